"""Fast checks of the bench's pieces: the load generator counts what it should,
the servers it adds behave as their docstrings say, and the tables and target
verdicts come out as written. The bench itself runs with `make bench`."""
import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import (bench, bench_part3, cited, machinery, mechanisms, placement, redis_peers,
                   trip)
from conftest import need_redis
from part3 import resp
from part3.redis_server import RedisControl, RedisServer, read_resp
from ground.frames import Frames
from ground.server import Server, recv
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
    assert arrived == sorted(f"GET k{client}n{number}"
                             for client in range(3) for number in range(4))
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
    assert replies == [b"a=AAAAAAAAAAAA\n", b"b=BBBBBBBBBBBB\n",
                       b"c=CCCCCCCCCCCC\n", b"d=DDDDDDDDDDDD\n"]
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
    # a forked child: it counts the pages it shares with its parent
    assert 5 < upstream.report["peak_rss_mb"] < 256


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
        {"relay": "socat", "clients": 1, "runs": runs(100, 200, 100)},
        {"relay": "PassthroughProxy", "clients": 1, "runs": runs(90, 100, 80)},  # .9 .5 .8
        {"relay": "PassthroughProxy", "clients": 8, "runs": runs(100, 100, 100)},
        {"relay": "FramedProxy cap 8", "clients": 8, "runs": runs(70, 80, 90)},
    ]
    results = {
        "overhead": {"rows": overhead_rows},
        "head_of_line": {"rows": [{"pool_cap": 2, "predicted_ms": 80.0, "wall_ms": {"median": 83.5},
                                   "within_target": False}]},
        "scale": {"rows": [{"relay": "FramedProxy cap 8", "clients": 1000, "wrong": 0, "lost": 0,
                            "peak_rss_mb": 40.0, "p99_ms": 150.0},
                           {"relay": "FramedProxy cap 8, not pinned", "clients": 1000, "wrong": 0,
                            "lost": 0, "peak_rss_mb": 70.0, "p99_ms": 300.0},
                           {"relay": "PassthroughProxy", "clients": 5000, "wrong": 0, "lost": 3,
                            "peak_rss_mb": 300.0},
                           {"relay": "haproxy", "clients": 5000, "wrong": 0, "lost": 0,
                            "peak_rss_mb": 30.0}]},
    }
    assert bench.targets(results) == [
        ("PassthroughProxy >= 0.9x socat, 1 client(s)", "0.80x (0.50-0.90)", False),
        ("FramedProxy cap 8 >= 0.75x PassthroughProxy, 8 client(s)", "0.80x (0.70-0.90)", True),
        ("head-of-line cap 2 within max(3 ms, 10%) of 80 ms", "83.5 ms", False),
        ("1000 clients through FramedProxy cap 8: p99 no worse than not pinned",
         "150 ms against 300", True),
        ("1000 clients through FramedProxy cap 8: 0 wrong, 0 lost", "0 wrong, 0 lost", True),
        ("1000 clients through FramedProxy cap 8, peak RSS < 64 MB", "40.0 MB", True),
        ("1000 clients through FramedProxy cap 8, not pinned: 0 wrong, 0 lost",
         "0 wrong, 0 lost", True),
        ("5000 clients through PassthroughProxy: 0 wrong, 0 lost", "0 wrong, 3 lost", False),
    ]


def test_targets_of_a_run_where_sections_failed_are_those_of_the_sections_that_finished():
    assert bench.targets({"failed": {"overhead": "OSError: boom"}}) == []


def test_absent_tools_are_skipped_with_a_note_that_says_how_to_get_them(monkeypatch):
    monkeypatch.setattr(machinery.shutil, "which", lambda tool, path=None: None)
    # fewer processes to start: the notes are the point
    monkeypatch.setattr(cited, "POOL_CAPS", (8,))
    notes = []
    with Upstream() as upstream, contextlib.ExitStack() as stack:
        relays = cited.start_relays(upstream.addr, notes, stack)
    assert list(relays) == ["PassthroughProxy", "FramedProxy cap 8"]
    get_them = "(`make bench-tools` installs socat and haproxy)"
    assert notes == [f"socat: skipped, not installed {get_them}",
                     f"haproxy: skipped, not installed {get_them}"]


