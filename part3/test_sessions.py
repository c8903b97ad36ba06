"""A Redis client's session through the pool: what it answers itself (HELLO, AUTH, SELECT,
CLIENT SETNAME...), the state a checkout brings a connection to, a transaction on the
connection the client holds, a wait or a stream on one of its own, the pool's own AUTH, and
a value longer than the pool keeps passed on as it arrives; then real clients with their
defaults (redis-py 8 sync and asyncio, redis-cli, redis-benchmark) through each pool kind.
"""
import asyncio
import re
import socket
import subprocess
import time

import pytest

from conftest import need_redis
from part2.managed import ManagedProxy
from part3 import lending
from part3.resp import RESP, Resp
from scaffolding import redis_server
from tcp_proxy import FramedProxy, Frames, Server

TIMEOUT = 5.0   # seconds a test's client waits for a reply before the test fails

# The pools a client-level test runs through: each keeps its clients' sessions.
POOL_KINDS = ["FramedProxy", "ManagedProxy"]


def make_pool(kind, redis, framing=RESP, pool_cap=4):
    if kind == "ManagedProxy":
        return ManagedProxy([(redis.addr, 1)], framing=framing)
    return FramedProxy(redis.addr, framing=framing, pool_cap=pool_cap)


def array(*items):
    """A request as every client library writes it: an array of bulk strings."""
    items = [item if isinstance(item, bytes) else str(item).encode() for item in items]
    return b"*%d\r\n" % len(items) + b"".join(b"$%d\r\n%s\r\n" % (len(i), i) for i in items)


class Client:
    """One raw client connection: send() requests, read() whole RESP replies."""

    def __init__(self, addr, timeout=TIMEOUT):
        self.sock = socket.create_connection(addr, timeout=timeout)
        self.unread = b""   # what redis_server.read_resp() keeps between replies

    def send(self, *requests):
        self.sock.sendall(b"".join(array(*r.split()) if isinstance(r, str) else r
                                   for r in requests))

    def read(self):
        return redis_server.read_resp(self)

    def ask(self, *requests):
        self.send(*requests)
        return [self.read() for _ in requests]

    def close(self):
        self.sock.close()


@pytest.fixture(scope="module")
def redis():
    need_redis()
    with redis_server.RedisServer() as server:
        yield server


@pytest.fixture
def control(redis):
    connection = redis_server.RedisControl(redis.addr)
    connection.command("FLUSHALL")
    yield connection
    connection.close()


@pytest.fixture
def clients():
    """clients(addr, n): n connected Clients, closed at the test's end."""
    made = []

    def connect(addr, count=1):
        made.extend(Client(addr) for _ in range(count))
        return made[-count:] if count > 1 else made[-1]

    yield connect
    for client in made:
        client.close()


def wait_for(condition, what, timeout=TIMEOUT):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what}")
        time.sleep(0.01)


def server_clients(control):
    """redis-server's own list of its clients, the control's own left out."""
    listed = control.command("CLIENT LIST").decode().splitlines()[1:]
    return [line for line in listed if line and " cmd=client|list " not in line]


def direct_and_pooled(redis, control, proxy, requests):
    """The replies to requests directly from redis-server and through the pool, each on a
    fresh connection, with every `id` a client's number (the pool numbers its own) blanked."""
    replies = []
    for addr in (redis.addr, proxy.addr):
        client = Client(addr)
        try:
            replies.append([re.sub(rb"\$2\r\nid\r\n:\d+\r\n", b"$2\r\nid\r\n:N\r\n", reply)
                            for reply in client.ask(*requests)])
        finally:
            client.close()
    return replies


# --- what the pool answers itself, as redis-server would -------------------------------------

HELLOS = ["HELLO", "HELLO 2", "HELLO 3", "HELLO 4", "HELLO 1", "HELLO x", "HELLO 3 SETNAME me",
          "HELLO 3 BOGUS", "HELLO 3 AUTH default anything", "HELLO 3 AUTH someone else",
          "HELLO 2 AUTH default", "HELLO 3 SETNAME", array("HELLO", "3", "SETNAME", "a b")]


@pytest.mark.parametrize("hello", HELLOS, ids=repr)
def test_the_pool_answers_hello_as_redis_server_does_its_version_included(redis, control, hello):
    """Each HELLO, then what it set: the protocol (a map or a flat array) and the name."""
    with FramedProxy(redis.addr, framing=RESP) as proxy:
        direct, pooled = direct_and_pooled(redis, control, proxy, [hello, "CLIENT GETNAME"])
    assert pooled == direct


def test_select_and_the_client_commands_are_answered_from_the_session_as_redis_server_does(
        redis, control):
    asked = ["SELECT 1", "SELECT 16", "SELECT -1", "SELECT x", "SELECT", "CLIENT SETNAME me",
             array("CLIENT", "SETNAME", "a b"), "CLIENT GETNAME", "CLIENT SETNAME", "AUTH x",
             "AUTH default x", "AUTH someone x", "AUTH a b c"]
    with FramedProxy(redis.addr, framing=RESP) as proxy:
        direct, pooled = direct_and_pooled(redis, control, proxy, asked)
    assert pooled == direct


