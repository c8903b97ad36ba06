"""The toy's claims, one test each, with the exact figures the demo and the
commentary state. conftest.py fails any test that leaves a thread or a socket."""
import collections
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import demo
from scaffolding import faults, kit
from scaffolding.faults import FaultyUpstream, TrustingPool
import tcp_proxy
from tests.linecount import code_lines
import ground.server
from ground.frames import MAX_LINE
from ground.workers import Workers
from tcp_proxy import answer, FramedProxy, NaiveProxy, PassthroughProxy, Upstream

HERE = Path(__file__).parent


def connect(stack, addr):
    client = kit.Client("test", addr, timeout=5)
    stack.callback(client.close)
    return client


# --- the line protocol -------------------------------------------------------

def test_protocol_answers_get_ping_and_says_what_is_wrong_with_anything_else():
    assert answer(b"GET alpha") == b"alpha=AAAAAAAAAAAA\n"
    assert len(answer(b"GET alpha")) == 19 and len(answer(b"GET beta")) == 18
    assert answer(b"PING") == b"PONG\n"
    assert answer(b"GET alpGET beta") == (
        b"ERR expected 'GET <key>' or 'PING', got 'GET alpGET beta'\n")
    assert answer(b"\x00\xff").startswith(b"ERR ")


def test_upstream_frames_its_input_however_the_bytes_are_cut():
    with Upstream() as upstream, contextlib.ExitStack() as stack:
        client = connect(stack, upstream.addr)
        for piece in (b"GE", b"T alpha\nPING\nGET b", b"eta\n"):
            client.send(piece)
            upstream.wait_bytes_in(sum(map(len, client.sent)))
        assert [client.read_line() for _ in range(3)] == [
            b"alpha=AAAAAAAAAAAA\n", b"PONG\n", b"beta=BBBBBBBBBBBB\n"]
        assert list(upstream.parsed) == ["GET alpha", "PING", "GET beta"]


# --- NaiveProxy: a correct byte relay that misdelivers -------------------------

def test_naive_relay_forwards_every_byte_exactly_once():
    with (Upstream() as upstream, NaiveProxy(upstream.addr) as proxy,
          contextlib.ExitStack() as stack):
        a, b = connect(stack, proxy.addr), connect(stack, proxy.addr)
        proxy.wait_connections(2)
        a.send(b"GET alp")
        proxy.wait_forwarded(7)
        b.send(b"GET beta\n")
        proxy.wait_forwarded(16)
        a.send(b"ha\n")
        proxy.wait_forwarded(19)
        upstream.wait_requests(2)
        assert upstream.bytes_in == proxy.forwarded == 19
        assert list(upstream.parsed) == ["GET alpGET beta", "ha"]


def test_naive_relay_hands_alphas_answer_to_b_and_nothing_to_a():
    received = demo.misdelivery("last")
    assert received == {"A": b"", "B": b"alpha=AAAAAAAAAAAA\nbeta=BBBBBBBBBBBB\n"}
    assert len(received["B"]) == 37


def test_broadcast_routing_gives_both_clients_both_answers():
    both = b"alpha=AAAAAAAAAAAA\nbeta=BBBBBBBBBBBB\n"
    assert demo.misdelivery("broadcast") == {"A": both, "B": both}


def test_naive_relay_is_right_with_one_request_in_flight_on_one_upstream_connection():
    with (Upstream() as upstream, NaiveProxy(upstream.addr) as proxy,
          contextlib.ExitStack() as stack):
        crowd = kit.clients(stack, proxy.addr, 8)
        right = sum(kit.ask_in_turn(client, kit.keys_for(index))
                    for index, client in enumerate(crowd))
        assert (right, proxy.connections, upstream.connections) == (24, 8, 1)


def test_naive_routing_must_be_last_or_broadcast():
    with pytest.raises(ValueError, match="routing"):
        NaiveProxy(("127.0.0.1", 9), routing="round-robin")


# --- PassthroughProxy: the 1:1 baseline and the half-close ---------------------

