"""resp: where a Redis reply ends and where a Redis request ends, so a pool can stand
between real Redis clients and a redis-server (RESP2).

The pool's checkin is a parse; for Redis the parse is RESP's, not a newline's.
A GET of a stored value is answered `$5\\r\\nhello\\r\\n`: two lines, one reply.
A pool that stops at the first b"\\n" lends the connection with `hello\\r\\n` still
on it, and the next borrower reads A's value as its own (CVE-2023-28858 was
that class of bug in redis-py's asyncio client).

A pool must parse both directions. A request it did not read whole is a request
it cannot vouch for: redis-server reads `*1\\r\\r$4\\r\\rPING\\r\\r*4...` as two
commands, and a pool that took it for one line would lend the connection while the
second still runs. And what a pool may lend depends on what state the protocol lets
a connection carry: after MULTI, SELECT or SUBSCRIBE the connection is no longer
interchangeable with its neighbours, so those commands are refused (UNSHAREABLE).

Map of the module:

    Parser                  where one message ends, found as its bytes arrive: it keeps
                            its place between calls, so a reply read in many recv()s
                            is parsed once (linear), and it needs no stack
    reply_size(buffer)      the length of the first whole reply in buffer, None while
                            it has not ended, ValueError for bytes no reply starts with
    words(request)          the command and arguments of a whole request
    UNSHAREABLE             the commands a pool cannot lend a connection for, each with
                            the rule it breaks; refusal(request) reads it
    Resp                    the framing object FramedProxy takes (max_reply, reply_size(),
                            reply_parser(), request_parser(), request_size(), fits(),
                            refusal(), session(), error()); RESP = Resp() is the one to use

The five RESP2 types, each opening with one type byte and a line ended by b"\\r\\n":
    +OK            simple string      -ERR ...     error         :42      integer
    $5 hello       bulk string: the line gives the length, then that many bytes and
                   b"\\r\\n"; $-1 is the null bulk string (GET of a missing key)
    *2 ...         array: the line gives the count, then that many replies of any
                   type, arrays included; *-1 is the null array
A request is an array of bulk strings (`*2\\r\\n$3\\r\\nGET\\r\\n$1\\r\\na\\r\\n`, what every
client library sends), or an inline command (`GET a\\r\\n`, what a person types), as
redis-server reads them. A b"\\r" that is not followed by b"\\n" ends no line here:
it makes the message malformed.
"""
import re

from tcp_proxy import Session

MAX_REPLY = 1 << 20     # the longest reply a pool will buffer (Redis allows 512 MB; a toy does not)
MAX_REQUEST = 1 << 20   # the longest request array it will buffer
MAX_INLINE = 64 * 1024  # the longest inline command (redis-server's own limit)

LENGTH = re.compile(rb"-1|0|[1-9][0-9]{0,17}")   # a length or count: canonical, or -1 for null
INTEGER = re.compile(rb"-?(0|[1-9][0-9]{0,18})")
CR, LF = b"\r\n"   # as integers, what indexing a buffer gives
BULK = re.compile(rb"\$(0|[1-9][0-9]{0,17})\r\n")   # a bulk string's line, the common case, read in one step
ARRAY = re.compile(rb"\*([1-9][0-9]{0,17})\r\n")     # an array's line, when it holds something
SIMPLE = re.compile(rb"[+-][^\r\n]*\r\n|:-?(?:0|[1-9][0-9]{0,18})\r\n|[$*]-1\r\n")   # a whole one-line reply
INLINE_SPACE = re.compile(rb"[ \t\v\f]+")   # what separates an inline command's words