def test_a_section_that_fails_says_why_in_one_line_and_the_others_still_print(monkeypatch, capsys):
    def fails():
        raise TimeoutError("gave up waiting for connections to reach 1000\nsecond line")

    def sections(arguments, notes):
        return [("scale", fails, mechanisms.render_scale),
                ("nagle", lambda: {"rows": [{"relay": "r", "requests": 1, "median_ms": 2.0,
                                             "low_ms": 1.0, "high_ms": 3.0}]},
                 cited.render_nagle)]
    monkeypatch.setattr(bench, "sections", sections)
    bench.main([])
    out = capsys.readouterr().out
    assert ("1. scale: could not finish: "
            "TimeoutError: gave up waiting for connections to reach 1000\n") in out
    assert "second line" not in out
    assert "2. Nagle: a request written in two parts" in out


def test_lean_upstream_answers_lines_however_they_were_cut():
    with (machinery.LeanUpstream() as upstream,
          socket.create_connection(upstream.addr, timeout=5) as sock):
        sock.sendall(b"GET a\nGET")
        sock.sendall(b" b\nPING\n")
        reader = sock.makefile("rb")
        replies = [reader.readline() for _ in range(3)]
        reader.close()
    assert replies == [b"a=AAAAAAAAAAAA\n", b"b=BBBBBBBBBBBB\n", b"PONG\n"]


@pytest.mark.parametrize("relay_class", [
    mechanisms.UncountedPassthroughProxy, mechanisms.SplicePassthroughProxy,
    mechanisms.OneThreadPassthroughProxy, placement.placed(PassthroughProxy)])
def test_each_alternative_relay_gives_every_client_its_own_replies(relay_class):
    with machinery.LeanUpstream() as upstream, relay_class(upstream.addr) as relay:
        measured = rounds_against(relay, 4, requests_each=25)
    assert (measured.answered, measured.wrong, measured.unanswered) == (100, 0, 0)


def test_bench_md_stays_within_its_size_bound():
    # a reader's budget: a new table is paid for by a cut
    assert (Path(__file__).parent / "BENCH.md").stat().st_size <= 28_000


# --- the head-of-line bench ----------------------------------------------------------------

def test_bench_in_order_fast_replies_never_come_before_the_slow_delay_and_tagged_ones_all_come():
    slow_latency, fast_latencies = bench_part3.in_order(0.05, 3)
    assert slow_latency >= 0.05 and len(fast_latencies) == 3
    assert min(fast_latencies) >= 0.05   # a lower bound, not a timing guess: they wait their turn
    slow_latency, fast_latencies = bench_part3.tagged(0.05, 3)
    assert slow_latency >= 0.05 and len(fast_latencies) == 3


# --- bench/placement.py -----------------------------------------------------------------

class AffinityRecorder(placement.OneCpuPerGroup, Server):
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


# --- bench/redis_peers.py: the machinery, nothing timed -----------------------------------

def need_tool(tool):
    """Skip without tool: a bench peer, which `make test` does not install."""
    if machinery.tool_path(tool) is None:
        pytest.skip(f"{tool} is not on PATH (`make bench-tools` installs it)")


class PlantedRedis(Server):
    """SET and GET over RESP from a dict, one connection at a time; the GET numbered
    wrong_get (counting from 1, across connections) is answered with a wrong value."""

    def __init__(self, wrong_get=None):
        super().__init__()
        self.values = {}
        self.gets = 0           # GETs answered so far; bumped by handle(), read by none
        self.wrong_get = wrong_get

    def handle(self, conn):
        frames = Frames(resp.RESP.reply_parser)   # a RESP array frames like a reply
        while data := recv(conn):
            frames.feed(data)
            while (request := frames.take()) is not None:
                words = request.split(b"\r\n")[2::2][:int(request[1:request.index(b"\r\n")])]
                conn.sendall(self.answer(words))

    def answer(self, words):
        if words[0] == b"SET":
            self.values[words[1]] = words[2]
            return b"+OK\r\n"
        with self._lock:
            self.gets += 1
            planted = self.gets == self.wrong_get
        value = b"not what was written" if planted else self.values[words[1]]
        return redis_peers.bulk(value)


