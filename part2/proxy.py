"""proxy: ManagedProxy, twemproxy's shape built from the lesson's parts, on one loop.

    ManagedProxy   a listener and every client connection on the set's loop; each client's
                   requests framed, admitted by the framing's session, gathered over
                   the turn's reads and pipelined in order through a ManagedSet; close()
                   ends it all
    ProxyClient    one client connection: a ClientStream (pipeline.py) and its socket,
                   read while its replies keep up, written once per turn

The order a request takes: the turn reads the client -> ClientStream.feed(): framed
(ground.frames.Frames), admitted (framing.session().admit(): None sends it on, bytes are the
pool's own answer) -> an entry per client per turn, gathered -> once the reads are over,
ManagedSet.place_batch(): one pick, one run per connection for every client's entries,
the connection's queue -> one send upstream in the turn's send phase -> the replies,
read, fit-checked, handed to each client in its own order -> one send per client.

With a framing whose sessions keep state (RESP), each entry carries its client's state and
the connection's pipeline syncs to it before the entry's run (HELLO, SELECT: pipeline.py);
a transaction, a wait, a stream or a long request goes on a connection of the client's own
(part2/lease.py), its later requests admitted once its reply is in.
"""
import contextlib
import socket

from part2.calls import ManagedError
from part2.clock import check_seconds
from part2.lease import ManagedLending, OwnLink, StreamLink
from part2.loop import READ, WRITE, Counted, Loop, start_thread
from part2.managed_set import ManagedSet, check_services
from part2.connection import OUT_MAX as UPSTREAM_QUEUED, WINDOW
from ground.session import HELD
from part2.pipeline import ClientStream, Entry
from ground.frames import Head
from ground.server import LISTEN_BACKLOG, Spare, host_and_port, out_of_descriptors, turn_away
from tcp_proxy import LINES

ACCEPTS_PER_TURN = 64     # connections accepted in one turn; the rest wait for the next
ACCEPT_BACKOFF = 0.05     # seconds the listener rests after accept() fails (out of descriptors)
CLIENT_READ = 64 * 1024   # bytes asked of one recv() from a client
OWED_MAX = 1024           # a client's requests in flight before it is read no more
OUT_HIGH = 1 << 20        # bytes of replies waiting for a client before it is read no more
OUT_MAX = 64 << 20        # bytes of replies a client that never reads may leave: then it is dropped
DEFERRED_MAX = 64         # a client's requests read and not yet admitted before it is read no more


class ManagedProxy(Counted, contextlib.AbstractContextManager):
    """Many clients' requests over a ManagedSet's connections, pipelined, on one loop.

    It pipelines by default, as Ocamlnet's set does (pending_calls_max has no limit):
    what every client sent in one turn goes as one run per connection, each client's
    requests whole and in its order (a client below pending_calls_max takes them); replies
    are matched in order, each checked by the framing's fit. A lost, extra or mismatched
    reply is caught as out of step and costs the calls on that connection an error, never
    another client's reply. A shared pipeline never waits for ever: msg_timeout (5 s,
    fatal) ends a connection whose oldest call is unanswered that long, every call owed
    on it answered with an error. framing= (LINES, or resp.RESP in front of redis-server)
    frames both directions and writes the errors. Methods a subclass may override:
    spawn(target) starts the loop's thread (the bench profiles through it).
    """
    counters = {"connections": 0, "answered": 0, "failed": 0, "dropped": 0, "accept_errors": 0}
    # connections  accepted on .addr; answered  replies from an upstream passed back
    # failed       errors made from a ManagedError; dropped  clients closed for never reading
    # accept_errors  accepts that failed (out of descriptors): the listener rested, then went on
    listen_addr = None   # None: 127.0.0.1, port 0; a subclass may say ("::1", 0)
    max_clients = None   # clients served at once (None: no limit); the next is turned away

    def __init__(self, services, idempotent=False, framing=LINES, msg_timeout=5.0,
                 msg_timeout_is_fatal=True, **set_options):
        check_services(services)   # before anything is made: a bad address leaves nothing behind
        check_seconds("msg_timeout", msg_timeout)
        super().__init__(Loop(set_options.get("clock")))
        self.framing = framing
        self.msg_timeout = msg_timeout
        self.retried = ManagedSet.RETRIED_BY_CALL   # what a request is retried after
        if idempotent:
            self.retried = ManagedSet.RETRIED_BY_IDEMPOTENT_CALL
        self.clients = set()
        self.turned_away = 0   # clients told there was no room and closed (max_clients)
        self.spare = Spare()   # a descriptor to give up, to turn one away when there are none
        self.gathered = []   # entries this turn's reads made, placed once the reads are over
        self.closed = False
        try:   # a setting the set refuses, or a listen that fails, leaves nothing open
            self.managed_set = ManagedSet(services, framing=framing, msg_timeout=msg_timeout,
                                          msg_timeout_is_fatal=msg_timeout_is_fatal,
                                          loop=self.loop, **set_options)
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
                    message = self.framing.error("max number of clients reached")
                    self.turned_away += self.spare.turn_away_waiting(self._listener, message)
                self.loop.unwatch(self._listener)
                self.loop.at(self.loop.clock.now() + ACCEPT_BACKOFF, self._listen_again)
                return
            if self.max_clients is not None and len(self.clients) >= self.max_clients:
                turn_away(sock, self.framing.error("max number of clients reached"))
                self.turned_away += 1
                continue
            try:   # no error ends accepting: this connection is closed, the next is served
                self.clients.add(ProxyClient(self, sock))
                self.count("connections")
            except Exception:
                sock.close()

    def gather(self, entries):
        """A client's entries, read in this turn: placed with every other client's once the
        turn's reads are over, in the order read."""
        if not self.gathered:
            self.loop.after_reads(self._place_gathered)
        self.gathered += entries

    def _place_gathered(self):
        entries, self.gathered = self.gathered, []
        self.managed_set.place_batch(entries, self.retried)

    def _place(self, entries):
        """Entries made after the reads (a client's admission resumed): placed at once."""
        self.managed_set.place_batch(entries, self.retried)

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
        self.loop.forget(self._listener)
        self.spare.close()
        self.managed_set.shut_down()   # first: a client owed a reply gets an error instead
        for client in list(self.clients):
            client.flush()   # one last send, the errors included: whatever fits, goes
            client.close()

    def __exit__(self, *exc_info):
        self.close()


