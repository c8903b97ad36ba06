"""bench.mechanisms: the mechanism study behind BENCH.md's "Which mechanism costs
what" and "Where a thread per client stops"; a reader of the cited figures
(bench/cited.py) need not read it.

    Uncounted..., SplicePassthroughProxy, OneThreadPassthroughProxy
                   the alternatives to PassthroughProxy's mechanism, each a change
                   to its pump or its threads
    alternatives   each alternative, PassthroughProxy with its threads placed on one
                   CPU per group (bench/placement.py) and not, its whole process on
                   one CPU, FramedProxy cap 8 placed and not, and socat: requests/s,
                   CPU per request in user and system time, context switches and
                   (--perf) futex() calls per request
    scale          1,000 and 5,000 clients connected at once, one request each,
                   through PassthroughProxy and FramedProxy cap 8 (placed and not)
                   and HAProxy: connect and accept times, p50 and p99, peak threads
                   and peak RSS
"""
import contextlib
import os
import selectors
import statistics
import threading
import time

from ground.server import recv, shutdown
from tcp_proxy import PassthroughProxy

from bench.machinery import (STOP_TIMEOUT, ExternalRelay, ServiceProcess, close_clients,
                             compare_relays, connect_clients, exchange_rounds, one_line, progress,
                             render_comparison, table, tool_path)

ALTERNATIVE_CLIENTS = (8, 64)      # alternatives: clients at once
SCALE_CLIENTS = (1000, 5000)       # scale: clients at once (--quick: the first only)
SCALE_POOL_CAP = 8
SCALE_ROUNDS = 3                   # scale: bursts of one request per client; the median p50 and p99
SCALE_ACCEPT_TIMEOUT = 60.0        # seconds the proxy may take to accept every client


# The alternatives to PassthroughProxy's mechanism, measured side by side by the
# alternatives section; scaffolding for the bench, none of them is the lesson.

class UncountedPassthroughProxy(PassthroughProxy):
    """No counting at all in the pumps (its hooks no longer work): the floor
    that counting can be brought down to."""

    def count(self, name, amount=1):
        if name not in ("forwarded", "returned"):
            super().count(name, amount)


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



# --- the sections --------------------------------------------------------------------------

UNPINNED = {"sockets_per_cpu": 0}
ALTERNATIVES = (("PassthroughProxy as it is (one CPU)", "passthrough", {}),
                ("threads not pinned", "passthrough", UNPINNED),
                ("not pinned, no counting in the pumps", UncountedPassthroughProxy, UNPINNED),
                ("whole process pinned to one CPU", "pinned-passthrough", UNPINNED),
                ("os.splice() through a pipe", SplicePassthroughProxy, UNPINNED),
                ("one selector thread for all bytes", OneThreadPassthroughProxy, UNPINNED),
                ("one CPU, no counting in the pumps", UncountedPassthroughProxy, {}),
                ("one CPU, os.splice()", SplicePassthroughProxy, {}),
                (f"FramedProxy cap {SCALE_POOL_CAP} as it is (one CPU)", "framed",
                 {"pool_cap": SCALE_POOL_CAP}),
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
        if tool_path("socat"):
            relays["socat"] = stack.enter_context(ExternalRelay("socat", upstream.addr))
        else:
            notes.append("socat: skipped, not installed (`make bench-tools`)")
        rows = compare_relays(relays, upstream, client_counts, repetitions, seconds,
                              count_futexes=count_futexes)
    return {"rows": rows, "repetitions": repetitions, "seconds_each": seconds}



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
            upstream.wait_for("connections", upstream_connections(len(clients)),
                              timeout=SCALE_ACCEPT_TIMEOUT)
            accepted_seconds = time.perf_counter() - started
            rounds = [exchange_rounds(clients, 1) for _ in range(SCALE_ROUNDS)]
            memory_and_threads = (None if isinstance(relay, ServiceProcess)
                                  else relay.memory_and_threads())
        finally:
            close_clients(clients)
    if memory_and_threads:
        peak_rss_mb, peak_threads = memory_and_threads
    else:
        peak_rss_mb, peak_threads = (relay.report.get("peak_rss_mb"),
                                     relay.report.get("peak_threads"))
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
               lambda addr: ServiceProcess("framed", addr, pool_cap=SCALE_POOL_CAP, **UNPINNED),
               none_yet)]
    if tool_path("haproxy"):
        relays.append(("haproxy", lambda addr: ExternalRelay("haproxy", addr), one_each))
    else:
        notes.append("haproxy: skipped, not installed "
                     "(`make bench-tools` installs socat and haproxy)")
    rows = []
    for client_count in client_counts:
        for label, start, upstream_connections in relays:
            progress(f"scale: {client_count} clients through {label}")
            try:
                with ServiceProcess("lean-upstream") as upstream:
                    rows.append(scale_row(label, start(upstream.addr), upstream, client_count,
                                          upstream_connections))
                if rows[-1]["peak_rss_mb"] is None:
                    notes.append(f"scale, {label}, {client_count} clients: "
                                 f"its process did not report within {STOP_TIMEOUT:.0f} s "
                                 f"of being stopped: threads and RSS unknown")
            except (OSError, RuntimeError, TimeoutError) as error:
                notes.append(f"scale, {label}, {client_count} clients: "
                             f"could not finish: {one_line(error)}")
    return {"rows": rows}


# --- the tables -----------------------------------------------------------------------------

def render_alternatives(section):
    return render_comparison(
        f"Alternatives: PassthroughProxy's mechanism against others, "
        f"median of {section['repetitions']} repetitions of {section['seconds_each']} s; "
        f"switches: the relay's context switches per request", section)



def render_scale(section):
    return table(
        "Scale: the clients connect at once "
        "(connected: every connect() returned; accepted: the proxy accepted all), "
        f"then each sends one request, {SCALE_ROUNDS} times; p50, p99: the median of the bursts'; "
        "lost: a connect that failed or a request unanswered",
        ["relay", "clients", "answered", "wrong", "lost", "connected ms", "accepted ms", "p50 ms",
         "p99 ms", "peak threads", "peak RSS MB"],
        [[row["relay"], row["clients"], row["answered"], row["wrong"], row["lost"],
          f"{row['connected_ms']:.0f}", f"{row['accepted_ms']:.0f}", f"{row['p50_ms']:.1f}",
          f"{row['p99_ms']:.1f}", row["peak_threads"] or "-",
          "-" if row["peak_rss_mb"] is None else f"{row['peak_rss_mb']:.1f}"]
         for row in section["rows"]])
