"""bench.attacks: hostile clients against `python3 -m part3 serve`, each beside an honest one.
A reader of the lesson need not read it: it measures what the pools do when a client does
what no well-behaved client does, and the lesson's claims do not rest on its figures.

    python3 -m bench.attacks [--kind framed|managed|both] [--runs N] [--only NAME,...]
                             [--pairs N] [--json FILE]                  (make bench-attacks)

Each run of an attack, on each pool kind, starts from nothing: a private redis-server
(part3/redis_server.py), then serve in a process of its own on port 0 (its "listening on"
line read for both ports), then an honest client, connected first, in a process of its own
so that no attacker thread of the bench delays its figures. The attack starts; once it bites,
the honest client does its SET+GET pairs of unique values, each reply checked. Then what the
attackers got (the pool's error, or the end of their connections, timed from the attack's
start), the pool's stats document, and its peak RSS (VmHWM), read just before it is stopped.
The table gives each figure at its worst over the runs; --json keeps every run whole.

    ATTACKS            name -> the attack's class, in the table's order; each class's
                       docstring says what it does and what it counts
    Pool               serve in a process of its own: its ports, stats, peak RSS, stop()
    vmhwm_mb()         peak RSS from /proc/PID/status
    SlowRelay          a relay before redis-server: every reply late, or one key's trickled
    HonestClient       SET+GET pairs (or MULTI/SET/EXEC+GET), each reply checked;
                       HonestProcess runs one in a process of its own
    Attackers          the attack's connections, watched: when each was told an error, closed
    Writer, Trickle    threads writing to attackers' sockets: as fast as they take bytes, or
                       a byte a second
    crowd()            many clients at once, each sending PING: what each heard, and when
    BusyRedisPy        a thread of redis-py doing SET+GET pairs (kill-9, sigstop)
    Attack             what every attack shares: prepare(), start() (the attack's bite()),
                       honest(), finish(), note()
    run_once()         one attack on one kind, every process and socket ended whatever happens
    worst(), render()  the table (the worst of each figure over the runs) and its notes

Every wait has a deadline and every address is 127.0.0.1 with a port from the OS. The marks
the table is read against (an honest pair within SLOWEST_MARK_MS, the pool within RSS_MARK_MB)
are targets, not measurements; measured figures live in bench/BENCH.md with their command.
"""
import argparse
import collections
import contextlib
import json
import os
import queue
import random
import re
import resource
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.machinery import PROCESSES, one_line, progress, raise_open_file_limit, table
from bench.redis_peers import Replies, bulk, command
from ground.frames import Frames
from ground.server import Server, recv, shutdown
from part3 import resp
from part3.redis_server import RedisControl, RedisServer, read_resp

ROOT = Path(__file__).resolve().parent.parent   # where `python3 -m part3` runs from
KINDS = ("framed", "managed")
PAIRS = 200              # the honest client's SET+GET pairs, by default
REPLY_TIMEOUT = 10.0     # seconds any bench client waits for one reply
HONEST_WITHIN = 30.0     # seconds the honest client has for all its pairs, unless an attack says
START_WITHIN = 20.0      # seconds serve may take to say where it listens (its ACL check first)
STOP_WITHIN = 15.0       # seconds serve has to exit after SIGTERM, before SIGKILL
STATS_WITHIN = 5.0       # seconds the stats port has to send its document
JOIN_WITHIN = 10.0       # seconds a bench thread has to end once told to
# Held clients are watched this long from the attack's start: past the pool's deadline for a
# request to arrive whole (README: a pool in front of your redis-server), with room to see it
HELD_WATCH = 20.0
# ... and past its idle deadline for a transaction or a WATCH, with room; a client that holds
# one is told only when it next asks (README), so then each asks (Attack.probe)
HOLD_WATCH = 35.0
PROBE_WITHIN = 5.0       # seconds the attackers' probes have for their replies
SLOWEST_MARK_MS = 250.0  # what the honest client's slowest pair should stay within
RSS_MARK_MB = 256.0      # what the pool's peak RSS should stay within
CHUNK = 65536            # bytes offered to one send() or asked of one recv()
REFUSAL = b"-ERR max number of clients reached"


# --- serve, in a process of its own -----------------------------------------------------------

def vmhwm_mb(status_text):
    """The VmHWM line of a /proc/PID/status text (the peak resident set, in kB) in MB, or
    None when it has none (a kernel thread, a zombie)."""
    for line in status_text.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return None


def peak_rss_mb(pid):
    """A live process's peak RSS in MB, or None once it has gone."""
    try:
        return vmhwm_mb(Path(f"/proc/{pid}/status").read_text(encoding="ascii"))
    except OSError:
        return None


def limit_files(count):
    """What a child runs before serve: at most `count` open files, soft and hard, so that
    serve's own raise to its hard limit finds nothing above."""
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (count, count))


LISTENING = re.compile(r"listening on 127\.0\.0\.1:(\d+); stats on 127\.0\.0\.1:(\d+)")


