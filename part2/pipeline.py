"""pipeline: the socket-free core of Part two; the lesson's checkin, for many calls at once.

    Pipeline      one upstream connection: runs of requests in, their bytes out (queue(),
                  wrote()); the upstream's bytes in (feed()), each reply framed where it
                  ends, fit-checked against the request it answers (framing.fits) and
                  handed to that request's run, oldest first; lose() turns every reply
                  still owed into an error, in order
    OutOfStep     what feed() raises when the upstream says what no request asked for
    Entry         a place in a proxy client's order: what it sent in one read, whose
                  replies go into the client's bytes once the places before it are
    hand_out()    the one loop that does so, for the replies of many entries at once
    ClientStream  one proxy client: its bytes in, whole requests out (framed by
                  ground.frames.Frames, admitted by the framing's session), grouped as
                  entries; the replies to them out as bytes, in the client's own order

No socket, thread, clock or lock: the connection and the proxy drive them from the loop,
and the tests drive them with bytes. A reply can only settle the oldest request owed: the
protocol carries no request ids, so order is the only thing that matches them.
"""
import collections

from ground.session import POOLED, NotYet
from part2.calls import Run
from ground.frames import Frames, Head, Passed



class OutOfStep(Exception):
    """The upstream's bytes cannot be the replies owed: the connection must end. str() is
    the reason it ends for; lost, what the calls owed on it are told; reply, the reply that
    proved it (if one did); run, the run that reply failed to answer (if any)."""

    def __init__(self, reason, lost=None, reply=None, run=None):
        super().__init__(reason)
        self.lost = lost or reason
        self.reply, self.run = reply, run


class StateRefused(OutOfStep):
    """A reply to the pipeline's own sync says the connection did not take the state."""


class SyncCheck:
    """The sink of the requests a pipeline queues to bring its connection to a client's
    state (framing.sync()): each reply checked by framing.synced(); a wrong one is out of
    step (every call owed on the connection gets an error), and no client ever sees them."""

    def __init__(self, framing):
        self.framing = framing

    def replied(self, run, replies):
        first = run.answered - len(replies)
        for request, reply in zip(run.requests[first:], replies):
            if reason := self.framing.synced(request, reply):
                raise StateRefused(f"the connection could not take a client's state: {reason}")

    def failed(self, run, error):
        """Its requests are the pool's own: no one waits for them."""


