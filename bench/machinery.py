"""bench.machinery: what every section of the bench is built from. A reader of
the lesson need not read it; a reader of the bench reads the section modules
(bench/cited.py, bench/mechanisms.py, bench/redis_peers.py) and comes here for
how a figure was taken.

    LeanUpstream, DistantUpstream
                       the line servers behind the relays: answer() and nothing
                       else per request; one whose delays overlap (a far upstream)
    ProfiledThreads    per-thread cProfile, for --profile (bench/redis_peers.py)
    build_server()     the server a child process runs: a kind named here, or a
                       server class of a section module (constructed with the
                       upstream's address), with its connections' threads placed
                       on CPUs by bench/placement.py (unless sockets_per_cpu=0)
    ServiceProcess     one server in a process of its own, so the load generator
                       never shares its GIL; it waits on the server's hooks and
                       reports its CPU and context switches on request, and on stop
                       its peak threads, peak RSS and CPU time
    ExternalRelay      socat or HAProxy (TCP mode) as a subprocess, when installed
                       (`make bench-tools`); its CPU time read from /proc
    Client, exchange_rounds(), throughput()
                       the load generator: one thread and one selector for any
                       number of clients; every reply is checked against answer()
    measured_with_usage(), compare_relays()
                       relays measured in turn within each repetition, ratios to
                       direct and to socat from the same repetition
    table(), render_comparison()
                       the text tables

Every loop is bounded in count and in time; every socket is on 127.0.0.1 with
a port from the OS; every server socket has TCP_NODELAY (tcp_proxy's
Server.track() sets it), and the load generator's sockets set it too.
"""
import contextlib
import cProfile
import io
import math
import multiprocessing
import os
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

from ground.frames import MAX_LINE, LineTooLong
from ground.server import recv, Server
from ground.workers import Workers
from tcp_proxy import answer, FramedProxy, PassthroughProxy, read_lines, Upstream

from bench import placement
from part2 import managed
from part3.framed import SessionProxy
from scaffolding.kit import free_port   # for tools that cannot report the port they took

MOST_CLIENTS = 5000                # the most clients any section connects at once (scale)
START_TIMEOUT = 10.0               # seconds a server process may take to listen
STOP_TIMEOUT = 60.0                # seconds it may take to report and close (10,000 threads)
REPLY_GRACE = 10.0                 # seconds past its deadline a round may wait for replies
PROCESSES = multiprocessing.get_context("spawn")   # a clean child: its RSS is its own


def progress(message):
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def raise_open_file_limit():
    """1,000 clients need more descriptors than a default soft limit of 1,024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 3 * MOST_CLIENTS + 64
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


KINDS = {"upstream": Upstream, "lean-upstream": LeanUpstream, "distant-upstream": DistantUpstream,
         "passthrough": PassthroughProxy, "pinned-passthrough": PassthroughProxy,
         "framed": FramedProxy, "sessions": SessionProxy, "managed": managed.ManagedProxy}


def kind_name(kind):
    """A kind as a row or an error names it: its string, or its class's name."""
    return kind if isinstance(kind, str) else kind.__name__


def build_server(kind, upstream_addr, options):
    """The server a child process runs. kind: a key of KINDS, or a server class
    that takes the upstream's address (a section's variant of PassthroughProxy;
    it reaches the child by reference, so it must live at a module's top level).
    options: pool_cap (framed, sessions), connections (managed), framing (framed, sessions,
    managed),
    reply_delay (upstreams), workers (passthrough), sockets_per_cpu (placement; 0 places
    nothing), profile."""
    server_class = KINDS[kind] if isinstance(kind, str) else kind
    if options.get("profile"):
        server_class = type("Profiled" + server_class.__name__, (ProfiledThreads, server_class), {})
    if kind not in ("lean-upstream", "managed"):   # theirs (the loop: one thread) run unplaced
        sockets_per_cpu = options.get("sockets_per_cpu", placement.OneCpuPerGroup.sockets_per_cpu)
        server_class = placement.placed(server_class, sockets_per_cpu)
    framing = {"framing": options["framing"]} if options.get("framing") else {}
    if kind == "upstream":
        delay = options.get("reply_delay")
        return server_class(pause=(lambda number: time.sleep(delay)) if delay else None)
    if kind == "lean-upstream":
        return server_class()
    if kind == "distant-upstream":
        return server_class(options["reply_delay"])
    if kind in ("framed", "sessions"):
        return server_class(upstream_addr, pool_cap=options["pool_cap"], **framing)
    if kind == "managed":
        return server_class([(upstream_addr, options["connections"])],
                            pending_calls_max=options.get("pending_calls_max"), **framing)
    if kind == "passthrough" and options.get("workers", 1) > 1:   # a process per core
        forked = type("Forked" + server_class.__name__, (Workers, server_class), {})
        return forked(upstream_addr, workers=options["workers"])
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


