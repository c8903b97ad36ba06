"""SessionProxy(framing=resp.RESP) for real Redis clients: requests framed whole (arrays
and inline commands), refused when they cannot be shared, errors in RESP's form, a
linear parse and deadlines. redis-cli, redis-py and redis-benchmark through it and
through ManagedProxy(framing=RESP) are test_client_libraries.py's.

Its sections go by subject, in the order a request meets them.
"""
import contextlib
import os
import socket
import subprocess
import threading
import time
import types

import pytest
from hypothesis import given, settings, strategies as st

from conftest import need_redis
from part3.conftest import REDIS_PROXIES, redis_py_client
from part3 import parser, words
from part3.resp import RESP
from part3 import redis_server
from part2.managed import ClientStream
from ground.frames import MAX_LINE
from ground.server import Server
from tcp_proxy import LINES, FramedProxy, read_lines
from part3.framed import SessionProxy

EXAMPLES = int(os.environ.get("SOAK", "40"))


def array(*words):
    """A request as every client library writes it: an array of bulk strings."""
    items = [word if isinstance(word, bytes) else str(word).encode() for word in words]
    return b"*%d\r\n" % len(items) + b"".join(b"$%d\r\n%s\r\n" % (len(item), item)
                                              for item in items)


def reader_of(sock):
    return types.SimpleNamespace(sock=sock, unread=b"")   # what redis_server.read_resp() reads from


def framed_pool(redis, **options):
    return SessionProxy(redis.addr, framing=RESP, **options)


# --- request framing, by hand and at random -------------------------------------------------

@pytest.mark.parametrize("buffer, size", [
    (array("GET", "a"), 20),
    (array("GET", "a") + array("GET", "b"), 20),        # pipelined: the first ends where it ends
    (array("SET", "k", "a\r\nb"), len(array("SET", "k", "a\r\nb"))),   # a value may hold \r\n
    (b"*2\r\n$3\r\nGET\r\n$1\r\na\r", None),
    (b"*2\r\n$3\r\nGET\r\n", None),
    (b"*2", None),
    (b"GET a\r\nGET b\r\n", 7),                         # an inline command
    (b"GET a\n", 6),                                    # redis-server also ends one at a bare \n
    (b"GET a", None),
    (b"\r\n", 2),                                       # a blank line: whole, and refused
    (b"*0\r\n", 4),
    (b"", None),
], ids=repr)
def test_request_size_by_hand(buffer, size):
    assert RESP.request_size(buffer) == size
    assert RESP.request_size(bytearray(buffer)) == size


@pytest.mark.parametrize("buffer", [
    b"*1\r\r$4\r\rPING\r\r",              # redis-server reads \r plus any byte as a line end here
    b"*1\r\n$4\r\rPING\r\n",
    b"*1\r\n$4\r\nPING\r\r",               # the bytes after a bulk string must be \r\n
    b"GET a\rb\r\n",                        # inline: a \r that ends nothing
    b"*1\r\n:1\r\n",                        # a request array holds bulk strings only
    b"*1\r\n*1\r\n$1\r\na\r\n",
    b"*1\r\n$-1\r\n",
    b"*x\r\n", b"*1\n",
    b"*2000000\r\n",                        # longer than max_request: it could never be buffered
    # each part fits; the whole would not
    b"*2\r\n$600000\r\n" + b"x" * 600000 + b"\r\n$600000\r\n",
    b"G" * (parser.MAX_INLINE + 1),
])
def test_a_malformed_request_is_a_value_error(buffer):
    with pytest.raises(ValueError):
        RESP.request_size(buffer)


@settings(max_examples=EXAMPLES, deadline=None)
@given(requests=st.lists(st.lists(st.binary(min_size=1, max_size=30), min_size=1, max_size=5),
                         min_size=1, max_size=6),
       points=st.lists(st.integers(0, 10**6), max_size=10))