class ProxyClient(ClientStream):
    """One client connection on the loop: read while its replies keep up, written once per turn.

    After its EOF (or a request that could not be framed) it is closed once every reply
    it is owed has been written; a client that has gone has its replies read and dropped.
    What its session lends it (a transaction, a wait, a stream) goes on a connection of
    its own (part2/lease.py), closed once that is over or the client goes."""

    def __init__(self, proxy, sock):
        super().__init__(proxy.framing, proxy, proxy)
        self.proxy, self.loop, self.sock = proxy, proxy.loop, sock
        self.session.addresses = (sock.getpeername(), sock.getsockname())
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reading = True      # not at EOF, not paused
        self.eof = False
        self.gone = False
        self.flushing = False
        self.watching = 0
        self.resuming = False    # a resume is listed for the turn's placing
        self.held = None         # the OwnLink of its transaction
        self.waiting_on = None   # the OwnLink of its wait
        self.link = None         # the StreamLink of its stream
        self.carrying = None     # the OwnLink its long request goes on, piece by piece
        self.upstream_full = False   # that link has its window of the request queued
        self.loop.want(self, READ)

    def ready(self, events):
        """What the turn found: a read, whose requests are gathered; or room to write."""
        if events & WRITE:
            self.loop.flush_soon(self)
        if not events & READ:
            return
        try:
            data = self.sock.recv(CLIENT_READ)
        except BlockingIOError:
            return
        except OSError:   # a reset: the client has gone
            data = b""
        if not data:
            self.eof = True
            if self.waiting_on is not None:   # it left while its command waits: that ends
                self.waiting_on.close()
        elif entries := self.feed(data):
            self.proxy.gather(entries)
        if self.out or self.eof or self.ended or self.owed >= OWED_MAX or \
                self.deferred is not None:   # else its replies will
            self.loop.flush_soon(self)   # the send phase writes, stops reading it, or closes it

    def park(self, entry, data):
        if not self.gone:   # else dropped, as what is written to it is
            super().park(entry, data)

    def writable(self):
        if self.gone:
            self.out.clear()
        elif not self.flushing:
            self.loop.flush_soon(self)

    def flush(self):
        """The turn's one send to this client, then what it is watched for."""
        self.flushing = False
        if self.gone:
            return
        if self.out:
            try:
                sent = self.sock.send(self.out)
            except BlockingIOError:
                sent = 0
            except OSError:   # it has gone: what it is still owed is read and dropped
                self.close()
                return
            del self.out[:sent]
            if len(self.out) > OUT_MAX:   # it does not read its replies: it may not hold them all
                self.proxy.count("dropped")
                self.close()
                return
            if self.drained is not None and self.backlog() < WINDOW:   # a long reply reads on
                drained, self.drained = self.drained, None
                drained()
        if (self.eof or self.ended) and self.done():
            self.close()
            return
        # else: back-pressure (backlog(), inline: this runs for every client in every turn)
        keeping_up = self.owed < OWED_MAX and len(self.out) + self.parked_bytes < OUT_HIGH
        if self.deferred is not None:
            keeping_up = keeping_up and len(self.deferred) < DEFERRED_MAX and \
                not self.upstream_full
            if self.link is not None and not self.link.watching & READ:
                self.loop.flush_soon(self.link)   # the stream may read again, if it waited
        self.reading = keeping_up and not (self.eof or self.ended)
        events = (READ if self.reading else 0) | (WRITE if self.out else 0)
        if events != self.watching:   # the common case, unchanged, costs not even a call
            self.loop.want(self, events)

    # -- what its session lends it (ClientStream's hooks)

    def idle(self):
        if not self.resuming and not self.gone:
            self.resuming = True
            self.loop.after_reads(self._resume)

    def _resume(self):
        self.resuming = False
        if self.gone:
            return
        if entries := self.resume():
            self.proxy._place(entries)
        self.loop.flush_soon(self)

    def busy(self):
        return self.link is not None and self.link.barriers > 0

    def lend(self, request):
        session = self.session
        try:
            if session.streams:
                if self.link is None:
                    self.link = StreamLink(self.proxy, self, WINDOW)
                # a barrier after each request, so what the pool answers next comes after its
                # reply; but not in MONITOR's stream, which would show the barrier's PING
                barrier = session.settles or not session.monitoring
                self.link.send(request, barrier)
                if not barrier:   # admission goes on
                    self.idle()
                return True
            if session.lease == HELD:
                link = self.held = self.held or OwnLink(self.proxy, self)
            else:   # a wait, or a long request: on one of its own, closed after its reply
                link = self.waiting_on = OwnLink(self.proxy, self)
            if isinstance(request, Head):
                self.carrying = link
            link.send(self, Entry(self, [request]), session.wait)
            return True
        except ManagedError as error:   # no connection of its own to be had: nothing is sent
            if session.streams:
                session.lost()
            self._answer([], [], None, self.framing.error(f"tcp-proxy: {error}"))
            self.idle()
            return False

    def pass_on(self, piece):
        link = self.carrying
        if link.extend(piece) >= UPSTREAM_QUEUED:   # its window is queued: read on once written
            self.upstream_full = True
            link.when_drained(self._upstream_drained)
        if not piece:   # the end (a Passed marker, no bytes of its own)
            self.carrying = None

    def _upstream_drained(self):
        self.upstream_full = False
        if not self.gone:
            self.loop.flush_soon(self)

    def cut(self):
        self.close()

    def own_replied(self, link):
        if link is self.held and not self.session.holds:   # the transaction is over
            self._let_go(link)
        elif link is self.waiting_on:
            self._let_go(link)

    def own_failed(self, link):
        self._let_go(link)
        self.idle()

    def _let_go(self, link):
        link.close()
        if link is self.held:
            self.held = None
        if link is self.waiting_on:
            self.waiting_on = None

    def answered(self):
        if self.link is not None and not self.session.streams:   # RESET, QUIT: the stream ends
            self._end_stream()
        if self.held is not None and not self.session.holds:   # an EXECABORT, RESET, QUIT the
            self._let_go(self.held)   # pool answered: its transaction's connection is never lent

    def stream_settled(self, link):
        if not self.session.streams:   # the last unsubscribe: the stream is over
            self._end_stream()
        self.idle()

    def stream_lost(self, link, message):
        self.link = None
        self.out += message
        self.ended = True   # the subscriber is told by its connection's end
        self.deferred = None
        self.loop.flush_soon(self)

    def _end_stream(self):
        link, self.link = self.link, None
        link.close()

    def close(self):
        if not self.gone:
            self.gone = True
            self.out.clear()
            for entry in self.waiting:
                entry.parked = []
            self.parked_bytes = 0
            self.loop.forget(self.sock)
            self.proxy.clients.discard(self)
            for link in (self.held, self.waiting_on, self.link):
                if link is not None:
                    link.close()
            if self.drained is not None:   # a long reply to it: its connection reads on
                drained, self.drained = self.drained, None
                drained()