def usage_of_this_process(server=None):
    """CPU seconds (user, system) and context switches (a thread that blocked:
    voluntary; one the kernel took the core from: involuntary) of every thread
    of this process so far, dead ones included, and of the server's other worker
    processes (ground.workers.Workers), which run until it closes, so no rusage of
    children counts them: read from /proc."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    found = {"user": usage.ru_utime, "system": usage.ru_stime,
             "voluntary": usage.ru_nvcsw, "involuntary": usage.ru_nivcsw}
    for pid in getattr(server, "_worker_pids", ()):   # ground.workers.Workers' own list
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()   # from field 3 on
            with open(f"/proc/{pid}/status", encoding="ascii") as status:
                lines = dict(line.split(":", 1) for line in status)
            ticks = os.sysconf("SC_CLK_TCK")
            found["user"] += int(fields[11]) / ticks   # field 14, utime
            found["system"] += int(fields[12]) / ticks   # field 15, stime
            found["voluntary"] += int(lines["voluntary_ctxt_switches"])
            found["involuntary"] += int(lines["nonvoluntary_ctxt_switches"])
    return found


def serve_in_child(kind, upstream_addr, options, pipe):
    """A child process's whole life: serve, report the address, answer
    ("wait", counter, n, timeout) messages until "stop", then send back what the process used."""
    raise_open_file_limit()
    # every thread inherits the affinity of the one that starts it
    if kind == "pinned-passthrough":
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    server = build_server(kind, upstream_addr, options)
    threads = PeakThreads()
    at_start = usage_of_this_process(server)   # the CPU of starting up is not the server's
    pipe.send(server.addr)
    with contextlib.suppress(EOFError):   # the parent died: stop all the same
        while (message := pipe.recv()) != "stop":
            if message == "usage":
                pipe.send(usage_of_this_process(server))
                continue
            _, counter, level, timeout = message
            try:
                getattr(server, f"wait_{counter}")(level, timeout=timeout)
                threads.sample()   # the moment the parent waited for may be a brief peak
                pipe.send(None)
            except TimeoutError as error:
                pipe.send(str(error))
    peak_threads = threads.stop()
    usage = usage_of_this_process(server)
    user, system = usage["user"] - at_start["user"], usage["system"] - at_start["system"]
    report = {
        "peak_threads": peak_threads,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,   # in kB
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
    """A server of build_server()'s kinds, in a process of its own, listening at .addr."""

    def __init__(self, kind, upstream_addr=None, **options):
        self.kind = kind_name(kind)
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
            raise RuntimeError(f"{self.kind} did not start within {START_TIMEOUT} s") from None

    def wait_for(self, counter, level, timeout=START_TIMEOUT):
        """Block until the server's hook counter reaches level (see ground.server's Hooks)."""
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


def tool_path(tool):
    """Where an installed tool is, or None; sbin too, where Debian puts haproxy and
    nutcracker and a user's PATH may not look."""
    return shutil.which(tool) or shutil.which(tool, path="/usr/local/sbin:/usr/sbin:/sbin")


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


# twemproxy (nutcracker): one pool, Redis protocol, one connection to the one server, made
# at the start, never ejected (the bench's server does not fail; a failure should show).
NUTCRACKER_CONFIG = """\
bench:
  listen: 127.0.0.1:{port}
  redis: true
  hash: fnv1a_64
  distribution: ketama
  server_connections: 1
  preconnect: true
  auto_eject_hosts: false
  servers:
   - 127.0.0.1:{upstream_port}:1
"""


