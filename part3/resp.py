"""resp: the RESP framing, the object a pool drives to stand between real Redis clients and a
redis-server: where a reply and a request end (part3/parser.py), which replies can answer a
request, what the pool refuses, what it says itself on a connection, and each client's
session (part3/session.py).

A pool must parse both directions. A request it did not read whole is a request
it cannot vouch for: redis-server reads `*1\\r\\r$4\\r\\rPING\\r\\r*4...` as two
commands, and a pool that took it for one line would lend the connection while the
second still runs. And a pool forwards only the commands it knows how to frame:
part3/commands.py is the table of them, with what each does to a connection (after
MULTI, SELECT or SUBSCRIBE a connection is no longer interchangeable with its
neighbours) and so what the pool does with it. RedisSession applies it per client.

    Resp          the framing object a pool takes (max_reply, reply_parser(), request_parser(),
                  request_size(), fits(), verdict(), refusal(), session(), error(); opening(),
                  facts_requests(), facts(), sync(), synced() for a pool's own requests);
                  RESP = Resp() is the one to use; Resp(allow=...) opens what the policy
                  refuses, Resp(password=...) asks one of the clients, Resp(upstream_password=
                  ...) says one
"""
import re

import part3.commands as commands
from part3.parser import MAX_REPLY, MAX_REQUEST, Overlong, Parser, PassedEnd, reply_size
from part3.session import RedisSession
from part3.words import Facts, array, as_bytes, inline_fault, shown, words

DEDICATED_CAP = 32     # connections a pool opens for its clients' waits and streams, at once

