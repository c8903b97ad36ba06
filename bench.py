"""bench.py: the times the demo cannot print, measured on this machine's loopback.

    python3 bench.py                 every section, about two and a half minutes
    python3 bench.py --quick         fewer and shorter repetitions, under 30 s
    python3 bench.py --json FILE     also write every raw figure to FILE
    python3 bench.py --profile       also profile the proxies' threads under load

Map of the module, in reading order:

    NaglePassthroughProxy, DistantUpstream, ProfiledThreads
                       the servers the bench adds: a relay without TCP_NODELAY, an
                       upstream whose delays overlap, and per-thread cProfile
    ServiceProcess     one server (the upstream, a proxy) in a process of its own,
                       so the load generator never shares its GIL; it waits on the
                       server's hooks on request, and on stop reports the
                       process's peak threads, peak RSS and CPU time
    ExternalRelay      socat or HAProxy (TCP mode) as a subprocess, when installed;
                       its CPU time read from /proc
    Client, exchange_rounds()
                       the load generator: one thread, one selector, any number
                       of clients each doing request -> reply round trips, every
                       reply checked against answer()
    sections           overhead, nagle, head_of_line, pipelining, scale, profile
    targets()          the targets set for the bench, each with the figure measured
    table(), main()    the text tables, the header, --json

Every loop is bounded in count and in time; every socket is on 127.0.0.1 with
a port from the OS; every server socket has TCP_NODELAY (tcp_proxy's
Server.track() sets it), and the load generator's sockets set it too.
"""
import argparse
import contextlib
import cProfile
import io
import json
import math
import multiprocessing
import os
import platform
import pstats
import queue
import resource
import selectors
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from tcp_proxy import FramedProxy, PassthroughProxy, Upstream, answer, read_lines, recv

try:   # the reliability layer; it joins the bench when it imports
    import managed
except ImportError:
    managed = None

CLIENT_COUNTS = (1, 8, 64)         # overhead: clients at once
POOL_CAPS = (1, 8, 64)             # overhead: FramedProxy's caps
REPLY_DELAY = 0.020                # head-of-line: D, the upstream's delay per reply
HEAD_OF_LINE_CLIENTS = 8           # head-of-line: N
HEAD_OF_LINE_CAPS = (1, 2, 4, 8)   # head-of-line: C
SCALE_CLIENTS = 1000
SCALE_POOL_CAP = 8
START_TIMEOUT = 10.0               # seconds a server process may take to listen
REPLY_GRACE = 10.0                 # seconds past its deadline a round may wait for replies
PROCESSES = multiprocessing.get_context("spawn")   # a clean child: its RSS is its own