class ExternalRelay(Running):
    """socat or HAProxy relaying TCP to the upstream, or twemproxy (nutcracker)
    proxying Redis: what a user would run instead. A config file, where the tool
    takes one, lives in a temporary directory that stop() removes."""
    TOOLS = ("socat", "haproxy")   # the layer-4 relays the line sections compare

    def __init__(self, tool, upstream_addr):
        port, upstream_port = free_port(), upstream_addr[1]
        self.cpu_at_start = None
        self.directory = None
        if tool == "socat":   # fork: a process per connection; nodelay on both sides
            argv = ["socat",
                    f"TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr,nodelay,backlog=1024",
                    f"TCP:127.0.0.1:{upstream_port},nodelay"]
        elif tool == "haproxy":
            config = self.write_config(
                "haproxy.cfg", HAPROXY_CONFIG.format(port=port, upstream_port=upstream_port))
            argv = ["haproxy", "-db", "-f", config]
        elif tool == "nutcracker":   # in the foreground unless -d; its stats on a port of its own
            config = self.write_config(
                "nutcracker.yml", NUTCRACKER_CONFIG.format(port=port, upstream_port=upstream_port))
            argv = ["nutcracker", "-c", config, "-s", str(free_port()), "-a", "127.0.0.1",
                    "-o", os.path.join(self.directory.name, "nutcracker.log")]
        else:
            raise ValueError(f"no such relay: {tool!r}")
        argv[0] = tool_path(tool) or tool
        self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addr = ("127.0.0.1", port)
        self._wait_until_listening()
        self.cpu_at_start = self.cpu_seconds()

    def write_config(self, name, text):
        """Write a config file into this relay's temporary directory; its path."""
        self.directory = tempfile.TemporaryDirectory(prefix="bench-relay-")
        path = os.path.join(self.directory.name, name)
        with open(path, "w", encoding="ascii") as config:
            config.write(text)
        return path

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
        # fields 14-17
        user, system, children_user, children_system = (int(ticks) / os.sysconf("SC_CLK_TCK")
                                                         for ticks in fields[11:15])
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
        if self.directory:
            self.directory.cleanup()
            self.directory = None
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


def throughput(addr, client_count, seconds):
    """Connect, warm every connection with one round trip, then measure."""
    clients = connect_clients(addr, client_count)
    try:
        exchange_rounds(clients, 1)
        return exchange_rounds(clients, requests_each=10**9, seconds=seconds)
    finally:
        close_clients(clients)


# --- measuring relays side by side -----------------------------------------------

def spread(values):
    return {"median": statistics.median(values), "low": min(values), "high": max(values)}


def ratio(mine, theirs):
    return mine / theirs if theirs else math.nan


