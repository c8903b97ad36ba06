"""pipeline: the socket-free core of Part two; the lesson's checkin, for many calls at once.

    Request       one request from its client's read to its reply's write (twemproxy's
                  struct msg): its client, bytes, deadline, attempts, and reply
    Pipeline      one upstream connection's core: requests in, their bytes out (queue());
                  the upstream's bytes in (feed()), each reply framed, fit-checked
                  (framing.fits) and paired with the oldest request owed; lose()
    Misstep       what feed() returns when the upstream says what no request asked for
    ClientStream  one proxy client's core: its bytes in (received()), whole requests out
                  (framed, admitted by its session) to gather(); replies out in its order

The order a request takes: ClientStream.received() -> a Request each, queued in its
client's order -> gather() (the set places them) -> Pipeline.queue() -> Pipeline.feed():
(request, reply) pairs -> ClientStream.replied(), written once every reply before it is.
No socket, thread, clock or lock (a transport is anything with write(data)): the tests
drive both with bytes. A reply settles the oldest request owed: with no request ids in
the protocol, order is the only thing that matches them.
"""
import collections

from ground.frames import Head, Passed, passing_frames
from ground.session import POOLED, NotYet

OWED_MAX = 1024   # a client's requests not yet answered before it is read no more
# What one client's requests in flight on the shared connections may cost a newcomer, who
# waits behind them: seconds of the connections' time at their pace lately. The rest of what
# the client sent waits its turn, so one long pipeline cannot put every other client's
# requests behind all of its own, however slow the server (twemproxy has no such bound).
FAIR_WAIT = 0.1
SHARE_MAX = 64    # a client's requests in flight however fast the server: its pipeline's depth


class Pace:
    """How long the shared connections have taken a reply lately, and so a client's fair
    share: how many of its requests may be in flight at once. Before a reply is timed the
    share is 1 (a slow server is not known to be fast); then as many as take FAIR_WAIT,
    at least 1, at most SHARE_MAX. Told by each connection (timed()); read by each client."""
    seconds = None   # a reply's time, smoothed over the last few (None: none timed yet)
    share = 1

    def timed(self, seconds):
        """A reply took `seconds` of a connection's time (its share of a read's replies)."""
        if self.seconds is not None:
            seconds = 0.75 * self.seconds + 0.25 * seconds   # lately, not once
        self.seconds = seconds
        self.share = SHARE_MAX if seconds * SHARE_MAX <= FAIR_WAIT else \
            max(1, int(FAIR_WAIT / seconds))


UNPACED = Pace()   # a stream with no pool: its share is its pipeline's depth
UNPACED.share = SHARE_MAX


class Request:
    """One request, and all its trip knows of it. `client` hears its outcome: replied(request,
    reply), failed(request, error), a proxy client's passing(request, piece) too (a reply
    too long to keep). What a request never needs stays the class's default."""
    deadline = None     # when its reply is due (None: never); set as it is placed
    reply = None        # its reply, kept while an earlier request of its client is owed
    pieces = ()         # a long reply's pieces kept so, in order
    end = 0             # where its last byte stands in its connection's bytes
    attempts = 0        # attempts made (a set's); each one places it on a connection
    tried = ()          # the services whose attempts failed (then a set)
    service = None      # the service of the attempt under way
    placer = None       # the set that retries it (None: no retries)
    retried = ()        # the errors it is retried after (its placer's)
    abandoned = False   # timed out, connection kept: its reply is owed and thrown away
    overdue_at = None   # abandoned: when its missing reply ends the connection
    sync = False        # a request of the pool's own, bringing its connection to a state
    shared = False      # a proxy client's, on a shared connection: one of its fair share

    def __init__(self, client, data, state=None):
        self.client = client   # who hears its outcome
        self.data = data       # one whole request, as read
        self.state = state     # what its connection must carry first (None: anything)

    def fail(self, error):
        """It cannot be answered here: the set that placed it retries it or gives up, else
        its client is told."""
        if self.placer is not None:
            self.placer.attempt_failed(self, error)
        else:
            self.client.failed(self, error)


class Misstep:
    """The upstream's bytes cannot be the replies owed: the connection must end for reason;
    lost is what the requests owed on it are told; reply, the reply that proved it (if one
    did); request, the request that reply failed to answer (if any)."""

    def __init__(self, reason, lost=None, reply=None, request=None):
        self.reason, self.lost = reason, lost or reason
        self.reply, self.request = reply, request