class Pool:
    """`python3 -m part3 serve` in front of upstream, listening and counting on ports of its
    own choosing; stderr kept in a temporary file, whose last lines stop() returns."""

    def __init__(self, kind, upstream, options=(), password=None, files=None):
        environ = {name: value for name, value in os.environ.items()
                   if name not in ("POOL_PASSWORD", "UPSTREAM_PASSWORD")}
        if password:
            environ["POOL_PASSWORD"] = password
        self.log = tempfile.TemporaryFile()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "part3", "serve", "--kind", kind,
                 "--upstream", f"{upstream[0]}:{upstream[1]}", "--listen", "127.0.0.1:0",
                 "--stats", "127.0.0.1:0", *options],
                cwd=ROOT, env=environ, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=self.log, preexec_fn=limit_files(files) if files else None)
        except BaseException:
            self.log.close()
            raise
        try:
            line = self._first_line()
            found = LISTENING.search(line)
            if not found:
                raise RuntimeError(f"serve said {line!r}, not where it listens; "
                                   f"its log ends: {self.log_tail()}")
            self.addr = ("127.0.0.1", int(found[1]))
            self.stats_addr = ("127.0.0.1", int(found[2]))
        except BaseException:
            self.stop()
            raise

    def _first_line(self):
        output, line = self.process.stdout.fileno(), b""
        deadline = time.monotonic() + START_WITHIN
        while not line.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([output], [], [], remaining)[0]:
                raise TimeoutError(f"serve did not listen within {START_WITHIN:g} s")
            data = os.read(output, 4096)
            if not data:
                raise RuntimeError(f"serve exited before it listened: {self.log_tail()}")
            line += data
        return line.decode(errors="replace")

    def stats(self):
        """The stats port's JSON document, or {"error": why} when it gave none."""
        try:
            with socket.create_connection(self.stats_addr, timeout=STATS_WITHIN) as sock:
                text, deadline = b"", time.monotonic() + STATS_WITHIN
                while (data := sock.recv(CHUNK)) and time.monotonic() < deadline:
                    text += data
            return json.loads(text)
        except (OSError, ValueError) as error:
            return {"error": one_line(error)}

    def peak_rss_mb(self):
        return peak_rss_mb(self.process.pid)

    def log_tail(self, lines=5):
        self.log.seek(0)
        return [line.decode(errors="replace") for line in self.log.read().splitlines()[-lines:]]

    def stop(self):
        """SIGTERM, then SIGKILL past STOP_WITHIN; the last lines of its log. Again: nothing."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_WITHIN)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.log.closed:
            return []
        self.process.stdout.close()
        tail = self.log_tail()
        self.log.close()
        return tail

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.stop()


# --- a slow server: a relay before redis-server ---------------------------------------------

class SlowRelay(Server):
    """Passes each request on to redis-server at once and each reply back late: every reply
    `reply_delay` seconds after the one before it has gone (a server that takes that long a
    request, so a pipeline's replies queue), and the reply to a request that names
    `trickle_key` one byte at a time, `trickle_every` seconds apart. Requests must be RESP
    arrays (a pool's are): they are framed to pair each reply with its request."""

    def __init__(self, upstream_addr, reply_delay=0.0, trickle_key=None, trickle_every=0.01):
        self.upstream_addr = upstream_addr
        self.reply_delay, self.trickle_every = reply_delay, trickle_every
        self.trickled = None if trickle_key is None else bulk(trickle_key)
        super().__init__()

    def handle(self, conn):
        upstream = self.connect(self.upstream_addr)
        asked = queue.SimpleQueue()   # requests in the order their replies will come
        replier = self.spawn(self._reply_late, upstream, conn, asked)
        frames = Frames(resp.RESP.reply_parser)   # an array of bulk strings frames as a reply
        try:
            while data := recv(conn):
                frames.feed(data)
                while (request := frames.take()) is not None:
                    asked.put(request)
                upstream.sendall(data)
        finally:
            shutdown(upstream)   # ends the replier's read
            replier.join()
            self.forget(upstream)

    def _reply_late(self, upstream, conn, asked):
        frames = Frames(resp.RESP.reply_parser)
        with contextlib.suppress(OSError):   # the pool left, or close(): no one reads the rest
            while data := recv(upstream):
                frames.feed(data)
                while (reply := frames.take()) is not None:
                    try:
                        request = asked.get(timeout=REPLY_TIMEOUT)
                    except queue.Empty:   # a reply to no request: pass it on as it is
                        request = b""
                    self._send_late(conn, reply, request)
        shutdown(conn)   # redis-server left: so does the pool's connection

    def _send_late(self, conn, reply, request):
        if self.trickled and self.trickled in request:
            for index in range(len(reply)):
                if self.closed:
                    return
                time.sleep(self.trickle_every)
                conn.sendall(reply[index:index + 1])
            return
        if self.reply_delay and not self.closed:
            time.sleep(self.reply_delay)
        conn.sendall(reply)


# --- the honest client ----------------------------------------------------------------------

class HonestClient:
    """SET+GET pairs of unique keys and values on one connection, each reply checked: right,
    wrong (a reply that is not the one owed), or an error (an error reply, a connection that
    broke, a reply later than REPLY_TIMEOUT). After an error that leaves the stream in doubt
    it connects again. transactions=True: each pair is MULTI, SET, EXEC, then GET."""

    def __init__(self, addr, token, password=None, transactions=False):
        self.addr, self.token = addr, token.encode()
        self.password, self.transactions = password, transactions
        self.sock = self.replies = None
        self.chooser = random.Random()
        with contextlib.suppress(OSError):   # not yet: the first pair tries again, and counts it
            self.connect()

    def connect(self):
        self.sock = socket.create_connection(self.addr, timeout=REPLY_TIMEOUT)
        self.replies = Replies(self.sock)
        if self.password and self.ask(b"AUTH", self.password.encode()) != b"+OK\r\n":
            raise ConnectionError("the pool refused the password")

    def close(self):
        if self.sock is not None:
            self.sock.close()
        self.sock = None

    def ask(self, *words):
        self.sock.sendall(command(*words))
        return read_resp(self.replies)

    def pairs(self, count, within):
        """Up to `count` pairs, as many as `within` seconds allow: a dict of the counts, the
        slowest pair in ms, and the errors' texts, the most frequent first."""
        figures = {"of": count, "done": 0, "right": 0, "wrong": 0, "errors": 0,
                   "slowest_ms": 0.0}
        errors = collections.Counter()
        deadline = time.monotonic() + within
        for number in range(count):
            if time.monotonic() > deadline:
                break
            started = time.perf_counter()
            try:
                if self.sock is None:
                    self.connect()
                outcome = (self.transaction_pair if self.transactions else self.pair)(number)
            except (OSError, ValueError) as error:   # a break, a timeout, bytes no reply is
                outcome = one_line(error)
                self.close()
            tally(figures, errors, outcome, started)
        figures["said"] = [f"{text} (x{times})" for text, times in errors.most_common(3)]
        return figures

    def key_and_value(self, number):
        key = b"honest:%s:%d" % (self.token, number)
        return key, key + b":" + self.chooser.randbytes(16).hex().encode()

    def pair(self, number):
        key, value = self.key_and_value(number)
        return (judged(self.ask(b"SET", key, value), b"+OK\r\n")
                or judged(self.ask(b"GET", key), bulk(value)) or "right")

    def transaction_pair(self, number):
        key, value = self.key_and_value(number)
        if failed := judged(self.ask(b"MULTI"), b"+OK\r\n"):
            return failed
        if failed := judged(self.ask(b"SET", key, value), b"+QUEUED\r\n"):
            self.ask(b"DISCARD")   # whatever it says: the transaction is over either way
            return failed
        return (judged(self.ask(b"EXEC"), b"*1\r\n+OK\r\n")
                or judged(self.ask(b"GET", key), bulk(value)) or "right")


def tally(figures, errors, outcome, started):
    """One pair's outcome counted: its time (from perf_counter() `started`) against the
    slowest, right or wrong, or an error counted by its text in `errors` (a Counter)."""
    figures["slowest_ms"] = max(figures["slowest_ms"], (time.perf_counter() - started) * 1000)
    figures["done"] += 1
    if outcome in ("right", "wrong"):
        figures[outcome] += 1
    else:
        figures["errors"] += 1
        errors[outcome] += 1


def judged(reply, owed):
    """None when the reply is the one owed; else "wrong", or the error's text."""
    if reply == owed:
        return None
    if reply.startswith(b"-"):
        return reply[1:].split(b"\r\n", 1)[0].decode(errors="replace")
    return "wrong"


def honest_in_child(addr, token, password, transactions, pipe):
    """The honest client's process: connect, say so, wait for the word, run the pairs, send
    the figures back."""
    client = HonestClient(addr, token, password, transactions)
    try:   # the bench may give up on it and close its end: then it is done
        pipe.send("connected")
        if pipe.poll(START_WITHIN + HOLD_WATCH):   # the attack's start comes first
            count, within = pipe.recv()
            pipe.send(client.pairs(count, within))
    except (EOFError, OSError):
        pass
    finally:
        client.close()


class HonestProcess:
    """An HonestClient in a process of its own, connected before the attack starts."""

    def __init__(self, addr, token, password=None, transactions=False):
        self.pipe, child_end = PROCESSES.Pipe()
        self.process = PROCESSES.Process(target=honest_in_child, daemon=True,
                                         args=(addr, token, password, transactions, child_end))
        self.process.start()
        child_end.close()
        if not self.pipe.poll(START_WITHIN):
            self.close()
            raise TimeoutError(f"the honest client did not connect within {START_WITHIN:g} s")
        self.pipe.recv()

    def pairs(self, count, within):
        self.pipe.send((count, within))
        if not self.pipe.poll(within + 2 * REPLY_TIMEOUT):   # its last pair may take two
            return {"of": count, "done": 0, "right": 0, "wrong": 0, "errors": 1,
                    "slowest_ms": None, "said": ["the honest client's process did not report"]}
        return self.pipe.recv()

    def close(self):
        self.process.join(JOIN_WITHIN)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.pipe.close()


# --- the attackers' connections ---------------------------------------------------------------

def error_line(heard):
    """The first error reply's line in what a client heard, without its '-', or None."""
    for line in heard.split(b"\r\n"):
        if line.startswith(b"-"):
            return line[1:].decode(errors="replace")
    return None


class Attackers:
    """The attack's own connections, watched from watch() on: when the pool told each an
    error (its text kept) and when it closed each, in seconds from the attack's start. With
    reads=False (a client that never reads) only a close is seen; its error, if any, is read
    from the end of what it was sent once the close has come."""
    HEARD = 4096   # bytes of what each heard that are kept: its error is near the start

    def __init__(self, reads=True):
        self.reads = reads
        self.started = time.monotonic()
        self.socks, self.heard = [], {}
        self.told_at, self.closed_at, self.said = {}, {}, {}
        self._stopping = threading.Event()
        self._watcher = None

    def connect(self, addr, count, first=b""):
        """count connections, each sending `first` (if any); the new ones."""
        made = []
        for _ in range(count):
            sock = socket.create_connection(addr, timeout=REPLY_TIMEOUT)
            self.socks.append(sock)
            made.append(sock)
            if first:
                sock.sendall(first)
        return made

    def watch(self):
        """Start watching; after this the sockets are non-blocking, for the writers too."""
        for sock in self.socks:
            sock.setblocking(False)
            self.heard[sock] = b""
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()

    def _watch(self):
        poller, watched = select.poll(), {}
        events = select.POLLRDHUP | (select.POLLIN if self.reads else 0)
        for sock in self.socks:
            poller.register(sock, events)
            watched[sock.fileno()] = sock
        while watched and not self._stopping.is_set():
            for descriptor, _ in poller.poll(100):
                sock = watched[descriptor]
                if not self.reads or self._read(sock):
                    self.closed_at[sock] = time.monotonic() - self.started
                    poller.unregister(descriptor)
                    del watched[descriptor]

    def _read(self, sock):
        """Read what came; True once the connection has ended."""
        try:
            data = sock.recv(CHUNK)
        except BlockingIOError:
            return False
        except OSError:   # a reset
            return True
        if len(self.heard[sock]) < self.HEARD:
            self.heard[sock] += data[:self.HEARD]
            if sock not in self.said and (said := error_line(self.heard[sock])):
                self.said[sock] = said
                self.told_at[sock] = time.monotonic() - self.started
        return not data

    def ended_at(self, sock):
        times = [at for at in (self.told_at.get(sock), self.closed_at.get(sock)) if at is not None]
        return min(times) if times else None

    def wait_ended(self, until):
        """Until every connection has been told an error or closed, or `until` seconds from
        the attack's start."""
        while time.monotonic() - self.started < until:
            if all(self.ended_at(sock) is not None for sock in self.socks):
                return
            time.sleep(0.05)

    def ask(self, request):
        """Each connection not yet ended sends request; how many did."""
        asking = [sock for sock in self.socks if self.ended_at(sock) is None]
        for sock in asking:
            with contextlib.suppress(OSError):   # full, or gone: the watch says which
                sock.send(request)
        return len(asking)

    def read_said_after_close(self):
        """For clients that read nothing: each closed one's last error line, from the tail of
        what was left for it (read now, within a deadline and a bound)."""
        for sock in self.closed_at:
            tail, deadline, read = b"", time.monotonic() + 2.0, 0
            with contextlib.suppress(OSError):
                while time.monotonic() < deadline and read < 256 * CHUNK:
                    if not select.select([sock], [], [], 0.2)[0]:
                        break
                    data = sock.recv(CHUNK)
                    if not data:
                        break
                    read += len(data)
                    tail = (tail + data)[-512:]
            errors = [line for line in tail.split(b"\r\n") if line.startswith(b"-")]
            if errors:
                self.said[sock] = errors[-1][1:].decode(errors="replace")

    def outcome(self, what=""):
        """What the attackers got, for the table: how many ended and by when, and the error
        the pool said most often."""
        ended = [at for at in map(self.ended_at, self.socks) if at is not None]
        count = len(self.socks)
        summary = f"{len(ended)}/{count} ended" + (f" by {max(ended):.1f} s" if ended else
                                                   f" in {time.monotonic() - self.started:.0f} s")
        said = collections.Counter(self.said.values()).most_common(1)
        answers = collections.Counter(   # what those not ended heard, a probe's answer say
            self.heard[sock].split(b"\r\n", 1)[0].decode(errors="replace")
            for sock in self.socks if self.ended_at(sock) is None and self.heard.get(sock))
        if answers:
            what += f"{'; ' if what else ''}the others heard {answers.most_common(1)[0][0]!r}"
        return {"summary": summary + (f"; {what}" if what else ""),
                "said": said[0][0] if said else "", "of": count, "held": count - len(ended),
                "closed": len(self.closed_at), "last_end_s": max(ended) if ended else None}

    def close(self):
        self._stopping.set()
        if self._watcher:
            self._watcher.join(JOIN_WITHIN)
        for sock in self.socks:
            sock.close()


class Writer(threading.Thread):
    """Writes `data` `repeats` times to each socket (non-blocking), as fast as each takes it,
    until all is written, the socket fails, stop(), or `within` seconds. until_answered: a
    socket is done as soon as there is something to read on it (an answer or a close)."""

    def __init__(self, socks, data, repeats=1, within=HELD_WATCH, until_answered=False):
        super().__init__(daemon=True)
        self.socks, self.data, self.repeats = socks, memoryview(data), repeats
        self.within, self.until_answered = within, until_answered
        self.sent = dict.fromkeys(socks, 0)
        self.answered_at, self.failed = {}, {}
        self.started = time.monotonic()
        self._stopping = threading.Event()

    @property
    def total(self):
        return len(self.data) * self.repeats * len(self.socks)

    def sent_bytes(self):
        return sum(self.sent.values())

    def run(self):
        poller, pending = select.poll(), {}
        listen = select.POLLIN | select.POLLRDHUP if self.until_answered else 0
        for sock in self.socks:
            poller.register(sock, select.POLLOUT | listen)
            pending[sock.fileno()] = sock
        whole = len(self.data) * self.repeats
        deadline = self.started + self.within
        while pending and not self._stopping.is_set() and time.monotonic() < deadline:
            for descriptor, event in poller.poll(100):
                sock = pending[descriptor]
                if event & listen:
                    self.answered_at[sock] = time.monotonic() - self.started
                    done = True
                else:
                    done = self._send(sock, whole)
                if done:
                    poller.unregister(descriptor)
                    del pending[descriptor]

    def _send(self, sock, whole):
        """Offer the socket its next bytes; True once it is done (all written, or failed)."""
        offset = self.sent[sock] % len(self.data)
        try:
            self.sent[sock] += sock.send(self.data[offset:offset + CHUNK])
        except BlockingIOError:
            return False
        except OSError as error:
            self.failed[sock] = one_line(error)
            return True
        return self.sent[sock] >= whole

    def wait_sent(self, count, within):
        """Until count bytes are written in all, or the writer has stopped, or within s."""
        deadline = time.monotonic() + within
        while self.is_alive() and self.sent_bytes() < count and time.monotonic() < deadline:
            time.sleep(0.02)

    def stop(self):
        self._stopping.set()
        self.join(JOIN_WITHIN)


def crowd(addr, count, within, keep=None):
    """count clients, each connecting and sending PING at once: a dict of what they heard
    within `within` seconds of their PING (PONG, the client limit's refusal, a close, another
    error, or nothing) and the slowest answer in seconds. Their sockets go into `keep` if
    given (they stay open, idle), else are closed."""
    heard, sent_at, answered_at, failures = {}, {}, {}, collections.Counter()
    socks = []
    try:
        for _ in range(count):
            try:
                sock = socket.create_connection(addr, timeout=REPLY_TIMEOUT)
            except OSError as error:
                failures[f"connect: {one_line(error)}"] += 1
                continue
            socks.append(sock)
            sock.setblocking(False)
            sent_at[sock], heard[sock] = time.monotonic(), b""
            with contextlib.suppress(OSError):   # one turned away may have gone already
                sock.send(command(b"PING"))
        poller = select.poll()
        waiting = {sock.fileno(): sock for sock in socks}
        for sock in socks:
            poller.register(sock, select.POLLIN | select.POLLRDHUP)
        deadline = max(sent_at.values(), default=time.monotonic()) + within
        while waiting and time.monotonic() < deadline:
            for descriptor, _ in poller.poll(100):
                sock = waiting[descriptor]
                try:
                    data = sock.recv(CHUNK)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                heard[sock] += data
                if not data or heard[sock].endswith(b"\r\n"):
                    answered_at[sock] = time.monotonic() - sent_at[sock]
                    poller.unregister(descriptor)
                    del waiting[descriptor]
        kinds = collections.Counter(failures)
        for sock in socks:
            late = answered_at.get(sock, within + 1) > within
            kinds["nothing" if late else answer_kind(heard[sock])] += 1
        return {"kinds": dict(kinds), "slowest_s": max(answered_at.values(), default=None)}
    finally:
        for sock in socks:
            if keep is None:
                sock.close()
            else:
                keep.append(sock)


def answer_kind(heard):
    if heard == b"+PONG\r\n":
        return "PONG"
    if heard.startswith(REFUSAL):
        return "refused"
    return error_line(heard) or ("closed" if not heard else "other")


def kinds_text(kinds):
    return ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items(),
                                                                 key=lambda item: -item[1]))


