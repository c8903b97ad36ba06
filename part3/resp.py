"""resp: where a Redis reply ends and where a Redis request ends, so a pool can stand
between real Redis clients and a redis-server (RESP2, and RESP3's replies).

The pool's checkin is a parse; for Redis the parse is RESP's, not a newline's.
A GET of a stored value is answered `$5\\r\\nhello\\r\\n`: two lines, one reply.
A pool that stops at the first b"\\n" lends the connection with `hello\\r\\n` still
on it, and the next borrower reads A's value as its own (CVE-2023-28858 was
that class of bug in redis-py's asyncio client).

A pool must parse both directions. A request it did not read whole is a request
it cannot vouch for: redis-server reads `*1\\r\\r$4\\r\\rPING\\r\\r*4...` as two
commands, and a pool that took it for one line would lend the connection while the
second still runs. And a pool forwards only the commands it knows how to frame:
part3/commands.py is the table of them, with what each does to a connection (after
MULTI, SELECT or SUBSCRIBE a connection is no longer interchangeable with its
neighbours) and so what the pool does with it. RedisSession applies it per client.

Map of the module:

    Parser                  where one message ends, found as its bytes arrive: it keeps
                            its place between calls, so a reply read in many recv()s
                            is parsed once (linear), and it needs no stack; made with
                            overlong="drop", it reads a message too long to keep to its
                            end, counting the bytes it lets go (Frames drops them)
    reply_size(buffer)      the length of the first whole reply in buffer, None while
                            it has not ended, ValueError for bytes no reply starts with
    words(request)          the command and arguments of a whole request, split as
                            redis-server splits them; inline_fault(request) says when
                            redis-server would read an inline command otherwise
    Resp                    the framing object FramedProxy takes (max_reply, reply_size(),
                            reply_parser(), request_parser(), request_size(), fits(),
                            verdict(), refusal(), session(), error()); RESP = Resp() is the
                            one to use; Resp(allow=...) opens what the policy refuses
    RedisSession            one client's rules: the table's verdict on each request, a
                            transaction refused whole, a blank line answered with nothing

The five RESP2 types, each opening with one type byte and a line ended by b"\\r\\n":
    +OK            simple string      -ERR ...     error         :42      integer
    $5 hello       bulk string: the line gives the length, then that many bytes and
                   b"\\r\\n"; $-1 is the null bulk string (GET of a missing key)
    *2 ...         array: the line gives the count, then that many replies of any
                   type, arrays included; *-1 is the null array
RESP3 (what a client gets after HELLO 3) adds, one line each: _ null, #t or #f boolean,
,3.14 double, (123 big number; length-prefixed as $ is: =8 verbatim string (txt:...), !5
blob error; and aggregates: ~n set, >n push (out of band: no request asked for it), %n map
(n pairs), |n attribute (n pairs, then the reply they annotate: one message). RESP3's
streamed forms ($? and *?) are refused: redis-server never sends them.
A request is an array of bulk strings (`*2\\r\\n$3\\r\\nGET\\r\\n$1\\r\\na\\r\\n`, what every
client library sends), or an inline command (`GET a\\r\\n`, what a person types), as
redis-server reads them. A b"\\r" that is not followed by b"\\n" ends no line here:
it makes the message malformed.
"""
import re

import part3.commands as commands
from tcp_proxy import Session

MAX_REPLY = 1 << 20     # the longest reply a pool will buffer (Redis allows 512 MB; a toy does not)
MAX_REQUEST = 1 << 20   # the longest request array it will buffer
MAX_INLINE = 64 * 1024  # the longest inline command (redis-server's own limit)
MAX_BULK = 512 << 20    # the longest request bulk string redis-server takes (proto-max-bulk-len)
MAX_COUNT = (1 << 31) - 1   # the most elements it takes in a request's array (INT_MAX)