def test_client_id_is_the_pools_number_for_the_client_and_hello_says_the_same(redis, clients):
    with FramedProxy(redis.addr, framing=RESP) as proxy:
        first, second = clients(proxy.addr, 2)
        hello = first.ask("HELLO 3")[0]
        assert first.ask("CLIENT ID") == [b":%s\r\n" % re.search(rb"id\r\n:(\d+)", hello)[1]]
        assert int(second.ask("CLIENT ID")[0][1:-2]) != int(first.ask("CLIENT ID")[0][1:-2])


def test_client_setinfo_which_redis_7_0_does_not_know_is_answered_ok_as_redis_py_sends_it(
        redis, control, clients):
    with FramedProxy(redis.addr, framing=RESP) as proxy:
        client = clients(proxy.addr)
        assert client.ask("CLIENT SETINFO LIB-NAME redis-py", "CLIENT SETINFO LIB-VER 8.1.0",
                          "CLIENT SETINFO COLOR red") == \
            [b"+OK\r\n", b"+OK\r\n", b"-ERR Unrecognized option 'COLOR'\r\n"]
    assert control.command("GET never") == b"$-1\r\n"


# --- a checkout is a state sync -------------------------------------------------------------

def test_a_checkout_brings_the_one_connection_to_each_clients_protocol_and_database(
        redis, control, clients):
    """Three clients, three states, one pooled connection: each request goes on it after
    the HELLO and SELECT that bring it to its client's state, in the same write."""
    control.command("CONFIG RESETSTAT")
    with FramedProxy(redis.addr, framing=RESP, pool_cap=1) as proxy:
        resp3, db2, plain = clients(proxy.addr, 3)
        assert resp3.ask("HELLO 3")[0].startswith(b"%7\r\n")
        assert db2.ask("SELECT 2") == [b"+OK\r\n"]
        for _ in range(2):
            assert resp3.ask("HSET h f three", "HGETALL h") == [b":0\r\n" if _ else b":1\r\n",
                                                              b"%1\r\n$1\r\nf\r\n$5\r\nthree\r\n"]
            assert db2.ask("HSET h f two", "HGETALL h")[1] == b"*2\r\n$1\r\nf\r\n$3\r\ntwo\r\n"
            assert plain.ask("HGETALL h") == [b"*2\r\n$1\r\nf\r\n$5\r\nthree\r\n"]
        assert proxy.opened == 1
    stats = control.command("INFO commandstats").decode()
    assert re.search(r"cmdstat_hello:calls=(\d+)", stats)[1] == "5"    # facts() once, 4 syncs
    assert re.search(r"cmdstat_select:calls=(\d+)", stats)[1] == "4"   # to 2 and back, twice


def test_client_no_evict_is_replayed_as_select_is_and_client_reply_on_changes_nothing(
        redis, control, clients):
    with FramedProxy(redis.addr, framing=RESP, pool_cap=1) as proxy:
        protected, other = clients(proxy.addr, 2)
        assert protected.ask("CLIENT NO-EVICT on", "CLIENT REPLY ON") == [b"+OK\r\n"] * 2
        for _ in range(2):   # the one connection, brought to each client's flags in turn
            assert re.search(rb" flags=N*e", protected.ask("CLIENT INFO")[0])
            assert not re.search(rb" flags=N*e", other.ask("CLIENT INFO")[0])
        assert protected.ask("CLIENT REPLY OFF")[0].startswith(
            b"-ERR tcp-proxy: CLIENT REPLY switches the connection's replies off")
        assert proxy.opened == 1


def test_two_clients_in_different_databases_overlapping_transactions_and_a_subscriber_see_their_own(
        redis, control, clients):
    with FramedProxy(redis.addr, framing=RESP, pool_cap=2) as proxy:
        one, two, listener = clients(proxy.addr, 3)
        assert one.ask("HELLO 3", "SELECT 1", "MULTI", "SET k one")[1:] == \
            [b"+OK\r\n", b"+OK\r\n", b"+QUEUED\r\n"]
        assert two.ask("SELECT 2", "MULTI", "SET k two") == [b"+OK\r\n", b"+OK\r\n", b"+QUEUED\r\n"]
        assert listener.ask("SUBSCRIBE news") == [b"*3\r\n$9\r\nsubscribe\r\n$4\r\nnews\r\n:1\r\n"]
        assert one.ask("GET k") == [b"+QUEUED\r\n"]
        assert control.command("PUBLISH news hello") == b":1\r\n"
        assert two.ask("GET k", "EXEC") == [b"+QUEUED\r\n", b"*2\r\n+OK\r\n$3\r\ntwo\r\n"]
        assert one.ask("EXEC") == [b"*2\r\n+OK\r\n$3\r\none\r\n"]
        assert listener.read() == b"*3\r\n$7\r\nmessage\r\n$4\r\nnews\r\n$5\r\nhello\r\n"
        assert one.ask("GET k", "SELECT 0", "GET k") == [b"$3\r\none\r\n", b"+OK\r\n", b"_\r\n"]
    assert control.command("GET k") == b"$-1\r\n"


