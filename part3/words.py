"""words: what the pool reads of a whole request (its command and arguments, as redis-server
splits them) and what it writes in RESP itself (its own requests, its own answers), and what it
reads of the replies to its own requests. A part of the framing, part3/resp.py.

    words(request), leading_words(head)   a request's words; those whole at a long one's start
    inline_fault(request)   when redis-server would read an inline command otherwise
    command_of(request)     its command, upper case; shown(name), how an error quotes it
    array(), bulk(), null() what the pool writes; decode(), Facts what it reads of its server
"""
import collections
import re

from ground.frames import Head

# An inline command's word as redis-server's sdssplitargs() (src/sds.c) reads one, quotes
# aside: blanks (isspace()) are skipped before a word, and a word ends at a space, a tab, a
# line end or a NUL, so a \v or \f inside one is part of it.
INLINE_WORD = re.compile(rb"[^ \t\n\r\x00\v\f][^ \t\n\r\x00]*")


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


def command_of(request):
    """A request's command, upper case: of a whole request, or of a long one's first bytes."""
    items = leading_words(request) if isinstance(request, Head) else words(request)
    return (items or [b""])[0].upper()


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