def test_check_values_counts_every_request_and_finds_the_one_planted_wrong_value():
    with PlantedRedis() as honest:
        assert redis_peers.check_values(honest.addr, threads=2, pairs=10, seed=1) == {
            "requests": 40, "wrong": 0, "failed": 0}
    with PlantedRedis(wrong_get=7) as liar:
        assert redis_peers.check_values(liar.addr, threads=2, pairs=10, seed=1) == {
            "requests": 40, "wrong": 1, "failed": 0}


def test_resp_commands_are_arrays_of_bulk_strings():
    assert redis_peers.command(b"GET", b"a") == b"*2\r\n$3\r\nGET\r\n$1\r\na\r\n"


def test_parse_rate_reads_the_runs_rate_from_the_set_and_get_rows_of_redis_benchmarks_csv():
    output = ('"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms",'
              '"p99_latency_ms","max_latency_ms"\n'
              '"SET","30000.00","1.225","0.608","1.127","1.887","2.967","9.031"\n'
              '"GET","60000.00","1.225","0.608","1.127","1.887","2.967","9.031"\n')
    # as many requests each: 2 n over n / 30000 + n / 60000 seconds
    assert redis_peers.parse_rate(output) == pytest.approx(40000.0)
    with pytest.raises(ValueError, match="no GET and SET rows"):
        redis_peers.parse_rate(output.split('"GET"')[0])


def test_requests_for_a_run_follow_the_last_rate_within_bounds():
    # 1,280 is below it
    assert redis_peers.requests_for(None, 8, 16, seconds=1.0) == redis_peers.MIN_REQUESTS
    # not 10,240
    assert redis_peers.requests_for(None, 64, 16, seconds=1.0) == redis_peers.WARM_UP_REQUESTS
    assert redis_peers.requests_for(30_000.4, 8, 1, seconds=1.0) == 30_000
    assert redis_peers.requests_for(100.0, 1, 1, seconds=1.0) == redis_peers.MIN_REQUESTS
    assert redis_peers.requests_for(1e9, 1, 1, seconds=1.0) == redis_peers.MAX_REQUESTS


def test_server_connections_count_the_clients_redis_holds_but_not_the_control_connection():
    need_redis()
    with RedisServer() as redis, contextlib.ExitStack() as stack:
        target = redis_peers.Target("direct", "-", redis, redis_peers.Direct(redis))
        stack.callback(target.close)
        assert target.server_connections() == 0
        for _ in range(3):
            client = stack.enter_context(socket.create_connection(redis.addr, timeout=5))
            client.sendall(redis_peers.command(b"PING"))
            assert client.recv(64) == b"+PONG\r\n"   # answered: redis has registered it
        assert target.server_connections() == 3


def test_twemproxy_gets_a_config_of_one_server_connection_and_proxies_a_get():
    need_redis()
    need_tool("nutcracker")
    with RedisServer() as redis, contextlib.ExitStack() as stack:
        control = RedisControl(redis.addr)
        stack.callback(control.close)
        assert control.command("SET planted value") == b"+OK\r\n"
        relay = stack.enter_context(machinery.ExternalRelay("nutcracker", redis.addr))
        config = Path(relay.directory.name) / "nutcracker.yml"
        text = config.read_text(encoding="ascii")
        assert f"listen: 127.0.0.1:{relay.addr[1]}\n" in text
        assert f"   - 127.0.0.1:{redis.addr[1]}:1\n" in text
        assert ("  redis: true\n  hash: fnv1a_64\n  distribution: ketama\n"
                "  server_connections: 1\n") in text
        with socket.create_connection(relay.addr, timeout=5) as client:
            client.sendall(redis_peers.command(b"GET", b"planted"))
            assert read_resp(redis_peers.Replies(client)) == b"$5\r\nvalue\r\n"
        relay.stop()
        assert not config.exists()   # stop() removes the directory


def test_a_missing_peer_is_skipped_with_a_note_that_says_how_to_get_it(monkeypatch):
    need_redis()
    specs = [spec for spec in redis_peers.target_specs() if spec[0] in ("direct", "twemproxy")]
    monkeypatch.setattr(redis_peers, "target_specs", lambda: specs)
    monkeypatch.setattr(machinery.shutil, "which", lambda tool, path=None: None)
    notes = []
    with contextlib.ExitStack() as stack:
        targets = redis_peers.start_targets(stack, notes)
        assert [target.label for target in targets] == ["direct"]
    assert notes == ["redis, twemproxy: skipped, nutcracker is not installed "
                     "(`make bench-tools` installs it)"]


