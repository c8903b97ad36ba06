"""The attacks both Redis pools withstood, kept as properties and regressions at the
suite's sizes (the review's own volumes are in its report): a pipelined stream cut at
random byte boundaries answered as a twin redis-server answers it directly; clients that
leave mid-pipeline or mid-reply; redis-server stopped, killed and restarted under busy
clients; many clients at once. The claim each time: no client ever reads a reply that is
not its own (an error may take its place, another's value never does).
"""
import os
import random
import signal
import socket
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import need_redis
from part2.managed import ManagedProxy
from part3.resp import RESP
from part3 import redis_server
from part3.framed import SessionProxy

EXAMPLES = int(os.environ.get("SOAK", "12"))   # per pool; `make soak` raises it
TIMEOUT = 5.0   # seconds a client waits for a reply before the test has found a hang

PROXIES = {
    "SessionProxy": lambda addr: SessionProxy(addr, framing=RESP, pool_cap=2),
    "ManagedProxy": lambda addr: ManagedProxy([(addr, 1)], framing=RESP),
}


def array(*items):
    items = [item if isinstance(item, bytes) else str(item).encode() for item in items]
    elements = b"".join(b"$%d\r\n%s\r\n" % (len(item), item) for item in items)
    return b"*%d\r\n" % len(items) + elements


class Reader:
    """What redis_server.read_resp() reads from: a socket and the bytes read past a reply."""

    def __init__(self, sock):
        self.sock, self.unread = sock, b""

    def read(self, count=1):
        return [redis_server.read_resp(self) for _ in range(count)]


@pytest.fixture(scope="module")
def twins():
    """Two private redis-servers: one behind the pool, one asked directly."""
    need_redis()
    with redis_server.RedisServer() as pooled, redis_server.RedisServer() as direct:
        yield pooled, direct


def flush(*servers):
    for server in servers:
        control = redis_server.RedisControl(server.addr)
        control.command("FLUSHALL")
        control.close()


# --- a pipelined stream cut anywhere, answered as a twin answers it -----------------------------

keys = st.sampled_from([b"k", b"l", b"h", b"n", b"\x00\xff binary \r\n key"])
values = st.binary(max_size=40)
requests = st.one_of(
    st.tuples(st.just(b"SET"), keys, values),
    st.tuples(st.just(b"GET"), keys),
    st.tuples(st.just(b"INCR"), st.just(b"n")),
    st.tuples(st.just(b"APPEND"), keys, values),
    st.tuples(st.just(b"LPUSH"), keys, values),
    st.tuples(st.just(b"LRANGE"), keys, st.just(b"0"), st.just(b"-1")),
    st.tuples(st.just(b"HSET"), keys, values, values),
    st.tuples(st.just(b"HGETALL"), keys),
    st.tuples(st.just(b"MGET"), keys, keys),
    st.tuples(st.just(b"DEL"), keys),
    st.tuples(st.just(b"ECHO"), values),
    st.tuples(st.just(b"PING")),
).map(lambda items: array(*items))
inline = st.sampled_from([b"PING\r\n", b"GET k\r\n", b"INCR n\n", b"EXISTS k l\r\n", b"\r\n",
                          b"*0\r\n"])
streams = st.lists(st.one_of(requests, inline), min_size=1, max_size=30)


def answered(request):
    """How many replies redis-server writes to a request of this stream: none to a blank."""
    return 0 if request in (b"\r\n", b"*0\r\n") else 1


def replies_to(addr, stream, cuts):
    """The replies to the stream written in the pieces cuts make, one connection."""
    data = b"".join(stream)
    edges = sorted({0, len(data), *(cut % (len(data) + 1) for cut in cuts)})
    with socket.create_connection(addr, timeout=TIMEOUT) as sock:
        for start, end in zip(edges, edges[1:]):
            sock.sendall(data[start:end])
        return Reader(sock).read(sum(map(answered, stream)))


@pytest.mark.parametrize("proxy_kind", PROXIES)
def test_a_pipelined_stream_cut_anywhere_is_answered_through_the_pool_as_a_twin_answers_it(
        twins, proxy_kind):
    pooled, direct = twins
    with PROXIES[proxy_kind](pooled.addr) as proxy:

        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
        @given(stream=streams, cuts=st.lists(st.integers(0, 10**6), max_size=8))
        def through_the_pool_as_directly(stream, cuts):
            flush(pooled, direct)
            assert replies_to(proxy.addr, stream, cuts) == replies_to(direct.addr, stream, cuts)

        through_the_pool_as_directly()


# --- clients that leave mid-pipeline or mid-reply ----------------------------------------------

