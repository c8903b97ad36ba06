"""Trust in tcp_proxy.py and part3/tagged.py when peers and clients lie, one claim per
test, with exact figures. Each test failed on the code before its fix; its docstring or
comment says how ("Before: ...").

    the fit check      a shifted reply reaches no one, through FramedProxy and through
                       Part two's pipelined ManagedProxy
    the accept loop    a thread that cannot start costs one connection
    NaiveProxy         a pipelined flood moves, and close() returns
    addresses          an upstream's own IPv6 .addr works; a bad one leaves nothing
    logs               bounded in bytes as well as entries
    TaggedClient       the send under the deadline; timed-out ids bounded
    TaggedUpstream     a bound on its threads over all connections
"""
import contextlib
import re
import socket
import threading
import time

import pytest
from hypothesis import given, settings, strategies as st

from part2.managed import ManagedProxy, ReliabilityCache
from part2.managed_demo import ask, in_background
from part3.tagged import CallTimeout, TaggedClient, TaggedError, TaggedUpstream
from scaffolding import kit
from scaffolding.faults import FaultyUpstream
from ground.frames import MAX_LINE
from ground.server import Hooks
from tcp_proxy import (FramedProxy, LINES, LOG_LINE_MAX, NaiveProxy, PassthroughProxy, Upstream,
                       answer)


def connect(stack, addr):
    client = kit.Client("test", addr, timeout=5)
    stack.callback(client.close)
    return client


# --- the fit check: a reply fits only the request whose reply it is ---------------------
#
# Before: fits() let any ERR line answer any request, and any reply starting `k=` answer
# `GET k`; each variant below gave the victim the other client's bytes, in both pools.

# (the victim's request, the other client's request, the other's bytes the victim must never see)
SHIFTS = {
    "another's ERR answers a GET": (b"GET alice9", b"LOGIN bob9 hunter2", b"hunter2"),
    "a key holding '=' answers a GET": (b"GET alice9", b"GET alice9=bob-session=s3cret",
                                        b"bob-session"),
    "another's ERR answers a request that gets an ERR": (b"LOGIN alice9 pw", b"LOGIN bob9 hunter2",
                                                         b"hunter2"),
}

# request lines built of the pieces that matter: commands, separators, quotes, \r, one key's letters
LINE_PIECES = [b"GET", b"PING", b"LOGIN", b" ", b"=", b"a", b"A", b"b", b"'", b"\r", b"1", b"\xff"]
request_lines = st.lists(st.sampled_from(LINE_PIECES), max_size=12).map(b"".join)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(ours=request_lines, theirs=request_lines)
def test_a_reply_fits_a_request_only_if_it_is_that_requests_own_reply(ours, theirs):
    """Before: fits(b"x\\n", answer(b"y")) was True (any ERR answered anything)."""
    assert LINES.fits(ours + b"\n", answer(ours))
    assert LINES.fits(ours + b"\n", answer(theirs)) == (answer(theirs) == answer(ours))


def test_the_fit_check_sees_the_whole_shape_of_a_reply_and_not_its_value():
    fits = LINES.fits
    assert [fits(b"GET alpha\n", reply) for reply in (
        b"alpha=AAAAAAAAAAAA\n",                  # its own reply
        # the right shape, another value: a shape cannot tell
        b"alpha=BBBBBBBBBBBB\n",
        b"alpha=AAAAAAAAAAA\n",                   # 11 copies
        b"alpha=AAAAAAAAAAAB\n",                  # not one byte repeated
        b"alpha=bob=AAAAAAAAAAAA\n",              # GET alpha=bob's reply
        # quotes it, but a GET is never refused
        b"ERR expected 'GET <key>' or 'PING', got 'GET alpha'\n",
    )] == [True, True, False, False, False, False]
    assert fits(b"PING\n", b"PONG\n") and not fits(b"PING\n", answer(b"LOGIN bob9 hunter2"))
    assert fits(b"GET a\r\n", b"a=AAAAAAAAAAAA\n")   # answer() reads the line without its \r
    # two requests whose ERR quotes are the same 40 bytes:
    same_40 = b"LOGIN bob9 hunter2 " + b"x" * 21
    assert fits(same_40 + b"1\n", answer(same_40 + b"2"))   # identical bytes, so nothing leaks
    # what Upstream says to a line past MAX_LINE
    overlong = b"ERR line longer than %d bytes\n" % MAX_LINE
    assert fits(b"GET " + b"k" * MAX_LINE + b"\n", overlong) and not fits(b"GET k\n", overlong)


