"""connection: one upstream connection of a ManagedClient, its whole life on the loop.

    start_connect()  a non-blocking connect begun (scaffolding of the socket API)
    Connection       connecting (the connect, then the initial ping if asked) -> up ->
                     ended; its Transport (the socket) and its Pipeline (the requests it
                     owes replies to); the requests waiting to be queued; end(), the one
                     way it ends, which fails what it owes
    Deadlines        the deadlines half of Connection (its base): the timer and the
                     opening deadline it owns, arm(), _check() and what each does

The order a request takes: send() (queued at once when up, else it waits) -> the
pipeline's bytes, which the transport writes -> the replies it reads (received(): the
pipeline's feed()) -> each request's client. The deadlines: the connect and the ping,
the oldest request owed (placed, plus msg_timeout), an abandoned request's missing reply
(msg_timeout later), the idle timeout: one timer, for the earliest, set again as it fires.
"""
import collections
import errno
import os
import socket

from part2.calls import CommunicationError, MessageLost, MessageTimeout, Owing, reason_of
from part2.clock import as_seconds, unlimited
from part2.loop import Transport
from part2.pipeline import Pipeline, Request
from ground.frames import Passed

ABANDONED_MAX = 64        # abandoned requests one connection may owe; one more ends it
QUEUED_MAX = 256 * 1024   # bytes of requests unsent on a connection before the next ones wait
PING = b"PING\n"          # the initial ping: a toy protocol request, and an inline command to Redis


def due(deadline, now):   # once a deadline (None: none) has come
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
    failed = sock.connect_ex(sockaddr)
    if failed in (0, errno.EINPROGRESS):
        return sock, None
    sock.close()
    return None, os.strerror(failed)


class Deadlines:
    """A connection's deadlines (Connection's, by inheritance), one timer for the earliest,
    and what each does once it has passed. It owns the timer and the opening deadline; the
    rest it reads of the connection it is part of."""

    def __init__(self, connect_deadline):
        self.connect_deadline = connect_deadline   # the connect's and the initial ping's
        self.timer = None                          # the loop's timer for the earliest deadline

    def disarm(self):   # the connection has ended: no deadline fires any more
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
        if self.state == "connecting":
            deadlines.append(self.connect_deadline)
        for request in self.pipeline.owed:   # abandoned ones come first: they are the oldest
            deadlines.append(request.overdue_at if request.abandoned else request.deadline)
            if not request.abandoned:
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
        if self.ended or self.state == "connecting" and self._connect_timed_out(now, timeout):
            return
        if not self._check_owed(now, timeout):
            return
        late = "still connecting after" if self.state == "connecting" else "request not sent within"
        while self.waiting and due(self.waiting[0].deadline, now):
            self.waiting.popleft().fail(MessageTimeout(f"{late} {timeout}"))
        if (idle_end := self.idle_deadline()) is not None and now >= idle_end:
            self.end(f"idle for {as_seconds(client.idle_timeout)}")
            return
        self.arm()

    def _connect_timed_out(self, now, timeout):
        """The connect or the ping past the opening deadline ends the connection."""
        if not due(self.connect_deadline, now):
            return False
        if self.ping is None:
            self.end("connect failed: timed out", CommunicationError("cannot connect: timed out"))
        else:
            self.end("initial ping not answered in time",
                     MessageTimeout(f"initial ping not answered within {timeout}"))
        return True

    def _check_owed(self, now, timeout):
        """The owed requests' deadlines, oldest first; False once the connection has ended."""
        owed, index = self.pipeline.owed, 0
        while index < len(owed):
            request = owed[index]
            if request.abandoned:
                if now >= request.overdue_at:
                    self.end("an abandoned call's reply is overdue",
                             MessageLost("a timed-out call's reply never came"))
                    return False
                index += 1
                continue
            if not due(request.deadline, now):
                return True
            if request.end > self.written:   # part of it is still unsent
                self._forget(request, MessageTimeout(f"request not sent within {timeout}"))
                self.end("a request not written in time",
                         MessageLost("a request not written in time closed the connection"))
                return False
            self._time_out(request, now, timeout)   # it leaves its place, or a stand-in keeps it
            if self.ended:
                return False
        return True

    def _time_out(self, request, now, timeout):
        """An owed request's deadline has passed: what becomes of it and of the connection."""
        client = self.client
        error = MessageTimeout(f"no reply within {timeout}")
        if client.msg_timeout_is_fatal:   # Ocamlnet: the other calls on it are lost, not timed out
            self._forget(request, error)
            self.end("message timeout (fatal)",
                     MessageLost("another call's fatal message timeout closed the connection"))
        elif client.late_replies == "forget":   # scaffolding: the bug, as a real code path
            self._forget(request, error)
        else:   # its reply is still owed: thrown away as it comes; it keeps the client busy
            self._abandon(request, error, now)
        client._tell("timed out", self, request.data)

    def _forget(self, request, error):
        """It leaves the queue, its caller told: so the next reply goes to the request behind
        it (the bug scaffolding shows), unless the connection ends first (a fatal timeout)."""
        self.pipeline.drop(request)
        request.fail(error)

    def _abandon(self, request, error, now):
        """Its caller is told; a stand-in keeps its place, so the request may go on (a retry)."""
        owed = self.pipeline.owed
        stand_in = Request(None, request.data)
        stand_in.end, stand_in.abandoned = request.end, True
        stand_in.overdue_at = now + self.client.msg_timeout
        owed[owed.index(request)] = stand_in
        request.fail(error)
        self.abandoned += 1
        if self.abandoned > ABANDONED_MAX:
            self.end(f"more than {ABANDONED_MAX} abandoned calls owed",
                     MessageLost("too many replies overdue on the connection"))


