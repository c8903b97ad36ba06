"""ManagedProxy's claims (part2/proxy.py): every client on one loop, pipelined in order over
the set's connections, each reply fit-checked and handed to the client that asked; the
message timeout; bounded buffers; the pool's own answers in place; the demo's transcript."""
import contextlib
import os
import resource
import select
import socket
import subprocess
import sys
import threading
import time

import pytest

from conftest import ROOT, closed_port_addr
from part2 import downstream, proxy as proxies
from part2.loop import INBOX_SIZE
from part2 import pipeline as pipelines
from part2.pipeline import OWED_MAX
from part2.managed import ManagedClient, ManagedProxy, ManagedSet, ReliabilityCache, VirtualClock
from part2.managed_demo import ask, in_background
from scaffolding import kit
from scaffolding.faults import FaultyUpstream
from ground.frames import MAX_LINE
from ground.server import Hooks, shutdown
from tcp_proxy import answer, FramedProxy, Upstream, read_lines

HERE = str(ROOT)


# --- many clients, one loop ------------------------------------------------------------------

def test_under_many_connected_clients_the_proxy_runs_one_thread_not_one_per_client():
    before = threading.active_count()
    with FaultyUpstream() as upstream, ManagedProxy([(upstream.addr, 1)]) as proxy, \
            contextlib.ExitStack() as stack:
        clients = [kit.Client("x", proxy.addr) for _ in range(200)]
        for client in clients:
            stack.callback(client.close)
        for number, client in enumerate(clients):
            client.send(b"GET c%d\n" % number)
        replies = [client.read_line() for client in clients]
        assert replies == [answer(b"GET c%d" % n) for n in range(200)]
        proxy.wait_connections(200)
        assert threading.active_count() - before < 50 - before   # fewer than 50 in the process
        assert threading.active_count() - len(upstream._threads) - before == 1   # the loop's
        assert (len(proxy.clients), upstream.connections, proxy.answered) == (200, 1, 200)


def test_proxy_pipelines_every_clients_requests_over_one_connection_each_client_its_own_replies():
    with FaultyUpstream(gate=8) as upstream:
        with ManagedProxy([(upstream.addr, 1)], pending_calls_max=8) as proxy:
            clients = [in_background(ask, proxy.addr, [f"GET {c}{n}" for n in range(3)])
                       for c in "abcdefgh"]
            replies = [client.result() for client in clients]
    assert replies == [[f"{c}{n}={c.upper() * 12}" for n in range(3)] for c in "abcdefgh"]
    assert upstream.connections == 1 and upstream.requests == 24


class TurnedByHand(ManagedProxy):
    """ManagedProxy whose loop the test turns, one run_once() at a time: it knows what one
    turn read."""

    def spawn(self, target):
        return None


def turn_until(proxy, done, turns=200):
    for _ in range(turns):
        if done():
            return
        proxy.loop.run_once()
    raise AssertionError(f"not done after {turns} turns")


def known_fast(proxy):
    """The proxy as once it has timed a reply from a fast server: each client's fair share is
    then its whole pipeline (before, it is one request, until the server's pace is known)."""
    proxy.pace.timed(0.0)
    return proxy


def batch_scenario(fault=None, **options):
    """Eight clients send two requests each, read in one turn; what went upstream (each
    "sent" event's bytes), the attempts the set heard of, and each client's replies."""
    sent, attempts = [], []

    def heard(source, event):
        (sent if event[0] == "sent" else attempts if event[0] == "attempt" else []).append(event)
    with FaultyUpstream() as upstream, contextlib.ExitStack() as stack:
        proxy = known_fast(stack.enter_context(TurnedByHand(
            [(upstream.addr, 1)], on_event=heard, rcache=ReliabilityCache(), **options)))
        clients = [stack.enter_context(socket.create_connection(proxy.addr, timeout=5))
                   for _ in range(8)]
        turn_until(proxy, lambda: len(proxy.clients) == 8)
        if fault:
            upstream.fail_next(1, how=fault)
        for number, client in enumerate(clients):
            client.sendall(b"GET k%d\nGET j%d\n" % (number, number))
        unread = {client.transport.sock for client in proxy.clients}
        while unread:   # once every client's bytes are in, one turn reads them all
            readable, _, _ = select.select(list(unread), [], [], Hooks.hook_timeout)
            assert readable, "a client's bytes never reached the proxy"
            unread -= set(readable)
        proxy.loop.run_once()
        assert proxy.managed_set.attempts == 16
        turn_until(proxy, lambda: proxy.answered + proxy.failed == 16 and not any(
            client.transport.out for client in proxy.clients))
        replies = [[next(lines), next(lines)] for lines in map(read_lines, clients)]
    return [event[-1] for event in sent], [event[1:] for event in attempts], replies


