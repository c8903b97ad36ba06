"""What a Redis client's session holds a connection for: a transaction on the connection
the client holds, a wait or a stream on one of its own, each bounded and closed after."""
import re
import socket
import time

import pytest

from part2.managed import ManagedProxy
from part3.conftest import POOL_KINDS, Client, make_pool, server_clients, wait_for
from part3.framed import SessionProxy
from part3.resp import RESP, Resp
from ground.server import shutdown
from tcp_proxy import PassthroughProxy


# --- a transaction on the connection the client holds ----------------------------------------

@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_a_transaction_is_queued_on_the_clients_own_connection_while_others_run_beside_it(
        redis, control, clients, pool_kind):
    with make_pool(pool_kind, redis, framing=RESP, pool_cap=2) as proxy:
        inside, outside = clients(proxy.addr, 2)
        assert inside.ask("MULTI", "INCR n", "INCR n") == \
            [b"+OK\r\n", b"+QUEUED\r\n", b"+QUEUED\r\n"]
        assert outside.ask("INCR n") == [b":1\r\n"]   # not queued: it runs now, on the other
        assert inside.ask("EXEC") == [b"*2\r\n:2\r\n:3\r\n"]
        if pool_kind == "SessionProxy":   # its pool's counters
            assert (proxy.opened, proxy.discarded) == (2, 0)   # the held one checked in at EXEC


@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_a_watched_key_another_client_changes_aborts_the_exec_and_unwatch_lets_go(
        redis, control, clients, pool_kind):
    with make_pool(pool_kind, redis, framing=RESP, pool_cap=2) as proxy:
        watcher, writer = clients(proxy.addr, 2)
        assert watcher.ask("WATCH k") == [b"+OK\r\n"]
        assert writer.ask("SET k theirs") == [b"+OK\r\n"]
        assert watcher.ask("MULTI", "SET k mine", "EXEC") == \
            [b"+OK\r\n", b"+QUEUED\r\n", b"*-1\r\n"]
        assert watcher.ask("WATCH k", "UNWATCH", "GET k") == [b"+OK\r\n", b"+OK\r\n",
                                                            b"$6\r\ntheirs\r\n"]
        if pool_kind == "SessionProxy":   # its pool's counters
            assert (proxy.opened, proxy.discarded) == (2, 0)


@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_a_client_that_leaves_mid_transaction_has_its_connection_closed_never_lent_again(
        redis, control, clients, pool_kind):
    with make_pool(pool_kind, redis, framing=RESP, pool_cap=1) as proxy:
        leaver = clients(proxy.addr)
        assert leaver.ask("MULTI", "SET k leaver") == [b"+OK\r\n", b"+QUEUED\r\n"]
        leaver.close()
        wait_for(lambda: not server_clients(control), "its connection closed")
        assert clients(proxy.addr).ask("SET k next", "GET k") == [b"+OK\r\n", b"$4\r\nnext\r\n"]
        if pool_kind == "SessionProxy":   # its pool's counters
            assert proxy.opened == 2
    assert server_clients(control) == []


@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_a_request_the_pool_refuses_inside_multi_dooms_the_transaction_and_nothing_of_it_runs(
        redis, control, clients, pool_kind):
    with make_pool(pool_kind, redis, framing=RESP, pool_cap=1) as proxy:
        client = clients(proxy.addr)
        replies = client.ask("MULTI", "SET k 1", "SELECT 1", "EXEC", "GET k")
        assert replies[:2] == [b"+OK\r\n", b"+QUEUED\r\n"]
        assert replies[2].startswith(b"-ERR tcp-proxy: SELECT is the pool's to answer")
        assert replies[3:] == [b"-EXECABORT Transaction discarded because of previous errors.\r\n",
                               b"$-1\r\n"]
        assert (proxy.lending.dedicated, proxy.lending.own) == (1, 0)   # the doomed one closed