# --- the attacks ------------------------------------------------------------------------------

class Stage:
    """What a run has set up for its attack: the redis-server, the pool, and a token that
    makes this run's keys its own."""

    def __init__(self, redis, pool, kind, pairs, token, password=None):
        self.redis, self.pool, self.kind = redis, pool, kind
        self.pairs, self.token, self.password = pairs, token, password


class Attack:
    """What every attack shares. A subclass says how serve runs for it (serve_options, the
    relay before redis-server, a password, a file limit) and what it does: bite() returns
    once the attack bites, finish() once what the attackers got is known. The honest client
    is an HonestProcess doing SET+GET pairs unless the attack brings its own load."""
    name = ""
    runs = 2                      # runs by default
    serve_options = ()            # serve's arguments beyond --kind, --upstream, the ports
    relay = None                  # SlowRelay's options: serve then runs in front of a relay
    password = False              # serve with POOL_PASSWORD: every client must AUTH
    files = None                  # serve's limit on open files
    transactions = False          # the honest client's pairs are MULTI/SET/EXEC+GET
    honest_within = HONEST_WITHIN
    should_end = True             # the pool should end every attacker (table: "held" is bad)
    watch_until = HELD_WATCH      # seconds from the start an attacker may take to be ended
    reads = True                  # the attackers read what they are sent
    probe = None                  # a request each attacker not yet ended sends at watch_until
    slowest_mark_ms = SLOWEST_MARK_MS   # None: no mark (the server itself was down)
    errors_allowed = False        # the honest client's errors are the answer the attack expects

    def __init__(self, stage):
        self.stage = stage
        self.attackers = Attackers(self.reads)
        self.threads = []         # bench threads the attack started: stopped by close()
        self.honest_client = None

    def prepare(self):
        """Before the attack: the honest client connected."""
        self.honest_client = HonestProcess(self.stage.pool.addr, self.stage.token,
                                           self.stage.password, self.transactions)

    def start(self):
        """Start the attack (its clock too: the attackers' times count from here); return
        once it bites."""
        self.attackers.started = time.monotonic()
        self.bite()

    def bite(self):
        """What the attack does first; each attack says."""

    def honest(self):
        return self.honest_client.pairs(self.stage.pairs, self.honest_within)

    def finish(self):
        """Stop what is still being sent; wait for the pool to end the attackers, then (with
        a probe) have those it has not ended ask, and hear what they are told."""
        for thread in self.threads:
            thread.stop()
        self.attackers.wait_ended(self.watch_until)
        if self.probe is None:
            return self.attackers.outcome()
        asked = self.attackers.ask(self.probe)
        self.attackers.wait_ended(self.watch_until + PROBE_WITHIN)
        return self.attackers.outcome(f"{asked} asked at {self.watch_until:.0f} s")

    def note(self):
        """(an attack's own figure, as text; how bad it is, to pick the worst run: 0 is fine)"""
        return "", 0

    def close(self):
        for thread in self.threads:
            thread.stop()
        self.attackers.close()
        if self.honest_client:
            self.honest_client.close()

    # shared by the attacks
    def control(self):
        """A connection of the bench's own straight to redis-server, for setup."""
        return contextlib.closing(RedisControl(self.stage.redis.addr))


