"""bench.bench: the times the demo cannot print, measured on this machine's loopback.

    python3 -m bench                 every section, about twelve minutes
    python3 -m bench --quick         fewer and shorter repetitions, 1,000 clients only: about two
                                     minutes
    python3 -m bench --only scale    one section (or several, comma-separated)
    python3 -m bench --only redis    redis-benchmark through the project's relays and the real ones
    python3 -m bench --only transaction   redis-py's pipeline() of SETs in MULTI ... EXEC
    python3 -m bench --json FILE     also write every raw figure to FILE
    python3 -m bench --profile       with redis: also profile the Python relays under
                                     redis-benchmark
    python3 -m bench --perf          also count the futex() calls of each alternative (perf, Linux)

The bench in reading order:

    bench/cited.py        what the commentary and BENCH.md cite: a hop's cost
                          (overhead), Nagle, head-of-line predicted then measured,
                          pipelining against pooling
    bench/mechanisms.py   the mechanism study: the alternatives to PassthroughProxy's
                          mechanism, CPU placement on and off, 1,000 and 5,000 clients
                          (scale)
    bench/redis_peers.py  redis-benchmark against a private redis-server, directly and
                          through the project's relays, socat, HAProxy and twemproxy
    bench/machinery.py    what they share: server processes, the load generator, tables
    bench/placement.py    the CPU-placement mixin every project relay runs with
    bench/attacks.py      run on its own (python3 -m bench.attacks): hostile clients
                          against `python3 -m part3 serve`, each beside an honest client
    this module           the sections in order, the targets set for the bench, the
                          header, --json; a section that fails says why in one line
                          while the others still run
"""
import argparse
import json
import os
import platform
import sys
import time

from bench import cited, mechanisms, redis_peers
from bench.cited import CLIENT_COUNTS
from bench.machinery import (low_high, one_line, progress, raise_open_file_limit, ratio, spread,
                             table)
from bench.mechanisms import SCALE_CLIENTS, SCALE_POOL_CAP

# --- the targets set for the bench ----------------------------------------------------

def targets(results):
    """Each target with the figure measured and whether it was reached, for the
    sections that finished."""
    found = []
    rows = {(row["relay"], row["clients"]): row
            for row in (results.get("overhead") or {}).get("rows", [])}
    comparisons = [("PassthroughProxy", "socat", client_count, 0.9)
                   for client_count in CLIENT_COUNTS]
    comparisons.append((f"FramedProxy cap {SCALE_POOL_CAP}", "PassthroughProxy", 8, 0.75))
    for name, other, client_count, least in comparisons:
        if (name, client_count) not in rows or (other, client_count) not in rows:
            continue   # socat may be absent
        mine, theirs = rows[(name, client_count)]["runs"], rows[(other, client_count)]["runs"]
        figures = spread([ratio(a["rate"], b["rate"]) for a, b in zip(mine, theirs)])
        found.append((f"{name} >= {least}x {other}, {client_count} client(s)",
                      f"{figures['median']:.2f}x ({low_high(figures, '{:.2f}')})",
                      figures["median"] >= least))
    for row in (results.get("head_of_line") or {}).get("rows", []):
        found.append((f"head-of-line cap {row['pool_cap']} within max(3 ms, 10%) of "
                      f"{row['predicted_ms']:.0f} ms", f"{row['wall_ms']['median']:.1f} ms",
                      row["within_target"]))
    scale_rows = {(row["relay"], row["clients"]): row
                  for row in (results.get("scale") or {}).get("rows", [])}
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
    found += redis_peers.targets(results.get("redis") or {})
    found += redis_peers.transaction_targets_reached(results.get("transaction") or {})
    return found



# --- output -----------------------------------------------------------------------

def render_targets(results):
    return table("The targets set for the bench", ["target", "measured", "reached"],
                 [[name, figure, "yes" if reached else "NO"]
                  for name, figure, reached in targets(results)])


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="3 short repetitions, and 1,000 clients only: "
                             "under a minute on a busy machine")
    parser.add_argument("--json", metavar="FILE", help="write every raw figure to FILE")
    parser.add_argument("--profile", action="store_true",
                        help="with redis: also profile PassthroughProxy and ManagedProxy(RESP) "
                             "under redis-benchmark (cProfile, every thread)")
    parser.add_argument("--perf", action="store_true",
                        help="alternatives: count each Python relay's futex() calls "
                             "with `perf stat` (Linux, root)")
    parser.add_argument("--only", metavar="SECTIONS",
                        help="comma-separated sections to run (default all): "
                             + ", ".join(SECTION_NAMES)
                             + "; also redis_profile (what --profile adds)")
    parser.add_argument("--repetitions", type=int,
                        help="repetitions per comparison (default 5, quick 3)")
    parser.add_argument("--seconds", type=float,
                        help="seconds per comparison measurement (default 1, quick 0.1)")
    return parser.parse_args(argv)


SECTION_NAMES = ("overhead", "alternatives", "nagle", "head_of_line", "scale", "pipelining",
                 "redis", "transaction")


def sections(arguments, notes):
    """(name, how to measure it, how to render it) for every section asked for."""
    repetitions = arguments.repetitions or (3 if arguments.quick else 5)
    seconds = arguments.seconds or (0.1 if arguments.quick else 1.0)
    chosen = arguments.only.split(",") if arguments.only else list(SECTION_NAMES)
    every = {
        "overhead": (lambda: cited.overhead(repetitions, seconds, notes), cited.render_overhead),
        "alternatives": (lambda: mechanisms.alternatives(repetitions, seconds,
                                                         mechanisms.ALTERNATIVE_CLIENTS, notes,
                                                         count_futexes=arguments.perf),
                         mechanisms.render_alternatives),
        "nagle": (lambda: cited.nagle(count=5 if arguments.quick else 20), cited.render_nagle),
        "head_of_line": (lambda: cited.head_of_line(repetitions), cited.render_head_of_line),
        "scale": (lambda: mechanisms.scale(SCALE_CLIENTS[:1] if arguments.quick else SCALE_CLIENTS,
                                           notes),
                  mechanisms.render_scale),
        "pipelining": (lambda: cited.pipelining(repetitions, notes), cited.render_pipelining),
        "redis": (lambda: redis_peers.redis_peers(arguments.repetitions
                                                  or (1 if arguments.quick else 3), notes,
                                                  run_seconds=0.3 if arguments.quick else 1.0),
                  redis_peers.render_redis),
        "transaction": (lambda: redis_peers.transaction(arguments.repetitions
                                                        or (1 if arguments.quick else 3), notes),
                        redis_peers.render_transaction),
    }
    every["redis_profile"] = (lambda: redis_peers.profile(), redis_peers.render_profile)
    if arguments.profile and "redis" in chosen:
        chosen.append("redis_profile")
    return [(name, *every[name]) for name in chosen]


def main(argv=None):
    arguments = parse_arguments(argv)
    raise_open_file_limit()
    started = time.perf_counter()
    results = {"cores": os.cpu_count(), "python": platform.python_version(),
               "load_average": os.getloadavg()[0],   # other work on the machine skews every figure
               "command": " ".join(["python3", "-m", "bench",
                                    *(argv if argv is not None else sys.argv[1:])]),
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
