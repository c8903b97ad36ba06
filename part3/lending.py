"""lending: how SessionProxy (part3/framed.py) lends connections to a client whose session
keeps state (Redis: its protocol and database, a transaction, a subscription). A reader of
Part one need not read it: the session (part3/session.py's RedisSession, socket-free) decides
what each request needs, and the lender does it, with the pool's own parts: checkout(),
checkin(), read_reply(), in_step(), connect().

    Lending       one pool's lender (ground.session names what it drives): serve(session,
                  client, request, requests) for each request, close(session) once its
                  client has gone; facts() and next_id() for the sessions; what each
                  connection carries (its state), and how many connections of their own
                  its clients have (dedicated_cap)
    Passing       a long reply's pieces to the client as they come, the first judged first
    Refused       what it raises when a client may not have a connection of its own now
A stream's connection (SUBSCRIBE) is relayed by part3/streams.py.

The order a request takes: session.admit() (None: it goes upstream) -> lend(): the
connection the client holds, one of its own, or a checkout -> sync(): the requests that
bring that connection to the session's state (HELLO, SELECT; the pool's own AUTH on a
fresh one), in the same write as the request -> their replies read and checked -> the
wait, for a command that waits -> read_reply(), in_step() with the session's fit ->
session.replied() -> give_back(): kept by the client while it holds it, else checked in.
"""
import collections
import itertools
import math
import select
import threading
import time
import weakref

from ground.frames import Frames, Head, Passed, rest_of
from ground.server import ready, shutdown
from ground.session import POOLED
from tcp_proxy import OutOfStep

HANG_UP = getattr(select, "POLLRDHUP", 0)   # poll()'s "the peer has stopped sending" (Linux)


class Refused(Exception):
    """A request the pool will not take now (no dedicated connection free): its client is
    told why, and nothing of it is sent."""