class Pipeline:
    """The owed replies of one upstream connection, kept as runs, oldest first.

    settled(run, replies, first) is called after each run's share of a read: replies
    answered run.requests[first:first + len(replies)] (the run's sink has been told,
    unless the run was abandoned: then they were thrown away). check_fit=False trusts
    every reply (scaffolding: the forgetful client of the demo's first scenario).

    With a framing whose connections carry a client's state (one with sync(): Redis's
    protocol and database), the pipeline keeps the state its queue leaves the connection
    in (`carries`); a run whose state differs goes after the framing's sync requests, a
    run of the pipeline's own (SyncCheck). So clients of many states share one connection,
    each request carried out in its own client's state."""

    def __init__(self, framing, settled, check_fit=True):
        self.framing = framing
        self.settled = settled
        self.check_fit = check_fit
        self.frames = passing_frames(framing, framing.reply_parser)   # a reply keeps its place
        self.owed = collections.deque()         # runs written (or being written), oldest first
        self.out = bytearray()                   # requests queued and not yet written
        self.unwritten = collections.deque()   # (end, run): runs whose last byte is not written
        self.queued = 0        # bytes ever queued
        self.written = 0       # bytes ever written
        self.answered = False  # a reply has come: from now on an EOF may be quiet
        self.lost = False      # lose() was called: nothing more is delivered
        self.syncs = hasattr(framing, "sync")   # its connections carry a client's state
        self.carries = None    # the state the end of the queue leaves (None: just opened)
        self.passing_to = None   # whose out a long reply's pieces go to, while one passes

    def queue(self, run):
        """A run's requests go out after every request queued before them (and the sync its
        state needs); return how many requests of the pipeline's own went before it."""
        synced = 0
        if self.syncs and (self.carries is None or run.state and run.state != self.carries):
            synced = self._sync(run)
        self.out += run.data
        self.queued += len(run.data)
        self.owed.append(run)
        self.unwritten.append((self.queued, run))
        return synced

    def _sync(self, run):
        wanted = run.state or self.framing.fresh_state   # a run that asks nothing: as opened
        requests = self.framing.sync(self.carries, wanted)
        self.carries = wanted
        if requests:
            self.queue(Run(requests, SyncCheck(self.framing), run.deadline))
        return len(requests)

    def wrote(self, count):
        """count bytes of out have been written; return the runs now written whole."""
        del self.out[:count]
        self.written += count
        done = []
        while self.unwritten and self.unwritten[0][0] <= self.written:
            done.append(self.unwritten.popleft()[1])
        return done

    def is_written(self, run):
        return not any(pending is run for _, pending in self.unwritten)

    def feed(self, data):
        """The upstream's bytes: every whole reply in them settles the oldest request owed; a
        reply longer than the framing keeps is passed to its sink piece by piece (passing()),
        its Head judged first, and settles its request at its end (a Passed, no bytes)."""
        frames, owed = self.frames, self.owed
        fits = self.framing.fits if self.check_fit else None
        frames.feed(data)
        taken, error = frames.take_all()
        if frames.pieces:   # a long reply's last pieces, taken from the bytes but not given
            taken += pieces_left(frames)
        run, replies, first = None, [], 0
        try:
            for reply in taken:
                if self.lost:
                    return
                if run is None:
                    if not owed:
                        raise OutOfStep("a reply no call was waiting for", "unexpected reply",
                                        reply)
                    run, first = owed[0], owed[0].answered
                if type(reply) is not bytes:   # a long reply's piece, or its end
                    if not isinstance(reply, Passed):
                        if replies:   # the run's replies before it go first
                            self._settle(run, replies, first)
                            replies, first = [], run.answered
                        self._pass(run, reply, fits)
                        continue
                    self.passing_to = None   # its end settles its request as a reply does
                if fits and not fits(run.requests[run.answered], reply, framed=True):
                    raise OutOfStep("a reply that does not fit its request",
                                    "upstream out of step: a reply did not fit its request",
                                    reply, run)
                run.answered += 1   # the load-bearing line: a reply settles the oldest request owed
                replies.append(reply)
                self.answered = True
                if run.answered == len(run.requests):   # the run is over: its sink is told now
                    owed.popleft()
                    if not run.abandoned:
                        run.sink.replied(run, replies)
                    self.settled(run, replies, first)
                    run, replies = None, []
        except StateRefused:   # told already: nothing of its run is settled again
            replies = []
            raise
        finally:
            if replies:   # the run's share so far, told before whatever ends the read
                self._settle(run, replies, first)
        if error is not None and not self.lost:   # bytes no reply starts with
            why = f"upstream out of step: a reply {self.framing!r} cannot frame ({error})"
            raise OutOfStep(why)
        if len(frames.unread) > self.framing.max_reply and not self.lost:
            raise OutOfStep(f"upstream out of step: a reply longer than "
                            f"{self.framing.max_reply} bytes")

    def _pass(self, run, piece, fits):
        """A piece of a long reply to run's sink (its Head judged first); the sink says whose
        out it went to, so the connection can stop reading while that one is full."""
        passing = getattr(run.sink, "passing", None)
        if isinstance(piece, Head):
            request = run.requests[run.answered]
            if fits and not fits(request, piece, framed=True):
                raise OutOfStep("a long reply that does not fit its request",
                                "upstream out of step: a long reply did not fit its request",
                                None, run)
            if passing is None and not run.abandoned:   # a thread's call takes replies whole
                raise OutOfStep(f"upstream out of step: a reply longer than "
                                f"{self.framing.max_reply} bytes")
        if not run.abandoned:
            self.passing_to = passing(run, piece)

    def _settle(self, run, replies, first):
        if not run.abandoned:
            run.sink.replied(run, replies)
        self.settled(run, replies, first)

    def drop(self, run):
        """Forget a run, so its reply goes to the run behind it: the bug scenario 1 shows."""
        self.owed.remove(run)

    def lose(self, error):
        """The connection is lost: every request still owed gets error, oldest first; return
        how many that was (abandoned ones included, whose callers already have theirs)."""
        self.lost = True
        if self.passing_to is not None:   # half a reply cannot be taken back: its client's ends
            self.passing_to.cut()
        owed, self.owed = self.owed, collections.deque()
        lost = 0
        for run in owed:
            lost += run.owing_count()
            run.fail(error)
        return lost

    def extend(self, run, piece):
        """More bytes of run's one long request, the last run queued, as they come."""
        self.out += piece
        self.queued += len(piece)
        if self.unwritten and self.unwritten[-1][1] is run:
            self.unwritten[-1] = (self.queued, run)
        else:
            self.unwritten.append((self.queued, run))


