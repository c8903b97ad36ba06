"""bench.cited: the figures the commentary and BENCH.md cite, and how each is taken.

    overhead       what a hop costs: round trips through PassthroughProxy, FramedProxy
                   (caps 1 and 8), socat and HAProxy to the lean upstream, at 1, 8
                   and 64 clients: requests/s,
                   ratios to direct and to socat from the same repetition, latency,
                   CPU per request of the relay's process and of the upstream's
    nagle          a request written in two parts 2 ms apart, through a relay with
                   TCP_NODELAY and through NaglePassthroughProxy, without it
    head_of_line   predicted, then measured: N clients at once through a pool of C
                   connections to an upstream that holds each reply D; the last
                   reply comes after ceil(N/C) * D
    pipelining     pipelining against pooling: one pipelined connection (Part two's
                   ManagedProxy) against pools of 1 and 8, to a slow upstream (service
                   time, which queues) and to a distant one (latency, which overlaps)

Each section returns its raw figures; render_<section>() prints its table. The
machinery (server processes, load generators, tables) is bench/machinery.py;
the mechanism study beside this is bench/mechanisms.py.
"""
import contextlib
import math
import socket
import statistics
import time

from tcp_proxy import answer, PassthroughProxy

from bench.machinery import (START_TIMEOUT, ExternalRelay, ServiceProcess, close_clients,
                             compare_relays, connect_clients, exchange_rounds, low_high,
                             render_comparison, spread, table, tool_path)

CLIENT_COUNTS = (1, 8, 64)         # overhead: clients at once
POOL_CAPS = (1, 8)                 # overhead: FramedProxy's caps
REPLY_DELAY = 0.020                # head-of-line: D, the upstream's delay per reply
HEAD_OF_LINE_CLIENTS = 8           # head-of-line: N
HEAD_OF_LINE_CAPS = (1, 2, 4, 8)   # head-of-line: C


class NaglePassthroughProxy(PassthroughProxy):
    """PassthroughProxy with Nagle's algorithm left on: what the relay would be
    without the TCP_NODELAY that Server.track() sets."""

    def track(self, sock):
        super().track(sock)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)
        return sock


# --- the sections --------------------------------------------------------------------------

def start_relays(upstream_addr, notes, stack):
    """Name -> a running server, for every relay the overhead section compares;
    each entered on stack, so whatever started is stopped if a later one fails."""
    relays = {"PassthroughProxy": stack.enter_context(ServiceProcess("passthrough", upstream_addr))}
    for cap in POOL_CAPS:
        relays[f"FramedProxy cap {cap}"] = stack.enter_context(
            ServiceProcess("framed", upstream_addr, pool_cap=cap))
    for tool in ExternalRelay.TOOLS:
        if tool_path(tool):
            relays[tool] = stack.enter_context(ExternalRelay(tool, upstream_addr))
        else:
            notes.append(f"{tool}: skipped, not installed "
                         "(`make bench-tools` installs socat and haproxy)")
    return relays


def overhead(repetitions, seconds, notes):
    """Round trips through each relay to the lean upstream, at 1, 8 and 64 clients."""
    with contextlib.ExitStack() as stack:
        upstream = stack.enter_context(ServiceProcess("lean-upstream"))
        relays = start_relays(upstream.addr, notes, stack)
        rows = compare_relays(relays, upstream, CLIENT_COUNTS, repetitions, seconds)
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
                            ("PassthroughProxy, Nagle left on", NaglePassthroughProxy)):
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


# --- the tables -----------------------------------------------------------------------------

def render_overhead(section):
    return render_comparison(
        f"Overhead: round trips through each relay to the lean upstream, "
        f"median of {section['repetitions']} repetitions of {section['seconds_each']} s; "
        f"ratios from the same repetition; CPU per request "
        f"of the relay's process (and of the upstream's)", section)


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
        ["pool cap C", "predicted ceil(N/C)*D ms", "measured ms", "range ms", "excess ms",
         "within target", "wrong"],
        [[row["pool_cap"], f"{row['predicted_ms']:.0f}", f"{row['wall_ms']['median']:.1f}",
          low_high(row["wall_ms"], "{:.1f}"), f"{row['excess_ms']:+.1f}",
          "yes" if row["within_target"] else "no", row["wrong"]] for row in section["rows"]])


def render_pipelining(section):
    return table(
        f"Pipelining vs pooling (Part two's ManagedProxy): {HEAD_OF_LINE_CLIENTS} clients at once; "
        f"a slow upstream spends {section['reply_delay_ms']:.0f} ms on each reply in turn, "
        f"a distant one answers each {section['reply_delay_ms']:.0f} ms after it arrived; "
        f"median of {section['repetitions']} bursts",
        ["upstream", "relay", "wall ms", "range ms", "p50 ms", "wrong"],
        [[row["upstream"], row["relay"], f"{row['wall_ms']['median']:.1f}",
          low_high(row["wall_ms"], "{:.1f}"), f"{row['p50_ms']:.1f}", row["wrong"]]
         for row in section["rows"]], left_columns=2)