def test_managed_clients_of_three_states_share_its_one_pipelined_connection_each_in_its_own(
        redis, control, clients):
    """ManagedProxy's pipeline keeps the state its queue leaves the connection in, and syncs
    it before an entry of a client whose state differs: the same HELLO and SELECT a checkout
    costs FramedProxy, on the one connection every client shares."""
    control.command("CONFIG RESETSTAT")
    with ManagedProxy([(redis.addr, 1)], framing=RESP) as proxy:
        resp3, db2, plain = clients(proxy.addr, 3)
        assert resp3.ask("HELLO 3")[0].startswith(b"%7\r\n")
        assert db2.ask("SELECT 2") == [b"+OK\r\n"]
        for _ in range(2):
            assert resp3.ask("HSET h f three", "HGETALL h") == [b":0\r\n" if _ else b":1\r\n",
                                                              b"%1\r\n$1\r\nf\r\n$5\r\nthree\r\n"]
            assert db2.ask("HSET h f two", "HGETALL h")[1] == b"*2\r\n$1\r\nf\r\n$3\r\ntwo\r\n"
            assert plain.ask("HGETALL h") == [b"*2\r\n$1\r\nf\r\n$5\r\nthree\r\n"]
        assert len(server_clients(control)) == 1
    stats = control.command("INFO commandstats").decode()
    assert re.search(r"cmdstat_hello:calls=(\d+)", stats)[1] == "5"    # facts() once, 4 syncs
    assert re.search(r"cmdstat_select:calls=(\d+)", stats)[1] == "4"   # to 2 and back, twice


def test_a_managed_transaction_goes_on_a_connection_of_its_own_closed_at_exec(
        redis, control, clients):
    with ManagedProxy([(redis.addr, 1)], framing=RESP) as proxy:
        inside, outside = clients(proxy.addr, 2)
        assert inside.ask("MULTI", "INCR n", "INCR n") == \
            [b"+OK\r\n", b"+QUEUED\r\n", b"+QUEUED\r\n"]
        assert outside.ask("INCR n") == [b":1\r\n"]   # not queued: it runs now, on the shared one
        assert inside.ask("EXEC") == [b"*2\r\n:2\r\n:3\r\n"]
        wait_for(lambda: len(server_clients(control)) == 1, "the transaction's own one closed")
        assert lending.lender_of(proxy).dedicated == 1


def test_a_managed_client_that_leaves_mid_transaction_has_its_own_connection_closed(
        redis, control, clients):
    with ManagedProxy([(redis.addr, 1)], framing=RESP) as proxy:
        leaver, other = clients(proxy.addr, 2)
        assert other.ask("PING") == [b"+PONG\r\n"]
        assert leaver.ask("MULTI", "SET k leaver") == [b"+OK\r\n", b"+QUEUED\r\n"]
        leaver.close()
        wait_for(lambda: len(server_clients(control)) == 1, "the transaction's connection closed")
        assert other.ask("GET k") == [b"$-1\r\n"]   # nothing of it ran


def test_a_managed_sync_the_server_refuses_fails_what_is_owed_and_ends_the_connection(
        guarded, clients):
    server, control = guarded
    with ManagedProxy([(server.addr, 1)], framing=RESP) as proxy:
        client = clients(proxy.addr)
        assert client.ask("HELLO 3")[0].startswith(b"%7\r\n")
        assert client.ask("GET k")[0].startswith(
            b"-ERR MessageLost: the connection could not take a client's state: HELLO was "
            b"answered -NOAUTH")
        wait_for(lambda: len(server_clients(control)) == 0, "the refused connection closed")


@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_a_clients_name_is_replayed_so_client_list_names_it_on_the_connection_it_borrows(
        redis, control, clients, pool_kind):
    with make_pool(pool_kind, redis, framing=Resp(allow=["CLIENT LIST"]), pool_cap=1) as proxy:
        named, other = clients(proxy.addr, 2)
        assert named.ask("CLIENT SETNAME worker-1") == [b"+OK\r\n"]
        assert b" name=worker-1 " in named.ask("CLIENT LIST")[0]
        assert b" name=worker-1 " not in other.ask("CLIENT LIST")[0]


@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_config_set_requirepass_is_never_passed_even_where_config_set_is_allowed(
        redis, control, clients, pool_kind):
    """AUTH belongs to the pool: a client that changed the server's password would leave the
    pool unable to open a connection for anyone."""
    with make_pool(pool_kind, redis, framing=Resp(allow=["CONFIG SET"])) as proxy:
        client = clients(proxy.addr)
        assert client.ask("CONFIG SET requirepass mine")[0].startswith(
            b"-ERR tcp-proxy: CONFIG SET requirepass changes the password every connection must "
            b"give the server, which is the pool's to say")
        assert client.ask("CONFIG SET maxmemory-samples 5") == [b"+OK\r\n"]
    assert control.command("CONFIG GET requirepass") == b"*2\r\n$11\r\nrequirepass\r\n$0\r\n\r\n"


# --- a transaction on the connection the client holds ----------------------------------------

def test_a_transaction_is_queued_on_the_clients_own_connection_while_others_run_beside_it(
        redis, control, clients):
    with FramedProxy(redis.addr, framing=RESP, pool_cap=2) as proxy:
        inside, outside = clients(proxy.addr, 2)
        assert inside.ask("MULTI", "INCR n", "INCR n") == \
            [b"+OK\r\n", b"+QUEUED\r\n", b"+QUEUED\r\n"]
        assert outside.ask("INCR n") == [b":1\r\n"]   # not queued: it runs now, on the other
        assert inside.ask("EXEC") == [b"*2\r\n:2\r\n:3\r\n"]
        assert (proxy.opened, proxy.discarded) == (2, 0)   # the held one checked in at EXEC


