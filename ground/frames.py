"""ground.frames: the one framing loop of the house, and the kinds of message it gives. A reader
of Part one need not open it, except where COMMENTARY.md sends them: FramedProxy asks it for
each whole request and reply, with its framing's parser, as every reader in the house does.

    Frames                bytes in as they arrive, whole messages out; no socket
    Piece, Head, Passed   the pieces of a message too long to keep, as a passing parser lets
                          go of them: its first piece, the rest, and its end
    LineEnd               where one line ends, as a parser Frames can use; MAX_LINE its bound,
                          LineTooLong what passing it raises
    passing_frames()      Frames over a framing's parser, passing long messages if it can
    rest_of()             a long message's pieces after its Head, from what Frames took
"""
import collections

MAX_LINE = 64 * 1024     # the longest line anyone here will buffer


class LineTooLong(ValueError):
    """A peer sent more than MAX_LINE bytes without a b"\\n"."""


class Piece(bytes):
    """Bytes of a message too long to keep, as a passing parser lets go of them (Frames)."""


class Head(Piece):
    """A long message's first piece: what a pool judges it by (its command, its reply type)."""


class Passed(bytes):
    """The end of a message handed on in pieces: no bytes of its own (they went before it);
    a framing's own kind says more (part3/parser.py's Passed: its size and first bytes)."""


class Frames:
    """The one framing loop of the house: bytes in as they arrive, whole messages out.

    feed(data) adds what a read gave; take() returns the next whole message, or None
    while it has not ended; take_all() every whole message now in, and the error that
    stopped it, if one did; rest() is what was read past the messages taken. The
    parser (new_parser() makes one: a size(buffer) that keeps its place) reads each
    byte once, however the reads cut the message. No socket: Part one's threads feed
    it from recv(), Part two's event loop from its turn. A parser with a message()
    makes the message from the bytes kept of it: part3/parser.py's Parser(overlong="drop") reads one
    too long to keep to its end, deleting from the buffer what it will not read again,
    and gives the error that answers it, so the bytes kept stay bounded. A parser that
    is `fresh` (it reads a message whole in one pass, keeping nothing) has ends(buffer),
    which reads ahead: take_all() cuts every message it found whole with one copy, and
    keeps the parser for the next read; a new one is made after a message take() read.
    One made to pass a long message on (overlong="pass") keeps what it lets go of in
    `passed`: take() gives it piece by piece, a Head, a Piece for each read of it, then a
    Passed at its end (take_all() is for parsers that keep or drop, not pass).
    """

    def __init__(self, new_parser, data=b""):
        self._new_parser, self._parser = new_parser, new_parser()
        self.unread = bytearray(data)   # read, not yet part of a message taken
        self.pieces = collections.deque()   # a long message's pieces, not yet taken

    def feed(self, data):
        self.unread += data

    def take(self):
        """The next whole message (or a piece of a long one), or None; ValueError (the
        parser's) for bytes no message is."""
        if self.pieces:
            return self.pieces.popleft()
        unread, parser, message = self.unread, self._parser, None
        if unread and (size := parser(unread)) is not None:   # a parser says nothing of b""
            message = getattr(parser, "message", bytes)(unread[:size])
            del unread[:size]   # from the front of a bytearray: no copy of the rest
            self._parser = self._new_parser()
        if passed := getattr(parser, "passed", None):   # a long message's pieces, its end last
            self.pieces.extend(passed)
            passed.clear()
            return self.pieces.popleft()
        return message

    def take_all(self):
        """(every whole message now in, in order; the ValueError the parser raised at the
        first bytes no message is, or None). Those bytes stay unread."""
        unread, parser, messages = self.unread, self._parser, []
        if getattr(parser, "fresh", False) and (ends := parser.ends(unread)):
            last, start = ends[-1], 0
            taken = bytes(unread if last == len(unread) else unread[:last])   # one copy for all
            del unread[:last]
            for end in ends:
                messages.append(taken[start:end])
                start = end
        try:
            while unread and (message := self.take()) is not None:   # the rest, step by step
                messages.append(message)
        except ValueError as error:
            return messages, error
        return messages, None

    def rest(self):
        return bytes(self.unread)

    def pieces_left(self):
        """A long message's last pieces, which take_all() took from the bytes but did not
        give (it stops once they are all read)."""
        pieces = list(self.pieces)
        self.pieces.clear()
        return pieces

    def midway(self):
        """True while a message has begun and not ended: bytes of it are kept, or a passing
        parser has let some go (a long one's pieces) and its end has not come."""
        return bool(self.unread) or getattr(self._parser, "dropped", 0) > 0


class LineEnd:
    """Where one line ends, as a parser Frames can use: it searches only bytes it has
    not seen. strict=True reads a request: a b"\\r" not at the line's end, or
    MAX_LINE bytes with no end, is a ValueError (LineTooLong for the second)."""

    def __init__(self, strict=False):
        self.strict = strict
        self.searched = 0      # bytes known to hold no b"\n"
        self.carriage = -1     # where the line's first b"\r" stands, once one has

    def size(self, buffer):
        end = buffer.find(b"\n", self.searched)
        if self.strict:
            self._check(buffer, len(buffer) if end < 0 else end)
        if end < 0:
            self.searched = len(buffer)
            return None
        return end + 1

    def _check(self, buffer, stop):
        if stop > MAX_LINE and stop == len(buffer):
            raise LineTooLong(f"line longer than {MAX_LINE} bytes")
        if self.carriage < 0:
            self.carriage = buffer.find(b"\r", self.searched, stop)
        if self.carriage >= 0 and buffer.count(b"\r", self.carriage, stop) < stop - self.carriage:
            # a b"\r" with more after it: not a line end, and not a byte to pass on
            raise ValueError(f"a \\r not followed by \\n: {bytes(buffer[:40])!r}")


def rest_of(messages):
    """The pieces of a long message after its Head, from an iterator of what Frames took, as
    they arrive, up to its end (a Passed)."""
    for piece in messages:
        yield piece
        if isinstance(piece, Passed):
            return


def passing_frames(framing, new_parser):
    """Frames over a framing's parser that pass a long message on in pieces, if the framing
    can (RESP's: passes_long), else keep each message whole."""
    if getattr(framing, "passes_long", False):
        return Frames(lambda: new_parser(passing=True))
    return Frames(new_parser)