LENGTH = re.compile(rb"-1|0|[1-9][0-9]{0,17}")   # a length or count: canonical, or -1 for null
INTEGER = re.compile(rb"-?(0|[1-9][0-9]{0,18})")
CR, LF = b"\r\n"   # as integers, what indexing a buffer gives
BULK = re.compile(rb"\$(0|[1-9][0-9]{0,17})\r\n")   # a bulk string's line, the common case, read in one step
ARRAY = re.compile(rb"\*([1-9][0-9]{0,17})\r\n")     # an array's line, when it holds something
SIMPLE = re.compile(rb"[+-][^\r\n]*\r\n|:-?(?:0|[1-9][0-9]{0,18})\r\n|[$*]-1\r\n")   # a whole one-line reply
# RESP3's one-line types, and RESP2's integer: the type byte and what its line must be.
SCALARS = {
    b":": INTEGER,
    b"_": re.compile(rb""),                                          # null
    b"#": re.compile(rb"[tf]"),                                      # boolean
    b",": re.compile(rb"[+-]?(inf|nan|[0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?)"),   # double
    b"(": re.compile(rb"-?(0|[1-9][0-9]*)"),                         # big number
}
SCALAR_NAMES = {b":": "integer", b"_": "null", b"#": "boolean", b",": "double", b"(": "big number"}
# The length-prefixed types: elements per unit of the length (0: a string of that many bytes).
# A map holds n pairs; an attribute n pairs too, then the reply it annotates (one message).
LENGTHS = {b"$": 0, b"=": 0, b"!": 0, b"*": 1, b"~": 1, b">": 1, b"%": 2, b"|": 2}
# An inline command's word as redis-server's sdssplitargs() (src/sds.c) reads one, quotes
# aside: blanks (isspace()) are skipped before a word, and a word ends at a space, a tab, a
# line end or a NUL, so a \v or \f inside one is part of it.
INLINE_WORD = re.compile(rb"[^ \t\n\r\x00\v\f][^ \t\n\r\x00]*")


class Overlong(bytes):
    """A message longer than the pool keeps, read to its end and dropped: its bytes are the
    error that answers it, in RESP's form (so a pool passes it to the client as it passes
    any error), and it keeps what is known of the message: its size, the limit it went
    past, its first bytes (head: HEAD at most, as many as had come when the first were
    dropped), and whether it was a request."""
    HEAD = 64

    def __new__(cls, size, limit, head, request):
        if request:
            text = (f"tcp-proxy: a request of {size} bytes is too long: longer than the {limit} "
                    f"a pool keeps, so it was read to its end and dropped, never sent")
        else:
            text = (f"upstream: a reply of {size} bytes is too long to pass on: longer than the "
                    f"{limit} a pool keeps, so it was read to its end and dropped")
        message = super().__new__(cls, b"-ERR %s\r\n" % text.encode("ascii"))
        message.size, message.limit, message.head, message.request = size, limit, head, request
        return message


