"""bench.redis_peers: the project's relays beside the real ones, on real Redis.

    python3 -m bench --only redis      (make bench-redis) about three minutes

redis-benchmark (-t get,set, Debian's redis-tools) drives a private redis-server
directly and through each target, at 1, 8 and 64 clients, each request waiting
for its reply (pipeline 1) and 16 at a time on each connection (-P 16):

    layer 4, bytes   PassthroughProxy, socat, HAProxy (TCP mode): a connection to
                     Redis per client, whatever the bytes say; and PassthroughProxy
                     with the mechanism study's os.splice() pump (bench/mechanisms.py)
    layer 7, RESP    SessionProxy(framing=resp.RESP) cap 8, ManagedProxy(framing=
                     resp.RESP) over one connection, twemproxy (nutcracker) with
                     server_connections 1: they read where each request and reply
                     ends, and share a few connections among many clients

Every target has a redis-server of its own (the same binary and settings), so
CLIENT LIST on it counts that target's server connections and no one else's:
sampled on a control connection every 20 ms while redis-benchmark runs; the
count seen most often is the row's "server conns" (a peak would count connections
a layer-4 relay has yet to close from the run before, a median the ones not yet
open while 64 clients connect). The targets take turns within each
repetition, a different one first each time; a ratio divides rates from the same
repetition; a row is the median of the repetitions. Each threaded project relay
runs with bench/placement.py's mixin, and its row says "placed"; ManagedProxy runs
on one loop thread, and nothing is placed.

redis-benchmark does not check what it reads. check_values() does, for every
target: threads SET random keys to random values and GET them back, one at a
time and pipelined in pairs; a value that is not the one written counts as
wrong. A target that is missing (nutcracker, haproxy, socat) is skipped with a
note that says how to get it.
"""
import contextlib
import csv
import pathlib
import random
import socket
import statistics
import subprocess
import threading
import time

from part3 import resp
from part3.redis_server import RedisControl, RedisServer, read_resp

from bench.machinery import (START_TIMEOUT, ExternalRelay, Running, ServiceProcess, low_high,
                             one_line, progress, ratio, spread, table, tool_path)
from bench.mechanisms import SplicePassthroughProxy

TESTS = ("GET", "SET")             # redis-benchmark -t: each sends -n requests, in turn
CLIENT_COUNTS = (1, 8, 64)         # redis-benchmark -c
PIPELINES = (1, 16)                # redis-benchmark -P: requests in flight on each connection
FRAMED_POOL_CAP = 8                # FramedProxy's connections to Redis
RUN_SECONDS = 1.0                  # what each test of a run aims at: -n is the last rate times this
MIN_REQUESTS = 2000                # -n never below this, nor above MAX_REQUESTS
MAX_REQUESTS = 1_000_000
WARM_UP_REQUESTS = 10_000          # the most an untimed first run sends (no rate seen yet)
BENCHMARK_TIMEOUT = 60.0           # seconds one redis-benchmark run may take before it is killed
SAMPLE_EVERY = 0.02                # seconds between CLIENT LIST samples during a run
CHECK_THREADS = 8                  # check_values(): threads, each with its own connection
CHECK_PAIRS = 150                  # check_values(): SET+GET pairs per thread
GET_THEM = "`make bench-tools` installs it"
WORKERS_LABEL = "PassthroughProxy, 2 workers, placed"   # a process per core (ground.workers)
WORKERS_TARGETS = ((8, 1.0), (64, 1.2))   # (clients, the least x socat at pipeline 1)
MANAGED_LABEL = "ManagedProxy(RESP) 1 conn"
# (clients, -P, the least x twemproxy)
MANAGED_TARGETS = ((8, 1, 0.8), (64, 1, 0.9), (64, 16, 0.9))
# the most CPU per request ManagedProxy may spend, 64 clients, -P 1
MANAGED_CPU_US = 10.0


# --- the targets ---------------------------------------------------------------------------

class Direct(Running):
    """redis-server itself, as a target: no relay in between."""

    def __init__(self, redis):
        self.addr = redis.addr