def test_what_every_client_sent_in_one_turn_goes_upstream_in_one_write_each_its_own_replies():
    sent, attempts, replies = batch_scenario()
    (written,) = sent
    asked = [b"GET k%d\nGET j%d\n" % (n, n) for n in range(8)]
    assert sorted(written.splitlines(True)) == sorted(b"".join(asked).splitlines(True))
    assert all(request in written for request in asked)   # each client's two side by side
    assert replies == [[answer(b"GET k%d" % n)[:-1], answer(b"GET j%d" % n)[:-1]] for n in range(8)]
    assert attempts == [(1, 0, "ok")] * 16   # one attempt per request, each ok


def test_a_turns_write_that_fails_leaves_each_request_retried_or_failed_on_its_own():
    sent, attempts, replies = batch_scenario("drop", idempotent=True, idempotent_wait=0)
    assert len(sent) == 2 and sorted(sent[1].splitlines()) == sorted(sent[0].splitlines())
    assert replies == [[answer(b"GET k%d" % n)[:-1], answer(b"GET j%d" % n)[:-1]] for n in range(8)]
    lost = "MessageLost: upstream closed the connection"
    assert attempts == [(1, 0, lost)] * 16 + [(2, 0, "ok")] * 16
    _, _, replies = batch_scenario("drop")   # call()'s semantics: a lost request is not retried
    assert replies == [[b"ERR " + lost.encode()] * 2] * 8


def test_a_default_proxy_pipelines_once_its_connections_are_busy():
    with FaultyUpstream(gate=3) as upstream:   # no reply until three requests are in
        with ManagedProxy([(upstream.addr, 1)]) as proxy:
            clients = [in_background(ask, proxy.addr, [f"GET {key}"]) for key in "abc"]
            assert [client.result() for client in clients] == [[f"{key}={key.upper() * 12}"]
                                                               for key in "abc"]
    assert upstream.connections == 1


def test_the_pools_own_answers_take_their_place_among_each_clients_replies():
    with FaultyUpstream(gate=2) as upstream, ManagedProxy([(upstream.addr, 1)]) as proxy, \
            socket.create_connection(proxy.addr, timeout=Hooks.hook_timeout) as sock:
        known_fast(proxy)
        sock.sendall(b"GET a\n\nGET b\n")   # a blank line, which the pool refuses itself
        lines = read_lines(sock)
        assert [next(lines) for _ in range(3)] == [
            b"a=AAAAAAAAAAAA", b"ERR tcp-proxy: an empty request", b"b=BBBBBBBBBBBB"]
        assert (proxy.answered, upstream.requests) == (2, 2)


def test_a_client_that_leaves_with_replies_owed_shifts_no_one():
    with FaultyUpstream(gate=4) as upstream, ManagedProxy([(upstream.addr, 1)]) as proxy:
        known_fast(proxy)
        with socket.create_connection(proxy.addr) as leaving:
            leaving.sendall(b"GET x1\nGET x2\nGET x3\nGET x")   # three and half a fourth, then gone
            upstream.wait_requests(3)
        assert ask(proxy.addr, ["GET b"]) == ["b=BBBBBBBBBBBB"]   # after the leaver's three replies
        upstream.wait_replies(4)   # the leaver's three were read, and dropped
        assert upstream.requests == 4 and proxy.answered == 4