class Parser:
    """Where one RESP message ends, found as its bytes arrive.

    size(buffer) (or calling the parser) is given the message from its first byte, as much
    as has arrived, and returns its length once it is whole, else None; it resumes where it
    stopped, so a message read in k pieces costs one parse of it, not k. Nesting needs no
    stack: an array of n adds n to the count of elements still to read, and the
    message has ended when that count reaches 0. request=True reads a request: an
    array of bulk strings, or an inline command. Raises ValueError for bytes no
    message starts with.

    A message longer than max_size is a ValueError too, unless overlong="drop": then the
    parser notes that it is `over` and reads on to the message's end, keeping its place but
    not its bytes: each time it stops for more, it deletes from the buffer's front (a
    bytearray, Frames' own) what it will not read again, counting it in `dropped`. Once
    the message has ended, message(kept) gives, for the bytes of it still kept, those bytes,
    or for one that was over, the Overlong error that answers it. The bound is on memory,
    not on how far a parse may go.
    """

    def __init__(self, max_size, request=False, overlong="raise"):
        if overlong not in ("raise", "drop"):
            raise ValueError(f"overlong is 'raise' or 'drop', not {overlong!r}")
        self.max_size = max_size
        self.request = request
        self.overlong = overlong
        self.inline = None       # for a request, once its first byte is in: is it inline?
        self.position = 0        # bytes of the message parsed whole so far, from the buffer's front
        self.searched = 0        # where the search for the current line's end resumes
        self.still_to_read = 1   # elements (array elements included) not yet read whole
        self.bulk_end = None     # inside a bulk string: where its bytes end
        self.lines = 0           # lines parsed, each once however the bytes came (the tests read it)
        self.over = False        # the message has proved longer than max_size (overlong="drop")
        self.dropped = 0         # bytes of it deleted from the buffer's front
        self.head = None         # its first bytes, kept when the first of them are deleted

    def __call__(self, buffer):
        return self.size(buffer)

    def size(self, buffer):
        end = self._parse(buffer)
        if end is None and self.over:
            self._let_go(buffer)
        return end

    def message(self, kept):
        """The message size() found the end of, from the bytes of it still in the buffer."""
        if not self.over:
            return bytes(kept)
        head = self.head if self.head is not None else bytes(kept[:Overlong.HEAD])
        return Overlong(self.dropped + len(kept), self.max_size, head, self.request)

    def _parse(self, buffer):
        if not buffer:   # nothing has arrived (a reader asks after every message it takes)
            return None
        if self.request and self.inline is None:
            self.inline = buffer[:1] != b"*"
        if self.inline:
            return self._inline(buffer)
        if not (self.lines or self.searched or self.over) and (whole := self._at_once(buffer)):
            return whole   # the common case, in one step
        while self.still_to_read or self.bulk_end is not None:
            if self.bulk_end is not None:
                if len(buffer) < self.bulk_end + 2:
                    return None   # the bulk string's bytes have not all arrived
                if buffer[self.bulk_end:self.bulk_end + 2] != b"\r\n":
                    raise ValueError("a bulk string not followed by \\r\\n where its length says")
                self.position = self.searched = self.bulk_end + 2
                self.bulk_end = None
                continue
            if (self.lines or not self.request) and self._whole_bulk_strings(buffer):
                continue
            if (line := self._line(buffer)) is None:
                return None
            self._element(line[:1], line[1:])
        return self.position

    def _at_once(self, buffer):
        """A message of the common shapes that has arrived whole (a one-line reply, a bulk
        string, an array of bulk strings: every request a client library sends), read in one
        pass; None for anything else, which the step by step parse then reads, or rejects."""
        first = buffer[:1]
        if first == b"*" and (head := ARRAY.match(buffer)):
            count, position = int(head[1]), head.end()
        elif self.request:
            return None
        elif first == b"$" and buffer[1:2] != b"-":
            count, position = 1, 0
        else:
            line = SIMPLE.match(buffer)
            return self._whole(1, line.end()) if line else None
        if count * 3 > len(buffer):   # not all here (an element takes 3 bytes at least)
            return None
        match = BULK.match
        for _ in range(count):
            bulk = match(buffer, position)
            if bulk is None:
                return None
            end = bulk.end() + int(bulk[1])
            if buffer[end:end + 2] != b"\r\n":
                return None
            position = end + 2
        return self._whole(count + (first == b"*"), position)

    def _whole(self, lines, size):
        if size > self.max_size:
            return None   # the step by step parse says why
        self.lines, self.position, self.searched, self.still_to_read = lines, size, size, 0
        return size

    def _let_go(self, buffer):
        """Delete from the front of the buffer what the parse of an overlong message will not
        read again: every byte before the line it is reading, or before the b"\\r\\n" that
        closes the bulk string it is in; every place it keeps moves back as much."""
        if self.inline:
            count = self.searched
        elif self.bulk_end is not None:
            count = min(self.bulk_end, len(buffer))
        else:
            count = self.position
        if not count:
            return
        if self.head is None:
            self.head = bytes(buffer[:Overlong.HEAD])
        del buffer[:count]
        self.dropped += count
        self.position = max(self.position - count, 0)
        self.searched = max(self.searched - count, 0)
        if self.bulk_end is not None:
            self.bulk_end -= count

    def _too_long(self, message):
        """A message longer than max_size: a ValueError, or (overlong="drop") read on, unkept."""
        if self.overlong == "raise":
            raise ValueError(message)
        self.over = True

    def _whole_bulk_strings(self, buffer):
        """Read the whole bulk strings that come next in one tight loop (a long array of them
        is the common long reply); True if there was one. Anything else is left to the rest."""
        position, still = self.position, self.still_to_read
        usable = len(buffer) if self.over else min(len(buffer), self.max_size)
        match = BULK.match
        while still and (bulk := match(buffer, position)):
            data_end = bulk.end() + int(bulk[1])
            if data_end + 2 > usable or buffer[data_end] != CR or buffer[data_end + 1] != LF:
                break   # not all here yet, too long, or wrong: the line by line path says which
            position = data_end + 2
            still -= 1
        read = self.still_to_read - still
        self.lines += read
        self.position = self.searched = position
        self.still_to_read = still
        return read > 0

    def _line(self, buffer):
        """The next line, without its b"\\r\\n", or None while it has not ended."""
        end = buffer.find(b"\r", self.searched)
        if (bare := buffer.find(b"\n", self.searched, len(buffer) if end < 0 else end)) >= 0:
            raise ValueError(f"a RESP line ended by a bare \\n: {bytes(buffer[self.position:bare + 1][:40])!r}")
        if end < 0 or end + 1 == len(buffer):   # not ended yet (or b"\r" is the last byte so far)
            self.searched = len(buffer) if end < 0 else end
            if not self.over and self.dropped + self.searched > self.max_size:
                self._too_long(f"a message longer than {self.max_size} bytes, and not over")
            if self.searched - self.position > self.max_size:   # one line is never dropped
                raise ValueError(f"a RESP line longer than {self.max_size} bytes, and not over")
            return None
        if buffer[end + 1] != ord(b"\n"):
            raise ValueError(f"a \\r not followed by \\n: {bytes(buffer[self.position:end + 2][:40])!r}")
        line = bytes(buffer[self.position:end])
        self.position = self.searched = end + 2
        self.lines += 1
        if not self.over and self.dropped + self.position > self.max_size:
            self._too_long(f"a message longer than {self.max_size} bytes")
        return line

    def _element(self, kind, line):
        """Account for one element's line: its type byte and the rest of its line."""
        self.still_to_read -= 1
        if self.request and kind != (b"*" if self.lines == 1 else b"$"):
            raise ValueError(f"a request array holds bulk strings only, not {kind + line[:40]!r}")
        if kind in (b"+", b"-"):
            return
        if kind in SCALARS:   # RESP2's integer and RESP3's one-line types: the line is the value
            if not SCALARS[kind].fullmatch(line):
                raise ValueError(f"not a RESP {SCALAR_NAMES[kind]}: {kind + line[:40]!r}")
            return
        if kind not in LENGTHS:
            raise ValueError(f"no RESP message starts with {kind!r} (line {kind + line[:40]!r})")
        if line == b"?":   # RESP3's streamed string or aggregate: no end known in advance
            raise ValueError(f"a streamed RESP3 message ({kind + line!r}): redis-server never "
                             f"sends one, and the pool frames none")
        if not LENGTH.fullmatch(line) or (line == b"-1" and kind not in b"$*") or \
                (self.request and kind == b"$" and line == b"-1"):
            raise ValueError(f"not a RESP length: {kind + line[:40]!r}")
        length = int(line)
        if kind == b"=" and 0 <= length < 4:   # a verbatim string opens with its format: txt:
            raise ValueError(f"a verbatim string too short for its format: {kind + line!r}")
        if self.request and length > (MAX_BULK if kind == b"$" else MAX_COUNT):
            raise ValueError(f"longer than redis-server takes in a request: {kind + line!r}")
        elements = LENGTHS[kind]   # elements per unit of its length; 0 for a string
        least = length * (elements * 3 or 1)   # 3 bytes an element at least
        if not self.over and least > self.max_size:
            self._too_long(f"a message longer than {self.max_size} bytes: {kind + line!r}")
        if elements:
            # *-1, the null array, holds nothing; an attribute's pairs come before the reply it
            # annotates, which is read as this element's place
            self.still_to_read += max(length, 0) * elements + (kind == b"|")
        elif length >= 0:
            self.bulk_end = self.position + length
            if not self.over and self.dropped + self.bulk_end + 2 > self.max_size:   # and the whole
                self._too_long(f"a message longer than {self.max_size} bytes: {kind + line!r}")

    def _inline(self, buffer):
        """An inline command: one line, ended by b"\\n" or b"\\r\\n", with no other b"\\r" in it."""
        end = buffer.find(b"\n", self.searched)
        if not self.over and self.dropped + (len(buffer) if end < 0 else end) > MAX_INLINE:
            self._too_long(f"an inline command longer than {MAX_INLINE} bytes")
        if end < 0:
            self.searched = len(buffer)
            return None
        if not self.over and b"\r" in buffer[:end].removesuffix(b"\r"):
            raise ValueError(f"a \\r not followed by \\n: {bytes(buffer[:end + 1][:40])!r}")
        self.lines += 1
        return end + 1


