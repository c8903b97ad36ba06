"""lending: how FramedProxy lends connections to a client whose session keeps state (Redis:
its protocol and database, a transaction, a subscription). A reader of Part one need not
read it: FramedProxy hands each request to its session's serve(), and a Redis session
(resp.RedisSession, socket-free) decides what the request needs; this module does it,
with the pool's own parts: checkout(), checkin(), read_reply(), in_step(), connect().

    Lending       one pool's lender: serve(session, client, request, requests) for each
                  request, close(session) once its client has gone; facts() and
                  next_id() for the sessions; what each connection carries (its state),
                  and how many connections of their own its clients have (dedicated_cap)
    Passing       a long reply's pieces to the client as they come, the first judged first
    StreamRelay   a stream's connection (SUBSCRIBE) relayed to its client by a thread

The order a request takes: session.admit() (None: it goes upstream) -> lend(): the
connection the client holds, one of its own, or a checkout -> sync(): the requests that
bring that connection to the session's state (HELLO, SELECT; the pool's own AUTH on a
fresh one), in the same write as the request -> their replies read and checked -> the
wait, for a command that waits -> read_reply(), in_step() with the session's fit ->
session.replied() -> give_back(): kept by the client while it holds it, else checked in.

What a session offers its pool (the interface; a pool drives it one request at a time):
    admit(request)          None: send it on; bytes: the pool's own answer
    lease                   POOLED (a checkout for this request), HELD (the connection the
                            client holds while `holds`), OWN (one opened for it, closed after)
    state, sync(state)      what a connection must carry; the requests that bring one there
    synced(request, reply)  why a reply to one of those is wrong, or None
    fits(request, reply), replied(request, reply), holds, wait
    streams, settles, barrier(), pushed(message)   a stream's messages, and its end
    lost()                  the connection its mode lived on is gone
    quitting                the client asked to end
"""
import contextlib
import itertools
import math
import select
import threading
import time
import weakref

from part2.pipeline import OWN
from tcp_proxy import Frames, Head, OutOfStep, Passed, recv, shutdown

HANG_UP = getattr(select, "POLLRDHUP", 0)   # poll()'s "the peer has stopped sending" (Linux)
LENDERS = weakref.WeakKeyDictionary()   # pool -> its Lending
MADE = threading.Lock()   # held while a pool's Lending is made


def lender_of(pool):
    """The pool's Lending, made the first time a session asks."""
    with MADE:
        if pool not in LENDERS:   # a pool with a lending of its own (ManagedProxy) has it made
            LENDERS[pool] = getattr(pool, "lending", None) or Lending(pool)
        return LENDERS[pool]


class Refused(Exception):
    """A request the pool will not take now (no dedicated connection free): its client is
    told why, and nothing of it is sent."""


class Lending:
    """What one pool does for its clients' sessions, beside its Part one exchange()."""

    def __init__(self, pool):
        self.pool = pool
        self.framing = pool.framing
        self.carries = weakref.WeakKeyDictionary()   # connection -> the state its sync left
        self.held = {}       # session -> the connection its client holds (a transaction)
        self.own = 0         # connections of a client's own (a wait, a stream) open now
        self.dedicated = 0   # such connections ever opened (the tests read it)
        self.learned = None  # what the pool read of its server, once (facts())
        self.lock = threading.Lock()
        self.ids = itertools.count(1)

    def next_id(self):
        return next(self.ids)

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
            self.stream(session, client, request, requests)
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
            if holding:
                session.lost()   # the connection its transaction was on: the rest is refused
            if passing.begun:   # a reply half given cannot be taken back: the client's ends too
                shutdown(client)
            return self.framing.error(f"upstream: {error}")
        except Refused as error:
            return self.framing.error(f"tcp-proxy: {error}")
        finally:
            if sock:   # a connection that failed or is out of step is never lent again
                self.give_back(session, sock, outcome)

    # --- which connection: held, its own, or a checkout; and where it goes after

    def lend(self, session):
        if session.lease == OWN:
            return self.open_own()
        with self.lock:
            held = self.held.pop(session, None)
        return held or self.pool.checkout()

    def give_back(self, session, sock, outcome):
        """The client keeps a connection its session holds; its own one is closed; any other
        is checked in (parked or closed, by the outcome)."""
        if session.lease == OWN:
            self.close_own(sock)
        elif outcome == "released" and session.holds:
            with self.lock:
                self.held[session] = sock
        else:
            self.pool.checkin(sock, outcome)

    def close(self, session):
        """Close the connection a session's client held (it has gone, or the pool's own
        answer ended its hold): it may carry a transaction, so it is never lent again."""
        with self.lock:
            sock = self.held.pop(session, None)
        if sock:
            self.pool.checkin(sock, "discarded")

    def open_own(self):
        """A connection for one client's wait or stream, never pooled: within the framing's
        dedicated_cap, else Refused (the client is told; nothing is sent)."""
        cap = self.framing.dedicated_cap
        with self.lock:
            if self.own >= cap:
                raise Refused(f"no connection of its own for this request: the pool's {cap} "
                              f"dedicated connections are all in use")
            self.own += 1
            self.dedicated += 1
        try:
            return self.pool.connect(self.pool.upstream_addr, self.pool.reply_timeout)
        except BaseException:
            with self.lock:
                self.own -= 1
            raise

    def close_own(self, sock):
        with self.lock:
            self.own -= 1
        self.pool.forget(sock)

    # --- the state sync, the wait, the pool's own requests

    def send(self, sock, data, client=None, rest=None):
        """A request (with the sync before it) in one write; then the rest of a long request,
        each piece as the client sends it, its silences bounded by reply_timeout."""
        sock.sendall(data)
        if rest is None:
            return
        client.settimeout(self.pool.reply_timeout)   # a silence: recv() gives b"", rest ends
        try:
            for piece in rest:
                sock.sendall(piece)
                if isinstance(piece, Passed):
                    return
        finally:
            client.settimeout(None)
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

    # --- a stream

    def stream(self, session, client, request, requests):
        """A request that makes its connection a stream (SUBSCRIBE): a connection of its own,
        relayed to the client by a thread of its own (StreamRelay) while the client's next
        requests go on it, until the stream ends (the last unsubscribe, as the replies count
        them), the client leaves or asks to end; then it is closed, never pooled. Before the
        pool answers anything itself, a barrier: every reply owed has reached the client."""
        try:
            sock = self.open_own()
        except Refused as error:
            session.lost()
            client.sendall(self.framing.error(f"tcp-proxy: {error}"))
            return
        except OSError as error:
            session.lost()
            client.sendall(self.framing.error(f"upstream: {error}"))
            return
        relay = None
        try:
            sync = session.sync(None)
            sock.sendall(b"".join(sync))
            buffer = self.read_synced(sock, session, sync)   # the stream's first bytes, if any
            relay = StreamRelay(self.pool, sock, client, session, buffer)
            relay.send(request)
            while session.streams and not relay.ended:
                if (request := self.pool.next_request(client, requests)) is None:
                    return
                answer = session.admit(request)
                for _ in rest_of(requests) if isinstance(request, Head) else ():
                    pass   # a long request is never sent on a stream: refused, read to its end
                if answer is None:
                    relay.send(request)
                    continue
                relay.settle()   # every reply owed before the pool's own answer goes first
                if not session.streams:
                    relay.stop()   # the stream has ended (RESET, QUIT): nothing may follow
                relay.write(answer)
                if session.quitting:
                    shutdown(client)
                    return
        except (OSError, OutOfStep) as error:
            message = self.framing.error(f"upstream: {error}")
            if relay:
                relay.write(message)
            else:
                client.sendall(message)
        finally:
            if relay:
                relay.stop()
            self.close_own(sock)
            if session.streams:   # the upstream ended it: the subscriber is told by its end
                session.lost()
                shutdown(client)


