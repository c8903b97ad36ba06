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
                  tcp_proxy.Frames, admitted by the framing's session), grouped as
                  entries; the replies to them out as bytes, in the client's own order

No socket, thread, clock or lock: the connection and the proxy drive them from the loop,
and the tests drive them with bytes. A reply can only settle the oldest request owed: the
protocol carries no request ids, so order is the only thing that matches them.
"""
import collections

from tcp_proxy import Frames


class OutOfStep(Exception):
    """The upstream's bytes cannot be the replies owed: the connection must end. str() is
    the reason it ends for; lost, what the calls owed on it are told; reply, the reply that
    proved it (if one did); run, the run that reply failed to answer (if any)."""

    def __init__(self, reason, lost=None, reply=None, run=None):
        super().__init__(reason)
        self.lost = lost or reason
        self.reply, self.run = reply, run


class Pipeline:
    """The owed replies of one upstream connection, kept as runs, oldest first.

    settled(run, replies, first) is called after each run's share of a read: replies
    answered run.requests[first:first + len(replies)] (the run's sink has been told,
    unless the run was abandoned: then they were thrown away). check_fit=False trusts
    every reply (scaffolding: the forgetful client of the demo's first scenario)."""

    def __init__(self, framing, settled, check_fit=True):
        self.framing = framing
        self.settled = settled
        self.check_fit = check_fit
        self.frames = Frames(framing.reply_parser)   # the reply being read keeps its place
        self.owed = collections.deque()         # runs written (or being written), oldest first
        self.out = bytearray()                   # requests queued and not yet written
        self.unwritten = collections.deque()   # (end, run): runs whose last byte is not written
        self.queued = 0        # bytes ever queued
        self.written = 0       # bytes ever written
        self.answered = False  # a reply has come: from now on an EOF may be quiet
        self.lost = False      # lose() was called: nothing more is delivered

    def queue(self, run):
        """A run's requests go out after every request queued before them."""
        self.out += run.data
        self.queued += len(run.data)
        self.owed.append(run)
        self.unwritten.append((self.queued, run))

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
        """The upstream's bytes: every whole reply in them settles the oldest request owed."""
        frames, owed = self.frames, self.owed
        fits = self.framing.fits if self.check_fit else None
        frames.feed(data)
        taken, error = frames.take_all()
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
        finally:
            if replies:   # the run's share so far, told before whatever ends the read
                self._settle(run, replies, first)
        if error is not None and not self.lost:   # bytes no reply starts with
            why = f"upstream out of step: a reply {self.framing!r} cannot frame ({error})"
            raise OutOfStep(why)
        if len(frames.unread) > self.framing.max_reply and not self.lost:
            raise OutOfStep(f"upstream out of step: a reply longer than "
                            f"{self.framing.max_reply} bytes")

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
        owed, self.owed = self.owed, collections.deque()
        lost = 0
        for run in owed:
            lost += run.owing_count()
            run.fail(error)
        return lost


class Entry:
    """One place in a proxy client's order, taken as it is made: requests it sent in one
    read, or the bytes the pool answered itself. The sink of a run of those requests (or
    one of a batch's, see hand_out()): a reply to the oldest entry waiting goes to the
    stream's bytes at once; one to a later entry is parked until the entries before it
    are written."""
    __slots__ = ("stream", "requests", "data", "left", "parked")

    def __init__(self, stream, requests, answer=None, data=None):
        self.stream = stream
        self.requests = requests       # what goes upstream ([] for an answer of the pool's)
        self.data = b"".join(requests) if data is None else data   # the same, end to end
        self.left = len(requests)      # requests still owed a reply or an error
        self.parked = [] if answer is None else [answer]   # what waits for the entries before
        stream.owed += self.left
        stream.waiting.append(self)

    def replied(self, run, replies):
        hand_out([self] * len(replies), replies)

    def failed(self, run, error):
        stream = self.stream
        message = stream.framing.error(f"{type(error).__name__}: {error}")
        stream.counts.failed += self.left
        stream.owed -= self.left
        if self is stream.waiting[0]:
            stream.out += message * self.left
            stream.writable()
        else:
            self.parked += [message] * self.left
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
            entry.parked.append(reply)   # written once the entries before it are
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


class ClientStream:
    """One proxy client, without its socket: requests in, replies out in its own order.

    feed(data) returns the new entries whose requests must go upstream; `out` holds the
    bytes to write to the client, each reply after the replies to every request before
    it, whichever connection brought it. A request the framing cannot read ends the
    stream: the client is told why after its earlier replies, and nothing after it is
    read. counts is told answered (replies from upstream) and failed (errors made)."""

    def __init__(self, framing, counts):
        self.framing = framing
        self.counts = counts
        self.frames = Frames(framing.request_parser)
        self.session = framing.session()   # what the pool answers itself, before any upstream
        self.waiting = collections.deque()   # entries not yet written whole, in the client's order
        self.out = bytearray()     # bytes for the client
        self.owed = 0              # requests sent upstream and not yet answered
        self.ended = False         # a request could not be framed: nothing more is read

    def feed(self, data):
        """The client's bytes; return the entries to send upstream, in order. Bytes that are
        whole requests, every one sent on, are the entry's bytes as they came."""
        if self.ended:
            return []
        frames, admit = self.frames, self.session.admit
        plain = not frames.unread   # no request begun before: its bytes may be all requests
        frames.feed(data)
        taken, error = frames.take_all()
        entries, requests = [], []
        for request in taken:
            answer = admit(request)
            if answer is None:
                requests.append(request)
            else:
                plain = False
                requests = self._answer(entries, requests, answer)
        if error is not None:   # the framing's: nothing after it can be framed
            self.ended = True
            self._answer(entries, requests, self.framing.error(str(error)))
            return entries
        if requests:   # owed replies: nothing to write yet
            whole = plain and not frames.unread
            entries.append(Entry(self, requests, data=bytes(data) if whole else None))
        return entries

    def _answer(self, entries, requests, answer):
        """The pool's own answer, after the requests before it; return a fresh run."""
        if requests:
            entries.append(Entry(self, requests))
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
                head.parked = []
                self.writable()
            if head.left:
                return
            waiting.popleft()

    def writable(self):
        """Bytes were added to out: a subclass with a socket arranges their send. Bytes added
        to an out that holds some already need not say so: their send is arranged."""

    def done(self):
        """Nothing more to write: every entry answered and its bytes taken."""
        return not self.waiting and not self.out