def test_redis_rows_take_each_ratio_within_a_repetition_and_the_targets_read_them():
    samples = {("direct", 64, 1): [(100.0, 64, None, None), (200.0, 65, None, None),
                                   (100.0, 64, None, None)],
               ("socat", 64, 1): [(50.0, 64, 30.0, None), (100.0, 64, 40.0, None),
                                  (50.0, 64, 50.0, None)],
               ("PassthroughProxy, placed", 64, 1): [(60.0, 64, 9.0, 2.0), (90.0, 64, 8.0, 3.0),
                                                     (40.0, 64, 7.0, 4.0)],
               ("twemproxy", 64, 1): [(80.0, 1, 5.0, None)] * 3,
               ("ManagedProxy(RESP) 1 conn", 64, 1): [(40.0, 1, 9.0, 5.0), (30.0, 1, 14.0, 5.0),
                                                       (20.0, 1, 9.0, 5.0)]}
    layers = {"direct": "-", "socat": "4", "PassthroughProxy, placed": "4", "twemproxy": "7",
              "ManagedProxy(RESP) 1 conn": "7"}
    rows = {row["target"]: row for row in redis_peers.rows_from(samples, layers)}
    passthrough = rows["PassthroughProxy, placed"]
    # 60/50, 90/100, 40/50
    assert passthrough["x_socat"] == {"median": 0.9, "low": 0.8, "high": 1.2}
    assert passthrough["x_direct"]["median"] == 0.45   # 0.6, 0.45, 0.4
    assert (passthrough["server_connections"], passthrough["cpu_us"],
            passthrough["switches"]) == (64, 8.0, 3.0)
    direct, socat = rows["direct"], rows["socat"]
    assert (direct["server_connections"], direct["cpu_us"], socat["switches"]) == (64, None, None)
    section = {"rows": list(rows.values()),
               "checks": [{"target": "ManagedProxy(RESP) 1 conn", "requests": 10, "wrong": 0,
                           "failed": 0}]}
    assert redis_peers.targets(section) == [
        ("redis: PassthroughProxy, placed >= 1.0x socat, 64 clients, pipeline 1", "0.90x", False),
        ("redis: ManagedProxy(RESP) >= 0.9x twemproxy, 64 clients, pipeline 1, "
         "1 server connection, 0 wrong",
         "0.38x, 1 conn, 0 wrong", False),
        ("redis: ManagedProxy(RESP) <= 10 us of CPU per request, 64 clients, pipeline 1",
         "9.0 us", True),
        ("redis: ManagedProxy(RESP) 1 conn: every value read is the one written",
         "0 wrong, 0 failed of 10", True)]


def test_steady_connections_are_the_count_seen_most_often_not_the_peak_nor_the_ramp():
    # 80: the run before's, closing
    assert redis_peers.steady([0, 3, 8, 64, 64, 64, 80, 64, 12]) == 64
    assert redis_peers.steady([1, 1, 8, 8]) == 8


def test_a_servers_usage_counts_the_cpu_of_its_other_worker_processes():
    """A worker runs until its server closes, so no rusage of children sees it: /proc does."""
    spin = "import time\nwhile time.process_time() < 0.2: pass\nprint(flush=True)\ntime.sleep(60)"
    worker = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE)
    try:
        worker.stdout.readline()   # it has spent its 0.2 s of CPU
        server = type("Server", (), {"_worker_pids": [worker.pid]})()
        alone, with_worker = (machinery.usage_of_this_process(),
                              machinery.usage_of_this_process(server))
        assert with_worker["user"] + with_worker["system"] - alone["user"] - alone["system"] >= 0.15
        assert with_worker["voluntary"] >= alone["voluntary"]
    finally:
        worker.kill()
        worker.wait()
        worker.stdout.close()


def test_redis_py_tests_read_pytests_summary_and_allow_every_server_wide_command_but_shutdown():
    from bench import redis_py_tests
    summary = "13 failed, 421 passed, 224 skipped, 1 xfailed, 671 warnings, 2 errors in 56.96s"
    assert redis_py_tests.counts(summary) == {"failed": 13, "passed": 421, "skipped": 224,
                                              "error": 2}
    allowed = redis_py_tests.server_wide()
    assert "SHUTDOWN" not in allowed and {"FLUSHALL", "CONFIG SET", "CLIENT KILL"} <= set(allowed)
    assert "SELECT" not in allowed and "REPLCONF" not in allowed   # replayed; never passed