def set_request(key, size, sent=None):
    """A SET of `size` bytes of value, or its first `sent` bytes."""
    whole = command(b"SET", key, b"v" * size)
    return whole if sent is None else whole[:sent]


class NonReader(Attack):
    """A client SETs a 1 MB value, then pipelines 200,000 GETs of it (written as fast as the
    socket takes them) and never reads a reply. Attacker: when the pool closed it, what it
    had written."""
    name, runs, reads = "non-reader", 5, False
    value_size, gets = 1 << 20, 200_000
    should_end = False   # a pool may stop reading it instead: that costs it alone
    watch_until = 5.0

    def bite(self):
        sock, = self.attackers.connect(self.stage.pool.addr, 1)
        sock.sendall(set_request(b"big", self.value_size))
        if read_resp(Replies(sock)) != b"+OK\r\n":
            raise RuntimeError("the attacker's SET was not stored")
        self.attackers.watch()
        self.writer = Writer([sock], command(b"GET", b"big"), self.gets, within=HOLD_WATCH)
        self.threads.append(self.writer)
        self.writer.start()
        self.writer.wait_sent(min(self.writer.total, 1 << 20), within=5.0)

    def finish(self):
        self.writer.stop()
        self.attackers.wait_ended(self.watch_until)
        self.attackers.read_said_after_close()
        return self.attackers.outcome(f"wrote {self.writer.sent_bytes() / 1e6:.1f} of "
                                      f"{self.writer.total / 1e6:.1f} MB")


class HalfRequests(Attack):
    """200 clients each write 999,000 bytes of a 1 MB SET and hold."""
    name = "half-requests"
    clients, value_size, sent = 200, 1_000_000, 999_000

    def bite(self):
        socks = self.attackers.connect(self.stage.pool.addr, self.clients)
        self.attackers.watch()
        self.writer = Writer(socks, set_request(b"half", self.value_size, self.sent),
                             within=self.watch_until)
        self.threads.append(self.writer)
        self.writer.start()
        self.writer.wait_sent(self.writer.total, within=self.watch_until / 2)

    def finish(self):
        outcome = super().finish()
        outcome["summary"] += f"; wrote {self.writer.sent_bytes() / 1e6:.0f} MB"
        return outcome


class HalfCommand(Attack):
    """200 clients each write `*3\\r\\n$3\\r\\nSET\\r\\n$1\\r\\nk` and hold."""
    name = "half-command"
    clients = 200

    def bite(self):
        self.attackers.connect(self.stage.pool.addr, self.clients, b"*3\r\n$3\r\nSET\r\n$1\r\nk")
        self.attackers.watch()


class HugeBulk(Attack):
    """As many clients as the pool has connections (`--size 2`) each announce a 512 MB value
    in a SET, then send nothing more."""
    name = "huge-bulk"
    serve_options = ("--size", "2")
    clients = 2
    head = b"*3\r\n$3\r\nSET\r\n$4\r\nhuge\r\n$%d\r\n" % (512 << 20)

    def bite(self):
        self.attackers.connect(self.stage.pool.addr, self.clients, self.head)
        self.attackers.watch()


class Trickle(threading.Thread):
    """One byte a second to each socket until it fails or stop()."""

    def __init__(self, socks, every=1.0):
        super().__init__(daemon=True)
        self.socks, self.every = list(socks), every
        self._stopping = threading.Event()

    def run(self):
        while self.socks and not self._stopping.wait(self.every):
            for sock in list(self.socks):
                try:
                    sock.send(b"v")
                except OSError:   # closed, or full: either way it is past trickling
                    self.socks.remove(sock)

    def stop(self):
        self._stopping.set()
        self.join(JOIN_WITHIN)


class HugeBulkTrickle(HugeBulk):
    """huge-bulk, then a byte of the value a second from each client."""
    name = "huge-bulk-trickle"

    def bite(self):
        super().bite()
        self.threads.append(Trickle(self.attackers.socks))
        self.threads[-1].start()


class InlineFlood(Attack):
    """A client writes an inline line of 1 GB with no newline as fast as it can, until the
    pool answers or closes, or a few seconds pass."""
    name = "inline-flood"
    megabytes, within = 1024, 5.0

    def bite(self):
        socks = self.attackers.connect(self.stage.pool.addr, 1)
        self.attackers.watch()
        self.writer = Writer(socks, b"A" * (1 << 20), self.megabytes, within=self.within,
                             until_answered=True)
        self.threads.append(self.writer)
        self.writer.start()
        self.writer.wait_sent(1 << 20, within=self.within)

    def finish(self):
        self.writer.join(self.within + JOIN_WITHIN)
        outcome = super().finish()
        answered = list(self.writer.answered_at.values())
        outcome["summary"] += (f"; wrote {self.writer.sent_bytes() / 1e6:.2f} MB"
                               + (f", answered at {answered[0]:.2f} s" if answered else ""))
        return outcome