def stayer(addr, index, rounds, wrong):
    """SET then GET its own keys, counting every reply that is not its own."""
    with socket.create_connection(addr, timeout=TIMEOUT) as sock:
        reader = Reader(sock)
        for number in range(rounds):
            key, value = f"stay:{index}:{number}", f"value-{index}-{number}".encode()
            sock.sendall(array("SET", key, value) + array("GET", key))
            wrong[index] += reader.read(2) != [b"+OK\r\n", b"$%d\r\n%s\r\n" % (len(value), value)]


def leaver(addr, seed, times):
    """Pipeline GETs of a long value, read a random part of the replies, and leave."""
    rng = random.Random(seed)
    for _ in range(times):
        with socket.create_connection(addr, timeout=TIMEOUT) as sock:
            sock.sendall(array("GET", "long") * rng.randint(1, 20))
            for _ in range(rng.randint(0, 3)):
                sock.recv(rng.randint(1, 30_000))


@pytest.mark.parametrize("proxy_kind", PROXIES)
def test_clients_leaving_mid_pipeline_or_mid_reply_leave_no_one_anothers_reply(twins, proxy_kind):
    pooled, _ = twins
    flush(pooled)
    control = redis_server.RedisControl(pooled.addr)
    control.command("SET long " + "x" * 50_000)
    control.close()
    wrong = [0] * 6
    with PROXIES[proxy_kind](pooled.addr) as proxy:
        threads = [threading.Thread(target=stayer, args=(proxy.addr, index, 40, wrong))
                   for index in range(6)]
        threads += [threading.Thread(target=leaver, args=(proxy.addr, seed, 5))
                    for seed in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert wrong == [0] * 6


# --- redis-server stopped, killed and restarted under busy clients ---------------------------

def busy(addr, index, stop, outcomes):
    """Until stop: SET and GET its own key, noting each GET's reply: right, an error, lost (the
    server that took the SET was killed) or wrong."""
    sock = None
    number = 0
    while not stop.is_set():
        number += 1
        value = f"busy-{index}-{number}".encode()
        try:
            sock = sock or socket.create_connection(addr, timeout=TIMEOUT)
            sock.sendall(array("SET", f"busy:{index}", value) + array("GET", f"busy:{index}"))
            set_reply, get_reply = Reader(sock).read(2)
        except OSError:   # the pool closed this client's connection: connect again
            outcomes.append("closed")
            sock = sock and sock.close()
            continue
        if get_reply == b"$%d\r\n%s\r\n" % (len(value), value):
            outcomes.append("right")
        elif get_reply.startswith(b"-") or set_reply.startswith(b"-"):
            outcomes.append("error")
        elif get_reply == b"$-1\r\n":   # its SET reached the server killed after it, which
            outcomes.append("lost")      # kept nothing: the new one's truthful answer is null
        else:
            outcomes.append(("wrong", get_reply))
    if sock:
        sock.close()


@pytest.mark.slow
@pytest.mark.parametrize("proxy_kind", PROXIES)
def test_redis_server_stopped_killed_and_restarted_under_busy_clients_gives_none_anothers_value(
        proxy_kind):
    need_redis()
    with redis_server.RedisServer() as server, PROXIES[proxy_kind](server.addr) as proxy:
        stop, outcomes = threading.Event(), []
        clients = [threading.Thread(target=busy, args=(proxy.addr, index, stop, outcomes))
                   for index in range(8)]
        for thread in clients:
            thread.start()
        try:
            time.sleep(0.2)   # the clients busy; then the faults, each given as long to show
            os.kill(server.process.pid, signal.SIGSTOP)
            time.sleep(0.3)
            os.kill(server.process.pid, signal.SIGCONT)
            time.sleep(0.2)
            server.kill_and_restart()
            before = len(outcomes)
            deadline = time.monotonic() + 10
            while outcomes[before:].count("right") < 20 and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            stop.set()
            for thread in clients:
                thread.join()
    assert outcomes.count("error") + outcomes.count("closed") > 0   # the kill was felt
    assert [outcome for outcome in outcomes if isinstance(outcome, tuple)] == []
    assert outcomes[before:].count("right") >= 20   # and the pool serves again after the restart


# --- many clients at once ---------------------------------------------------------------------

@pytest.mark.parametrize("proxy_kind", PROXIES)
def test_many_clients_at_once_each_read_back_their_own_values(twins, proxy_kind):
    pooled, _ = twins
    count = 250   # connected all at once, then each writes, then each reads
    with PROXIES[proxy_kind](pooled.addr) as proxy:
        socks = [socket.create_connection(proxy.addr, timeout=TIMEOUT) for _ in range(count)]
        try:
            for index, sock in enumerate(socks):
                key = f"many:{index}"
                sock.sendall(array("SET", key, f"v{index}") + array("GET", key))
            replies = [Reader(sock).read(2) for sock in socks]
        finally:
            for sock in socks:
                sock.close()
    assert replies == [[b"+OK\r\n", b"$%d\r\nv%d\r\n" % (len(b"v%d" % index), index)]
                       for index in range(count)]