# -- bench/applications.py: its machinery, without .venv-applications or the libraries

def test_applications_without_their_venv_say_in_one_line_how_to_make_it(monkeypatch, capsys,
                                                                         tmp_path):
    from bench import applications
    monkeypatch.setattr(applications, "VENV_PYTHON", tmp_path / "no-venv/bin/python")
    assert applications.main(["--only", "rq"]) == 2
    assert capsys.readouterr().out == (
        "applications: no .venv-applications; `make applications` makes it\n")


def test_applications_take_libraries_by_name_and_refuse_one_they_do_not_know(capsys):
    from bench import applications
    options = applications.parse(["--kind", "managed", "--only", "rq, arq"])
    assert (options.kinds, options.only) == (["managed"], ["rq", "arq"])
    assert applications.parse([]).kinds == ["framed", "managed"]
    with pytest.raises(SystemExit):
        applications.parse(["--only", "rq,resque"])
    assert "no library named resque; the names: rq, celery," in capsys.readouterr().err


def test_an_applications_run_is_read_from_its_result_line_and_what_the_pool_said_in_errors():
    from bench import applications, application_work
    begun, result = application_work.BEGUN_MARK, application_work.RESULT_MARK
    output = "\n".join([
        f"{begun}set, get", "some log line of the library's own",
        f"{begun}keys",
        "redis.exceptions.ResponseError: tcp-proxy: KEYS is refused here ",
        "pubsub thread exiting on ResponseError(\"upstream: the client's state: no\")",
        "redis.exceptions.ResponseError: tcp-proxy: KEYS is refused here",
        "ValueError: upstream: not one of the pool's, it has no Error before it: shown",
        result + '{"did": ["set, get"], "step": "keys", "error": "ResponseError: no"}'])
    outcome = applications.read_outcome("django-redis", "framed", output, 0)
    assert (outcome.did, outcome.step, outcome.error) == (["set, get"], "keys",
                                                          "ResponseError: no")
    assert outcome.said == ["tcp-proxy: KEYS is refused here", "upstream: the client's state: no",
                            "upstream: not one of the pool's, it has no Error before it: shown"]


def test_an_applications_run_with_no_result_line_failed_at_the_last_step_it_began():
    from bench import applications, application_work
    output = f"{application_work.BEGUN_MARK}one\n{application_work.BEGUN_MARK}two\n"
    killed = applications.read_outcome("rq", "managed", output, None)
    assert (killed.did, killed.step) == (["one"], "two")
    assert killed.error == f"TimeoutError: no end within {applications.RUN_TIMEOUT:g} s"
    crashed = applications.read_outcome("rq", "managed", "", -9)
    assert (crashed.did, crashed.step) == ([], None)
    assert crashed.error == "it ended with status -9 and said no result"


def test_applications_count_the_refusals_that_grew_between_two_readings_of_the_stats():
    from bench import applications
    before = {"refused.KEYS": 1, "refused.SWAPDB": 2, "connections": 3}
    after = {"refused.KEYS": 3, "refused.SWAPDB": 2, "refused.FLUSHALL": 1, "connections": 9}
    assert applications.refusals(before, after) == {"KEYS": 2, "FLUSHALL": 1}


def test_applications_print_a_line_per_run_and_a_table_of_library_by_target():
    from bench import applications
    failed = applications.Outcome("rq", "framed", ["enqueued", "worked"], "stopped",
                                  "TimeoutError: late", said=["upstream: gone"],
                                  refused={"KEYS": 2}, logged=["upstream connection closed"])
    assert failed.line() == (
        "rq             framed   FAILED  enqueued; worked\n"
        "    failed at 'stopped': TimeoutError: late\n"
        "    the pool said: upstream: gone\n"
        "    the pool refused: KEYS x2\n"
        "    the pool logged: upstream connection closed")
    outcomes = [applications.Outcome("rq", "direct", ["enqueued", "worked", "stopped"]), failed,
                applications.Outcome("arq", "direct", [])]
    assert applications.summary(outcomes, ["direct", "framed"]) == (
        "each library's everyday work\n"
        "library  direct  framed          \n"
        "-------  ------  ----------------\n"
        "rq       ok      failed at step 3\n"
        "arq      ok      -               \n")