def test_a_watched_key_another_client_changes_aborts_the_exec_and_unwatch_lets_go(
        redis, control, clients):
    with FramedProxy(redis.addr, framing=RESP, pool_cap=2) as proxy:
        watcher, writer = clients(proxy.addr, 2)
        assert watcher.ask("WATCH k") == [b"+OK\r\n"]
        assert writer.ask("SET k theirs") == [b"+OK\r\n"]
        assert watcher.ask("MULTI", "SET k mine", "EXEC") == \
            [b"+OK\r\n", b"+QUEUED\r\n", b"*-1\r\n"]
        assert watcher.ask("WATCH k", "UNWATCH", "GET k") == [b"+OK\r\n", b"+OK\r\n",
                                                            b"$6\r\ntheirs\r\n"]
        assert (proxy.opened, proxy.discarded) == (2, 0)


def test_a_client_that_leaves_mid_transaction_has_its_connection_closed_never_lent_again(
        redis, control, clients):
    with FramedProxy(redis.addr, framing=RESP, pool_cap=1) as proxy:
        leaver = clients(proxy.addr)
        assert leaver.ask("MULTI", "SET k leaver") == [b"+OK\r\n", b"+QUEUED\r\n"]
        leaver.close()
        proxy.wait_discarded(1)
        assert clients(proxy.addr).ask("SET k next", "GET k") == [b"+OK\r\n", b"$4\r\nnext\r\n"]
        assert proxy.opened == 2
    assert server_clients(control) == []


def test_a_request_the_pool_refuses_inside_multi_dooms_the_transaction_and_nothing_of_it_runs(
        redis, control, clients):
    with FramedProxy(redis.addr, framing=RESP, pool_cap=1) as proxy:
        client = clients(proxy.addr)
        replies = client.ask("MULTI", "SET k 1", "SELECT 1", "EXEC", "GET k")
        assert replies[:2] == [b"+OK\r\n", b"+QUEUED\r\n"]
        assert replies[2].startswith(b"-ERR tcp-proxy: SELECT is the pool's to answer")
        assert replies[3:] == [b"-EXECABORT Transaction discarded because of previous errors.\r\n",
                               b"$-1\r\n"]
        assert (proxy.opened, proxy.discarded) == (2, 1)   # the doomed one closed


def test_a_subscribe_inside_a_transaction_dooms_it_and_after_watch_is_refused_until_unwatch(
        redis, control, clients):
    """redis-server queues a SUBSCRIBE inside MULTI and runs it at EXEC, which would turn the
    held connection into a stream: the pool refuses it, and so the transaction."""
    with FramedProxy(redis.addr, framing=RESP, pool_cap=1) as proxy:
        client = clients(proxy.addr)
        replies = client.ask("MULTI", "SUBSCRIBE a", "EXEC", "WATCH k", "SUBSCRIBE a", "UNWATCH")
        assert replies[0] == b"+OK\r\n" and replies[3] == replies[5] == b"+OK\r\n"
        assert replies[1].startswith(b"-ERR tcp-proxy: SUBSCRIBE inside a transaction")
        assert replies[2].startswith(b"-EXECABORT")
        assert replies[4].startswith(b"-ERR tcp-proxy: SUBSCRIBE while WATCH holds the connection")
        assert lending.lender_of(proxy).dedicated == 0


def test_reset_ends_a_transaction_by_closing_its_connection_and_the_session_starts_again(
        redis, control, clients):
    with FramedProxy(redis.addr, framing=RESP, pool_cap=1) as proxy:
        client = clients(proxy.addr)
        assert client.ask("HELLO 3", "SELECT 3", "MULTI", "SET k 1", "RESET", "GET k")[2:] == \
            [b"+OK\r\n", b"+QUEUED\r\n", b"+RESET\r\n", b"$-1\r\n"]   # RESP2 and db 0 again
        assert proxy.discarded == 1
    assert control.command("SELECT 3") == b"+OK\r\n" and control.command("GET k") == b"$-1\r\n"


# --- a wait or a stream on a connection of its own -------------------------------------------

def test_a_blocking_command_waits_on_a_connection_of_its_own_while_the_pool_serves_others(
        redis, control, clients):
    with FramedProxy(redis.addr, framing=RESP, pool_cap=1) as proxy:
        waiter, other = clients(proxy.addr, 2)
        waiter.send("BLPOP q 0")
        assert other.ask("SET x 1", "GET x") == [b"+OK\r\n", b"$1\r\n1\r\n"]
        wait_for(lambda: any(" cmd=blpop " in c for c in server_clients(control)), "the wait")
        assert other.ask("RPUSH q job") == [b":1\r\n"]
        assert waiter.read() == b"*2\r\n$1\r\nq\r\n$3\r\njob\r\n"
        assert (proxy.opened, lending.lender_of(proxy).dedicated) == (2, 1)
        wait_for(lambda: len(server_clients(control)) == 1, "its own connection closed")


def test_a_blocking_command_with_a_timeout_is_answered_null_after_it_not_before(redis, clients):
    with FramedProxy(redis.addr, framing=RESP) as proxy:
        client = clients(proxy.addr)
        started = time.monotonic()
        assert client.ask("BLPOP q 0.2", "HELLO 3", "BRPOP q 0.1")[::2] == [b"*-1\r\n", b"_\r\n"]
        assert time.monotonic() - started >= 0.3