class IdleMulti(Attack):
    """As many clients as the pool has connections (`--size 2`) send MULTI, then silence."""
    name = "idle-multi"
    serve_options = ("--size", "2")
    clients, opening, watch_until = 2, (b"MULTI",), HOLD_WATCH
    probe = command(b"EXEC")

    def bite(self):
        socks = self.attackers.connect(self.stage.pool.addr, self.clients, command(*self.opening))
        for sock in socks:
            if read_resp(Replies(sock)) != b"+OK\r\n":
                raise RuntimeError(f"{self.opening[0].decode()} was not accepted")
        self.attackers.watch()


class IdleWatch(IdleMulti):
    """idle-multi with WATCH k."""
    name = "idle-watch"
    opening, probe = (b"WATCH", b"k"), command(b"MULTI")


class DedicatedMulti(Attack):
    """64 clients (serve's default --dedicated) each open a transaction and hold it; the
    honest client's pairs are MULTI, SET, EXEC then GET: each should be served, or told why
    within the pool's wait for a connection of its own."""
    name = "dedicated-multi"
    clients, opening, transactions = 64, (b"MULTI",), True
    # told clearly within the pool's wait for a connection of its own (README), or served
    errors_allowed, slowest_mark_ms = True, 5000 + SLOWEST_MARK_MS
    watch_until, probe = HOLD_WATCH, command(b"EXEC")
    honest_within = HOLD_WATCH + 10.0   # once the holders lose their connections, it goes on

    def bite(self):
        socks = self.attackers.connect(self.stage.pool.addr, self.clients, command(*self.opening))
        if self.opening[0] == b"MULTI":
            for sock in socks:
                read_resp(Replies(sock))   # +OK, or the refusal watch() would miss
        self.attackers.watch()
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:   # until the pool has lent them all
            if self.stage.pool.stats().get("dedicated.open", 0) >= self.clients:
                break
            time.sleep(0.05)


class DedicatedBlpop(DedicatedMulti):
    """dedicated-multi with BLPOP q 0, a wait with no end: the pool has no reason to end it."""
    name = "dedicated-blpop"
    opening, should_end, probe = (b"BLPOP", b"q", b"0"), False, None
    honest_within = watch_until = 12.0


class SlowSubscriber(Attack):
    """A subscriber reads nothing for 2 s while 1,500 messages of 10 KB are published
    through the pool, then reads until nothing comes for a moment (it has caught up); then
    10 more are published: how many it got of each, and whether the pool ended it with an
    error."""
    name = "slow-subscriber"
    messages, size, later, asleep, quiet = 1500, 10_000, 10, 2.0, 0.5
    should_end = False

    def bite(self):
        self.subscriber, = self.attackers.connect(self.stage.pool.addr, 1,
                                                  command(b"SUBSCRIBE", b"news"))
        self.frames = Frames(resp.RESP.reply_parser)   # kept across reads: a timeout loses nothing
        self.subscriber.settimeout(REPLY_TIMEOUT)
        self.next_message()   # the confirmation: it is subscribed
        self.subscribed = time.monotonic()
        self.publisher = socket.create_connection(self.stage.pool.addr, timeout=REPLY_TIMEOUT)
        self.published = 0
        self.publishing = threading.Thread(target=self.publish, args=(0, self.messages),
                                           daemon=True)
        self.publishing.start()

    def publish(self, first, count, batch=50):
        """Messages first..first+count-1, pipelined in batches; each names its number, and
        each one redis-server says it delivered counts in .published."""
        replies = Replies(self.publisher)
        with contextlib.suppress(OSError, ValueError):
            for start in range(first, first + count, batch):
                numbers = range(start, min(start + batch, first + count))
                self.publisher.sendall(b"".join(
                    command(b"PUBLISH", b"news", b"%d:" % number + b"m" * self.size)
                    for number in numbers))
                for _ in numbers:
                    self.published += read_resp(replies) == b":1\r\n"

    def next_message(self):
        while (message := self.frames.take()) is None:
            data = self.subscriber.recv(CHUNK)
            if not data:
                raise ConnectionResetError("the pool closed the subscriber's connection")
            self.frames.feed(data)
        return message

    def read_messages(self, numbers, quiet, until):
        """Messages read until `quiet` seconds pass with none, or `until`; the numbers of
        those it got go into `numbers`. The error that ended it, or ""."""
        self.subscriber.settimeout(quiet)
        try:
            while time.monotonic() < until:
                message = self.next_message()
                if message.startswith(b"-"):
                    return message[1:].split(b"\r\n", 1)[0].decode(errors="replace")
                payload = message.rsplit(b"\r\n", 2)[-2]
                numbers.add(int(payload.split(b":", 1)[0]))
        except TimeoutError:
            return ""
        except (OSError, ValueError) as error:
            return one_line(error)
        return ""

    def finish(self):
        self.publishing.join(HONEST_WITHIN)
        time.sleep(max(0.0, self.subscribed + self.asleep - time.monotonic()))
        asleep, after = set(), set()
        said = self.read_messages(asleep, self.quiet, time.monotonic() + HONEST_WITHIN)
        if not said and not self.publishing.is_alive():
            self.publish(self.messages, self.later)
            said = self.read_messages(after, 2.0, time.monotonic() + 5.0)
        self.got, self.ended = (len(asleep), len(after)), bool(said)
        ended = "ended" if said else "open"
        return {"summary": f"{ended}; got {len(asleep)}/{self.messages} sent while it slept, "
                           f"{len(after)}/{self.later} after ({self.published} delivered)",
                "said": said, "of": 1,
                "held": 0, "closed": int(bool(said)), "last_end_s": None}

    def note(self):
        asleep, after = self.got
        # one ended with an error is what redis-server does past its limit: no loss to report
        return (f"{asleep}/{self.messages} while asleep, {after}/{self.later} after catching up",
                0 if self.ended else self.later - after)

    def close(self):
        super().close()
        with contextlib.suppress(AttributeError):
            self.publisher.close()


class PipelineHog(Attack):
    """Over a relay whose every reply leaves 50 ms after the one before (`--size 1`), a
    client pipelines 200 GETs; then 5 honest clients each send one GET. The honest figures
    are theirs: how many got their value, and the slowest; the mark is all 5 within 0.5 s."""
    name = "pipeline-hog"
    relay = {"reply_delay": 0.05}
    serve_options = ("--size", "1")
    hogged, honest_clients, mark = 200, 5, 0.5
    should_end, slowest_mark_ms = False, mark * 1000

    def prepare(self):
        with self.control() as control:
            control.command("SET hog x")
            for index in range(self.honest_clients):
                control.command(f"SET polite:{index} value-{index}")
        self.polite = [socket.create_connection(self.stage.pool.addr, timeout=REPLY_TIMEOUT)
                       for _ in range(self.honest_clients)]

    def bite(self):
        self.hog, = self.attackers.connect(self.stage.pool.addr, 1,
                                           command(b"GET", b"hog") * self.hogged)
        self.hog_got = []
        self.hog_reader = threading.Thread(target=self.read_hog, daemon=True)
        self.hog_reader.start()
        time.sleep(0.1)   # its requests reach the pool first

    def read_hog(self):
        replies = Replies(self.hog)
        started = time.monotonic()
        with contextlib.suppress(OSError, ValueError):
            while len(self.hog_got) < self.hogged:
                read_resp(replies)
                self.hog_got.append(time.monotonic() - started)

    def honest(self):
        times, outcomes = {}, collections.Counter()
        started = time.monotonic()
        for index, sock in enumerate(self.polite):
            sock.sendall(command(b"GET", b"polite:%d" % index))

        def wait(index, sock):
            try:
                reply = read_resp(Replies(sock))
            except (OSError, ValueError) as error:
                outcomes[one_line(error)] += 1
                return
            times[index] = time.monotonic() - started
            outcomes[judged(reply, bulk(b"value-%d" % index)) or "right"] += 1

        waiters = [threading.Thread(target=wait, args=pair) for pair in enumerate(self.polite)]
        for waiter in waiters:
            waiter.start()
        for waiter in waiters:
            waiter.join(2 * REPLY_TIMEOUT)
        self.within_mark = sum(1 for seconds in times.values() if seconds <= self.mark)
        self.slowest = max(times.values(), default=None)
        right, wrong = outcomes.pop("right", 0), outcomes.pop("wrong", 0)
        return {"of": self.honest_clients, "done": self.honest_clients, "right": right,
                "wrong": wrong, "errors": sum(outcomes.values()),
                "slowest_ms": None if self.slowest is None else self.slowest * 1000,
                "said": [f"{text} (x{count})" for text, count in outcomes.most_common(3)]}

    def finish(self):
        time.sleep(0.2)
        return {"summary": f"the hog had {len(self.hog_got)}/{self.hogged} replies",
                "said": "", "of": 1, "held": 0, "closed": 0, "last_end_s": None}

    def note(self):
        slowest = "-" if self.slowest is None else f"{self.slowest:.2f} s"
        return (f"{self.within_mark}/{self.honest_clients} GETs within {self.mark:g} s "
                f"(slowest {slowest})", self.honest_clients - self.within_mark)

    def close(self):
        super().close()
        for sock in getattr(self, "polite", ()):
            sock.close()
        if hasattr(self, "hog_reader"):
            self.attackers.close()   # ends its read
            self.hog_reader.join(JOIN_WITHIN)