def test_a_client_that_never_reads_is_not_read_once_its_replies_pile_up_and_the_others_are_served():
    request = b"GET %s\n" % (b"k" * 1000)
    reply = answer(request[:-1])
    with FaultyUpstream() as upstream, ManagedProxy([(upstream.addr, 1)]) as proxy, \
            socket.create_connection(proxy.addr) as flooder:
        flooder.settimeout(0.5)
        # until nothing more goes: the proxy stopped reading
        with contextlib.suppress(TimeoutError):
            while True:
                flooder.sendall(request * 64)
        assert ask(proxy.addr, ["GET a"]) == ["a=AAAAAAAAAAAA"]
        # read on the loop's thread, where a client leaves the set in the turn that closes it
        reading, owed, out = proxy.loop.ask(state_of_the_client_at, proxy, flooder.getsockname())
        past = INBOX_SIZE // len(request) + 1   # requests a read may bring past the bound
        assert not reading and owed <= OWED_MAX + past
        assert out <= downstream.BACKLOG_HIGH + (OWED_MAX + past) * len(reply)


def state_of_the_client_at(proxy, address):
    (client,) = [client for client in proxy.clients
                 if client.transport.sock.getpeername() == address]
    return client.transport.reading, len(client.queue), client.backlog()


def test_close_answers_what_is_owed_with_an_error_and_closes_every_socket():
    with FaultyUpstream(every="skip") as silent:
        proxy = ManagedProxy([(silent.addr, 1)])
        with socket.create_connection(proxy.addr, timeout=Hooks.hook_timeout) as sock:
            sock.sendall(b"GET a\n")
            silent.wait_requests(1)
            proxy.close()
            assert sock.recv(4096) == b"ERR MessageLost: client shut down\n"
            assert sock.recv(4096) == b""
        assert not proxy.loop.thread.is_alive() and proxy.loop.stopped


def test_a_client_connection_that_cannot_be_set_up_is_closed_and_the_next_is_served(monkeypatch):
    made = []

    class FailsOnce(downstream.ProxyClient):
        def __init__(self, proxy, sock):
            if not made:
                made.append("failed")
                raise RuntimeError("a client that could not be set up")
            super().__init__(proxy, sock)
    monkeypatch.setattr(proxies, "ProxyClient", FailsOnce)
    with FaultyUpstream() as upstream, ManagedProxy([(upstream.addr, 1)]) as proxy:
        with socket.create_connection(proxy.addr, timeout=Hooks.hook_timeout) as first:
            assert first.recv(4096) == b""   # closed, not left hanging
        assert ask(proxy.addr, ["GET a"]) == ["a=AAAAAAAAAAAA"]
        assert (made, proxy.connections, proxy.loop.handler_errors) == (["failed"], 1, 0)


def test_a_client_that_finds_no_descriptor_is_turned_away_at_once_and_the_next_is_served():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with FaultyUpstream() as upstream, ManagedProxy([(upstream.addr, 1)]) as proxy:
        assert ask(proxy.addr, ["GET a"]) == ["a=AAAAAAAAAAAA"]   # the upstream connection is open
        client = socket.socket()   # its descriptor taken now: the proxy's accept finds none
        fillers = []
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 4096), hard))
            with contextlib.suppress(OSError):
                while True:   # every descriptor this process may have, taken
                    fillers.append(open(os.devnull, "rb"))
            client.settimeout(Hooks.hook_timeout)
            client.connect(proxy.addr)
            # told at once, with the proxy's spare descriptor: not left in the kernel's queue
            assert client.recv(4096) == b"ERR max number of clients reached\n"
            assert client.recv(1) == b""
        finally:
            for filler in fillers:
                filler.close()
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            client.close()
        assert ask(proxy.addr, ["GET b"]) == ["b=BBBBBBBBBBBB"]   # once the listener has rested
        assert proxy.turned_away == 1 and proxy.loop.handler_errors == 0


# --- upstream failures, and replies out of step -----------------------------------------------

def test_proxy_answers_an_upstream_failure_with_an_err_line_and_idempotent_retries_it():
    with FaultyUpstream() as upstream:
        with ManagedProxy([(upstream.addr, 1)], idempotent_wait=0,
                          rcache=ReliabilityCache()) as proxy:
            # with no cache given, the error would disable the service for 1 s
            upstream.fail_next(1)
            assert ask(proxy.addr, ["GET a", "GET b"]) == [
                "ERR MessageLost: upstream closed the connection", "b=BBBBBBBBBBBB"]
            assert (proxy.answered, proxy.failed) == (1, 1)
        with ManagedProxy([(upstream.addr, 1)], idempotent=True, idempotent_wait=0,
                          rcache=ReliabilityCache()) as proxy:
            upstream.fail_next(1)
            assert ask(proxy.addr, ["GET a"]) == ["a=AAAAAAAAAAAA"]