def test_a_client_that_leaves_while_its_command_waits_has_that_connection_closed(
        redis, control, clients):
    with FramedProxy(redis.addr, framing=RESP) as proxy:
        waiter = clients(proxy.addr)
        waiter.send("BLPOP q 0")
        wait_for(lambda: any(" cmd=blpop " in c for c in server_clients(control)), "the wait")
        waiter.close()
        wait_for(lambda: not server_clients(control), "the waiting connection closed")
    assert control.command("RPUSH q job") == b":1\r\n"   # nobody took it


def test_connections_of_their_own_are_bounded_and_past_the_bound_a_clear_error_says_so(
        redis, control, clients):
    with FramedProxy(redis.addr, framing=Resp(dedicated_cap=1)) as proxy:
        first, second = clients(proxy.addr, 2)
        first.send("BLPOP q 0")
        wait_for(lambda: any(" cmd=blpop " in c for c in server_clients(control)), "the wait")
        assert second.ask("SUBSCRIBE news", "GET k") == [
            b"-ERR tcp-proxy: no connection of its own for this request: the pool's 1 dedicated "
            b"connections are all in use\r\n", b"$-1\r\n"]
        assert second.ask("RPUSH q job") == [b":1\r\n"]
        assert first.read() == b"*2\r\n$1\r\nq\r\n$3\r\njob\r\n"


def test_a_subscription_streams_on_its_own_connection_until_its_last_unsubscribe(
        redis, control, clients):
    with FramedProxy(redis.addr, framing=RESP, pool_cap=1) as proxy:
        client = clients(proxy.addr)
        assert client.ask("SUBSCRIBE a b") == [
            b"*3\r\n$9\r\nsubscribe\r\n$1\r\na\r\n:1\r\n"]
        assert client.read() == b"*3\r\n$9\r\nsubscribe\r\n$1\r\nb\r\n:2\r\n"
        assert control.command("PUBLISH b hi") == b":1\r\n"
        assert client.read() == b"*3\r\n$7\r\nmessage\r\n$1\r\nb\r\n$2\r\nhi\r\n"
        assert client.ask("PING", "CLIENT ID", "UNSUBSCRIBE a") == [
            b"*2\r\n$4\r\npong\r\n$0\r\n\r\n", b":1\r\n",   # the pool's own, after the PING's
            b"*3\r\n$11\r\nunsubscribe\r\n$1\r\na\r\n:1\r\n"]
        assert client.ask("GET k") == [b"-ERR Can't execute 'get': only (P|S)SUBSCRIBE / "
                                       b"(P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in "
                                       b"this context\r\n"]
        assert client.ask("UNSUBSCRIBE", "GET k") == [
            b"*3\r\n$11\r\nunsubscribe\r\n$1\r\nb\r\n:0\r\n", b"$-1\r\n"]   # pooled again
        assert lending.lender_of(proxy).own == 0 and proxy.opened == 2
        wait_for(lambda: len(server_clients(control)) == 1, "the stream's connection closed")


def test_resp3_pushes_reach_their_subscriber_between_the_replies_to_its_requests(
        redis, control, clients):
    with FramedProxy(redis.addr, framing=RESP) as proxy:
        client = clients(proxy.addr)
        assert client.ask("HELLO 3")[0].startswith(b"%7")
        assert client.ask("PSUBSCRIBE n*") == [b">3\r\n$10\r\npsubscribe\r\n$2\r\nn*\r\n:1\r\n"]
        assert control.command("PUBLISH news first") == b":1\r\n"
        assert client.read() == b">4\r\n$8\r\npmessage\r\n$2\r\nn*\r\n$4\r\nnews\r\n$5\r\nfirst\r\n"
        assert client.ask("SET k v", "GET k") == [b"+OK\r\n", b"$1\r\nv\r\n"]   # RESP3 allows it
        assert client.ask("SELECT 1")[0].startswith(b"-ERR tcp-proxy: SELECT on a connection that "
                                                    b"is a stream")
        assert client.ask("PUNSUBSCRIBE", "GET k") == [
            b">3\r\n$12\r\npunsubscribe\r\n$2\r\nn*\r\n:0\r\n", b"$1\r\nv\r\n"]


def test_reset_and_quit_end_a_stream_and_unsubscribe_outside_one_is_answered_as_redis_does(
        redis, control, clients):
    with FramedProxy(redis.addr, framing=RESP) as proxy:
        resetter, quitter = clients(proxy.addr, 2)
        direct = Client(redis.addr)
        try:
            assert resetter.ask("UNSUBSCRIBE", "SUNSUBSCRIBE x") == direct.ask(
                "UNSUBSCRIBE", "SUNSUBSCRIBE x")
        finally:
            direct.close()
        assert resetter.ask("SUBSCRIBE a", "RESET", "GET k") == [
            b"*3\r\n$9\r\nsubscribe\r\n$1\r\na\r\n:1\r\n", b"+RESET\r\n", b"$-1\r\n"]
        assert quitter.ask("SUBSCRIBE a", "QUIT") == [b"*3\r\n$9\r\nsubscribe\r\n$1\r\na\r\n:1\r\n",
                                                      b"+OK\r\n"]
        assert quitter.sock.recv(1) == b""
        wait_for(lambda: not any(re.search(r" sub=[1-9]", line)
                                 for line in server_clients(control)),
                 "every stream's connection closed")
        wait_for(lambda: lending.lender_of(proxy).own == 0, "the lender's count of them")