class SlowUpstream(Attack):
    """Over a relay that trickles the reply to any request for key `slow` (a byte each
    10 ms), `--size 2`: a client GETs `slow` (1,000 bytes) while the honest client works."""
    name = "slow-upstream"
    relay = {"trickle_key": b"slow", "trickle_every": 0.01}
    serve_options = ("--size", "2")
    value_size = 1000
    should_end = False

    def bite(self):
        with self.control() as control:
            control.command("SET slow " + "s" * self.value_size)
        self.slow, = self.attackers.connect(self.stage.pool.addr, 1, command(b"GET", b"slow"))
        self.slow.settimeout(HELD_WATCH)
        self.slow_got = None
        self.slow_reader = threading.Thread(target=self.read_slow, daemon=True)
        self.slow_reader.start()
        time.sleep(0.1)   # its request is on its way up first

    def read_slow(self):
        started = time.monotonic()
        try:
            reply = read_resp(Replies(self.slow))
            said = judged(reply, bulk(b"s" * self.value_size)) or "its value"
        except (OSError, ValueError) as error:
            said = one_line(error)
        self.slow_got = (said, time.monotonic() - started)

    def finish(self):
        self.slow_reader.join(HELD_WATCH + JOIN_WITHIN)
        said, seconds = self.slow_got or ("nothing", None)
        told = said if said != "its value" else ""
        return {"summary": f"got {said if not told else 'an error'}"
                           + (f" at {seconds:.1f} s" if seconds is not None else ""),
                "said": told, "of": 1, "held": 0, "closed": 0, "last_end_s": seconds}

    def close(self):
        super().close()   # closes the slow client's socket, which ends its read
        if hasattr(self, "slow_reader"):
            self.slow_reader.join(JOIN_WITHIN)


class CrowdThread(threading.Thread):
    """crowd() on a thread of its own; its result in .result."""

    def __init__(self, *args, **kwargs):
        super().__init__(daemon=True)
        self.args_, self.kwargs_ = args, kwargs
        self.result = None

    def run(self):
        self.result = crowd(*self.args_, **self.kwargs_)

    def stop(self):
        self.join(2 * REPLY_TIMEOUT)


class Thousands(Attack):
    """4,000 clients connect at once, each sending PING, while the honest client works."""
    name = "thousands"
    clients, within = 4000, 20.0
    should_end = False

    def bite(self):
        self.crowd = CrowdThread(self.stage.pool.addr, self.clients, self.within)
        self.threads.append(self.crowd)
        self.crowd.start()
        time.sleep(0.1)

    def finish(self):
        self.crowd.stop()
        result = self.crowd.result or {"kinds": {}, "slowest_s": None}
        self.kinds = result["kinds"]
        slowest = result["slowest_s"]
        return {"summary": kinds_text(self.kinds)
                + ("" if slowest is None else f", slowest {slowest:.1f} s"),
                "said": "", "of": self.clients, "held": 0, "closed": 0, "last_end_s": slowest}

    def note(self):
        return "", self.clients - self.kinds.get("PONG", 0)


class FileLimit(Attack):
    """serve allowed 512 open files; the honest client connected first, then 1,000 clients
    each PING and idle: each should get PONG or the client limit's refusal within 2 s; then
    a new client, served or refused at once; then, once the crowd has left, a client that
    should be served again."""
    name = "file-limit"
    files, clients, within = 512, 1000, 2.0
    should_end = False

    def bite(self):
        self.crowd_socks = []
        self.first = crowd(self.stage.pool.addr, self.clients, self.within, self.crowd_socks)

    def finish(self):
        self.new = crowd(self.stage.pool.addr, 1, self.within)
        for sock in self.crowd_socks:
            sock.close()
        self.crowd_socks.clear()
        started, self.again = time.monotonic(), None
        while self.again is None and time.monotonic() - started < 10.0:
            if crowd(self.stage.pool.addr, 1, self.within)["kinds"].get("PONG"):
                self.again = time.monotonic() - started
            else:
                time.sleep(0.1)
        slowest = self.first["slowest_s"]
        return {"summary": kinds_text(self.first["kinds"])
                + ("" if slowest is None else f" (slowest {slowest:.2f} s)"),
                "said": "", "of": self.clients, "held": self.first["kinds"].get("nothing", 0),
                "closed": 0, "last_end_s": slowest}

    def note(self):
        new, slowest = self.new["kinds"], self.new["slowest_s"]
        when = "" if slowest is None else f" in {slowest * 1000:.0f} ms"
        again = "never" if self.again is None else f"after {self.again:.1f} s"
        silent = self.first["kinds"].get("nothing", 0) + new.get("nothing", 0)
        return (f"new client: {kinds_text(new)}{when}; served again {again}",
                silent + (self.again is None))

    def close(self):
        super().close()
        for sock in getattr(self, "crowd_socks", ()):
            sock.close()


class BusyRedisPy(threading.Thread):
    """redis-py (from the venv) doing SET+GET pairs of unique keys until stop(): counts of
    right, wrong, lost (a null where its value was: the SET went to a server since killed,
    which kept nothing) and errors, and the slowest pair."""

    def __init__(self, addr, token):
        super().__init__(daemon=True)
        try:
            import redis   # the venv's: only these attacks need it
        except ImportError:
            raise RuntimeError("needs redis-py: run the bench with .venv/bin/python "
                               "(make bench-attacks)") from None
        self.client = redis.Redis(host=addr[0], port=addr[1], socket_timeout=5.0,
                                  socket_connect_timeout=5.0)
        self.token = token
        self.counts = collections.Counter()
        self.errors = collections.Counter()
        self.slowest = 0.0
        self._stopping = threading.Event()

    def run(self):
        number = 0
        while not self._stopping.is_set():
            number += 1
            key = f"busy:{self.token}:{number}"
            value = f"{key}:{random.getrandbits(64):x}".encode()
            started = time.perf_counter()
            try:
                self.client.set(key, value)
                got = self.client.get(key)
                outcome = "right" if got == value else "lost" if got is None else "wrong"
            except Exception as error:   # redis-py's own errors: all are the pool's answers
                outcome = "error"
                self.errors[one_line(error)] += 1
            self.slowest = max(self.slowest, time.perf_counter() - started)
            self.counts[outcome] += 1

    def stop(self):
        self._stopping.set()
        self.join(4 * 5.0 + JOIN_WITHIN)   # redis-py retries a pair's timeout three times
        self.client.close()


