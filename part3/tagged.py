"""tagged: request ids over one connection, so replies may come back in any order.

Part two matched replies to calls by their order on the wire, so a slow request
held up every reply behind it, and a timed-out call's late reply still owned the
connection until it arrived. Here each request carries an id chosen by the
client, its reply carries the same id back, and the order on the wire no longer
means anything.

The protocol: a request is `<id> <line>\\n`, its reply `<id> <reply line>\\n`, the id
in decimal digits (no sign, no leading zero). The reply line is tcp_proxy.answer()'s.

Map of the module, in reading order:

    parse_tagged()     splits `<id> <rest>` and refuses anything else
    TaggedUpstream     a Server that answers each request on its own thread, after
                       a per-key delay (real seconds, for the bench) and a pause(key)
                       hook (for the demo and the tests), so replies leave out of
                       order; tagged=False is the untagged twin, which must still
                       write its replies in arrival order (pipelining)
    TaggedError        CallTimeout, ConnectionBroken: what a caller of call() can see
    TaggedClient       ONE connection; call(line) from any number of threads; a
                       reader thread hands each reply to the call that owns its id

The order a call takes through TaggedClient:
    call(line) -> a fresh id, registered as owed -> `<id> <line>` written whole
    -> wait on the condition -> the reader thread parses `<id> <reply>`, finds the
    owed call, hands it the reply -> call() returns the reply line without the id

What is out of step (the connection is destroyed, every owed call fails):
a reply whose id no call is owed (unknown, or answered already: a duplicate),
a line that is not `<id> <reply>`, a line longer than MAX_LINE, a request the
call's deadline cut off mid-write. A reply whose id belongs to a call that timed
out is simply dropped: ids are never reused on a connection, so no later call can
take it for its own. Such replies are owed for a bounded time and count: one still
missing overdue_timeout after its call gave up, or more than ABANDONED_MAX of them,
ends the connection (the upstream has lost replies), as in Part two.
"""
import collections
import contextlib
import itertools
import re
import select
import socket
import threading
import time

from part2.managed import ABANDONED_MAX   # Part two's bound on replies owed to nobody
from ground.frames import LineTooLong
from ground.server import Hooks, host_and_port, ready, Server, shutdown
from tcp_proxy import answer, loggable, read_lines

MAX_OWED = 1024        # calls owed on one connection (waiting or timed out, not yet answered)
MAX_IN_FLIGHT = 256    # requests one upstream connection answers at once; past it, it stops reading
MAX_ANSWERING = 1024   # request threads one TaggedUpstream runs at once over all its connections;
                       # past it, every connection's reader waits for one to end
OVERDUE_TIMEOUT = 5.0  # seconds a timed-out call's reply may still take before the connection ends

ID = re.compile(rb"(0|[1-9][0-9]{0,17}) (.*)", re.DOTALL)   # at most 18 digits: a plain int


def parse_tagged(line):
    """(id, rest) of a `<id> <rest>` line without its b"\\n"; ValueError for anything else."""
    match = ID.fullmatch(line)
    if not match:
        raise ValueError(f"expected '<id> <line>', got {line[:40]!r}")
    return int(match.group(1)), match.group(2)


def key_of(line):
    """The key a request asks for (`GET key` -> "key"); "" for anything else."""
    words = line.rstrip(b"\r").split(b" ")
    return words[1].decode("utf-8", "replace") if len(words) == 2 and words[0] == b"GET" else ""


# --- the upstream ---------------------------------------------------------------------