def test_passthrough_is_right_with_one_upstream_connection_per_client():
    with Upstream() as upstream, PassthroughProxy(upstream.addr) as proxy:
        assert demo.many_clients(proxy.addr) == 24
        proxy.wait_eofs(16)
        assert (proxy.connections, proxy.opened, upstream.connections) == (8, 8, 8)


def test_half_close_delivers_the_whole_reply_and_close_delivers_nothing():
    assert demo.half_close_trial(True) == b"alpha=AAAAAAAAAAAA\n"
    assert demo.half_close_trial(False) == b""


# --- FramedProxy: the pool that parses -------------------------------------------

@pytest.mark.parametrize("cap, opened", [(1, 1), (2, 2), (4, 4), (8, 8), (16, 8)])
def test_pool_opens_min_of_cap_and_requests_in_flight(cap, opened):
    with Upstream(gate=min(cap, 8)) as upstream, FramedProxy(upstream.addr, pool_cap=cap) as proxy:
        assert demo.many_clients(proxy.addr) == 24
        assert proxy.opened == upstream.connections == opened
        assert proxy.released == 24


def test_pool_with_three_clients_in_flight_opens_three_under_a_cap_of_eight():
    with Upstream(gate=3) as upstream, FramedProxy(upstream.addr, pool_cap=8) as proxy:
        assert demo.many_clients(proxy.addr, count=3) == 9
        assert proxy.opened == 3


def test_pipelined_client_is_served_without_another_recv():
    with (Upstream() as upstream, FramedProxy(upstream.addr) as proxy,
          contextlib.ExitStack() as stack):
        client = connect(stack, proxy.addr)
        client.send(b"GET alpha\nGET beta\nPING\n")   # one write, three requests, then silence
        assert [client.read_line() for _ in range(3)] == [
            b"alpha=AAAAAAAAAAAA\n", b"beta=BBBBBBBBBBBB\n", b"PONG\n"]
        assert list(upstream.parsed) == ["GET alpha", "GET beta", "PING"] and proxy.opened == 1


def test_framed_reader_stops_at_the_delimiter_and_bytes_past_it_are_dirty():
    with FramedProxy(("127.0.0.1", 9)) as proxy:
        ours, theirs = socket.socketpair()
        with ours, theirs:
            theirs.sendall(b"alpha=AAAAAAAAAAAA\nbeta=BB")   # one recv: a reply and a half
            reply, rest = proxy.read_reply(ours)
            assert (reply, rest) == (b"alpha=AAAAAAAAAAAA\n", b"beta=BB")
            # the reply stands, the connection goes
            assert proxy.in_step(b"GET alpha\n", reply, rest) is False
            assert proxy.in_step(b"GET alpha\n", reply, b"") is True
            theirs.sendall(b"BBBBBBBBBB\n")
            assert proxy.read_reply(ours, rest) == (b"beta=BBBBBBBBBBBB\n", b"")


def test_framed_release_is_right_whether_a_reply_comes_whole_or_paused():
    assert demo.release_trial("framed", split=False) == 8
    assert demo.release_trial("framed", split=True) == 8


def test_timeout_release_is_right_on_one_write_and_wrong_on_a_paused_reply():
    assert demo.release_trial("timeout", split=False) == 8
    assert demo.release_trial("timeout", split=True) == 0


GC_PAUSE = 0.12   # seconds an upstream pauses inside a reply (COMMENTARY.md, scenario 6)


@pytest.mark.parametrize("release", ["framed", "timeout"])
def test_a_pause_longer_than_the_release_timeout_cuts_a_reply_only_for_the_timeout_rule(release):
    pause = lambda number: time.sleep(GC_PAUSE) if number == 1 else None   # the first reply only
    with Upstream(split_at=len(b"alpha="), pause=pause) as upstream, \
            FramedProxy(upstream.addr, release=release) as proxy, contextlib.ExitStack() as stack:
        assert proxy.release_timeout < GC_PAUSE
        first, second = connect(stack, proxy.addr), connect(stack, proxy.addr)
        first.send(b"GET alpha\n")
        # no b"\n" to wait for
        got = first.read_line() if release == "framed" else first.sock.recv(64)
        second.send(b"GET bravo\n")
        wanted = {"framed": (b"alpha=AAAAAAAAAAAA\n", b"bravo=BBBBBBBBBBBB\n"),
                  "timeout": (b"alpha=", b"AAAAAAAAAAAA\n")}   # the tail is the next borrower's
        assert (got, second.read_line()) == wanted[release]