class KillNine(Attack):
    """20 threads of redis-py do SET+GET pairs through the pool; 2 s in, redis-server is
    killed (SIGKILL) and another started on its port; 3 s more, then a new client should be
    served. Wrong must stay 0; lost values (the server that took them was killed) are not
    wrong."""
    name = "kill-9"
    threads_count, before, after = 20, 2.0, 3.0
    should_end, errors_allowed, slowest_mark_ms = False, True, None   # the server was down

    def prepare(self):
        self.busy = [BusyRedisPy(self.stage.pool.addr, f"{self.stage.token}:{index}")
                     for index in range(self.threads_count)]

    def hit(self):
        self.stage.redis.kill_and_restart()

    def bite(self):
        for thread in self.busy:
            thread.start()
        self.threads.extend(self.busy)
        time.sleep(self.before)
        self.hit()
        self.hit_at = self.before
        time.sleep(self.after)

    def honest(self):
        for thread in self.busy:
            thread.stop()
        counts, errors = collections.Counter(), collections.Counter()
        for thread in self.busy:
            counts.update(thread.counts)
            errors.update(thread.errors)
        self.lost = counts["lost"]
        done = sum(counts.values())
        return {"of": done, "done": done, "right": counts["right"], "wrong": counts["wrong"],
                "errors": counts["error"],
                "slowest_ms": max(thread.slowest for thread in self.busy) * 1000,
                "said": [f"{text} (x{times})" for text, times in errors.most_common(3)]}

    def finish(self):
        started, self.again = time.monotonic(), None
        client = HonestClient(self.stage.pool.addr, self.stage.token + ":after")
        try:
            while self.again is None and time.monotonic() - started < 15.0:
                if client.pairs(1, REPLY_TIMEOUT)["right"]:
                    self.again = time.monotonic() - started
                else:
                    time.sleep(0.2)
        finally:
            client.close()
        return {"summary": f"{self.name} at {self.hit_at:.0f} s", "said": "", "of": 1,
                "held": 0, "closed": 0, "last_end_s": None}

    def note(self):
        again = "never" if self.again is None else f"after {self.again:.1f} s"
        return f"{self.lost} lost; a new client served {again}", int(self.again is None)


class SigStop(KillNine):
    """kill-9's load, but redis-server is stopped (SIGSTOP) for 6 s, then continued."""
    name, stopped = "sigstop", 6.0

    def hit(self):
        pid = self.stage.redis.process.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(self.stopped)
        finally:
            os.kill(pid, signal.SIGCONT)


class AclInterleave(Attack):
    """serve with POOL_PASSWORD: 10 threads authenticate and do SET+GET pairs, each 10th pair
    AUTH again and SELECT another database (a key's value read back must be the one written
    in that database); 10 intruder threads meanwhile try a wrong password and then a GET,
    each refusal checked. Wrong counts a value out of place, or an intruder answered."""
    name, password = "acl-interleave", True
    workers, intruders, databases = 10, 10, 16
    should_end = False

    def prepare(self):
        self.stop_intruders = threading.Event()
        self.tries = collections.Counter()

    def honest(self):
        results = [None] * self.workers
        workers = [threading.Thread(target=self.work, args=(index, results), daemon=True)
                   for index in range(self.workers)]
        intruders = [threading.Thread(target=self.intrude, args=(index,), daemon=True)
                     for index in range(self.intruders)]
        for thread in workers + intruders:
            thread.start()
        for thread in workers:
            thread.join(HONEST_WITHIN + 2 * REPLY_TIMEOUT)
        self.stop_intruders.set()
        for thread in intruders:
            thread.join(2 * REPLY_TIMEOUT)
        figures = {"of": self.workers * self.stage.pairs, "done": 0, "right": 0, "wrong": 0,
                   "errors": 0, "slowest_ms": 0.0}
        said = collections.Counter()
        for result in filter(None, results):
            for name in ("done", "right", "wrong", "errors"):
                figures[name] += result[name]
            figures["slowest_ms"] = max(figures["slowest_ms"], result["slowest_ms"])
            said.update(result["said"])
        figures["said"] = [f"{text} (x{times})" for text, times in said.most_common(3)]
        return figures

    def work(self, index, results):
        client = HonestClient(self.stage.pool.addr, f"{self.stage.token}:{index}",
                              self.stage.password)
        held = {}   # database -> the value last written there under this worker's key
        database, key = 0, f"acl:{self.stage.token}:{index}".encode()
        figures = {"done": 0, "right": 0, "wrong": 0, "errors": 0, "slowest_ms": 0.0}
        said = collections.Counter()
        deadline = time.monotonic() + HONEST_WITHIN
        try:
            for number in range(self.stage.pairs):
                if time.monotonic() > deadline:
                    break
                started = time.perf_counter()
                try:
                    if client.sock is None:
                        client.connect()
                        database = 0
                    outcome = None
                    if number % 10 == 9:
                        database = (database + 1 + index) % self.databases
                        outcome = (judged(client.ask(b"AUTH", client.password.encode()),
                                          b"+OK\r\n")
                                   or judged(client.ask(b"SELECT", b"%d" % database), b"+OK\r\n")
                                   or judged(client.ask(b"GET", key),
                                             bulk(held[database]) if database in held
                                             else b"$-1\r\n"))
                    value = b"%d:%d:%x" % (database, number, random.getrandbits(64))
                    outcome = (outcome or judged(client.ask(b"SET", key, value), b"+OK\r\n")
                               or judged(client.ask(b"GET", key), bulk(value)) or "right")
                    if outcome == "right":
                        held[database] = value
                except (OSError, ValueError) as error:
                    outcome = one_line(error)
                    client.close()
                tally(figures, said, outcome, started)
        finally:
            client.close()
        figures["said"] = list(said.elements())
        results[index] = figures

    def intrude(self, index):
        while not self.stop_intruders.is_set():
            try:
                with socket.create_connection(self.stage.pool.addr, timeout=REPLY_TIMEOUT) as sock:
                    replies = Replies(sock)
                    for _ in range(5):
                        sock.sendall(command(b"AUTH", b"not-the-password")
                                     + command(b"GET", b"acl:%d" % index))
                        answers = (read_resp(replies), read_resp(replies))
                        refused = all(answer.startswith(b"-") for answer in answers)
                        self.tries["refused" if refused else "answered"] += 1
                        self.said = error_line(answers[0]), error_line(answers[1])
            except (OSError, ValueError) as error:
                self.tries[f"broke: {one_line(error)}"] += 1

    def finish(self):
        said = getattr(self, "said", ("", ""))
        return {"summary": f"{self.tries['refused']} wrong AUTH+GET refused, "
                           f"{self.tries['answered']} answered",
                "said": " / ".join(filter(None, said)), "of": self.intruders, "held": 0,
                "closed": 0, "last_end_s": None}

    def note(self):
        return "", self.tries["answered"]


ATTACKS = {attack.name: attack for attack in (
    NonReader, HalfRequests, HalfCommand, HugeBulk, HugeBulkTrickle, InlineFlood, IdleMulti,
    IdleWatch, DedicatedMulti, DedicatedBlpop, SlowSubscriber, PipelineHog, SlowUpstream,
    Thousands, FileLimit, KillNine, SigStop, AclInterleave)}


# --- one run --------------------------------------------------------------------------------

def stats_figures(stats):
    """What the table shows of a stats document: refusals by command summed, clients turned
    away, connections of a client's own open and waited for."""
    return {"refused": sum(value for name, value in stats.items()
                           if name.startswith("refused.") and isinstance(value, int)),
            "turned_away": stats.get("clients.turned_away"),
            "dedicated_open": stats.get("dedicated.open"),
            "dedicated_waiting": stats.get("dedicated.waiting")}


def run_once(attack_class, kind, run=0, pairs=PAIRS):
    """One run of an attack on one pool kind, from a fresh redis-server to its end: the
    record of what happened, or of why the run could not finish ("failed")."""
    record = {"attack": attack_class.name, "kind": kind, "run": run,
              "marks": {"slowest_ms": attack_class.slowest_mark_ms,
                        "errors_allowed": attack_class.errors_allowed,
                        "should_end": attack_class.should_end}}
    started = time.monotonic()
    password = f"pool-{random.getrandbits(64):x}" if attack_class.password else None
    token = f"{attack_class.name}:{kind}:{run}:{random.getrandbits(32):x}"
    try:
        with contextlib.ExitStack() as stack:
            redis = stack.enter_context(RedisServer())
            upstream = redis.addr
            if attack_class.relay is not None:
                upstream = stack.enter_context(SlowRelay(redis.addr, **attack_class.relay)).addr
            pool = stack.enter_context(Pool(kind, upstream, attack_class.serve_options,
                                            password=password, files=attack_class.files))
            attack = attack_class(Stage(redis, pool, kind, pairs, token, password))
            stack.callback(attack.close)
            attack.prepare()
            attack.start()
            record["honest"] = attack.honest()
            record["attacker"] = attack.finish()
            text, badness = attack.note()
            record["note"] = {"text": text, "badness": badness}
            record["stats"] = pool.stats()
            record["peak_rss_mb"] = pool.peak_rss_mb()   # just before it stops
            attack.close()
            record["log"] = pool.stop()
    except Exception as error:   # the bench goes on to the next run, saying why
        record["failed"] = one_line(error)
    record["seconds"] = time.monotonic() - started
    return record


