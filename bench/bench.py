"""bench.bench: the times the demo cannot print, measured on this machine's loopback.

    python3 -m bench                 every section, about nine minutes
    python3 -m bench --quick         fewer and shorter repetitions, 1,000 clients only: about a minute
    python3 -m bench --only scale    one section (or several, comma-separated)
    python3 -m bench --json FILE     also write every raw figure to FILE
    python3 -m bench --profile       also profile the proxies' threads under load
    python3 -m bench --perf          also count the futex() calls of each alternative (perf, Linux)

Map of the module, in reading order:

    LeanUpstream       the line server behind every relay in the overhead section
    Uncounted..., NotifyIfWaited..., SplicePassthroughProxy, OneThreadPassthroughProxy
                       the alternatives to PassthroughProxy's mechanism, each a
                       change to its pump or its threads; build_server() runs any of
                       them, and any proxy, with its connections' threads placed on CPUs
                       by bench/placement.py (every row unless it says "not pinned":
                       sockets_per_cpu=0), or its whole process on one CPU ("pinned-passthrough")
    NaglePassthroughProxy, DistantUpstream, ProfiledThreads
                       a relay without TCP_NODELAY, an upstream whose delays
                       overlap, and per-thread cProfile
    ServiceProcess     one server (the upstream, a proxy) in a process of its own,
                       so the load generator never shares its GIL; it waits on the
                       server's hooks and reports its CPU and context switches on
                       request, and on stop its peak threads, peak RSS and CPU time
    ExternalRelay      socat or HAProxy (TCP mode) as a subprocess, when installed
                       (`make bench-tools`); its CPU time read from /proc
    Client, exchange_rounds(), threaded_round_trips()
                       the load generators: one thread and one selector for any
                       number of clients, or a thread per client; every reply is
                       checked against answer()
    sections           overhead, alternatives, nagle, head_of_line, scale,
                       pipelining (and profile); each table is printed as soon as
                       it is measured, and a section that fails says why in one
                       line while the others still run
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
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from tcp_proxy import (MAX_LINE, FramedProxy, LineTooLong, PassthroughProxy, Server, Upstream, answer,
                       read_lines, recv, shutdown)

from bench import placement
from part2 import managed

CLIENT_COUNTS = (1, 8, 64)         # overhead: clients at once
POOL_CAPS = (1, 8, 64)             # overhead: FramedProxy's caps
REPLY_DELAY = 0.020                # head-of-line: D, the upstream's delay per reply
HEAD_OF_LINE_CLIENTS = 8           # head-of-line: N
HEAD_OF_LINE_CAPS = (1, 2, 4, 8)   # head-of-line: C
THREADED_CLIENTS = 8               # overhead: the row also measured with a thread per client
ALTERNATIVE_CLIENTS = (1, 8, 64)   # alternatives: clients at once
SCALE_CLIENTS = (1000, 5000)       # scale: clients at once (--quick: the first only)
SCALE_POOL_CAP = 8
SCALE_ROUNDS = 3                   # scale: bursts of one request per client; the median p50 and p99
SCALE_ACCEPT_TIMEOUT = 60.0        # seconds the proxy may take to accept every client
START_TIMEOUT = 10.0               # seconds a server process may take to listen
STOP_TIMEOUT = 60.0                # seconds it may take to report and close (10,000 threads)
REPLY_GRACE = 10.0                 # seconds past its deadline a round may wait for replies
PROCESSES = multiprocessing.get_context("spawn")   # a clean child: its RSS is its own


def progress(message):
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def raise_open_file_limit():
    """1,000 clients need more descriptors than a default soft limit of 1,024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 3 * max(SCALE_CLIENTS) + 64
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))


# --- the servers, each in a process of its own ----------------------------------

class LeanUpstream(Server):
    """The line server behind every relay in the overhead section: answer() and
    nothing else per request (no hooks, no request log, no writer thread), one
    thread per connection. Upstream costs about four times as much CPU per
    request, enough to become the bottleneck and hide what a relay costs. Its
    threads go wherever the OS puts them, as socat's do (build_server() never places
    them): only the relay is measured."""

    def handle(self, conn):
        buffer = b""
        while data := recv(conn):
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            if len(buffer) > MAX_LINE:
                raise LineTooLong(f"line longer than {MAX_LINE} bytes")
            conn.sendall(b"".join(map(answer, lines)))


# The alternatives to PassthroughProxy's mechanism, measured side by side by the
# alternatives section; scaffolding for the bench, none of them is the lesson.

class UncountedPassthroughProxy(PassthroughProxy):
    """No counting at all in the pumps (its hooks no longer work): the floor
    that counting can be brought down to."""

    def count(self, name, amount=1):
        if name not in ("forwarded", "returned"):
            super().count(name, amount)