def rest_of(requests):
    """The pieces of a long request after its Head, as they arrive, up to its end."""
    for piece in requests:
        yield piece
        if isinstance(piece, Passed):
            return


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


class StreamRelay:
    """One stream's two directions (Lending.stream()): its connection's messages to the
    client as they come, each whole (a long one passed on as it arrives), by a thread of its
    own; the client's requests to it; and the barrier between them: after a request that
    settles, and before the pool's own answer, the session's barrier() goes too, and every
    reply owed before it has reached the client once the barrier's own reply is back."""

    def __init__(self, pool, sock, client, session, buffer):
        self.pool, self.sock, self.client, self.session = pool, sock, client, session
        self.writing = threading.Lock()   # each write to the client whole: relayed, or the pool's
        self.settled = threading.Condition()   # barriers sent and seen; the thread's end
        self.sent = self.seen = 0
        self.passing = False    # a long message is going to the client: `writing` is held
        self.ended = False      # the thread has stopped: the stream is over, whoever ended it
        self.stopping = False   # stop() ended it, not the upstream
        sock.settimeout(None)   # a stream is silent for as long as it likes
        self.thread = pool.spawn(self.run, buffer)

    def send(self, request):
        """A request on the stream; one that settles takes a barrier along, and is waited for."""
        barrier = self.session.barrier() if self.session.settles else b""
        with self.settled:
            self.sent += bool(barrier)
            target = self.sent
        self.sock.sendall(request + barrier)
        self.wait(target)

    def settle(self):
        """A barrier alone: every reply owed before it has reached the client once it returns."""
        with self.settled:
            self.sent += 1
            target = self.sent
        self.sock.sendall(self.session.barrier())
        self.wait(target)

    def wait(self, target):
        with self.settled:
            if not self.settled.wait_for(lambda: self.seen >= target or self.ended,
                                         self.pool.exchange_timeout):
                raise TimeoutError(f"no reply to the pool's barrier within "
                                   f"{self.pool.exchange_timeout:g} s")

    def write(self, data):
        with self.writing, contextlib.suppress(OSError):   # a client gone: its handler ends
            self.client.sendall(data)

    def stop(self):
        self.stopping = True
        shutdown(self.sock)   # wakes the thread's recv()
        if self.thread is not threading.current_thread():
            self.thread.join()

    def run(self, buffer):
        frames = Frames(lambda: self.pool.framing.reply_parser(passing=True), buffer)
        try:
            while True:
                while (message := frames.take()) is not None:
                    self.relay(message)
                if not (data := recv(self.sock)):
                    return
                frames.feed(data)
        except (ValueError, OSError) as error:   # out of step, or a client gone
            if not self.stopping and not self.passing:
                self.write(self.pool.framing.error(f"upstream: out of step: {error}"))
        finally:
            if self.passing:
                self.writing.release()
            with self.settled:
                self.ended = True
                self.settled.notify_all()
            if not self.stopping:   # the upstream ended it: so does the client's connection
                shutdown(self.client)

    def relay(self, message):
        """One message, or one piece of a long one: to the client, unless it is the reply to
        the pool's own barrier."""
        if isinstance(message, Head):
            self.writing.acquire()
            self.passing = True
        if self.passing:
            self.client.sendall(message)   # a Passed marker has no bytes: it is the end
            if isinstance(message, Passed):
                self.passing = False
                self.writing.release()
            return
        with self.settled:
            if not (theirs := self.session.pushed(message)):
                self.seen += 1
                self.settled.notify_all()
        if theirs:
            with self.writing:
                self.client.sendall(message)