class Lending:
    """What one SessionProxy does for its clients' sessions, beside Part one's exchange()."""

    def __init__(self, pool, framing):
        self.pool = pool
        self.framing = framing
        self.carries = weakref.WeakKeyDictionary()   # connection -> the state its sync left
        self.held = {}       # session -> the connection its client holds (a transaction)
        self.own = 0         # connections of a client's own open now (held, lent, or idle)
        self.own_idle = []   # such connections between two clients: clean, ready to lend
        self.waiting = 0     # requests waiting for one of them (the stats show it)
        self.closing = False   # the pool is closing: nobody waits for one any more
        self.dedicated = 0   # such connections ever opened (the tests read it)
        self.learned = None  # what the pool read of its server, once (facts())
        self.refusals = collections.Counter()   # command -> requests its sessions refused
        self.lock = threading.Condition()   # checkin_own() notifies it: one may be free
        self.ids = itertools.count(1)

    def next_id(self):
        return next(self.ids)

    def refused(self, command):
        with self.lock:   # sessions on many threads count here
            self.refusals[command] += 1

    def serve(self, session, client, request, requests):
        """One request: the session's own answer, or its trip on the connection its lease
        says; one too long to keep (a Head) is passed on as the rest comes."""
        answer = session.admit(request)
        rest = rest_of(requests) if isinstance(request, Head) else None
        if answer is not None:
            for _ in rest or ():   # read to its end, never sent
                pass
            if not session.holds:
                self.close(session)   # a hold the pool's own answer ended (RESET)
            client.sendall(answer)
            if session.quitting:   # QUIT: +OK, then the end; nothing after it is answered
                shutdown(client)
        elif session.streams:
            self.pool.stream(session, client, request, requests)
        else:
            client.sendall(self.exchange(session, request, client, rest))

    def exchange(self, session, request, client, rest=None):
        """Part one's exchange(), with what the session says: on which connection (lend()),
        what it must carry first (sync), how long the reply may take to begin (wait), and
        whether the client keeps the connection (give_back())."""
        sock = None
        outcome = "discarded"
        holding = session.holds
        passing = Passing(request, session.fits, client)   # a long reply: to the client as it comes
        try:
            sock = self.lend(session)
            sync = session.sync(self.carries.get(sock))
            self.send(sock, b"".join(sync) + request, client, rest)
            buffer = self.read_synced(sock, session, sync)
            if session.wait is not None:
                self.await_reply(sock, client, session.wait, buffer)
            reply, rest = self.pool.read_reply(sock, buffer, passing)
            in_step = self.pool.in_step(request, reply, rest, session.fits)
            outcome = "released" if in_step else "dirty"
            session.replied(request, reply)
            return reply
        except (OutOfStep, OSError) as error:
            outcome = "dirty" if isinstance(error, OutOfStep) else "discarded"
            if sock:
                self.pool.upstream_lost(sock, error)
            if holding:
                session.lost()   # the connection its transaction was on: the rest is refused
            if passing.begun:   # a reply half given cannot be taken back: the client's ends too
                shutdown(client)
            return self.framing.error(f"upstream: {error}")
        except ValueError as error:   # the client's long request: malformed, or too slow
            if holding:   # half a request went up: the connection is closed, never lent
                session.lost()
            return self.framing.error(str(error))
        except Refused as error:
            return self.framing.error(f"tcp-proxy: {error}")
        finally:
            if sock:   # a connection that failed or is out of step is never lent again
                self.give_back(session, sock, outcome)

    # --- which connection: the shared pool's, or one of the client's own; and after

    def lend(self, session):
        """A pooled request: a checkout from the shared pool. A transaction's (HELD), a wait's
        or a long request's (OWN): the connection the client holds, else one of its own, so
        that no client can keep the shared pool's connections from the others."""
        if session.lease == POOLED:
            return self.pool.checkout()
        with self.lock:
            held = self.held.pop(session, None)
        return held or self.checkout_own()

    def give_back(self, session, sock, outcome):
        """The client keeps a connection its session holds; any other goes back where it came
        from (parked, or closed, by the outcome)."""
        if session.lease == POOLED:
            self.pool.checkin(sock, outcome)
        elif outcome == "released" and session.holds:
            with self.lock:
                self.held[session] = sock
        else:
            self.checkin_own(sock, outcome)

    def close(self, session):
        """Close the connection a session's client held (it has gone, or the pool's own
        answer ended its hold): it may carry a transaction, so it is never lent again."""
        with self.lock:
            sock = self.held.pop(session, None)
        if sock:
            self.checkin_own(sock, "discarded")

    def expire(self, session, why):
        """The client held its connection too long without a request: it is closed, and the
        rest of the client's transaction is refused, saying why."""
        self.close(session)
        session.lost(why)

    def checkout_own(self):
        """A connection of a client's own, never lent to another while it is (a transaction's,
        a wait's, a stream's): one left clean by the last, or a new one within the framing's
        dedicated_cap, or the next one free within checkout_timeout; else Refused, naming the
        cap (the client is told; nothing is sent)."""
        cap, patience = self.framing.dedicated_cap, self.pool.checkout_timeout
        with self.lock:
            self.waiting += 1
            try:
                free = self.lock.wait_for(lambda: self.own_idle or self.own < cap or
                                          self.closing, patience)
            finally:
                self.waiting -= 1
            if not free:
                raise Refused(f"no connection of its own free within {patience:g} s: the "
                              f"pool's {cap} dedicated connections are all in use")
            if self.closing:
                raise ConnectionAbortedError("proxy closed")
            while self.own_idle:
                sock = self.own_idle.pop()
                if not ready(sock, timeout=0):   # it has said nothing since its last reply
                    return sock
                self.own -= 1   # bytes nobody asked for, or an EOF: closed, its place free
                self.pool.forget(sock)
            self.own += 1
            self.dedicated += 1
        try:
            return self.pool.connect(self.pool.upstream_addr, self.pool.reply_timeout)
        except BaseException:
            self.checkin_own(None, "discarded")
            raise

    def close_all(self):
        """The pool is closing: whoever waits for a connection of its own stops waiting."""
        with self.lock:
            self.closing = True
            self.lock.notify_all()

    def checkin_own(self, sock, outcome):
        """A connection of a client's own, done with: kept for the next if it was released
        (its reply whole and in step, nothing held), else closed."""
        with self.lock:
            if outcome == "released":
                self.own_idle.append(sock)
            else:
                self.own -= 1
                if sock is not None:
                    self.pool.forget(sock)
            self.lock.notify()
        self.pool.count(outcome)   # counted as the shared pool's checkins are

    # --- the state sync, the wait, the pool's own requests

    def send(self, sock, data, client=None, rest=None):
        """A request (with the sync before it) in one write; then the rest of a long request,
        each piece as the client sends it (within the pool's request_timeout: a ValueError
        past it, from the client's requests)."""
        sock.sendall(data)
        for piece in rest or ():
            sock.sendall(piece)
            if isinstance(piece, Passed):
                return
        if rest is not None:
            raise ConnectionAbortedError("the client left in the middle of its request")

    def read_synced(self, sock, session, sync):
        """The replies to a sync, each checked (session.synced()); the bytes read past them."""
        if not sync:
            return b""
        replies, rest = self.read_framed(sock, len(sync))
        for request, reply in zip(sync, replies):
            if reason := session.synced(request, reply):
                raise ConnectionError(f"the connection could not take the client's state: "
                                      f"{reason}")
        self.carries[sock] = session.state
        return rest

    def read_framed(self, sock, count, buffer=b""):
        """count whole replies to the pool's own requests, and the bytes read past them:
        framed whatever the release rule, within exchange_timeout."""
        deadline = time.monotonic() + self.pool.exchange_timeout
        frames = Frames(self.framing.reply_parser, buffer)
        replies = []
        try:
            while len(replies) < count:
                if (reply := frames.take()) is None:
                    frames.feed(self.pool.more_before(sock, deadline))
                else:
                    replies.append(reply)
        except ValueError as error:
            raise OutOfStep(f"out of step: {error}") from None
        return replies, frames.rest()

    def facts(self):
        """What the pool reads of its server once (the framing's facts_requests(): Redis's
        version, mode, role and databases), on a pooled connection, made ready as any is."""
        if self.learned is not None:
            return self.learned
        sock, outcome = self.pool.checkout(), "discarded"
        try:
            state = self.carries.get(sock)
            opening = self.framing.opening() if state is None else []
            asked = self.framing.facts_requests()
            sock.sendall(b"".join(opening + asked))
            replies, rest = self.read_framed(sock, len(opening) + len(asked))
            for request, reply in zip(opening, replies):
                if reply != b"+OK\r\n":
                    raise ConnectionRefusedError(f"the upstream refused the pool's own "
                                                 f"AUTH: {reply[:60].strip()!r}")
            self.carries[sock] = state or self.framing.fresh_state
            self.learned = self.framing.facts(replies[len(opening):])
            outcome = "dirty" if rest else "released"
            return self.learned
        finally:
            self.pool.checkin(sock, outcome)

    def await_reply(self, sock, client, wait, buffer=b""):
        """Before the reply to a request that waits (BLPOP): as long as its own timeout says
        and reply_timeout more, or for ever (math.inf) while the client stays; a client that
        hangs up ends the wait (its connection is closed: its command is still waiting)."""
        if buffer:
            return
        deadline = time.monotonic() + wait + self.pool.reply_timeout
        poller = select.poll()   # not select(): that fails on descriptors above 1023
        poller.register(sock, select.POLLIN)
        poller.register(client, HANG_UP)
        while (remaining := deadline - time.monotonic()) > 0:
            timeout = None if math.isinf(remaining) else math.ceil(remaining * 1000)
            ready = dict(poller.poll(timeout))
            if sock.fileno() in ready:
                return
            if client.fileno() in ready:
                raise ConnectionAbortedError("the client left while its request waited")
        raise TimeoutError(f"no reply within the {wait:g} s it waits, and "
                           f"{self.pool.reply_timeout:g} s more")


class Passing:
    """Where a long reply's pieces go (FramedProxy.read_reply(passing=)): to the client as
    they come, once the first is judged to fit the request. `begun`: some have gone, so a
    failure now ends the client's connection too (half a reply cannot be taken back)."""

    def __init__(self, request, fits, client):
        self.request, self.fits, self.client = request, fits, client
        self.begun = False

    def __call__(self, piece):
        if isinstance(piece, Head) and not self.fits(self.request, piece):
            raise OutOfStep(f"out of step: a long reply that does not answer "
                            f"{self.request[:40]!r}")
        self.client.sendall(piece)
        self.begun = True