@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_a_subscribe_inside_a_transaction_dooms_it_and_after_watch_is_refused_until_unwatch(
        redis, control, clients, pool_kind):
    """redis-server queues a SUBSCRIBE inside MULTI and runs it at EXEC, which would turn the
    held connection into a stream: the pool refuses it, and so the transaction."""
    with make_pool(pool_kind, redis, pool_cap=1) as proxy:
        client = clients(proxy.addr)
        replies = client.ask("MULTI", "SUBSCRIBE a", "EXEC", "WATCH k", "SUBSCRIBE a", "UNWATCH")
        assert replies[0] == b"+OK\r\n" and replies[3] == replies[5] == b"+OK\r\n"
        assert replies[1].startswith(b"-ERR tcp-proxy: SUBSCRIBE inside a transaction")
        assert replies[2].startswith(b"-EXECABORT")
        assert replies[4].startswith(b"-ERR tcp-proxy: SUBSCRIBE while WATCH holds the connection")
        assert proxy.lending.dedicated == 2   # each transaction's own connection; no stream's


@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_reset_ends_a_transaction_by_closing_its_connection_and_the_session_starts_again(
        redis, control, clients, pool_kind):
    with make_pool(pool_kind, redis, framing=RESP, pool_cap=1) as proxy:
        client = clients(proxy.addr)
        assert client.ask("HELLO 3", "SELECT 3", "MULTI", "SET k 1", "RESET", "GET k")[2:] == \
            [b"+OK\r\n", b"+QUEUED\r\n", b"+RESET\r\n", b"$-1\r\n"]   # RESP2 and db 0 again
        assert (proxy.lending.dedicated, proxy.lending.own) == (1, 0)   # closed, never lent
    assert control.command("SELECT 3") == b"+OK\r\n" and control.command("GET k") == b"$-1\r\n"


# --- a wait or a stream on a connection of its own -------------------------------------------

@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_a_blocking_command_waits_on_a_connection_of_its_own_while_the_pool_serves_others(
        redis, control, clients, pool_kind):
    with make_pool(pool_kind, redis, framing=RESP, pool_cap=1) as proxy:
        waiter, other = clients(proxy.addr, 2)
        waiter.send("BLPOP q 0")
        assert other.ask("SET x 1", "GET x") == [b"+OK\r\n", b"$1\r\n1\r\n"]
        wait_for(lambda: any(" cmd=blpop " in c for c in server_clients(control)), "the wait")
        assert other.ask("RPUSH q job") == [b":1\r\n"]
        assert waiter.read() == b"*2\r\n$1\r\nq\r\n$3\r\njob\r\n"
        # its own connection, clean, kept for the next wait
        assert (proxy.lending.dedicated, len(proxy.lending.own_idle)) == (1, 1)


@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_a_blocking_command_with_a_timeout_is_answered_null_after_it_not_before(
        redis, clients, pool_kind):
    with make_pool(pool_kind, redis, framing=RESP) as proxy:
        client = clients(proxy.addr)
        started = time.monotonic()
        assert client.ask("BLPOP q 0.2", "HELLO 3", "BRPOP q 0.1")[::2] == [b"*-1\r\n", b"_\r\n"]
        assert time.monotonic() - started >= 0.3


@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_a_client_that_leaves_while_its_command_waits_has_that_connection_closed(
        redis, control, clients, pool_kind):
    with make_pool(pool_kind, redis, framing=RESP) as proxy:
        waiter = clients(proxy.addr)
        waiter.send("BLPOP q 0")
        wait_for(lambda: any(" cmd=blpop " in c for c in server_clients(control)), "the wait")
        waiter.close()
        wait_for(lambda: not server_clients(control), "the waiting connection closed")
    assert control.command("RPUSH q job") == b":1\r\n"   # nobody took it


@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_connections_of_their_own_are_bounded_and_past_the_bound_a_clear_error_says_so(
        redis, control, clients, pool_kind):
    framing = Resp(dedicated_cap=1)   # one waits for a free one, checkout_timeout at most
    if pool_kind == "SessionProxy":
        pool = SessionProxy(redis.addr, framing=framing, checkout_timeout=0.2)
    else:
        pool = ManagedProxy([(redis.addr, 1)], framing=framing, checkout_timeout=0.2)
    refusal = (b"-ERR tcp-proxy: no connection of its own free within 0.2 s: the pool's 1 "
               b"dedicated connections are all in use\r\n")
    with pool as proxy:
        first, second = clients(proxy.addr, 2)
        first.send("BLPOP q 0")
        wait_for(lambda: any(" cmd=blpop " in c for c in server_clients(control)), "the wait")
        assert second.ask("SUBSCRIBE news", "GET k") == [refusal, b"$-1\r\n"]
        assert second.ask("RPUSH q job") == [b":1\r\n"]
        assert first.read() == b"*2\r\n$1\r\nq\r\n$3\r\njob\r\n"