def passing_frames(framing, new_parser):
    """Frames for a framing's messages: one that can pass a long message on in pieces
    (RESP's parsers, passing=True) does; any other keeps each message whole."""
    if getattr(framing, "passes_long", False):
        return Frames(lambda: new_parser(passing=True))
    return Frames(new_parser)


def pieces_left(frames):
    """The pieces of a long message Frames.take_all() left behind: it stops once the bytes
    are all read, with a message's last pieces taken from them but not given."""
    pieces = list(frames.pieces)
    frames.pieces.clear()
    return pieces


class Entry:
    """One place in a proxy client's order, taken as it is made: requests it sent in one
    read, or the bytes the pool answered itself. The sink of a run of those requests (or
    one of a batch's, see hand_out()): a reply to the oldest entry waiting goes to the
    stream's bytes at once; one to a later entry is parked until the entries before it
    are written."""
    __slots__ = ("stream", "requests", "data", "left", "parked", "state")

    def __init__(self, stream, requests, answer=None, data=None, state=None):
        self.stream = stream
        # its client's state as of its place in the client's order: the state its requests
        # were admitted in, which a state change admitted after them (SELECT) does not touch
        self.state = stream.session.state if state is None else state
        self.requests = requests       # what goes upstream ([] for an answer of the pool's)
        self.data = b"".join(requests) if data is None else data   # the same, end to end
        self.left = len(requests)      # requests still owed a reply or an error
        self.parked = []               # what waits for the entries before it (stream.park())
        if answer is not None:
            stream.park(self, answer)
        stream.owed += self.left
        stream.waiting.append(self)

    def replied(self, run, replies):
        hand_out([self] * len(replies), replies)

    def passing(self, run, piece):
        """A piece of a long reply: to the client's bytes, or parked behind the entries before
        it; return the stream it is for."""
        stream = self.stream
        if self is stream.waiting[0]:
            idle = not stream.out
            stream.out += piece
            if idle:
                stream.writable()
        else:
            stream.park(self, bytes(piece))
        return stream

    def failed(self, run, error):
        stream = self.stream
        message = stream.framing.error(f"{type(error).__name__}: {error}")
        stream.counts.failed += self.left
        stream.owed -= self.left
        if self is stream.waiting[0]:
            stream.out += message * self.left
            stream.writable()
        else:
            stream.park(self, message * self.left)
        self.left = 0
        stream.advance()


def hand_out(entries, replies):
    """Each reply to the entry beside it (the two lists in step, in the order the replies
    came), whatever its client: into the client's bytes at once if that entry is the oldest
    its client waits for, else parked until the entries before it are written. One loop for
    a batch's replies: no call per reply but the one that gives a client its first bytes."""
    for entry, reply in zip(entries, replies):
        stream = entry.stream
        entry.left -= 1
        stream.owed -= 1
        stream.counts.answered += 1
        if entry is not stream.waiting[0]:
            stream.park(entry, reply)   # written once the entries before it are
            continue
        out = stream.out
        idle = not out   # no send arranged yet: the stream is told (see writable())
        out += reply
        if idle:
            stream.writable()
        if not entry.left:
            stream.waiting.popleft()
            if stream.waiting:
                stream.advance()
            elif stream.deferred is not None:   # admission waited for every reply: it goes on
                stream.idle()


