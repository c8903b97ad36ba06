"""client: ManagedClient, one upstream connection at a time, remade when a call needs it.

    ManagedClient   its settings, counters, transition log and events; place(requests),
                    which a ManagedSet (and call()) uses to send requests; call(), a
                    thread's blocking call of one request; shut_down()

The order a thread's call takes: call() -> the loop (hand-off) -> place(): a connection,
made if the client is down (connection.py) -> written by its transport -> its reply read
and matched in order by the connection's pipeline -> the BlockingCall it completes ->
the thread, at the end of that turn.
"""
import collections

from part2.cache import global_rcache
from part2.calls import (BlockingCall, ManagedError, MessageLost, MessageTimeout, Owing,
                         ServiceUnavailable, check_addr, check_request)
from part2.clock import as_seconds, check_seconds, unlimited
from part2.connection import Connection
from part2.hooks import Counted
from part2.loop import Loop
from part2.pipeline import Request
from tcp_proxy import LINES

TRANSITIONS_KEPT = 64    # entries of a client's transition_log; older ones are dropped


class ManagedClient(Counted):
    """One connection to one upstream at a time, made when a call needs it.

    A call on a down client connects; with initial_ping the new connection must answer
    PING before any request is written. An error takes the client down, counts once per
    connection, fails every call owed on it, and is never retried here. An EOF while
    nothing is owed, on a connection that has carried a reply, takes it down quietly and
    the next call reconnects. idle_timeout: < 0 never, 0 right after the last reply,
    > 0 seconds with nothing owed. msg_timeout is one deadline per call (negative or inf:
    none), from the moment the loop places it; it ends the connection only if
    msg_timeout_is_fatal, else the call is abandoned: its reply is still owed and thrown
    away as it comes. Replies are framed by `framing` (tcp_proxy.LINES, resp.RESP); one
    that does not fit its request, or comes when none is owed, ends the connection.

    on_event(client, event) hears ("transition", before, after, reason), and "sent",
    "timed out" and "reply" (laid out by _tell()): the seam pictures/ draws through.
    Made on its own, the client turns a loop of its own on a thread; given loop=, it runs
    on that one (a ManagedSet's). late_replies="forget" (scaffolding) forgets a timed-out
    call and trusts every reply: the bug the demo's first scenario shows.
    """
    counters = {"transitions": 0, "calls": 0, "connects": 0, "sent": 0, "written": 0, "replies": 0,
                "discarded": 0, "errors": 0, "waiting": 0, "callback_errors": 0}
    # transitions  state changes; bumped by _move(), which logs each in transition_log
    # calls        thread calls begun; bumped as the loop takes one over
    # connects     sockets connected; bumped by the connection once its connect is over
    # sent         requests queued to write, pings included; written  requests sent in full
    # replies      replies handed to their callers; discarded  late replies of abandoned calls
    # errors       failed connections (not failed calls); bumped last by Connection.end()
    # waiting      requests placed while a connect (or its ping) was under way
    # callback_errors  its on_event raised; bumped by call_back(), for tests to wait on

    def __init__(self, addr, *, rcache=None, initial_ping=False, idle_timeout=-1.0,
                 msg_timeout=-1.0, msg_timeout_is_fatal=False, clock=None, on_event=None,
                 late_replies="discard", framing=LINES, loop=None, pace=None):
        if late_replies not in ("discard", "forget"):
            raise ValueError(f"late_replies is 'discard' or 'forget', not {late_replies!r}")
        check_addr(addr)
        check_seconds("msg_timeout", msg_timeout)
        check_seconds("idle_timeout", idle_timeout)
        self.own_loop = loop is None
        super().__init__(loop or Loop(clock))
        self.addr, self.framing = addr, framing
        self.rcache = rcache or global_rcache()
        self.initial_ping, self.idle_timeout = initial_ping, idle_timeout
        self.msg_timeout, self.msg_timeout_is_fatal = msg_timeout, msg_timeout_is_fatal
        self.clock, self.on_event, self.late_replies = self.loop.clock, on_event, late_replies
        self.timeout = None if unlimited(msg_timeout) else msg_timeout   # what a deadline adds
        self.pace = pace            # a proxy's Pace, told how long each reply takes (or None)
        self.state = "down"
        self.connection = None      # the Connection of states connecting and up
        self.picked = 0             # requests a set's batch picked it for, not yet placed
        self.reserved = 0           # a set's pick() for a thread whose call has not begun
        self.reserved_despite_cache = 0   # those made with every service disabled (see pick())
        self.transition_log = collections.deque(maxlen=TRANSITIONS_KEPT)   # (from, to, reason)
        self._shut = False
        if self.own_loop:
            self.loop.start()

    @property
    def pending_calls(self):
        """Requests placed and not yet settled, abandoned ones (their replies still owed) too,
        those a set's batch picked it for (placed once the batch is formed), and the calls a
        set's pick() reserved it for."""
        connection = self.connection
        return (connection.pending() if connection else 0) + self.picked + self.reserved

    # -- a thread's call --

    def call(self, request):
        """Send one request and return its reply, or raise a ManagedError."""
        check_request(request, self.framing)
        if self._shut:
            raise ManagedError("client shut down")
        call = BlockingCall(request, self.loop)
        return self.loop.complete(call, lambda: self._begin(call))

    def _begin(self, call):
        self.count("calls")
        despite_cache = self._end_reservation()
        if not self._shut and not despite_cache and not self.rcache.is_enabled(self.addr):
            call.failed(None, ServiceUnavailable("the reliability cache has disabled this port"))
            return
        request = Request(call, call.request)
        request.deadline = self.deadline()
        self.place([request])

    def release(self):
        """Give back a reservation a set's pick() made, without calling."""
        self.loop.ask(self._end_reservation)

    def _end_reservation(self):
        """A call begins: one reservation of a set's pick() fewer; True if that pick was made
        with every service disabled (its call does not ask the cache again)."""
        despite = self.reserved_despite_cache > 0 and self.reserved > 0
        self.reserved = max(self.reserved - 1, 0)
        self.reserved_despite_cache = max(self.reserved_despite_cache - despite, 0)
        return despite

    # -- on the loop --

    def deadline(self):
        """The deadline of a call placed now: msg_timeout from now, or None."""
        return None if self.timeout is None else self.clock.now() + self.timeout

    def place(self, requests):
        """Send requests (their deadlines set) on the connection, made first if the client
        is down."""
        if self._shut:
            for request in requests:
                request.fail(ManagedError("client shut down"))
            return
        if self.connection is not None:
            self.connection.send(requests)
            return
        now, placed = self.clock.now(), []
        for request in requests:
            if request.deadline is not None and now >= request.deadline:   # so is a reconnect
                request.fail(MessageTimeout(f"no connection within "
                                            f"{as_seconds(self.msg_timeout)}"))
            else:
                placed.append(request)
        if not placed:
            return
        self.connection = connection = Connection(self, placed[0].deadline)
        self._move("connecting", "a call needs a connection")
        connection.send(placed)   # before the connect starts: one that fails at once fails them
        connection.open()

    def _move(self, state, reason):
        transition = (self.state, state, reason)
        self.state = state
        self.transition_log.append(transition)
        self.count("transitions")
        if self.on_event:
            self.loop.queue_callback(self, self.on_event, self, ("transition",) + transition)

    def _tell(self, kind, connection, *details, owed=None):
        """Queue on_event's (kind, clock time, connection, the Owing of each request it owes
        now (or of `owed`), whether it has ended, *details); made with the turn's callbacks."""
        if self.on_event:
            owed = connection.pipeline.owed if owed is None else owed
            owed = tuple(Owing(request.data, request.abandoned) for request in owed)
            event = (kind, self.clock.now(), connection, owed, connection.ended) + details
            self.loop.queue_callback(self, self.on_event, self, event)

    def _record_error(self):
        """Count an error in the cache now; its events are made with the turn's callbacks."""
        for on_event, cache, event in self.rcache.count_error(self.addr):
            self.loop.queue_callback(cache, on_event, cache, event)

    # -- the end --

    def shut_down(self):
        """Final: fail what is pending, close the connection; a loop of its own is ended and
        joined (from a callback on that loop, it ends once the turn is over)."""
        if not self.loop.stopped:
            try:
                self.loop.ask(self._shut_on_loop)
            except ManagedError:   # the loop stopped meanwhile: what it owned is closed
                pass
        if self.own_loop:
            self.loop.shut_down()

    def _shut_on_loop(self):
        self._shut = True
        if self.connection:
            self.connection.end("shut down", lost=MessageLost("client shut down"))
