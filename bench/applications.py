"""applications: eight libraries built on Redis doing their everyday work, with their defaults,
directly against redis-server and through `python3 -m part3 serve` of each kind. A reader of
the lesson need not read it: it is how the pools are tried on what their users run.

    python3 -m bench.applications [--kind framed|managed|both] [--only NAME,...] [--keep DIR]
    (make applications: the venv it needs, then this)

It starts a private redis-server and, for each kind asked, serve with its defaults in a process
of its own (a free port to listen on, and a stats port, whose refused.* counters name each
command the pool refused). Then, library by library, bench/application_work.py runs in
.venv-applications, where the libraries are, once per target: directly, then through each
pool, each time on a server emptied first. A line per run as it ends: ok, or the step that
failed and its exception, with what the pool said in its error replies, refused and logged
meanwhile; then the table of them all. --keep writes each run's whole output into DIR.

    Served        serve of one kind in a process of its own: its port, its stats, its log
    run_work()    one library's work on one target, within RUN_TIMEOUT: an Outcome
    Outcome       what a run did, as its line (line()) and its cell (cell())
    summary()     the table: a row per library, a column per target
    main(argv)
"""
import argparse
import contextlib
import dataclasses
import json
import os
import pathlib
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time

from bench import application_work, machinery
from part3.redis_server import RedisControl, RedisServer, redis_available

ROOT = pathlib.Path(__file__).resolve().parent.parent
VENV_PYTHON = ROOT / ".venv-applications/bin/python"
LIBRARIES = tuple(application_work.WORKS)
KINDS = ("framed", "managed")
RUN_TIMEOUT = 180.0   # seconds one library's work on one target may take, its workers' too
SAID_SHOWN = 3        # distinct pool error texts shown for one run, at most
# An error reply the pool wrote itself, as a client library shows it: an exception's text to
# the end of its line, or its repr to the closing quote. The pool's refusals begin
# "tcp-proxy: ", its failures upstream "upstream: ".
POOL_SAID = re.compile(r"Error(?:: (?P<text>(?:tcp-proxy|upstream): .*)"
                       r"|\((?P<quote>['\"])(?P<quoted>(?:tcp-proxy|upstream): .*?)(?P=quote)\))")