def test_an_applications_run_past_its_deadline_is_killed_with_the_workers_it_started(
        monkeypatch):
    from bench import applications, application_work
    started_a_worker = (
        "import subprocess, sys, time\n"
        "worker = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"print({application_work.BEGUN_MARK!r} + str(worker.pid), flush=True)\n"
        "time.sleep(60)\n")
    monkeypatch.setattr(applications, "work_command",
                        lambda library, url: [sys.executable, "-c", started_a_worker])
    monkeypatch.setattr(applications, "RUN_TIMEOUT", 1.0)
    output, status = applications.run_work("rq", "redis://127.0.0.1:1/0")
    assert status is None
    worker_pid = int(applications.read_outcome("rq", "direct", output, status).step)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{worker_pid}").exists() and time.monotonic() < deadline:
        state = Path(f"/proc/{worker_pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
        if state == "Z":   # killed; its new parent has yet to reap it
            break
        time.sleep(0.05)
    else:
        assert not Path(f"/proc/{worker_pid}").exists(), "the run's worker outlived it"


def test_an_applications_run_where_the_library_is_missing_says_which(monkeypatch):
    """The project's own venv has none of the libraries: the work fails on its import."""
    from bench import applications
    monkeypatch.setattr(applications, "VENV_PYTHON", Path(sys.executable))
    output, status = applications.run_work("limits", "redis://127.0.0.1:1/0")
    outcome = applications.read_outcome("limits", "direct", output, status)
    assert (status, outcome.did, outcome.step) == (0, [], None)
    assert outcome.error == "ModuleNotFoundError: No module named 'limits'"


def test_applications_start_serve_with_its_defaults_read_its_stats_and_end_it(tmp_path):
    from bench import applications
    need_redis()
    with RedisServer() as redis, open(tmp_path / "serve.log", "w+") as log:
        served = applications.Served("managed", redis.addr, log)
        try:
            control = RedisControl(("127.0.0.1", served.port))
            try:
                assert control.command("KEYS nothing:*") == b"*0\r\n"
            finally:
                control.close()
            stats = served.stats()
            assert stats["connections"] == 1 and not applications.refusals({}, stats)
            assert "the pool's connections run as ACL user tcp-proxy" in served.logged()
        finally:
            served.close()
        assert served.process.returncode == 0


# --- bench/attacks.py: its machinery, one small attack --------------------------------------

def test_vmhwm_is_read_from_a_status_text_in_mb_and_is_none_for_a_process_gone():
    from bench import attacks
    status = "Name:\tpython3\nVmPeak:\t  99999 kB\nVmHWM:\t    2048 kB\nVmRSS:\t 1024 kB\n"
    assert attacks.vmhwm_mb(status) == 2.0
    assert attacks.vmhwm_mb("Name:\tkthreadd\n") is None
    assert attacks.peak_rss_mb(os.getpid()) > 1
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert attacks.peak_rss_mb(gone.pid) is None


def attack_record(attack, kind, right, slowest_ms, rss, held, badness=0, wrong=0, errors=0):
    return {"attack": attack, "kind": kind, "run": 0,
            "honest": {"of": 200, "done": 200, "right": right, "wrong": wrong, "errors": errors,
                       "slowest_ms": slowest_ms, "said": ["ERR no (x1)"] if errors else []},
            "attacker": {"summary": f"{2 - held}/2 ended", "said": "ERR too slow", "of": 2,
                         "held": held, "closed": 2 - held, "last_end_s": 10.0},
            "note": {"text": f"badness {badness}", "badness": badness},
            "stats": {"refused.KEYS": 1, "refused.DEBUG": 2, "clients.turned_away": held,
                      "dedicated.open": 1, "dedicated.waiting": 0},
            "peak_rss_mb": rss}


def test_the_table_takes_each_figure_at_its_worst_and_lists_what_is_past_the_marks():
    from bench import attacks
    records = [attack_record("half-command", "framed", 200, 3.0, 30.0, held=0, badness=1),
               attack_record("half-command", "framed", 190, 400.0, 20.0, held=2, badness=0,
                             wrong=1, errors=9),
               attack_record("half-command", "managed", 200, 2.0, 300.0, held=0),
               {"attack": "half-command", "kind": "managed", "run": 1, "failed": "OSError: x"}]
    framed, managed = attacks.worst(records)
    assert (framed["right"], framed["of"], framed["wrong"], framed["errors"]) == (190, 200, 1, 9)
    assert (framed["slowest_ms"], framed["peak_rss_mb"], framed["refused"]) == (400.0, 30.0, 3)
    assert framed["attacker"]["held"] == 2 and framed["note"]["text"] == "badness 1"
    assert managed["runs"] == 2 and managed["failed"] == ["OSError: x"]
    text = attacks.render([framed, managed])
    assert "half-command  framed      2       190/200      1       9         400" in text
    assert ("half-command, framed: 1 wrong, 9 errors, slowest pair 400 ms (mark 250), "
            "2 attackers never ended, badness 1\n") in text
    assert "half-command, managed: peak RSS 300 MB, 1 runs failed\n" in text
    assert "half-command, managed: OSError: x\n" in text
    assert "half-command, framed: ERR too slow\n" in text


def test_the_honest_client_counts_a_value_not_its_own_as_wrong():
    from bench import attacks
    with PlantedRedis(wrong_get=2) as liar:
        client = attacks.HonestClient(liar.addr, "t")
        try:
            figures = client.pairs(4, within=5.0)
        finally:
            client.close()
    assert {name: figures[name] for name in ("of", "done", "right", "wrong", "errors")} == {
        "of": 4, "done": 4, "right": 3, "wrong": 1, "errors": 0}


def test_the_slow_relay_queues_every_reply_and_trickles_one_keys():
    from bench import attacks
    need_redis()
    with RedisServer() as redis, contextlib.ExitStack() as stack:
        control = RedisControl(redis.addr)
        stack.callback(control.close)
        control.command("SET slow abcde")
        late = stack.enter_context(attacks.SlowRelay(redis.addr, reply_delay=0.05))
        trickling = stack.enter_context(attacks.SlowRelay(redis.addr, trickle_key=b"slow",
                                                          trickle_every=0.01))
        for relay, requests, least in ((late, [redis_peers.command(b"PING")] * 3, 0.15),
                                       (trickling, [redis_peers.command(b"GET", b"slow")],
                                        0.11)):
            with socket.create_connection(relay.addr, timeout=5) as client:
                started = time.monotonic()
                client.sendall(b"".join(requests))
                replies = redis_peers.Replies(client)
                got = [read_resp(replies) for _ in requests]
                assert time.monotonic() - started >= least   # three delays in a row; 11 bytes
        assert got == [b"$5\r\nabcde\r\n"]


def test_one_small_attack_on_framed_serve_records_each_sides_outcome_the_stats_and_the_rss():
    from bench import attacks
    need_redis()
    small = type("SmallFlood", (attacks.InlineFlood,), {"megabytes": 4})
    record = attacks.run_once(small, "framed", pairs=10)
    assert "failed" not in record, record.get("failed")
    assert {name: record["honest"][name] for name in ("of", "right", "wrong", "errors")} == {
        "of": 10, "right": 10, "wrong": 0, "errors": 0}
    assert record["attacker"]["held"] == 0 and "inline" in record["attacker"]["said"]
    assert "clients.turned_away" in record["stats"] and record["peak_rss_mb"] > 1
    assert attacks.worst([record])[0]["right"] == 10


def test_a_trip_counts_the_pools_own_calls_for_one_get_and_none_of_the_upstreams():
    trips = {label: trip.one_trip(make_pool) for label, make_pool in trip.POOLS.items()}
    framed, managed = trips["FramedProxy"].calls, trips["ManagedProxy"].calls
    assert ("tcp_proxy.py", "FramedProxy.checkin") in framed
    assert ("part2/pipeline.py", "Pipeline.feed") in managed
    assert ("part2/pipeline.py", "ClientStream.replied") in managed
    for calls in (framed, managed):
        assert not [name for _, name in calls if name.startswith(trip.LEFT_OUT)]
        assert not [path for path, _ in calls if path.startswith((".venv", "bench/"))]