def test_pipelined_arrays_cut_anywhere_are_framed_back_one_by_one_as_sent(requests, points):
    sent = [array(*words) for words in requests]
    stream = b"".join(sent)
    edges = sorted({0, len(stream), *(point % (len(stream) + 1) for point in points)})
    framed, buffer, size = [], bytearray(), RESP.request_parser()
    for start, end in zip(edges, edges[1:]):
        buffer += stream[start:end]
        while (length := size(buffer)) is not None:
            framed.append(bytes(buffer[:length]))
            del buffer[:length]
            size = RESP.request_parser()
    assert framed == sent and buffer == b""
    assert [words.words(request) for request in framed] == requests


def test_line_framing_frames_by_line_and_refuses_a_bare_carriage_return_and_an_overlong_line():
    assert [LINES.request_size(buffer)
            for buffer in (b"GET a\nGET b\n", b"GET a\r\n", b"GET a", b"\n")] == [6, 7, None, 1]
    for malformed in (b"GET a\rGET b\n", b"G" * (MAX_LINE + 1)):
        with pytest.raises(ValueError):
            LINES.request_size(malformed)
    assert (LINES.refusal(b"\r\n"), LINES.refusal(b"GET a\n")) == ("an empty request", None)


def test_words_and_fits_see_the_real_command_not_the_arrays_count():
    assert words.words(array("brpoplpush", "a", "b", "0")) == [b"brpoplpush", b"a", b"b", b"0"]
    assert words.words(b"  GET\t a  \r\n") == [b"GET", b"a"]
    assert RESP.fits(array("GET", "a"), b"$1\r\nx\r\n")
    # with `*2` as its command, anything fitted
    assert not RESP.fits(array("GET", "a"), b"+PONG\r\n")


def test_errors_are_written_in_each_protocols_own_form():
    assert RESP.error("upstream: gone\r\nEXTRA") == b"-ERR upstream: gone  EXTRA\r\n"
    assert LINES.error("upstream: gone") == b"ERR upstream: gone\n"


# --- a request hiding another -----------------------------------------------------------------

SMUGGLED = (b"*1\r\r$4\r\rPING\r\r*4\r\r$10\r\rBRPOPLPUSH\r\r$4\r\rfeed\r\r$9\r\rbalance:1\r\r"
            b"$1\r\r0\r\n")   # the line: PING, then a BRPOPLPUSH that blocks the connection


def test_a_request_hiding_a_second_behind_bare_carriage_returns_is_refused_and_reaches_no_one(
        redis, control):
    control.command("DEL feed balance:1")
    control.command("SET balance:2 victims-own")
    with framed_pool(redis, pool_cap=1) as proxy:
        with socket.create_connection(proxy.addr, timeout=10) as attacker:
            attacker.sendall(SMUGGLED)
            reply = redis_server.read_resp(reader_of(attacker))
            assert reply == b"-ERR a \\r not followed by \\n: b'*1\\r\\r'\r\n"
            assert attacker.recv(1) == b""   # nothing after it can be framed: the connection ends
        with socket.create_connection(proxy.addr, timeout=10) as victim:
            victim.sendall(array("GET", "balance:2"))
            assert redis_server.read_resp(reader_of(victim)) == b"$11\r\nvictims-own\r\n"
        assert proxy.opened == 1
    assert b"cmdstat_brpoplpush" not in control.command("INFO commandstats")


def test_the_line_pool_in_front_of_redis_refuses_the_smuggling_line_too(redis):
    with FramedProxy(redis.addr, framing=LINES) as proxy:
        with socket.create_connection(proxy.addr, timeout=10) as attacker:
            attacker.sendall(SMUGGLED)
            assert next(read_lines(attacker)).startswith(b"ERR a \\r not followed by \\n")
        assert proxy.opened == 0


# --- session state ----------------------------------------------------------------------------

STATE = "sets state on the connection that the next borrower would inherit"
SESSION = "speaks for the client's session: who it is, how it speaks, when it ends"