class NotifyIfWaitedPassthroughProxy(PassthroughProxy):
    """A fast path for Hooks.count(): the condition is still taken for every
    chunk, but notify_all() is skipped when nobody waits."""

    def count(self, name, amount=1):
        with self._changed:
            setattr(self, name, getattr(self, name) + amount)
            if self._changed._waiters:
                self._changed.notify_all()


class SplicePassthroughProxy(PassthroughProxy):
    """os.splice(): the kernel moves each chunk from the source socket into a
    pipe and from the pipe into the sink; the bytes never enter Python."""

    def pump(self, source, deliver, counter):
        sink = deliver.__self__   # _one_way passes sink.sendall
        read_end, write_end = os.pipe()
        moved_in_all = 0
        try:
            with contextlib.suppress(OSError):
                while moved := os.splice(source.fileno(), write_end, 65536):
                    moved_in_all += moved
                    while moved:
                        moved -= os.splice(read_end, sink.fileno(), moved)
        finally:
            os.close(read_end)
            os.close(write_end)
        self.count(counter, moved_in_all)


class OneThreadPassthroughProxy(PassthroughProxy):
    """One selector thread moves every byte of every connection, so no GIL
    hand-off happens between relays; but its sendall() blocks them all while
    one client does not read. A connection's handler only waits for its end."""

    def __init__(self, upstream_addr):
        super().__init__(upstream_addr)
        self._selector = selectors.DefaultSelector()
        self.spawn(self._move_every_byte)

    def handle(self, client):
        upstream = self.connect(self.upstream_addr)
        ended = threading.Event()
        self._selector.register(upstream, selectors.EVENT_READ, (client, ended))
        self._selector.register(client, selectors.EVENT_READ, (upstream, ended))
        while not (ended.wait(0.1) or self.closed):
            pass
        self.forget(upstream)

    def _move_every_byte(self):
        while not self.closed:
            for key, _ in self._selector.select(timeout=0.1):
                sink, ended = key.data
                data = recv(key.fileobj)
                with contextlib.suppress(OSError):
                    if data:
                        sink.sendall(data)
                        continue
                for sock in (key.fileobj, sink):   # either side's EOF ends the relay
                    with contextlib.suppress(KeyError):
                        self._selector.unregister(sock)
                    shutdown(sock)
                ended.set()
        self._selector.close()


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
        "upstream": Upstream, "lean-upstream": LeanUpstream, "distant-upstream": DistantUpstream,
        "passthrough": PassthroughProxy, "pinned-passthrough": PassthroughProxy,
        "uncounted-passthrough": UncountedPassthroughProxy, "splice-passthrough": SplicePassthroughProxy,
        "one-thread-passthrough": OneThreadPassthroughProxy, "notify-passthrough": NotifyIfWaitedPassthroughProxy,
        "nagle-passthrough": NaglePassthroughProxy, "framed": FramedProxy,
        "managed": managed.ManagedProxy,
    }
    server_class = classes[kind]
    if options.get("profile"):
        server_class = type("Profiled" + server_class.__name__, (ProfiledThreads, server_class), {})
    if kind != "lean-upstream":   # sockets_per_cpu 0: its threads wherever the OS puts them
        server_class = placement.placed(server_class, options.get("sockets_per_cpu", placement.OneCpuPerGroup.sockets_per_cpu))
    if kind == "upstream":
        delay = options.get("reply_delay")
        return server_class(pause=(lambda number: time.sleep(delay)) if delay else None)
    if kind == "lean-upstream":
        return server_class()
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


