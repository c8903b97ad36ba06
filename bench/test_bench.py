"""Fast checks of the bench's pieces: the load generator counts what it should,
the servers it adds behave as their docstrings say, and the tables and target
verdicts come out as written. The bench itself runs with `make bench`."""
import contextlib
import os
import socket
import time
from pathlib import Path

import pytest

from bench import bench, bench_part3, cited, machinery, mechanisms, placement
import tcp_proxy
from tcp_proxy import PassthroughProxy, Upstream


class WrongUpstream(Upstream):
    """Answers every request with the same reply, right only for key x."""

    def reply(self, conn, data):
        conn.sendall(b"x=XXXXXXXXXXXX\n")


def rounds_against(server, client_count, requests_each, before_sending=lambda: None):
    """Connect client_count clients to server, call before_sending(), run one round."""
    clients = machinery.connect_clients(server.addr, client_count)
    try:
        before_sending()
        return machinery.exchange_rounds(clients, requests_each)
    finally:
        machinery.close_clients(clients)


def test_exchange_rounds_answers_every_request_of_every_client():
    with Upstream() as upstream:
        measured = rounds_against(upstream, 3, requests_each=4)
        arrived = sorted(upstream.parsed)   # the order across connections is the scheduler's
    assert arrived == sorted(f"GET k{client}n{number}" for client in range(3) for number in range(4))
    assert (measured.answered, measured.wrong, measured.unanswered) == (12, 0, 0)
    assert len(measured.latencies) == 12


def test_exchange_rounds_counts_a_reply_to_another_request_as_wrong():
    with WrongUpstream() as upstream:
        measured = rounds_against(upstream, 2, requests_each=3)
    assert (measured.answered, measured.wrong, measured.unanswered) == (0, 6, 0)


def test_exchange_rounds_counts_a_closed_connection_as_unanswered():
    with Upstream() as upstream:   # every connection is shut down before a request is sent
        measured = rounds_against(upstream, 2, requests_each=3, before_sending=upstream.close)
    assert (measured.answered, measured.wrong, measured.unanswered) == (0, 0, 2)


def test_distant_upstream_overlaps_the_delays_of_pipelined_requests():
    delay = 0.1
    with machinery.DistantUpstream(delay) as upstream, \
            socket.create_connection(upstream.addr, timeout=5) as sock:
        started = time.perf_counter()
        sock.sendall(b"GET a\nGET b\nGET c\nGET d\n")
        reader = sock.makefile("rb")
        replies = [reader.readline() for _ in range(4)]
        seconds = time.perf_counter() - started
        reader.close()
    assert replies == [b"a=AAAAAAAAAAAA\n", b"b=BBBBBBBBBBBB\n", b"c=CCCCCCCCCCCC\n", b"d=DDDDDDDDDDDD\n"]
    assert delay <= seconds < 2 * delay   # four delays that overlap, not four in a row


def test_nagle_passthrough_proxy_turns_nodelay_off_on_what_it_tracks():
    with Upstream() as upstream, cited.NaglePassthroughProxy(upstream.addr) as proxy:
        sock = proxy.track(socket.socket())
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
        proxy.forget(sock)


def test_service_process_serves_waits_on_hooks_and_reports_its_threads_and_memory():
    with machinery.ServiceProcess("upstream") as upstream:
        clients = machinery.connect_clients(upstream.addr, 2)
        try:
            measured = machinery.exchange_rounds(clients, requests_each=5)
            upstream.wait_for("replies", 10)   # both connections still open: their threads alive
        finally:
            machinery.close_clients(clients)
        with pytest.raises(TimeoutError, match="replies to reach 11"):
            upstream.wait_for("replies", 11, timeout=0.1)
    assert (measured.answered, measured.wrong) == (10, 0)
    # main, accept loop, and a reader and a writer per client
    assert upstream.report["peak_threads"] == 6
    assert 5 < upstream.report["peak_rss_mb"] < 64


def test_table_aligns_names_left_and_figures_right():
    assert machinery.table("T", ["name", "n"], [["a", 1], ["long", 22]]) == (
        "T\n"
        "name   n\n"
        "----  --\n"
        "a      1\n"
        "long  22\n")