def test_pool_release_must_be_framed_or_timeout():
    with pytest.raises(ValueError, match="release"):
        FramedProxy(("127.0.0.1", 9), release="on-idle")


# --- bad input and failures cost nothing ------------------------------------------------

@pytest.mark.parametrize("server", ["upstream", "framed"])
def test_overlong_line_gets_an_err_line_and_other_clients_carry_on(server):
    with (Upstream() as upstream, FramedProxy(upstream.addr) as proxy,
          contextlib.ExitStack() as stack):
        target = upstream if server == "upstream" else proxy
        bystander, flooder = connect(stack, target.addr), connect(stack, target.addr)
        bystander.send(b"GET alp")
        flooder.send(b"x" * (MAX_LINE + 1))
        assert flooder.read_to_eof() == b"ERR line longer than 65536 bytes\n"
        bystander.send(b"ha\n")
        assert bystander.read_line() == b"alpha=AAAAAAAAAAAA\n"


def test_garbage_gets_an_err_line_and_the_connection_still_serves():
    with (Upstream() as upstream, FramedProxy(upstream.addr) as proxy,
          contextlib.ExitStack() as stack):
        client = connect(stack, proxy.addr)
        client.send(b"\x00\xff\xfe junk\nPING\n")
        assert client.read_line().startswith(b"ERR expected 'GET <key>' or 'PING'")
        assert client.read_line() == b"PONG\n"


def test_client_that_vanishes_mid_request_costs_no_thread_and_no_pool_slot():
    with Upstream() as upstream, FramedProxy(upstream.addr, pool_cap=1) as proxy:
        with contextlib.ExitStack() as stack:
            connect(stack, proxy.addr).send(b"GET alp")   # and gone
            proxy.wait_connections(1)
        with contextlib.ExitStack() as stack:
            quitter = connect(stack, proxy.addr)
            quitter.send(b"GET alpha\n")   # gone before its reply is written back
        proxy.wait_released(1)
        with contextlib.ExitStack() as stack:
            assert kit.ask_in_turn(connect(stack, proxy.addr), ["beta"]) == 1
        assert (proxy.opened, proxy.released, proxy.discarded) == (1, 2, 0)


class DiesMidReply(Upstream):
    """Writes the first 6 bytes of its first reply, then drops the connection."""

    def reply(self, conn, data):
        if self.replies == 0:
            self.count("replies")
            conn.sendall(data[:6])
            conn.shutdown(socket.SHUT_RDWR)
            return
        super().reply(conn, data)


def test_upstream_that_dies_mid_reply_costs_an_err_line_and_its_connection():
    with DiesMidReply() as upstream, FramedProxy(upstream.addr, pool_cap=1) as proxy, \
            contextlib.ExitStack() as stack:
        client = connect(stack, proxy.addr)
        client.send(b"GET alpha\n")
        assert client.read_line() == b"ERR upstream: upstream closed mid-reply\n"
        client.send(b"GET beta\n")   # served on a fresh connection, never on the broken one
        assert client.read_line() == b"beta=BBBBBBBBBBBB\n"
        assert (proxy.opened, proxy.discarded, proxy.released) == (2, 1, 1)


def test_unreachable_upstream_gives_an_err_line_and_frees_the_pool_slot():
    with Upstream() as gone:
        address = gone.addr
    with FramedProxy(address, pool_cap=1) as proxy, contextlib.ExitStack() as stack:
        client = connect(stack, proxy.addr)
        for _ in range(2):   # a leaked slot would make the second request wait forever
            client.send(b"PING\n")
            assert client.read_line().startswith(b"ERR upstream: ")
        assert proxy.open == 0


