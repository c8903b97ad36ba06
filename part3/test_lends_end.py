"""Every lend has an end: what one client may hold of a pool, and for how long. A request has
a deadline for arriving whole, a held connection (MULTI, WATCH) one for its idleness, an
inline command a bound in bytes; and what a client holds is a connection of its own, never
one the others share, so an honest client beside the attack is served as if it were alone."""
import time

import pytest

from part2.managed import ManagedProxy
from part3 import acl, redis_server
from part3.conftest import POOL_KINDS, array, server_clients, wait_for
from part3.framed import SessionProxy
from part3.parser import MAX_INLINE
from part3.resp import RESP, Resp

PATIENCE = 1.0   # seconds each deadline under test is given: the honest client's pairs take less


def pool(redis, pool_kind="SessionProxy", **options):
    framing = options.pop("framing", RESP)
    deadlines = dict(request_timeout=PATIENCE, hold_timeout=PATIENCE, **options)
    if pool_kind == "ManagedProxy":
        return ManagedProxy([(redis.addr, 2)], framing=framing, **deadlines)
    return SessionProxy(redis.addr, framing=framing, pool_cap=2, **deadlines)


def honest_pairs(client, count=20, prefix="honest"):
    """SET then GET of a value of its own, count times: the slowest pair's seconds."""
    slowest = 0.0
    for number in range(count):
        started = time.monotonic()
        value = f"{prefix}-{number}"
        assert client.ask(f"SET {prefix} {value}", f"GET {prefix}") == [
            b"+OK\r\n", b"$%d\r\n%s\r\n" % (len(value), value.encode())]
        slowest = max(slowest, time.monotonic() - started)
    return slowest


@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_half_a_request_held_is_ended_at_its_deadline_and_the_honest_client_never_waits(
        redis, control, clients, pool_kind):
    with pool(redis, pool_kind) as proxy:
        holders = clients(proxy.addr, 3)
        honest = clients(proxy.addr)
        for holder in holders:
            holder.sock.sendall(b"*3\r\n$3\r\nSET\r\n$1\r\nk")
        assert honest_pairs(honest) < PATIENCE
        for holder in holders:
            assert holder.read() == b"-ERR tcp-proxy: no whole request within 1 s\r\n"
            assert holder.sock.recv(1) == b""
        assert control.command("GET k") == b"$-1\r\n"


@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_a_long_value_trickled_keeps_only_its_own_connection_and_only_until_its_deadline(
        redis, control, clients, pool_kind):
    with pool(redis, pool_kind) as proxy:
        trickler, honest = clients(proxy.addr, 2)
        trickler.sock.sendall(b"*3\r\n$3\r\nSET\r\n$4\r\nlong\r\n$%d\r\n" % (4 << 20) +
                              b"x" * (2 << 20))   # past the window: passing upstream, on its own
        started = time.monotonic()
        while time.monotonic() - started < PATIENCE / 2:
            trickler.sock.sendall(b"x")
            time.sleep(0.01)
        assert honest_pairs(honest) < PATIENCE
        assert trickler.read() == b"-ERR tcp-proxy: no whole request within 1 s\r\n"
        assert proxy.lending.dedicated == 1
        wait_for(lambda: proxy.lending.own == 0, "the trickler's own connection closed")
    assert control.command("EXISTS long") == b":0\r\n"


@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_a_transaction_idle_past_its_deadline_loses_its_connection_and_is_refused_saying_why(
        redis, control, clients, pool_kind):
    with pool(redis, pool_kind) as proxy:
        idlers = clients(proxy.addr, 3)
        honest = clients(proxy.addr)
        for idler in idlers:
            assert idler.ask("MULTI", "INCR n") == [b"+OK\r\n", b"+QUEUED\r\n"]
        assert honest_pairs(honest) < PATIENCE
        wait_for(lambda: proxy.lending.own == 0, "the idle transactions' connections closed")
        why = b"held its connection 1 s without a request"
        for idler in idlers:
            assert idler.ask("INCR n", "EXEC") == [
                b"-ERR tcp-proxy: INCR not sent: the transaction it is queued in " + why + b"\r\n",
                b"-EXECABORT tcp-proxy: the transaction " + why + b"; nothing in it ran\r\n"]
            assert idler.ask("MULTI", "INCR n", "EXEC") == [b"+OK\r\n", b"+QUEUED\r\n",
                                                           b"*1\r\n:1\r\n"]   # served again
            control.command("DEL n")


