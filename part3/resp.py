"""resp: where a Redis reply ends, so a pool can frame Redis replies (RESP2).

The pool's checkin is a parse; for Redis the parse is RESP's, not a newline's.
A GET of a stored value is answered `$5\\r\\nhello\\r\\n`: two lines, one reply.
A pool that stops at the first b"\\n" lends the connection with `hello\\r\\n` still
on it, and the next borrower reads A's value as its own (CVE-2023-28858 was
that class of bug in redis-py's asyncio client).

Map of the module:

    reply_size(buffer, max_reply)   the length of the first whole reply in buffer,
                                    None while it has not ended, ValueError for
                                    bytes that can never start a valid reply
    Resp                            the framing object FramedProxy takes (max_reply,
                                    reply_size(), fits()); RESP = Resp() is the one to use

The five RESP2 types, each opening with one type byte and a line ended by b"\\r\\n":
    +OK            simple string      -ERR ...     error         :42      integer
    $5 hello       bulk string: the line gives the length, then that many bytes and
                   b"\\r\\n"; $-1 is the null bulk string (GET of a missing key)
    *2 ...         array: the line gives the count, then that many replies of any
                   type, arrays included; *-1 is the null array

Requests need no parser here: the clients speak Redis inline commands
(`GET k\\r\\n`), which redis-server reads as lines.
"""
import re

MAX_REPLY = 1 << 20   # the longest reply a pool will buffer (Redis allows 512 MB; a toy does not)

LENGTH = re.compile(rb"-1|0|[1-9][0-9]{0,17}")   # a length or count: canonical, or -1 for null
INTEGER = re.compile(rb"-?(0|[1-9][0-9]{0,18})")


def reply_size(buffer, max_reply=MAX_REPLY):
    """The length of the first whole RESP reply at the start of buffer, or None while
    it has not ended. Raises ValueError for bytes no valid reply starts with.

    Nesting needs no stack: an array of n adds n to the count of replies still to
    read, and the first reply has ended when that count reaches 0.
    """
    position = 0
    still_to_read = 1   # replies (array elements included) not yet read whole
    while still_to_read:
        line_end = buffer.find(b"\r\n", position)
        if line_end < 0:
            if b"\n" in buffer[position:]:   # a bare b"\n": no RESP line ends that way
                raise ValueError(f"a RESP line ended by a bare \\n: {bytes(buffer[position:position + 40])!r}")
            return None   # the type byte's line has not ended yet
        kind, line = buffer[position:position + 1], bytes(buffer[position + 1:line_end])
        position = line_end + 2
        still_to_read -= 1
        if kind in (b"+", b"-"):
            if b"\n" in line or b"\r" in line:
                raise ValueError(f"a simple string or error with a line break in it: {line[:40]!r}")
        elif kind == b":":
            if not INTEGER.fullmatch(line):
                raise ValueError(f"not a RESP integer: {line[:40]!r}")
        elif kind in (b"$", b"*"):
            if not LENGTH.fullmatch(line):
                raise ValueError(f"not a RESP length: {kind + line[:40]!r}")
            length = int(line)
            if length * (1 if kind == b"$" else 3) > max_reply:   # an element takes 3 bytes at least
                raise ValueError(f"a reply longer than {max_reply} bytes: {kind + line!r}")
            if kind == b"*":
                still_to_read += max(length, 0)   # *-1, the null array, holds nothing
            elif length >= 0:
                data_end = position + length
                if len(buffer) < data_end + 2:
                    return None   # the bulk string's bytes have not all arrived
                if buffer[data_end:data_end + 2] != b"\r\n":
                    raise ValueError(f"a bulk string of {length} bytes not followed by \\r\\n")
                position = data_end + 2
        else:
            raise ValueError(f"no RESP reply starts with {kind!r} (line {kind + line[:40]!r})")
    return position


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

    def reply_size(self, buffer):
        """Length of the first whole reply at the start of buffer, or None while it has not ended."""
        return reply_size(buffer, self.max_reply)

    def fits(self, request, reply):
        """True if `reply` is one whole RESP reply of a type that can answer `request`
        (an inline command with its line end, e.g. b"GET k\\r\\n")."""
        try:
            if reply_size(reply, self.max_reply) != len(reply):
                return False
        except ValueError:
            return False
        command = request.split(None, 1)[0].upper() if request.split() else b""
        expected = REPLY_TYPES.get(command)
        return reply[:1] == b"-" or expected is None or reply[:1] in expected

    def __repr__(self):
        return "resp.RESP"


RESP = Resp()