class Served:
    """`python3 -m part3 serve --kind KIND` with its defaults in front of upstream, in a process
    of its own, listening on a free port, with a stats port; its stderr kept in a file, so the
    lines it logs during one run can be told from the rest. close() ends it with SIGTERM (then
    SIGKILL, after stop_timeout)."""
    start_timeout = 20.0   # seconds before it says where it listens (it asks the server first)
    stop_timeout = 10.0
    stats_timeout = 5.0

    def __init__(self, kind, upstream, log):
        self.kind, self.log = kind, log
        environment = {name: value for name, value in os.environ.items()
                       if name not in ("POOL_PASSWORD", "UPSTREAM_PASSWORD")}   # its defaults
        self.process = subprocess.Popen(
            [sys.executable, "-m", "part3", "serve", "--kind", kind,
             "--upstream", f"{upstream[0]}:{upstream[1]}", "--listen", "127.0.0.1:0",
             "--stats", "127.0.0.1:0"],
            cwd=ROOT, env=environment, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=log, text=True)
        try:
            line = self._first_line()
            found = re.fullmatch(r"listening on 127\.0\.0\.1:(\d+); stats on 127\.0\.0\.1:(\d+)",
                                 line.strip())
            if not found:
                raise OSError(f"serve --kind {kind} said {line!r}; its log: {self.logged()!r}")
        except BaseException:
            self.close()
            raise
        self.port, self.stats_port = int(found[1]), int(found[2])

    def _first_line(self):
        ready = select.select([self.process.stdout], [], [], self.start_timeout)[0]
        if not ready:
            raise TimeoutError(f"serve --kind {self.kind} did not listen within "
                               f"{self.start_timeout:g} s")
        return self.process.stdout.readline()

    def stats(self):
        """Its counters, as its stats port answers them."""
        with socket.create_connection(("127.0.0.1", self.stats_port),
                                      timeout=self.stats_timeout) as sock:
            with sock.makefile("rb") as answer:
                return json.loads(answer.read())

    def logged(self, since=0):
        """What it wrote on stderr from offset `since` on."""
        self.log.flush()
        self.log.seek(since)
        return self.log.read()

    def log_end(self):
        self.log.seek(0, os.SEEK_END)
        return self.log.tell()

    def close(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process.stdout.close()


@dataclasses.dataclass
class Outcome:
    """One run: the library, the target (direct or a kind), the steps it finished, and, if it
    failed, the step and the exception; what the pool said, refused and logged meanwhile."""
    library: str
    target: str
    did: list
    step: str | None = None
    error: str | None = None
    said: list = dataclasses.field(default_factory=list)
    refused: dict = dataclasses.field(default_factory=dict)
    logged: list = dataclasses.field(default_factory=list)

    @property
    def ok(self):
        return self.error is None

    def cell(self):
        return "ok" if self.ok else f"failed at step {len(self.did) + 1}"

    def line(self):
        """The run as text: a first line (library, target, ok or failed, the steps done), then
        one indented line for each of the failure, the pool's error texts, its refusals and
        its log."""
        lines = [f"{self.library:14} {self.target:8} {'ok' if self.ok else 'FAILED':6}  "
                 + ("; ".join(self.did) or "nothing done")]
        if not self.ok:
            lines.append(f"    failed at {self.step or 'its start'!r}: {self.error}")
        lines += [f"    the pool said: {text}" for text in self.said]
        if self.refused:
            lines.append("    the pool refused: " + ", ".join(
                f"{command} x{count}" for command, count in sorted(self.refused.items())))
        lines += [f"    the pool logged: {text}" for text in self.logged]
        return "\n".join(lines)


def read_outcome(library, target, output, status):
    """The Outcome a run's output tells: its RESULT_MARK line, or, where there is none (killed,
    or ended before it could print one), the steps it began, the last of them unfinished."""
    begun, result = [], None
    for line in output.splitlines():
        before, mark, rest = line.partition(application_work.RESULT_MARK)
        if mark:
            result = json.loads(rest)
        before, mark, rest = line.partition(application_work.BEGUN_MARK)
        if mark:
            begun.append(rest)
    said = list(dict.fromkeys((found["text"] or found["quoted"]).strip()
                              for found in POOL_SAID.finditer(output)))[:SAID_SHOWN]
    if result is not None:
        return Outcome(library, target, result["did"], result.get("step"), result.get("error"),
                       said)
    error = (f"TimeoutError: no end within {RUN_TIMEOUT:g} s" if status is None
             else f"it ended with status {status} and said no result")
    return Outcome(library, target, begun[:-1], (begun or [None])[-1], error, said)


def refusals(before, after):
    """The commands refused between two readings of the stats, and how often."""
    counts = {name.removeprefix("refused."): after[name] - before.get(name, 0)
              for name in after if name.startswith("refused.")}
    return {command: count for command, count in counts.items() if count}


def work_command(library, url):
    return [str(VENV_PYTHON), "-m", "bench.application_work", library, url]


def run_work(library, url):
    """(the run's output, its exit status or None if it was killed at RUN_TIMEOUT). The run is
    a session of its own, so whatever it started (its workers) goes with it: at the deadline,
    and after its end, whatever of it is left is killed."""
    child = subprocess.Popen(work_command(library, url), cwd=ROOT, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             errors="replace", start_new_session=True)
    try:
        output, _ = child.communicate(timeout=RUN_TIMEOUT)
        status = child.returncode
    except subprocess.TimeoutExpired:
        status = None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        output, _ = child.communicate()
    finally:
        with contextlib.suppress(ProcessLookupError):   # none of its session left: as it should
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    return output, status


def run_on(library, target, redis, served, keep):
    """One library's work on one target (direct: redis-server itself), on an emptied server."""
    control = RedisControl(redis.addr)
    try:
        control.command("FLUSHALL")
    finally:
        control.close()
    pool = served.get(target)
    port = pool.port if pool else redis.addr[1]
    before, log_from = (pool.stats(), pool.log_end()) if pool else ({}, 0)
    output, status = run_work(library, f"redis://127.0.0.1:{port}/0")
    outcome = read_outcome(library, target, output, status)
    if pool:
        outcome.refused = refusals(before, pool.stats())
        outcome.logged = [line.split(": ", 1)[-1] for line in pool.logged(log_from).splitlines()]
    if keep:
        (keep / f"{library}-{target}.txt").write_text(output)
    return outcome


def summary(outcomes, targets):
    """The table of every run: a row per library, a column per target."""
    by_run = {(outcome.library, outcome.target): outcome for outcome in outcomes}
    libraries = list(dict.fromkeys(outcome.library for outcome in outcomes))
    rows = [[library] + [by_run[library, target].cell() if (library, target) in by_run else "-"
                         for target in targets] for library in libraries]
    return machinery.table("each library's everyday work", ["library", *targets], rows,
                           left_columns=len(targets) + 1)


def versions():
    """The libraries' versions in the venv, and redis-py's, as one line."""
    names = [*LIBRARIES, "redis"]
    asked = ("import importlib.metadata as metadata, json, sys\n"
             "print(json.dumps([metadata.version(name) for name in sys.argv[1:]]))")
    found = subprocess.run([str(VENV_PYTHON), "-c", asked, *names], capture_output=True,
                           text=True, timeout=60, check=True)
    pairs = [f"{name} {version}" for name, version in zip(names, json.loads(found.stdout))]
    return ", ".join(pairs[:-1]) + f", on redis-py {pairs[-1].split()[-1]}"


def parse(argv):
    parser = argparse.ArgumentParser(prog="python3 -m bench.applications",
                                     description="libraries built on Redis through each pool")
    parser.add_argument("--kind", choices=(*KINDS, "both"), default="both")
    parser.add_argument("--only", default=",".join(LIBRARIES),
                        help="libraries, by name, comma-separated: " + ", ".join(LIBRARIES))
    parser.add_argument("--keep", type=pathlib.Path, default=None,
                        help="a directory to write each run's whole output into")
    options = parser.parse_args(argv)
    options.only = [name.strip() for name in options.only.split(",") if name.strip()]
    unknown = [name for name in options.only if name not in LIBRARIES]
    if unknown:
        parser.error(f"no library named {', '.join(unknown)}; the names: {', '.join(LIBRARIES)}")
    options.kinds = list(KINDS) if options.kind == "both" else [options.kind]
    return options


def main(argv=None):
    options = parse(argv)
    if not VENV_PYTHON.exists():
        print("applications: no .venv-applications; `make applications` makes it")
        return 2
    if not redis_available():
        print("applications: no redis-server on PATH; `make redis-server` installs it")
        return 2
    if options.keep:
        options.keep.mkdir(parents=True, exist_ok=True)
    targets = ["direct", *options.kinds]
    print(versions(), flush=True)
    outcomes = []
    started = time.monotonic()
    with RedisServer() as redis, contextlib.ExitStack() as stack:
        served = {}
        for kind in options.kinds:
            log = stack.enter_context(tempfile.TemporaryFile("w+", prefix="serve-log-"))
            served[kind] = stack.enter_context(contextlib.closing(Served(kind, redis.addr, log)))
            for text in served[kind].logged().splitlines():
                print(f"serve --kind {kind}: {text.split(': ', 1)[-1]}")
        print(flush=True)
        for library in options.only:
            for target in targets:
                outcome = run_on(library, target, redis, served, options.keep)
                outcomes.append(outcome)
                print(outcome.line(), flush=True)
    print()
    print(summary(outcomes, targets), end="")
    print(f"({time.monotonic() - started:.0f} s)")
    return 0 if all(outcome.ok for outcome in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
