"""links: the connections a ManagedProxy client has of its own (part2/lease.py lends them),
beside the shared pipeline. A reader of the batch path need not read it.

    SessionFraming  the framing of a client's own connection: its fit is the session's
                    (inside MULTI, +QUEUED), and each reply is told to the session as its
                    fit is checked, in order (a transaction begun or ended)
    OwnLink         a connection of one client's own (a transaction's or a wait's): a
                    ManagedClient on the set's loop that the set's pick never sees; the
                    client of the requests sent on it (their replies to the client's
                    stream, then what each ended); given back once the transaction or the
                    wait is over and it owes nothing, to be lent to the next (bind())
    StreamLink      a client's stream (SUBSCRIBE, MONITOR) on a connection of its own: the
                    upstream's messages to the client as they come (a long one in pieces),
                    each request followed by the session's barrier, whose reply tells the
                    client's admission to go on (and, the subscriptions all gone, ends it)
"""
import math

from ground.frames import Frames, Passed, Piece
from ground.session import HELD
from part2.calls import ManagedError
from part2.client import ManagedClient
from part2.connection import QUEUED_MAX, start_connect
from part2.loop import Transport
from part2.pipeline import Request

WINDOW = 1 << 20     # bytes a stream's subscriber may have unread before its stream is read no more


class SessionFraming:
    """The framing, with the fit of one client's session (session.fits()); a reply whose
    fit is checked is told to the session (holding()) at once, so the next reply's fit is
    judged as of it (MULTI's +OK: from then on, +QUEUED)."""

    def __init__(self, framing, session):
        self.framing, self.session = framing, session

    def __getattr__(self, name):
        return getattr(self.framing, name)

    def fits(self, request, reply, framed=False):
        if not self.session.fits(request, reply):
            return False
        self.session.holding(request, reply)
        return True


def own_addr(managed_set):
    """The first service the set's cache has enabled (its first, if none is)."""
    enabled = [addr for addr in managed_set.addrs if managed_set.rcache.is_enabled(addr)]
    return (enabled or managed_set.addrs)[0]


class OwnLink:
    """A connection of one client's own: a ManagedClient on the proxy's loop, not the set's;
    the client of every request sent on it."""

    def __init__(self, proxy, stream):
        proxy.lending.opened()
        self.lending, self.stream = proxy.lending, stream
        managed_set = proxy.managed_set
        self.client = ManagedClient(own_addr(managed_set), loop=proxy.loop,
                                    framing=SessionFraming(proxy.framing, stream.session),
                                    rcache=managed_set.rcache, msg_timeout=proxy.msg_timeout,
                                    msg_timeout_is_fatal=True)
        self.closed = False
        self.silent = False   # closed by its client, which says why itself: no error to tell
        self.spoiled = False  # what it was lent for ended by the pool's own answer: never again
        self.last = None   # the last request sent (a long one's pieces follow it)

    def bind(self, stream):
        """Lent again, to another client: its session's fit from now on."""
        self.stream, self.silent, self.spoiled, self.last = stream, False, False, None
        self.client.framing.session = stream.session

    def usable(self):
        """Open, up, and owing nothing: what its last client did with it is over."""
        connection = self.client.connection
        return not self.closed and connection is not None and connection.state == "up" and \
            not connection.pending()

    def send(self, data, state, wait=None):
        """One request on it: within msg_timeout, or a wait's own timeout and msg_timeout
        more (math.inf: for as long as the client stays); return its Request."""
        clock = self.client.clock
        request = self.last = Request(self, data, state)
        if wait is None:
            request.deadline = self.client.deadline()
        elif not math.isinf(wait):
            request.deadline = clock.now() + wait + self.client.msg_timeout
        self.client.place([request])
        return request

    def replied(self, request, reply):
        self.stream.replied(request, reply)
        self.stream.own_replied(self)

    def passing(self, request, piece):
        return self.stream.passing(request, piece)

    def failed(self, request, error):
        if self.silent:
            return
        session = self.stream.session
        if session.lease == HELD or session.holds:
            session.lost()   # its transaction went with it: the rest is refused to its end
        self.stream.failed(request, error)
        self.stream.own_failed(self)

    def owed(self):
        """Requests sent on it whose replies have not come."""
        connection = self.client.connection
        return connection.pending() if connection is not None else 0

    def extend(self, piece):
        """A piece of the long request sent on it; how many bytes of it wait to be sent."""
        connection = self.client.connection
        if self.closed or connection is None:   # it has failed: the request has its error
            return 0
        return connection.extend(self.last, piece)

    def when_drained(self, function):
        if (connection := self.client.connection) is not None and connection.transport:
            connection.transport.when_drained(function, QUEUED_MAX)
        else:
            function()

    def close(self):
        if not self.closed:
            self.closed = True
            self.lending.closed()
            self.client._shut_on_loop()   # on the loop: whatever it owes fails, its socket closed
            self.client.loop.counted.remove(self.client)   # the loop wakes its waiters no more