class Connection(Deadlines):
    """One connection's life (see the module's map), and its transport's protocol. Its
    client holds the settings, the counters and the events; the connection changes them
    through the client's _move(), _tell() and _record_error(), and bumps its counters."""

    def __init__(self, client, deadline):
        super().__init__(deadline)
        self.client, self.loop = client, client.loop
        self.state = "connecting"
        self.transport = None
        fit = client.late_replies != "forget"   # scaffolding: the forgetful client checks nothing
        self.pipeline = Pipeline(client.framing, check_fit=fit)
        self.waiting = collections.deque()   # placed, not yet queued: connecting, or no room
        self.unwritten = collections.deque()   # requests queued whose last byte is not sent
        self.written = 0         # bytes the transport has sent
        self.ping, self.ended = None, False
        self.abandoned = 0       # requests owed whose callers gave up
        self.idle_since = None
        self.timed_from = None   # when the reply owed first began to take the server's time
        self.reader = None       # a long reply's client that reads slower than it comes: the
                                 # connection waits for it while no one else's reply is owed

    def pending(self):   # placed here and not yet settled, abandoned ones (owed still) too
        return len(self.pipeline.owed) + len(self.waiting)

    # -- connecting --

    def open(self):
        sock, failed = start_connect(self.client.addr)
        if failed:
            self.ended_connecting(failed)
            return
        self.transport = Transport(self.loop, sock, self, connecting=True, sent=self._sent)
        self.arm()

    def ended_connecting(self, reason):
        self.end(f"connect failed: {reason}", CommunicationError(f"cannot connect: {reason}"))

    def connected(self):
        self.client.count("connects")
        if self.client.initial_ping:   # nothing else is written before it is answered
            self.ping = Request(self, PING)
            self.ping.deadline = self.connect_deadline
            self.send([self.ping], at_once=True)
        else:
            self._up("connected")

    def replied(self, request, reply):   # the connection is its ping's client
        self._up("initial ping answered")

    def failed(self, request, error):   # the ping's: the connection's end says why, not this
        pass

    def _up(self, reason):
        self.state = "up"
        self.idle_since = self.client.clock.now()
        self.client._move("up", reason)
        self._send_waiting()
        self.arm()

    # -- requests in, bytes out --

    def send(self, requests, at_once=False):
        """Requests placed on this connection: queued now when it is up with room, and
        nothing waits before them (or at_once: the ping, those that waited); else they wait."""
        if self.reader is not None:   # another request: no one waits for a slow reader
            self.read_on()
        if at_once or self.state == "up" and not self.waiting and \
                len(self.transport.out) < QUEUED_MAX:
            client = self.client
            if client.pace is not None and not self.pipeline.owed:   # the first owed: timed
                self.timed_from = client.clock.now()                 # from here
            data = self.pipeline.queue(requests)
            self.unwritten.extend(requests)
            client.sent += len(requests)
            if client.on_event:
                client._tell("sent", self, data)
            self.transport.write(data)
        else:
            if self.state == "connecting":
                self.client.count("waiting", len(requests))
            self.waiting.extend(requests)
        deadline = requests[0].deadline
        if deadline is not None and (self.timer is None or deadline < self.timer.when):
            self.arm()

    def _send_waiting(self):
        """The requests that waited, as many as there is room for; the rest once there is."""
        waiting, transport = self.waiting, self.transport
        while waiting and not self.ended and len(transport.out) < QUEUED_MAX:
            room, batch = QUEUED_MAX - len(transport.out), []
            while waiting and room > 0:
                batch.append(request := waiting.popleft())
                room -= len(request.data)
            self.send(batch, at_once=True)
        if waiting and not self.ended:
            transport.when_drained(self._send_waiting, QUEUED_MAX)

    def _sent(self, count):
        """The transport sent count bytes: the requests whose last byte went are written."""
        self.written += count
        unwritten, done = self.unwritten, 0
        while unwritten and unwritten[0].end <= self.written:
            unwritten.popleft()
            done += 1
        self.client.written += done

    def extend(self, request, piece):
        """More of request's one long request (a connection of a client's own carries it
        alone); return the bytes not yet sent."""
        if request in self.waiting:   # not queued yet: it goes with the rest, once it is
            request.data += piece
            return len(request.data)
        self.transport.write(self.pipeline.extend(request, piece))
        return len(self.transport.out)

    # -- bytes in, replies out --

    def received(self, data):
        """The upstream's bytes: each settled request's client told, in order."""
        pipeline, client = self.pipeline, self.client
        settled, misstep = pipeline.feed(data)
        last, on_event, replies, whole = len(settled) - 1, client.on_event, 0, 0
        reader = None   # the client a long reply's piece went to
        for index, (request, message) in enumerate(settled):
            if type(message) is not bytes and not isinstance(message, Passed):   # a piece
                if not request.abandoned:
                    reader = request.client.passing(request, message)
                continue
            whole += 1
            if request.abandoned:
                client.discarded += 1
                self.abandoned -= 1
            elif request.client is self:
                self.replied(request, message)
            elif not request.sync:
                request.client.replied(request, message)
                replies += 1
                if (placer := request.placer) is not None and placer.on_event:
                    placer.attempt_ok(request)
            if index == last and not pipeline.owed and self.state == "up" and \
                    client.idle_timeout >= 0:
                self._idle(request)
            if on_event:
                self._tell_reply(settled, index)
        client.replies += replies
        if whole and client.pace is not None and self.timed_from is not None:
            now = client.clock.now()   # how long each reply took, lately
            client.pace.timed((now - self.timed_from) / whole)
            self.timed_from = now   # the next reply's time runs from this one's
        if settled and not client.rcache.steady:   # a reply forgets the port's errors, if any
            client.rcache.record_success(client.addr)
        if misstep is not None:
            request = misstep.request
            oldest = Owing(request.data, request.abandoned) if request else None
            self.end(misstep.reason, MessageLost(misstep.lost))
            if misstep.reply is not None:   # the reply that proved it is told too
                client._tell("reply", self, misstep.reply, oldest)
        elif reader is not None and pipeline.passing is not None and \
                len(pipeline.owed) == 1 and not self.waiting and reader.behind():
            self.wait_for(reader, pipeline.passing)

    # -- a long reply's slow reader --

    def wait_for(self, reader, request):
        """Read no more until the reader catches up (or goes, or another request comes): the
        rest of its reply waits in the server, not here. Its deadline is now the reader's:
        msg_timeout to catch up, set again each time reading goes on; a reader that never
        does ends the connection as a silent server would."""
        self.reader = reader
        self.transport.pause()
        self._due_from_now(request)
        reader.when_caught_up(self.read_on)

    def read_on(self):
        if self.reader is None:
            return
        self.reader = None
        if self.ended:
            return
        self.transport.resume()
        if self.pipeline.passing is not None:
            self._due_from_now(self.pipeline.passing)

    def _due_from_now(self, request):
        timeout = self.client.timeout
        request.deadline = None if timeout is None else self.client.clock.now() + timeout
        self.arm()

    def _idle(self, request):
        """The last reply owed has come."""
        client = self.client
        self.idle_since = client.clock.now()
        if client.idle_timeout == 0 and request is not self.ping:
            self.end("idle: closed after the last reply (idle_timeout 0)")
        else:
            self.arm()

    def _tell_reply(self, settled, index):
        """on_event's "reply" for settled[index], with what was owed right after it."""
        request, message = settled[index]
        owed = [later for later, kept in settled[index + 1:]
                if type(kept) is bytes or isinstance(kept, Passed)] + list(self.pipeline.owed)
        self.client._tell("reply", self, message, Owing(request.data, request.abandoned), owed=owed)

    def hung_up(self, reason):
        """The transport's end: an EOF (reason None), or a failed connect or send."""
        if self.state == "connecting" and self.ping is None:
            self.ended_connecting(reason or "connection closed")
        elif reason is not None:
            self.end(f"send failed: {reason}", MessageLost(f"send failed: {reason}"))
        else:
            self._stream_ended("upstream closed the connection")

    def _stream_ended(self, problem):
        """The upstream's EOF: quiet only after a reply, with nothing owed that anyone waits for."""
        waited_for = sum(not request.abandoned for request in self.pipeline.owed)
        if waited_for:
            self.end(f"{problem} with {waited_for} call(s) owed", MessageLost(problem))
        elif not self.pipeline.answered:
            before = f"{problem} before any reply"
            self.end(before, CommunicationError(before))
        elif self.pipeline.owed:   # Ocamlnet forgets a timed-out call: its reply is no error
            self.end(f"{problem}, owing only replies no caller waits for")
        else:
            self.end("upstream closed the idle connection")

    # -- the end --

    def end(self, reason, failure=None, lost=None):
        """Down for good, once. A failure counts one error and fails every request on it; a
        quiet end gives its waiting ones to the client's next connection, its owed ones
        `lost`."""
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
        if self.transport is not None:
            self.transport.close()
        error = failure or lost or MessageLost(reason)
        for request in self.pipeline.lose():   # an abandoned one's caller has its error
            if not request.abandoned and not request.sync:   # already; a sync has none
                request.fail(error)
        waiting, self.waiting = self.waiting, collections.deque()
        if failure or lost:
            for request in waiting:
                request.fail(failure or lost)
        elif waiting:
            client.place(list(waiting))
        if failure:
            client.count("errors")