def test_an_extra_line_from_upstream_never_reaches_another_client():
    # both requests are on the one connection before any reply
    with FaultyUpstream(gate=2) as upstream:
        upstream.fail_next(1, how="extra")
        with ManagedProxy([(upstream.addr, 1)], rcache=ReliabilityCache()) as proxy:
            clients = [in_background(ask, proxy.addr, [f"GET {key}"]) for key in "ab"]
            replies = [client.result()[0] for client in clients]
    lost = "ERR MessageLost: upstream out of step: a reply did not fit its request"
    # whichever went first is right
    assert replies in (["a=AAAAAAAAAAAA", lost], [lost, "b=BBBBBBBBBBBB"])


def test_a_dropped_reply_fails_both_calls_owed_and_idempotent_calls_are_retried_right():
    with FaultyUpstream(gate=2) as upstream:
        upstream.fail_next(1, how="skip")   # the first reply never comes; the second arrives first
        with ManagedProxy([(upstream.addr, 1)], idempotent=True, idempotent_wait=0,
                          rcache=ReliabilityCache()) as proxy:
            clients = [in_background(ask, proxy.addr, [f"GET {key}"]) for key in "ab"]
            assert [client.result() for client in clients] == [["a=AAAAAAAAAAAA"],
                                                               ["b=BBBBBBBBBBBB"]]
            assert proxy.managed_set.attempts == 4 and proxy.managed_set.clients[0][0].errors == 1
    assert sorted(upstream.parsed) == ["GET a", "GET a", "GET b", "GET b"]


def test_a_call_unanswered_within_msg_timeout_ends_its_connection_every_call_owed_an_error():
    clock = VirtualClock()
    cache = ReliabilityCache(clock=clock)
    with FaultyUpstream(hold={1, 2}) as upstream, \
            ManagedProxy([(upstream.addr, 1)], clock=clock, rcache=cache) as proxy:
        first = in_background(ask, proxy.addr, ["GET a"])
        upstream.wait_requests(1)
        clock.advance(2.5)
        second = in_background(ask, proxy.addr, ["GET b"])
        upstream.wait_requests(2)
        clock.advance(2.5)   # a's call, 5 s old: the default message timeout, fatal
        assert first.result() == ["ERR MessageTimeout: no reply within 5.0s"]
        lost = "ERR MessageLost: another call's fatal message timeout closed the connection"
        assert second.result() == [lost]
        upstream.release()   # the replies come late, on a connection that has ended: unread
        assert ask(proxy.addr, ["GET c"]) == ["c=CCCCCCCCCCCC"]
        client = proxy.managed_set.clients[0][0]
        assert (client.connects, client.errors, upstream.connections) == (2, 1, 2)
        assert client.transition_log[2] == ("up", "down", "message timeout (fatal)")


def test_a_default_proxy_in_front_of_a_dead_a_and_a_live_b_answers_at_once():
    with FaultyUpstream() as live:
        with ManagedProxy([(closed_port_addr(), 1), (live.addr, 1)], policy="failover") as proxy:
            started = time.monotonic()
            assert ask(proxy.addr, ["GET a", "GET b", "GET c"]) == [
                "a=AAAAAAAAAAAA", "b=BBBBBBBBBBBB", "c=CCCCCCCCCCCC"]
            assert time.monotonic() - started < 1.0 and proxy.managed_set.attempts == 4