@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_an_inline_command_past_redis_servers_limit_is_refused_at_once(redis, clients, pool_kind):
    with pool(redis, pool_kind) as proxy:
        client = clients(proxy.addr)
        client.sock.sendall(b"GET " + b"k" * MAX_INLINE)   # no line end: it would never be whole
        assert client.read() == b"-ERR an inline command longer than %d bytes\r\n" % MAX_INLINE
        assert clients(proxy.addr).ask("PING") == [b"+PONG\r\n"]


@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_a_wait_for_a_connection_of_its_own_is_served_once_one_frees_within_the_deadline(
        redis, control, clients, pool_kind):
    with pool(redis, pool_kind, framing=Resp(dedicated_cap=1), checkout_timeout=5.0) as proxy:
        first, second = clients(proxy.addr, 2)
        first.send("BLPOP q 0")
        wait_for(lambda: any(" cmd=blpop " in c for c in server_clients(control)), "the wait")
        second.send("BLPOP r 0")   # waits for the one connection of their own there is
        wait_for(lambda: proxy.lending.waiting == 1, "the second wait's turn")
        control.command("RPUSH q job")
        assert first.read() == b"*2\r\n$1\r\nq\r\n$3\r\njob\r\n"
        wait_for(lambda: any(" cmd=blpop " in c for c in server_clients(control)), "its wait")
        control.command("RPUSH r job")
        assert second.read() == b"*2\r\n$1\r\nr\r\n$3\r\njob\r\n"
        assert (proxy.lending.dedicated, proxy.lending.waiting) == (1, 0)   # the one, reused


@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_a_request_that_comes_whole_in_a_trickle_within_its_deadline_is_served(
        redis, clients, pool_kind):
    with pool(redis, pool_kind) as proxy:
        client = clients(proxy.addr)
        request = array("SET", "slow", "value")
        for byte in request:
            client.sock.sendall(bytes([byte]))
        assert client.read() == b"+OK\r\n"


@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_a_connection_of_a_clients_own_used_for_a_wait_carries_a_subscription_next(
        redis, control, clients, pool_kind):
    """A connection kept for the next client's own use is synced from the state it carries,
    not as if just opened: as the pool's own ACL user it may not be made again (rq and celery
    wait, then subscribe)."""
    framing, _ = acl.confine(redis.addr)
    with pool(redis, pool_kind, framing=framing) as proxy:
        waiter, subscriber = clients(proxy.addr, 2)
        assert waiter.ask("BLPOP q 0.01") == [b"*-1\r\n"]
        assert subscriber.ask("SUBSCRIBE news") == [
            b"*3\r\n$9\r\nsubscribe\r\n$4\r\nnews\r\n:1\r\n"]
        if pool_kind == "SessionProxy":   # the wait's, used again (a managed stream has one
            assert proxy.lending.dedicated == 1   # of its own, never lent after)


@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_a_subscriber_that_falls_behind_then_reads_gets_every_message_and_what_follows(
        redis, control, clients, pool_kind):
    """Past its window the pool reads the stream no more (redis-server keeps the rest); once
    the subscriber has read, it reads on, with no request needed to wake it."""
    message = b"m" * 10_000
    with pool(redis, pool_kind) as proxy:
        subscriber = clients(proxy.addr)
        assert subscriber.ask("SUBSCRIBE news")[0].startswith(b"*3\r\n$9\r\nsubscribe")
        for _ in range(1500):   # 15 MB, past the window, while the subscriber reads nothing
            control.sock.sendall(array("PUBLISH", "news", message))
        for _ in range(1500):
            assert redis_server.read_resp(control) == b":1\r\n"
        published = b"*3\r\n$7\r\nmessage\r\n$4\r\nnews\r\n$10000\r\n" + message + b"\r\n"
        for _ in range(1500):
            assert subscriber.read() == published
        assert control.command("PUBLISH news after") == b":1\r\n"
        assert subscriber.read() == b"*3\r\n$7\r\nmessage\r\n$4\r\nnews\r\n$5\r\nafter\r\n"