class StreamLink:
    """A client's stream on a connection of its own, on the loop: the sync first (its
    replies checked, never relayed), then each request with the session's barrier after it;
    every message to the client as it comes but the barrier's reply, which says the replies
    before it are all in (busy() is false again). Reading stops while the client has
    `window` bytes or more to take."""

    def __init__(self, proxy, stream, window=WINDOW):
        proxy.lending.opened()
        self.proxy, self.stream, self.loop = proxy, stream, proxy.loop
        self.session, self.framing, self.window = stream.session, proxy.framing, window
        sock, failed = start_connect(own_addr(proxy.managed_set))
        if failed:
            proxy.lending.closed()
            raise ManagedError(f"cannot connect: {failed}")
        self.checking = self.session.sync(None)   # the sync's requests, their replies owed
        self.frames = Frames(lambda: self.framing.reply_parser(passing=True))
        self.barriers = 0      # barriers sent whose replies have not come
        self.up = self.closed = False
        self.timer = None
        self.transport = Transport(self.loop, sock, self, connecting=True)
        self.transport.write(b"".join(self.checking))   # sent once the connect is over

    def connected(self):
        self.up = True

    def send(self, request, barrier=True):
        """request on the stream; with a barrier, the session's goes after it and the client's
        admission waits for its reply: a subscription's change is counted, and whatever the
        pool answers next is written after this request's reply."""
        self.transport.write(request)
        if not barrier:
            return
        self.transport.write(self.session.barrier())
        self.barriers += 1
        if self.timer is None:
            self.timer = self.loop.at(self.loop.clock.now() + self.proxy.msg_timeout, self._late)

    def _late(self):
        self.timer = None
        if self.barriers and not self.closed:
            self.end("no reply to the pool's barrier within msg_timeout")

    def read_on(self):
        """Read while the client has less than the window to take."""
        if self.closed:
            return
        if self.stream.backlog() < self.window:
            self.transport.resume()
        else:
            self.transport.pause()
            self.stream.transport.when_drained(self.read_on, self.window)

    def received(self, data):
        self.frames.feed(data)
        try:
            while not self.closed and (message := self.frames.take()) is not None:
                self._message(message)
        except ValueError as error:
            self.end(f"out of step: {error}")
        self.read_on()

    def hung_up(self, reason):
        if not self.up:
            self.end(f"cannot connect: {reason}")
        else:
            self.end("the upstream closed the stream" if reason is None else
                     f"send failed: {reason}")

    def _message(self, message):
        stream = self.stream
        if self.checking:
            request = self.checking.pop(0)
            if isinstance(message, (Piece, Passed)) or self.framing.synced(request, message):
                self.end("the connection could not take the client's state")
            return
        if isinstance(message, Passed):   # the end of a long one: its bytes went before it
            return
        if isinstance(message, Piece) or self.session.pushed(message):
            stream.transport.write(message)
            return
        self.barriers -= 1   # the barrier's reply: every reply before it is in
        if not self.barriers:
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            stream.stream_settled(self)

    def end(self, problem):
        """The upstream ended it (or lied): the client is told, then its connection ends."""
        if self.closed:
            return
        self.close()
        self.session.lost()
        self.stream.stream_lost(self, self.framing.error(f"upstream: {problem}"))

    def close(self):
        if not self.closed:
            self.closed = True
            if self.timer is not None:
                self.timer.cancel()
            self.transport.close()
            self.proxy.lending.closed()