def test_a_one_service_proxy_errs_at_once_on_refused_connects_and_answers_once_upstream_is_back():
    upstream = FaultyUpstream()
    upstream.close()
    try:
        with ManagedProxy([(upstream.addr, 1)]) as proxy:   # the defaults, with the set's own cache
            started = time.monotonic()
            assert ask(proxy.addr, ["GET a", "GET b", "GET c"]) == [
                "ERR CommunicationError: cannot connect: Connection refused"] * 3
            # was 10.0 s to the first ERR: two idempotent_waits
            assert time.monotonic() - started < 1.0
            # b and c found the only service disabled (a's window: 1 s, on the real clock) and
            # tried it anyway
            assert (proxy.managed_set.attempts, proxy.managed_set.retries,
                    proxy.managed_set.refusals) == (3, 0, 0)
            upstream.restart()
            assert ask(proxy.addr, ["GET d"]) == ["d=DDDDDDDDDDDD"]   # at once, window or no window
            assert (proxy.managed_set.refusals == 0
                    and proxy.managed_set.rcache.is_enabled(upstream.addr))
    finally:
        upstream.close()


def ask_once(addr, line):
    """One request line through a proxy; its reply read whole, however long (ask() stops at
    MAX_LINE)."""
    with socket.create_connection(addr, timeout=Hooks.hook_timeout) as sock:
        sock.sendall(line)
        reply = b""
        while not reply.endswith(b"\n") and (data := sock.recv(65536)):
            reply += data
    return reply


def test_a_request_just_over_max_line_is_answered_whole_as_framed_proxy_does_and_disables_nothing():
    # GET and 65,540 bytes: once cut to MAX_LINE, its own reply no longer fit it
    key = b"k" * (MAX_LINE + 4)
    honest = key + b"=KKKKKKKKKKKK\n"
    with FaultyUpstream() as upstream:
        with FramedProxy(upstream.addr) as framed:
            assert ask_once(framed.addr, b"GET " + key + b"\n") == honest
        # with the set's own cache, as a user gets it
        with ManagedProxy([(upstream.addr, 1)]) as proxy:
            assert ask_once(proxy.addr, b"GET " + key + b"\n") == honest
            assert ask(proxy.addr, ["GET a"]) == ["a=AAAAAAAAAAAA"]
            client = proxy.managed_set.clients[0][0]
            assert (proxy.answered, proxy.failed, client.errors, client.connects) == (2, 0, 0, 1)
            assert proxy.managed_set.rcache.disables == 0


# --- addresses ------------------------------------------------------------------------------------

@contextlib.contextmanager
def upstream_on_ipv6_loopback():
    """Scaffolding: the toy protocol served on ::1, one connection at a time; yields its .addr, a
    4-tuple."""
    listener = socket.create_server(("::1", 0), family=socket.AF_INET6)

    def serve():
        with contextlib.suppress(OSError):   # shutdown() below ends accept()
            while True:
                conn, _ = listener.accept()
                with conn:
                    for line in read_lines(conn):
                        conn.sendall(answer(line))
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()
    finally:
        shutdown(listener)
        thread.join()
        listener.close()


def test_an_upstreams_own_ipv6_address_works_for_a_client_and_a_proxy():
    with upstream_on_ipv6_loopback() as addr:
        assert len(addr) == 4
        client = ManagedClient(addr)
        assert client.call(b"GET a\n") == b"a=AAAAAAAAAAAA\n" and client.state == "up"
        client.shut_down()
        with ManagedProxy([(addr, 1)]) as proxy:
            assert ask(proxy.addr, ["GET b", "PING"]) == ["b=BBBBBBBBBBBB", "PONG"]
            assert proxy.managed_set.rcache.errors == 0


def test_a_bad_address_or_setting_is_a_value_error_at_once_and_leaves_nothing_made():
    for bad in [("::1",), ("127.0.0.1", "7001"), ("127.0.0.1", 0), ("127.0.0.1", 70000),
                ("127.0.0.1", 7001, 0), "127.0.0.1:7001", (b"127.0.0.1", 7001), ("", 7001)]:
        for make in (ManagedClient, lambda addr: ManagedSet([(addr, 1)]),
                     lambda addr: ManagedProxy([(addr, 1)])):
            with pytest.raises(ValueError, match="an address is"):
                make(bad)
    # a setting only the set reads: nothing left open
    with pytest.raises(ValueError, match="policy"):
        ManagedProxy([(("127.0.0.1", 7001), 1)], policy="sometimes")


# --- the transcript ---------------------------------------------------------------------------

