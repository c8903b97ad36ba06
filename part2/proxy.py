"""proxy: ManagedProxy, twemproxy's shape built from the lesson's parts, on one loop.

    ManagedProxy   a listener and every client connection on the set's loop; close()
                   ends it all
    ProxyClient    one client connection (part2/downstream.py)

The order a request takes: the client's transport reads -> ClientStream.received():
framed (ground.frames.Frames), admitted (framing.session().admit(): None sends it on, bytes
are the pool's own answer), a Request each, queued in the client's order -> the set's
gather(): once the turn's reads are over, one pick and one write per connection for
every client's requests (a client's requests in flight all on one connection: two
connections may run what they carry in either order) -> the connection's transport
sends -> the replies, read, fit-checked and paired with their requests (pipeline.py) ->
each client's replied(), in its own order -> one send per client, in the turn's send phase.

With a framing whose sessions keep state (RESP), each request carries its client's state
and the connection's pipeline syncs to it first (HELLO, SELECT); a transaction, a wait,
a stream or a long request goes on a connection of the client's own (part2/lease.py).
"""
import contextlib
import socket

from part2.clock import check_seconds
from part2.downstream import ProxyClient
from part2.lease import ManagedLending
from part2.handoff import start_thread
from part2.hooks import Counted
from part2.loop import READ, Loop
from part2.managed_set import ManagedSet, check_services
from part2.pipeline import Pace
from ground.server import (ACCEPT_BACKOFF, LISTEN_BACKLOG, Spare, host_and_port,
                           out_of_descriptors, turn_away)
from tcp_proxy import LINES

ACCEPTS_PER_TURN = 64     # connections accepted in one turn; the rest wait for the next


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
        self.pace = Pace()     # the shared connections' pace: each client's fair share
        try:   # a setting the set refuses, or a listen that fails, leaves nothing open
            self.managed_set = ManagedSet(services, framing=framing, msg_timeout=msg_timeout,
                                          msg_timeout_is_fatal=msg_timeout_is_fatal,
                                          loop=self.loop, pace=self.pace, **set_options)
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