def test_monitor_is_refused_by_the_pools_policy_and_streams_once_allowed_by_name(
        redis, control, clients):
    with FramedProxy(redis.addr, framing=RESP) as proxy:
        assert clients(proxy.addr).ask("MONITOR") == [
            b"-ERR tcp-proxy: MONITOR streams every client's commands to the connection; refused "
            b"by the pool's policy (allow it by name)\r\n"]
    with FramedProxy(redis.addr, framing=Resp(allow={"MONITOR"})) as proxy:
        watcher = clients(proxy.addr)
        assert watcher.ask("MONITOR") == [b"+OK\r\n"]
        control.command("SET seen yes")
        assert re.fullmatch(rb'\+[0-9.]+ \[0 127\.0\.0\.1:\d+\] "SET" "seen" "yes"\r\n',
                            watcher.read())


# --- AUTH belongs to the pool ----------------------------------------------------------------

def test_a_pool_with_a_password_answers_noauth_until_its_clients_auth_and_auth_is_its_own(
        redis, control, clients):
    control.command("CONFIG RESETSTAT")
    with FramedProxy(redis.addr, framing=Resp(password="s3cret")) as proxy:
        client = clients(proxy.addr)
        assert client.ask("GET k", "HELLO 3", "AUTH wrong", "AUTH s3cret", "GET k") == [
            b"-NOAUTH Authentication required.\r\n",
            b"-NOAUTH HELLO must be called with the client already authenticated, otherwise the "
            b"HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and "
            b"select the RESP protocol version at the same time\r\n",
            b"-WRONGPASS invalid username-password pair or user is disabled.\r\n",
            b"+OK\r\n", b"$-1\r\n"]
        other = clients(proxy.addr)
        assert other.ask("HELLO 3 AUTH default s3cret")[0].startswith(b"%7\r\n")
        assert other.ask("RESET", "GET k") == [b"+RESET\r\n",
                                               b"-NOAUTH Authentication required.\r\n"]
    assert b"cmdstat_auth" not in control.command("INFO commandstats")   # none reached it


def test_a_pool_that_keeps_no_state_still_asks_its_password_before_it_forwards_anything(
        redis, control, clients):
    """ManagedProxy's sessions keep no state, but a password is no connection's: checked
    by the session, and nothing is forwarded before it."""
    with ManagedProxy([(redis.addr, 1)], framing=Resp(password="s3cret")) as proxy:
        client = clients(proxy.addr)
        assert client.ask("SET k v", "AUTH wrong", "AUTH s3cret", "SET k v") == [
            b"-NOAUTH Authentication required.\r\n",
            b"-WRONGPASS invalid username-password pair or user is disabled.\r\n",
            b"+OK\r\n", b"+OK\r\n"]
    assert control.command("DBSIZE") == b":1\r\n"


@pytest.fixture
def guarded():
    """A private redis-server that asks a password of its clients (upstream-secret)."""
    need_redis()
    with redis_server.RedisServer() as server:
        control = redis_server.RedisControl(server.addr)
        control.command("CONFIG SET requirepass upstream-secret")
        control.command("AUTH upstream-secret")
        try:
            yield server, control
        finally:
            control.close()


def test_the_pool_authenticates_upstream_with_credentials_of_its_own_never_a_clients(guarded):
    import redis as redis_py
    server, control = guarded
    framing = Resp(password="client-secret", upstream_password="upstream-secret")
    with FramedProxy(server.addr, framing=framing, pool_cap=2) as proxy:
        client = redis_py.Redis(port=proxy.addr[1], password="client-secret", socket_timeout=10)
        try:
            assert client.set("k", "v") is True and client.get("k") == b"v"
            with client.pipeline() as pipe:
                assert pipe.incr("n").incr("n").execute() == [1, 2]
        finally:
            client.close()
        intruder = Client(proxy.addr)
        try:   # the server's own password is no client's: the pool asks for its own
            assert intruder.ask("AUTH upstream-secret") == \
                [b"-WRONGPASS invalid username-password pair or user is disabled.\r\n"]
        finally:
            intruder.close()
        opened = proxy.opened
    stats = control.command("INFO commandstats").decode()
    assert int(re.search(r"cmdstat_auth:calls=(\d+)", stats)[1]) == opened + 1   # + the control's


def test_without_its_own_credentials_the_pool_passes_on_the_servers_noauth(guarded, clients):
    server, _ = guarded
    with FramedProxy(server.addr, framing=RESP) as proxy:
        assert clients(proxy.addr).ask("GET k")[0].startswith(b"-NOAUTH")


def test_a_sync_the_server_refuses_costs_the_request_an_error_and_the_connection_its_life(
        guarded, clients):
    """The server asks a password the pool does not have: a RESP3 client's request goes
    after a HELLO 3 it refuses, so the request is answered with an error, not the server's
    NOAUTH to a connection in the wrong protocol, and that connection is never lent again."""
    server, _ = guarded
    with FramedProxy(server.addr, framing=RESP) as proxy:
        client = clients(proxy.addr)
        assert client.ask("HELLO 3")[0].startswith(b"%7\r\n")
        assert client.ask("GET k") == [b"-ERR upstream: the connection could not take the "
                                       b"client's state: HELLO was answered -NOAUTH HELLO must be "
                                       b"called with the cl\r\n"]   # its first 40 bytes
        assert proxy.discarded == 1


