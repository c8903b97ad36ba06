"""connection: one upstream connection of a ManagedClient, its whole life on the loop.

    start_connect()  a non-blocking connect begun (scaffolding of the socket API)
    Connection       connecting (the connect, then the initial ping if asked) -> up ->
                     ended; its Pipeline (the runs it owes replies to); the runs waiting
                     to be written; the deadlines it keeps on the loop's clock; end(),
                     the one way it ends, which fails what it owes
    Deadlines        the deadlines half of Connection (its base): the timer and the
                     opening deadline it owns, arm(), _check() and what each does

The order a run takes: take() (queued at once when up, else it waits) -> the turn's send
phase (flush(): one send) -> the upstream's replies, read by the turn (_read(): the
pipeline's feed()) -> the run's sink. The deadlines: the connect and the ping (the opening
run's), the oldest run owed (placed, plus msg_timeout), an abandoned run's missing reply
(msg_timeout later), the idle timeout. One timer is set, for the earliest; it may fire
early (the oldest run was answered meanwhile), and is then set again.
"""
import collections
import errno
import os
import socket

from part2.calls import (IGNORED, CommunicationError, MessageLost, MessageTimeout, Owing, Run,
                         reason_of)
from part2.clock import as_seconds, unlimited
from part2.loop import READ, WRITE
from part2.pipeline import OutOfStep, Pipeline

ABANDONED_MAX = 64      # abandoned runs one connection may owe; one more ends it (a memory bound)
OUT_MAX = 256 * 1024    # bytes of requests queued on a connection before the next runs wait
READ_SIZE = 256 * 1024  # bytes asked of one recv() from the upstream
WINDOW = 1 << 20        # bytes of a long reply its client may have unread before reading stops
PING = b"PING\n"        # the initial ping: a toy protocol request, and an inline command to Redis


def due(deadline, now):
    """True once a deadline (None: none) has come."""
    return deadline is not None and now >= deadline


