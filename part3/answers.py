"""answers: what a Redis session answers itself (HELLO, AUTH, SELECT, CLIENT ..., QUIT, RESET),
as redis-server answers each, from what the session keeps. RedisSession's, by inheritance
(part3/session.py); a reader of its admission rules need not read each answer.

    PoolAnswers   one method per command the pool answers; ANSWERS names them by command
"""
import hmac
import re

from part3.parser import INTEGER
from part3.words import bulk, null, shown

NAME_BYTES = re.compile(rb"[!-~]*")   # a client name redis-server takes: no blank, no control byte
WRONGPASS = b"-WRONGPASS invalid username-password pair or user is disabled.\r\n"
NAME_REFUSED = b"-ERR Client names cannot contain spaces, newlines or special characters.\r\n"


class PoolAnswers:
    """The commands a Redis session answers itself (ANSWERS), as redis-server answers each,
    from what the session keeps: its protocol, database, name, credentials (RedisSession's
    fields; the lender gives the server's facts and the client's id). An answer that ends
    what the client held (QUIT) or admits it (AUTH) moves the session's mode (move())."""

    def hello(self, items):
        version, options = None, items[1:]
        if options:
            if not INTEGER.fullmatch(options[0]):
                return self.framing.error("Protocol version is not an integer or out of range")
            version, options = int(options[0]), options[1:]
            if version not in (2, 3):
                return self.framing.error("unsupported protocol version", code="NOPROTO")
        credentials, name, position = None, None, 0
        while position < len(options):
            option, more = options[position].upper(), len(options) - position - 1
            if option == b"AUTH" and more >= 2:
                credentials, position = options[position + 1:position + 3], position + 3
            elif option == b"SETNAME" and more:
                name, position = options[position + 1], position + 2
            else:
                return self.framing.error(f"Syntax error in HELLO option '{shown(option)}'")
        if credentials and not self.authenticate(*credentials):
            return WRONGPASS
        if not self.authenticated:
            return self.framing.error(
                "HELLO must be called with the client already authenticated, otherwise the "
                "HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client "
                "and select the RESP protocol version at the same time", code="NOAUTH")
        if name is not None and not NAME_BYTES.fullmatch(name):
            return NAME_REFUSED
        try:
            facts = self.lender.facts()
        except (OSError, ValueError) as error:
            return self.framing.error(f"upstream: {error}")
        if name is not None:
            self.name = name or None   # an empty name clears it
        self.protocol = version or self.protocol
        self.restate()
        pairs = [bulk(b"server"), bulk(b"redis"), bulk(b"version"), bulk(facts.version),
                 bulk(b"proto"), b":%d\r\n" % self.protocol, bulk(b"id"), b":%d\r\n" % self.id,
                 bulk(b"mode"), bulk(facts.mode), bulk(b"role"), bulk(facts.role),
                 bulk(b"modules"), b"*0\r\n"]
        opening = b"%%%d\r\n" % (len(pairs) // 2) if self.protocol == 3 else b"*%d\r\n" % len(pairs)
        return opening + b"".join(pairs)

    def authenticate(self, user, password):
        """Whether these are the credentials the pool asks of its clients (any password, for
        user default, when it asks none, as redis-server's default user without one)."""
        wanted = self.framing.password
        right = hmac.compare_digest(user, self.framing.user) and (
            wanted is None or hmac.compare_digest(password, wanted))
        if right:
            self.move("authenticated")
        return right

    def auth(self, items):
        if len(items) not in (2, 3):
            return self.framing.error("syntax error" if len(items) > 3 else
                                      "wrong number of arguments for 'auth' command")
        if len(items) == 2 and self.framing.password is None:
            return self.framing.error("AUTH <password> called without any password configured "
                                      "for the default user. Are you sure your configuration is "
                                      "correct?")
        user, password = (b"default", items[1]) if len(items) == 2 else items[1:]
        return b"+OK\r\n" if self.authenticate(user, password) else WRONGPASS

    def select(self, items):
        if len(items) != 2:
            return self.framing.error("wrong number of arguments for 'select' command")
        if not INTEGER.fullmatch(items[1]):
            return self.framing.error("value is not an integer or out of range")
        index = int(items[1])
        if index:
            try:
                databases = self.lender.facts().databases
            except (OSError, ValueError) as error:
                return self.framing.error(f"upstream: {error}")
            if databases is None:
                return self.refuse("SELECT: the server does not say how many databases it has "
                                   "(CONFIG GET databases), so the pool selects only 0")
            if not 0 <= index < databases:
                return self.framing.error("DB index is out of range")
        self.db = index
        self.restate()
        return b"+OK\r\n"

    def client(self, items):
        subcommand = items[1].upper()
        arity = {b"SETNAME": 3, b"GETNAME": 2, b"ID": 2, b"SETINFO": 4, b"INFO": 2}[subcommand]
        if len(items) != arity:
            return self.framing.error(f"wrong number of arguments for 'client|"
                                      f"{shown(subcommand.lower())}' command")
        if subcommand == b"ID":
            return b":%d\r\n" % self.id
        if subcommand == b"INFO":
            return self.client_info()
        if subcommand == b"GETNAME":
            return bulk(self.name) if self.name else null(self.protocol)
        if subcommand == b"SETNAME":
            if not NAME_BYTES.fullmatch(items[2]):
                return NAME_REFUSED
            self.name = items[2] or None
            self.restate()
            return b"+OK\r\n"
        attribute = items[2].lower()
        if attribute not in (b"lib-name", b"lib-ver"):
            return self.framing.error(f"Unrecognized option '{shown(items[2])}'")
        if not NAME_BYTES.fullmatch(items[3]):
            return self.framing.error(f"{attribute.decode()} cannot contain spaces, newlines or "
                                      f"special characters.")
        self.library[attribute] = items[3]
        return b"+OK\r\n"

    def client_info(self):
        """CLIENT INFO, as redis-server writes it, for this client: its id, its address and the
        pool's (not those of the connection the pool would send it on, which a library would
        record as its own: rq names its workers by it), its name, database and protocol; a
        verbatim string in RESP3. What the pool does not keep (buffers, memory) reads 0."""
        peer, here = (f"{addr[0]}:{addr[1]}" for addr in self.addresses or (("?", 0),) * 2)
        streams = self.subscribed if self.streams else {b"": 0, b"s": 0}
        fields = (f"id={self.id} addr={peer} laddr={here} fd=-1 name={shown(self.name or b'')} "
                  f"age=0 idle=0 flags={'e' if self.no_evict else 'N'} db={self.db} "
                  f"sub={streams[b'']} psub=0 "
                  f"ssub={streams[b's']} multi=-1 qbuf=0 qbuf-free=0 argv-mem=0 multi-mem=0 "
                  f"rbs=0 rbp=0 obl=0 oll=0 omem=0 tot-mem=0 events=r cmd=client|info "
                  f"user={shown(self.framing.user)} redir=-1 resp={self.protocol}\n").encode()
        if self.protocol == 3:
            return b"=%d\r\ntxt:%s\r\n" % (len(fields) + 4, fields)
        return bulk(fields)

    def no_evict_command(self, items):
        """CLIENT NO-EVICT on|off: kept, and replayed on every connection the client's
        requests go on (sync()), as SELECT is."""
        if len(items) != 3:
            return self.framing.error("wrong number of arguments for 'client|no-evict' command")
        if items[2].lower() not in (b"on", b"off"):
            return self.framing.error("syntax error")
        self.no_evict = items[2].lower() == b"on"
        self.restate()
        return b"+OK\r\n"

    def reply_command(self, items):
        """CLIENT REPLY ON changes nothing (a connection the pool lends always replies); OFF
        and SKIP would silence it, so that no reply ends a loan: never."""
        if len(items) == 3 and items[2].lower() == b"on":
            return b"+OK\r\n"
        return self.refuse(self.framing.verdict(items)[1])

    def quit(self, items):
        """+OK, then the end: the pool closes the connection after it (the lender sees
        `quitting`), and answers nothing the client sent after it."""
        self.move("quit")   # what it held is let go, never lent
        return b"+OK\r\n"

    def reset_command(self, items):
        self.reset()
        return b"+RESET\r\n"

    def unsubscribe(self, items):
        """(P|S)UNSUBSCRIBE with nothing subscribed, as redis-server answers it: one confirmation
        per channel named (or one, its channel null), each with a count of 0."""
        kind = items[0].lower()
        opening = b">3\r\n" if self.protocol == 3 else b"*3\r\n"
        named = [bulk(channel) for channel in items[1:]] or [null(self.protocol)]
        return b"".join(opening + bulk(kind) + channel + b":0\r\n" for channel in named)


ANSWERS = {   # the commands the pool answers itself, from what the session keeps
    b"HELLO": PoolAnswers.hello, b"AUTH": PoolAnswers.auth, b"SELECT": PoolAnswers.select,
    b"CLIENT SETNAME": PoolAnswers.client, b"CLIENT GETNAME": PoolAnswers.client,
    b"CLIENT ID": PoolAnswers.client, b"CLIENT SETINFO": PoolAnswers.client,
    b"CLIENT INFO": PoolAnswers.client,
    b"CLIENT NO-EVICT": PoolAnswers.no_evict_command, b"CLIENT REPLY": PoolAnswers.reply_command,
    b"QUIT": PoolAnswers.quit, b"RESET": PoolAnswers.reset_command,
    b"UNSUBSCRIBE": PoolAnswers.unsubscribe, b"PUNSUBSCRIBE": PoolAnswers.unsubscribe,
    b"SUNSUBSCRIBE": PoolAnswers.unsubscribe,
}