def reply_size(buffer, max_reply=MAX_REPLY):
    """The length of the first whole RESP reply at the start of buffer, or None while
    it has not ended. Raises ValueError for bytes no valid reply starts with."""
    return Parser(max_reply).size(buffer)


def words(request):
    """The command and arguments of one whole request (as Parser(request=True) framed it);
    an inline command's split as redis-server splits it (INLINE_WORD). [] for a blank line
    or an empty array, which redis-server answers with nothing."""
    if not request.startswith(b"*"):
        return INLINE_WORD.findall(request.removesuffix(b"\n").removesuffix(b"\r"))
    items, position = [], request.index(b"\r\n") + 2
    while position < len(request):   # each element: $<length>\r\n<bytes>\r\n
        line_end = request.index(b"\r\n", position)
        start = line_end + 2
        end = start + int(request[position + 1:line_end])
        items.append(request[start:end])
        position = end + 2
    return items


def inline_fault(request):
    """Why redis-server would read this inline command otherwise than words() does, or None.
    Its inline parser finds the line's end with strchr(), which stops at a NUL: a line with
    one is never over for it, and the connection waits for ever (src/networking.c,
    processInlineBuffer); and sdssplitargs() unquotes quotes into words the pool never saw."""
    if request.startswith(b"*"):
        return None
    if b"\x00" in request:
        return "an inline command with a NUL byte (redis-server's inline parser stops at it)"
    if b'"' in request or b"'" in request:
        return "an inline command with quotes (send it as a RESP array)"
    return None