def target_specs():
    """(label, layer, tool needed or None, start(redis_addr) -> Running) for every target, in
    table order."""
    return [
        ("direct", "-", None, None),
        ("PassthroughProxy, placed", "4", None, lambda addr: ServiceProcess("passthrough", addr)),
        (WORKERS_LABEL, "4", None, lambda addr: ServiceProcess("passthrough", addr, workers=2)),
        # the mechanism study's pump: bytes never enter Python
        ("PassthroughProxy, splice, placed", "4", None,
         lambda addr: ServiceProcess(SplicePassthroughProxy, addr)),
        ("socat", "4", "socat", lambda addr: ExternalRelay("socat", addr)),
        ("haproxy", "4", "haproxy", lambda addr: ExternalRelay("haproxy", addr)),
        (f"SessionProxy(RESP) cap {FRAMED_POOL_CAP}, placed", "7", None,
         lambda addr: ServiceProcess("sessions", addr, pool_cap=FRAMED_POOL_CAP,
                                     framing=resp.RESP)),
        (MANAGED_LABEL, "7", None,   # one loop thread: nothing to place
         lambda addr: ServiceProcess("managed", addr, connections=1, framing=resp.RESP)),
        ("twemproxy", "7", "nutcracker", lambda addr: ExternalRelay("nutcracker", addr)),
    ]


class Replies:
    """A socket and what was read past the last whole reply: what read_resp() reads from."""

    def __init__(self, sock):
        self.sock = sock
        self.unread = b""


class Target:
    """One row's subject: its own redis-server, the relay in front of it (or none),
    and a control connection that counts the server's clients."""

    def __init__(self, label, layer, redis, relay):
        self.label, self.layer = label, layer
        self.redis, self.relay = redis, relay
        self.addr = relay.addr
        self.control = RedisControl(redis.addr)
        self.control_id = self.control.command("CLIENT ID")[1:-2]   # b":7\r\n" -> b"7"

    def server_connections(self):
        """The redis-server's client connections now, the control connection not counted."""
        reply = self.control.command("CLIENT LIST")
        listing = reply[reply.index(b"\r\n") + 2:-2]
        return sum(1 for line in listing.splitlines()
                   if line and not line.startswith(b"id=%s " % self.control_id))

    def relay_usage(self):
        """The relay's CPU seconds so far ({"user": , "system": }), or None for direct."""
        return None if isinstance(self.relay, Direct) else self.relay.usage()

    def close(self):
        self.control.close()


def start_targets(stack, notes):
    """Every target that can run here, each entered on stack; a note for each that cannot."""
    targets = []
    for label, layer, needs, start in target_specs():
        if needs is not None and not tool_path(needs):
            notes.append(f"redis, {label}: skipped, {needs} is not installed ({GET_THEM})")
            continue
        redis = stack.enter_context(RedisServer())
        relay = stack.enter_context(start(redis.addr) if start else Direct(redis))
        target = Target(label, layer, redis, relay)
        stack.callback(target.close)
        targets.append(target)
    return targets


# --- one run of redis-benchmark -------------------------------------------------------------

def benchmark_argv(addr, clients, pipeline, requests):
    return ["redis-benchmark", "-h", addr[0], "-p", str(addr[1]), "-t", ",".join(TESTS).lower(),
            "-n", str(requests), "-c", str(clients), "-P", str(pipeline), "--csv"]


def parse_rate(csv_text):
    """requests/s over the whole run from redis-benchmark --csv's output (a header line, then
    a row per test, "SET","rps",...): each test sends as many requests, so the run's rate
    is the harmonic mean of the tests' rates."""
    rates = {row.get("test"): float(row["rps"]) for row in csv.DictReader(csv_text.splitlines())
             if row.get("test") in TESTS}
    if len(rates) < len(TESTS):
        raise ValueError(f"no {' and '.join(TESTS)} rows in redis-benchmark's output: "
                         f"{csv_text[-200:]!r}")
    return len(rates) / sum(1 / rate for rate in rates.values())


def run_benchmark(target, clients, pipeline, requests):
    """(requests/s, server connections (the steady() count of the samples taken
    while it ran), the relay's per_request() usage) of one redis-benchmark run against target."""
    usage_before = target.relay_usage()
    process = subprocess.Popen(benchmark_argv(target.addr, clients, pipeline, requests),
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + BENCHMARK_TIMEOUT
    connections = []
    try:
        while True:   # sample while its clients are connected: waiting on the process is the pause
            connections.append(target.server_connections())
            try:
                process.wait(SAMPLE_EVERY)
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"redis-benchmark through {target.label} ran past "
                                       f"{BENCHMARK_TIMEOUT:.0f} s") from None
        output = process.stdout.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()
    if process.returncode:
        raise RuntimeError(f"redis-benchmark through {target.label} exited with "
                           f"{process.returncode}")
    return (parse_rate(output), steady(connections),
            per_request(usage_before, target.relay_usage(), requests * len(TESTS)))