class Parser:
    """Where one RESP message ends, found as its bytes arrive.

    size(buffer) is given the message from its first byte, as much as has arrived,
    and returns its length once it is whole, else None; it resumes where it stopped,
    so a message read in k pieces costs one parse of it, not k. Nesting needs no
    stack: an array of n adds n to the count of elements still to read, and the
    message has ended when that count reaches 0. request=True reads a request: an
    array of bulk strings, or an inline command. Raises ValueError for bytes no
    message starts with.
    """

    def __init__(self, max_size, request=False):
        self.max_size = max_size
        self.request = request
        self.position = 0        # bytes of the message parsed whole so far
        self.searched = 0        # where the search for the current line's end resumes
        self.still_to_read = 1   # elements (array elements included) not yet read whole
        self.bulk_end = None     # inside a bulk string: where its bytes end
        self.lines = 0           # lines parsed, each once however the bytes came (the tests read it)

    def size(self, buffer):
        if not buffer:   # nothing has arrived (a reader asks after every message it takes)
            return None
        if self.request and self.position == 0 and buffer[:1] != b"*":
            return self._inline(buffer)
        if not self.searched and (whole := self._at_once(buffer)):   # the common case, in one step
            return whole
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

    def _whole_bulk_strings(self, buffer):
        """Read the whole bulk strings that come next in one tight loop (a long array of them
        is the common long reply); True if there was one. Anything else is left to the rest."""
        position, still, usable = self.position, self.still_to_read, min(len(buffer), self.max_size)
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
            if self.searched > self.max_size:
                raise ValueError(f"a message longer than {self.max_size} bytes, and not over")
            return None
        if buffer[end + 1] != ord(b"\n"):
            raise ValueError(f"a \\r not followed by \\n: {bytes(buffer[self.position:end + 2][:40])!r}")
        line = bytes(buffer[self.position:end])
        self.position = self.searched = end + 2
        self.lines += 1
        return line

    def _element(self, kind, line):
        """Account for one element's line: its type byte and the rest of its line."""
        self.still_to_read -= 1
        if self.request and kind != (b"*" if self.lines == 1 else b"$"):
            raise ValueError(f"a request array holds bulk strings only, not {kind + line[:40]!r}")
        if kind in (b"+", b"-"):
            return
        if kind == b":":
            if not INTEGER.fullmatch(line):
                raise ValueError(f"not a RESP integer: {line[:40]!r}")
            return
        if kind not in (b"$", b"*"):
            raise ValueError(f"no RESP message starts with {kind!r} (line {kind + line[:40]!r})")
        if not LENGTH.fullmatch(line) or (self.request and kind == b"$" and line == b"-1"):
            raise ValueError(f"not a RESP length: {kind + line[:40]!r}")
        length = int(line)
        if length * (1 if kind == b"$" else 3) > self.max_size:   # an element takes 3 bytes at least
            raise ValueError(f"a message longer than {self.max_size} bytes: {kind + line!r}")
        if kind == b"*":
            self.still_to_read += max(length, 0)   # *-1, the null array, holds nothing
        elif length >= 0:
            self.bulk_end = self.position + length
            if self.bulk_end + 2 > self.max_size:   # the whole message is bounded, not only each part
                raise ValueError(f"a message longer than {self.max_size} bytes: {kind + line!r}")

    def _inline(self, buffer):
        """An inline command: one line, ended by b"\\n" or b"\\r\\n", with no other b"\\r" in it."""
        end = buffer.find(b"\n", self.searched)
        if end < 0:
            self.searched = len(buffer)
            if len(buffer) > MAX_INLINE:
                raise ValueError(f"an inline command longer than {MAX_INLINE} bytes")
            return None
        if b"\r" in buffer[:end].removesuffix(b"\r"):
            raise ValueError(f"a \\r not followed by \\n: {bytes(buffer[:end + 1][:40])!r}")
        self.lines += 1
        return end + 1


def reply_size(buffer, max_reply=MAX_REPLY):
    """The length of the first whole RESP reply at the start of buffer, or None while
    it has not ended. Raises ValueError for bytes no valid reply starts with."""
    return Parser(max_reply).size(buffer)


def words(request):
    """The command and arguments of one whole request (as Parser(request=True) framed it)."""
    if not request.startswith(b"*"):   # inline: words apart, as redis-server splits them
        return INLINE_SPACE.split(request.removesuffix(b"\n").removesuffix(b"\r").strip(b" \t\v\f"))
    items, position = [], request.index(b"\r\n") + 2
    while position < len(request):   # each element: $<length>\r\n<bytes>\r\n
        line_end = request.index(b"\r\n", position)
        start = line_end + 2
        end = start + int(request[position + 1:line_end])
        items.append(request[start:end])
        position = end + 2
    return items