class Pipeline:
    """The owed requests of one upstream connection, oldest first.

    queue(requests) returns their bytes; feed(data) returns (settled, misstep): settled, the
    (request, message) pairs read, message a whole reply (it settles the request), a long
    reply's piece or its end (a Passed, which settles it); misstep, a Misstep or None.
    check_fit=False trusts every reply (scaffolding: the forgetful client of scenario 1).

    A framing whose connections carry a client's state (sync(): Redis's protocol and
    database) has the pipeline keep the state its queue leaves (`carries`): a request whose
    state differs goes after the framing's sync requests, the pipeline's own (sync=True:
    each reply checked by framing.synced(), given to no one)."""

    def __init__(self, framing, check_fit=True):
        self.framing = framing
        self.check_fit = check_fit
        self.frames = passing_frames(framing, framing.reply_parser)   # a reply keeps its place
        self.owed = collections.deque()   # requests queued, oldest first
        self.queued = 0        # bytes ever queued
        self.answered = False  # a reply has come: from now on an EOF may be quiet
        self.syncs = hasattr(framing, "sync")   # its connections carry a client's state
        self.carries = None    # the state the end of the queue leaves (None: just opened)
        self.passing = None    # the request whose long reply is passing, piece by piece

    def queue(self, requests):
        """Requests go out after every request queued before them (and the sync each one's
        state needs); return their bytes, end to end."""
        owed, queued, parts = self.owed, self.queued, []
        for request in requests:
            if self.syncs and (self.carries is None or request.state and
                               request.state != self.carries):
                self.queued = queued
                parts.append(self._sync(request))
                queued = self.queued
            data = request.data
            queued += len(data)
            request.end = queued
            owed.append(request)
            parts.append(data)
        self.queued = queued
        return b"".join(parts)

    def _sync(self, request):
        wanted = request.state or self.framing.fresh_state   # one that asks nothing: as opened
        syncing = [Request(self, sync, wanted) for sync in self.framing.sync(self.carries, wanted)]
        self.carries = wanted
        for sync in syncing:
            sync.sync, sync.deadline = True, request.deadline
        return self.queue(syncing) if syncing else b""

    def extend(self, request, piece):
        """More of request's one long request (the last queued), as it comes."""
        self.queued += len(piece)
        request.end = self.queued
        return piece

    def feed(self, data):
        """The upstream's bytes: each whole reply settles the oldest request owed."""
        frames, owed, settled = self.frames, self.owed, []
        fits = self.framing.fits if self.check_fit else None
        frames.feed(data)
        taken, error = frames.take_all()
        if frames.pieces:   # a long reply's last pieces, taken from the bytes but not given
            taken += frames.pieces_left()
        self.answered = self.answered or bool(taken)   # from now on an EOF may be quiet
        settle = settled.append
        for reply in taken:
            if not owed:
                return settled, Misstep("a reply no call was waiting for", "unexpected reply",
                                        reply)
            request = owed[0]
            if type(reply) is not bytes:   # a long reply's piece, or its end
                if not isinstance(reply, Passed):
                    if (misstep := self._piece(request, reply, fits)) is not None:
                        return settled, misstep
                    settle((request, reply))
                    continue
                self.passing = None   # its end settles its request as a whole reply does
            if fits and not request.sync and not fits(request.data, reply, framed=True):
                return settled, Misstep("a reply that does not fit its request",
                                        "upstream out of step: a reply did not fit its request",
                                        reply, request)
            owed.popleft()   # the load-bearing line: a reply settles the oldest request owed
            # a sync is the pool's own: synced() judges its reply, not a client's session
            if request.sync and (reason := self.framing.synced(request.data, reply)):
                return settled, Misstep(f"the connection could not take a client's state: "
                                        f"{reason}")
            settle((request, reply))
        if error is not None:   # bytes no reply starts with
            return settled, Misstep(f"upstream out of step: a reply {self.framing!r} cannot "
                                    f"frame ({error})")
        if len(frames.unread) > self.framing.max_reply:
            return settled, Misstep(f"upstream out of step: a reply longer than "
                                    f"{self.framing.max_reply} bytes")
        return settled, None

    def _piece(self, request, piece, fits):
        """None, or the Misstep a long reply's piece is (its Head judged: its fit, and
        whether its client takes a reply in pieces)."""
        if isinstance(piece, Head):
            if fits and not fits(request.data, piece, framed=True):
                return Misstep("a long reply that does not fit its request",
                               "upstream out of step: a long reply did not fit its request",
                               None, request)
            if not request.abandoned and not hasattr(request.client, "passing"):
                return Misstep(f"upstream out of step: a reply longer than "
                               f"{self.framing.max_reply} bytes")   # a thread takes replies whole
            self.passing = request
        return None

    def drop(self, request):   # its reply then goes to the one behind it: scenario 1's bug
        self.owed.remove(request)

    def lose(self):
        """The connection is lost: every request still owed, oldest first; a client half a
        long reply reached is cut."""
        owed, self.owed = self.owed, collections.deque()
        passing, self.passing = self.passing, None
        if passing is not None and not passing.abandoned:
            passing.client.cut()
        return owed


