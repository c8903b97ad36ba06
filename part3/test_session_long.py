"""A value longer than the pool keeps, passed on as it arrives in both directions, within
a window of memory, in its client's order behind a slower reply too; a long reply that cannot
answer its request reaches no one."""
import re
import socket

from part2.managed import ManagedProxy
from part3.conftest import Client, array, lost, make_pool, wait_for
from part3.resp import RESP
from ground.frames import Frames
from ground.server import Server, shutdown
from tcp_proxy import PassthroughProxy
from part3.framed import SessionProxy


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


def test_a_value_many_windows_long_goes_through_the_pool_and_back_in_bounded_memory(
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
        if pool_kind == "SessionProxy":
            proxy.wait_released(2)   # the GET's connection, checked in once its reply has passed
            assert (proxy.released, proxy.dirty) == (2, 0)
        grown = peak() - before
        assert (read, wrong, lost(proxy)) == (VALUE, 0, (0, 0))
    assert control.command("STRLEN huge") == b":%d\r\n" % VALUE
    assert grown < 16 << 20, f"{grown >> 20} MB"


def test_a_long_reply_waits_in_the_server_for_its_lone_slow_reader_and_never_for_another(
        redis, control):
    """ManagedProxy over one connection: a client GETs a value many windows long and reads
    none of it. With no other reply owed there, the connection stops reading once the
    client is a window behind, so the pool holds a window, not the value. Another client's
    GET is answered at once: the connection reads on, the rest of the value kept for its
    slow reader. That reader then gets every byte, in order."""
    value = bytes(range(256)) * (BIG // 256)
    control.command("FLUSHALL")
    setter = Client(redis.addr)
    assert setter.ask(array("SET", "big", value)) == [b"+OK\r\n"]
    setter.close()
    with ManagedProxy([(redis.addr, 1)], framing=RESP) as proxy:
        slow, other = Client(proxy.addr), Client(proxy.addr)
        try:
            slow.send(array("GET", "big"))
            wait_for(lambda: proxy.loop.ask(lambda: waiting_for_a_reader(proxy)),
                     "the connection waiting for its slow reader")
            held = proxy.loop.ask(lambda: max(stream.backlog() for stream in proxy.clients))
            assert held < BIG // 2
            assert other.ask(array("GET", "x")) == [b"$-1\r\n"]
            expected = b"$%d\r\n%s\r\n" % (BIG, value)
            received = bytearray()
            while len(received) < len(expected) and (data := slow.sock.recv(1 << 16)):
                received += data
            assert received == expected
        finally:
            slow.close()
            other.close()
        assert lost(proxy) == (0, 0)


def test_a_slow_reader_that_never_catches_up_ends_the_wait_at_its_deadline(redis, control):
    """The wait for a long reply's reader has a deadline (msg_timeout, from each catch-up):
    a reader that never reads ends the connection, which the next request finds remade."""
    setter = Client(redis.addr)
    assert setter.ask(array("SET", "big", b"b" * BIG)) == [b"+OK\r\n"]
    setter.close()
    with ManagedProxy([(redis.addr, 1)], framing=RESP, msg_timeout=0.5) as proxy:
        slow, other = Client(proxy.addr), Client(proxy.addr)
        try:
            slow.send(array("GET", "big"))
            wait_for(lambda: proxy.loop.ask(lambda: waiting_for_a_reader(proxy)),
                     "the connection waiting for its slow reader")
            managed = proxy.managed_set.clients[0][0]
            wait_for(lambda: ("up", "down", "message timeout (fatal)") in proxy.loop.ask(
                lambda: list(managed.transition_log)), "the wait's end at its deadline")
            assert other.ask(array("GET", "x")) == [b"$-1\r\n"]
        finally:
            slow.close()
            other.close()


def waiting_for_a_reader(proxy):
    """True once the set's one connection waits for a long reply's slow reader."""
    clients = proxy.managed_set.clients[0]
    connection = clients[0].connection if clients else None
    return connection is not None and connection.reader is not None


def test_a_long_reply_whose_first_bytes_cannot_answer_the_request_reaches_no_one(redis, clients):
    """An INCR answered with a bulk string longer than the pool keeps: out of step at its
    first bytes, before any of it is passed on."""
    scripted = ScriptedLong(b"$%d\r\n" % (2 << 20) + b"x" * (2 << 20) + b"\r\n")
    with scripted, SessionProxy(scripted.addr, framing=RESP) as proxy:
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
    with SessionProxy(redis.addr, framing=RESP, pool_cap=1) as proxy:
        leaver = clients(proxy.addr)
        half = b"*3\r\n$3\r\nSET\r\n$4\r\nhalf\r\n$%d\r\n" % (4 << 20) + b"h" * (2 << 20)
        leaver.sock.sendall(half)
        leaver.close()
        proxy.wait_discarded(1)
        assert clients(proxy.addr).ask("GET half", "SET k v") == [b"$-1\r\n", b"+OK\r\n"]


# --- a long reply behind its client's slower reply -------------------------------------------

class HoldsTheSlowKeysConnection(PassthroughProxy):
    """A relay in front of redis-server that holds every reply on the connection that
    carried a request for the key `slow`, from that request on, until release()."""
    counters = {**PassthroughProxy.counters, "held": 0, "behind": 0, "releases": 0}
    # held      connections whose replies are held; bumped as the request goes upstream
    # behind    requests for other keys sent on a held connection; bumped as each goes
    # releases  release() calls; the held replies go on once it is 1

    def __init__(self, upstream_addr):
        self.holding = set()   # the upstream sockets whose replies wait for release()
        super().__init__(upstream_addr)

    def release(self):
        self.count("releases")

    def _one_way(self, source, sink, counter):
        deliver = self._forward if counter == "forwarded" else self._return
        self.pump(source, lambda data: deliver(source, sink, data), counter)
        shutdown(sink, socket.SHUT_WR)

    def _forward(self, client, upstream, data):
        if b"slow" in data:
            self.holding.add(upstream)
            self.count("held")
        elif upstream in self.holding:
            self.count("behind")
        upstream.sendall(data)

    def _return(self, upstream, client, data):
        if upstream in self.holding:
            self.wait_until(lambda: self.releases or self.closed, "the release")
        client.sendall(data)


def test_a_long_reply_behind_its_clients_slower_reply_waits_on_the_same_connection(
        redis, control):
    """ManagedProxy over two connections: a client's GET slow goes on one, held by the relay;
    its GET big, sent after, goes behind it on the same one (on the other, it could run
    first), and another client is served on the other meanwhile. Released, both replies
    come whole, in order."""
    value = bytes(range(256)) * (BIG // 256)
    control.command("FLUSHALL")
    setter = Client(redis.addr)
    assert setter.ask(array("SET", "big", value)) == [b"+OK\r\n"]
    setter.close()
    with HoldsTheSlowKeysConnection(redis.addr) as relay, \
            ManagedProxy([(relay.addr, 2)], framing=RESP) as proxy:
        client, other = Client(proxy.addr), Client(proxy.addr)
        try:
            client.send(array("GET", "slow"))
            relay.wait_held(1)
            client.send(array("GET", "big"))
            assert other.ask(array("GET", "x")) == [b"$-1\r\n"]   # on the other connection
            relay.release()
            expected = b"$-1\r\n" + b"$%d\r\n%s\r\n" % (BIG, value)   # read raw: Client keeps
            received = bytearray()                                      # no reply this long
            while len(received) < len(expected) and (data := client.sock.recv(1 << 16)):
                received += data
            assert received == expected
            assert (relay.held, relay.behind) == (1, 1)   # big went on slow's connection
        finally:
            client.close()
            other.close()
        assert lost(proxy) == (0, 0)


BIG = 8 << 20   # bytes of the big value: the window and a read many times over