def progress(message):
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def raise_open_file_limit():
    """1,000 clients need more descriptors than a default soft limit of 1,024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4 * SCALE_CLIENTS + 64
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))


# --- the servers, each in a process of its own ----------------------------------

class NaglePassthroughProxy(PassthroughProxy):
    """PassthroughProxy with Nagle's algorithm left on: what the relay would be
    without the TCP_NODELAY that Server.track() sets."""

    def track(self, sock):
        super().track(sock)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)
        return sock


class ProfiledThreads:
    """Mixin: every thread the server spawns runs under a cProfile.Profile of its
    own (cProfile sees one thread only); report() merges them all."""
    profiles = []

    def spawn(self, target, *args):
        def profiled(*target_args):
            profile = cProfile.Profile()
            self.profiles.append(profile)   # list.append is atomic under the GIL
            profile.runcall(target, *target_args)
        return super().spawn(profiled, *args)

    @classmethod
    def report(cls, lines=14):
        """The top functions by their own time; recv() and _accept() count the
        time their threads spent waiting, not only CPU."""
        text = io.StringIO()
        stats = pstats.Stats(*cls.profiles, stream=text)
        stats.sort_stats("tottime").print_stats(lines)
        return text.getvalue()


class DistantUpstream(Upstream):
    """An upstream whose every reply leaves `delay` seconds after its request
    arrived, however many requests are in flight on the connection: a far
    upstream (latency that overlaps) rather than a slow one (Upstream's pause,
    service time that queues). Its handle() differs from Upstream's only in
    stamping each reply with the time it is due, which Upstream's queue of
    bytes has no room for."""

    def __init__(self, delay):
        super().__init__()
        self.delay = delay

    def handle(self, conn):
        due_replies = queue.SimpleQueue()
        writer = self.spawn(self._write_when_due, conn, due_replies)
        try:
            for line in read_lines(conn):
                due_replies.put((time.monotonic() + self.delay, answer(line)))
        finally:
            due_replies.put(None)
            writer.join()

    def _write_when_due(self, conn, due_replies):
        with contextlib.suppress(OSError):   # the client has gone: no one reads the rest
            while (item := due_replies.get()) is not None:
                due, data = item
                time.sleep(max(0.0, due - time.monotonic()))
                conn.sendall(data)


def build_server(kind, upstream_addr, options):
    """The server a child process runs. kind: upstream, distant-upstream,
    passthrough, nagle-passthrough, framed or managed."""
    classes = {
        "upstream": Upstream, "distant-upstream": DistantUpstream, "passthrough": PassthroughProxy,
        "nagle-passthrough": NaglePassthroughProxy, "framed": FramedProxy,
        "managed": managed and managed.ManagedProxy,
    }
    server_class = classes[kind]
    if options.get("profile"):
        server_class = type("Profiled" + server_class.__name__, (ProfiledThreads, server_class), {})
    if kind == "upstream":
        delay = options.get("reply_delay")
        return server_class(pause=(lambda number: time.sleep(delay)) if delay else None)
    if kind == "distant-upstream":
        return server_class(options["reply_delay"])
    if kind == "framed":
        return server_class(upstream_addr, pool_cap=options["pool_cap"])
    if kind == "managed":
        return server_class([(upstream_addr, options["connections"])],
                            pending_calls_max=options.get("pending_calls_max"))
    return server_class(upstream_addr)


class PeakThreads:
    """The most threads alive at once, the sampler not counted: sampled every
    millisecond until stopped, and whenever sample() is called (a peak shorter
    than a millisecond is seen only then)."""

    def __init__(self):
        self.peak = threading.active_count()
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample_until_stopped, daemon=True)
        self._sampler.start()

    def sample(self):
        self.peak = max(self.peak, threading.active_count() - 1)

    def _sample_until_stopped(self):
        while not self._stop.wait(0.001):
            self.sample()

    def stop(self):
        self._stop.set()
        self._sampler.join()
        return self.peak


def serve_in_child(kind, upstream_addr, options, pipe):
    """A child process's whole life: serve, report the address, answer
    ("wait", counter, n, timeout) messages until "stop", then send back what the process used."""
    raise_open_file_limit()
    server = build_server(kind, upstream_addr, options)
    threads = PeakThreads()
    at_start = resource.getrusage(resource.RUSAGE_SELF)   # the CPU of starting up is not the server's
    pipe.send(server.addr)
    with contextlib.suppress(EOFError):   # the parent died: stop all the same
        while (message := pipe.recv()) != "stop":
            _, counter, level, timeout = message
            try:
                getattr(server, f"wait_{counter}")(level, timeout=timeout)
                threads.sample()   # the moment the parent waited for may be a brief peak
                pipe.send(None)
            except TimeoutError as error:
                pipe.send(str(error))
    peak_threads = threads.stop()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    user, system = usage.ru_utime - at_start.ru_utime, usage.ru_stime - at_start.ru_stime
    report = {
        "peak_threads": peak_threads,
        "peak_rss_mb": usage.ru_maxrss / 1024,   # Linux reports kilobytes
        "cpu_seconds": user + system, "user_seconds": user, "system_seconds": system,
        "profile": ProfiledThreads.report() if options.get("profile") else None,
    }
    server.close()
    pipe.send(report)


class Running:
    """Something listening at .addr until stop(); usable as a context manager."""
    addr = None
    report = None

    def stop(self):
        """Stop the server; keep what it reports about itself in .report."""

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.stop()


class ServiceProcess(Running):
    def __init__(self, kind, upstream_addr=None, **options):
        self.kind = kind
        self.pipe, child_end = PROCESSES.Pipe()
        self.process = PROCESSES.Process(target=serve_in_child, daemon=True,
                                         args=(kind, upstream_addr, options, child_end))
        self.process.start()
        child_end.close()
        try:
            if not self.pipe.poll(START_TIMEOUT):
                raise EOFError
            self.addr = self.pipe.recv()
        except EOFError:   # silent, or died before it listened (its traceback is on stderr)
            self.process.kill()
            raise RuntimeError(f"{kind} did not start within {START_TIMEOUT} s") from None

    def wait_for(self, counter, level, timeout=START_TIMEOUT):
        """Block until the server's hook counter reaches level (see tcp_proxy's Hooks)."""
        self.pipe.send(("wait", counter, level, timeout))
        failure = self.pipe.recv() if self.pipe.poll(timeout + START_TIMEOUT) else "no answer"
        if failure:
            raise TimeoutError(f"{self.kind}: {failure}")

    def stop(self):
        if self.report is not None or not self.process.is_alive():
            return self.report
        self.pipe.send("stop")
        self.report = self.pipe.recv() if self.pipe.poll(START_TIMEOUT) else {}
        self.process.join(START_TIMEOUT)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.pipe.close()
        return self.report


def free_port():
    """A port the OS has just handed out, for tools that cannot report theirs."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