# --- the table ------------------------------------------------------------------------------

def worst(records):
    """One row per (attack, kind), each figure at its worst over the runs that finished:
    the fewest right (of the pairs asked), the most wrong and errors, the slowest pair, the
    highest peak RSS, the attacker outcome held longest, the most refusals; the note of its
    worst run; and why any run could not finish."""
    groups = {}
    for record in records:
        groups.setdefault((record["attack"], record["kind"]), []).append(record)
    rows = []
    for (attack, kind), runs in groups.items():
        finished = [record for record in runs if "failed" not in record]
        row = {"attack": attack, "kind": kind, "runs": len(runs),
               "failed": [record["failed"] for record in runs if "failed" in record]}
        if finished:
            honest = [record["honest"] for record in finished]
            fewest = min(honest, key=lambda figures: figures["right"] / max(figures["of"], 1))
            stats = [stats_figures(record["stats"]) for record in finished]
            row.update(
                right=fewest["right"], of=fewest["of"],
                wrong=max(figures["wrong"] for figures in honest),
                errors=max(figures["errors"] for figures in honest),
                slowest_ms=max((figures["slowest_ms"] for figures in honest
                                if figures["slowest_ms"] is not None), default=None),
                said=next((figures["said"] for figures in honest if figures.get("said")), []),
                peak_rss_mb=max((record["peak_rss_mb"] for record in finished
                                 if record["peak_rss_mb"] is not None), default=None),
                attacker=max((record["attacker"] for record in finished),
                             key=lambda outcome: (outcome["held"], outcome["last_end_s"] or 0)),
                note=max((record["note"] for record in finished),
                         key=lambda note: note["badness"]),
                marks=finished[0].get("marks", {}),
                **{name: max((figures[name] for figures in stats if figures[name] is not None),
                             default=None) for name in stats[0]})
        rows.append(row)
    return rows


def cell(value, form="{:.0f}"):
    return "-" if value is None else form.format(value)


def past_marks(row):
    """What in a row is past the marks: a wrong value, an error (unless the attack expects
    them), a slow pair, a large pool, an attacker the pool should have ended and did not, an
    attack's own figure short of its target."""
    found = []
    marks = row.get("marks", {})
    slowest_mark = marks.get("slowest_ms", SLOWEST_MARK_MS)
    if row.get("wrong"):
        found.append(f"{row['wrong']} wrong")
    if row.get("errors") and not marks.get("errors_allowed"):
        found.append(f"{row['errors']} errors")
    if None not in (row.get("slowest_ms"), slowest_mark) and row["slowest_ms"] > slowest_mark:
        found.append(f"slowest pair {row['slowest_ms']:.0f} ms (mark {slowest_mark:.0f})")
    if row.get("peak_rss_mb") is not None and row["peak_rss_mb"] > RSS_MARK_MB:
        found.append(f"peak RSS {row['peak_rss_mb']:.0f} MB")
    if row.get("attacker") and marks.get("should_end", True) and row["attacker"]["held"]:
        found.append(f"{row['attacker']['held']} attackers never ended")
    if row.get("note", {}).get("badness"):
        found.append(row["note"]["text"])
    if row.get("failed"):
        found.append(f"{len(row['failed'])} runs failed")
    return found


def render(rows, title="Attacks on `python3 -m part3 serve`, each beside an honest client"):
    """The table, then what the attackers were told, the attacks' own figures, and every
    row past the marks."""
    body = []
    for row in rows:
        if "right" not in row:
            body.append([row["attack"], row["kind"], row["runs"]] + ["-"] * 8
                        + ["every run failed"])
            continue
        attacker = row["attacker"]
        dedicated = f"{cell(row['dedicated_open'])}/{cell(row['dedicated_waiting'])}"
        body.append([row["attack"], row["kind"], row["runs"], f"{row['right']}/{row['of']}",
                     row["wrong"], row["errors"], cell(row["slowest_ms"]),
                     cell(row["peak_rss_mb"]), cell(row["refused"]), cell(row["turned_away"]),
                     dedicated, attacker["summary"]])
    text = table(title + f" (worst of the runs; marks: a pair within {SLOWEST_MARK_MS:g} ms, "
                 f"the pool within {RSS_MARK_MB:g} MB)",
                 ["attack", "kind", "runs", "honest right", "wrong", "errors", "slowest ms",
                  "peak RSS MB", "refused", "turned away", "dedicated open/waiting",
                  "attackers"],
                 body, left_columns=2)
    said = [f"  {row['attack']}, {row['kind']}: {row['attacker']['said']}"
            for row in rows if row.get("attacker", {}).get("said")]
    honest_said = [f"  {row['attack']}, {row['kind']}: {'; '.join(row['said'])}"
                   for row in rows if row.get("said")]
    notes = [f"  {row['attack']}, {row['kind']}: {row['note']['text']}"
             for row in rows if row.get("note", {}).get("text")]
    marks = [f"  {row['attack']}, {row['kind']}: {', '.join(found)}"
             for row in rows if (found := past_marks(row))]
    failed = [f"  {row['attack']}, {row['kind']}: {reason}"
              for row in rows for reason in row["failed"]]
    for heading, lines in (("What the pool told the attackers", said),
                           ("What the honest clients were told", honest_said),
                           ("The attacks' own figures", notes),
                           ("Past the marks", marks), ("Runs that could not finish", failed)):
        if lines:
            text += f"\n{heading}:\n" + "\n".join(lines) + "\n"
    return text


# --- the command ----------------------------------------------------------------------------

def parse(argv):
    parser = argparse.ArgumentParser(
        prog="python3 -m bench.attacks",
        description="hostile clients against `python3 -m part3 serve`, each beside an honest "
                    "client; attacks: " + ", ".join(ATTACKS))
    parser.add_argument("--kind", choices=(*KINDS, "both"), default="both")
    parser.add_argument("--runs", type=int, default=None,
                        help="runs of each attack on each kind (default: the attack's own, "
                             "5 for non-reader, 2 for the rest)")
    parser.add_argument("--only", default=None, help="attacks by name, comma-separated")
    parser.add_argument("--pairs", type=int, default=PAIRS,
                        help="the honest client's SET+GET pairs (default %(default)s)")
    parser.add_argument("--json", default=None, metavar="FILE",
                        help="also write every run's record to FILE")
    options = parser.parse_args(argv)
    names = options.only.split(",") if options.only else list(ATTACKS)
    unknown = [name for name in names if name not in ATTACKS]
    if unknown:
        parser.error(f"no such attack: {', '.join(unknown)} (there are {', '.join(ATTACKS)})")
    options.attacks = [ATTACKS[name] for name in names]
    options.kinds = KINDS if options.kind == "both" else (options.kind,)
    return options


def main(argv=None):
    options = parse(sys.argv[1:] if argv is None else argv)
    raise_open_file_limit()   # thousands of clients on this side too
    started, records = time.monotonic(), []
    for attack in options.attacks:
        runs = options.runs or attack.runs
        for run in range(runs):
            for kind in options.kinds:
                progress(f"attacks: {attack.name} on {kind}, run {run + 1}/{runs}")
                records.append(run_once(attack, kind, run, options.pairs))
                if "failed" in records[-1]:
                    progress(f"attacks: {attack.name} on {kind}: {records[-1]['failed']}")
    seconds = time.monotonic() - started
    print(render(worst(records)))
    print(f"{len(records)} runs in {seconds / 60:.1f} minutes; load average at the end "
          f"{os.getloadavg()[0]:.1f}")
    if options.json:
        with open(options.json, "w", encoding="utf-8") as output:
            json.dump({"argv": sys.argv, "seconds": seconds, "records": records}, output,
                      indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