class RepeatsItsFirstReplyLate(Upstream):
    """Writes reply 1 again, unasked, once request 2 has arrived: after quiet() looked, so
    the copy is the first thing request 2's borrower reads."""

    def reply(self, conn, data):
        super().reply(conn, data)
        if self.replies == 1:
            self.wait_requests(2)
            conn.sendall(data)


@pytest.mark.parametrize("victim, other, secret", SHIFTS.values(), ids=SHIFTS.keys())
def test_framed_proxy_answers_a_repeated_reply_with_an_err_that_holds_none_of_it(
        victim, other, secret):
    """Before: the victim received the other client's reply, secret included."""
    with RepeatsItsFirstReplyLate() as upstream, FramedProxy(upstream.addr, pool_cap=1) as proxy, \
            contextlib.ExitStack() as stack:
        bob, alice = connect(stack, proxy.addr), connect(stack, proxy.addr)
        bob.send(other + b"\n")
        assert bob.read_line() == answer(other)
        alice.send(victim + b"\n")
        received = alice.read_line()
        assert received == (b"ERR upstream: out of step: a reply of %d bytes does not answer %r\n"
                            % (len(answer(other)), victim + b"\n"))
        assert secret not in received and (proxy.dirty, proxy.released) == (1, 1)


@pytest.mark.parametrize("fault", ["skip", "extra"])
@pytest.mark.parametrize("victim, other, secret", SHIFTS.values(), ids=SHIFTS.keys())
def test_pipelined_managed_proxy_answers_a_skipped_or_repeated_reply_with_an_error(
        victim, other, secret, fault):
    """skip: the victim's reply never comes, so the other's comes first; extra: the other's
    reply comes twice. Before: the victim received the other's reply, secret included."""
    first, second = (victim, other) if fault == "skip" else (other, victim)
    lost = "ERR MessageLost: upstream out of step: a reply did not fit its request"
    # both requests are on the one connection before any reply
    with FaultyUpstream(gate=2) as upstream:
        upstream.fail_next(1, how=fault)
        with ManagedProxy([(upstream.addr, 1)], rcache=ReliabilityCache()) as proxy:
            asked_first = in_background(ask, proxy.addr, [first.decode()])
            upstream.wait_requests(1)
            asked_second = in_background(ask, proxy.addr, [second.decode()])
            replies = {first: asked_first.result()[0], second: asked_second.result()[0]}
    assert replies[victim] == lost and secret.decode() not in replies[victim]
    assert replies[other] == (lost if fault == "skip" else answer(other).decode().rstrip("\n"))


# --- the accept loop: no error ends it --------------------------------------------------

class OutOfThreadsOnce(Upstream):
    """spawn() fails once for a connection's thread, as a system out of threads does."""
    refused = 0   # connections whose thread did not start; bumped by spawn()

    def spawn(self, target, *args):
        if target == self.serve_connection and not self.refused:
            self.refused += 1
            raise RuntimeError("can't start new thread")
        return super().spawn(target, *args)


def test_a_connection_whose_thread_cannot_start_is_closed_and_the_next_one_is_served():
    """Before: the RuntimeError ended the accept loop; the first client's read timed out
    (its connection was never closed) and no later client was ever accepted."""
    with OutOfThreadsOnce() as upstream, contextlib.ExitStack() as stack:
        assert connect(stack, upstream.addr).read_to_eof() == b""   # closed, not left hanging
        assert kit.ask_in_turn(connect(stack, upstream.addr), ["alpha"]) == 1
        assert (upstream.refused, upstream.connections) == (1, 2)


# --- NaiveProxy under a flood: it may misroute, but it moves ----------------------------

FLOOD_REQUEST = b"GET %s\n" % (b"k" * 60_000)
FLOOD = 1000   # requests of 60 kB: 60 MB each way, far past what loopback's buffers hold


def fill_every_buffer(sock, flood):
    """Write the flood until no byte has gone for 0.5 s: every buffer between here and the
    upstream and back is full, and the relay's writes wait. Return how many bytes went."""
    sock.settimeout(0.5)
    written = 0
    with contextlib.suppress(TimeoutError):
        while written < len(flood):
            written += sock.send(flood[written:])
    return written


def close_within(server, seconds):
    """Run server.close() on a thread; True if it returned within `seconds`."""
    closing = threading.Thread(target=server.close)
    closing.start()
    closing.join(seconds)
    return not closing.is_alive()