class FutexCalls:
    """The futex() system calls a process makes while the block runs, counted by
    `perf stat` (a GIL hand-off that waits is one); .count stays None without perf."""

    def __init__(self, pid):
        self.pid, self.count, self.perf = pid, None, None

    def __enter__(self):
        self.perf = subprocess.Popen(["perf", "stat", "-x,", "-e", "syscalls:sys_enter_futex",
                                      "-p", str(self.pid)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(0.2)   # perf attaches to the process's threads
        return self

    def __exit__(self, *exc_info):
        self.perf.send_signal(signal.SIGINT)
        report = self.perf.communicate(timeout=START_TIMEOUT)[1]
        counts = [int(line.split(",")[0]) for line in report.splitlines() if line[:1].isdigit()]
        self.count = counts[0] if counts else None


def measured_with_usage(addr, client_count, seconds, processes, count_futexes=False):
    """One measurement of throughput(); the Round, and
    for each process its CPU microseconds (user, system) and context switches
    per answered request while it ran (and the last process's futex calls)."""
    before = [process.usage() for process in processes]
    with (FutexCalls(processes[-1].process.pid) if count_futexes
          else contextlib.nullcontext()) as futexes:
        measured = throughput(addr, client_count, seconds)
    after = [process.usage() for process in processes]
    answered = max(measured.answered, 1)
    per_request = []
    for start, end in zip(before, after):
        user, system = end["user"] - start["user"], end["system"] - start["system"]
        switches = None if end["voluntary"] is None else (
            end["voluntary"] + end["involuntary"]
            - start["voluntary"] - start["involuntary"]) / answered
        per_request.append({"cpu_us": (user + system) / answered * 1e6,
                            "user_us": user / answered * 1e6,
                            "system_us": system / answered * 1e6, "switches": switches})
    per_request[-1]["futexes"] = (futexes.count / answered
                                  if futexes and futexes.count is not None else None)
    return measured, per_request



def compare_relays(relays, upstream, client_counts, repetitions, seconds, count_futexes=False):
    """Every relay (and a direct connection) measured in turn, repetition by
    repetition; each row's ratios to direct and to socat come from the same
    repetition, and each relay in turn is measured first after direct."""
    samples = {}   # (relay, clients) -> one dict per repetition
    names = list(relays)
    for repetition in range(repetitions):
        for client_count in client_counts:
            progress(f"repetition {repetition + 1}/{repetitions}, {client_count} clients")
            turn = repetition % len(names)
            for name in ["direct"] + names[turn:] + names[:turn]:
                relay = relays.get(name)
                processes = [upstream] + ([relay] if relay else [])
                measured, usage = measured_with_usage(
                    relay.addr if relay else upstream.addr, client_count, seconds, processes,
                    count_futexes and isinstance(relay, ServiceProcess))
                samples.setdefault((name, client_count), []).append({
                    "rate": measured.rate, "answered": measured.answered,
                    "p50_us": measured.percentile(0.50) * 1e6,
                    "p99_us": measured.percentile(0.99) * 1e6,
                    "wrong": measured.wrong + measured.unanswered,
                    "upstream_cpu_us": usage[0]["cpu_us"],
                    "relay": usage[1] if relay else None})
    rows = []
    for (name, client_count), runs in samples.items():
        direct = samples[("direct", client_count)]
        socat = samples.get(("socat", client_count))
        relay_usage = [run["relay"] for run in runs if run["relay"]]
        switches = [usage["switches"] for usage in relay_usage if usage["switches"] is not None]
        futexes = [usage["futexes"] for usage in relay_usage if usage.get("futexes") is not None]
        rows.append({
            "relay": name, "clients": client_count, "runs": runs,
            "rate": spread([run["rate"] for run in runs]),
            "x_direct": spread([ratio(run["rate"], other["rate"])
                                for run, other in zip(runs, direct)]),
            "x_socat": socat and spread([ratio(run["rate"], other["rate"])
                                         for run, other in zip(runs, socat)]),
            "p50_us": statistics.median(run["p50_us"] for run in runs),
            "p99_us": statistics.median(run["p99_us"] for run in runs),
            "upstream_cpu_us": statistics.median(run["upstream_cpu_us"] for run in runs),
            "relay_cpu_us": relay_usage and statistics.median(usage["cpu_us"]
                                                              for usage in relay_usage),
            "relay_user_us": relay_usage and statistics.median(usage["user_us"]
                                                               for usage in relay_usage),
            "relay_system_us": relay_usage and statistics.median(usage["system_us"]
                                                                 for usage in relay_usage),
            "switches": switches and statistics.median(switches),
            "futexes": futexes and statistics.median(futexes),
            "wrong": sum(run["wrong"] for run in runs)})
    return rows



# --- output -----------------------------------------------------------------------

def table(title, columns, rows, left_columns=1):
    """A fixed-width text table: names (the first left_columns) to the left, figures to the
    right."""
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


def render_comparison(title, section, left_columns=2):
    return table(
        title,
        ["relay", "clients", "req/s", "x direct", "x socat (range)", "p50 us", "p99 us",
         "relay CPU us/req", "user", "system", "switches/req", "futex/req", "upstream CPU us/req",
         "wrong"],
        [[row["relay"], row["clients"], f"{row['rate']['median']:.0f}",
          f"{row['x_direct']['median']:.2f}", ratio_cell(row["x_socat"]),
          f"{row['p50_us']:.0f}", f"{row['p99_us']:.0f}", cpu_cell(row["relay_cpu_us"]),
          cpu_cell(row["relay_user_us"]), cpu_cell(row["relay_system_us"]),
          f"{row['switches']:.1f}" if row["switches"] else "-",
          f"{row['futexes']:.2f}" if row.get("futexes") else "-",
          f"{row['upstream_cpu_us']:.0f}", row["wrong"]]
         for row in sorted(section["rows"], key=lambda row: row["clients"])],
        left_columns)

