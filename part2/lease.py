"""lease: what ManagedProxy lends a client whose session keeps state (Redis: a transaction,
a wait, a stream), on the set's loop, beside the shared pipeline. A reader of the batch
path need not read it: a client that never asks for any of this never reaches it.

    ManagedLending  one proxy's lender, as its sessions see it (ground/session.py names what
                    it drives): next_id(), facts() learned once through the set (NotYet
                    until then), how many connections of their own its clients have
                    (within the framing's dedicated_cap)
    SessionFraming  the framing of a client's own connection: its fit is the session's
                    (inside MULTI, +QUEUED), and each reply is told to the session as its
                    fit is checked, in order (a transaction begun or ended)
    OwnLink         a connection of one client's own (a transaction's or a wait's): a
                    ManagedClient on the set's loop that the set's pick never sees; the
                    client of the requests sent on it (their replies to the client's
                    stream, then what each ended); closed once the transaction or the
                    wait is over, never lent to another
    StreamLink      a client's stream (SUBSCRIBE, MONITOR) on a connection of its own: the
                    upstream's messages to the client as they come (a long one in pieces),
                    each request followed by the session's barrier, whose reply tells the
                    client's admission to go on (and, the subscriptions all gone, ends it)

The order a lent request takes: ClientStream.admit() (session.lease is not POOLED) ->
it waits until every request before it is answered -> ProxyClient.lend() -> an OwnLink
(or the StreamLink) -> its reply to the client -> the requests after it admitted. Inside
a transaction the connection is the client's already: each request goes on it as it is
admitted (ProxyClient.lend_now()), and admission waits only after one whose reply may
change what the session says next (session.settles: MULTI, EXEC, WATCH).
"""
import collections
import itertools
import math

from part2.calls import ManagedError
from part2.client import ManagedClient
from part2.connection import QUEUED_MAX, start_connect
from part2.loop import Transport
from ground.session import HELD, NotYet
from part2.pipeline import Request
from ground.frames import Frames, Passed, Piece

WINDOW = 1 << 20     # bytes a stream's subscriber may have unread before its stream is read no more
FACTS_RETRY = 1.0   # seconds the pool answers with its failure to learn, before it asks again


class ManagedLending:
    """What one ManagedProxy does for its clients' sessions beside the shared pipeline."""

    def __init__(self, proxy):
        self.proxy = proxy
        self.framing = proxy.framing
        self.ids = itertools.count(1)
        self.learned = None    # what the pool read of its server, once (facts())
        self.learning = False
        self.failure = None    # (when, why) the last learning failed
        self.waiters = []      # what to call once the facts are in (or failed)
        self.own = 0           # connections of a client's own open now (lent, or idle)
        self.own_idle = []     # OwnLinks left clean by their last client, to lend again
        self.queue = collections.deque()   # (client, request, timer): waiting for one
        self.waiting = 0       # how many wait (the stats show it)
        self.dedicated = 0     # such connections ever opened (the tests read it)
        self.refusals = collections.Counter()   # command -> requests its sessions refused

    def next_id(self):
        return next(self.ids)

    def refused(self, command):
        self.refusals[command] += 1

    def facts(self):
        """The server's facts (framing.facts()); the first time, NotYet: they are asked
        through the set, as any request, and every session waiting is told once they come."""
        if self.learned is not None:
            return self.learned
        now = self.proxy.loop.clock.now()
        if self.failure and now < self.failure[0] + FACTS_RETRY:
            raise ConnectionError(self.failure[1])
        if not self.learning:
            self.learning = True
            asked = self.framing.facts_requests()
            sink = FactsSink(self, len(asked))
            for order, data in enumerate(asked):
                request = Request(sink, data)
                request.order = order   # its place among the replies the facts are read from
                self.proxy.managed_set.place(request)
        raise NotYet(self.waiters)

    def learned_now(self, facts=None, failure=None):
        self.learning = False
        self.learned = facts
        if failure is not None:
            self.failure = (self.proxy.loop.clock.now(), failure)
        waiters, self.waiters = self.waiters, []
        for resume in waiters:
            resume()

    def opened(self):
        """One more connection of a client's own, or ManagedError past dedicated_cap."""
        cap = self.framing.dedicated_cap
        if self.own >= cap:
            raise ManagedError(f"no connection of its own for this request: the pool's {cap} "
                               f"dedicated connections are all in use")
        self.own += 1
        self.dedicated += 1

    def closed(self):
        self.own -= 1
        self.serve_waiting()

    def link_for(self, stream):
        """An OwnLink for the client: one left clean by another, or a new one within
        dedicated_cap; None at the cap (then the client waits: wait())."""
        while self.own_idle:
            link = self.own_idle.pop()
            if link.usable():
                link.bind(stream)
                return link
            link.close()
        if self.own >= self.framing.dedicated_cap:
            return None
        return OwnLink(self.proxy, stream)

    def wait(self, stream, request):
        """The client waits for a connection of its own, checkout_timeout at most, and is
        then refused, naming the cap; its request goes once one is free (serve_waiting())."""
        loop, patience = self.proxy.loop, self.proxy.checkout_timeout
        entry = [stream, request, None]
        entry[2] = loop.at(loop.clock.now() + patience, lambda: self.waited_too_long(entry))
        self.queue.append(entry)
        self.waiting = len(self.queue)

    def waited_too_long(self, entry):
        if entry in self.queue:
            self.queue.remove(entry)
            self.waiting = len(self.queue)
            cap, patience = self.framing.dedicated_cap, self.proxy.checkout_timeout
            entry[0].refused(ManagedError(
                f"no connection of its own free within {patience:g} s: the pool's {cap} "
                f"dedicated connections are all in use"))

    def room_for_a_stream(self):
        """Room under the cap for a stream's connection (never lent again): an idle one is
        closed to make it, if need be."""
        if self.own >= self.framing.dedicated_cap and self.own_idle:
            self.own_idle.pop().close()
        return self.own < self.framing.dedicated_cap

    def give_back(self, link):
        """A link its client is done with, clean: lent to the next that waits, or kept."""
        if link.usable():
            self.own_idle.append(link)
            self.serve_waiting()
        else:
            link.close()

    def close_all(self):
        """The proxy is closing: what is kept is closed, and nobody waits any more."""
        queue, self.queue = self.queue, collections.deque()
        for _, _, timer in queue:
            timer.cancel()
        while self.own_idle:
            self.own_idle.pop().close()

    def serve_waiting(self):
        """Whoever waits for a connection of its own, in turn, while there is one to lend."""
        while self.queue and (self.own_idle or self.own < self.framing.dedicated_cap):
            stream, request, timer = self.queue.popleft()
            self.waiting = len(self.queue)
            timer.cancel()
            if not stream.gone:
                stream.lend(request)


class FactsSink:
    """The client of the pool's own facts_requests(): their replies, in their order."""

    def __init__(self, lending, count):
        self.lending = lending
        self.replies = {}   # request -> its reply
        self.count = count
        self.over = False

    def replied(self, request, reply):
        self.replies[request] = reply
        if len(self.replies) == self.count and not self.over:
            self.over = True
            in_order = [self.replies[key] for key in sorted(self.replies, key=order_of)]
            try:
                facts = self.lending.framing.facts(in_order)
            except ValueError as error:
                self.lending.learned_now(failure=f"the server's facts: {error}")
                return
            self.lending.learned_now(facts)

    def failed(self, request, error):
        if not self.over:
            self.over = True
            self.lending.learned_now(failure=str(error))


def order_of(request):
    return request.order


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