def shown(name):
    """A command's name as an error quotes it: short, every byte printable (b"GET\\x00")."""
    return repr(bytes(name[:40]))[2:-1]


class Resp:
    """The RESP framing: the interface FramedProxy(framing=...) drives.

    Resp(allow=names) forwards the commands named (a server-wide command of the table,
    `FLUSHDB`, `CONFIG SET`) that the policy refuses by default; Resp(refuse=names) refuses
    commands it would forward. A name the table does not have, or one it never passes, is a
    ValueError. max_reply and max_request bound what the pool keeps of one message."""

    def __init__(self, allow=(), refuse=(), max_reply=MAX_REPLY, max_request=MAX_REQUEST):
        self.allowed = self._names(allow, commands.POLICY, "allowed")
        self.refused = self._names(refuse, commands.FORWARD, "refused")
        self.max_reply = max_reply
        self.max_request = max_request

    @staticmethod
    def _names(names, action, verb):
        """The table's names, upper case, each of a row whose action is `action`."""
        chosen = set()
        for name in names:
            name = (name if isinstance(name, bytes) else name.encode("ascii")).upper()
            row = commands.COMMANDS.get(name)
            if row is None:
                raise ValueError(f"{shown(name)} is not in the command table: no pool frames it")
            kind = commands.KINDS[row.kind]
            if kind.action != action:
                raise ValueError(f"{shown(name)} cannot be {verb} by name: it {kind.effect} "
                                 f"(its action is {kind.action})")
            chosen.add(name)
        return frozenset(chosen)

    def reply_size(self, buffer):
        """Length of the first whole reply at the start of buffer, or None while it has not ended."""
        return reply_size(buffer, self.max_reply)

    def reply_parser(self):
        """A fresh parser (called on one reply as it grows, it keeps its place) that reads a
        reply longer than max_reply to its end without keeping it: Frames then gives an
        Overlong, and the pool answers that client with an error, not the connection's end."""
        return Parser(self.max_reply, overlong="drop")

    def request_parser(self):
        """The same for one request: an array of bulk strings, or an inline command."""
        return Parser(self.max_request, request=True, overlong="drop")

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
        if kind.action == commands.FORWARD or name in self.allowed:
            return commands.FORWARD, None
        if kind.action == commands.POLICY:
            return commands.POLICY, (f"{shown(name)} {kind.effect}; refused by the pool's policy "
                                     f"(allow it by name)")
        if kind.action == commands.NEVER:
            return commands.NEVER, f"{shown(name)} {kind.effect}; a pool never passes it"
        return kind.action, f"{shown(name)} {kind.effect}; a pool cannot lend it"

    def refusal(self, request):
        """Why this request may not reach a pooled connection (a message), or None. A blank
        one is not refused: the session answers it with nothing."""
        if (fault := inline_fault(request)):
            return fault
        items = words(request)
        return self.verdict(items)[1] if items else None

    def session(self):
        """What the pool keeps of one client between its requests (RedisSession)."""
        return RedisSession(self)

    def error(self, message, code="ERR"):
        """An error reply in RESP's own form: one line, so no line break survives in it."""
        text = re.sub(r"[\r\n]", " ", message).encode("utf-8", "replace")
        return b"-%s %s\r\n" % (code.encode("ascii"), text)

    def fits(self, request, reply):
        """True if `reply` is one whole RESP reply of a type that can answer `request`
        (a whole request: an array, or an inline command with its line end), as the
        command table says; an error answers any command the table has. An Overlong reply
        (read whole and dropped) is judged by its first byte."""
        if isinstance(reply, Overlong):
            kind = reply.head[:1]
        else:
            try:
                if reply_size(reply, self.max_reply) != len(reply):
                    return False
            except ValueError:
                return False
            kind = reply[:1]
        row = commands.lookup(words(request) or [b""])
        return row is not None and len(kind) == 1 and (kind == b"-" or kind in row.replies)

    def __repr__(self):
        bounds = (self.max_reply, self.max_request)
        if self.allowed or self.refused or bounds != (MAX_REPLY, MAX_REQUEST):
            return (f"resp.Resp(allow={sorted(self.allowed)}, refuse={sorted(self.refused)}, "
                    f"max_reply={self.max_reply}, max_request={self.max_request})")
        return "resp.RESP"