@pytest.mark.parametrize("words, rule", [
    (("WATCH", "k"),
     "WATCH is part of a transaction, state the connection keeps until EXEC or DISCARD"),
    (("subscribe", "news"),
     "SUBSCRIBE turns the connection into a stream of pushes no request asked for"),
    (("SELECT", "5"), f"SELECT {STATE}"),
    (("AUTH", "hunter2"), f"AUTH {SESSION}"),
    (("HELLO", "3"), f"HELLO {SESSION}"),
    (("CLIENT", "setname", "a"), f"CLIENT SETNAME {SESSION}"),
    (("BLPOP", "jobs", "0"), "BLPOP holds the connection for as long as it waits"),
    (("XREAD", "BLOCK", "0", "STREAMS", "s", "$"),
     "XREAD BLOCK holds the connection for as long as it waits"),
])
def test_a_session_without_a_pool_refuses_what_would_change_or_hold_its_connection_by_rule(
        words, rule):
    """A session given no pool to keep state for its client refuses what a pool's sessions
    answer, replay, pin or dedicate; what comes after it goes on."""
    session = RESP.session()
    assert session.admit(array(*words)) == \
        b"-ERR tcp-proxy: %s; a pool cannot lend it\r\n" % rule.encode()
    assert session.admit(array("SET", "after", "fine")) is None


def test_a_transaction_holds_its_connection_so_the_next_borrowers_set_is_never_queued_in_it(
        redis, control):
    """Before, refused: after A's MULTI, B's SET was answered +QUEUED on A's connection, and
    lost. Now A's connection is A's from MULTI to EXEC; B's SET goes on the other one."""
    control.command("DEL b-key")
    with framed_pool(redis, pool_cap=2) as proxy, \
            socket.create_connection(proxy.addr, timeout=10) as a, \
            socket.create_connection(proxy.addr, timeout=10) as b:
        a.sendall(array("MULTI"))
        assert redis_server.read_resp(reader_of(a)) == b"+OK\r\n"
        b.sendall(array("SET", "b-key", "b-value"))
        assert redis_server.read_resp(reader_of(b)) == b"+OK\r\n"   # not +QUEUED
        a.sendall(array("EXEC"))
        assert redis_server.read_resp(reader_of(a)) == b"*0\r\n"   # nothing was queued in it
    assert control.command("GET b-key") == b"$7\r\nb-value\r\n"


# --- a transaction, whole or not at all ------------------------------------------------------

MULTI_REFUSED = (b"-ERR tcp-proxy: MULTI is part of a transaction, state the connection keeps "
                 b"until EXEC or DISCARD; a pool cannot lend it; the pool refuses the whole "
                 b"transaction: nothing up to its EXEC or DISCARD is sent\r\n")
EXEC_ABORTED = (b"-EXECABORT tcp-proxy: the transaction was refused at its MULTI; nothing in it "
                b"ran\r\n")


def not_sent(name):
    return (b"-ERR tcp-proxy: %s not sent: the transaction it is queued in was refused at its "
            b"MULTI\r\n" % name)


def test_every_request_from_a_refused_multi_to_its_exec_or_discard_is_answered_and_never_sent():
    """A session given no pool refuses MULTI, and with it every request up to the EXEC or
    DISCARD that ends the transaction: answered in the client's order, none sent on."""
    sent = []
    stream = ClientStream(RESP, types.SimpleNamespace(answered=0, failed=0),
                          types.SimpleNamespace(out=bytearray(), write=None))
    stream.transport.write, stream.gather = stream.transport.out.extend, sent.extend
    stream.received(array("MULTI") + array("SET", "t:a", 1) + b"\r\n" + array("MULTI") +
                    array("EXEC", "now") + array("DISCARD") + array("SET", "t:b", 2) +
                    array("multi") + b"GET t:b\r\n" + array("exec") + array("EXEC"))
    assert [request.data for request in sent] == [array("SET", "t:b", 2)]   # sent: that alone
    stream.replied(sent[0], b"+OK\r\n")
    assert bytes(stream.transport.out) == b"".join([
        MULTI_REFUSED, not_sent(b"SET"), not_sent(b"MULTI"), not_sent(b"EXEC"),   # a blank: nothing
        b"+OK\r\n",                                  # DISCARD ends it, as redis-server's does
        b"+OK\r\n",                                  # SET t:b, sent: the transaction is over
        MULTI_REFUSED, not_sent(b"GET"), EXEC_ABORTED,
        b"-ERR tcp-proxy: EXEC is part of a transaction, state the connection keeps until EXEC or "
        b"DISCARD; a pool cannot lend it\r\n"])     # EXEC with no MULTI: refused alone