# What a pool cannot lend a connection for, and why: each of these leaves the connection
# different from its neighbours (state), or keeps it busy past one reply (held), so the
# next borrower would inherit it. A pool that shares connections refuses them, as
# twemproxy and PgBouncer's transaction mode do; a client that needs them needs a
# connection of its own (PassthroughProxy, or Redis directly).
TRANSACTION = "changes the connection's state (a transaction is queued on it)"
SUBSCRIBED = "turns the connection into a stream of pushes no request asked for"
SESSION = "changes the connection's state"
BLOCKS = "holds the connection for as long as it waits"
CLOSES = "closes the connection"
UNSHAREABLE = {
    b"MULTI": TRANSACTION, b"EXEC": TRANSACTION, b"DISCARD": TRANSACTION,
    b"WATCH": TRANSACTION, b"UNWATCH": TRANSACTION,
    b"SUBSCRIBE": SUBSCRIBED, b"PSUBSCRIBE": SUBSCRIBED, b"SSUBSCRIBE": SUBSCRIBED,
    b"UNSUBSCRIBE": SUBSCRIBED, b"PUNSUBSCRIBE": SUBSCRIBED, b"SUNSUBSCRIBE": SUBSCRIBED,
    b"MONITOR": SUBSCRIBED,
    b"SELECT": SESSION, b"AUTH": SESSION, b"HELLO": SESSION, b"RESET": SESSION,
    b"READONLY": SESSION, b"READWRITE": SESSION,
    b"CLIENT SETNAME": SESSION, b"CLIENT SETINFO": SESSION, b"CLIENT REPLY": SESSION,
    b"CLIENT TRACKING": SESSION, b"CLIENT CACHING": SESSION, b"CLIENT NO-EVICT": SESSION,
    b"CLIENT NO-TOUCH": SESSION,
    b"BLPOP": BLOCKS, b"BRPOP": BLOCKS, b"BRPOPLPUSH": BLOCKS, b"BLMOVE": BLOCKS, b"BLMPOP": BLOCKS,
    b"BZPOPMIN": BLOCKS, b"BZPOPMAX": BLOCKS, b"BZMPOP": BLOCKS, b"WAIT": BLOCKS, b"WAITAOF": BLOCKS,
    b"XREAD BLOCK": BLOCKS, b"XREADGROUP BLOCK": BLOCKS,   # only with a BLOCK argument
    b"QUIT": CLOSES,
}


def refusal(request):
    """Why a pool cannot pass this whole request on, or None if it can."""
    items = words(request)
    if not items or items == [b""]:
        return "an empty request"
    if not request.startswith(b"*") and re.search(rb"[\"']", request):   # redis-server unquotes them
        return "an inline command with quotes (send it as a RESP array)"
    command = items[0].upper()
    named = [command, command + b" " + (items[1].upper() if len(items) > 1 else b"")]
    if command in (b"XREAD", b"XREADGROUP"):   # options come before STREAMS; a key may be named block
        upper = [item.upper() for item in items]
        options = upper[:upper.index(b"STREAMS")] if b"STREAMS" in upper else upper
        if b"BLOCK" in options:
            named.append(command + b" BLOCK")
    for name in named:
        if name in UNSHAREABLE:
            return f"{name.decode('ascii', 'replace')} {UNSHAREABLE[name]}; a pool cannot lend it"
    return None


# What a reply to each command can be, by its type byte; an error (-) answers anything.
# A command not listed here may be answered by any type.
REPLY_TYPES = {
    b"GET": b"$", b"SET": b"+$", b"PING": b"+$", b"ECHO": b"$",
    b"INCR": b":", b"DECR": b":", b"DEL": b":", b"EXISTS": b":",
    b"MGET": b"*", b"LRANGE": b"*", b"KEYS": b"*", b"CLIENT": b"+:$*",
}


class Resp:
    """The RESP framing: the interface FramedProxy(framing=...) drives."""

    max_reply = MAX_REPLY
    max_request = MAX_REQUEST

    def reply_size(self, buffer):
        """Length of the first whole reply at the start of buffer, or None while it has not ended."""
        return reply_size(buffer, self.max_reply)

    def reply_parser(self):
        """A fresh parser's size(): called on one reply as it grows, it keeps its place."""
        return Parser(self.max_reply).size

    def request_parser(self):
        """The same for one request: an array of bulk strings, or an inline command."""
        return Parser(self.max_request, request=True).size

    def request_size(self, buffer):
        """Length of the first whole request at the start of buffer, or None while it has
        not ended; ValueError for a malformed one (nothing after it can be framed)."""
        return self.request_parser()(buffer)

    def refusal(self, request):
        """Why this request may not reach a pooled connection (a message), or None."""
        return refusal(request)

    def session(self):
        """What the pool keeps of one client between its requests (tcp_proxy.Session)."""
        return Session(self)

    def error(self, message):
        """An error reply in RESP's own form: one line, so no line break survives in it."""
        return b"-ERR %s\r\n" % re.sub(r"[\r\n]", " ", message).encode("utf-8", "replace")

    def fits(self, request, reply):
        """True if `reply` is one whole RESP reply of a type that can answer `request`
        (a whole request: an array, or an inline command with its line end)."""
        try:
            if reply_size(reply, self.max_reply) != len(reply):
                return False
            command = (words(request) or [b""])[0].upper()
        except ValueError:
            return False
        expected = REPLY_TYPES.get(command)
        return reply[:1] == b"-" or expected is None or reply[:1] in expected

    def __repr__(self):
        return "resp.RESP"


RESP = Resp()