class TaggedUpstream(Server):
    """The line protocol with ids: each request answered on its own thread, so a
    reply leaves as soon as it is ready, whatever came before it.

    delays={"slow": 0.2}   seconds (real time) before the reply to `GET slow`; the
                           bench's knob. close() cuts a delay short.
    pause(key)             called on the request's thread before its reply is written
                           (after the delay); scaffolding for the demo and the tests,
                           which hold a reply on a hook instead of a sleep
    tagged=False           the untagged twin: plain lines, each reply still computed on
                           its own thread after its delay, but written in arrival order,
                           as a pipelined protocol without ids must
    answering_max=N        request threads at once over all connections (MAX_ANSWERING)
    """
    counters = {**Server.counters, "requests": 0, "ready": 0, "replies": 0}
    # requests  request lines parsed (id included); bumped by the reader after `parsed` has it
    # ready     replies whose delay and pause are over; bumped on the request's thread
    # replies   reply lines written whole; bumped after sendall(), once `written` has it

    def __init__(self, delays=None, pause=None, tagged=True, answering_max=MAX_ANSWERING):
        super().__init__()
        self.delays, self.tagged = dict(delays or {}), tagged
        self.pause = pause or (lambda key: None)
        # the latest request lines and reply lines, as loggable() keeps them, in order
        self.parsed = collections.deque(maxlen=1000)
        self.written = collections.deque(maxlen=1000)
        # held by every request thread, over all connections; a reader waits for one to be free
        self._answering = threading.BoundedSemaphore(answering_max)

    def handle(self, conn):
        """Read requests; give each its own thread. A connection with MAX_IN_FLIGHT
        requests unanswered is not read until one is answered (the bound), and no
        connection is read while answering_max threads answer (the bound over all)."""
        in_flight = threading.BoundedSemaphore(MAX_IN_FLIGHT)
        order = Turns()      # tagged=False: replies leave in the order of arrival
        write_lock = threading.Lock()   # one reply's bytes go out whole
        answering = []       # this connection's request threads, joined before it closes
        try:
            for number, line in enumerate(read_lines(conn)):
                self.parsed.append(loggable(line))
                self.count("requests")
                in_flight.acquire()   # the bound; every holder ends (close() cuts delays short)
                self._answering.acquire()   # the bound over all connections; every holder ends too
                try:
                    answering.append(self.spawn(self._answer, conn, line, number, order, write_lock,
                                                in_flight))
                except RuntimeError:   # no thread to be had: its slots are free again
                    in_flight.release()
                    self._answering.release()
                    raise
        finally:
            for thread in answering:   # at EOF the replies owed are written, then it closes
                thread.join()

    def _answer(self, conn, line, number, order, write_lock, in_flight):
        """Answer one request on its own thread: delay, pause, then write (in turn if untagged)."""
        try:
            request_id, request = None, line
            if self.tagged:
                try:
                    request_id, request = parse_tagged(line)
                except ValueError as error:   # no id to answer with: the client is out of step
                    request = None
                    reply = b"ERR %s\n" % str(error).encode()
            if request is not None:
                reply = answer(request)
            key = key_of(request or b"")
            self._delay(self.delays.get(key, 0.0))
            self.pause(key)
            self.count("ready")
            if request_id is not None:
                reply = b"%d %s" % (request_id, reply)
            if not self.tagged:
                order.wait_turn(number)   # the load-bearing wait of in-order pipelining
            with write_lock, contextlib.suppress(OSError):   # a client that has gone reads nothing
                conn.sendall(reply)
                self.written.append(loggable(reply).rstrip("\n"))
                self.count("replies")
        finally:
            order.done(number)   # even a failed reply ends its turn: none after it waits for ever
            in_flight.release()
            self._answering.release()

    def _delay(self, seconds):
        """Wait `seconds` of real time, or less if close() comes first."""
        with self._lock:
            self._lock.wait_for(lambda: self.closed, seconds)


class Turns:
    """tagged=False: reply number n may be written once replies 0..n-1 have been.
    Each reply's turn ends (done()) whatever happened to it, so no wait is for ever."""

    def __init__(self):
        self._changed = threading.Condition()   # notified by done()
        self.finished = set()   # reply numbers whose turn is over
        self.next = 0           # the lowest number not finished: whose turn it is

    def wait_turn(self, number):
        with self._changed:
            self._changed.wait_for(lambda: self.next == number)

    def done(self, number):
        with self._changed:
            self.finished.add(number)
            while self.next in self.finished:
                self.finished.discard(self.next)
                self.next += 1
            self._changed.notify_all()


# --- the client -----------------------------------------------------------------------