# --- a request too long to keep: read to its end, answered, never a reset -----------------------

@pytest.mark.parametrize("proxy_kind", ["SessionProxy", "ManagedProxy"])
def test_a_request_and_a_reply_longer_than_the_pool_keeps_are_passed_on_as_they_arrive(
        redis, control, proxy_kind):
    """redis-py's test_large_responses: the 5 MB SET goes upstream as it arrives and the
    GET's reply comes back the same way, past the 1 MiB the pool keeps. Before, through
    ManagedProxy: the SET was read to its end, dropped and answered too long."""
    control.command("DEL large")
    value = bytes(range(256)) * 20_000   # 5,120,000 bytes, no two pieces alike
    with REDIS_PROXIES[proxy_kind](redis, 1) as proxy:
        client = redis_py_client(proxy)
        try:
            assert client.set("large", value) is True
            assert client.get("large") == value
            assert client.set("small", "fine") is True
            # the SET on a connection of its own, the GET's reply on the shared one
            assert (proxy.connections, proxy.lending.dedicated) == (1, 1)
        finally:
            client.close()
            client.connection_pool.disconnect()
    assert control.command("STRLEN large") == b":5120000\r\n"


def test_a_client_whose_bytes_cannot_be_framed_reads_its_error_then_the_end_never_a_reset(redis):
    """The pool answers bytes it cannot frame with an error and ends the connection; the
    client has 2 MB still on the way. Before: the pool closed with them unread, the kernel
    sent a reset, and the client's next read failed (Connection reset by peer)."""
    malformed = b"*1\r\r$4\r\rPING\r\r" + b"x" * (2 << 20)
    with framed_pool(redis) as proxy, socket.create_connection(proxy.addr, timeout=10) as client:

        def write():
            with contextlib.suppress(OSError):   # a reset would end the write too: the read says
                client.sendall(malformed)

        writer = threading.Thread(target=write)
        writer.start()
        received = b""
        try:
            while data := client.recv(4096):
                received += data
        finally:
            writer.join()
    assert received == b"-ERR a \\r not followed by \\n: b'*1\\r\\r'\r\n"


# --- blank lines ------------------------------------------------------------------------------

def test_a_blank_line_is_answered_at_once_by_the_line_pool_and_never_sent_upstream(redis):
    # the client's timeout, 2.5 s: well under reply_timeout (5 s)
    with FramedProxy(redis.addr, framing=LINES) as proxy, \
            socket.create_connection(proxy.addr, timeout=2.5) as client:
        client.sendall(b"\r\n" * 3)
        error = b"ERR tcp-proxy: an empty request\n"
        received = b""
        while len(received) < 3 * len(error):
            received += client.recv(4096)
        assert received == error * 3
        assert proxy.opened == 0


BLANKS = b"\r\n" + b"  \r\n" + b"\n" + b"\t\r\n" + b"*0\r\n" + b"*-1\r\n"   # none answered


def test_redis_server_answers_blank_lines_and_empty_arrays_with_nothing(redis):
    with socket.create_connection(redis.addr, timeout=5) as direct:
        direct.sendall(BLANKS + b"PING\r\n")
        assert redis_server.read_resp(reader_of(direct)) == b"+PONG\r\n"
        direct.settimeout(0.2)
        with pytest.raises(TimeoutError):
            direct.recv(1)   # nothing more: the blanks got no reply


@pytest.mark.parametrize("proxy_kind", ["SessionProxy", "ManagedProxy"])
def test_blank_lines_and_empty_arrays_are_answered_with_nothing_as_redis_server_does(
        redis, proxy_kind):
    """Before: each got `-ERR tcp-proxy: an empty request`, a reply redis-server never
    writes, so a client counting replies (redis-cli --pipe) counted an error."""
    with REDIS_PROXIES[proxy_kind](redis, 1) as proxy, \
            socket.create_connection(proxy.addr, timeout=5) as client:
        client.sendall(BLANKS + b"PING\r\n" + BLANKS + array("ECHO", "after"))
        reader = reader_of(client)
        replies = [redis_server.read_resp(reader) for _ in range(2)]
        assert replies == [b"+PONG\r\n", b"$5\r\nafter\r\n"]
        client.settimeout(0.2)
        with pytest.raises(TimeoutError):
            client.recv(1)
        assert reader.unread == b""


