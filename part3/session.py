"""session: one Redis client's session, the rules its requests are admitted by before any
borrow (ground/session.py names what its lender drives). Socket-free: the pools' lenders
(part3/lending.py's, part2/lease.py's) drive it one request at a time.

    RedisSession   the table's verdict on each request; with a lender, what the pool answers
                   itself (part3/answers.py), the state a connection is synced to, a
                   transaction pinned, a wait or a stream given a connection of its own
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

    With a pool that can hold state for its client (FramedProxy through part3/lending.py,
    ManagedProxy through part2/lease.py), each state has its answer:
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
    The pool drives it one request at a time (part3/lending.py, part2/lease.py say how).
    """
    lease, wait, quitting = POOLED, None, False   # what admit() says of the request admitted

    def __init__(self, framing, lender=None):
        super().__init__(framing, lender)   # the lender does what the session says
        self.refused_transaction = False   # from a refused MULTI to its EXEC or DISCARD
        self.refused_why = "was refused at its MULTI"
        self.id = lender.next_id() if lender else 0
        self.reset()

    def reset(self):
        """The session as a new client's, and as RESET leaves one."""
        self.protocol, self.db = 2, 0
        self.no_evict = False   # CLIENT NO-EVICT, replayed as SELECT is
        self.name = None
        self.restate()
        self.library = {}       # CLIENT SETINFO's attributes
        self.authenticated = self.framing.password is None
        self.multi = False      # between MULTI's +OK and the reply to its EXEC or DISCARD
        self.watching = False   # between WATCH's +OK and EXEC, DISCARD or UNWATCH
        self.doomed = None      # why the open transaction cannot run (a request refused in it)
        self.streams = self.settles = self.monitoring = False
        self.subscribed = {b"": 0, b"s": 0}   # by family: channels and patterns; shard channels
        self.marker = b"tcp-proxy:barrier:%s" % secrets.token_hex(8).encode("ascii")

    def restate(self):
        """state: what a connection must carry for this client's requests (Resp.sync() brings
        one there), kept as one tuple, made again whenever a part of it changes."""
        self.state = (self.protocol, self.db, self.no_evict, self.name)

    @property
    def holds(self):
        return self.multi or self.watching

    def admit(self, request):
        if not self.refused_transaction and self.authenticated and not self.streams and \
                not self.quitting and self.framing.forwards_plainly(request):
            self.lease, self.wait = HELD if self.multi or self.watching else POOLED, None
            return None   # the common case: its name says so, and no words are split
        if self.quitting:   # after QUIT, nothing is answered: the connection is ending
            return b""
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
        if self.refused_transaction:
            return self.inside_refused_transaction(items)
        if self.lender is None:
            if not self.authenticated:   # a pool password: checked here, with no connection
                return self.auth(items) if items[0].upper() == b"AUTH" else NOAUTH
            return self.without_state(items)
        self.lease, self.wait, self.settles = (HELD if self.holds else POOLED), None, False
        name = commands.name_of(items)
        if not self.authenticated and name not in BEFORE_AUTH:
            return NOAUTH
        action, reason = self.framing.verdict(items)
        if isinstance(request, Head) and (action != commands.FORWARD or self.streams or
                                          name.split(b" ")[0] in commands.BY_ARGUMENTS):
            return self.refuse(f"{shown(name)} too long to pass on: the pool passes on only a "
                               f"long request it forwards as it is, and keeps {len(request)} bytes")
        if self.streams:
            return self.in_stream(name, action, reason, items)
        if action == commands.FORWARD:
            return None
        if self.doomed and name == b"EXEC":   # as redis-server ends a transaction it refused
            self.multi = self.watching = False   # a part of: its connection is closed, not lent
            self.doomed = None
            return self.framing.error("Transaction discarded because of previous errors.",
                                      code="EXECABORT")
        if (answer := ANSWERS.get(name)):
            if self.multi and name not in (b"QUIT", b"RESET"):
                return self.doom(f"{shown(name)} is the pool's to answer, and a transaction "
                                 f"cannot hold it")
            return answer(self, items)
        if action == commands.PIN:
            self.lease = HELD
            return None
        if action == commands.DEDICATE:
            return self.dedicate(name, commands.kind_of(commands.lookup(items), items), items,
                                 reason)
        return self.doom(reason) if self.multi else self.refuse(reason)

    def dedicate(self, name, kind, items, reason):
        """A wait on a connection of its own (or the one the client holds: it stays the
        client's; inside MULTI it is queued, and waits for nothing); a stream on its own."""
        if kind == "blocks":
            if not self.multi:
                self.lease = HELD if self.holds else OWN
                self.wait = commands.wait_of(items)
            return None
        if self.multi:
            return self.doom(f"{shown(name)} inside a transaction: its connection would turn "
                             f"into a stream")
        if self.watching:
            return self.refuse(f"{shown(name)} while WATCH holds the connection: UNWATCH first")
        if name in OPENS_A_STREAM or kind == "monitor":
            self.lease, self.streams, self.settles = OWN, True, name in OPENS_A_STREAM
            self.monitoring = kind == "monitor"
            return None
        return self.refuse(reason)

    def in_stream(self, name, action, reason, items):
        """A request while the client's connection is a stream: more subscriptions, anything
        forwarded, or the pool's own answers; nothing that would change the stream's state."""
        self.lease = OWN
        if name in SUBSCRIBING:
            self.settles = True   # its confirmations may end the stream
            return None
        if action == commands.FORWARD:
            return None
        if name in (b"QUIT", b"RESET", b"AUTH", b"CLIENT ID", b"CLIENT GETNAME", b"CLIENT SETNAME",
                    b"CLIENT SETINFO"):
            return ANSWERS[name](self, items)
        return self.refuse(f"{shown(name)} on a connection that is a stream of messages (after "
                           f"SUBSCRIBE or MONITOR): unsubscribe first, or RESET")

    def without_state(self, items):
        """For a pool that keeps no state for its client: only what the table forwards."""
        action, reason = self.framing.verdict(items)
        if action == commands.FORWARD:
            return None
        if action == commands.PIN and items[0].upper() == b"MULTI" and len(items) == 1:
            self.refused_transaction = True
            return self.refuse(f"{reason}; the pool refuses the whole transaction: nothing up to "
                               f"its EXEC or DISCARD is sent")
        return self.refuse(reason)

    def inside_refused_transaction(self, items):
        """A request between a refused MULTI and its end: never sent. EXEC ends it as
        redis-server ends a transaction that failed while queueing (EXECABORT); DISCARD
        as redis-server does (+OK: nothing is queued); anything else is refused."""
        command = items[0].upper()
        if command in (b"EXEC", b"DISCARD") and len(items) == 1:
            self.refused_transaction = False
            if command == b"DISCARD":
                return b"+OK\r\n"
            return self.framing.error(f"tcp-proxy: the transaction {self.refused_why}; "
                                      f"nothing in it ran", code="EXECABORT")
        if command == b"UNWATCH" and self.refused_why != "was refused at its MULTI":
            self.refused_transaction = False   # a WATCH whose connection was lost: it ends here
            return b"+OK\r\n"
        return self.refuse(f"{shown(commands.name_of(items))} not sent: the transaction it is "
                           f"queued in {self.refused_why}")

    def doom(self, reason):
        """Refuse a request inside MULTI, and so the transaction: redis-server's own rule for
        a command it refuses while queueing (EXEC answers EXECABORT)."""
        self.doomed = reason
        return self.refuse(reason)

    def lost(self):
        """The connection the client's mode was on is gone: a stream ends; the rest of a
        transaction is refused up to its end, since its MULTI or WATCH went with it."""
        if self.holds:
            self.refused_transaction = True
            self.refused_why = "lost its connection"
        self.multi = self.watching = self.streams = False
        self.doomed = None
        self.subscribed = {b"": 0, b"s": 0}

    def refuse(self, reason):
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
        if self.multi and command_of(request) not in TRANSACTION_ENDS:
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
        if command == b"MULTI" and not failed:
            self.multi = True
        elif command in TRANSACTION_ENDS and self.multi:
            self.multi = self.watching = False
            self.doomed = None
        elif command == b"WATCH" and not failed and not self.multi:
            self.watching = True
        elif command == b"UNWATCH" and not failed and not self.multi:
            self.watching = False

    def barrier(self):
        return array(b"PING", self.marker)

    def pushed(self, message):
        """A message on the stream: the client's (True), or the reply to the pool's barrier
        (False: at it, a stream whose subscriptions are all gone has ended)."""
        if message in (bulk(self.marker), array(b"pong", self.marker)):
            if not self.monitoring and not any(self.subscribed.values()):
                self.streams = False
            return False
        if (confirmed := confirmation(message)):
            kind, count = confirmed
            self.subscribed[b"s" if kind in (b"ssubscribe", b"sunsubscribe") else b""] = count
        return True
