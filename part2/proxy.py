"""proxy: ManagedProxy, twemproxy's shape built from the lesson's parts, on one loop.

    ManagedProxy   a listener and every client connection on the set's loop; close()
                   ends it all
    ProxyClient    one client connection: a ClientStream (pipeline.py) on its Transport
                   (loop.py), read while its replies keep up; what its session lends it

The order a request takes: the client's transport reads -> ClientStream.received():
framed (tcp_proxy.Frames), admitted (framing.session().admit(): None sends it on, bytes
are the pool's own answer), a Request each, queued in the client's order -> the set's
gather(): once the turn's reads are over, one pick and one write per connection for
every client's requests -> the connection's transport sends -> the replies, read,
fit-checked and paired with their requests (pipeline.py) -> each client's replied(),
in its own order -> one send per client, in the turn's send phase.

With a framing whose sessions keep state (RESP), each request carries its client's state
and the connection's pipeline syncs to it first (HELLO, SELECT); a transaction, a wait,
a stream or a long request goes on a connection of the client's own (part2/lease.py).
"""
import contextlib
import socket

from part2.calls import ManagedError
from part2.clock import check_seconds
from part2.connection import QUEUED_MAX
from part2.lease import ManagedLending, StreamLink
from part2.handoff import start_thread
from part2.hooks import Counted
from part2.loop import READ, Loop, Transport
from part2.managed_set import ManagedSet, check_services
from ground.session import HELD
from part2.pipeline import OWED_MAX, ClientStream
from ground.frames import Head
from ground.server import (ACCEPT_BACKOFF, LISTEN_BACKLOG, Spare, host_and_port,
                           out_of_descriptors, turn_away)
from tcp_proxy import LINES

ACCEPTS_PER_TURN = 64     # connections accepted in one turn; the rest wait for the next
BACKLOG_HIGH = 1 << 20    # bytes of replies waiting for a client before it is read no more
UNREAD_MAX = 64 << 20     # bytes of replies a client that never reads may leave: then it is dropped
HELD_MAX = 64             # a client's requests read and not yet admitted before it is read no more


class ManagedProxy(Counted, contextlib.AbstractContextManager):
    """Many clients' requests over a ManagedSet's connections, pipelined, on one loop.

    It pipelines by default, as Ocamlnet's set does (pending_calls_max has no limit):
    what every client sent in one turn goes as one write per connection, each client's
    requests whole and in its order; replies are matched in order, each checked by the
    framing's fit. A lost, extra or mismatched reply is caught as out of step and costs
    the calls on that connection an error, never another client's reply. A shared
    pipeline never waits for ever: msg_timeout (5 s, fatal) ends a connection whose
    oldest call is unanswered that long, every call owed on it answered with an error.
    framing= (LINES, or resp.RESP in front of redis-server) frames both directions and
    writes the errors. Methods a subclass may override: spawn(target) starts the loop's
    thread (the bench profiles through it).
    """
    counters = {"connections": 0, "answered": 0, "failed": 0, "dropped": 0, "accept_errors": 0}
    # connections  accepted on .addr; answered  replies from an upstream passed back
    # failed       errors made from a ManagedError; dropped  clients closed for never reading
    # accept_errors  accepts that failed (out of descriptors): the listener rested, then went on
    listen_addr = None   # None: 127.0.0.1, port 0; a subclass may say ("::1", 0)
    max_clients = None   # clients served at once (None: no limit); the next is turned away

    def __init__(self, services, idempotent=False, framing=LINES, msg_timeout=5.0,
                 msg_timeout_is_fatal=True, request_timeout=10.0, hold_timeout=30.0,
                 checkout_timeout=5.0, **set_options):
        check_services(services)   # before anything is made: a bad address leaves nothing behind
        for name, seconds in (("msg_timeout", msg_timeout), ("request_timeout", request_timeout),
                              ("hold_timeout", hold_timeout),
                              ("checkout_timeout", checkout_timeout)):
            check_seconds(name, seconds)
        super().__init__(Loop(set_options.get("clock")))
        self.framing = framing
        self.msg_timeout = msg_timeout
        self.request_timeout, self.hold_timeout = request_timeout, hold_timeout
        self.checkout_timeout = checkout_timeout   # a wait for a connection of one's own
        self.clients = set()
        self.turned_away = 0   # clients told there was no room and closed (max_clients)
        self.spare = Spare()   # a descriptor to give up, to turn one away when there are none
        self.closed = False
        try:   # a setting the set refuses, or a listen that fails, leaves nothing open
            self.managed_set = ManagedSet(services, framing=framing, msg_timeout=msg_timeout,
                                          msg_timeout_is_fatal=msg_timeout_is_fatal,
                                          loop=self.loop, **set_options)
            if idempotent:   # what the clients' requests are retried after
                self.managed_set.gathered_retried = ManagedSet.RETRIED_BY_IDEMPOTENT_CALL
            self.lending = ManagedLending(self)
            addr = self.listen_addr or ("127.0.0.1", 0)
            family = socket.getaddrinfo(*host_and_port(addr), type=socket.SOCK_STREAM)[0][0]
            self._listener = socket.create_server(addr, family=family, backlog=LISTEN_BACKLOG)
        except BaseException:
            self.spare.close()
            self.loop.shut_down()
            raise
        self._listener.setblocking(False)
        self.addr = self._listener.getsockname()
        self.loop.watch(self._listener, READ, self._accept)
        self.loop.start(self.spawn)

    def spawn(self, target):
        return start_thread(target)

    def _accept(self, events):
        for _ in range(ACCEPTS_PER_TURN):
            try:
                sock, _ = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as error:   # out of descriptors, or an aborted connect: rest, go on
                self.count("accept_errors")
                if out_of_descriptors(error):   # the one waiting is told, not left waiting
                    self.turned_away += self.spare.turn_away_waiting(self._listener, self.full())
                self.loop.unwatch(self._listener)
                self.loop.at(self.loop.clock.now() + ACCEPT_BACKOFF, self._listen_again)
                return
            if self.max_clients is not None and len(self.clients) >= self.max_clients:
                turn_away(sock, self.full())
                self.turned_away += 1
                continue
            try:   # no error ends accepting: this connection is closed, the next is served
                self.clients.add(ProxyClient(self, sock))
                self.count("connections")
            except Exception:
                sock.close()

    def full(self):
        """What a client turned away is told, in the framing's words (redis-server's own)."""
        return self.framing.error("max number of clients reached")

    def _listen_again(self):
        if not self.closed:
            self.loop.watch(self._listener, READ, self._accept)

    def close(self):
        """Stop accepting, answer what is owed with errors (the set shut down), close every
        socket and end the loop. Calling it again does nothing."""
        if self.closed:
            return
        self.closed = True
        if not self.loop.stopped:
            self.loop.ask(self._close_on_loop)
        self.loop.shut_down()

    def _close_on_loop(self):
        self.loop.unwatch(self._listener)
        self._listener.close()
        self.spare.close()
        self.lending.close_all()
        self.managed_set.shut_down()   # first: a client owed a reply gets an error instead
        for client in list(self.clients):
            client.transport.flush()   # one last send, the errors included: whatever fits, goes
            client.close()

    def __exit__(self, *exc_info):
        self.close()


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
            self.proxy.clients.discard(self)
            for link in (self.pinned, self.waiting_on, self.link):
                if link is not None:
                    link.close()


def cancelled(timer):
    """None, once the timer (if any) will not fire."""
    if timer is not None:
        timer.cancel()
    return None
