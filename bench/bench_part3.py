"""bench_part3: head-of-line blocking, in-order pipelining against request ids.

    python3 -m bench.bench_part3 [--slow SECONDS] [--fast N] [--trials T]

One connection, one upstream (tagged.TaggedUpstream), the same per-key delay:
`GET slow` is answered after --slow seconds, every other key at once. The
client sends GET slow, then N fast GETs behind it, and times each reply.

  in order   the untagged twin: plain lines, pipelined, replies in request order
             (what Part two's pipelining, HTTP/1.1 pipelining and RESP must do)
  tagged     TaggedClient: N+1 threads calling over the one connection, each
             reply matched by its id, so it leaves as soon as it is ready

The prediction, printed before the measurement: in order, every fast reply waits
behind the slow one, so its latency is about the slow delay (never less: the
upstream cannot write it before the slow reply, which it writes after the
delay); tagged, a fast reply's latency is a round trip plus thread hand-offs
(a thread that wants the GIL may wait out its 5 ms switch interval), milliseconds,
whatever the slow delay is. The slow reply takes the delay both
ways. Real times: the figures change from run to run and machine to machine.
"""
import argparse
import socket
import statistics
import threading
import time

from part3.tagged import TaggedClient, TaggedUpstream


def in_order(slow, fast):
    """Latencies (seconds): the slow reply's, and each fast reply's, pipelined without ids."""
    with TaggedUpstream(delays={"slow": slow}, tagged=False) as upstream:
        with socket.create_connection(upstream.addr, timeout=slow + 10) as sock:
            requests = b"GET slow\n" + b"".join(b"GET fast%d\n" % number for number in range(fast))
            start = time.monotonic()
            sock.sendall(requests)
            arrivals, buffer = [], b""
            while len(arrivals) < fast + 1:
                data = sock.recv(65536)
                if not data:
                    raise ConnectionError("the upstream closed before every reply came")
                now = time.monotonic()
                arrivals += [now - start] * data.count(b"\n")   # every line this recv completed
                buffer += data
    return arrivals[0], arrivals[1:]


def tagged(slow, fast):
    """Latencies (seconds): the slow call's, and each fast call's, over one tagged connection."""
    latencies = {}

    def timed_call(name, line):
        start = time.monotonic()
        client.call(line)
        latencies[name] = time.monotonic() - start

    with TaggedUpstream(delays={"slow": slow}) as upstream, TaggedClient(upstream.addr) as client:
        threads = [threading.Thread(target=timed_call, args=("slow", b"GET slow\n"))]
        threads[0].start()
        client.wait_sent(1)   # the slow request is on the wire first, as in order
        for number in range(fast):
            threads.append(threading.Thread(target=timed_call,
                                            args=(number, b"GET fast%d\n" % number)))
            threads[-1].start()
        for thread in threads:
            thread.join()
    return latencies.pop("slow"), list(latencies.values())


def head_of_line(slow=0.2, fast=20, trials=5):
    """Median over trials of each figure:
    {"in order": (slow, fast median, fast max), "tagged": ...}."""
    figures = {}
    for name, run in (("in order", in_order), ("tagged", tagged)):
        rows = []
        for _ in range(trials):
            slow_latency, fast_latencies = run(slow, fast)
            rows.append((slow_latency, statistics.median(fast_latencies), max(fast_latencies)))
        figures[name] = tuple(statistics.median(column) for column in zip(*rows))
    return figures


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slow", type=float, default=0.2,
                        help="the slow key's delay, seconds (0.2)")
    parser.add_argument("--fast", type=int, default=20, help="fast requests behind it (20)")
    parser.add_argument("--trials", type=int, default=5, help="trials per row; medians shown (5)")
    options = parser.parse_args(argv)
    slow_ms = options.slow * 1000
    print(f"One connection: GET slow ({slow_ms:.0f} ms), then {options.fast} fast GETs behind it; "
          f"medians of {options.trials} trials.")
    print(f"Prediction: in order, every fast reply waits about {slow_ms:.0f} ms (never less);")
    print("            tagged, a fast reply waits for nothing but a round trip "
          "and thread hand-offs")
    print(f"            (milliseconds, far below {slow_ms:.0f}); "
          f"the slow reply takes {slow_ms:.0f} ms both ways.")
    figures = head_of_line(options.slow, options.fast, options.trials)
    print("              slow reply   fast replies: median   max")
    for name, (slow_latency, fast_median, fast_max) in figures.items():
        print(f"  {name:<10}  {slow_latency * 1000:7.1f} ms   {fast_median * 1000:16.1f} ms"
              f"   {fast_max * 1000:6.1f} ms")
    ratio = figures["in order"][1] / figures["tagged"][1]
    print(f"Measured: the fast replies' median is {ratio:.0f}x shorter with ids.")


if __name__ == "__main__":
    main()