def start_connect(addr):
    """A socket whose non-blocking connect to addr has begun: (socket, None), or (None, why
    not). A (host, port) of IPv6 connects as its 4-tuple does; a scope id is in the host."""
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(*addr[:2], type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as error:
        return None, reason_of(error)
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    failed = sock.connect_ex(sockaddr)
    if failed in (0, errno.EINPROGRESS):
        return sock, None
    sock.close()
    return None, os.strerror(failed)


class Deadlines:
    """A connection's deadlines (Connection's, by inheritance): the connect's and the initial
    ping's, each owed run's msg_timeout, the waiting runs', the idle timeout; one timer set
    for the earliest, and what each does once it has passed. It owns the timer and the
    opening run's deadline; the rest it reads of the connection it is part of."""

    def __init__(self, connect_deadline):
        self.connect_deadline = connect_deadline   # the opening run's: the connect and the ping
        self.timer = None                          # the loop's timer for the earliest deadline

    def disarm(self):
        """No deadline fires any more: the connection has ended."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def arm(self):
        """Set the timer for the earliest deadline kept, unless the one set fires no later."""
        due = self._next_deadline()
        if due is None or (self.timer is not None and self.timer.when <= due):
            return
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.loop.at(due, self._check)

    def _next_deadline(self):
        deadlines = [self.idle_deadline(), self.waiting[0].deadline if self.waiting else None]
        if not self.connected or self.ping and not self.ping.over():
            deadlines.append(self.connect_deadline)
        for run in self.pipeline.owed:   # abandoned runs come first: they are the oldest
            deadlines.append(run.overdue_at if run.abandoned else run.deadline)
            if not run.abandoned:
                break
        return min((deadline for deadline in deadlines if deadline is not None), default=None)

    def idle_deadline(self):
        idle_timeout = self.client.idle_timeout
        if self.state != "up" or self.pipeline.owed or self.waiting or idle_timeout <= 0 \
                or unlimited(idle_timeout):
            return None
        return self.idle_since + idle_timeout

    def _check(self):
        """The timer fired: end, abandon or fail whatever is due now, then set it again."""
        self.timer = None
        client, now = self.client, self.client.clock.now()
        timeout = as_seconds(client.msg_timeout)
        connecting = not self.connected or self.ping and not self.ping.over()
        if self.ended or connecting and self._connect_timed_out(now, timeout):
            return
        if not self._check_owed(now, timeout):
            return
        late = "still connecting after" if self.state == "connecting" else "request not sent within"
        while self.waiting and due(self.waiting[0].deadline, now):
            self._fail(self.waiting.popleft(), MessageTimeout(f"{late} {timeout}"))
        if (idle_end := self.idle_deadline()) is not None and now >= idle_end:
            self.end(f"idle for {as_seconds(client.idle_timeout)}")
            return
        self.arm()

    def _connect_timed_out(self, now, timeout):
        """The connect or the ping past the opening run's deadline ends the connection."""
        if not due(self.connect_deadline, now):
            return False
        if not self.connected:
            self.end("connect failed: timed out", CommunicationError("cannot connect: timed out"))
        else:
            self.end("initial ping not answered in time",
                     MessageTimeout(f"initial ping not answered within {timeout}"))
        return True

    def _check_owed(self, now, timeout):
        """The owed runs' deadlines, oldest first; False once the connection has ended."""
        owed, index = self.pipeline.owed, 0
        while index < len(owed):
            run = owed[index]
            if run.abandoned and now >= run.overdue_at:
                self.end("an abandoned call's reply is overdue",
                         MessageLost("a timed-out call's reply never came"))
            elif not run.abandoned and not due(run.deadline, now):
                return True
            elif not run.abandoned and not self.pipeline.is_written(run):   # part of it on the wire
                self._fail(run, MessageTimeout(f"request not sent within {timeout}"))
                self.end("a request not written in time",
                         MessageLost("a request not written in time closed the connection"))
            elif not run.abandoned:
                self._time_out(run, now, timeout)
            if self.ended:
                return False
            index += run.abandoned   # an abandoned run keeps its place; a forgotten one has left
        return True

    def _time_out(self, run, now, timeout):
        """An owed run's deadline has passed: what becomes of it and of the connection."""
        client = self.client
        request = b"".join(run.requests[run.answered:])
        error = MessageTimeout(f"no reply within {timeout}")
        if client.msg_timeout_is_fatal:   # Ocamlnet: the other calls on it are lost, not timed out
            self._fail(run, error)
            self.end("message timeout (fatal)",
                     MessageLost("another call's fatal message timeout closed the connection"))
        elif client.late_replies == "forget":   # scaffolding: the bug, as a real code path
            self._forget(run, error)
        else:   # its replies are still owed: thrown away as they come; they keep the client busy
            self._abandon(run, error, now)
        client._tell("timed out", self, request)

    def _forget(self, run, error):
        self.pipeline.drop(run)   # so the next reply goes to the run behind it
        self._fail(run, error)

    def _abandon(self, run, error, now):
        run.sink.failed(run, error)
        run.abandoned, run.overdue_at = True, now + self.client.msg_timeout
        self.abandoned += 1
        if self.abandoned > ABANDONED_MAX:
            self.end(f"more than {ABANDONED_MAX} abandoned calls owed",
                     MessageLost("too many replies overdue on the connection"))

    def _fail(self, run, error):
        self.pending -= run.owing_count()
        run.fail(error)


class Connection(Deadlines):
    """One connection's life (see the module's map). Its client holds the settings, the
    counters and the events; the connection changes them through the client's _move(),
    _tell() and _record_error(), and bumps its counters."""

    def __init__(self, client, deadline):
        super().__init__(deadline)
        self.client, self.loop = client, client.loop
        self.state = "connecting"
        self.sock = None
        fit = client.late_replies != "forget"   # scaffolding: the forgetful client checks nothing
        self.pipeline = Pipeline(client.framing, self._settled, check_fit=fit)
        self.waiting = collections.deque()   # runs placed, not yet queued: connecting, or no room
        self.ping = None
        self.connected = self.ended = False
        self.pending = 0         # requests placed here and not yet settled, abandoned ones included
        self.abandoned = 0       # runs owed whose callers gave up
        self.idle_since = None
        self.replied_now = False   # a reply came in the read being handled
        self.flushing = False    # listed for this turn's send phase
        self.inbox = None        # once connected: what each recv_into() fills (see _read())
        self.watching = 0        # the events the loop watches its socket for (Loop.want())
        self.paused = False      # not read while a long reply's client has its window full
        self.drained = None      # what to call once its queue is short again (a long request)

    # -- connecting --

    def open(self):
        self.sock, failed = start_connect(self.client.addr)
        if failed:
            self._connect_failed(failed)
            return
        self.loop.want(self, WRITE)   # writable once the connect is over, whatever its outcome
        self.arm()

    def _connect_failed(self, reason):
        self.end(f"connect failed: {reason}", CommunicationError(f"cannot connect: {reason}"))

    def _connect_over(self):
        if failed := self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            self._connect_failed(os.strerror(failed))
            return
        self.connected = True
        self.inbox = memoryview(bytearray(READ_SIZE))
        self.client.count("connects")
        self.loop.want(self, READ)
        if self.client.initial_ping:   # nothing else is written before it is answered
            self.ping = Run([PING], IGNORED, self.connect_deadline, is_ping=True)   # see _settled()
            self._send(self.ping)
        else:
            self._up("connected")

    def _up(self, reason):
        self.state = "up"
        self.idle_since = self.client.clock.now()
        self.client._move("up", reason)
        self.loop.flush_soon(self)   # the runs that waited go out in this turn's send phase
        self.arm()

    # -- runs in, bytes out --

    def take(self, run):
        """A run placed on this connection: queued at once, or after the runs waiting."""
        self.pending += len(run.requests)
        if self.state == "up" and not self.waiting and len(self.pipeline.out) < OUT_MAX:
            self._send(run)
        else:
            if self.state == "connecting":
                self.client.count("waiting")
            self.waiting.append(run)
        if run.deadline is not None and (self.timer is None or run.deadline < self.timer.when):
            self.arm()

    def _send(self, run):
        self.pending += self.pipeline.queue(run)   # the sync before it (a state) is owed too
        self.client.sent += len(run.requests)
        if self.client.on_event:
            self.client._tell("sent", self, run.data)
        if not self.flushing:
            self.loop.flush_soon(self)

    def flush(self):
        """The turn's one send: what is queued, and the waiting runs there is room for."""
        self.flushing = False
        pipeline = self.pipeline
        while self.waiting and self.state == "up" and len(pipeline.out) < OUT_MAX:
            self._send(self.waiting.popleft())
        if self.ended or not self.connected:
            return
        if pipeline.out:
            try:
                sent = self.sock.send(pipeline.out)
            except BlockingIOError:
                sent = 0
            except OSError as error:
                reason = reason_of(error)
                self.end(f"send failed: {reason}", MessageLost(f"send failed: {reason}"))
                return
            for run in pipeline.wrote(sent):
                self.client.written += len(run.requests)
        if self.drained is not None and len(pipeline.out) < OUT_MAX:
            drained, self.drained = self.drained, None
            drained()
        events = (0 if self.paused else READ) | (WRITE if pipeline.out else 0)
        if events != self.watching:
            self.loop.want(self, events)

    def ready(self, events):
        if not self.connected:
            self._connect_over()
        elif events & READ:
            self._read()
        if events & WRITE and self.connected and not self.ended:
            self.loop.flush_soon(self)

    # -- bytes in, replies out --

    def _read(self):
        """One recv_into() the connection's own buffer: a recv() of READ_SIZE would make (and
        the allocator map and unmap) a new buffer that large for every read."""
        inbox = self.inbox
        try:
            count = self.sock.recv_into(inbox)
        except BlockingIOError:
            return
        except OSError:   # a reset reads as an EOF
            count = 0
        if not count:
            self._stream_ended("upstream closed the connection")
            return
        self.replied_now, out_of_step = False, None
        try:
            self.pipeline.feed(inbox[:count])   # the pipeline's Frames copies what it keeps
        except OutOfStep as error:
            out_of_step = error
        if self.replied_now:   # a reply is the proof of health, not a connect; once per read
            self.client.rcache.record_success(self.client.addr)
        if (passing_to := self.pipeline.passing_to) is not None and not self.ended and \
                passing_to.backlog() > WINDOW:   # a long reply: read on once its client has read
            self.paused = True
            self.loop.want(self, WRITE if self.pipeline.out else 0)
            passing_to.drained = self._read_again
        if out_of_step:
            run = out_of_step.run
            oldest = Owing(run.requests[run.answered], run.abandoned) if run else None
            self.end(str(out_of_step), MessageLost(out_of_step.lost))
            if out_of_step.reply is not None:   # the reply that proved it is told too
                self.client._tell("reply", self, out_of_step.reply, oldest)

    def _read_again(self):
        self.paused = False
        if not self.ended:
            self.loop.want(self, READ | (WRITE if self.pipeline.out else 0))

    def extend(self, run, piece):
        """More of run's one long request (a connection of a client's own carries it alone)."""
        if run in self.waiting:   # not queued yet: it goes with the rest, once it is
            run.data += piece
        else:
            self.pipeline.extend(run, piece)
        if not self.flushing:
            self.loop.flush_soon(self)

    def _settled(self, run, replies, first):
        """The pipeline's report: run's share of this read has come (see Pipeline)."""
        client = self.client
        self.pending -= len(replies)
        self.replied_now = True
        if run.abandoned:
            client.discarded += len(replies)
            self.abandoned -= run.over()
        elif run.is_ping:
            self._up("initial ping answered")
        else:
            client.replies += len(replies)
        if not self.pipeline.owed and self.state == "up" and client.idle_timeout >= 0:
            self.idle_since = client.clock.now()
            if client.idle_timeout == 0 and not run.is_ping:
                self.end("idle: closed after the last reply (idle_timeout 0)")
            else:
                self.arm()
        if client.on_event:
            oldest = Owing(b"".join(run.requests[first:first + len(replies)]), run.abandoned)
            client._tell("reply", self, b"".join(replies), oldest)

    def _stream_ended(self, problem):
        """The upstream's EOF: quiet only after a reply, with nothing owed that anyone waits for."""
        waited_for = sum(run.owing_count() for run in self.pipeline.owed if not run.abandoned)
        if waited_for:
            self.end(f"{problem} with {waited_for} call(s) owed", MessageLost(problem))
        elif not self.pipeline.answered:
            before = f"{problem} before any reply"
            self.end(before, CommunicationError(before))
        else:   # Ocamlnet forgets a timed-out call: its reply, never come, is no error
            self.end("upstream closed the idle connection")

    # -- the end --

    def end(self, reason, failure=None, lost=None):
        """Down for good, once. A failure counts one error and fails every run on it; a quiet
        end gives its waiting runs to the client's next connection, its owed ones `lost`."""
        if self.ended:
            return
        client = self.client
        self.ended, self.state = True, "ended"
        self.disarm()
        if failure:
            client._record_error()
        if client.connection is self:
            client.connection = None
            client._move("down", reason)
        if self.sock is not None:
            self.loop.forget(self.sock)
        self.inbox = None   # its buffer goes with it, whoever still holds the connection
        self.pending -= self.pipeline.lose(failure or lost or MessageLost(reason))
        waiting, self.waiting = self.waiting, collections.deque()
        for run in waiting:
            if failure or lost:
                self._fail(run, failure or lost)
            else:
                self.pending -= run.owing_count()
                client.place(run)
        if failure:
            client.count("errors")
