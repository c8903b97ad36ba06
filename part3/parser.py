"""parser: where one RESP message ends, found as its bytes arrive, so a pool can stand between
real Redis clients and a redis-server (RESP2, and RESP3's replies). A part of the framing,
part3/resp.py, which a pool drives; this is only its parse.

The pool's checkin is a parse; for Redis the parse is RESP's, not a newline's.
A GET of a stored value is answered `$5\\r\\nhello\\r\\n`: two lines, one reply.
A pool that stops at the first b"\\n" lends the connection with `hello\\r\\n` still
on it, and the next borrower reads A's value as its own (CVE-2023-28858 was
that class of bug in redis-py's asyncio client).

    Parser                  where one message ends, found as its bytes arrive: it keeps
                            its place between calls, so a reply read in many recv()s
                            is parsed once (linear), and it needs no stack; made with
                            overlong="drop", it reads a message too long to keep to its
                            end, counting the bytes it lets go (Frames drops them); with
                            overlong="pass", it hands them on (Frames gives them in pieces)
    Overlong, PassedEnd     what such a message becomes: the error that answers it, or
                            the marker of its end
    reply_size(buffer)      the length of the first whole reply in buffer, None while
                            it has not ended, ValueError for bytes no reply starts with

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

from ground import frames
from ground.frames import Head, Piece

MAX_REPLY = 1 << 20     # the longest reply a pool will buffer (Redis allows 512 MB; a toy does not)
MAX_REQUEST = 1 << 20   # the longest request array it will buffer
MAX_INLINE = 64 * 1024  # the longest inline command (redis-server's own limit)
MAX_BULK = 512 << 20    # the longest request bulk string redis-server takes (proto-max-bulk-len)
MAX_COUNT = (1 << 31) - 1   # the most elements it takes in a request's array (INT_MAX)
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


class PassedEnd(frames.Passed):
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
    first a Head), and ends it with a PassedEnd marker instead of the error: what a pool uses
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
            end = PassedEnd(self.dropped + len(kept), self.max_size, head, self.request)
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
        if self.dropped + (len(buffer) if end < 0 else end) > MAX_INLINE:   # refused at once,
            raise ValueError(f"an inline command longer than {MAX_INLINE} bytes")   # as redis does
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
