"""Each pool held against redis-server itself: a random sequence of reads, writes and session
changes (SELECT, HELLO, CLIENT SETNAME and GETNAME, MULTI, WATCH), written in random cuts on a
fresh connection directly to redis-server and through each pool, gets the same replies each
way and leaves the same keys, types and values in every database.

What may differ, and is kept out of the comparison:
- HELLO's `id` field: the pool numbers its own clients; it is blanked in every reply;
- between MULTI and its end, the pool refuses what it answers itself (SELECT, HELLO, CLIENT
  SETNAME and GETNAME) and dooms the transaction, where redis-server queues it: no sequence
  holds one there (test_session_held.py holds the refusal);
- replies that differ by connection (CLIENT ID, CLIENT LIST, INFO, TIME, RANDOMKEY, SCAN):
  no sequence asks for one.
"""
import os
import re
import socket

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from part2.managed import ManagedProxy
from part3.conftest import POOL_KINDS, Client, array, make_pool
from part3.resp import RESP

EXAMPLES = int(os.environ.get("SOAK", "80"))
DATABASES = range(4)
KEYS = ["k", "n", "h", "probe"]

keys = st.sampled_from(KEYS)
values = st.sampled_from(["", "1", "-7", "abc", "x y"])
fields = st.sampled_from(["f", "g"])


def command(*words):
    return st.tuples(*(st.just(word) if isinstance(word, str) else word for word in words))


# Reads and writes: what may go anywhere, inside MULTI too.
plain = st.one_of(
    command("SET", keys, values), command("GET", keys), command("INCR", keys),
    command("DEL", keys), command("APPEND", keys, values), command("EXISTS", keys, keys),
    command("MGET", keys, keys), command("HSET", keys, fields, values), command("HGETALL", keys),
    command("DBSIZE"), command("PING"), command("PING", values),
)
# What changes the session or opens a transaction: never between MULTI and its end.
session = st.one_of(
    command("SELECT", st.sampled_from([str(number) for number in DATABASES])),
    command("HELLO", st.sampled_from(["2", "3"])), command("HELLO"),
    command("CLIENT", "SETNAME", st.sampled_from(["alpha", "beta"])),
    command("CLIENT", "GETNAME"), command("WATCH", keys), command("UNWATCH"), command("MULTI"),
    command("EXEC"), command("DISCARD"),   # outside MULTI: an error, as redis-server says it
)
# Inside MULTI, beside reads and writes: its end, or what redis-server refuses there (MULTI,
# WATCH) or queues (UNWATCH).
in_transaction = st.one_of(command("EXEC"), command("DISCARD"), command("MULTI"),
                           command("WATCH", keys), command("UNWATCH"))


@st.composite
def sequences(draw):
    """A list of commands (tuples of words); a transaction opened may be left open."""
    made, in_multi = [], False
    for _ in range(draw(st.integers(1, 20))):
        allowed = in_transaction if in_multi else session
        made.append(draw(st.one_of(plain, allowed)))
        if made[-1] == ("MULTI",):   # inside MULTI, refused: the transaction goes on
            in_multi = True
        elif made[-1] in (("EXEC",), ("DISCARD",)):
            in_multi = False
    return made


# How the bytes are written: all at once, a command a write, a command a write each after
# the reply before it, or cut at these offsets (inside commands as well as between them).
cuttings = st.one_of(st.sampled_from(["whole", "each", "lockstep"]),
                     st.lists(st.integers(0, 10**4), min_size=1, max_size=8))


def pieces(requests, cuts):
    """The writes the requests go out in, cut as cuts says (not "lockstep")."""
    data = b"".join(requests)
    if cuts == "whole":
        return [data]
    if cuts == "each":
        return list(requests)
    edges = sorted({0, len(data), *(cut % (len(data) + 1) for cut in cuts)})
    return [data[start:end] for start, end in zip(edges, edges[1:])]


def blank_id(reply):
    return re.sub(rb"\$2\r\nid\r\n:\d+\r\n", b"$2\r\nid\r\n:N\r\n", reply)


def replies(addr, commands, cuts):
    """Each command's whole reply, in order, on a fresh connection; a reply that does not come
    fails the read within Client's timeout."""
    requests = [array(*words) for words in commands]
    client = Client(addr)
    try:
        client.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if cuts == "lockstep":
            return [blank_id(reply) for request in requests for reply in client.ask(request)]
        for piece in pieces(requests, cuts):
            client.sock.sendall(piece)
        return [blank_id(client.read()) for _ in requests]
    finally:
        client.close()


def contents(control):
    """Every key of every database: its type and value, as the control connection reads them."""
    found = {}
    for database in DATABASES:
        control.command(f"SELECT {database}")
        for key in KEYS:
            kind = control.command(f"TYPE {key}")
            if kind == b"+string\r\n":
                found[database, key] = kind, control.command(f"GET {key}")
            elif kind != b"+none\r\n":
                found[database, key] = kind, control.command(f"HGETALL {key}")
    control.command("SELECT 0")
    return found


def run(addr, control, commands, cuts):
    """The replies, then what the run left; from empty databases."""
    assert control.command("FLUSHALL") == b"+OK\r\n"
    answered = replies(addr, commands, cuts)
    return answered, contents(control)


@pytest.fixture
def pools(redis):
    """A pool of each kind, a new client of it each example. The module's one test is their
    whole life: closed at its end, before the leak guard looks."""
    # two connections to the managed set: a client's pipeline could be split over them
    with make_pool("FramedProxy", redis) as framed, \
            ManagedProxy([(redis.addr, 2)], framing=RESP) as managed:
        made = dict(zip(POOL_KINDS, (framed, managed)))
        for pool in made.values():   # as a pool in use is: it has asked the server's facts
            assert replies(pool.addr, [("SELECT", "1"), ("SELECT", "0")], "lockstep") == \
                [b"+OK\r\n"] * 2
        yield made


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(commands=sequences(), cuts=cuttings)
# Each pipelined with a state change the pool answers itself after a request that must run
# in the state before it; all failed on ManagedProxy before it kept that order.
@example(commands=[("SET", "probe", "abc"), ("GET", "probe"), ("SELECT", "3")], cuts="whole")
@example(commands=[("SELECT", "3"), ("SET", "probe", "1"), ("SELECT", "0"), ("GET", "probe"),
                   ("SELECT", "3"), ("GET", "probe")], cuts="whole")
@example(commands=[("GET", "k"), ("HELLO", "3")], cuts="whole")
# A WATCH, then HELLO both ways, with writes between, sent whole.
@example(commands=[("WATCH", "k"), ("SET", "k", ""), ("HELLO", "3"), ("SET", "k", ""),
                   ("HELLO", "2")], cuts="whole")
# A write and reads of it, pipelined: on two connections a read could run before its write.
@example(commands=[("SET", "k", "1"), ("GET", "k"), ("APPEND", "k", "abc"), ("GET", "k"),
                   ("INCR", "n"), ("GET", "n")], cuts="whole")
def test_any_sequence_cut_anyhow_gets_from_each_pool_what_redis_server_gives_directly(
        redis, control, pools, commands, cuts):
    direct = run(redis.addr, control, commands, cuts)
    for kind, pool in pools.items():
        assert (kind, run(pool.addr, control, commands, cuts)) == (kind, direct)