@pytest.mark.slow
def test_naive_relay_passes_on_every_reply_of_a_flood_once_its_client_reads():
    """The client writes until everything is full, then reads. Before: forward() held the
    lock across its write upstream, and route() needed it to pass the next reply on:
    nothing moved again (71 replies of 1000 in the run checked, then none in 5 s)."""
    flood = memoryview(FLOOD_REQUEST * FLOOD)
    with Upstream() as upstream:
        proxy = NaiveProxy(upstream.addr)
        client = kit.Client("flooder", proxy.addr)
        written = fill_every_buffer(client.sock, flood)
        client.sock.settimeout(5)   # from here on, 5 s without a byte is a wedged relay

        def write_the_rest():
            with contextlib.suppress(OSError):   # shut down below, if the relay wedged
                client.sock.sendall(flood[written:])

        writer = threading.Thread(target=write_the_rest)
        writer.start()
        replies = 0
        with contextlib.suppress(TimeoutError):
            while replies < FLOOD and client.read_line() == answer(FLOOD_REQUEST[:-1]):
                replies += 1
        client.sock.shutdown(socket.SHUT_RDWR)   # a wedged writer (before the fix) ends too
        writer.join()
        client.close()
        closed = close_within(proxy, 2)
        upstream.close()   # before the fix, what let a wedged close() end
        proxy.close()
        assert written < len(flood) and (replies, closed) == (FLOOD, True)


def test_naive_relay_closes_promptly_while_a_client_that_never_reads_floods_it():
    """Before: close() waited for ever on the lock forward() held across a write that
    could not finish."""
    with Upstream() as upstream:
        proxy = NaiveProxy(upstream.addr)
        with socket.create_connection(proxy.addr) as flooder:
            written = fill_every_buffer(flooder, memoryview(FLOOD_REQUEST * FLOOD))
            closed = close_within(proxy, 2)
        upstream.close()   # before the fix, what let a wedged close() end
        proxy.close()
        assert written < len(FLOOD_REQUEST * FLOOD) and closed


# --- addresses of any family ------------------------------------------------------------

def skip_without_ipv6_loopback():
    if not socket.has_ipv6:
        pytest.skip("this Python has no IPv6")
    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
    except OSError as error:
        pytest.skip(f"::1 cannot be bound here: {error}")


class UpstreamOnIPv6(Upstream):
    listen_addr = ("::1", 0)


class TaggedUpstreamOnIPv6(TaggedUpstream):
    listen_addr = ("::1", 0)


@pytest.mark.parametrize("proxy_class", [NaiveProxy, FramedProxy, PassthroughProxy])
def test_every_proxy_reaches_an_upstream_on_ipv6_by_its_own_addr(proxy_class):
    """Before: the upstream listened on 127.0.0.1 whatever it asked (and Server.listen(("::1",
    0)) was refused); given a 4-tuple, connect() raised ValueError."""
    skip_without_ipv6_loopback()
    with (UpstreamOnIPv6() as upstream, proxy_class(upstream.addr) as proxy,
          contextlib.ExitStack() as stack):
        assert upstream.addr[0] == "::1" and len(upstream.addr) == 4
        assert kit.ask_in_turn(connect(stack, proxy.addr), ["alpha", "beta"]) == 2
        assert proxy.opened == 1


def test_a_tagged_client_reaches_a_tagged_upstream_listening_on_ipv6_by_its_addr():
    skip_without_ipv6_loopback()
    with TaggedUpstreamOnIPv6() as upstream, TaggedClient(upstream.addr) as client:
        assert len(upstream.addr) == 4 and client.call(b"GET alpha\n") == answer(b"GET alpha")


BAD_ADDRESSES = [("127.0.0.1",), ("127.0.0.1", 80, 0), "127.0.0.1:80"]


@pytest.mark.parametrize("bad", BAD_ADDRESSES, ids=repr)
def test_every_proxy_refuses_a_bad_address_and_leaves_no_thread_or_socket(bad):
    """Before: ("127.0.0.1", 80, 0) left NaiveProxy's accept thread running (only OSError
    was cleaned up), and PassthroughProxy and FramedProxy took any address."""
    before = set(threading.enumerate())
    for relay in (NaiveProxy, PassthroughProxy, FramedProxy):
        with pytest.raises(ValueError, match=r"an address is \(host, port\)"):
            relay(bad)
    assert set(threading.enumerate()) == before