def usage_of_this_process():
    """CPU seconds (user, system) and context switches (a thread that blocked:
    voluntary; one the kernel took the core from: involuntary) of every thread
    of this process so far, dead ones included."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"user": usage.ru_utime, "system": usage.ru_stime,
            "voluntary": usage.ru_nvcsw, "involuntary": usage.ru_nivcsw}


def serve_in_child(kind, upstream_addr, options, pipe):
    """A child process's whole life: serve, report the address, answer
    ("wait", counter, n, timeout) messages until "stop", then send back what the process used."""
    raise_open_file_limit()
    if kind.startswith("pinned-"):   # every thread inherits the affinity of the one that starts it
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    server = build_server(kind, upstream_addr, options)
    threads = PeakThreads()
    at_start = resource.getrusage(resource.RUSAGE_SELF)   # the CPU of starting up is not the server's
    pipe.send(server.addr)
    with contextlib.suppress(EOFError):   # the parent died: stop all the same
        while (message := pipe.recv()) != "stop":
            if message == "usage":
                pipe.send(usage_of_this_process())
                continue
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
    pipe.send(report)   # first: closing 10,000 threads on a loaded machine takes a while
    server.close()


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

    def usage(self):
        """The server process's usage_of_this_process(), asked for through the pipe."""
        self.pipe.send("usage")
        if not self.pipe.poll(START_TIMEOUT):
            raise TimeoutError(f"{self.kind}: no answer to a usage request")
        return self.pipe.recv()

    def stop(self):
        if self.report is not None or not self.process.is_alive():
            return self.report
        self.pipe.send("stop")
        self.report = self.pipe.recv() if self.pipe.poll(STOP_TIMEOUT) else {}
        self.process.join(STOP_TIMEOUT)
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
    maxconn 6000
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

    def usage(self):
        """CPU seconds as ServiceProcess.usage() gives them, once every per-connection
        child has ended and been reaped; context switches are not counted (None)."""
        self._wait_for_children()
        user, system = self.cpu_seconds()
        return {"user": user, "system": system, "voluntary": None, "involuntary": None}

    def memory_and_threads(self):
        """(peak RSS in MB, threads now) of the tool's own process, from /proc."""
        with open(f"/proc/{self.process.pid}/status", encoding="ascii") as status:
            fields = dict(line.split(":", 1) for line in status)
        return int(fields["VmHWM"].split()[0]) / 1024, int(fields["Threads"])

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


def connect_clients(addr, count, failures=None):
    """count connected Clients; with a failures list, a connect that fails is
    noted there (the error's text) instead of raising."""
    clients = []
    for number in range(count):
        try:
            clients.append(Client(number, addr))
        except OSError as error:
            if failures is None:
                close_clients(clients)
                raise
            failures.append(str(error))
    return clients


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


def threaded_round_trips(addr, client_count, seconds):
    """The other load generator: a thread per client, each with a blocking socket
    doing request -> reply round trips for `seconds` (after one untimed warm-up
    round trip); the figures of all of them in one Round."""
    clients = connect_clients(addr, client_count)
    measured = Round()
    lock = threading.Lock()

    def run(client):
        reader = client.sock.makefile("rb")
        latencies, answered, wrong = [], 0, 0
        try:
            client.send_request()
            reader.readline()
            start.wait()
            while time.perf_counter() < deadline:
                client.send_request()
                reply = reader.readline()
                latencies.append(time.perf_counter() - client.sent_at)
                if reply == answer(client.request[:-1]):
                    answered += 1
                else:
                    wrong += 1
        except OSError:
            pass
        finally:
            reader.close()
            with lock:
                measured.latencies.extend(latencies)
                measured.answered += answered
                measured.wrong += wrong

    start = threading.Event()
    threads = [threading.Thread(target=run, args=(client,)) for client in clients]
    try:
        for thread in threads:
            thread.start()
        measured.started = time.perf_counter()
        deadline = measured.started + seconds
        start.set()
        for thread in threads:
            thread.join(seconds + REPLY_GRACE)
        measured.finished = time.perf_counter()
    finally:
        close_clients(clients)
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


def ratio(mine, theirs):
    return mine / theirs if theirs else math.nan


LOAD_GENERATORS = {"selector": throughput, "threads": threaded_round_trips}