# --- a value longer than the pool keeps, passed on as it arrives ---------------------------------

def rss():
    with open("/proc/self/status", encoding="ascii") as status:
        return int(re.search(r"VmRSS:\s+(\d+) kB", status.read())[1]) * 1024


def peak_since_now():
    """Start counting the process's peak memory from now (Linux: clear_refs 5); a function
    that gives the peak since, or the resident size at the time if it cannot be reset."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as refs:
            refs.write("5")
    except OSError:
        return rss

    def peak():
        with open("/proc/self/status", encoding="ascii") as status:
            return int(re.search(r"VmHWM:\s+(\d+) kB", status.read())[1]) * 1024
    return peak


VALUE = 64 << 20   # bytes: past the pool's window many times over, within Redis's 512 MB
BLOCK = bytes(range(256)) * 256   # 64 kB: the value is this, over and over


def test_a_64_mb_value_set_then_got_through_the_pool_grows_this_process_by_less_than_16_mb(
        redis, control, pool_kind):
    """The client streams too: it writes the value block by block and reads it the same way,
    checking every byte, keeping none."""
    with make_pool(pool_kind, redis, pool_cap=1) as proxy, \
            socket.create_connection(proxy.addr, timeout=30) as sock:
        before, peak = rss(), peak_since_now()
        sock.sendall(b"*3\r\n$3\r\nSET\r\n$4\r\nhuge\r\n$%d\r\n" % VALUE)
        for _ in range(VALUE // len(BLOCK)):
            sock.sendall(BLOCK)
        sock.sendall(b"\r\n" + array("GET", "huge"))
        expected = b"+OK\r\n$%d\r\n" % VALUE
        received = b""
        while len(received) < len(expected):
            received += sock.recv(len(expected) - len(received))
        assert received == expected
        read, wrong, ruler = 0, 0, bytes(range(256)) * 257   # a byte's value: its place, mod 256
        while read < VALUE:
            data = sock.recv(min(1 << 16, VALUE - read))
            assert data
            wrong += data != ruler[read % 256:read % 256 + len(data)]
            read += len(data)
        assert sock.recv(2) == b"\r\n"
        if pool_kind == "FramedProxy":
            proxy.wait_released(2)   # the GET's connection, checked in once its reply has passed
            assert (proxy.released, proxy.dirty) == (2, 0)
        grown = peak() - before
        assert (read, wrong, lost(proxy)) == (VALUE, 0, (0, 0))
    assert control.command("STRLEN huge") == b":%d\r\n" % VALUE
    assert grown < 16 << 20, f"{grown >> 20} MB"


def test_a_long_reply_whose_first_bytes_cannot_answer_the_request_reaches_no_one(redis, clients):
    """An INCR answered with a bulk string longer than the pool keeps: out of step at its
    first bytes, before any of it is passed on."""
    scripted = ScriptedLong(b"$%d\r\n" % (2 << 20) + b"x" * (2 << 20) + b"\r\n")
    with scripted, FramedProxy(scripted.addr, framing=RESP) as proxy:
        client = clients(proxy.addr)
        assert client.ask("INCR n") == [b"-ERR upstream: out of step: a long reply that does not "
                                        b"answer b'*2\\r\\n$4\\r\\nINCR\\r\\n$1\\r\\nn\\r\\n'\r\n"]
        assert proxy.dirty == 1


class ScriptedLong(Server):
    """A fake Redis that answers every request with the one reply it was given."""

    def __init__(self, reply):
        super().__init__()
        self.reply = reply

    def handle(self, conn):
        frames = Frames(RESP.request_parser)
        while data := conn.recv(1 << 16):
            frames.feed(data)
            while frames.take() is not None:
                conn.sendall(self.reply)


def test_a_client_that_leaves_in_the_middle_of_a_long_request_costs_its_connection_alone(
        redis, control, clients):
    with FramedProxy(redis.addr, framing=RESP, pool_cap=1) as proxy:
        leaver = clients(proxy.addr)
        half = b"*3\r\n$3\r\nSET\r\n$4\r\nhalf\r\n$%d\r\n" % (4 << 20) + b"h" * (2 << 20)
        leaver.sock.sendall(half)
        leaver.close()
        proxy.wait_discarded(1)
        assert clients(proxy.addr).ask("GET half", "SET k v") == [b"$-1\r\n", b"+OK\r\n"]


# --- real clients with their defaults, through each pool kind -------------------------------------

@pytest.fixture(params=POOL_KINDS)
def pool_kind(request):
    return request.param


def redis_py(proxy, **options):
    import redis as redis_py_module
    return redis_py_module.Redis(host=proxy.addr[0], port=proxy.addr[1], socket_timeout=10,
                                 **options)


def the_issues_calls(client, other_db):
    """The calls of the table a new user of redis-py 8 writes first, with what each returned."""
    got = [client.set("k", "v"), client.get("k")]
    with client.pipeline() as pipe:
        got.append(pipe.set("p", 1).get("p").execute())
    with client.pipeline(transaction=False) as pipe:
        got.append(pipe.set("p", 2).get("p").execute())
    got += [other_db.get("k"), other_db.set("k", "one"), other_db.get("k"), client.get("k")]
    pubsub = client.pubsub()
    try:
        pubsub.subscribe("ch")
        got.append(pubsub.get_message(timeout=5))
        got.append(client.publish("ch", "hello"))
        got.append(pubsub.get_message(timeout=5))
    finally:
        pubsub.close()
    got += [client.blpop("q", timeout=1), client.rpush("q", "job"), client.blpop("q", timeout=1)]
    long = bytes(range(256)) * 8192   # 2 MB
    got += [client.set("long", long), client.get("long") == long]
    return got


def test_redis_py_with_its_defaults_does_every_call_of_the_table_as_it_does_directly(
        redis, control, pool_kind):
    import redis as redis_py_module
    direct = [redis_py_module.Redis(port=redis.addr[1], db=db, socket_timeout=10) for db in (0, 1)]
    try:
        expected = the_issues_calls(*direct)
    finally:
        for client in direct:
            client.close()
    control.command("FLUSHALL")
    with make_pool(pool_kind, redis) as proxy:
        pooled = [redis_py(proxy, db=db) for db in (0, 1)]
        try:
            assert the_issues_calls(*pooled) == expected
        finally:
            for client in pooled:
                client.close()


def test_redis_py_asyncio_with_its_defaults_sets_gets_pipelines_and_subscribes(
        redis, control, pool_kind):
    import redis.asyncio as redis_asyncio

    async def calls(port):
        client = redis_asyncio.Redis(port=port, socket_timeout=10)
        try:
            got = [await client.set("a", "1"), await client.get("a")]
            async with client.pipeline() as pipe:
                got.append(await pipe.incr("n").incr("n").execute())
            pubsub = client.pubsub()
            await pubsub.subscribe("ch")
            got.append(await pubsub.get_message(timeout=5))
            await client.publish("ch", "hi")
            got.append(await pubsub.get_message(timeout=5))
            await pubsub.aclose()
            return got
        finally:
            await client.aclose()

    with make_pool(pool_kind, redis) as proxy:
        assert asyncio.run(calls(proxy.addr[1])) == [
            True, b"1", [1, 2],
            {"type": "subscribe", "pattern": None, "channel": b"ch", "data": 1},
            {"type": "message", "pattern": None, "channel": b"ch", "data": b"hi"}]


def test_redis_py_with_a_password_authenticates_to_the_pool(redis, control, pool_kind):
    import redis as redis_py_module
    with make_pool(pool_kind, redis, framing=Resp(password="s3cret")) as proxy:
        for protocol in (3, 2):   # HELLO 3 AUTH, or AUTH then the rest
            client = redis_py(proxy, password="s3cret", protocol=protocol, db=1)
            try:
                assert client.set("k", protocol) is True and client.get("k") == b"%d" % protocol
            finally:
                client.close()
        stranger = redis_py(proxy, password="wrong")
        with pytest.raises(redis_py_module.AuthenticationError):
            stranger.get("k")
        stranger.close()


def test_redis_cli_speaks_resp3_through_the_pool_and_reads_its_maps(redis, control, pool_kind):
    need_redis("redis-cli")
    with make_pool(pool_kind, redis) as proxy:
        port = str(proxy.addr[1])
        runs = [subprocess.run(["redis-cli", "-3", "-p", port, *words], capture_output=True,
                               timeout=30)
                for words in (["HSET", "h", "f", "v"], ["HGETALL", "h"],
                              ["-n", "1", "HGETALL", "h"], ["MULTI"])]
    assert [run.stdout for run in runs] == [b"1\n", b"f v\n", b"\n", b"OK\n"]


@pytest.mark.slow
def test_redis_cli_pipe_with_100000_commands_has_every_one_acknowledged(redis, control, pool_kind):
    need_redis("redis-cli")
    count = 100_000
    commands = b"".join(array("SET", f"pipe:{number}", number) for number in range(count))
    with make_pool(pool_kind, redis) as proxy:
        run = subprocess.run(["redis-cli", "-p", str(proxy.addr[1]), "--pipe"], input=commands,
                             capture_output=True, timeout=300)
    assert (run.returncode, run.stdout.splitlines()[-1]) == (0, b"errors: 0, replies: %d" % count)
    assert control.command("DBSIZE") == b":%d\r\n" % count


@pytest.mark.parametrize("pipeline", [1, 16])
def test_redis_benchmark_in_resp3_completes_get_and_set_with_no_error(
        redis, control, pool_kind, pipeline):
    need_redis("redis-benchmark")
    with make_pool(pool_kind, redis, pool_cap=8) as proxy:
        run = subprocess.run(["redis-benchmark", "-3", "-p", str(proxy.addr[1]), "-t", "get,set",
                              "-n", "400", "-c", "8", "-P", str(pipeline), "-q"],
                             capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
        assert run.returncode == 0, run
        assert [line.split(b":")[0] for line in run.stdout.replace(b"\r", b"\n").split(b"\n")
                if b"requests per second" in line] == [b"SET", b"GET"]
        assert lost(proxy) == (0, 0)
    assert control.command("STRLEN key:__rand_int__") == b":3\r\n"


def lost(proxy):
    """What a pool counts of a client served badly: FramedProxy's connections checked in
    dirty or discarded, ManagedProxy's errors made and clients dropped."""
    if isinstance(proxy, ManagedProxy):
        return (proxy.failed, proxy.dropped)
    return (proxy.dirty, proxy.discarded)