@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_a_subscription_streams_on_its_own_connection_until_its_last_unsubscribe(
        redis, control, clients, pool_kind):
    with make_pool(pool_kind, redis, framing=RESP, pool_cap=1) as proxy:
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
        if pool_kind == "SessionProxy":   # its pool's counters
            assert proxy.lending.own == 0 and proxy.opened == 2
        wait_for(lambda: len(server_clients(control)) == 1, "the stream's connection closed")


@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_resp3_pushes_reach_their_subscriber_between_the_replies_to_its_requests(
        redis, control, clients, pool_kind):
    with make_pool(pool_kind, redis, framing=RESP) as proxy:
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


@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_reset_and_quit_end_a_stream_and_unsubscribe_outside_one_is_answered_as_redis_does(
        redis, control, clients, pool_kind):
    with make_pool(pool_kind, redis, framing=RESP) as proxy:
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
        wait_for(lambda: proxy.lending.own == 0, "the lender's count of them")


@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_monitor_is_refused_by_the_pools_policy_and_streams_once_allowed_by_name(
        redis, control, clients, pool_kind):
    with make_pool(pool_kind, redis) as proxy:
        assert clients(proxy.addr).ask("MONITOR") == [
            b"-ERR tcp-proxy: MONITOR streams every client's commands to the connection; refused "
            b"by the pool's policy (allow it by name)\r\n"]
    with make_pool(pool_kind, redis, framing=Resp(allow={"MONITOR"})) as proxy:
        watcher = clients(proxy.addr)
        assert watcher.ask("MONITOR") == [b"+OK\r\n"]
        control.command("SET seen yes")
        assert re.fullmatch(rb'\+[0-9.]+ \[0 127\.0\.0\.1:\d+\] "SET" "seen" "yes"\r\n',
                            watcher.read())


class HoldsATransactionsRepliesUntilItsExec(PassthroughProxy):
    """A relay in front of redis-server: on a connection that has carried MULTI, once MULTI's
    reply has gone back, every reply waits until EXEC has gone upstream. A pool that sent
    a transaction's commands one reply at a time would wait on it for ever."""
    counters = {**PassthroughProxy.counters, "execs": 0}
    # execs  EXECs forwarded upstream; bumped as each goes

    def __init__(self, upstream_addr):
        self.transactions = {}   # upstream socket -> the replies gone back since its MULTI
        super().__init__(upstream_addr)

    def _one_way(self, source, sink, counter):
        deliver = self._forward if counter == "forwarded" else self._return
        self.pump(source, lambda data: deliver(source, sink, data), counter)
        shutdown(sink, socket.SHUT_WR)

    def _forward(self, client, upstream, data):
        if b"MULTI" in data:
            self.transactions[upstream] = 0
        upstream.sendall(data)
        if b"EXEC" in data:
            self.count("execs")

    def _return(self, upstream, client, data):
        if upstream in self.transactions:
            if self.transactions[upstream]:   # MULTI's own reply has gone back already
                self.wait_until(lambda: self.execs or self.closed, "the EXEC")
            self.transactions[upstream] += 1
        client.sendall(data)


def test_a_transactions_commands_go_to_its_connection_as_they_come_not_one_reply_at_a_time(
        redis, clients):
    sets = [f"SET t:{number} {number}" for number in range(10)]
    with HoldsATransactionsRepliesUntilItsExec(redis.addr) as relay, \
            ManagedProxy([(relay.addr, 1)], framing=RESP) as proxy:
        client = clients(proxy.addr)
        replies = client.ask("MULTI", *sets, "EXEC", "GET t:9")
    assert replies == [b"+OK\r\n"] + [b"+QUEUED\r\n"] * 10 + [
        b"*10\r\n" + b"+OK\r\n" * 10, b"$1\r\n9\r\n"]
    assert relay.execs == 1