def test_naive_relay_whose_upstream_died_closes_a_client_that_arrives_later():
    with (Upstream() as upstream, NaiveProxy(upstream.addr) as proxy,
          contextlib.ExitStack() as stack):
        early = connect(stack, proxy.addr)
        assert kit.ask_in_turn(early, ["alpha"]) == 1   # registered, and answered
        upstream.close()
        assert early.read_to_eof() == b""   # told at once that the upstream has gone
        late = connect(stack, proxy.addr)
        late.send(b"GET alpha\n")
        assert late.read_to_eof() == b""    # an EOF, not a read that waits forever


def test_naive_relay_that_cannot_reach_its_upstream_leaves_no_thread_or_listener():
    with Upstream() as gone:
        address = gone.addr
    before = set(threading.enumerate())
    with pytest.raises(ConnectionRefusedError):
        NaiveProxy(address)
    assert set(threading.enumerate()) == before


# --- scaffolding: hooks and lifecycle ------------------------------------------------

def test_a_hook_that_times_out_names_its_counter_its_target_and_every_counter():
    with Upstream() as upstream:
        with pytest.raises(TimeoutError) as raised:
            upstream.wait_requests(1, timeout=0.05)
    message = str(raised.value)
    assert "requests to reach 1" in message
    assert "<Upstream connections=0, opened=0, bytes_in=0, requests=0, replies=0>" in message


def test_an_unknown_hook_is_an_attribute_error():
    with Upstream() as upstream:
        with pytest.raises(AttributeError):
            upstream.wait_for_godot(1)


def test_close_joins_every_thread_and_closes_every_socket():
    before = set(threading.enumerate())
    upstream = Upstream()
    proxies = [NaiveProxy(upstream.addr), FramedProxy(upstream.addr, pool_cap=2),
               PassthroughProxy(upstream.addr)]
    with contextlib.ExitStack() as stack:
        for proxy in proxies:
            client = connect(stack, proxy.addr)
            client.send(b"PING\n")
            assert client.read_line() == b"PONG\n"
        assert len(set(threading.enumerate()) - before) >= 10
        for server in proxies + [upstream]:   # clients still connected: close() must cut them
            server.close()
    assert set(threading.enumerate()) == before
    assert all(s.fileno() == -1 for server in proxies + [upstream] for s in server._sockets)


def test_close_does_not_wait_out_a_gate_that_was_never_reached():
    upstream = Upstream(gate=2)
    with contextlib.ExitStack() as stack:
        client = connect(stack, upstream.addr)
        client.send(b"GET alpha\n")
        upstream.wait_requests(1)
        started = time.monotonic()
        upstream.close()   # the writer holds alpha's reply at the gate
        assert time.monotonic() - started < upstream.hook_timeout / 2
        assert client.read_to_eof() == b""

LINE_CEILING = 300   # a ceiling, never raised: a change that needs more moves something out


def test_the_lesson_module_stays_under_its_line_ceiling():
    assert code_lines(HERE / "tcp_proxy.py") <= LINE_CEILING



@pytest.mark.parametrize("proxy_class", [PassthroughProxy, FramedProxy])
def test_workers_share_the_port_each_serves_some_clients_and_close_ends_every_process(proxy_class):
    clients = 40   # the kernel deals them out by a hash: all to one listener has odds of 2**-39
    with Upstream() as upstream:
        forked = type("Forked" + proxy_class.__name__, (Workers, proxy_class), {})
        with forked(upstream.addr, workers=2) as proxy:
            for n in range(clients):
                with socket.create_connection(proxy.addr, timeout=5) as sock:
                    sock.sendall(b"GET k%d\n" % n)
                    assert next(tcp_proxy.read_lines(sock)) == answer(b"GET k%d" % n).rstrip(b"\n")
            upstream.wait_requests(clients)
            # this process's share; the other served the rest
            assert 0 < proxy.connections < clients
            (other,) = proxy._worker_pids
        with pytest.raises(ChildProcessError):   # reaped by close(): no such child any more
            os.waitpid(other, os.WNOHANG)

# --- the demo ----------------------------------------------------------------------

@pytest.mark.slow
def test_demo_prints_the_checked_in_transcript_three_times_over():
    runs = [subprocess.Popen([sys.executable, "demo.py"], cwd=HERE, stdout=subprocess.PIPE)
            for _ in range(3)]
    outputs = [run.communicate(timeout=60)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0, 0]
    golden = (HERE / "transcripts" / "demo.txt").read_bytes()
    assert outputs == [golden] * 3