class RedisSession(Session):
    """One client's rules, applied to each of its requests before any borrow (admit()).

    A request the table forwards is sent on (None). A blank line or an empty array is
    answered with nothing (b""), as redis-server answers it. A request longer than
    max_request was read to its end and dropped: an error says so, and the client goes
    on. Anything else is refused with an error naming its rule; and a refused MULTI
    refuses its whole transaction: every request up to its EXEC or DISCARD is answered
    with an error and never sent, so nothing of it runs, and a client told that it
    failed can send it again without applying any of it twice.
    """

    def __init__(self, framing):
        super().__init__(framing)
        self.refused_transaction = False   # from a refused MULTI to its EXEC or DISCARD

    def admit(self, request):
        if isinstance(request, Overlong):   # read whole and dropped: it is its own answer
            return bytes(request)
        if (fault := inline_fault(request)):
            return self.refuse(fault)
        if not (items := words(request)):
            return b""
        if self.refused_transaction:
            return self.inside_refused_transaction(items)
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
            return self.framing.error("tcp-proxy: the transaction was refused at its MULTI; "
                                      "nothing in it ran", code="EXECABORT")
        return self.refuse(f"{shown(commands.name_of(items))} not sent: the transaction it is "
                           f"queued in was refused at its MULTI")

    def refuse(self, reason):
        return self.framing.error(f"tcp-proxy: {reason}")


RESP = Resp()
