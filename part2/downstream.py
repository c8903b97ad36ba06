"""downstream: ProxyClient, one client connection of a ManagedProxy (part2/proxy.py), on the
loop: its ClientStream core (part2/pipeline.py) on its Transport (part2/loop.py), read while
its replies keep up, and what its session lends it (connections of its own: part2/lease.py).

    ProxyClient   hung_up(), overflowed(), bounded(): its transport's protocol and its bounds;
                  deadlines(): every lend has an end (a request's arrival, a hold's idleness);
                  lend(), lend_now(), own_replied(): its connections of its own
"""

from ground.frames import Head
from ground.session import HELD
from part2.calls import ManagedError
from part2.connection import QUEUED_MAX
from part2.links import StreamLink
from part2.loop import Transport
from part2.pipeline import OWED_MAX, ClientStream

BACKLOG_HIGH = 1 << 20    # bytes of replies waiting for a client before it is read no more
UNREAD_MAX = 64 << 20     # bytes of replies a client that never reads may leave: then it is dropped
HELD_MAX = 64             # a client's requests read and not yet admitted before it is read no more


class ProxyClient(ClientStream):
    """One client connection on the loop: read while its replies keep up.

    After its EOF (or a request that could not be framed) it is closed once every reply
    it is owed has been sent; a client that has gone has its replies read and dropped.
    What its session lends it (a transaction, a wait, a stream) goes on a connection of
    its own (part2/lease.py), closed once that is over or the client goes; the requests
    of a transaction go on its connection as they come."""

    def __init__(self, proxy, sock):
        super().__init__(proxy.framing, proxy, None, proxy)
        self.proxy, self.loop = proxy, proxy.loop
        self.gather = proxy.managed_set.gather
        self.eof = False
        self.gone = False
        self.resuming = False    # a resume is listed for the turn's placing
        self.pinned = None       # the OwnLink of its transaction
        self.waiting_on = None   # the OwnLink of its wait
        self.link = None         # the StreamLink of its stream
        self.carrying = None     # the OwnLink its long request goes on, piece by piece
        self.sending = False     # a long request lent is going on, piece by piece
        self.upstream_full = False   # that link has its window of the request unsent
        self.transport = Transport(self.loop, sock, self, limit=BACKLOG_HIGH)
        self.session.addresses = (sock.getpeername(), sock.getsockname())
        self.request_timer = None   # a request has begun: it has request_timeout to end
        self.hold_timer = None      # it holds a connection: hold_timeout for its next request
        self.catching_up = []       # what waits for it to catch up: told then, or when it goes

    # -- every lend has an end --

    def received(self, data, held=None):
        super().received(data, held)
        if held is None and (self.frames.midway() or self.request_timer is not None or
                             self.session.holds or self.hold_timer is not None):
            self.deadlines()

    def deadlines(self):
        """A request begun has request_timeout from its first byte to end; a connection the
        client holds (MULTI, WATCH), hold_timeout from each of its requests to the next."""
        loop, proxy = self.loop, self.proxy
        if not self.frames.midway():
            self.request_timer = cancelled(self.request_timer)
        elif self.request_timer is None:
            self.request_timer = loop.at(loop.clock.now() + proxy.request_timeout,
                                         self.request_late)
        self.hold_timer = cancelled(self.hold_timer)
        if self.session.holds and not self.gone:
            self.hold_timer = loop.at(loop.clock.now() + proxy.hold_timeout, self.hold_late)

    def request_late(self):
        """No whole request within request_timeout: the client is told, and ends (what it
        sent of the request, and anything after, is never read)."""
        self.request_timer = None
        if self.gone or not self.frames.midway():
            return
        if (carrying := self.carrying) is not None:   # half a long request went up: its
            if carrying.last in self.queue:   # connection closes, and its place in the
                self.queue.remove(carrying.last)   # client's order is this error's
            carrying.silent = True
            self._let_go(carrying)
            self.carrying, self.sending = None, False
        self.ended, self.held = True, None
        self.answer(self.framing.error(f"tcp-proxy: no whole request within "
                                       f"{self.proxy.request_timeout:g} s"))
        self.bounded()

    def hold_late(self):
        """hold_timeout without a request while it holds a connection: the connection is
        closed (never lent with what it holds) and the rest of its transaction refused."""
        self.hold_timer = None
        pinned = self.pinned
        if self.gone or not self.session.holds:
            return
        if pinned is not None and pinned.owed():   # a reply still comes: not idle
            self.deadlines()
            return
        if pinned is not None:
            self._let_go(pinned)
        self.session.lost(f"held its connection {self.proxy.hold_timeout:g} s without a "
                          f"request")

    # -- its transport's protocol, and its bounds --

    def hung_up(self, reason):
        """The client's EOF: closed once its replies are sent; a failed send: closed now."""
        if reason is not None:   # it has gone: what it is still owed is read and dropped
            self.close()
            return
        self.eof = True
        if self.waiting_on is not None:   # it left while its command waits: that ends
            self.waiting_on.close()
        self.bounded()

    def overflowed(self):
        """More than BACKLOG_HIGH unsent, or a long reply's piece kept: read no more; past
        UNREAD_MAX kept for it, it does not read, and is dropped rather than have a shared
        connection wait for it."""
        if self.backlog() > UNREAD_MAX:
            self.proxy.count("dropped")
            self.close()
        else:
            self.bounded()

    def behind(self):
        return self.backlog() >= BACKLOG_HIGH

    def when_caught_up(self, function):
        self.catching_up.append(function)
        self.transport.when_drained(self._caught_up, BACKLOG_HIGH)

    def _caught_up(self):
        waiting, self.catching_up = self.catching_up, []
        for function in waiting:
            function()

    def bounded(self):
        """Read on only while its replies keep up (requests owed, bytes kept, requests held,
        what it is lending); closed once it has ended and everything is sent."""
        if self.gone:
            return
        if (self.eof or self.ended) and not self.queue and not self.transport.out and \
                self.held is None:   # everything sent
            self.close()
            return
        keeping_up = len(self.queue) < OWED_MAX and self.backlog() < BACKLOG_HIGH and \
            not (self.eof or self.ended)
        if self.held is not None:
            keeping_up = keeping_up and len(self.held) < HELD_MAX and not self.upstream_full
            if self.link is not None:   # the stream may read again, if it waited
                self.link.read_on()
        if keeping_up:
            self.transport.resume()
        else:
            self.transport.pause()
            self.transport.when_drained(self.bounded, BACKLOG_HIGH)

    # -- what its session lends it (ClientStream's hooks) --

    def held_up(self):
        if self.sending:   # the pieces of the long request lent, as they come
            self.send_pieces()
        if not self.resuming and not self.gone:
            self.resuming = True
            self.loop.after_reads(self._resume)

    def _resume(self):
        """Admission goes on, once nothing before it is owed: the request lent first, then
        those held, admitted in order."""
        self.resuming = False
        if self.gone or self.held is None or self.queue or self.busy():
            self.bounded()
            return
        if self.lent is not None:
            request, self.lent = self.lent, None
            sent = self.lend(request)
            if isinstance(request, Head):   # its pieces follow it, or are dropped
                self.sending = sent
                self.send_pieces()
        else:
            self.admit_held()
        self.bounded()

    def busy(self):
        return self.link is not None and self.link.barriers > 0

    def lend_now(self, data, state):
        """A request of a transaction whose connection it holds, sent as it comes; unless its
        reply may change what the session says next (MULTI, EXEC), admission goes on."""
        link, session = self.pinned, self.session
        if link is None or link.closed or session.lease != HELD or not session.holds:
            return None
        return link.send(data, state)

    def lend(self, data):
        """data on a connection of the client's own, as its session says: the one it holds,
        a stream's, or one the lender has free; with none free, it waits its turn (a long
        request is refused at once: its pieces are coming)."""
        session, lending = self.session, self.proxy.lending
        try:
            if session.streams:
                if self.link is None:
                    if not lending.room_for_a_stream():
                        lending.wait(self, data)
                        return True
                    self.link = StreamLink(self.proxy, self)
                # a barrier after each request, so what the pool answers next comes after its
                # reply; but not in MONITOR's stream, which would show the barrier's PING
                barrier = session.settles or not session.monitoring
                self.link.send(data, barrier)
                if not barrier:   # admission goes on
                    self.held_up()
                return True
            link = self.pinned if session.lease == HELD else None
            if link is None and (link := lending.link_for(self)) is None:
                if isinstance(data, Head):
                    raise ManagedError(f"no connection of its own free for a long request: the "
                                       f"pool's {self.framing.dedicated_cap} dedicated "
                                       f"connections are all in use")
                lending.wait(self, data)
                return True
            if session.lease == HELD:
                self.pinned = link
            else:   # a wait, or a long request: given back once its reply is in
                self.waiting_on = link
            if isinstance(data, Head):
                self.carrying = link
            # a long request's reply is due once it has come whole (within request_timeout)
            wait = self.proxy.request_timeout if isinstance(data, Head) else session.wait
            self.queue.append(link.send(data, session.state, wait))
            return True
        except ManagedError as error:   # no connection of its own to be had: nothing is sent
            self.refused(error)
            return False

    def refused(self, error):
        """No connection of its own to be had (at once, or within checkout_timeout): told so
        in its order, and admission goes on."""
        if self.session.streams:
            self.session.lost()
        self.answer(self.framing.error(f"tcp-proxy: {error}"))
        self.held_up()

    def send_pieces(self):
        """The pieces of the long request lent, read so far: on to its connection; a refused
        one's, dropped."""
        held, taken = self.held, 0
        for piece in held:
            if type(piece) is bytes or isinstance(piece, Head):
                break
            taken += 1
            if self.sending:
                self.pass_on(piece)
            if not piece:   # its end (a Passed marker, no bytes of its own)
                self.sending = False
                break
        del held[:taken]

    def pass_on(self, piece):
        link = self.carrying
        if link.extend(piece) >= QUEUED_MAX:   # its window is unsent: read on once it has gone
            self.upstream_full = True
            link.when_drained(self._upstream_drained)
        if not piece:   # the end (a Passed marker, no bytes of its own)
            self.carrying = None

    def _upstream_drained(self):
        self.upstream_full = False
        self.bounded()

    def cut(self):
        self.close()

    def own_replied(self, link):
        if link is self.pinned and not self.session.holds and not link.owed():
            self._let_go(link, clean=not link.spoiled)   # the transaction is over
        elif link is self.waiting_on:
            self._let_go(link, clean=True)
        if self.session.holds != (self.hold_timer is not None):   # a hold begun, or ended
            self.deadlines()
        if self.held is not None:
            self.held_up()

    def own_failed(self, link):
        self._let_go(link)
        self.held_up()

    def _let_go(self, link, clean=False):
        """Done with a connection of its own: given back to the lender if what it was for is
        over and it owes nothing, else closed (a transaction cut short, a client gone)."""
        if clean:
            self.proxy.lending.give_back(link)
        else:
            link.close()
        if link is self.pinned:
            self.pinned = None
        if link is self.waiting_on:
            self.waiting_on = None

    def answered(self):
        if self.link is not None and not self.session.streams:   # RESET, QUIT: the stream ends
            self._end_stream()
        pinned = self.pinned   # an EXECABORT, RESET, QUIT the pool answered: its transaction's
        if pinned is not None and not self.session.holds:   # connection is never lent again
            pinned.spoiled = True   # (closed once its replies are in: own_replied())
            if not pinned.owed():
                self._let_go(pinned)

    def stream_settled(self, link):
        if not self.session.streams:   # the last unsubscribe: the stream is over
            self._end_stream()
        self.held_up()

    def stream_lost(self, link, message):
        self.link = None
        self.transport.write(message)
        self.ended = True   # the subscriber is told by its connection's end
        self.held = None
        self.bounded()

    def _end_stream(self):
        link, self.link = self.link, None
        link.close()

    def close(self):
        if not self.gone:
            self.gone = True
            self.request_timer = cancelled(self.request_timer)
            self.hold_timer = cancelled(self.hold_timer)
            self.queue.clear()
            self.parked = 0
            self.transport.close()
            self._caught_up()   # what waited for it reads on: it will never catch up
            self.proxy.clients.discard(self)
            for link in (self.pinned, self.waiting_on, self.link):
                if link is not None:
                    link.close()


def cancelled(timer):
    """None, once the timer (if any) will not fire."""
    if timer is not None:
        timer.cancel()
    return None