def steady(samples):
    """The count seen most often (the larger of a tie): the connections held once every
    client has connected and before any has left, however long connecting took."""
    return max(statistics.multimode(samples))


def per_request(before, after, requests):
    """The relay's CPU microseconds and context switches per request between two
    usage readings ({"cpu_us": None, "switches": None} for direct; switches None
    for a tool, whose switches /proc does not sum)."""
    if not (before and after):
        return {"cpu_us": None, "switches": None}
    seconds = sum(after[name] - before[name] for name in ("user", "system"))
    switches = None
    if after["voluntary"] is not None:
        switches = sum(after[name] - before[name]
                       for name in ("voluntary", "involuntary")) / requests
    return {"cpu_us": seconds / requests * 1e6, "switches": switches}


def requests_for(rate, clients, pipeline, seconds):
    """-n for a run of about `seconds` at the rate seen last (None: not yet seen)."""
    wanted = rate * seconds if rate else min(10 * clients * pipeline, WARM_UP_REQUESTS)
    return int(min(MAX_REQUESTS, max(MIN_REQUESTS, wanted)))


# --- the correctness pass ---------------------------------------------------------------------

def command(*words):
    """A RESP array of bulk strings: a request as redis-cli and redis-py write it."""
    return b"*%d\r\n" % len(words) + b"".join(b"$%d\r\n%s\r\n" % (len(word), word)
                                           for word in words)


def bulk(value):
    return b"$%d\r\n%s\r\n" % (len(value), value)