class FutexCalls:
    """The futex() system calls a process makes while the block runs, counted by
    `perf stat` (a GIL hand-off that waits is one); .count stays None without perf."""

    def __init__(self, pid):
        self.pid, self.count, self.perf = pid, None, None

    def __enter__(self):
        self.perf = subprocess.Popen(["perf", "stat", "-x,", "-e", "syscalls:sys_enter_futex", "-p", str(self.pid)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(0.2)   # perf attaches to the process's threads
        return self

    def __exit__(self, *exc_info):
        self.perf.send_signal(signal.SIGINT)
        report = self.perf.communicate(timeout=START_TIMEOUT)[1]
        counts = [int(line.split(",")[0]) for line in report.splitlines() if line[:1].isdigit()]
        self.count = counts[0] if counts else None


def measured_with_usage(load, addr, client_count, seconds, processes, count_futexes=False):
    """One measurement with the load generator named by `load`; the Round, and
    for each process its CPU microseconds (user, system) and context switches
    per answered request while it ran (and the last process's futex calls)."""
    before = [process.usage() for process in processes]
    with FutexCalls(processes[-1].process.pid) if count_futexes else contextlib.nullcontext() as futexes:
        measured = LOAD_GENERATORS[load](addr, client_count, seconds)
    after = [process.usage() for process in processes]
    answered = max(measured.answered, 1)
    per_request = []
    for start, end in zip(before, after):
        user, system = end["user"] - start["user"], end["system"] - start["system"]
        switches = None if end["voluntary"] is None else (
            end["voluntary"] + end["involuntary"] - start["voluntary"] - start["involuntary"]) / answered
        per_request.append({"cpu_us": (user + system) / answered * 1e6, "user_us": user / answered * 1e6,
                            "system_us": system / answered * 1e6, "switches": switches})
    per_request[-1]["futexes"] = futexes.count / answered if futexes and futexes.count is not None else None
    return measured, per_request


def start_relays(upstream_addr, notes, stack):
    """Name -> a running server, for every relay the overhead section compares;
    each entered on stack, so whatever started is stopped if a later one fails."""
    relays = {"PassthroughProxy": stack.enter_context(ServiceProcess("passthrough", upstream_addr))}
    for cap in POOL_CAPS:
        relays[f"FramedProxy cap {cap}"] = stack.enter_context(
            ServiceProcess("framed", upstream_addr, pool_cap=cap))
    for tool in ExternalRelay.TOOLS:
        if shutil.which(tool):
            relays[tool] = stack.enter_context(ExternalRelay(tool, upstream_addr))
        else:
            notes.append(f"{tool}: skipped, not installed (`make bench-tools` installs socat and haproxy)")
    return relays


def compare_relays(relays, upstream, client_counts, repetitions, seconds, loads=lambda client_count: ["selector"],
                   count_futexes=False):
    """Every relay (and a direct connection) measured in turn, repetition by
    repetition; each row's ratios to direct and to socat come from the same
    repetition, and each relay in turn is measured first after direct."""
    samples = {}   # (relay, clients, load) -> one dict per repetition
    names = list(relays)
    for repetition in range(repetitions):
        for client_count in client_counts:
            for load in loads(client_count):
                progress(f"repetition {repetition + 1}/{repetitions}, {client_count} clients, {load} load")
                turn = repetition % len(names)
                for name in ["direct"] + names[turn:] + names[:turn]:
                    relay = relays.get(name)
                    processes = [upstream] + ([relay] if relay else [])
                    measured, usage = measured_with_usage(
                        load, relay.addr if relay else upstream.addr, client_count, seconds, processes,
                        count_futexes and isinstance(relay, ServiceProcess))
                    samples.setdefault((name, client_count, load), []).append({
                        "rate": measured.rate, "answered": measured.answered,
                        "p50_us": measured.percentile(0.50) * 1e6, "p99_us": measured.percentile(0.99) * 1e6,
                        "wrong": measured.wrong + measured.unanswered,
                        "upstream_cpu_us": usage[0]["cpu_us"],
                        "relay": usage[1] if relay else None})
    rows = []
    for (name, client_count, load), runs in samples.items():
        direct = samples[("direct", client_count, load)]
        socat = samples.get(("socat", client_count, load))
        relay_usage = [run["relay"] for run in runs if run["relay"]]
        switches = [usage["switches"] for usage in relay_usage if usage["switches"] is not None]
        futexes = [usage["futexes"] for usage in relay_usage if usage.get("futexes") is not None]
        rows.append({
            "relay": name, "clients": client_count, "load": load, "runs": runs,
            "rate": spread([run["rate"] for run in runs]),
            "x_direct": spread([ratio(run["rate"], other["rate"]) for run, other in zip(runs, direct)]),
            "x_socat": socat and spread([ratio(run["rate"], other["rate"]) for run, other in zip(runs, socat)]),
            "p50_us": statistics.median(run["p50_us"] for run in runs),
            "p99_us": statistics.median(run["p99_us"] for run in runs),
            "upstream_cpu_us": statistics.median(run["upstream_cpu_us"] for run in runs),
            "relay_cpu_us": relay_usage and statistics.median(usage["cpu_us"] for usage in relay_usage),
            "relay_user_us": relay_usage and statistics.median(usage["user_us"] for usage in relay_usage),
            "relay_system_us": relay_usage and statistics.median(usage["system_us"] for usage in relay_usage),
            "switches": switches and statistics.median(switches),
            "futexes": futexes and statistics.median(futexes),
            "wrong": sum(run["wrong"] for run in runs)})
    return rows


def overhead(repetitions, seconds, notes):
    """Round trips through each relay to the lean upstream, at 1, 8 and 64
    clients; the 8-client row also with a thread per client."""
    with contextlib.ExitStack() as stack:
        upstream = stack.enter_context(ServiceProcess("lean-upstream"))
        relays = start_relays(upstream.addr, notes, stack)
        rows = compare_relays(relays, upstream, CLIENT_COUNTS, repetitions, seconds,
                              loads=lambda count: ["selector", "threads"] if count == THREADED_CLIENTS else ["selector"])
    return {"rows": rows, "repetitions": repetitions, "seconds_each": seconds}


UNPINNED = {"sockets_per_cpu": 0}
ALTERNATIVES = (("PassthroughProxy as it is (one CPU)", "passthrough", {}),
                ("threads not pinned", "passthrough", UNPINNED),
                ("not pinned, no counting in the pumps", "uncounted-passthrough", UNPINNED),
                ("not pinned, count() without notify_all()", "notify-passthrough", UNPINNED),
                ("whole process pinned to one CPU", "pinned-passthrough", UNPINNED),
                ("os.splice() through a pipe", "splice-passthrough", UNPINNED),
                ("one selector thread for all bytes", "one-thread-passthrough", UNPINNED),
                ("one CPU, no counting in the pumps", "uncounted-passthrough", {}),
                ("one CPU, os.splice()", "splice-passthrough", {}),
                (f"FramedProxy cap {SCALE_POOL_CAP} as it is (one CPU)", "framed", {"pool_cap": SCALE_POOL_CAP}),
                (f"FramedProxy cap {SCALE_POOL_CAP}, threads not pinned", "framed",
                 {"pool_cap": SCALE_POOL_CAP, **UNPINNED}))


def alternatives(repetitions, seconds, client_counts, notes, count_futexes=False):
    """PassthroughProxy's mechanism against the alternatives to it, in one run
    (and FramedProxy cap 8 with and without its connection threads pinned):
    requests/s, CPU per request split into user and system time, and the
    context switches that are the GIL's hand-offs (and every blocking recv)."""
    with contextlib.ExitStack() as stack:
        upstream = stack.enter_context(ServiceProcess("lean-upstream"))
        relays = {label: stack.enter_context(ServiceProcess(kind, upstream.addr, **options))
                  for label, kind, options in ALTERNATIVES}
        if shutil.which("socat"):
            relays["socat"] = stack.enter_context(ExternalRelay("socat", upstream.addr))
        else:
            notes.append("socat: skipped, not installed (`make bench-tools`)")
        rows = compare_relays(relays, upstream, client_counts, repetitions, seconds, count_futexes=count_futexes)
    return {"rows": rows, "repetitions": repetitions, "seconds_each": seconds}


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
    with ServiceProcess("lean-upstream") as upstream:
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


def pipelining(repetitions, notes):
    """HEAD_OF_LINE_CLIENTS clients over one upstream connection, pipelined
    (ManagedProxy, Part two) or one request at a time (FramedProxy cap 1), with a
    pool of 8 for comparison; against a slow upstream (D of service per reply,
    which queues) and a distant one (D of latency per reply, which overlaps)."""
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
    return {"rows": rows, "reply_delay_ms": REPLY_DELAY * 1e3, "repetitions": repetitions}


def scale_row(label, relay, upstream, client_count, upstream_connections):
    """client_count clients connect at once to relay, then each sends one request,
    SCALE_ROUNDS times; the requests go out once the relay has accepted every
    client and the upstream has accepted upstream_connections(clients connected).
    One burst's p99 moves by half from run to run: the row gives the median of the
    bursts' p50s and of their p99s. A proxy process that does not report when stopped
    leaves its threads and RSS unknown (None)."""
    failures = []
    with relay:
        started = time.perf_counter()
        clients = connect_clients(relay.addr, client_count, failures)
        connected_seconds = time.perf_counter() - started
        try:
            if isinstance(relay, ServiceProcess):   # connect() returns once the kernel queued it
                relay.wait_for("connections", len(clients), timeout=SCALE_ACCEPT_TIMEOUT)
            upstream.wait_for("connections", upstream_connections(len(clients)), timeout=SCALE_ACCEPT_TIMEOUT)
            accepted_seconds = time.perf_counter() - started
            rounds = [exchange_rounds(clients, 1) for _ in range(SCALE_ROUNDS)]
            memory_and_threads = None if isinstance(relay, ServiceProcess) else relay.memory_and_threads()
        finally:
            close_clients(clients)
    if memory_and_threads:
        peak_rss_mb, peak_threads = memory_and_threads
    else:
        peak_rss_mb, peak_threads = relay.report.get("peak_rss_mb"), relay.report.get("peak_threads")
    return {"relay": label, "clients": client_count, "rounds": len(rounds),
            "answered": sum(measured.answered for measured in rounds),
            "wrong": sum(measured.wrong for measured in rounds),
            "lost": len(failures) + sum(measured.unanswered for measured in rounds),
            "connected_ms": connected_seconds * 1e3, "accepted_ms": accepted_seconds * 1e3,
            "p50_ms": statistics.median(measured.percentile(0.50) for measured in rounds) * 1e3,
            "p99_ms": statistics.median(measured.percentile(0.99) for measured in rounds) * 1e3,
            "peak_threads": peak_threads, "peak_rss_mb": peak_rss_mb, "failures": failures[:3]}


def scale(client_counts, notes):
    """Many clients connected at once, one request each, through PassthroughProxy
    (two threads a client), FramedProxy cap 8 (one thread a client, 8 upstream
    connections), each also with its threads not pinned to one CPU, and HAProxy
    when installed; a row that cannot finish says why."""
    def one_each(clients):   # a relay that opens an upstream connection per client, at once
        return clients

    def none_yet(clients):   # the pool opens its connections when the first requests come
        return 0

    relays = [("PassthroughProxy", lambda addr: ServiceProcess("passthrough", addr), one_each),
              ("PassthroughProxy, not pinned",
               lambda addr: ServiceProcess("passthrough", addr, **UNPINNED), one_each),
              (f"FramedProxy cap {SCALE_POOL_CAP}",
               lambda addr: ServiceProcess("framed", addr, pool_cap=SCALE_POOL_CAP), none_yet),
              (f"FramedProxy cap {SCALE_POOL_CAP}, not pinned",
               lambda addr: ServiceProcess("framed", addr, pool_cap=SCALE_POOL_CAP, **UNPINNED), none_yet)]
    if shutil.which("haproxy"):
        relays.append(("haproxy", lambda addr: ExternalRelay("haproxy", addr), one_each))
    else:
        notes.append("haproxy: skipped, not installed (`make bench-tools` installs socat and haproxy)")
    rows = []
    for client_count in client_counts:
        for label, start, upstream_connections in relays:
            progress(f"scale: {client_count} clients through {label}")
            try:
                with ServiceProcess("lean-upstream") as upstream:
                    rows.append(scale_row(label, start(upstream.addr), upstream, client_count,
                                          upstream_connections))
                if rows[-1]["peak_rss_mb"] is None:
                    notes.append(f"scale, {label}, {client_count} clients: its process did not report "
                                 f"within {STOP_TIMEOUT:.0f} s of being stopped: threads and RSS unknown")
            except (OSError, RuntimeError, TimeoutError) as error:
                notes.append(f"scale, {label}, {client_count} clients: could not finish: {one_line(error)}")
    return {"rows": rows}


def profile(seconds):
    """Where a proxy's CPU time goes: every thread profiled, merged, the top
    functions by their own time."""
    reports = {}
    with ServiceProcess("lean-upstream") as upstream:
        for label, kind, client_count, options in (("PassthroughProxy", "passthrough", 8, {}),
                                                   ("FramedProxy cap 8", "framed", 8, {"pool_cap": 8})):
            with ServiceProcess(kind, upstream.addr, profile=True, **options) as proxy:
                measured = throughput(proxy.addr, client_count, seconds)
            reports[label] = {"requests": measured.answered, "clients": client_count,
                              "cpu_seconds": proxy.report["cpu_seconds"], "profile": proxy.report["profile"]}
    return reports


# --- the targets set for the bench ----------------------------------------------------

def targets(results):
    """Each target with the figure measured and whether it was reached, for the
    sections that finished."""
    found = []
    rows = {(row["relay"], row["clients"], row["load"]): row
            for row in (results.get("overhead") or {}).get("rows", [])}
    comparisons = [("PassthroughProxy", "socat", client_count, "selector", 0.9) for client_count in CLIENT_COUNTS]
    comparisons.append(("PassthroughProxy", "socat", THREADED_CLIENTS, "threads", 0.9))
    comparisons += [(f"FramedProxy cap {SCALE_POOL_CAP}", "PassthroughProxy", THREADED_CLIENTS, load, 0.75)
                    for load in ("selector", "threads")]
    for name, other, client_count, load, least in comparisons:
        if (name, client_count, load) not in rows or (other, client_count, load) not in rows:
            continue   # socat may be absent
        mine, theirs = rows[(name, client_count, load)]["runs"], rows[(other, client_count, load)]["runs"]
        figures = spread([ratio(a["rate"], b["rate"]) for a, b in zip(mine, theirs)])
        found.append((f"{name} >= {least}x {other}, {client_count} client(s), {load} load",
                      f"{figures['median']:.2f}x ({low_high(figures, '{:.2f}')})", figures["median"] >= least))
    for row in (results.get("head_of_line") or {}).get("rows", []):
        found.append((f"head-of-line cap {row['pool_cap']} within max(3 ms, 10%) of "
                      f"{row['predicted_ms']:.0f} ms", f"{row['wall_ms']['median']:.1f} ms",
                      row["within_target"]))
    scale_rows = {(row["relay"], row["clients"]): row for row in (results.get("scale") or {}).get("rows", [])}
    for (relay, client_count), row in scale_rows.items():
        unpinned = scale_rows.get((f"{relay}, not pinned", client_count))
        if unpinned and client_count == 1000:
            found.append((f"{client_count} clients through {relay}: p99 no worse than not pinned",
                          f"{row['p99_ms']:.0f} ms against {unpinned['p99_ms']:.0f}",
                          row["p99_ms"] <= unpinned["p99_ms"]))
    for row in scale_rows.values():
        if row["relay"] == "haproxy":
            continue
        found.append((f"{row['clients']} clients through {row['relay']}: 0 wrong, 0 lost",
                      f"{row['wrong']} wrong, {row['lost']} lost", row["wrong"] + row["lost"] == 0))
        if row["relay"] == f"FramedProxy cap {SCALE_POOL_CAP}" and row["clients"] == 1000 \
                and row["peak_rss_mb"] is not None:
            found.append((f"{row['clients']} clients through {row['relay']}, peak RSS < 64 MB",
                          f"{row['peak_rss_mb']:.1f} MB", row["peak_rss_mb"] < 64))
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


def one_line(error):
    """An exception as one line: its type and the first line of its message."""
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"


def ratio_cell(figures):
    return f"{figures['median']:.2f} ({low_high(figures, '{:.2f}')})" if figures else "-"


def cpu_cell(value):
    return f"{value:.0f}" if value else "-"


def render_comparison(title, section, left_columns=3):
    return table(
        title,
        ["relay", "clients", "load", "req/s", "x direct", "x socat (range)", "p50 us", "p99 us",
         "relay CPU us/req", "user", "system", "switches/req", "futex/req", "upstream CPU us/req", "wrong"],
        [[row["relay"], row["clients"], row["load"], f"{row['rate']['median']:.0f}",
          f"{row['x_direct']['median']:.2f}", ratio_cell(row["x_socat"]),
          f"{row['p50_us']:.0f}", f"{row['p99_us']:.0f}", cpu_cell(row["relay_cpu_us"]),
          cpu_cell(row["relay_user_us"]), cpu_cell(row["relay_system_us"]),
          f"{row['switches']:.1f}" if row["switches"] else "-",
          f"{row['futexes']:.2f}" if row.get("futexes") else "-", f"{row['upstream_cpu_us']:.0f}", row["wrong"]]
         for row in sorted(section["rows"], key=lambda row: (row["clients"], row["load"] != "selector"))],
        left_columns)


def render_overhead(section):
    return render_comparison(
        f"Overhead: round trips through each relay to the lean upstream, median of {section['repetitions']} "
        f"repetitions of {section['seconds_each']} s; ratios from the same repetition; CPU per request "
        f"of the relay's process (and of the upstream's)", section)


def render_alternatives(section):
    return render_comparison(
        f"Alternatives: PassthroughProxy's mechanism against others, median of {section['repetitions']} "
        f"repetitions of {section['seconds_each']} s; switches: the relay's context switches per request", section)


def render_nagle(section):
    return table(
        "Nagle: a request written in two parts 2 ms apart, through the relay",
        ["relay", "requests", "median ms", "range ms"],
        [[row["relay"], row["requests"], f"{row['median_ms']:.1f}",
          f"{row['low_ms']:.1f}-{row['high_ms']:.1f}"] for row in section["rows"]])


def render_head_of_line(section):
    return table(
        f"Head-of-line: {HEAD_OF_LINE_CLIENTS} clients at once, upstream delays each reply "
        f"{section['reply_delay_ms']:.0f} ms, median of {section['repetitions']} bursts",
        ["pool cap C", "predicted ceil(N/C)*D ms", "measured ms", "range ms", "excess ms", "within target",
         "wrong"],
        [[row["pool_cap"], f"{row['predicted_ms']:.0f}", f"{row['wall_ms']['median']:.1f}",
          low_high(row["wall_ms"], "{:.1f}"), f"{row['excess_ms']:+.1f}",
          "yes" if row["within_target"] else "no", row["wrong"]] for row in section["rows"]])


def render_pipelining(section):
    return table(
        f"Pipelining vs pooling (Part two's ManagedProxy): {HEAD_OF_LINE_CLIENTS} clients at once; a slow "
        f"upstream spends {section['reply_delay_ms']:.0f} ms on each reply in turn, a distant one answers each "
        f"{section['reply_delay_ms']:.0f} ms after it arrived; median of {section['repetitions']} bursts",
        ["upstream", "relay", "wall ms", "range ms", "p50 ms", "wrong"],
        [[row["upstream"], row["relay"], f"{row['wall_ms']['median']:.1f}", low_high(row["wall_ms"], "{:.1f}"),
          f"{row['p50_ms']:.1f}", row["wrong"]] for row in section["rows"]], left_columns=2)


def render_scale(section):
    return table(
        "Scale: the clients connect at once (connected: every connect() returned; accepted: the proxy "
        f"accepted all), then each sends one request, {SCALE_ROUNDS} times; p50, p99: the median of the "
        "bursts'; lost: a connect that failed or a request unanswered",
        ["relay", "clients", "answered", "wrong", "lost", "connected ms", "accepted ms", "p50 ms",
         "p99 ms", "peak threads", "peak RSS MB"],
        [[row["relay"], row["clients"], row["answered"], row["wrong"], row["lost"], f"{row['connected_ms']:.0f}",
          f"{row['accepted_ms']:.0f}", f"{row['p50_ms']:.1f}", f"{row['p99_ms']:.1f}",
          row["peak_threads"] or "-", "-" if row["peak_rss_mb"] is None else f"{row['peak_rss_mb']:.1f}"]
         for row in section["rows"]])


def render_profile(section):
    return "\n".join(f"Profile of {label}: {report['requests']} requests from {report['clients']} clients, "
                     f"{report['cpu_seconds']:.2f} s of process CPU, every thread profiled "
                     f"(profiling slows it)\n{report['profile']}" for label, report in section.items())


def render_targets(results):
    return table("The targets set for the bench", ["target", "measured", "reached"],
                 [[name, figure, "yes" if reached else "NO"] for name, figure, reached in targets(results)])


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="3 short repetitions, and 1,000 clients only: under a minute on a busy machine")
    parser.add_argument("--json", metavar="FILE", help="write every raw figure to FILE")
    parser.add_argument("--profile", action="store_true",
                        help="also profile PassthroughProxy and FramedProxy under load (cProfile, every thread)")
    parser.add_argument("--perf", action="store_true",
                        help="alternatives: count each Python relay's futex() calls with `perf stat` (Linux, root)")
    parser.add_argument("--only", metavar="SECTIONS",
                        help="comma-separated sections to run (default all): " + ", ".join(SECTION_NAMES))
    parser.add_argument("--repetitions", type=int, help="repetitions per comparison (default 5, quick 3)")
    parser.add_argument("--seconds", type=float, help="seconds per comparison measurement (default 1, quick 0.1)")
    return parser.parse_args(argv)


SECTION_NAMES = ("overhead", "alternatives", "nagle", "head_of_line", "scale", "pipelining")


def sections(arguments, notes):
    """(name, how to measure it, how to render it) for every section asked for."""
    repetitions = arguments.repetitions or (3 if arguments.quick else 5)
    seconds = arguments.seconds or (0.1 if arguments.quick else 1.0)
    chosen = arguments.only.split(",") if arguments.only else list(SECTION_NAMES)
    every = {
        "overhead": (lambda: overhead(repetitions, seconds, notes), render_overhead),
        "alternatives": (lambda: alternatives(repetitions, seconds, ALTERNATIVE_CLIENTS, notes,
                                              count_futexes=arguments.perf), render_alternatives),
        "nagle": (lambda: nagle(count=5 if arguments.quick else 20), render_nagle),
        "head_of_line": (lambda: head_of_line(repetitions), render_head_of_line),
        "scale": (lambda: scale(SCALE_CLIENTS[:1] if arguments.quick else SCALE_CLIENTS, notes), render_scale),
        "pipelining": (lambda: pipelining(repetitions, notes), render_pipelining),
    }
    if arguments.profile:
        chosen.append("profile")
        every["profile"] = (lambda: profile(seconds=2 * seconds), render_profile)
    return [(name, *every[name]) for name in chosen]


def main(argv=None):
    arguments = parse_arguments(argv)
    raise_open_file_limit()
    started = time.perf_counter()
    results = {"cores": os.cpu_count(), "python": platform.python_version(),
               "load_average": os.getloadavg()[0],   # other work on the machine skews every figure
               "command": " ".join(["python3", "-m", "bench", *(argv if argv is not None else sys.argv[1:])]),
               "failed": {}}
    print(f"bench.py on {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"{platform.system()} {platform.release()}, load average {results['load_average']:.1f} "
          f"at the start; one run of: {results['command']}\n", flush=True)
    chosen = sections(arguments, notes := [])
    for number, (name, measure, render) in enumerate(chosen, 1):
        progress(f"section {number}/{len(chosen)}: {name}")
        noted = len(notes)
        try:
            results[name] = measure()
            text = render(results[name])
        except Exception as error:   # one section's failure must not lose the others
            results["failed"][name] = one_line(error)
            text = f"{name}: could not finish: {one_line(error)}\n"
        print(f"{number}. {text}" + "".join(note + "\n" for note in notes[noted:]), flush=True)
    progress(f"{time.perf_counter() - started:.0f} s in all")
    results["targets"] = [{"target": name, "measured": figure, "reached": reached}
                          for name, figure, reached in targets(results)]
    print(render_targets(results), flush=True)
    if arguments.json:
        with open(arguments.json, "w", encoding="utf-8") as out:
            json.dump(results, out, indent=1, default=str)


if __name__ == "__main__":
    main()
