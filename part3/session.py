"""session: one Redis client's session, the rules its requests are admitted by before any
borrow (ground/session.py names what its lender drives). Socket-free: the pools' lenders
(part3/lending.py's, part2/lease.py's) drive it one request at a time.

    MODES, TRANSITIONS   what a session holds (its mode), and what moves it to another: a
                   table, as part3/commands.py is one; each mode admits a request its way
    RedisSession   the table's verdict on each request; with a lender, what the pool answers
                   itself (part3/answers.py), the state a connection is synced to, a
                   transaction pinned, a wait or a stream given a connection of its own

The order a request takes: admit() (the mode's rule: ADMITTED_BY) -> None to send it on,
with lease and wait saying how, or the pool's own answer -> the lender sends it -> replied()
(a reply on a held connection moves the mode: a transaction begun or ended) -> the next.
"""
import re
import secrets

import part3.commands as commands
from ground import frames
from ground.frames import Head
from ground.session import HELD, OWN, POOLED, Session
from part3.answers import ANSWERS, PoolAnswers
from part3.parser import Overlong
from part3.words import array, bulk, command_of, inline_fault, leading_words, shown, words

# A subscription's confirmation, as redis-server writes one: [kind, channel, count], the
# channel null when there was none to name (an UNSUBSCRIBE with nothing subscribed).
CONFIRMATION = re.compile(rb"[*>]3\r\n\$[0-9]+\r\n([ps]?(?:un)?subscribe)\r\n"
                          rb"(?:\$-1\r\n|_\r\n|\$([0-9]+)\r\n)", re.IGNORECASE)
COUNT = re.compile(rb":([0-9]+)\r\n")
SUBSCRIBING = {b"SUBSCRIBE", b"PSUBSCRIBE", b"SSUBSCRIBE", b"UNSUBSCRIBE", b"PUNSUBSCRIBE",
               b"SUNSUBSCRIBE"}
OPENS_A_STREAM = {b"SUBSCRIBE", b"PSUBSCRIBE", b"SSUBSCRIBE"}
RESP3_ONLY = frozenset(b"_,#(=!~%|>")   # types a RESP2 connection never sends
ERRORS = frozenset(b"-!")
BEFORE_AUTH = {b"AUTH", b"HELLO", b"QUIT", b"RESET"}   # what a client may send unauthenticated
TRANSACTION_ENDS = {b"EXEC", b"DISCARD"}


NOAUTH = b"-NOAUTH Authentication required.\r\n"

# What a session holds, and so how it admits a request (ADMITTED_BY names each mode's rule).
MODES = {
    "unauthenticated": "the pool asks a password, and none has been given: AUTH, HELLO, QUIT "
                       "and RESET only",
    "open": "holds nothing: each request as the table's verdict says",
    "watching": "WATCH holds a connection: the client's requests go on it",
    "queueing": "inside MULTI, on the held connection: a request the pool refuses dooms it",
    "doomed": "inside MULTI, a request refused: EXEC is answered EXECABORT, nothing runs",
    "refusing": "a transaction refused whole (its MULTI refused, or its connection lost): "
                "every request refused up to its end",
    "streaming": "SUBSCRIBE made the connection a stream: subscriptions and what the table "
                 "forwards go on it, until the last unsubscribe",
    "monitoring": "MONITOR made the connection a stream",
    "quitting": "QUIT was answered: nothing after it is",
}
HOLDING = {"watching", "queueing", "doomed"}   # a connection is the client's alone
QUEUEING = {"queueing", "doomed"}             # inside MULTI
STREAMING = {"streaming", "monitoring"}
ROUTINE = {"open"} | HOLDING   # where a request the table forwards by name goes at once

# What moves a session from one mode to another; an event a mode has no row for leaves it
# as it is (EXEC without a transaction ends nothing). `*`: any mode. RESET is no event: it
# makes the session a new client's (reset()).
TRANSITIONS = """
# mode             event            next mode
unauthenticated    authenticated    open
open               watched          watching
open               multi-opened     queueing
open               multi-refused    refusing
open               subscribed       streaming
open               monitored        monitoring
watching           multi-opened     queueing
watching           unwatched        open
watching           lost             refusing
queueing           doomed           doomed
queueing           ended            open
queueing           lost             refusing
doomed             ended            open
doomed             lost             refusing
refusing           ended            open
streaming          unsubscribed     open
streaming          lost             open
monitoring         lost             open
*                  quit             quitting
"""
MOVES = {(mode, event): after for mode, event, after in
         (line.split() for line in TRANSITIONS.splitlines() if line and not line.startswith("#"))}