def test_targets_compare_rates_from_the_same_repetition():
    def runs(*rates):
        return [{"rate": rate} for rate in rates]
    overhead_rows = [
        {"relay": "socat", "clients": 1, "load": "selector", "runs": runs(100, 200, 100)},
        {"relay": "PassthroughProxy", "clients": 1, "load": "selector", "runs": runs(90, 100, 80)},  # .9 .5 .8
        {"relay": "PassthroughProxy", "clients": 8, "load": "threads", "runs": runs(100, 100, 100)},
        {"relay": "FramedProxy cap 8", "clients": 8, "load": "threads", "runs": runs(70, 80, 90)},
    ]
    results = {
        "overhead": {"rows": overhead_rows},
        "head_of_line": {"rows": [{"pool_cap": 2, "predicted_ms": 80.0, "wall_ms": {"median": 83.5},
                                   "within_target": False}]},
        "scale": {"rows": [{"relay": "FramedProxy cap 8", "clients": 1000, "wrong": 0, "lost": 0,
                            "peak_rss_mb": 40.0, "p99_ms": 150.0},
                           {"relay": "FramedProxy cap 8, not pinned", "clients": 1000, "wrong": 0, "lost": 0,
                            "peak_rss_mb": 70.0, "p99_ms": 300.0},
                           {"relay": "PassthroughProxy", "clients": 5000, "wrong": 0, "lost": 3,
                            "peak_rss_mb": 300.0},
                           {"relay": "haproxy", "clients": 5000, "wrong": 0, "lost": 0, "peak_rss_mb": 30.0}]},
    }
    assert bench.targets(results) == [
        ("PassthroughProxy >= 0.9x socat, 1 client(s), selector load", "0.80x (0.50-0.90)", False),
        ("FramedProxy cap 8 >= 0.75x PassthroughProxy, 8 client(s), threads load", "0.80x (0.70-0.90)", True),
        ("head-of-line cap 2 within max(3 ms, 10%) of 80 ms", "83.5 ms", False),
        ("1000 clients through FramedProxy cap 8: p99 no worse than not pinned", "150 ms against 300", True),
        ("1000 clients through FramedProxy cap 8: 0 wrong, 0 lost", "0 wrong, 0 lost", True),
        ("1000 clients through FramedProxy cap 8, peak RSS < 64 MB", "40.0 MB", True),
        ("1000 clients through FramedProxy cap 8, not pinned: 0 wrong, 0 lost", "0 wrong, 0 lost", True),
        ("5000 clients through PassthroughProxy: 0 wrong, 0 lost", "0 wrong, 3 lost", False),
    ]


def test_targets_of_a_run_where_sections_failed_are_those_of_the_sections_that_finished():
    assert bench.targets({"failed": {"overhead": "OSError: boom"}}) == []


def test_absent_tools_are_skipped_with_a_note_that_says_how_to_get_them(monkeypatch):
    monkeypatch.setattr(cited.shutil, "which", lambda tool: None)
    monkeypatch.setattr(cited, "POOL_CAPS", (8,))   # fewer processes to start: the notes are the point
    notes = []
    with Upstream() as upstream, contextlib.ExitStack() as stack:
        relays = cited.start_relays(upstream.addr, notes, stack)
    assert list(relays) == ["PassthroughProxy", "FramedProxy cap 8"]
    get_them = "(`make bench-tools` installs socat and haproxy)"
    assert notes == [f"socat: skipped, not installed {get_them}", f"haproxy: skipped, not installed {get_them}"]


def test_a_section_that_fails_says_why_in_one_line_and_the_others_still_print(monkeypatch, capsys):
    def fails():
        raise TimeoutError("gave up waiting for connections to reach 1000\nsecond line")

    def sections(arguments, notes):
        return [("scale", fails, mechanisms.render_scale),
                ("nagle", lambda: {"rows": [{"relay": "r", "requests": 1, "median_ms": 2.0, "low_ms": 1.0,
                                             "high_ms": 3.0}]}, cited.render_nagle)]
    monkeypatch.setattr(bench, "sections", sections)
    bench.main([])
    out = capsys.readouterr().out
    assert "1. scale: could not finish: TimeoutError: gave up waiting for connections to reach 1000\n" in out
    assert "second line" not in out
    assert "2. Nagle: a request written in two parts" in out