def test_demo_managed_prints_the_golden_transcript_on_every_run():
    with open(os.path.join(HERE, "transcripts", "managed.txt"), encoding="utf-8") as golden:
        expected = golden.read()
    for _ in range(3):
        run = subprocess.run([sys.executable, "demo.py", "--managed"], cwd=HERE,
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        assert run.stdout == expected


# --- a fair share of a shared connection ---------------------------------------------------

def test_a_clients_pipeline_takes_at_most_fair_wait_of_a_slow_servers_time_ahead_of_a_newcomer():
    """A server that takes 50 ms a reply, on the proxy's clock. Before a reply is timed the
    hog has one request in flight; once one is, FAIR_WAIT's worth (two); so with the third
    reply held, the newcomer's request goes up right behind the hog's two in flight, not
    behind the rest of its pipeline. Released, every reply comes, each in its order."""
    clock, released = VirtualClock(), threading.Event()
    per_reply = 0.05

    def slow(number):
        if number >= 3:
            released.wait(Hooks.hook_timeout)
        clock.advance(per_reply)   # the time this reply takes the server

    with Upstream(pause=slow) as upstream, \
            ManagedProxy([(upstream.addr, 1)], clock=clock, msg_timeout=-1,
                         rcache=ReliabilityCache(clock=clock)) as proxy:
        hog = socket.create_connection(proxy.addr, timeout=Hooks.hook_timeout)
        newcomer = socket.create_connection(proxy.addr, timeout=Hooks.hook_timeout)
        with hog, newcomer:
            hog.sendall(b"".join(b"GET hog%d\n" % number for number in range(40)))
            upstream.wait_requests(4)   # the first alone, the second, then two in flight
            assert proxy.loop.ask(lambda: proxy.pace.share) == int(
                pipelines.FAIR_WAIT / per_reply) == 2
            newcomer.sendall(b"GET newcomer\n")
            upstream.wait_requests(5)
            released.set()
            assert next(read_lines(newcomer)) == b"newcomer=NNNNNNNNNNNN"
            hogs = read_lines(hog)
            assert [next(hogs) for _ in range(40)] == [
                answer(b"GET hog%d" % number).rstrip(b"\n") for number in range(40)]
        assert list(upstream.parsed)[:5] == [
            "GET hog0", "GET hog1", "GET hog2", "GET hog3", "GET newcomer"]


# --- a client's own order ------------------------------------------------------------------------

def test_a_clients_pipelined_requests_go_on_one_connection_so_none_runs_before_one_it_follows():
    """Two connections may run what they carry in either order: a client's requests in flight
    all go on one, so its GET can never run before the SET it follows."""
    with FaultyUpstream(hold={1}) as upstream, \
            ManagedProxy([(upstream.addr, 2)]) as proxy:
        with socket.create_connection(proxy.addr, timeout=Hooks.hook_timeout) as client:
            client.sendall(b"GET a\nGET b\nGET c\n")   # one write: one read of the pool's
            upstream.wait_requests(1)
            upstream.release()
            replies = read_lines(client)
            assert [next(replies) for _ in "abc"] == [
                b"a=AAAAAAAAAAAA", b"b=BBBBBBBBBBBB", b"c=CCCCCCCCCCCC"]
        assert list(upstream.parsed) == ["GET a", "GET b", "GET c"]
        assert upstream.connections == 1
        assert [ask(proxy.addr, [f"GET {key}"]) for key in "de"] == [
            ["d=DDDDDDDDDDDD"], ["e=EEEEEEEEEEEE"]]   # nothing in flight: any connection


def test_a_clients_requests_retried_elsewhere_go_on_one_connection_there_in_its_order():
    with FaultyUpstream() as live, \
            ManagedProxy([(closed_port_addr(), 2), (live.addr, 2)]) as proxy:
        with socket.create_connection(proxy.addr, timeout=Hooks.hook_timeout) as client:
            client.sendall(b"GET a\nGET b\nGET c\n")   # all placed on the dead one, then retried
            replies = read_lines(client)
            assert [next(replies) for _ in "abc"] == [
                b"a=AAAAAAAAAAAA", b"b=BBBBBBBBBBBB", b"c=CCCCCCCCCCCC"]
        assert (list(live.parsed), live.connections) == (["GET a", "GET b", "GET c"], 1)