def confirmation(message):
    """(kind, count) if the message confirms a subscription change, else None: its kind in
    lower case (b"unsubscribe"), and how many subscriptions of its family the client has."""
    if not (head := CONFIRMATION.match(message)):
        return None
    end = head.end() + (int(head[2]) + 2 if head[2] is not None else 0)
    if not (count := COUNT.fullmatch(message, end)):
        return None
    return head[1].lower(), int(count[1])


class RedisSession(PoolAnswers, Session):
    """One client's rules, applied to each of its requests before any borrow (admit()).

    A request the table forwards is sent on (None). A blank line or an empty array is
    answered with nothing (b""), as redis-server answers it. A request longer than
    max_request was read to its end and dropped: an error says so, and the client goes
    on. Anything else is refused with an error naming its rule; and a refused MULTI
    refuses its whole transaction: every request up to its EXEC or DISCARD is answered
    with an error and never sent, so nothing of it runs, and a client told that it
    failed can send it again without applying any of it twice.

    With a lender (SessionProxy's, ManagedProxy's), each state has its answer:
      answered    HELLO (2 or 3, with AUTH and SETNAME), AUTH, CLIENT SETNAME, GETNAME, ID
                  and SETINFO, QUIT and RESET, from what the session keeps; never sent
      replayed    SELECT, answered, and the protocol HELLO chose: the session's state,
                  which sync() brings any connection to before it carries a request
      pinned      MULTI or WATCH to EXEC, DISCARD or UNWATCH: on the connection the client
                  holds; inside MULTI a reply is +QUEUED or an error, and a request the pool
                  refuses there dooms the transaction (EXEC: EXECABORT, nothing runs)
      dedicated   a wait (BLPOP, XREAD BLOCK) on a connection of its own, for its timeout;
                  SUBSCRIBE's stream (and MONITOR's, where the policy allows it) until the
                  last unsubscribe, as the confirmations count them (pushed())
    What it holds is its mode (MODES), moved by TRANSITIONS (move()).
    """

    def __init__(self, framing, lender=None):
        super().__init__(framing, lender)   # the lender does what the session says
        self.id = lender.next_id() if lender else 0
        self.reset()

    def reset(self):
        """The session as a new client's, and as RESET leaves one."""
        self.protocol, self.db = 2, 0
        self.no_evict = False   # CLIENT NO-EVICT, replayed as SELECT is
        self.name = None
        self.restate()
        self.library = {}       # CLIENT SETINFO's attributes
        self.mode = "open" if self.framing.password is None else "unauthenticated"
        self.refusing_why = "was refused at its MULTI"   # in mode refusing: why
        self.lease, self.wait, self.settles = POOLED, None, False   # of the request admitted
        self.subscribed = {b"": 0, b"s": 0}   # by family: channels and patterns; shard channels
        self.command = None   # the command of the request admit() reads now, once it has words
        self.marker = b"tcp-proxy:barrier:%s" % secrets.token_hex(8).encode("ascii")

    def restate(self):
        """state: what a connection must carry for this client's requests (Resp.sync() brings
        one there), kept as one tuple, made again whenever a part of it changes."""
        self.state = (self.protocol, self.db, self.no_evict, self.name)

    def move(self, event):
        """The mode an event leaves the session in (TRANSITIONS)."""
        self.mode = MOVES.get((self.mode, event)) or MOVES.get(("*", event)) or self.mode

    # What the lenders read (ground.session.Session), each the mode's.
    holds = property(lambda self: self.mode in HOLDING)
    streams = property(lambda self: self.mode in STREAMING)
    quitting = property(lambda self: self.mode == "quitting")
    authenticated = property(lambda self: self.mode != "unauthenticated")
    monitoring = property(lambda self: self.mode == "monitoring")

    def admit(self, request):
        if self.mode in ROUTINE and type(request) is bytes and \
                self.framing.forwards_plainly(request):
            self.lease = HELD if self.mode in HOLDING else POOLED
            self.wait, self.settles = None, False
            return None   # the common case: its name says so, and no words are split
        if self.mode == "quitting":   # nothing is answered: the connection is ending
            return b""
        self.command = None   # until its words are read
        if isinstance(request, Overlong):   # read whole and dropped: it is its own answer
            return bytes(request)
        if isinstance(request, Head):   # too long to keep: judged by the words whole in it
            items = leading_words(request)
            if not items:
                return self.refuse("a request too long to keep whose command is not in its "
                                   f"first {len(request)} bytes")
        else:
            if (fault := inline_fault(request)):
                return self.refuse(fault)
            if not (items := words(request)):
                return b""
        self.command = commands.name_of(items)   # what a refusal is counted under
        if self.lender is None and self.mode != "refusing":
            return self.without_state(items)
        self.lease, self.wait, self.settles = HELD if self.holds else POOLED, None, False
        return ADMITTED_BY[self.mode](self, request, items)

    def with_verdict(self, request, items):
        """Modes open, watching, queueing and doomed: the table's verdict, the pool's own
        answers, a pin, a wait or a stream; inside MULTI, a refusal dooms the transaction."""
        name = commands.name_of(items)
        action, reason = self.framing.verdict(items)
        if isinstance(request, Head) and (action != commands.FORWARD or
                                          name.split(b" ")[0] in commands.BY_ARGUMENTS):
            return self.refuse(f"{shown(name)} too long to pass on: the pool passes on only a "
                               f"long request it forwards as it is, and keeps {len(request)} bytes")
        if action == commands.FORWARD:
            if isinstance(request, Head):   # its pieces come as the client sends them: on a
                self.lease = HELD if self.holds else OWN   # connection no other client needs
            return None
        queued = self.mode in QUEUEING
        if self.mode == "doomed" and name == b"EXEC":   # as redis-server ends a transaction it
            self.move("ended")   # refused a part of: its connection is closed, not lent
            return self.framing.error("Transaction discarded because of previous errors.",
                                      code="EXECABORT")
        if (answer := ANSWERS.get(name)):
            if queued and name not in (b"QUIT", b"RESET"):
                return self.doom(f"{shown(name)} is the pool's to answer, and a transaction "
                                 f"cannot hold it")
            return answer(self, items)
        if action == commands.PIN:   # its reply begins or ends the hold: the next waits for it
            self.lease, self.settles = HELD, True
            return None
        if action == commands.DEDICATE:
            return self.dedicate(name, commands.kind_of(commands.lookup(items), items), items,
                                 reason)
        return self.doom(reason) if queued else self.refuse(reason)

    def before_auth(self, request, items):
        """Mode unauthenticated: AUTH and HELLO (which authenticate), QUIT and RESET."""
        if commands.name_of(items) not in BEFORE_AUTH:
            return NOAUTH
        return self.with_verdict(request, items)

    def dedicate(self, name, kind, items, reason):
        """A wait on a connection of its own (or the one the client holds: it stays the
        client's; inside MULTI it is queued, and waits for nothing); a stream on its own."""
        if kind == "blocks":
            if self.mode not in QUEUEING:
                self.lease = HELD if self.holds else OWN
                self.wait = commands.wait_of(items)
            return None
        if self.mode in QUEUEING:
            return self.doom(f"{shown(name)} inside a transaction: its connection would turn "
                             f"into a stream")
        if self.mode == "watching":
            return self.refuse(f"{shown(name)} while WATCH holds the connection: UNWATCH first")
        if name in OPENS_A_STREAM or kind == "monitor":
            self.lease, self.settles = OWN, name in OPENS_A_STREAM
            self.move("monitored" if kind == "monitor" else "subscribed")
            return None
        return self.refuse(reason)

    def in_stream(self, request, items):
        """Modes streaming and monitoring: more subscriptions, anything forwarded, or the
        pool's own answers; nothing that would change the stream's state."""
        self.lease = OWN
        name = commands.name_of(items)
        action, _ = self.framing.verdict(items)
        if isinstance(request, Head):
            return self.refuse(f"{shown(name)} too long to pass on: the pool passes on only a "
                               f"long request it forwards as it is, and keeps {len(request)} bytes")
        if name in SUBSCRIBING:
            self.settles = True   # its confirmations may end the stream
            return None
        if action == commands.FORWARD:
            return None
        if name in (b"QUIT", b"RESET", b"AUTH", b"CLIENT ID", b"CLIENT GETNAME", b"CLIENT SETNAME",
                    b"CLIENT SETINFO", b"CLIENT INFO"):
            return ANSWERS[name](self, items)
        return self.refuse(f"{shown(name)} on a connection that is a stream of messages (after "
                           f"SUBSCRIBE or MONITOR): unsubscribe first, or RESET")

    def without_state(self, items):
        """With no lender, nothing can be kept for the client: only what the table forwards
        (and a pool password, checked here, with no connection)."""
        if self.mode == "unauthenticated":
            return self.auth(items) if items[0].upper() == b"AUTH" else NOAUTH
        action, reason = self.framing.verdict(items)
        if action == commands.FORWARD:
            return None
        if action == commands.PIN and items[0].upper() == b"MULTI" and len(items) == 1:
            self.refusing_why = "was refused at its MULTI"
            self.move("multi-refused")
            return self.refuse(f"{reason}; the pool refuses the whole transaction: nothing up to "
                               f"its EXEC or DISCARD is sent")
        return self.refuse(reason)

    def refusing(self, request, items):
        """Mode refusing: a request between a refused MULTI and its end is never sent. EXEC ends
        it as redis-server ends a transaction that failed while queueing (EXECABORT); DISCARD
        as redis-server does (+OK: nothing is queued); anything else is refused."""
        command = items[0].upper()
        if command in (b"EXEC", b"DISCARD") and len(items) == 1:
            self.move("ended")
            if command == b"DISCARD":
                return b"+OK\r\n"
            return self.framing.error(f"tcp-proxy: the transaction {self.refusing_why}; "
                                      f"nothing in it ran", code="EXECABORT")
        if command == b"UNWATCH" and self.refusing_why != "was refused at its MULTI":
            self.move("ended")   # a WATCH whose connection was lost: it ends here
            return b"+OK\r\n"
        return self.refuse(f"{shown(commands.name_of(items))} not sent: the transaction it is "
                           f"queued in {self.refusing_why}")

    def doom(self, reason):
        """Refuse a request inside MULTI, and so the transaction: redis-server's own rule for
        a command it refuses while queueing (EXEC answers EXECABORT)."""
        self.move("doomed")
        return self.refuse(reason)

    def lost(self, why="lost its connection"):
        """The connection the client's mode was on is gone: a stream ends; the rest of a
        transaction is refused up to its end (saying why), since its MULTI or WATCH went with
        it."""
        if self.holds:
            self.refusing_why = why
        self.move("lost")
        self.subscribed = {b"": 0, b"s": 0}

    def refuse(self, reason):
        """The pool's refusal, in RESP's form, counted by its lender under the command refused
        (a name the table lacks, under one name for all: a client chooses them)."""
        if self.lender is not None:
            name = self.command
            known = name in commands.COMMANDS
            self.lender.refused(name.decode() if known else "(not in the table)" if name else
                                "(no command read)")
        return self.framing.error(f"tcp-proxy: {reason}")

    # --- the lender drives these (ground.session.Session)

    def sync(self, state):
        """What brings a connection carrying `state` (None: just opened) to this client's."""
        return self.framing.sync(state, self.state)

    def synced(self, request, reply):
        return self.framing.synced(request, reply)

    def fits(self, request, reply):
        """The fit of a reply the pool's parser framed (or of a long one's first bytes): the
        framing's, by its type, and more: inside MULTI, +QUEUED or an error (EXEC and DISCARD
        aside); a connection that speaks RESP2 sends none of RESP3's types."""
        if isinstance(reply, frames.Passed):   # a long reply passed on: its first bytes
            reply = reply.head
        first = reply[:1]
        if self.protocol == 2 and first and first[0] in RESP3_ONLY:
            return False
        if self.mode in QUEUEING and command_of(request) not in TRANSACTION_ENDS:
            return reply == b"+QUEUED\r\n" or (bool(first) and first[0] in ERRORS)
        return self.framing.fits(request, reply, framed=True)

    def replied(self, request, reply):
        """What a reply on the held connection says (holding())."""
        if self.lease == HELD:
            self.holding(request, reply)

    def holding(self, request, reply):
        """A reply on the connection the client holds: a transaction begun or ended, keys
        watched or not."""
        command = command_of(request)
        failed = reply[:1] in (b"-", b"!")
        if command in TRANSACTION_ENDS:
            if self.mode in QUEUEING:
                self.move("ended")
        elif failed or self.mode in QUEUEING:   # queued (or refused): it moves nothing yet
            return
        elif command == b"MULTI":
            self.move("multi-opened")
        elif command == b"WATCH":
            self.move("watched")
        elif command == b"UNWATCH":
            self.move("unwatched")

    def barrier(self):
        return array(b"PING", self.marker)

    def pushed(self, message):
        """A message on the stream: the client's (True), or the reply to the pool's barrier
        (False: at it, a stream whose subscriptions are all gone has ended)."""
        if message in (bulk(self.marker), array(b"pong", self.marker)):
            if not any(self.subscribed.values()):
                self.move("unsubscribed")   # a subscriber's stream; MONITOR's has no row
            return False
        if (confirmed := confirmation(message)):
            kind, count = confirmed
            self.subscribed[b"s" if kind in (b"ssubscribe", b"sunsubscribe") else b""] = count
        return True


ADMITTED_BY = {   # each mode's rule for a request that must be read by its words
    "unauthenticated": RedisSession.before_auth, "open": RedisSession.with_verdict,
    "watching": RedisSession.with_verdict, "queueing": RedisSession.with_verdict,
    "doomed": RedisSession.with_verdict, "refusing": RedisSession.refusing,
    "streaming": RedisSession.in_stream, "monitoring": RedisSession.in_stream,
}