def test_lean_upstream_answers_lines_however_they_were_cut():
    with machinery.LeanUpstream() as upstream, socket.create_connection(upstream.addr, timeout=5) as sock:
        sock.sendall(b"GET a\nGET")
        sock.sendall(b" b\nPING\n")
        reader = sock.makefile("rb")
        replies = [reader.readline() for _ in range(3)]
        reader.close()
    assert replies == [b"a=AAAAAAAAAAAA\n", b"b=BBBBBBBBBBBB\n", b"PONG\n"]


@pytest.mark.parametrize("relay_class", [
    mechanisms.UncountedPassthroughProxy, mechanisms.NotifyIfWaitedPassthroughProxy, mechanisms.SplicePassthroughProxy,
    mechanisms.OneThreadPassthroughProxy, placement.placed(PassthroughProxy)])
def test_each_alternative_relay_gives_every_client_its_own_replies(relay_class):
    with machinery.LeanUpstream() as upstream, relay_class(upstream.addr) as relay:
        measured = rounds_against(relay, 4, requests_each=25)
    assert (measured.answered, measured.wrong, measured.unanswered) == (100, 0, 0)


def test_threaded_load_generator_counts_every_round_trip_of_every_thread():
    with machinery.LeanUpstream() as upstream:
        measured = machinery.threaded_round_trips(upstream.addr, 3, seconds=0.05)
    assert measured.answered == len(measured.latencies) > 3
    assert measured.wrong == 0


def test_bench_md_stays_within_its_size_bound():
    # issue 10: about 15 KB; issue 16 moved the placement and backlog notes here from tcp_proxy.py
    assert (Path(__file__).parent / "BENCH.md").stat().st_size <= 16_500


# --- the head-of-line bench ----------------------------------------------------------------

def test_bench_in_order_fast_replies_never_come_before_the_slow_delay_and_tagged_ones_all_come():
    slow_latency, fast_latencies = bench_part3.in_order(0.05, 3)
    assert slow_latency >= 0.05 and len(fast_latencies) == 3
    assert min(fast_latencies) >= 0.05   # a lower bound, not a timing guess: they wait their turn
    slow_latency, fast_latencies = bench_part3.tagged(0.05, 3)
    assert slow_latency >= 0.05 and len(fast_latencies) == 3


# --- bench/placement.py -----------------------------------------------------------------

class AffinityRecorder(placement.OneCpuPerGroup, tcp_proxy.Server):
    """Notes the CPUs each connection's thread may run on, then echoes until EOF."""
    sockets_per_cpu = 2

    def __init__(self):
        super().__init__()
        self.cpus_of_each_connection = []

    def handle(self, conn):
        self.cpus_of_each_connection.append(os.sched_getaffinity(0))
        while data := conn.recv(64):
            conn.sendall(data)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux and two CPUs to choose from")
def test_connections_fill_one_cpu_up_to_sockets_per_cpu_then_the_next():
    cpus = sorted(os.sched_getaffinity(0))
    first = os.getpid() % len(cpus)   # each process starts at a CPU of its own
    with AffinityRecorder() as server, contextlib.ExitStack() as stack:
        for _ in range(3):   # open at once: 1, 2, then 3 sockets when each is served
            client = stack.enter_context(socket.create_connection(server.addr))
            client.sendall(b"hi\n")
            assert client.recv(64) == b"hi\n"
    groups = [first, first + 1, first + 1]   # 1//2, 2//2, 3//2 sockets per CPU
    assert server.cpus_of_each_connection == [{cpus[group % len(cpus)]} for group in groups]
    with type("Unpinned", (AffinityRecorder,), {"sockets_per_cpu": 0})() as server, \
            contextlib.ExitStack() as stack:
        client = stack.enter_context(socket.create_connection(server.addr))
        client.sendall(b"hi\n")
        assert client.recv(64) == b"hi\n"
    assert server.cpus_of_each_connection == [set(cpus)]