class ClientStream:
    """One proxy client, without its socket: requests in, replies out in its own order.

    feed(data) returns the new entries whose requests must go upstream; `out` holds the
    bytes to write to the client, each reply after the replies to every request before
    it, whichever connection brought it; what came before its turn is parked in its entry,
    and counts with out in backlog(), which the client's bounds are held against. A request
    the framing cannot read ends the stream: the client is told why after its earlier
    replies, and nothing after it is read. counts is told answered (replies from upstream)
    and failed (errors made).

    Given its pool, the framing's session keeps the client's state: each entry records the
    state its requests need (a pipeline syncs its connection to it). A request the session
    lends a connection of the client's own (session.lease: a transaction's, a wait's, a
    stream's) waits until every request before it is answered, then goes by lend() (a
    subclass's); the requests after it wait (`deferred`, not yet admitted) until its reply
    is in, so the session judges each after the one before it, as in FramedProxy. So does
    a request whose answer needs what the pool is still learning (NotYet)."""

    def __init__(self, framing, counts, pool=None):
        self.framing = framing
        self.counts = counts
        self.frames = passing_frames(framing, framing.request_parser)
        # what the pool answers itself, before any upstream; its lender does what it says
        self.session = framing.session(pool.lending if pool else None)
        self.waiting = collections.deque()   # entries not yet written whole, in the client's order
        self.out = bytearray()     # bytes for the client
        self.parked_bytes = 0      # bytes for it parked behind an entry still owed (park())
        self.owed = 0              # requests sent upstream and not yet answered
        self.ended = False         # a request could not be framed: nothing more is read
        self.deferred = None       # requests read and not yet admitted (None: admitting)
        self.deferred_error = None   # the framing's error after them
        self.lent = None           # a request waiting to go on a connection of the client's own
        self.sending = False       # a long request lent is going on, piece by piece (pass_on())
        self.skipping = False      # a long request refused: its pieces are read and dropped
        self.drained = None        # what to call once out is short again (a long reply waits)

    def feed(self, data, held=None):
        """The client's bytes; return the entries to send upstream, in order. Bytes that are
        whole requests, every one sent on, are the entry's bytes as they came. Each request
        the session admits is sent on, answered by the pool, or lent a connection of the
        client's own. held: (requests, error) read before, admitted now (resume())."""
        if held is None:
            if self.ended:
                return []
            frames = self.frames
            plain = not frames.unread   # no request begun before: its bytes may be all requests
            frames.feed(data)
            taken, error = frames.take_all()
            if frames.pieces:   # a long request's last pieces, taken from the bytes but not given
                taken += pieces_left(frames)
            if self.deferred is not None:   # admission waits: these wait behind the rest
                self.deferred += taken
                self.deferred_error = self.deferred_error or error
                if self.sending:
                    self._send_pieces()
                return []
            whole = bytes(data) if plain and not frames.unread else None
        else:
            (taken, error), whole = held, None
        session = self.session
        admit = session.admit
        entries, requests = [], []
        state = session.state   # the state `requests` were admitted in
        rest = iter(taken)
        for request in rest:
            long = type(request) is not bytes   # a long request's Head, a piece, its end
            if long and not isinstance(request, Head):   # of one refused: read, dropped
                self.skipping = self.skipping and not isinstance(request, Passed)
                continue
            try:
                answer = admit(request)
            except NotYet as not_yet:   # the pool is learning what the answer needs
                not_yet.then(self.idle)
                return self._defer(entries, requests, state, [request, *rest], error,
                                   at_once=False)
            if answer is None:
                if session.lease == POOLED and not long:
                    requests.append(request)
                    continue
                self.lent = request   # after every reply before it: on one of its own
                return self._defer(entries, requests, state, list(rest), error)
            whole = None
            self.skipping = isinstance(request, Head)   # refused: the rest of it is dropped
            requests = self._answer(entries, requests, state, answer)
            state = session.state   # what the answer changed applies from here on
            self.answered()
        if error is not None:   # the framing's: nothing after it can be framed
            self.ended = True
            self._answer(entries, requests, state, self.framing.error(str(error)))
            return entries
        if requests:   # owed replies: nothing to write yet
            entries.append(Entry(self, requests, data=whole, state=state))
        if session.quitting:   # QUIT: nothing after it is read
            self.ended = True
        return entries

    def _defer(self, entries, requests, state, rest, error, at_once=True):
        if requests:
            entries.append(Entry(self, requests, state=state))
        self.deferred, self.deferred_error = rest, error
        if at_once and not self.waiting:   # nothing before it owed: it goes on now
            self.idle()
        return entries

    def idle(self):
        """Every request admitted has been answered (or what admission waited for is in):
        a subclass resumes() soon, not inside the hand-out that said so."""

    def resume(self):
        """Admission goes on: the request lent first (lend()), then the deferred ones,
        admitted in order; return the entries they made for upstream."""
        if self.waiting or self.deferred is None or self.busy():
            return []
        if self.lent is not None:
            request, self.lent = self.lent, None
            sent = self.lend(request)
            if isinstance(request, Head):   # its pieces follow it, or are dropped
                self.sending, self.skipping = sent, not sent
                self._send_pieces()
            return []
        held = self.deferred, self.deferred_error
        self.deferred = self.deferred_error = None
        return self.feed(b"", held)

    def _send_pieces(self):
        """The pieces of the long request lent, read so far: on to its connection (pass_on());
        a refused one's, dropped."""
        deferred, taken = self.deferred, 0
        for piece in deferred:
            if type(piece) is bytes or isinstance(piece, Head):
                break
            taken += 1
            if self.sending:
                self.pass_on(piece)
            if isinstance(piece, Passed):   # its end: what comes next is a request
                self.sending = self.skipping = False
                break
        del deferred[:taken]

    def lend(self, request):
        """A subclass sends request on a connection of the client's own, as session.lease
        says, and returns True; once its reply is in, idle(). Without one, it is refused."""
        refusal = self.framing.error("tcp-proxy: no connection of its own here")
        self._answer([], [], None, refusal)
        self.idle()
        return False

    def pass_on(self, piece):
        """A piece of the long request lent (a subclass sends it after the request's Head)."""

    def cut(self):
        """Half a long reply reached the client and the rest never will: its connection ends."""
        self.ended = True

    def busy(self):
        """A connection of the client's own still owes it something (a subclass's)."""
        return False

    def answered(self):
        """The pool has answered a request itself (a subclass ends what the answer ended)."""

    def _answer(self, entries, requests, state, answer):
        """The pool's own answer, after the requests before it (admitted in `state`); return
        a fresh run."""
        if requests:
            entries.append(Entry(self, requests, state=state))
        Entry(self, [], answer)
        if len(self.waiting) == 1:   # with none before it: written at once
            self.advance()
        return []

    def advance(self):
        """Write what the entries at the head have, dropping each once it is whole."""
        waiting = self.waiting
        while waiting:
            head = waiting[0]
            if head.parked:
                for reply in head.parked:
                    self.out += reply
                    self.parked_bytes -= len(reply)
                head.parked = []
                self.writable()
            if head.left:
                return
            waiting.popleft()
        if self.deferred is not None:
            self.idle()

    def park(self, entry, data):
        """data for an entry behind the oldest, kept until the entries before it are written.
        They count with out against the client's bounds: a long reply's pieces parked behind
        a reply still owed stop its connection's reading as unread bytes do."""
        entry.parked.append(data)
        self.parked_bytes += len(data)

    def backlog(self):
        """Bytes kept for the client: out and what is parked behind an entry still owed."""
        return len(self.out) + self.parked_bytes

    def writable(self):
        """Bytes were added to out: a subclass with a socket arranges their send. Bytes added
        to an out that holds some already need not say so: their send is arranged."""

    def done(self):
        """Nothing more to write: every entry answered and its bytes taken."""
        return not self.waiting and not self.out and self.deferred is None