def test_demo_never_sleeps_and_prints_no_port():
    source = (HERE / "demo.py").read_text()
    assert "time.sleep" not in source and "import time" not in source
    transcript = (HERE / "transcripts" / "demo.txt").read_text()
    assert "127.0.0.1" not in transcript and "Thread" not in transcript


def test_demo_list_names_the_nine_scenarios_and_only_runs_one(capsys):
    assert demo.main(["--list"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert names == ["interleave", "headline", "broadcast", "passthrough", "pool", "release",
                     "boundary", "half-close", "dishonest"]
    assert demo.main(["--only", "headline"]) == 0
    assert capsys.readouterr().out.startswith("== 2. Whole requests, one after the other")


def test_only_keeps_the_number_a_scenario_has_in_the_full_run_for_every_part(capsys):
    # the one runner serves demo.py, --managed and --part3: --only runs one of any list
    scenarios = [(name, f"Scenario {name}", lambda name=name: print(f"  ran {name}"))
                 for name in "abc"]
    assert demo.run(scenarios, only="c") == 0
    assert capsys.readouterr().out == "== 3. Scenario c ==\n  ran c\n\n"
    assert demo.main(["--managed", "--only", "failover"]) == 0
    assert capsys.readouterr().out.startswith("== 4. Failover with a reliability cache")


def test_demo_with_a_hook_that_times_out_prints_no_transcript_and_names_the_scenario(capsys):
    def stuck():
        print("half a transcript")
        with Upstream() as upstream:
            upstream.wait_requests(1, timeout=0.05)

    assert demo.run([("stuck", "A scenario that never sees its event", stuck)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "scenario 'stuck' failed: gave up waiting for requests to reach 1" in captured.err


def test_race_says_its_numbers_are_one_runs_and_the_pool_makes_no_mistake(capsys):
    demo.race(trials=1)
    out = capsys.readouterr().out
    assert "These numbers are one run's" in out
    pool_rows = out.split("connections opened\n")[1].splitlines()
    assert [row.split()[1] for row in pool_rows] == ["0"] * 5


# --- a dishonest upstream and hostile clients ---------------------------------------

def test_dishonest_scenario_trusting_pool_shifts_and_framed_pool_closes_dirty():
    received, proxy = demo.dishonest_trial(TrustingPool)
    assert received == {"A": [b"alpha1=AAAAAAAAAAAA\n", b"bravo1=BBBBBBBBBBBB\n",
                              b"alpha2=AAAAAAAAAAAA\n"],
                        "B": [faults.EXTRA] * 3}
    assert (proxy.dirty, proxy.opened) == (0, 1)
    received, proxy = demo.dishonest_trial(FramedProxy)
    assert received == {"A": [answer(b"GET alpha%d" % n) for n in (1, 2, 3)],
                        "B": [answer(b"GET bravo%d" % n) for n in (1, 2, 3)]}
    assert (proxy.dirty, proxy.opened, proxy.released) == (6, 6, 0)


def take_turns(proxy_addr, rounds=3):
    """A and B take turns, one request each per round; every reply line, per client."""
    with contextlib.ExitStack() as stack:
        crowd, received = [connect(stack, proxy_addr) for _ in range(2)], ([], [])
        for round_number in range(1, rounds + 1):
            for index, client in enumerate(crowd):
                client.send(b"GET %s%d\n" % (b"ab"[index:index + 1], round_number))
                received[index].append(client.read_line())
        return received


# how the upstream misbehaves -> (its fault on every reply, on the first one only, cut_at)
MISBEHAVIOURS = {"extra": ("extra", None, None), "extra-later": ("extra-later", None, None),
                 "drop-first": (None, "skip", None), "endless": ("endless", None, None),
                 "hang-up": ("hang-up", None, None), "mid-reply": ("cut", None, 6),
                 "silent": ("skip", None, None)}
# mode -> (right answers of 6, ERR lines of 6) where the outcome does not depend on timing
EXACT_OUTCOMES = {"extra": (6, 0), "drop-first": (5, 1), "endless": (0, 6), "mid-reply": (0, 6),
                  "silent": (0, 6)}


@pytest.mark.parametrize("mode", MISBEHAVIOURS)
def test_framed_pool_gives_its_own_reply_or_an_err_line_whatever_the_upstream(mode):
    later = lambda reply_number: time.sleep(0.02)   # the extra line comes 20 ms after its reply
    every, first, cut_at = MISBEHAVIOURS[mode]
    with FaultyUpstream(every=every, cut_at=cut_at, later=later) as upstream, \
            FramedProxy(upstream.addr, pool_cap=1, reply_timeout=0.1) as proxy:
        if first:
            upstream.fail_next(1, first)
        received = take_turns(proxy.addr)
    own = [[answer(b"GET %s%d" % (name, n)) for n in (1, 2, 3)] for name in (b"a", b"b")]
    for replies, expected in zip(received, own):
        for got, want in zip(replies, expected):
            assert got == want or got.startswith(b"ERR upstream"), (mode, got)
    right = sum(got == want for replies, expected in zip(received, own)
                for got, want in zip(replies, expected))
    errors = sum(got.startswith(b"ERR") for replies in received for got in replies)
    if mode in EXACT_OUTCOMES:
        assert (right, errors) == EXACT_OUTCOMES[mode]


def test_a_reply_past_max_line_is_an_err_line_and_a_dirty_connection():
    with FaultyUpstream(every="endless") as upstream, FramedProxy(upstream.addr) as proxy, \
            contextlib.ExitStack() as stack:
        client = connect(stack, proxy.addr)
        client.send(b"GET alpha\n")
        assert client.read_line() == b"ERR upstream: out of step: a reply longer than 65536 bytes\n"
        assert (proxy.dirty, proxy.released) == (1, 0)


def test_a_reply_that_answers_another_request_is_an_err_line_never_a_wrong_answer():
    with FaultyUpstream(every="extra-later") as upstream, \
            FramedProxy(upstream.addr) as proxy, contextlib.ExitStack() as stack:
        client = connect(stack, proxy.addr)
        # the EXTRA after alpha's reply either waits on the idle connection (quiet() closes it)
        # or is read as beta's reply (in_step() refuses it): beta is never answered EXTRA
        assert kit.ask_in_turn(client, ["alpha"]) == 1
        client.send(b"GET beta\n")
        assert client.read_line() in (b"beta=BBBBBBBBBBBB\n",
                                      b"ERR upstream: out of step: a reply of 6 bytes "
                                      b"does not answer b'GET beta\\n'\n")
        assert proxy.dirty in (1, 2)   # beta's own EXTRA may come in the same recv() as its reply


def test_an_idle_connection_that_speaks_unasked_is_closed_before_it_is_lent():
    with FaultyUpstream(every="extra-later") as upstream, FramedProxy(upstream.addr) as proxy, \
            contextlib.ExitStack() as stack:
        # EXTRA only once idle
        upstream.later = lambda reply_number: proxy.wait_released(reply_number)
        client = connect(stack, proxy.addr)
        assert kit.ask_in_turn(client, ["alpha"]) == 1
        upstream.wait_extras(1)   # EXTRA waits on the idle connection: a peek, not a read, finds it
        assert kit.ask_in_turn(client, ["beta"]) == 1
        assert (proxy.dirty, proxy.opened) == (1, 2)


SERVE_WITH_FEW_DESCRIPTORS = """
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (40, 40))
from tcp_proxy import Upstream
with Upstream() as upstream:
    print(upstream.addr[1], flush=True)
    sys.stdin.read()   # until the test closes our stdin
"""


def test_accept_loop_survives_running_out_of_descriptors_and_serves_again():
    server = subprocess.Popen([sys.executable, "-c", SERVE_WITH_FEW_DESCRIPTORS], cwd=HERE,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        addr = ("127.0.0.1", int(server.stdout.readline()))
        with contextlib.ExitStack() as stack:
            crowd = [connect(stack, addr) for _ in range(60)]   # more than 40 descriptors
            crowd[-1].send(b"PING\n")   # in the listen queue, never accepted while the limit holds
            crowd[-1].sock.settimeout(0.3)
            with pytest.raises(TimeoutError):
                crowd[-1].read_line()
        with contextlib.ExitStack() as stack:   # every client has gone: descriptors are free
            assert kit.ask_in_turn(connect(stack, addr), ["alpha"]) == 1
    finally:
        server.stdin.close()
        assert server.wait(timeout=10) == 0
        server.stdout.close()


def test_close_returns_promptly_while_a_connect_waits_on_a_full_accept_queue(monkeypatch):
    assert ground.server.CONNECT_TIMEOUT + 0.4 <= 2.0   # close() waits out at most one connect
    monkeypatch.setattr(ground.server, "CONNECT_TIMEOUT", 0.3)   # the same wait, shorter
    stalled = socket.create_server(("127.0.0.1", 0), backlog=0)   # listens, never accepts
    fillers = []
    with stalled, FramedProxy(stalled.getsockname()) as proxy, contextlib.ExitStack() as stack:
        for _ in range(4):   # fill the accept queue: from now on a connect gets no answer
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(stalled.getsockname())
            fillers.append(stack.enter_context(filler))
        client = connect(stack, proxy.addr)
        client.send(b"PING\n")
        proxy.wait_connections(1)
        time.sleep(0.1)   # the handler is inside connect() now
        started = time.monotonic()
        proxy.close()
        assert time.monotonic() - started < 0.3 + 0.4


def test_a_silent_upstream_costs_an_err_line_after_reply_timeout_and_prompt_close():
    with FaultyUpstream(every="skip") as upstream, \
            FramedProxy(upstream.addr, reply_timeout=0.2) as proxy, contextlib.ExitStack() as stack:
        client = connect(stack, proxy.addr)
        client.send(b"PING\n")
        assert client.read_line() == b"ERR upstream: timed out\n"
        assert (proxy.discarded, proxy.open) == (1, 0)
        client.send(b"PING\n")   # and a wait that close() cuts short
        upstream.wait_requests(2)
        started = time.monotonic()
        proxy.close()
        assert time.monotonic() - started < 0.5


def test_close_shuts_every_socket_first_so_a_held_reply_is_never_sent(monkeypatch):
    attempted = threading.Event()

    class LateWriter(Upstream):
        def reply(self, conn, data):
            while not self.closed:   # reach the gate only once close() has said closed
                time.sleep(0.001)
            try:
                super().reply(conn, data)
            finally:
                attempted.set()

    real_shutdown = tcp_proxy.shutdown

    def slow_shutdown(sock, how=socket.SHUT_RDWR):   # widens the window the race needs
        attempted.wait(0.3)
        real_shutdown(sock, how)

    monkeypatch.setattr(tcp_proxy, "shutdown", slow_shutdown)
    upstream = LateWriter(gate=2)
    with contextlib.ExitStack() as stack:
        client = connect(stack, upstream.addr)
        client.send(b"GET alpha\n")
        upstream.wait_requests(1)
        upstream.close()
        assert client.read_to_eof() == b""


def test_a_client_that_never_reads_is_no_longer_read_and_memory_stays_bounded():
    key = b"k" * 60_000   # replies of 60 kB fill the socket buffers in a few dozen
    with Upstream() as upstream, contextlib.ExitStack() as stack:
        client = connect(stack, upstream.addr)
        client.sock.settimeout(0.5)
        sent = 0
        # no progress for 0.5 s: the upstream stopped reading
        with contextlib.suppress(TimeoutError):
            for sent in range(1, 1001):
                client.sock.sendall(b"GET %s\n" % key)
        assert sent < 1000
        assert upstream.requests < 400   # the reply queue's 64, and what the buffers hold


def test_upstream_remembers_its_latest_request_lines_and_counts_them_all():
    with Upstream() as upstream, contextlib.ExitStack() as stack:
        assert upstream.parsed.maxlen == 1000
        upstream.parsed = collections.deque(maxlen=3)
        assert kit.ask_in_turn(connect(stack, upstream.addr), ["a", "b", "c", "d", "e"]) == 5
        assert (list(upstream.parsed), upstream.requests) == (["GET c", "GET d", "GET e"], 5)