HAPROXY_CONFIG = """\
global
    maxconn 4096
defaults
    mode tcp
    timeout connect 5s
    timeout client 60s
    timeout server 60s
frontend relay
    bind 127.0.0.1:{port}
    default_backend upstream
backend upstream
    server only 127.0.0.1:{upstream_port}
"""


class ExternalRelay(Running):
    """socat or HAProxy relaying TCP to the upstream: what a user would run instead."""
    TOOLS = ("socat", "haproxy")

    def __init__(self, tool, upstream_addr):
        port, upstream_port = free_port(), upstream_addr[1]
        self.config, self.cpu_at_start = None, None
        if tool == "socat":   # fork: a process per connection; nodelay on both sides
            argv = ["socat", f"TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr,nodelay,backlog=1024",
                    f"TCP:127.0.0.1:{upstream_port},nodelay"]
        else:
            self.config = tempfile.NamedTemporaryFile("w", suffix=".cfg", delete=False)
            self.config.write(HAPROXY_CONFIG.format(port=port, upstream_port=upstream_port))
            self.config.close()
            argv = ["haproxy", "-db", "-f", self.config.name]
        self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addr = ("127.0.0.1", port)
        self._wait_until_listening()
        self.cpu_at_start = self.cpu_seconds()

    def _wait_until_listening(self):
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline and self.process.poll() is None:
            with contextlib.suppress(OSError):
                socket.create_connection(self.addr, timeout=1).close()
                return
            time.sleep(0.01)
        self.stop()
        raise RuntimeError(f"{self.process.args[0]} did not start listening on {self.addr}")

    def cpu_seconds(self):
        """(user, system) CPU seconds of the tool and of the children it has reaped
        (socat forks one per connection), read from /proc; None without /proc."""
        try:
            with open(f"/proc/{self.process.pid}/stat", encoding="ascii") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()   # from field 3 on
        except OSError:
            return None
        user, system, children_user, children_system = (int(ticks) / os.sysconf("SC_CLK_TCK")
                                                         for ticks in fields[11:15])   # fields 14-17
        return user + children_user, system + children_system

    def _wait_for_children(self):
        """Until the tool has reaped every per-connection child (at most START_TIMEOUT)."""
        children = f"/proc/{self.process.pid}/task/{self.process.pid}/children"
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            try:
                with open(children, encoding="ascii") as listing:
                    if not listing.read().strip():
                        return
            except OSError:
                return
            time.sleep(0.01)

    def stop(self):
        if self.report is None and self.process.poll() is None and self.cpu_at_start:
            self._wait_for_children()
            user, system = self.cpu_seconds()
            self.report = {"user_seconds": user - self.cpu_at_start[0],
                           "system_seconds": system - self.cpu_at_start[1]}
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(START_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.config:
            os.unlink(self.config.name)
            self.config = None
        return self.report


# --- the load generator ---------------------------------------------------------

class Client:
    """One connection doing round trips: send a request, wait for its whole reply."""

    def __init__(self, number, addr):
        self.number = number
        self.sock = socket.create_connection(addr, timeout=START_TIMEOUT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sent = 0          # requests sent in the current round
        self.request = b""     # the request waiting for its reply
        self.sent_at = 0.0
        self.buffer = b""

    def send_request(self):
        self.request = b"GET k%dn%d\n" % (self.number, self.sent)   # unique: a stray reply shows
        self.sent += 1
        self.sent_at = time.perf_counter()
        self.sock.sendall(self.request)

    def close(self):
        self.sock.close()


def connect_clients(addr, count):
    return [Client(number, addr) for number in range(count)]


def close_clients(clients):
    for client in clients:
        client.close()


class Round:
    """What one round of round trips measured."""

    def __init__(self):
        self.answered = self.wrong = self.unanswered = 0
        self.latencies = []   # seconds per round trip
        self.started = self.finished = time.perf_counter()

    @property
    def seconds(self):
        return self.finished - self.started

    @property
    def rate(self):
        return self.answered / self.seconds if self.seconds else 0.0

    def percentile(self, fraction):
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else math.nan


def exchange_rounds(clients, requests_each, seconds=None):
    """Every client sends a request, reads its reply, and sends the next, until it
    has sent requests_each or `seconds` have passed; all clients start at once.
    A connection that fails counts its request as unanswered."""
    selector = selectors.DefaultSelector()
    measured = Round()
    deadline = measured.started + (seconds if seconds is not None else REPLY_GRACE)
    give_up = deadline + REPLY_GRACE

    def send_or_give_up(client):
        try:
            client.send_request()
        except OSError:
            measured.unanswered += 1
            selector.unregister(client.sock)

    for client in clients:
        client.sent, client.buffer = 0, b""
        selector.register(client.sock, selectors.EVENT_READ, client)
        send_or_give_up(client)
    while selector.get_map() and time.perf_counter() < give_up:
        for key, _ in selector.select(timeout=0.5):
            client = key.data
            data = recv(client.sock)
            if not data:   # the far side closed: whatever was asked stays unanswered
                measured.unanswered += 1
                selector.unregister(client.sock)
                continue
            client.buffer += data
            if b"\n" not in client.buffer:
                continue
            now = time.perf_counter()
            reply, client.buffer = client.buffer.split(b"\n", 1)
            measured.latencies.append(now - client.sent_at)
            measured.finished = now
            if reply + b"\n" == answer(client.request[:-1]):
                measured.answered += 1
            else:
                measured.wrong += 1
            if client.sent < requests_each and now < deadline:
                send_or_give_up(client)
            else:
                selector.unregister(client.sock)
    measured.unanswered += len(selector.get_map())   # still waiting when time ran out
    selector.close()
    return measured


def throughput(addr, client_count, seconds):
    """Connect, warm every connection with one round trip, then measure."""
    clients = connect_clients(addr, client_count)
    try:
        exchange_rounds(clients, 1)
        return exchange_rounds(clients, requests_each=10**9, seconds=seconds)
    finally:
        close_clients(clients)


# --- sections ---------------------------------------------------------------------

def spread(values):
    return {"median": statistics.median(values), "low": min(values), "high": max(values)}


def start_relays(upstream_addr, notes):
    """Name -> a running server, for every relay the overhead section compares."""
    relays = {"PassthroughProxy": ServiceProcess("passthrough", upstream_addr)}
    for cap in POOL_CAPS:
        relays[f"FramedProxy cap {cap}"] = ServiceProcess("framed", upstream_addr, pool_cap=cap)
    if managed:
        relays["ManagedProxy 8 conns"] = ServiceProcess("managed", upstream_addr, connections=8)
    else:
        notes.append("ManagedProxy: skipped, managed.py does not import")
    for tool in ExternalRelay.TOOLS:
        if shutil.which(tool):
            relays[tool] = ExternalRelay(tool, upstream_addr)
        else:
            notes.append(f"{tool}: skipped, not installed")
    return relays


def overhead(repetitions, seconds):
    """Requests/s and round-trip percentiles per relay, as ratios to a direct
    connection measured in the same repetition."""
    notes, samples = [], {}
    with contextlib.ExitStack() as stack:
        upstream = stack.enter_context(ServiceProcess("upstream"))
        relays = {name: stack.enter_context(server)
                  for name, server in start_relays(upstream.addr, notes).items()}
        addresses = {"direct": upstream.addr, **{name: server.addr for name, server in relays.items()}}
        for repetition in range(repetitions):
            for client_count in CLIENT_COUNTS:
                progress(f"overhead: repetition {repetition + 1}/{repetitions}, {client_count} clients")
                direct = throughput(upstream.addr, client_count, seconds)
                names = list(relays)
                turn = repetition % len(names)   # each relay in turn measured first after direct
                for name in ["direct"] + names[turn:] + names[:turn]:
                    measured = direct if name == "direct" else throughput(addresses[name], client_count, seconds)
                    samples.setdefault((name, client_count), []).append({
                        "rate": measured.rate, "ratio": measured.rate / direct.rate,
                        "p50_us": measured.percentile(0.50) * 1e6, "p99_us": measured.percentile(0.99) * 1e6,
                        "wrong": measured.wrong, "unanswered": measured.unanswered,
                        "answered": measured.answered})
        reports = {name: server.stop() for name, server in relays.items()}
    rows = [{"relay": name, "clients": client_count, "runs": runs,
             "rate": spread([run["rate"] for run in runs]),
             "ratio": spread([run["ratio"] for run in runs]),
             "p50_us": statistics.median(run["p50_us"] for run in runs),
             "p99_us": statistics.median(run["p99_us"] for run in runs),
             "wrong": sum(run["wrong"] + run["unanswered"] for run in runs)}
            for (name, client_count), runs in samples.items()]
    cpu = []
    for name, report in reports.items():
        served = sum(run["answered"] for (relay, _), runs in samples.items() if relay == name for run in runs)
        if report and served:
            cpu.append({"relay": name, "requests": served,
                        "user_us": report["user_seconds"] / served * 1e6,
                        "system_us": report["system_seconds"] / served * 1e6})
    return {"rows": rows, "cpu": cpu, "notes": notes, "repetitions": repetitions, "seconds_each": seconds}


def split_request_round_trips(addr, count, gap):
    """One client whose every request goes out in two writes, `gap` seconds apart;
    the round-trip times in seconds (after five untimed warm-up requests)."""
    times = []
    with socket.create_connection(addr, timeout=START_TIMEOUT) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = sock.makefile("rb")
        for number in range(count + 5):
            request = b"GET nagle%d\n" % number
            started = time.perf_counter()
            sock.sendall(request[:6])
            time.sleep(gap)   # the two halves reach the relay as two recv()s
            sock.sendall(request[6:])
            reply = reader.readline()
            if number >= 5:
                times.append(time.perf_counter() - started)
            if reply != answer(request[:-1]):
                raise AssertionError(f"wrong reply {reply!r} to {request!r}")
        reader.close()
    return times


def nagle(count, gap=0.002):
    """A request written in two parts through the relay, with and without TCP_NODELAY."""
    rows = []
    with ServiceProcess("upstream") as upstream:
        for label, kind in (("PassthroughProxy, TCP_NODELAY on", "passthrough"),
                            ("PassthroughProxy, Nagle left on", "nagle-passthrough")):
            with ServiceProcess(kind, upstream.addr) as relay:
                times = split_request_round_trips(relay.addr, count, gap)
            rows.append({"relay": label, "requests": count, "gap_ms": gap * 1e3,
                         "median_ms": statistics.median(times) * 1e3,
                         "low_ms": min(times) * 1e3, "high_ms": max(times) * 1e3})
    return {"rows": rows}


def burst(addr, client_count, rounds):
    """client_count clients connected first, then each sends one request at once,
    `rounds` times; one untimed round first."""
    clients = connect_clients(addr, client_count)
    try:
        exchange_rounds(clients, 1)
        return [exchange_rounds(clients, 1) for _ in range(rounds)]
    finally:
        close_clients(clients)


def bursts_through(kind, upstream_addr, repetitions, **options):
    """HEAD_OF_LINE_CLIENTS clients at once through a fresh proxy process: the
    figures of every burst."""
    with ServiceProcess(kind, upstream_addr, **options) as proxy:
        rounds = burst(proxy.addr, HEAD_OF_LINE_CLIENTS, repetitions)
    return {"clients": HEAD_OF_LINE_CLIENTS,
            "wall_ms": spread([measured.seconds * 1e3 for measured in rounds]),
            "p50_ms": statistics.median(measured.percentile(0.5) * 1e3 for measured in rounds),
            "wrong": sum(measured.wrong + measured.unanswered for measured in rounds)}


def head_of_line(repetitions):
    """N clients at once through a pool of C connections to an upstream that takes
    D per reply: the prediction is ceil(N/C) * D."""
    rows = []
    with ServiceProcess("upstream", reply_delay=REPLY_DELAY) as upstream:
        for cap in HEAD_OF_LINE_CAPS:
            row = bursts_through("framed", upstream.addr, repetitions, pool_cap=cap)
            predicted = math.ceil(HEAD_OF_LINE_CLIENTS / cap) * REPLY_DELAY * 1e3
            excess = row["wall_ms"]["median"] - predicted
            rows.append({"pool_cap": cap, "predicted_ms": predicted, "excess_ms": excess,
                         "within_target": abs(excess) <= max(3.0, 0.10 * predicted), **row})
    return {"rows": rows, "reply_delay_ms": REPLY_DELAY * 1e3, "repetitions": repetitions}


def pipelining(repetitions):
    """HEAD_OF_LINE_CLIENTS clients over one upstream connection, pipelined
    (ManagedProxy) or one request at a time (FramedProxy cap 1), with a pool of 8
    for comparison; against a slow upstream (D of service per reply, which queues)
    and a distant one (D of latency per reply, which overlaps)."""
    if not managed:
        return {"rows": [], "notes": ["pipelining: skipped, managed.py does not import"]}
    upstreams = (("slow", "upstream"), ("distant", "distant-upstream"))
    relays = (("FramedProxy cap 1", "framed", {"pool_cap": 1}),
              ("ManagedProxy, 1 conn, pipelined", "managed", {"connections": 1}),
              ("FramedProxy cap 8", "framed", {"pool_cap": 8}))
    rows = []
    for upstream_label, upstream_kind in upstreams:
        with ServiceProcess(upstream_kind, reply_delay=REPLY_DELAY) as upstream:
            for label, kind, options in relays:
                rows.append({"upstream": upstream_label, "relay": label,
                             **bursts_through(kind, upstream.addr, repetitions, **options)})
    return {"rows": rows, "notes": [], "reply_delay_ms": REPLY_DELAY * 1e3, "repetitions": repetitions}


def scale():
    """SCALE_CLIENTS clients connected at once, one request each, through
    FramedProxy cap 8 (the target) and PassthroughProxy (two threads a client)."""
    rows = []
    with ServiceProcess("upstream") as upstream:
        for label, kind, options in ((f"FramedProxy cap {SCALE_POOL_CAP}", "framed", {"pool_cap": SCALE_POOL_CAP}),
                                     ("PassthroughProxy", "passthrough", {})):
            with ServiceProcess(kind, upstream.addr, **options) as proxy:
                connect_started = time.perf_counter()
                clients = connect_clients(proxy.addr, SCALE_CLIENTS)
                connect_seconds = time.perf_counter() - connect_started
                try:   # connect() returns once the kernel queued it; the proxy accepts later
                    proxy.wait_for("connections", SCALE_CLIENTS)
                    accept_seconds = time.perf_counter() - connect_started
                    measured = exchange_rounds(clients, 1)
                finally:
                    close_clients(clients)
            rows.append({"relay": label, "answered": measured.answered, "wrong": measured.wrong,
                         "unanswered": measured.unanswered, "connected_ms": connect_seconds * 1e3,
                         "accepted_ms": accept_seconds * 1e3,
                         "burst_ms": measured.seconds * 1e3, "p50_ms": measured.percentile(0.50) * 1e3,
                         "p99_ms": measured.percentile(0.99) * 1e3, **proxy.report})
    return {"clients": SCALE_CLIENTS, "rows": rows}


def profile(seconds):
    """Where a proxy's CPU time goes, in the two cases the targets are closest in:
    every thread profiled, merged, the top functions by their own time."""
    reports = {}
    with ServiceProcess("upstream") as upstream:
        for label, kind, client_count, options in (("PassthroughProxy", "passthrough", 1, {}),
                                                   ("FramedProxy cap 8", "framed", 8, {"pool_cap": 8})):
            with ServiceProcess(kind, upstream.addr, profile=True, **options) as proxy:
                measured = throughput(proxy.addr, client_count, seconds)
            reports[label] = {"requests": measured.answered, "clients": client_count,
                              "cpu_seconds": proxy.report["cpu_seconds"], "profile": proxy.report["profile"]}
    return reports


# --- the targets set for the bench ----------------------------------------------------

def targets(results):
    """Each target with the figure measured and whether it was reached."""
    found = []
    rows = {(row["relay"], row["clients"]): row for row in results["overhead"]["rows"]}

    def ratios(name, other, client_count):
        """name's rate / other's rate in each repetition: both from the same one."""
        mine, theirs = rows[(name, client_count)]["runs"], rows[(other, client_count)]["runs"]
        return spread([a["rate"] / b["rate"] for a, b in zip(mine, theirs)])

    comparisons = [("PassthroughProxy", "socat", client_count, 0.9) for client_count in (1, 8)]
    comparisons += [(f"FramedProxy cap {cap}", "PassthroughProxy", client_count, 0.75)
                    for cap in POOL_CAPS for client_count in CLIENT_COUNTS if client_count <= min(cap, 8)]
    for name, other, client_count, least in comparisons:
        if (name, client_count) in rows and (other, client_count) in rows:   # socat may be absent
            figures = ratios(name, other, client_count)
            found.append((f"{name} >= {least}x {other}, {client_count} client(s)",
                          f"{figures['median']:.2f}x ({low_high(figures, '{:.2f}')})",
                          figures["median"] >= least))
    for row in results["head_of_line"]["rows"]:
        found.append((f"head-of-line cap {row['pool_cap']} within max(3 ms, 10%) of "
                      f"{row['predicted_ms']:.0f} ms", f"{row['wall_ms']['median']:.1f} ms",
                      row["within_target"]))
    measured = results["scale"]["rows"][0]   # FramedProxy cap 8, the one the targets name
    found.append((f"{results['scale']['clients']} clients through {measured['relay']}, 0 wrong answers",
                  f"{measured['wrong'] + measured['unanswered']} wrong or unanswered",
                  measured["wrong"] + measured["unanswered"] == 0))
    found.append((f"{results['scale']['clients']} clients through {measured['relay']}, peak RSS < 64 MB",
                  f"{measured['peak_rss_mb']:.1f} MB", measured["peak_rss_mb"] < 64))
    return found


# --- output -----------------------------------------------------------------------

def table(title, columns, rows, left_columns=1):
    """A fixed-width text table: names (the first left_columns) to the left, figures to the right."""
    cells = [columns] + [[str(value) for value in row] for row in rows]
    widths = [max(len(row[index]) for row in cells) for index in range(len(columns))]

    def line(row):
        return "  ".join(value.ljust(width) if index < left_columns else value.rjust(width)
                         for index, (value, width) in enumerate(zip(row, widths)))
    return "\n".join([title, line(columns), line(["-" * width for width in widths])]
                     + [line(row) for row in cells[1:]]) + "\n"


def low_high(figures, form="{:.0f}"):
    return f"{form.format(figures['low'])}-{form.format(figures['high'])}"


def render(results, arguments):
    header = (f"bench.py on {os.cpu_count()} cores, Python {platform.python_version()}, "
              f"{platform.system()} {platform.release()}, load average {results['load_average']:.1f} "
              f"at the start; one run of: {arguments}\n")
    out = [header]
    section = results["overhead"]
    out.append(table(
        f"1. Overhead: round trips through each relay, median of {section['repetitions']} "
        f"repetitions of {section['seconds_each']} s (ratio to direct from the same repetition)",
        ["relay", "clients", "req/s", "range", "x direct", "range", "p50 us", "p99 us", "wrong"],
        [[row["relay"], row["clients"], f"{row['rate']['median']:.0f}", low_high(row["rate"]),
          f"{row['ratio']['median']:.2f}", low_high(row["ratio"], "{:.2f}"),
          f"{row['p50_us']:.0f}", f"{row['p99_us']:.0f}", row["wrong"]]
         for row in sorted(section["rows"], key=lambda row: row["clients"])]))
    out.extend(note + "\n" for note in section["notes"])
    out.append(table(
        "CPU time of each relay's processes per request, over the whole overhead section",
        ["relay", "requests", "user us/req", "system us/req"],
        [[row["relay"], row["requests"], f"{row['user_us']:.0f}", f"{row['system_us']:.0f}"]
         for row in section["cpu"]]))
    out.append(table(
        "Nagle: a request written in two parts 2 ms apart, through the relay",
        ["relay", "requests", "median ms", "range ms"],
        [[row["relay"], row["requests"], f"{row['median_ms']:.1f}",
          f"{row['low_ms']:.1f}-{row['high_ms']:.1f}"] for row in results["nagle"]["rows"]]))
    section = results["head_of_line"]
    out.append(table(
        f"2. Head-of-line: {HEAD_OF_LINE_CLIENTS} clients at once, upstream delays each reply "
        f"{section['reply_delay_ms']:.0f} ms, median of {section['repetitions']} bursts",
        ["pool cap C", "predicted ceil(N/C)*D ms", "measured ms", "range ms", "excess ms", "within target",
         "wrong"],
        [[row["pool_cap"], f"{row['predicted_ms']:.0f}", f"{row['wall_ms']['median']:.1f}",
          low_high(row["wall_ms"], "{:.1f}"), f"{row['excess_ms']:+.1f}",
          "yes" if row["within_target"] else "no", row["wrong"]] for row in section["rows"]]))
    section = results["pipelining"]
    if section["rows"]:
        out.append(table(
            f"3. Pipelining vs pooling: {HEAD_OF_LINE_CLIENTS} clients at once; a slow upstream spends "
            f"{section['reply_delay_ms']:.0f} ms on each reply in turn, a distant one answers each "
            f"{section['reply_delay_ms']:.0f} ms after it arrived; median of {section['repetitions']} bursts",
            ["upstream", "relay", "wall ms", "range ms", "p50 ms", "wrong"],
            [[row["upstream"], row["relay"], f"{row['wall_ms']['median']:.1f}", low_high(row["wall_ms"], "{:.1f}"),
              f"{row['p50_ms']:.1f}", row["wrong"]] for row in section["rows"]], left_columns=2))
    else:
        out.append("3. Pipelining vs pooling\n" + "".join(note + "\n" for note in section["notes"]))
    section = results["scale"]
    out.append(table(
        f"4. Scale: {section['clients']} clients connect at once, then each sends one request; from the "
        f"first connect until every connect() returned (connected) and the proxy accepted all (accepted)",
        ["relay", "answered", "wrong", "unanswered", "connected ms", "accepted ms", "burst ms", "p50 ms",
         "p99 ms", "peak threads", "peak RSS MB"],
        [[row["relay"], row["answered"], row["wrong"], row["unanswered"], f"{row['connected_ms']:.0f}",
          f"{row['accepted_ms']:.0f}",
          f"{row['burst_ms']:.0f}", f"{row['p50_ms']:.1f}", f"{row['p99_ms']:.1f}",
          row["peak_threads"], f"{row['peak_rss_mb']:.1f}"] for row in section["rows"]]))
    out.append(table("5. The targets set for the bench", ["target", "measured", "reached"],
                     [[name, figure, "yes" if reached else "NO"] for name, figure, reached in targets(results)]))
    for label, report in (results.get("profile") or {}).items():
        out.append(f"Profile of {label}: {report['requests']} requests from {report['clients']} clients, "
                   f"{report['cpu_seconds']:.2f} s of process CPU, every thread profiled "
                   f"(profiling slows it)\n{report['profile']}")
    return "\n".join(out)


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 short repetitions: under 30 s")
    parser.add_argument("--json", metavar="FILE", help="write every raw figure to FILE")
    parser.add_argument("--profile", action="store_true",
                        help="also profile PassthroughProxy and FramedProxy under load (cProfile, every thread)")
    parser.add_argument("--repetitions", type=int, help="overhead repetitions (default 5, quick 3)")
    parser.add_argument("--seconds", type=float, help="seconds per overhead measurement (default 1, quick 0.1)")
    return parser.parse_args(argv)


def main(argv=None):
    arguments = parse_arguments(argv)
    raise_open_file_limit()
    repetitions = arguments.repetitions or (3 if arguments.quick else 5)
    seconds = arguments.seconds or (0.1 if arguments.quick else 1.0)
    started = time.perf_counter()
    results = {"cores": os.cpu_count(), "python": platform.python_version(),
               "load_average": os.getloadavg()[0],   # other work on the machine skews every figure
               "command": " ".join(["python3", "bench.py", *(argv if argv is not None else sys.argv[1:])])}
    progress("section 1/5: overhead")
    results["overhead"] = overhead(repetitions, seconds)
    progress("nagle: one request in two writes, with and without TCP_NODELAY")
    results["nagle"] = nagle(count=5 if arguments.quick else 20)
    progress("section 2/5: head-of-line")
    results["head_of_line"] = head_of_line(repetitions)
    progress("section 3/5: pipelining vs pooling")
    results["pipelining"] = pipelining(repetitions)
    progress(f"section 4/5: scale, {SCALE_CLIENTS} clients")
    results["scale"] = scale()
    if arguments.profile:
        progress("profile: every proxy thread under cProfile")
        results["profile"] = profile(seconds=2 * seconds)
    progress(f"section 5/5: tables; {time.perf_counter() - started:.0f} s in all")
    results["targets"] = [{"target": name, "measured": figure, "reached": reached}
                          for name, figure, reached in targets(results)]
    print(render(results, results["command"]))
    if arguments.json:
        with open(arguments.json, "w", encoding="utf-8") as out:
            json.dump(results, out, indent=1, default=str)


if __name__ == "__main__":
    main()