# A request array's first element (its name), when it holds no line end: as the key of what
# its name alone says (Resp.forwards_plainly(), Resp.fits()), its length line with it.
NAME = re.compile(rb"\*[1-9][0-9]{0,17}\r\n(\$[1-9][0-9]?\r\n[^\r\n]{1,99})\r\n")
NAMES_KEPT = 4096   # names a Resp remembers what they say: a client chooses them, so a bound
NOT_BY_NAME = (False, None)   # what Resp._named() says of a request whose name does not say
class Resp:
    """The RESP framing: what a pool made with framing= drives (SessionProxy, ManagedProxy).

    Resp(allow=names) forwards the commands named (a server-wide command of the table,
    `FLUSHDB`, `CONFIG SET`) that the policy refuses by default; Resp(refuse=names) refuses
    commands it would forward. A name the table does not have, or one it never passes, is a
    ValueError. max_reply and max_request bound what the pool keeps of one message: the
    window a longer one is passed on through, in pieces (both pools).

    AUTH belongs to the pool: password= (and user=, "default" if not given) is what it asks
    of its clients (AUTH and HELLO ... AUTH are answered by their session; anything else
    before them, -NOAUTH); upstream_password= (and upstream_user=) is what it says itself to
    the server, on each connection it opens. A client's credentials never reach a shared
    connection. dedicated_cap bounds the connections each pool opens for its clients' own
    use (a wait, a stream) at once.

    A script calls commands as the pool's upstream user, so the pool forwards scripts only
    where that user is confined to what the table forwards: confined=True says it is (a check
    against the server found so: part3/acl.py); own_user=(name, password, rules) is an ACL
    user of the pool's own, made again on each connection it opens (ACL SETUSER, after its
    AUTH) and authenticated as, whose rules are the table's (acl.rules()). Neither: every
    script is refused, and the refusal names the remedy."""

    def __init__(self, allow=(), refuse=(), max_reply=MAX_REPLY, max_request=MAX_REQUEST,
                 password=None, user=None, upstream_password=None, upstream_user=None,
                 dedicated_cap=DEDICATED_CAP, confined=False, own_user=None):
        self.allowed = self._names(allow, {commands.POLICY}, "allowed")
        self.refused = self._names(refuse, {commands.FORWARD, commands.CONFINED}, "refused")
        self.max_reply = max_reply
        self.max_request = max_request
        self._by_name = {}   # NAME's key -> (forwarded whatever the arguments, the reply types)
        self.password = as_bytes(password)
        self.user = as_bytes(user) or b"default"
        self.upstream_password = as_bytes(upstream_password)
        self.upstream_user = as_bytes(upstream_user)
        self.dedicated_cap = dedicated_cap
        self.own_user = own_user
        self.confined = confined or own_user is not None
        self._own_user_opening = [] if own_user is None else [
            array(b"ACL", b"SETUSER", own_user[0], *own_user[2]),
            array(b"AUTH", own_user[0], own_user[1])]

    @staticmethod
    def _names(names, actions, verb):
        """The table's names, upper case, each of a row whose action is one of `actions`."""
        chosen = set()
        for name in names:
            name = (name if isinstance(name, bytes) else name.encode("ascii")).upper()
            row = commands.COMMANDS.get(name)
            if row is None:
                raise ValueError(f"{shown(name)} is not in the command table: no pool frames it")
            kind = commands.KINDS[row.kind]
            if kind.action not in actions and not (kind.policy and commands.POLICY in actions):
                raise ValueError(f"{shown(name)} cannot be {verb} by name: it {kind.effect} "
                                 f"(its action is {kind.action})")
            chosen.add(name)
        return frozenset(chosen)

    def reply_size(self, buffer):
        """Length of the first whole reply at the start of buffer, or None while it has not
        ended."""
        return reply_size(buffer, self.max_reply)

    def reply_parser(self, passing=False):
        """A fresh parser (called on one reply as it grows, it keeps its place) that reads a
        reply longer than max_reply to its end without keeping it: Frames then gives an
        Overlong, and the pool answers that client with an error, not the connection's end;
        passing=True: it hands the reply on in pieces instead (Frames(passing=True))."""
        return Parser(self.max_reply, overlong="pass" if passing else "drop")

    def request_parser(self, passing=False):
        """The same for one request: an array of bulk strings, or an inline command."""
        return Parser(self.max_request, request=True, overlong="pass" if passing else "drop")

    def request_size(self, buffer):
        """Length of the first whole request at the start of buffer, or None while it has
        not ended; ValueError for a malformed one (nothing after it can be framed), and for
        one longer than max_request."""
        return Parser(self.max_request, request=True).size(buffer)

    def verdict(self, items):
        """(action, reason) for a request's words: commands.FORWARD and None if the pool
        sends it on a shared connection, else the action the table names (policy applied)
        and why the request is refused. A command the table lacks is never sent."""
        name = commands.name_of(items)
        if b"\x00" in name:   # redis-server compares names with strcasecmp(), which stops at a NUL
            return commands.NEVER, f"a command name with a NUL byte ({shown(name)})"
        row = commands.COMMANDS.get(name)
        if row is None:
            return commands.NEVER, (f"{shown(name)} is not in the pool's command table, so the "
                                    f"pool cannot tell what answers it")
        kind_name = commands.kind_of(row, items)
        kind = commands.KINDS[kind_name]
        if kind_name != row.kind:   # its arguments made it another kind: say which
            name += b" " + commands.BY_ARGUMENTS[row.name][2]
        if name in self.refused:
            return commands.POLICY, f"{shown(name)} is refused by the pool's policy"
        if kind.policy and name not in self.allowed:   # MONITOR: by the policy, then its kind
            return commands.POLICY, (f"{shown(name)} {kind.effect}; refused by the pool's policy "
                                     f"(allow it by name)")
        if kind.action == commands.FORWARD or (name in self.allowed and not kind.policy):
            return commands.FORWARD, None
        if kind.action == commands.CONFINED:
            if self.confined:
                return commands.FORWARD, None
            return commands.CONFINED, (
                f"{shown(name)} {kind.effect}; the pool forwards a script only where its "
                f"upstream user is confined to what the pool forwards: start it with `python3 "
                f"-m part3 serve`, which confines it where it can, or install the rule `python3 "
                f"-m part3 acl` prints")
        if kind.action == commands.POLICY:
            return commands.POLICY, (f"{shown(name)} {kind.effect}; refused by the pool's policy "
                                     f"(allow it by name)")
        if kind.action == commands.NEVER:
            return commands.NEVER, f"{shown(name)} {kind.effect}; a pool never passes it"
        return kind.action, f"{shown(name)} {kind.effect}; a pool cannot lend it"

    def forwards_plainly(self, request):
        """True when request is a command the table forwards whatever its arguments say
        (GET, SET: no container, no argument that changes its kind), as its name alone
        tells, remembered by name; False when the words must decide (RedisSession.admit()
        asks this first, and splits the words only then)."""
        name = NAME.match(request)
        said = name and self._by_name.get(name[1])   # the common case: a name met before
        return (said or self._named(request))[0]

    def _named(self, request):
        """What a request's name alone says: (forwards_plainly, the reply types of its row),
        (False, None) when the name does not say (inline, a container, a name unknown)."""
        name = NAME.match(request)
        if name is None:
            return NOT_BY_NAME
        key = name[1]
        said = self._by_name.get(key)
        if said is None:
            said = self._learn(key)
            if len(self._by_name) < NAMES_KEPT:
                self._by_name[key] = said
        return said

    def _learn(self, key):
        """What NAME's key (b"$3\\r\\nGET") says, from the table and the policy."""
        length, name = key.split(b"\r\n")
        command = name.upper()
        row = commands.COMMANDS.get(command)
        if int(length[1:]) != len(name) or row is None or command in commands.CONTAINERS:
            return NOT_BY_NAME
        plainly = command not in commands.BY_ARGUMENTS and \
            self.verdict([name]) == (commands.FORWARD, None)
        return plainly, row.replies

    def refusal(self, request):
        """Why this request may not reach a pooled connection (a message), or None. A blank
        one is not refused: the session answers it with nothing."""
        if (fault := inline_fault(request)):
            return fault
        items = words(request)
        return self.verdict(items)[1] if items else None

    def session(self, lender=None):
        """What the pool keeps of one client between its requests (RedisSession): with the
        lender of a pool that can hold state for it (SessionProxy's, ManagedProxy's), the
        session answers, replays, pins and dedicates; without one, it refuses what would
        need it."""
        return RedisSession(self, lender)

    passes_long = True   # a message longer than a pool keeps can be passed on in pieces
    fresh_state = (2, 0, False, None)   # what a connection the pool opens carries, AUTH said:
    # (its protocol, its database, whether CLIENT NO-EVICT is on, its CLIENT SETNAME)

    def opening(self):
        """What the pool says on a connection it has just opened, before anything else: its
        own AUTH (upstream_password), then, with a user of its own, that user made again (a
        server restarted since has forgotten it) and authenticated as; or nothing."""
        opening = []
        if self.upstream_password is not None:
            user = [self.upstream_user] if self.upstream_user else []
            opening.append(array(b"AUTH", *user, self.upstream_password))
        return opening + self._own_user_opening

    def facts_requests(self):
        """What the pool asks its server once (facts()): HELLO with no version (the server's
        version, mode and role, in whatever protocol the connection speaks) and CONFIG GET
        databases (what a SELECT may name)."""
        return [array(b"HELLO"), array(b"CONFIG", b"GET", b"databases")]

    def facts(self, replies):
        """The Facts facts_requests()' replies give. A server that does not say (no HELLO
        before Redis 6, CONFIG refused by its ACL) leaves that fact at its default, or None."""
        hello, databases = replies
        return Facts.read(hello, databases)

    def sync(self, carried, wanted):
        """The requests that bring a connection carrying the state `carried` to the state
        `wanted` (each a fresh_state-like tuple): HELLO, SELECT, CLIENT NO-EVICT and SETNAME
        for what
        differs; on a connection just opened (carried None), the pool's AUTH first."""
        requests = self.opening() if carried is None else []
        protocol, db, no_evict, name = carried or self.fresh_state
        wanted_protocol, wanted_db, wanted_no_evict, wanted_name = wanted or self.fresh_state
        if protocol != wanted_protocol:
            requests.append(array(b"HELLO", b"%d" % wanted_protocol))
        if db != wanted_db:
            requests.append(array(b"SELECT", b"%d" % wanted_db))
        if no_evict != wanted_no_evict:
            requests.append(array(b"CLIENT", b"NO-EVICT", b"on" if wanted_no_evict else b"off"))
        if name != wanted_name:   # so CLIENT LIST and the server's log name the client
            requests.append(array(b"CLIENT", b"SETNAME", wanted_name or b""))
        return requests

    def synced(self, request, reply):
        """Why a reply to sync()'s HELLO (a map, or RESP2's array), SELECT or AUTH (+OK) is
        wrong, or None."""
        command = words(request)[0]
        if reply[:1] in b"%*" if command == b"HELLO" else reply == b"+OK\r\n":
            return None
        if command == b"AUTH":
            return f"the upstream refused the pool's own AUTH: {shown(reply[:60].strip())}"
        return f"{shown(command)} was answered {shown(reply[:60].strip())}"

    def error(self, message, code="ERR"):
        """An error reply in RESP's own form: one line, so no line break survives in it."""
        text = re.sub(r"[\r\n]", " ", message).encode("utf-8", "replace")
        return b"-%s %s\r\n" % (code.encode("ascii"), text)

    def fits(self, request, reply, framed=False):
        """True if `reply` is one whole RESP reply of a type that can answer `request`
        (a whole request: an array, or an inline command with its line end), as the
        command table says; an error answers any command the table has. An Overlong reply
        (read whole and dropped) is judged by its first byte. framed=True: the reply is one
        whole reply already (the framing's parser framed it), so only its type is checked."""
        kind = reply[:1]
        if kind == b"-" and isinstance(reply, Overlong):
            kind = reply.head[:1]
        elif not kind and isinstance(reply, PassedEnd):   # a long reply's end: judged by its head
            kind = reply.head[:1]
        elif not framed:
            try:
                if reply_size(reply, self.max_reply) != len(reply):
                    return False
            except ValueError:
                return False
        name = NAME.match(request)
        said = name and self._by_name.get(name[1])   # the common case: a name met before
        replies = (said or self._named(request))[1]
        if replies is None:
            row = commands.lookup(words(request) or [b""])
            if row is None:
                return False
            replies = row.replies
        return len(kind) == 1 and (kind == b"-" or kind in replies)

    def __repr__(self):
        bounds = (self.max_reply, self.max_request)
        if self.allowed or self.refused or bounds != (MAX_REPLY, MAX_REQUEST):
            return (f"resp.Resp(allow={sorted(self.allowed)}, refuse={sorted(self.refused)}, "
                    f"max_reply={self.max_reply}, max_request={self.max_request})")
        return "resp.RESP"


RESP = Resp()
