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
                            end, counting the bytes it lets go (Frames drops them); with
                            overlong="pass", it hands them on (Frames gives them in pieces)
    reply_size(buffer)      the length of the first whole reply in buffer, None while
                            it has not ended, ValueError for bytes no reply starts with
    words(request)          the command and arguments of a whole request, split as
                            redis-server splits them; inline_fault(request) says when
                            redis-server would read an inline command otherwise
    Resp                    the framing object FramedProxy takes (max_reply, reply_size(),
                            reply_parser(), request_parser(), request_size(), fits(),
                            verdict(), refusal(), session(), error(); opening(), facts()
                            for a pool's own requests); RESP = Resp() is the one to use;
                            Resp(allow=...) opens what the policy refuses, Resp(password=
                            ...) asks one of the clients, Resp(upstream_password=...) says one
    RedisSession            one client's session: the table's verdict on each request, a
                            blank line answered with nothing; with a pool that keeps state
                            (FramedProxy, through part3/lending.py) what it answers itself
                            (HELLO, AUTH, SELECT, CLIENT SETNAME...), the state sync() brings
                            a connection to, a transaction pinned, a wait or a stream given a
                            connection of its own; without one, all of that refused
    PoolAnswers             what a session answers itself (HELLO, AUTH, SELECT, CLIENT ...),
                            as redis-server answers each: RedisSession's by inheritance
    Facts, decode(), array()  what the pool reads of its server; what it writes itself

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
import collections
import hmac
import re
import secrets

import part3.commands as commands
import part3.lending as lending
import tcp_proxy
from part2.pipeline import HELD, OWN, POOLED
from tcp_proxy import Head, Piece, Session

MAX_REPLY = 1 << 20     # the longest reply a pool will buffer (Redis allows 512 MB; a toy does not)
MAX_REQUEST = 1 << 20   # the longest request array it will buffer
MAX_INLINE = 64 * 1024  # the longest inline command (redis-server's own limit)
MAX_BULK = 512 << 20    # the longest request bulk string redis-server takes (proto-max-bulk-len)
MAX_COUNT = (1 << 31) - 1   # the most elements it takes in a request's array (INT_MAX)
DEDICATED_CAP = 32     # connections a pool opens for its clients' waits and streams, at once

LENGTH = re.compile(rb"-1|0|[1-9][0-9]{0,17}")   # a length or count: canonical, or -1 for null
INTEGER = re.compile(rb"-?(0|[1-9][0-9]{0,18})")
CR, LF = b"\r\n"   # as integers, what indexing a buffer gives
# A bulk string's line, the common case, read in one step.
BULK = re.compile(rb"\$(0|[1-9][0-9]{0,17})\r\n")
# The one-pass read of an array of bulk strings: its line and its first element's in one match,
# then each next element's line with the \r\n that ends the element before it.
ARRAY_HEAD = re.compile(rb"\*([1-9][0-9]{0,17})\r\n\$(0|[1-9][0-9]{0,17})\r\n")
NEXT_BULK = re.compile(rb"\r\n\$(0|[1-9][0-9]{0,17})\r\n")
STAR, DOLLAR = b"*$"   # as integers, what indexing a buffer gives
NUMBERS = {b"%d" % number: number for number in range(1024)}   # the common lengths, no int() each
# A whole one-line reply.
SIMPLE = re.compile(rb"[+-][^\r\n]*\r\n|:-?(?:0|[1-9][0-9]{0,18})\r\n|[$*]-1\r\n")
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
# A request array's first element (its name), when it holds no line end: as the key of what
# its name alone says (Resp.forwards_plainly(), Resp.fits()), its length line with it.
NAME = re.compile(rb"\*[1-9][0-9]{0,17}\r\n(\$[1-9][0-9]?\r\n[^\r\n]{1,99})\r\n")
NAMES_KEPT = 4096   # names a Resp remembers what they say: a client chooses them, so a bound
NOT_BY_NAME = (False, None)   # what Resp._named() says of a request whose name does not say
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


class Passed(tcp_proxy.Passed):
    """The end of a message too long to keep, handed on as it came (Parser(overlong="pass")):
    no bytes of its own (every byte went before it, piece by piece); what is known of the
    message, as an Overlong knows it: its size, the limit, its first bytes, a request?"""

    def __new__(cls, size, limit, head, request):
        marker = super().__new__(cls, b"")
        marker.size, marker.limit, marker.head, marker.request = size, limit, head, request
        return marker


class Parser:
    """Where one RESP message ends, found as its bytes arrive.

    size(buffer) (or calling the parser) is given the message from its first byte, as much
    as has arrived, and returns its length once it is whole, else None; it resumes where it
    stopped, so a message read in k pieces costs one parse of it, not k. Nesting needs no
    stack: an array of n adds n to the count of elements still to read, and the
    message has ended when that count reaches 0. request=True reads a request: an
    array of bulk strings, or an inline command. Raises ValueError for bytes no
    message starts with. A message of the common shapes that has come whole is read in
    one pass that keeps no place: the parser stays `fresh`, and can read the next one.

    A message longer than max_size is a ValueError too, unless overlong="drop": then the
    parser notes that it is `over` and reads on to the message's end, keeping its place but
    not its bytes: each time it stops for more, it deletes from the buffer's front (a
    bytearray, Frames' own) what it will not read again, counting it in `dropped`. Once
    the message has ended, message(kept) gives, for the bytes of it still kept, those bytes,
    or for one that was over, the Overlong error that answers it. The bound is on memory,
    not on how far a parse may go. overlong="pass" reads such a message the same way, but
    keeps each run of bytes it deletes in `passed` (Frames(passing=True) hands them on, the
    first a Head), and ends it with a Passed marker instead of the error: what a pool uses
    to pass a long value through with a window of memory.
    """

    def __init__(self, max_size, request=False, overlong="raise"):
        if overlong not in ("raise", "drop", "pass"):
            raise ValueError(f"overlong is 'raise', 'drop' or 'pass', not {overlong!r}")
        self.max_size = max_size
        self.request = request
        self.overlong = overlong
        self.inline = None       # for a request, once its first byte is in: is it inline?
        self.position = 0        # bytes of the message parsed whole so far, from the buffer's front
        self.searched = 0        # where the search for the current line's end resumes
        self.still_to_read = 1   # elements (array elements included) not yet read whole
        self.bulk_end = None     # inside a bulk string: where its bytes end
        self.lines = 0           # lines parsed, each once however the bytes came (tests read it)
        self.over = False        # the message has proved longer than max_size (overlong="drop")
        self.dropped = 0         # bytes of it deleted from the buffer's front
        self.head = None         # its first bytes, kept when the first of them are deleted
        self.fresh = True        # nothing kept yet: each message read whole in one pass keeps it so
        self.passed = []         # overlong="pass": the bytes deleted, for Frames to hand on

    def size(self, buffer):
        if self.fresh and buffer:
            if (whole := self._at_once(buffer)) is not None:
                return whole   # the common case, in one pass: the parser kept nothing, and is fresh
            self.fresh = False   # from here on the parse keeps its place in this message
        end = self._parse(buffer)
        if end is None and self.over:
            self._let_go(buffer)
        return end

    __call__ = size   # calling the parser is size(), with no call in between

    def message(self, kept):
        """The message size() found the end of, from the bytes of it still in the buffer."""
        if not self.over:
            return bytes(kept)
        head = self.head if self.head is not None else bytes(kept[:Overlong.HEAD])
        if self.overlong == "pass":   # its last bytes go the way the others went, then its end
            end = Passed(self.dropped + len(kept), self.max_size, head, self.request)
            self.passed += [(Piece if self.dropped else Head)(kept), end]
            return end
        return Overlong(self.dropped + len(kept), self.max_size, head, self.request)

    def _parse(self, buffer):
        if not buffer:   # nothing has arrived (a reader asks after every message it takes)
            return None
        if self.request and self.inline is None:
            self.inline = buffer[:1] != b"*"
        if self.inline:
            return self._inline(buffer)
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

    def ends(self, buffer):
        """Where each message at the buffer's front ends, for as many as have come whole in the
        common shapes (a list, maybe empty), each read in one pass: the first that has not is
        left to size(). Only a fresh parser reads ahead so, and it stays fresh."""
        found, start, size = [], 0, len(buffer)
        if self.fresh:
            at_once = self._at_once
            while start < size and (end := at_once(buffer, start)) is not None:
                found.append(end)
                start = end
        return found

    def _at_once(self, buffer, start=0):
        """Where a message of the common shapes that has arrived whole (a one-line reply, a bulk
        string, an array of bulk strings: every request a client library sends) ends, the
        message starting at `start`, read in one pass that changes nothing in the parser; None
        for anything else, which the step by step parse then reads, or rejects."""
        number, size, first = NUMBERS.get, len(buffer), buffer[start]
        if first == STAR and (head := ARRAY_HEAD.match(buffer, start)):
            count = number(head[1]) or int(head[1])
            if count * 3 > size - start:   # not all here (an element takes 3 bytes at least)
                return None
            end = head.end() + (number(head[2]) or int(head[2]))   # the first element's end
            match = NEXT_BULK.match
            while count > 1:
                bulk = match(buffer, end)
                if bulk is None:
                    return None
                end = bulk.end() + (number(bulk[1]) or int(bulk[1]))
                count -= 1
        elif self.request:
            return None
        elif first == DOLLAR and (bulk := BULK.match(buffer, start)):
            end = bulk.end() + (number(bulk[1]) or int(bulk[1]))
        else:
            line = SIMPLE.match(buffer, start)
            return line.end() if line and line.end() - start <= self.max_size else None
        end += 2
        if end > size or buffer[end - 2] != CR or buffer[end - 1] != LF \
                or end - start > self.max_size:
            return None   # not all here, or wrong, or too long: the step by step parse says which
        return end

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
        if self.overlong == "pass":
            self.passed.append((Piece if self.dropped else Head)(buffer[:count]))
        del buffer[:count]
        self.dropped += count
        self.position = max(self.position - count, 0)
        self.searched = max(self.searched - count, 0)
        if self.bulk_end is not None:
            self.bulk_end -= count

    def _too_long(self, message):
        """A message longer than max_size: a ValueError, or (overlong="drop" or "pass") read
        on, unkept."""
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
            shown_bytes = bytes(buffer[self.position:bare + 1][:40])
            raise ValueError(f"a RESP line ended by a bare \\n: {shown_bytes!r}")
        if end < 0 or end + 1 == len(buffer):   # not ended yet (or b"\r" is the last byte so far)
            self.searched = len(buffer) if end < 0 else end
            if not self.over and self.dropped + self.searched > self.max_size:
                self._too_long(f"a message longer than {self.max_size} bytes, and not over")
            if self.searched - self.position > self.max_size:   # one line is never dropped
                raise ValueError(f"a RESP line longer than {self.max_size} bytes, and not over")
            return None
        if buffer[end + 1] != ord(b"\n"):
            shown_bytes = bytes(buffer[self.position:end + 2][:40])
            raise ValueError(f"a \\r not followed by \\n: {shown_bytes!r}")
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
    ValueError. max_reply and max_request bound what the pool keeps of one message: the
    window a longer one is passed on through, in pieces (both pools).

    AUTH belongs to the pool: password= (and user=, "default" if not given) is what it asks
    of its clients (AUTH and HELLO ... AUTH are answered by their session; anything else
    before them, -NOAUTH); upstream_password= (and upstream_user=) is what it says itself to
    the server, on each connection it opens. A client's credentials never reach a shared
    connection. dedicated_cap bounds the connections each pool opens for its clients' own
    use (a wait, a stream) at once."""

    def __init__(self, allow=(), refuse=(), max_reply=MAX_REPLY, max_request=MAX_REQUEST,
                 password=None, user=None, upstream_password=None, upstream_user=None,
                 dedicated_cap=DEDICATED_CAP):
        self.allowed = self._names(allow, commands.POLICY, "allowed")
        self.refused = self._names(refuse, commands.FORWARD, "refused")
        self.max_reply = max_reply
        self.max_request = max_request
        self._by_name = {}   # NAME's key -> (forwarded whatever the arguments, the reply types)
        self.password = as_bytes(password)
        self.user = as_bytes(user) or b"default"
        self.upstream_password = as_bytes(upstream_password)
        self.upstream_user = as_bytes(upstream_user)
        self.dedicated_cap = dedicated_cap

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
            if kind.action != action and not (kind.policy and action == commands.POLICY):
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

    def session(self, pool=None):
        """What the pool keeps of one client between its requests (RedisSession): with a
        pool that can hold state for it (FramedProxy, ManagedProxy), the session answers,
        replays, pins and dedicates; without one, it refuses what would need it."""
        return RedisSession(self, pool)

    passes_long = True   # a message longer than a pool keeps can be passed on in pieces
    fresh_state = (2, 0, False, None)   # what a connection the pool opens carries, AUTH said:
    # (its protocol, its database, whether CLIENT NO-EVICT is on, its CLIENT SETNAME)

    def opening(self):
        """What the pool says on a connection it has just opened, before anything else: its
        own AUTH (upstream_password), or nothing."""
        if self.upstream_password is None:
            return []
        user = [self.upstream_user] if self.upstream_user else []
        return [array(b"AUTH", *user, self.upstream_password)]

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
        elif not kind and isinstance(reply, Passed):   # a long reply's end: judged by its head
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


# --- what the pool says itself, in RESP, and what it reads of the server's replies -----------

def as_bytes(text):
    return text.encode("utf-8") if isinstance(text, str) else text


def bulk(data):
    return b"$%d\r\n%s\r\n" % (len(data), data)


def array(*items):
    """A request (or a flat reply) as a client library writes one: an array of bulk strings."""
    return b"*%d\r\n" % len(items) + b"".join(bulk(as_bytes(item)) for item in items)


def null(protocol):
    return b"_\r\n" if protocol == 3 else b"$-1\r\n"


def decode(message, depth=8):
    """The value of one whole reply the pool asked for itself (HELLO, CONFIG GET): bytes, int,
    None, or a list (a map's pairs flattened, as RESP2 writes them); nested at most depth."""
    value, end = _decode(bytes(message), 0, depth)
    return value


def _decode(data, position, depth):
    end = data.index(b"\r\n", position)
    kind, line = data[position:position + 1], data[position + 1:end]
    if kind in b"+-:(,#" or kind == b"_":
        return (int(line) if kind == b":" else None if kind == b"_" else line), end + 2
    length = int(line)
    if kind in b"$=!":
        if length < 0:
            return None, end + 2
        return data[end + 2:end + 2 + length], end + 4 + length
    if depth <= 0:
        raise ValueError("a reply nested deeper than the pool reads its own")
    items, position = [], end + 2
    for _ in range(max(length, 0) * (2 if kind in b"%|" else 1)):
        item, position = _decode(data, position, depth - 1)
        items.append(item)
    if kind == b"|":   # an attribute: the reply it annotates is the value
        return _decode(data, position, depth - 1)
    return (None if length < 0 else items), position


def leading_words(head):
    """The words whole at the start of a long request's first bytes (a Head): the command,
    and as many arguments as have come whole; None if it is no RESP array."""
    if not head.startswith(b"*"):
        return None
    items, position = [], head.index(b"\r\n") + 2
    while (line_end := head.find(b"\r\n", position)) >= 0:
        start = line_end + 2
        end = start + int(head[position + 1:line_end])
        if end + 2 > len(head):
            break
        items.append(head[start:end])
        position = end + 2
    return items


class Facts(collections.namedtuple("Facts", "version mode role databases")):
    """What the pool reads of its server once (Resp.facts_requests()): its HELLO's version,
    mode and role, and CONFIG GET databases (None if the server would not say)."""

    @classmethod
    def read(cls, hello, databases):
        said = {}
        if hello[:1] in b"*%":
            pairs = decode(hello)
            said = dict(zip(pairs[::2], pairs[1::2]))
        count = decode(databases) if databases[:1] in b"*%" else []
        return cls(said.get(b"version", b"unknown"), said.get(b"mode", b"standalone"),
                   said.get(b"role", b"master"), int(count[1]) if len(count) == 2 else None)


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
NAME_BYTES = re.compile(rb"[!-~]*")   # a client name redis-server takes: no blank, no control byte
TRANSACTION_ENDS = {b"EXEC", b"DISCARD"}


def command_of(request):
    """A request's command, upper case: of a whole request, or of a long one's first bytes."""
    items = leading_words(request) if isinstance(request, Head) else words(request)
    return (items or [b""])[0].upper()


def confirmation(message):
    """(kind, count) if the message confirms a subscription change, else None: its kind in
    lower case (b"unsubscribe"), and how many subscriptions of its family the client has."""
    if not (head := CONFIRMATION.match(message)):
        return None
    end = head.end() + (int(head[2]) + 2 if head[2] is not None else 0)
    if not (count := COUNT.fullmatch(message, end)):
        return None
    return head[1].lower(), int(count[1])


class PoolAnswers:
    """The commands a Redis session answers itself (ANSWERS), as redis-server answers each,
    from what the session keeps: its protocol, database, name, credentials (RedisSession's
    fields; the lender gives the server's facts and the client's id)."""

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
        self.authenticated = self.authenticated or right
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
        arity = {b"SETNAME": 3, b"GETNAME": 2, b"ID": 2, b"SETINFO": 4}[subcommand]
        if len(items) != arity:
            return self.framing.error(f"wrong number of arguments for 'client|"
                                      f"{shown(subcommand.lower())}' command")
        if subcommand == b"ID":
            return b":%d\r\n" % self.id
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
        self.quitting = True
        self.multi = self.watching = self.streams = False   # what it held is let go, never lent
        return b"+OK\r\n"

    def reset_command(self, items):
        self.refused_transaction = False
        self.reset()
        return b"+RESET\r\n"

    def unsubscribe(self, items):
        """(P|S)UNSUBSCRIBE with nothing subscribed, as redis-server answers it: one confirmation
        per channel named (or one, its channel null), each with a count of 0."""
        kind = items[0].lower()
        opening = b">3\r\n" if self.protocol == 3 else b"*3\r\n"
        named = [bulk(channel) for channel in items[1:]] or [null(self.protocol)]
        return b"".join(opening + bulk(kind) + channel + b":0\r\n" for channel in named)


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

    def __init__(self, framing, pool=None):
        super().__init__(framing, pool)
        self.refused_transaction = False   # from a refused MULTI to its EXEC or DISCARD
        self.refused_why = "was refused at its MULTI"
        self.lender = lending.lender_of(pool) if pool else None   # does what the session says
        self.id = self.lender.next_id() if pool else 0
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
            self.lease = HELD if self.multi or self.watching else POOLED
            self.wait, self.settles = None, False
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
        if self.pool is None:
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
        if action == commands.PIN:   # its reply begins or ends the hold: the next waits for it
            self.lease, self.settles = HELD, True
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

    # --- the pool drives these (tcp_proxy.Session)

    def serve(self, client, request, requests):
        self.lender.serve(self, client, request, requests)

    def close(self):
        self.lender.close(self)

    def sync(self, state):
        """What brings a connection carrying `state` (None: just opened) to this client's."""
        return self.framing.sync(state, self.state)

    def synced(self, request, reply):
        return self.framing.synced(request, reply)

    def fits(self, request, reply):
        """The fit of a reply the pool's parser framed (or of a long one's first bytes): the
        framing's, by its type, and more: inside MULTI, +QUEUED or an error (EXEC and DISCARD
        aside); a connection that speaks RESP2 sends none of RESP3's types."""
        if isinstance(reply, tcp_proxy.Passed):   # a long reply passed on: its first bytes
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

WRONGPASS = b"-WRONGPASS invalid username-password pair or user is disabled.\r\n"
NOAUTH = b"-NOAUTH Authentication required.\r\n"
NAME_REFUSED = b"-ERR Client names cannot contain spaces, newlines or special characters.\r\n"
ANSWERS = {   # the commands the pool answers itself, from what the session keeps
    b"HELLO": RedisSession.hello, b"AUTH": RedisSession.auth, b"SELECT": RedisSession.select,
    b"CLIENT SETNAME": RedisSession.client, b"CLIENT GETNAME": RedisSession.client,
    b"CLIENT ID": RedisSession.client, b"CLIENT SETINFO": RedisSession.client,
    b"CLIENT NO-EVICT": RedisSession.no_evict_command, b"CLIENT REPLY": RedisSession.reply_command,
    b"QUIT": RedisSession.quit, b"RESET": RedisSession.reset_command,
    b"UNSUBSCRIBE": RedisSession.unsubscribe, b"PUNSUBSCRIBE": RedisSession.unsubscribe,
    b"SUNSUBSCRIBE": RedisSession.unsubscribe,
}


RESP = Resp()