class BadlyConnectingPool(FramedProxy):
    """A pool whose connect() fails with an error that is not an OSError."""

    def connect(self, addr, read_timeout=None):
        raise ValueError("a connect that fails in an unexpected way")


# the ValueError
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_framed_pool_frees_the_slot_a_connect_reserved_whatever_the_connect_raises():
    """The error ends that client's handler (the client sees its connection close).
    Before: only an OSError freed the slot, and the second client waited for ever."""
    with (BadlyConnectingPool(("127.0.0.1", 1), pool_cap=1) as proxy,
          contextlib.ExitStack() as stack):
        for _ in range(2):   # a slot kept would make the second request wait for ever
            client = connect(stack, proxy.addr)
            client.send(b"PING\n")
            assert client.read_to_eof() == b""
        assert (proxy.open, proxy.discarded, proxy.opened) == (0, 2, 0)


# --- request logs bounded in bytes ------------------------------------------------------

LONG_LINE = b"\xff" * 64_000   # each byte is one U+FFFD when decoded: bytes and characters agree


def test_upstream_keeps_the_first_bytes_of_each_request_line_it_logs():
    """Before: every line kept whole, so these 200 would hold 200 x 64,000 = 12,800,000 characters
    (measured with 1,000 lines: 64,000,000 in 128 MB). The bound, not the count, is the claim."""
    with Upstream() as upstream, socket.create_connection(upstream.addr) as sock:
        sock.sendall((LONG_LINE + b"\n") * 200)   # each is answered with a 58-byte ERR line
        upstream.wait_requests(200)
        assert LOG_LINE_MAX == 200 and len(upstream.parsed) == 200
        assert sum(map(len, upstream.parsed)) == 200 * LOG_LINE_MAX == 40_000


def test_tagged_upstream_keeps_the_first_bytes_of_each_line_it_logs():
    """Before: every line kept whole, so these 200 calls would hold 200 x 64,000 = 12,800,000
    characters in each of parsed and written (measured with 1,000 calls: 64,000,000). The bound,
    not the count, is the claim."""
    key = b"k" * 64_000
    with TaggedUpstream() as upstream, TaggedClient(upstream.addr) as client:
        for number in range(200):
            assert client.call(b"GET %s\n" % key) == answer(b"GET %s" % key)
        upstream.wait_replies(200)
        assert (sum(map(len, upstream.parsed)) == sum(map(len, upstream.written))
                == 200 * LOG_LINE_MAX == 40_000)
        assert upstream.parsed[0] == "1 GET " + "k" * (LOG_LINE_MAX - 6)


# --- TaggedClient: the send under the deadline ------------------------------------------

class Outcomes:
    """Calls on threads of their own, and what each gave: a reply or the error's class."""

    def __init__(self, function, arguments):
        self.results = {}
        self.threads = [threading.Thread(target=self._run, args=(function, argument))
                        for argument in arguments]
        for thread in self.threads:
            thread.start()

    def _run(self, function, argument):
        try:
            self.results[argument] = function(argument)
        except TaggedError as error:
            self.results[argument] = type(error).__name__

    def still_running_after(self, seconds):
        deadline = time.monotonic() + seconds
        for thread in self.threads:
            thread.join(max(deadline - time.monotonic(), 0))
        return sum(thread.is_alive() for thread in self.threads)


def test_every_call_to_an_upstream_that_never_reads_ends_by_its_msg_timeout():
    """100 calls of 60 kB (6 MB, more than the buffers on the way take), msg_timeout 0.2 s:
    each ends within 2 s. Before: blocked in sendall(), 35 of 100 still running after 2 s."""
    line = b"GET %s\n" % (b"k" * 60_000)
    with FaultyUpstream(on_connect="deaf") as upstream:
        client = TaggedClient(upstream.addr, msg_timeout=0.2)
        calls = Outcomes(lambda number: client.call(line), range(100))
        running = calls.still_running_after(2.0)
        client.close()   # before the fix, what ended the blocked writes
        calls.still_running_after(5.0)
        assert running == 0
        assert set(calls.results.values()) <= {"CallTimeout", "ConnectionBroken"}
        assert client.sent < 100 and client.broken == 1