class TaggedError(Exception):
    """A call that did not get its reply."""


class CallTimeout(TaggedError):
    """No reply within msg_timeout; the connection goes on, and the late reply will be dropped."""


class ConnectionBroken(TaggedError):
    """The connection ended, or went out of step, before this call's reply came."""


class Call:
    """One owed call: its reply, or the error that ends it."""

    def __init__(self):
        self.reply, self.error = None, None

    @property
    def settled(self):
        return self.reply is not None or self.error is not None


class TaggedClient(Hooks):
    """One connection to a tagged upstream, shared by every thread that calls.

    call(line) may run in many threads at once; each gets the reply that carries
    its own id, whatever order the replies arrive in. msg_timeout < 0 waits for ever;
    otherwise a call gives up after msg_timeout seconds with CallTimeout, and the
    connection goes on. The deadline covers the whole call: the wait for a turn to
    write, the write (a request cut off mid-write breaks the connection: it is out of
    step) and the reply. A reply out of step breaks the connection: every owed call
    fails with ConnectionBroken, and so does every later call. So do too many
    timed-out calls' replies owed (ABANDONED_MAX), or one overdue_timeout late.
    close() ends it.
    """
    counters = {"sent": 0, "replies": 0, "timeouts": 0, "dropped": 0, "broken": 0}
    # sent      requests written whole; bumped by _send()
    # replies   replies handed to their calls; bumped by the reader thread
    # timeouts  calls that gave up; bumped by call() as it leaves the reply to be dropped
    # dropped   late replies of timed-out calls thrown away; bumped by the reader thread
    # broken    1 once the connection has ended; bumped by _break()
    # callback(client, event): ("sent", request with its id) just before it is written,
    # ("got", line) for each reply line the reader takes; pictures/ draws through it
    on_event = None

    def __init__(self, addr, msg_timeout=-1, overdue_timeout=OVERDUE_TIMEOUT):
        super().__init__()
        self.msg_timeout = msg_timeout
        self.overdue_timeout = overdue_timeout
        self.sock = socket.create_connection(host_and_port(addr), timeout=Hooks.hook_timeout)
        self.sock.settimeout(None)   # from here on the reader waits as long as calls are owed
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.owed = {}           # id -> Call: sent (or being sent), reply not yet in
        self.abandoned = {}      # timed-out calls: id -> when its reply is overdue (monotonic)
        self.failure = None      # why the connection ended; set once, by _break()
        self._ids = itertools.count(1)   # never reused: a late reply can match no other call
        self._lock = threading.Condition()   # guards the above; notified when a call settles
        self._send_lock = threading.Lock()   # one request's bytes go out whole
        self._reader = threading.Thread(target=self._read_replies, daemon=True)
        self._reader.start()

    def call(self, line, msg_timeout=None):
        """Send one request line (with its b"\\n", no id); return its reply line without
        the id, b"\\n" included. Raises CallTimeout or ConnectionBroken.
        msg_timeout, if given, replaces the client's for this call alone."""
        if not line.endswith(b"\n") or b"\n" in line[:-1]:
            raise ValueError(f"a request is one line ending in b'\\n', not {line[:40]!r}")
        if msg_timeout is None:
            msg_timeout = self.msg_timeout
        # from the call's start
        deadline = None if msg_timeout < 0 else time.monotonic() + msg_timeout
        call = Call()
        with self._lock:
            self._end_if_overdue()
            if self.failure:
                raise ConnectionBroken(self.failure)
            if len(self.owed) + len(self.abandoned) >= MAX_OWED:
                raise TaggedError(f"{MAX_OWED} calls already owed on this connection")
            request_id = next(self._ids)
            self.owed[request_id] = call   # registered before it is sent: the reply may be quick
        try:
            self._send(b"%d %s" % (request_id, line), deadline)
        except OSError as error:   # this call is owed, so _break() fails it too
            self._break(f"sending failed: {error}")
        with self._lock:
            while not call.settled:
                overdue_at = self._end_if_overdue()   # ending the connection fails this call too
                if call.settled:
                    break
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    self._abandon(request_id)
                    break
                wakes = [moment - now for moment in (deadline, overdue_at) if moment is not None]
                self._lock.wait(max(min(wakes), 0) if wakes else None)
        if not call.settled:
            self.count("timeouts")
            raise CallTimeout(f"no reply within {msg_timeout:g} s")
        if call.error:
            raise ConnectionBroken(call.error)
        return call.reply

    def _send(self, request, deadline):
        """Write the request whole before the deadline (None: however long it takes), one
        writer at a time. If the deadline comes before anything is written, the call just
        times out; once part of it is on the wire, it raises TimeoutError: out of step."""
        wait = -1 if deadline is None else max(deadline - time.monotonic(), 0)
        if not self._send_lock.acquire(timeout=wait):
            return
        try:
            self._tell("sent", request)   # with its id, before a byte of it is written
            unsent = memoryview(request)
            while True:
                with contextlib.suppress(BlockingIOError):   # the upstream's buffers are full
                    unsent = unsent[self.sock.send(unsent, socket.MSG_DONTWAIT):]
                if not unsent:
                    break
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0 and len(unsent) == len(request):
                    return   # nothing of it went out: the connection is still in step
                if wait is not None and wait <= 0:
                    raise TimeoutError(f"the deadline came with {len(unsent)} of {len(request)} "
                                       f"bytes unsent")
                ready(self.sock, select.POLLOUT, wait)
            self.count("sent")
        finally:
            self._send_lock.release()

    def _abandon(self, request_id):
        """With the lock held: a call gave up. Its reply, when it comes, is dropped by id;
        past ABANDONED_MAX such replies owed, the connection ends."""
        del self.owed[request_id]
        self.abandoned[request_id] = time.monotonic() + self.overdue_timeout
        if len(self.abandoned) > ABANDONED_MAX:
            self._break(f"more than {ABANDONED_MAX} timed-out calls' replies owed")
        self._lock.notify_all()   # a waiting call has a new moment to wake at: this overdue time

    def _end_if_overdue(self):
        """With the lock held: end the connection if a timed-out call's reply is overdue;
        else return when the first one will be (None if none is owed)."""
        overdue_at = min(self.abandoned.values(), default=None)
        if overdue_at is not None and time.monotonic() >= overdue_at:
            self._break(f"a timed-out call's reply is more than {self.overdue_timeout:g} s late")
            return None
        return overdue_at

    def _read_replies(self):
        """The reader thread: hand each reply to the call that owns its id."""
        try:
            for line in read_lines(self.sock):
                self._tell("got", line)
                reply_id, reply = parse_tagged(line)   # ValueError: out of step
                with self._lock:
                    call = self.owed.pop(reply_id, None)
                    if call is not None:
                        call.reply = reply + b"\n"
                        self._lock.notify_all()
                    elif reply_id in self.abandoned:
                        del self.abandoned[reply_id]
                    else:
                        raise ValueError(f"a reply for id {reply_id}, which no call is owed")
                    # counted under the lock, so a caller that has its reply sees the count
                    self.count("replies" if call is not None else "dropped")
            self._break("the upstream closed the connection")
        except (ValueError, LineTooLong) as error:   # LineTooLong is a ValueError too
            self._break(f"out of step: {error}")
        except OSError as error:
            self._break(f"connection failed: {error}")

    def _tell(self, *event):
        if self.on_event:
            self.on_event(self, event)

    def _break(self, reason):
        """End the connection: every owed call fails with `reason`; so does every later call."""
        with self._lock:
            if self.failure:
                return
            self.failure = reason
            for call in self.owed.values():
                call.error = reason
            self.owed.clear()
            self.abandoned.clear()
            self.count("broken")   # under the lock: a failed caller sees it counted
            self._lock.notify_all()
        shutdown(self.sock)   # the reader (if it is not the caller) sees EOF and ends

    def close(self):
        """End the connection, fail what is owed, join the reader. Calling it again does nothing."""
        self._break("the client was closed")
        self._reader.join()
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
