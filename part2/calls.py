"""calls: what a caller of Part two is told, and the units of work the loop moves.

    ManagedError and its five subclasses   the failures a caller can see
    check_request(), check_addr()          what a request and an address must be
    Run      requests that travel together, their replies owed in order: a thread's one
             call, or what the proxy's clients sent in one turn; its sink hears the outcome
    Owing    what an event shows of a run: its requests, and whether it was abandoned
    Call     a thread's blocking call: the sink of its run, and what the thread waits on

A sink is anything with replied(run, replies) (the next len(replies) requests of the run
are answered, in order) and failed(run, error) (every request not yet answered gets
error; the run is over). A Call, a ManagedSet's attempt and a proxy client are sinks.
"""
import collections
import contextlib
import threading

from tcp_proxy import LINES


class ManagedError(Exception):
    """Any failure of the managed layer; its message never names an address."""


class MessageLost(ManagedError):
    """The request may have reached the upstream, but its reply never came."""


class MessageTimeout(ManagedError):
    """No reply within msg_timeout (or no answer to the initial ping)."""


class CommunicationError(ManagedError):
    """Could not connect: the request was never sent."""


class ServiceUnavailable(ManagedError):
    """The reliability cache has disabled this port: the request was never sent."""


class ClusterServiceUnavailable(ManagedError):
    """No service of a set has a client to spare: the request was never sent."""


def check_request(request, framing=LINES):
    """A request is bytes holding exactly one whole request, as the framing's request_size()
    reads it (as the proxy's clients are read): never a part of one, never two."""
    if isinstance(request, bytes):
        with contextlib.suppress(ValueError):
            if framing.request_size(request) == len(request):
                return
    raise ValueError(f"a request is one whole request of bytes (for LINES, one line ending in "
                     f"b'\\n'), not {request!r:.60}")


def check_addr(addr):
    """An upstream's address: (host, port), or IPv6's (host, port, flowinfo, scope_id)."""
    numbers = all(isinstance(field, int) and not isinstance(field, bool) for field in addr[1:]) \
        if isinstance(addr, tuple) else False
    fields_ok = isinstance(addr, tuple) and len(addr) in (2, 4) and isinstance(addr[0], str) \
        and addr[0] and numbers
    if not fields_ok or not 0 < addr[1] < 65536:
        raise ValueError(f"an address is (host, port) or (host, port, flowinfo, scope_id), "
                         f"a port from 1 to 65535, not {addr!r}")


def reason_of(error):
    """An exception's reason, as a transition or an error message gives it."""
    strerror = error.strerror if isinstance(error, OSError) else None
    return strerror or str(error) or type(error).__name__


Owing = collections.namedtuple("Owing", "request abandoned")


class Run:
    """Requests written together on one connection; their replies come in the same order.

    A run is one entry of a connection's queue of owed replies, however many requests it
    holds: what the proxy's clients sent in one turn goes as one run. Its deadline (the
    time it was placed, plus the message timeout) is the connection's while it is the
    oldest run owed. An abandoned run timed out without ending its connection: its
    replies are still owed, and thrown away as they come."""
    __slots__ = ("requests", "data", "answered", "sink", "deadline", "abandoned", "overdue_at",
                 "is_ping", "state")

    def __init__(self, requests, sink, deadline=None, is_ping=False, data=None, state=None):
        self.requests = requests   # whole requests, in the order they are written
        self.data = b"".join(requests) if data is None else data   # the same, end to end
        self.answered = 0          # how many have had their reply (or were failed)
        self.sink = sink
        self.deadline = deadline
        self.abandoned = False
        self.overdue_at = None     # abandoned: when its missing replies end the connection
        self.is_ping = is_ping     # the initial ping: its sink is its connection
        self.state = state         # what its connection must carry first (None: anything)

    def over(self):
        return self.answered == len(self.requests)

    def owing_count(self):
        """How many of its requests are still owed a reply."""
        return len(self.requests) - self.answered

    def fail(self, error):
        """Every request still unanswered gets error (an abandoned run's caller already has one)."""
        if not self.over():
            if not self.abandoned:
                self.sink.failed(self, error)
            self.answered = len(self.requests)

    def owing(self):
        """What an event shows of it: the requests still owed a reply, end to end."""
        return Owing(b"".join(self.requests[self.answered:]), self.abandoned)


class Ignored:
    """The sink of a run whose replies its connection reads itself: the initial ping's."""

    def replied(self, run, replies):
        pass

    def failed(self, run, error):
        pass


IGNORED = Ignored()


class Call:
    """A thread's blocking call of one request: the sink its run reports to, and the
    completion the thread waits on. The loop completes it at the end of the turn that
    settled it, once the turn's callbacks are made."""
    __slots__ = ("request", "reply", "error", "done", "waiter", "loop")
    state = None   # a thread's call asks nothing of its connection's state

    def __init__(self, request, loop):
        self.request = request
        self.reply = None
        self.error = None
        self.done = False
        self.loop = loop
        self.waiter = threading.Lock()   # held until the call is done; the thread waits to take it
        self.waiter.acquire()

    def replied(self, run, replies):
        self.reply = replies[0]
        self.loop.finish(self)

    def failed(self, run, error):
        self.error = error
        self.loop.finish(self)

    def outcome(self):
        """The reply, or the error raised."""
        if self.error is not None:
            raise type(self.error)(*self.error.args)   # a new one: one instance per raising thread
        return self.reply