def test_a_request_cut_off_mid_write_by_its_deadline_breaks_the_connection():
    """One request of 8 MB, more than the buffers on the way take, msg_timeout 0.05 s."""
    line = b"GET %s\n" % (b"k" * 8_000_000)
    with (FaultyUpstream(on_connect="deaf") as upstream,
          TaggedClient(upstream.addr, msg_timeout=0.05) as client):
        # before: 10 s, then TimeoutError
        reason = kit.Background(client.call, line, expected=TaggedError).result()
        unsent = re.fullmatch(r"ConnectionBroken: sending failed: "
                              r"the deadline came with (\d+) of %d bytes unsent"
                              % len(b"1 " + line), reason)
        assert unsent and 0 < int(unsent.group(1)) < len(line)
        assert (client.sent, client.broken) == (0, 1)
        # the connection has ended
        assert kit.outcome(client.call, b"GET a\n", expected=TaggedError) == reason


# --- TaggedClient: timed-out ids bounded in count and time ------------------------------

def held_until_closed(upstream, prefix):
    """A pause hook: replies to keys starting with `prefix` are written only at close()."""
    def pause(key):
        if key.startswith(prefix):
            upstream.wait_until(lambda: upstream.closed, "close()")
    return pause


def test_a_timed_out_call_past_the_bound_ends_the_connection_and_its_owed_call():
    """Before: nothing ended; timed-out ids piled up until 1024, after which every call
    was refused for good ("1024 calls already owed") on a connection that was fine."""
    with TaggedUpstream() as upstream, TaggedClient(upstream.addr) as client:
        upstream.pause = held_until_closed(upstream, "lost")
        # waits for ever
        owed = kit.Background(client.call, b"GET lost-owed\n", expected=TaggedError)
        client.wait_sent(1)
        for number in range(1, 66):
            with pytest.raises(CallTimeout):
                client.call(b"GET lost%d\n" % number, msg_timeout=0)
        reason = "ConnectionBroken: more than 64 timed-out calls' replies owed"
        assert owed.result() == reason
        assert kit.outcome(client.call, b"GET healthy\n", expected=TaggedError) == reason
        assert (client.sent, client.timeouts, client.broken, client.abandoned) == (66, 65, 1, {})


def test_a_timed_out_calls_reply_still_missing_overdue_timeout_later_ends_it():
    """overdue_timeout=0: overdue at once. The call still waiting wakes and fails.
    Before: there was no such bound (overdue_timeout was not a setting)."""
    with TaggedUpstream() as upstream, TaggedClient(upstream.addr, overdue_timeout=0) as client:
        upstream.pause = held_until_closed(upstream, "lost")
        owed = kit.Background(client.call, b"GET lost-owed\n", expected=TaggedError)
        client.wait_sent(1)
        with pytest.raises(CallTimeout):
            client.call(b"GET lost\n", msg_timeout=0)
        reason = "ConnectionBroken: a timed-out call's reply is more than 0 s late"
        assert owed.result() == reason
        assert kit.outcome(client.call, b"GET healthy\n", expected=TaggedError) == reason


# --- TaggedUpstream: a bound on its threads over all connections ------------------------

class Holding(Hooks):
    counters = {"held": 0}   # request threads waiting in the pause hook; bumped by the hook


def test_a_tagged_upstream_runs_at_most_answering_max_threads_over_all_connections():
    """answering_max=4; 4 requests on one connection, then 3 on another. Before: no bound
    across connections: all 7 ran at once (and 20 connections could run 5,120)."""
    holding, release = Holding(), threading.Event()

    def pause(key):
        holding.count("held")
        release.wait(Hooks.hook_timeout)

    with TaggedUpstream(pause=pause, answering_max=4) as upstream, contextlib.ExitStack() as stack:
        stack.callback(release.set)   # whatever happens, no request thread waits out the hook
        first, second = connect(stack, upstream.addr), connect(stack, upstream.addr)
        first.send(b"".join(b"%d GET a%d\n" % (number, number) for number in range(1, 5)))
        holding.wait_held(4)
        second.send(b"".join(b"%d GET b%d\n" % (number, number) for number in range(1, 4)))
        upstream.wait_requests(5)   # the second connection's first request is read, and waits
        with pytest.raises(TimeoutError):
            upstream.wait_requests(6, timeout=0.3)   # for a thread: its reader reads nothing more
        assert holding.held == 4
        release.set()
        upstream.wait_replies(7)
        assert sorted(first.read_line() for _ in range(4)) == [
            b"%d a%d=AAAAAAAAAAAA\n" % (n, n) for n in range(1, 5)]
        assert sorted(second.read_line() for _ in range(3)) == [
            b"%d b%d=BBBBBBBBBBBB\n" % (n, n) for n in range(1, 4)]
        assert (holding.held, upstream.requests) == (7, 7)