class ClientStream:
    """One proxy client, without its socket: its bytes in, requests out, and replies out
    in its own order, whichever connection brought them.

    received(data) frames what the client sent and admits each request by its session:
    one sent on becomes a Request, queued in the client's order and handed with the read's
    others to gather() (which places it behind the client's others in flight, on their
    connection: `upstream`); the pool's own answer takes its place in that order. replied()
    (failed(), passing()) writes a reply through `transport` once every reply before it
    is written; until then it is kept on its request, and counts in backlog(). A request
    the framing cannot read ends the stream, its error after the replies before it.

    Admission stops at a request its session lends a connection of the client's own
    (lease not POOLED) or whose answer needs what the pool is still learning (NotYet):
    the rest is `held`. It stops too once its fair share of requests (pace.share) are in
    flight on the shared connections, and goes on as their replies come (`sharing`). What
    a subclass (the proxy's client) may override: held_up() (it lends `lent`, then admit_held()),
    lend_now() (a request on the transaction's own connection), answered() (the pool
    answered one), bounded() and cut().
    """
    gather = None   # what takes the requests each read made for the pool (the proxy's set)

    def __init__(self, framing, counts, transport, pool=None):
        self.framing = framing
        self.counts = counts           # told answered (replies passed back) and failed
        self.transport = transport     # write(data), and `out`, the bytes it has not sent
        self.frames = passing_frames(framing, framing.request_parser)
        # what the pool answers itself, before any upstream; its lender does what it says
        self.session = framing.session(pool.lending if pool else None)
        self.queue = collections.deque()   # its requests not yet written back, in its order
        self.parked = 0            # bytes of replies kept behind an earlier request still owed
        self.ended = False         # a request could not be framed, or QUIT: nothing more is read
        self.held = None           # what was read and not yet admitted (None: admitting)
        self.held_error = None     # the framing's error after it
        self.lent = None           # the request admission stopped at, to go on one of its own
        self.shared = 0            # its requests in flight on shared connections
        # (managed client, service) they went to: the next goes there too, behind them, for
        # requests on two connections may run in either order (a GET before the SET it follows)
        self.upstream = None
        self.sharing = False       # admission stopped at its fair share: on as replies come
        self.pace = pool.pace if pool else UNPACED   # the shared connections' pace lately

    # -- requests in --

    def received(self, data, held=None):
        """The client's bytes (a transport's protocol), whole requests admitted in order;
        or held, (requests, error) read before and admitted now (admit_held())."""
        if held is not None:
            taken, error = held
        elif self.ended:
            return
        else:
            frames = self.frames
            frames.feed(data)
            taken, error = frames.take_all()
            if frames.pieces:   # a long request's last pieces, taken but not given
                taken += frames.pieces_left()
            if self.held is not None:   # admission waits: these wait behind the rest
                self.held += taken
                self.held_error = self.held_error or error
                self.held_up()
                return
        session, queue, requests = self.session, self.queue, []
        admit = session.admit
        state = session.state   # the state the requests from here on were admitted in
        for index, request in enumerate(taken):
            long = type(request) is not bytes   # a long request's Head, a piece, its end
            if long and not isinstance(request, Head):   # of one refused: read, dropped
                continue
            try:
                answer = admit(request)
            except NotYet as not_yet:   # the pool is learning what the answer needs
                not_yet.then(self.held_up)
                self.held, self.held_error = taken[index:], error
                break
            if answer is None:
                if session.lease == POOLED and not long:
                    if self.shared >= self.pace.share:   # the rest wait their turn
                        self.held, self.held_error, self.sharing = taken[index:], error, True
                        break
                    requests.append(request := Request(self, request, state))
                    request.shared = True
                    self.shared += 1
                    queue.append(request)
                    continue
                if not long and (lent := self.lend_now(request, state)) is not None:
                    queue.append(lent)
                    if not session.settles:   # its reply changes nothing the session says
                        continue
                    self.held, self.held_error = taken[index + 1:], error   # until its reply
                    break
                self.lent = request   # after every reply before it: on one of its own
                self.held, self.held_error = taken[index + 1:], error
                self.held_up()
                break
            self.answer(answer)   # a long one refused: the rest of it is read and dropped
            state = session.state   # what the answer changed applies from here on
            self.answered()
        else:
            if error is not None:   # the framing's: nothing after it can be framed
                self.ended = True
                self.answer(self.framing.error(str(error)))
            elif session.quitting:   # QUIT: nothing after it is read
                self.ended = True
        if requests:
            self.gather(requests)
        if len(queue) >= OWED_MAX or self.held is not None or self.ended:
            self.bounded()

    def admit_held(self):
        """Admission goes on with what was held, in order."""
        held = self.held, self.held_error
        self.held = self.held_error = None
        self.received(b"", held)

    def answer(self, data):
        """The pool's own answer, after every reply before it (kept on a request of none)."""
        if self.queue:
            self.queue.append(placeholder := Request(self, None))
            placeholder.reply, self.parked = data, self.parked + len(data)
        else:
            self.transport.write(data)

    # -- replies out --

    def replied(self, request, reply):
        """A reply from upstream: written now if its request is the oldest this client waits
        for (with the replies kept behind it), else kept on its request until it is."""
        self.counts.answered += 1
        if request.shared:
            self.shared -= 1
            if not self.shared:   # nothing of it in flight: its next may go anywhere
                self.upstream = None
            if self.sharing and self.shared <= self.pace.share // 2:   # its turn again
                self.sharing = False
                self.admit_held()
        queue = self.queue
        if queue and queue[0] is request:
            queue.popleft()
            self.transport.write(reply)
            if queue and (queue[0].reply is not None or queue[0].pieces) or \
                    self.held is not None:   # what waited behind it goes now
                self.release()
        else:
            request.reply = reply
            self.parked += len(reply)

    def failed(self, request, error):
        """Its request's error, in the reply's place; counted as failed, not answered."""
        self.counts.failed += 1
        self.counts.answered -= 1   # replied() counts what it writes as answered
        self.replied(request, self.framing.error(f"{type(error).__name__}: {error}"))

    def passing(self, request, piece):
        """A piece of a long reply: to the client now, or kept behind the replies before it;
        return the stream it is for (its reader may wait for it: backlog())."""
        if self.queue and self.queue[0] is request:
            self.transport.write(piece)
        else:
            request.pieces = [*request.pieces, bytes(piece)]
            self.parked += len(piece)
        self.overflowed()   # the shared connection reads on: the client's bound decides
        return self

    def release(self):
        """Write what the requests at the head of the queue have, each once it is whole;
        once nothing before it is owed, the request admission stopped at is told."""
        queue, write = self.queue, self.transport.write
        while queue:   # a write may end the client (its bound), and clear the queue
            head = queue[0]
            for piece in head.pieces:
                write(piece)
                self.parked -= len(piece)
            head.pieces = ()
            if head.reply is None or not queue:
                return
            queue.popleft()
            write(head.reply)
            self.parked -= len(head.reply)
        if self.held is not None:
            self.held_up()

    def backlog(self):
        """Bytes for the client: unsent, and kept."""
        return len(self.transport.out) + self.parked

    # -- what a subclass may override --

    def held_up(self):
        """Admission stopped, or what it waits for may have come (only with a pool)."""

    def lend_now(self, request, state):
        """A request for a connection that is the client's already: a subclass sends it and
        returns its Request; None: admission stops at it."""

    def answered(self):
        """The pool has answered a request itself (a subclass ends what the answer ended)."""

    def bounded(self):
        """OWED_MAX owed, admission held or the stream ended: a subclass stops reading."""

    def overflowed(self):
        """A long reply's piece was kept for the client: a subclass holds it to its bound."""

    def behind(self):
        """True when the client reads its replies slower than they come (a subclass says;
        the core keeps up)."""
        return False

    def when_caught_up(self, function):
        """function() once the client has caught up, or has gone (a subclass's transport)."""
        function()

    def cut(self):
        """Half a long reply reached the client and the rest never will: nothing more is read."""
        self.ended = True