def check_values(addr, threads=CHECK_THREADS, pairs=CHECK_PAIRS, seed=None):
    """Threads SET random keys to random values through addr and GET each back;
    every other pair goes out in one write (pipelined). A dict: requests sent,
    wrong (a reply that is not +OK to a SET, or not the value written to a GET),
    failed (a connection that broke, or a reply that did not come in time)."""
    figures = {"requests": 0, "wrong": 0, "failed": 0}
    lock = threading.Lock()

    def one_client(number):
        chooser = random.Random(f"{seed}-{number}" if seed is not None else None)
        sent = wrong = failed = 0
        try:
            with socket.create_connection(addr, timeout=START_TIMEOUT) as sock:
                reader = Replies(sock)
                for pair in range(pairs):
                    key = b"bench:%d:%d:%x" % (number, pair, chooser.getrandbits(64))
                    value = chooser.randbytes(chooser.randrange(1, 300)).hex().encode()
                    set_request, get_request = command(b"SET", key, value), command(b"GET", key)
                    if pair % 2:
                        sock.sendall(set_request + get_request)
                        replies = [read_resp(reader), read_resp(reader)]
                    else:
                        sock.sendall(set_request)
                        replies = [read_resp(reader)]
                        sock.sendall(get_request)
                        replies.append(read_resp(reader))
                    sent += 2
                    wrong += (replies[0] != b"+OK\r\n") + (replies[1] != bulk(value))
        except (OSError, ValueError):
            failed += 1
        with lock:
            figures["requests"] += sent
            figures["wrong"] += wrong
            figures["failed"] += failed

    workers = [threading.Thread(target=one_client, args=(number,)) for number in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return figures


# --- the section ---------------------------------------------------------------------------

def measure(target, clients, pipeline, last_rate, run_seconds, notes):
    """One timed run: (rate, connections, CPU us, switches per request); first an
    untimed one where no rate has been seen (it warms the pools and sizes the run).
    A run that fails is noted and counts as rate 0."""
    key = (target.label, clients, pipeline)
    try:
        if key not in last_rate:
            last_rate[key] = run_benchmark(target, clients, pipeline,
                                           requests_for(None, clients, pipeline, run_seconds))[0]
        rate, connections, usage = run_benchmark(
            target, clients, pipeline, requests_for(last_rate[key], clients, pipeline, run_seconds))
    except (OSError, RuntimeError, TimeoutError, ValueError) as error:
        notes.append(f"redis, {target.label}, {clients} clients, pipeline {pipeline}: "
                     f"{one_line(error)}")
        return (0.0, 0, None, None)
    last_rate[key] = rate or last_rate[key]
    return (rate, connections, usage["cpu_us"], usage["switches"])


def redis_peers(repetitions, notes, run_seconds=RUN_SECONDS):
    """Every target at every client count and pipeline depth, interleaved within
    each repetition; then the correctness pass through each."""
    if not (tool_path("redis-server") and tool_path("redis-benchmark")):
        notes.append(f"redis: skipped, needs redis-server and redis-benchmark "
                     f"({GET_THEM.replace('it', 'them')})")
        return {"rows": [], "checks": [], "repetitions": repetitions}
    # (label, clients, pipeline) -> [(rate, connections, cpu_us, switches)] one per repetition
    samples = {}
    last_rate = {}   # (label, clients, pipeline) -> the rate its last run measured
    with contextlib.ExitStack() as stack:
        targets = start_targets(stack, notes)
        for repetition in range(repetitions):
            for clients in CLIENT_COUNTS:
                for pipeline in PIPELINES:
                    progress(f"redis: repetition {repetition + 1}/{repetitions}, "
                             f"{clients} clients, pipeline {pipeline}")
                    turn = repetition % len(targets)
                    for target in targets[turn:] + targets[:turn]:
                        samples.setdefault((target.label, clients, pipeline),
                                           [None] * repetitions)[repetition] = measure(
                            target, clients, pipeline, last_rate, run_seconds, notes)
        checks = []
        for target in targets:
            progress(f"redis: checking values through {target.label}")
            checks.append({"target": target.label, "layer": target.layer,
                           **check_values(target.addr)})
        layers = {target.label: target.layer for target in targets}
    return {"rows": rows_from(samples, layers), "checks": checks, "repetitions": repetitions,
            "run_seconds": run_seconds}


def rows_from(samples, layers):
    """A row per (target, clients, pipeline): the median rate, and ratios to direct,
    socat and twemproxy taken repetition by repetition."""
    rows = []
    for (label, clients, pipeline), runs in samples.items():
        def ratios_to(other):
            theirs = samples.get((other, clients, pipeline))
            if not theirs:
                return None
            return spread([ratio(mine[0], their[0])
                           for mine, their in zip(runs, theirs) if mine and their])
        rates = [run[0] for run in runs if run]
        rows.append({"target": label, "layer": layers[label], "clients": clients,
                     "pipeline": pipeline, "rate": spread(rates), "runs": runs,
                     "x_direct": ratios_to("direct"), "x_socat": ratios_to("socat"),
                     "x_twemproxy": ratios_to("twemproxy"),
                     "server_connections": statistics.median(run[1] for run in runs if run),
                     "cpu_us": median_of(run[2] for run in runs if run),
                     "switches": median_of(run[3] for run in runs if run)})
    return rows


def median_of(values):
    """The median of the values that are not None, or None."""
    known = [value for value in values if value is not None]
    return statistics.median(known) if known else None


def targets(section):
    """The targets set for these rows, each (name, figure, reached): PassthroughProxy beside
    socat; ManagedProxy's loop beside twemproxy, and its CPU per request."""
    rows = {(row["target"], row["clients"], row["pipeline"]): row
            for row in section.get("rows", [])}
    checks = {check["target"]: check for check in section.get("checks", [])}
    found = []
    for clients in (8, 64):
        for pipeline in PIPELINES:
            row = rows.get(("PassthroughProxy, placed", clients, pipeline))
            if row and row["x_socat"]:
                found.append((f"redis: PassthroughProxy, placed >= 1.0x socat, {clients} clients, "
                              f"pipeline {pipeline}", f"{row['x_socat']['median']:.2f}x",
                              row["x_socat"]["median"] >= 1.0))
    for clients, least in WORKERS_TARGETS:
        row = rows.get((WORKERS_LABEL, clients, 1))
        if row and row["x_socat"]:
            seen = row["x_socat"]["median"]
            found.append((f"redis: {WORKERS_LABEL} >= {least}x socat, "
                          f"{clients} clients, pipeline 1",
                          f"{seen:.2f}x", seen >= least))
    check = checks.get(MANAGED_LABEL)
    for clients, pipeline, least in MANAGED_TARGETS:
        row = rows.get((MANAGED_LABEL, clients, pipeline))
        if row and row["x_twemproxy"] and check:
            ratio_seen = row["x_twemproxy"]["median"]
            reached = ratio_seen >= least and row["server_connections"] == 1 and not check["wrong"]
            found.append((f"redis: ManagedProxy(RESP) >= {least}x twemproxy, {clients} clients, "
                          f"pipeline {pipeline}, 1 server connection, 0 wrong",
                          f"{ratio_seen:.2f}x, {row['server_connections']:.0f} conn, "
                          f"{check['wrong']} wrong",
                          reached))
    row = rows.get((MANAGED_LABEL, 64, 1))
    if row and row["cpu_us"] is not None:
        found.append((f"redis: ManagedProxy(RESP) <= {MANAGED_CPU_US:g} us of CPU per request, "
                      "64 clients, pipeline 1", f"{row['cpu_us']:.1f} us",
                      row["cpu_us"] <= MANAGED_CPU_US))
    for check in section.get("checks", []):
        found.append((f"redis: {check['target']}: every value read is the one written",
                      f"{check['wrong']} wrong, {check['failed']} failed of {check['requests']}",
                      check["wrong"] + check["failed"] == 0))
    return found


PROFILED = (("PassthroughProxy, placed", "passthrough", {}, 20_000),
            (MANAGED_LABEL, "managed", {"connections": 1, "framing": resp.RESP}, 4_000))


def profile(clients=64):
    """(--profile) Where the Python relays' CPU goes under redis-benchmark: every
    thread profiled (cProfile), merged, the top functions by their own time."""
    reports = {}
    for label, kind, options, requests in PROFILED:
        with (RedisServer() as redis,
              ServiceProcess(kind, redis.addr, profile=True, **options) as proxy,
              contextlib.closing(Target(label, "-", redis, proxy)) as target):
            rate, _, usage = run_benchmark(target, clients, 1, requests)
            proxy.stop()
        reports[label] = {"requests": requests, "clients": clients, "rate": rate,
                          "cpu_us": usage["cpu_us"], "switches": usage["switches"],
                          "profile": proxy.report["profile"]}
    return reports


def render_profile(section):
    return "\n".join(f"Profile of {label} under redis-benchmark -t get -c {report['clients']} "
                     f"-n {report['requests']}: {report['rate']:.0f} requests/s profiled, "
                     f"{report['cpu_us']:.0f} us of CPU and {report['switches']:.1f} context "
                     f"switches per request, every thread profiled "
                     f"(profiling slows it)\n{report['profile']}"
                     for label, report in section.items())


# --- the tables -----------------------------------------------------------------------------

def ratio_cell(figures):
    return f"{figures['median']:.2f}" if figures else "-"


def render_redis(section):
    rows = sorted(section["rows"], key=lambda row: (row["pipeline"], row["clients"]))
    text = table(
        f"Redis: redis-benchmark -t get,set through each target to a redis-server of its own, "
        f"median of {section['repetitions']} repetitions of about "
        f"{section.get('run_seconds', RUN_SECONDS):g} s, targets "
        "interleaved; ratios from the same repetition; server conns: CLIENT LIST during the run, "
        "the count seen most often",
        ["target", "layer", "clients", "pipeline", "req/s", "range", "x direct", "x socat",
         "x twemproxy", "server conns", "relay CPU us/req", "switches/req"],
        [[row["target"], row["layer"], row["clients"], row["pipeline"],
          f"{row['rate']['median']:.0f}", low_high(row["rate"]), ratio_cell(row["x_direct"]),
          ratio_cell(row["x_socat"]), ratio_cell(row["x_twemproxy"]),
          f"{row['server_connections']:.0f}",
          "-" if row["cpu_us"] is None else f"{row['cpu_us']:.1f}",
          "-" if row["switches"] is None else f"{row['switches']:.2f}"]
         for row in rows], left_columns=2)
    checks = table(
        f"Values checked: {CHECK_THREADS} threads SET random keys to random values "
        "and GET them back (half the pairs pipelined)",
        ["target", "layer", "requests", "wrong", "failed"],
        [[check["target"], check["layer"], check["requests"], check["wrong"], check["failed"]]
         for check in section["checks"]], left_columns=2)
    return text + "\n" + checks


# --- a transaction through each Redis pool ---------------------------------------------------

REDIS_PY_PYTHON = pathlib.Path(__file__).resolve().parent.parent / ".venv-redis-8.1.0/bin/python"
TRANSACTION_SETS = 10      # SETs in one redis-py pipeline(), MULTI before them and EXEC after
TRANSACTION_ROUNDS = 2000  # pipelines timed per target and repetition, after a tenth as many
# Run in redis-py's venv: the median microseconds of one pipeline(transaction=True).execute().
TRANSACTION_SCRIPT = """
import statistics, sys, time
import redis
host, port, rounds, sets = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
client = redis.Redis(host=host, port=port, socket_timeout=10)
times = []
for _ in range(rounds + rounds // 10):
    pipe = client.pipeline(transaction=True)
    for number in range(sets):
        pipe.set(f"transaction:{number}", number)
    started = time.perf_counter()
    assert pipe.execute() == [True] * sets
    times.append(time.perf_counter() - started)
print(statistics.median(times[rounds // 10:]) * 1e6)
"""


def transaction_targets():
    """(label, start(redis_addr) -> Running or None for direct) for the transaction line."""
    return [("direct", None),
            (f"SessionProxy(RESP) cap {FRAMED_POOL_CAP}, placed",
             lambda addr: ServiceProcess("sessions", addr, pool_cap=FRAMED_POOL_CAP,
                                         framing=resp.RESP)),
            (MANAGED_LABEL, lambda addr: ServiceProcess("managed", addr, connections=1,
                                                        framing=resp.RESP))]


def transaction(repetitions, notes, rounds=TRANSACTION_ROUNDS):
    """redis-py 8's pipeline() of TRANSACTION_SETS SETs (MULTI ... EXEC), timed directly and
    through each pool, the targets taking turns in each repetition; a row per target."""
    if not REDIS_PY_PYTHON.exists() or not tool_path("redis-server"):
        notes.append("transaction: skipped, needs redis-server and .venv-redis-8.1.0 "
                     "(make wild-venvs)")
        return {"rows": [], "repetitions": repetitions}
    samples = {}
    with contextlib.ExitStack() as stack:
        started = []
        for label, start in transaction_targets():
            redis = stack.enter_context(RedisServer())
            relay = stack.enter_context(start(redis.addr)) if start else Direct(redis)
            started.append((label, relay))
        for repetition in range(repetitions):
            turn = repetition % len(started)
            for label, relay in started[turn:] + started[:turn]:
                progress(f"transaction: repetition {repetition + 1}/{repetitions}, {label}")
                timed = subprocess.run(
                    [str(REDIS_PY_PYTHON), "-c", TRANSACTION_SCRIPT, relay.addr[0],
                     str(relay.addr[1]), str(rounds), str(TRANSACTION_SETS)],
                    capture_output=True, text=True, timeout=BENCHMARK_TIMEOUT)
                if timed.returncode:
                    notes.append(f"transaction, {label}: {one_line(timed.stderr or 'failed')}")
                    continue
                samples.setdefault(label, [None] * repetitions)[repetition] = float(timed.stdout)
    direct = samples.get("direct", [])
    rows = [{"target": label, "us": spread([run for run in runs if run]),
             "x_direct": spread([ratio(mine, theirs) for mine, theirs in zip(runs, direct)
                                 if mine and theirs]) if direct else None}
            for label, runs in samples.items()]
    return {"rows": rows, "repetitions": repetitions, "rounds": rounds}


def render_transaction(section):
    return table(
        f"redis-py 8.1.0 pipeline() of {TRANSACTION_SETS} SETs (MULTI ... EXEC) through each "
        f"target to a redis-server of its own: median microseconds of "
        f"{section.get('rounds', TRANSACTION_ROUNDS)} executes, median of "
        f"{section['repetitions']} repetitions, targets interleaved",
        ["target", "us per pipeline", "range", "x direct"],
        [[row["target"], f"{row['us']['median']:.0f}", low_high(row["us"], "{:.0f}"),
          ratio_cell(row["x_direct"])] for row in section["rows"]], left_columns=1)


def transaction_targets_reached(section):
    """ManagedProxy's transaction within TRANSACTION_MOST x its direct time."""
    return [(f"transaction: ManagedProxy(RESP) <= {TRANSACTION_MOST:g}x direct",
             f"{row['x_direct']['median']:.2f}x", row["x_direct"]["median"] <= TRANSACTION_MOST)
            for row in section.get("rows", []) if row["target"] == MANAGED_LABEL and
            row["x_direct"]]


TRANSACTION_MOST = 2.0   # the most ManagedProxy's transaction may take, x its time direct
