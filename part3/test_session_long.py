"""A value longer than the pool keeps, passed on as it arrives in both directions, within
a window of memory; a long reply that cannot answer its request reaches no one."""
import re
import socket

from part3.conftest import array, lost, make_pool
from part3.resp import RESP
from tcp_proxy import FramedProxy, Frames, Server


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