def test_redis_cli_pipe_ending_with_a_blank_line_reads_every_reply_with_no_error(redis, control):
    """redis-cli --pipe counts the replies it reads; a blank line it sends is answered with
    nothing by redis-server, and now by the pool. Before: `errors: 1`, exit status 1."""
    need_redis("redis-cli")
    count = 1000   # the property is per request; BENCH.md has the volume
    commands = b"".join(array("SET", f"pipe:{number}", number) for number in range(count)) + b"\r\n"
    with framed_pool(redis) as proxy:
        run = subprocess.run(["redis-cli", "-p", str(proxy.addr[1]), "--pipe"], input=commands,
                             capture_output=True, timeout=60)
    assert (run.returncode, run.stderr) == (0, b""), run
    assert run.stdout.splitlines()[-1] == b"errors: 0, replies: %d" % count
    assert control.command(f"GET pipe:{count - 1}") == b"$3\r\n%d\r\n" % (count - 1)


# --- the framing is linear --------------------------------------------------------------------

LONG_LIST = 98_000   # elements of 4 bytes: a 980,008-byte LRANGE reply, just under max_reply


def long_reply():
    return b"*%d\r\n" % LONG_LIST + b"$4\r\nvvvv\r\n" * LONG_LIST


def test_a_long_reply_read_in_small_pieces_is_parsed_once_line_by_line():
    reply, buffer, size = long_reply(), bytearray(), RESP.reply_parser()
    for start in range(0, len(reply), 4096):
        buffer += reply[start:start + 4096]
        end = size(buffer)
    assert (end, len(reply), size.lines) == (980_008, 980_008, LONG_LIST + 1)


