"""calls: what a caller of Part two is told, and what a thread waits on.

    ManagedError and its five subclasses   the failures a caller can see
    check_request(), check_addr()          what a request and an address must be
    reason_of()      an exception's reason, as a transition or an error message gives it
    Owing            what an event shows of a request owed: its bytes, whether abandoned
    BlockingCall     a thread's blocking call: the client of its one Request, and what
                     the thread waits on

A request's client is anything with replied(request, reply) and failed(request, error):
a BlockingCall, a proxy's ClientStream (pipeline.py), the pool's own requests' owners.
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


Owing = collections.namedtuple("Owing", "request abandoned")   # what an event shows of one


class BlockingCall:
    """A thread's blocking call of one request: the client of its Request, and the
    completion the thread waits on. The loop completes it at the end of the turn that
    settled it, once the turn's callbacks are made."""
    __slots__ = ("request", "reply", "error", "done", "waiter", "loop", "reserved")

    def __init__(self, request, loop):
        self.request = request
        self.reply = None
        self.error = None
        self.done = False
        self.loop = loop
        self.reserved = False   # a set's pick reserved a client for it (ManagedSet.pick())
        self.waiter = threading.Lock()   # held until the call is done; the thread waits to take it
        self.waiter.acquire()

    def replied(self, request, reply):
        self.reply = reply
        self.loop.finish(self)

    def failed(self, request, error):
        self.error = error
        self.loop.finish(self)

    def outcome(self):
        """The reply, or the error raised."""
        if self.error is not None:
            raise type(self.error)(*self.error.args)   # a new one: one instance per raising thread
        return self.reply
