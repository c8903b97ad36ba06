"""Fast checks of bench.py's pieces: the load generator counts what it should,
the servers it adds behave as their docstrings say, and the tables and target
verdicts come out as written. The bench itself runs with `make bench`."""
import socket
import time

import pytest

import bench
from tcp_proxy import Upstream


class WrongUpstream(Upstream):
    """Answers every request with the same reply, right only for key x."""

    def reply(self, conn, data):
        conn.sendall(b"x=XXXXXXXXXXXX\n")


def rounds_against(server, client_count, requests_each, before_sending=lambda: None):
    """Connect client_count clients to server, call before_sending(), run one round."""
    clients = bench.connect_clients(server.addr, client_count)
    try:
        before_sending()
        return bench.exchange_rounds(clients, requests_each)
    finally:
        bench.close_clients(clients)


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
    with bench.DistantUpstream(delay) as upstream, \
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
    with Upstream() as upstream, bench.NaglePassthroughProxy(upstream.addr) as proxy:
        sock = proxy.track(socket.socket())
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
        proxy.forget(sock)


def test_service_process_serves_waits_on_hooks_and_reports_its_threads_and_memory():
    with bench.ServiceProcess("upstream") as upstream:
        clients = bench.connect_clients(upstream.addr, 2)
        try:
            measured = bench.exchange_rounds(clients, requests_each=5)
            upstream.wait_for("replies", 10)   # both connections still open: their threads alive
        finally:
            bench.close_clients(clients)
        with pytest.raises(TimeoutError, match="replies to reach 11"):
            upstream.wait_for("replies", 11, timeout=0.1)
    assert (measured.answered, measured.wrong) == (10, 0)
    # main, accept loop, and a reader and a writer per client
    assert upstream.report["peak_threads"] == 6
    assert 5 < upstream.report["peak_rss_mb"] < 64


def test_table_aligns_names_left_and_figures_right():
    assert bench.table("T", ["name", "n"], [["a", 1], ["long", 22]]) == (
        "T\n"
        "name   n\n"
        "----  --\n"
        "a      1\n"
        "long  22\n")


def test_targets_compare_rates_from_the_same_repetition():
    def runs(*rates):
        return [{"rate": rate} for rate in rates]
    overhead_rows = [
        {"relay": "socat", "clients": 1, "runs": runs(100, 200, 100)},
        {"relay": "PassthroughProxy", "clients": 1, "runs": runs(90, 100, 80)},   # 0.9, 0.5, 0.8
        {"relay": "FramedProxy cap 1", "clients": 1, "runs": runs(90, 100, 80)},
    ]
    results = {
        "overhead": {"rows": overhead_rows},
        "head_of_line": {"rows": [{"pool_cap": 2, "predicted_ms": 80.0, "wall_ms": {"median": 83.5},
                                   "within_target": False}]},
        "scale": {"clients": 1000, "rows": [{"relay": "FramedProxy cap 8", "wrong": 0, "unanswered": 0,
                                             "peak_rss_mb": 40.0}]},
    }
    assert bench.targets(results) == [
        ("PassthroughProxy >= 0.9x socat, 1 client(s)", "0.80x (0.50-0.90)", False),
        ("FramedProxy cap 1 >= 0.75x PassthroughProxy, 1 client(s)", "1.00x (1.00-1.00)", True),
        ("head-of-line cap 2 within max(3 ms, 10%) of 80 ms", "83.5 ms", False),
        ("1000 clients through FramedProxy cap 8, 0 wrong answers", "0 wrong or unanswered", True),
        ("1000 clients through FramedProxy cap 8, peak RSS < 64 MB", "40.0 MB", True),
    ]


def test_absent_tools_and_managed_proxy_are_skipped_with_a_one_line_note(monkeypatch):
    monkeypatch.setattr(bench.shutil, "which", lambda tool: None)
    monkeypatch.setattr(bench, "managed", None)
    notes = []
    with Upstream() as upstream:
        relays = bench.start_relays(upstream.addr, notes)
        for relay in relays.values():
            relay.stop()
    assert list(relays) == ["PassthroughProxy", "FramedProxy cap 1", "FramedProxy cap 8", "FramedProxy cap 64"]
    assert notes == ["ManagedProxy: skipped, managed.py does not import",
                     "socat: skipped, not installed", "haproxy: skipped, not installed"]
    assert bench.pipelining(repetitions=1) == {"rows": [], "notes": ["pipelining: skipped, managed.py does not import"]}