@pytest.mark.parametrize("proxy_kind", REDIS_PROXIES)
def test_a_long_lrange_through_the_pool_is_framed_in_one_pass_within_a_ceiling(
        redis, control, proxy_kind):
    """ManagedProxy's reader once parsed each reply from byte 0 after every recv(), and took
    longer than the bound here; the pipeline's reader keeps its place (ground.frames.Frames)."""
    control.command("DEL long")
    for _ in range(LONG_LIST // 1000):
        control.command("RPUSH long " + " ".join(["vvvv"] * 1000))
    with REDIS_PROXIES[proxy_kind](redis, 1) as proxy, \
            socket.create_connection(proxy.addr, timeout=60) as client:
        started = time.monotonic()
        client.sendall(array("LRANGE", "long", "0", "-1"))
        received = 0
        while received < len(long_reply()):   # counted, not parsed: only the pool's parse is timed
            received += len(client.recv(1 << 16))
        elapsed = time.monotonic() - started
    assert received == 980_008
    assert elapsed < 5.0, (f"{elapsed:.2f} s (0.4 s measured on a loaded machine; "
                           f"55 s when it was quadratic)")


# --- a reply RESP cannot frame ----------------------------------------------------------------

class ScriptedByRequest(Server):
    """A fake Redis that answers each inline request line with replies[line], as given."""
    counters = {**Server.counters, "requests": 0}
    # requests  request lines read; bumped per line, before its reply is written

    def __init__(self, replies):
        super().__init__()
        self.replies = replies

    def handle(self, conn):
        for line in read_lines(conn):
            self.count("requests")
            conn.sendall(self.replies[line.rstrip(b"\r")])


@pytest.mark.parametrize("bad", [b"%1\r\n+a\r\n+b\r\n", b"$x\r\n", b"$?\r\n"],
                         ids=["a-map-to-get", "bad-length", "streamed"])
def test_a_reply_resp_cannot_frame_costs_an_error_and_its_connection_and_the_rest_are_served(bad):
    with ScriptedByRequest({b"GET bad": bad, b"GET good": b"$4\r\nfine\r\n"}) as upstream, \
            SessionProxy(upstream.addr, framing=RESP) as proxy, \
            socket.create_connection(proxy.addr, timeout=10) as client:
        reader = reader_of(client)
        client.sendall(b"GET bad\r\nGET good\r\n")
        assert redis_server.read_resp(reader).startswith(b"-ERR upstream: out of step: ")
        assert redis_server.read_resp(reader) == b"$4\r\nfine\r\n"
        assert (proxy.opened, proxy.dirty, proxy.released) == (2, 1, 1)


# --- a deadline for the whole reply, and for checkout -----------------------------------------

class Trickle(Server):
    """An upstream that answers every request with a long reply, one byte at a time, a
    byte every `interval` seconds: never silent for long, never done."""
    counters = {**Server.counters, "requests": 0}
    # requests  request lines read; bumped before the trickle starts

    def __init__(self, interval):
        super().__init__()
        self.interval = interval

    def handle(self, conn):
        for _ in read_lines(conn):
            self.count("requests")
            for byte in b"$60\r\n" + b"t" * 60 + b"\r\n":
                with self._lock:   # the fault's own pace, cut short by close(), which notifies
                    if self._lock.wait_for(lambda: self.closed, self.interval):
                        return
                conn.sendall(bytes([byte]))


@pytest.mark.slow
def test_a_trickling_reply_errs_at_the_exchange_deadline_and_a_waiting_borrower_at_checkout():
    with Trickle(interval=0.025) as upstream, \
            SessionProxy(upstream.addr, framing=RESP, reply_timeout=0.5, exchange_timeout=1.0,
                        checkout_timeout=0.25) as proxy, \
            socket.create_connection(proxy.addr, timeout=10) as first, \
            socket.create_connection(proxy.addr, timeout=10) as second:
        started = time.monotonic()
        first.sendall(b"GET a\r\n")
        upstream.wait_requests(1)
        second.sendall(b"GET b\r\n")
        assert redis_server.read_resp(reader_of(second)) == \
            b"-ERR upstream: no upstream connection free within 0.25 s\r\n"
        assert redis_server.read_resp(reader_of(first)) == (
            b"-ERR upstream: no whole reply within 1 s\r\n")
        elapsed = time.monotonic() - started
        assert (proxy.opened, proxy.discarded) == (1, 1)
    # and the error, not the value: the trickle takes 67 x 0.025 s = 1.675 s at least
    assert elapsed >= 1.0


def test_the_defaults_bound_each_silence_the_whole_reply_and_the_wait_for_a_connection():
    with SessionProxy(("127.0.0.1", 9), framing=RESP) as proxy:
        assert (proxy.reply_timeout, proxy.exchange_timeout,
                proxy.checkout_timeout) == (5.0, 10.0, 5.0)


# --- the wait for a reply: poll(), not select() -----------------------------------------------

def test_the_timeout_release_waits_with_poll_so_a_descriptor_past_fd_setsize_works(redis):
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"descriptors are capped at {hard} here")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    # what is opened next is above 1023
    fillers = [os.open(os.devnull, os.O_RDONLY) for _ in range(1030)]
    try:
        with SessionProxy(redis.addr, framing=RESP, release="timeout",
                         release_timeout=0.05) as proxy, \
                socket.create_connection(proxy.addr, timeout=10) as client:
            client.sendall(b"PING\r\n")
            assert redis_server.read_resp(reader_of(client)) == b"+PONG\r\n"
    finally:
        for descriptor in fillers:
            os.close(descriptor)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# --- pipelining ------------------------------------------------------------------------------

def test_a_client_pipelining_arrays_and_inline_commands_in_one_write_is_answered_in_order(
        redis, control):
    with framed_pool(redis, pool_cap=2) as proxy, \
            socket.create_connection(proxy.addr, timeout=10) as client:
        requests = [array("SET", f"pipe{n}", f"value{n}") for n in range(50)]
        requests += [array("GET", f"pipe{n}") if n % 2 else b"GET pipe%d\r\n" % n
                     for n in range(50)]
        client.sendall(b"".join(requests))
        reader = reader_of(client)
        replies = [redis_server.read_resp(reader) for _ in requests]
    assert replies == [b"+OK\r\n"] * 50 + [b"$%d\r\nvalue%d\r\n" % (len(b"value%d" % n), n)
                                           for n in range(50)]
