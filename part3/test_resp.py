"""resp.py: RESP replies framed whole, however the bytes are cut, at any depth; and the
real redis-server that demo.py --part3 runs them against."""
import itertools
import os
import pathlib
import socket
import subprocess
import sys
import types

import pytest
from hypothesis import given, settings, strategies as st

from conftest import ROOT, need_redis
from part3 import redis_server
from scaffolding import kit
from part3.parser import MAX_BULK, Overlong, Parser, PassedEnd, reply_size
from part3.resp import RESP
from ground.frames import Frames, Head, Piece
from ground.server import Server
from tcp_proxy import LINES, read_lines
from part3.framed import SessionProxy

EXAMPLES = int(os.environ.get("SOAK", "40"))   # `make soak` raises it; the suite stays fast

# --- an encoder, for the tests only ---------------------------------------------------------

simple_text = st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=["Cs"]),
                      max_size=12)
scalars = st.one_of(
    simple_text.map(lambda text: b"+" + text.encode() + b"\r\n"),
    simple_text.map(lambda text: b"-ERR " + text.encode() + b"\r\n"),
    st.integers(-2**63, 2**63 - 1).map(lambda number: b":%d\r\n" % number),
    # \r\n inside too
    st.binary(max_size=40).map(lambda data: b"$%d\r\n%s\r\n" % (len(data), data)),
    st.just(b"$-1\r\n"),
    st.just(b"*-1\r\n"),
)
replies = st.recursive(scalars, lambda elements: st.lists(elements, max_size=4).map(
    lambda items: b"*%d\r\n" % len(items) + b"".join(items)), max_leaves=20)

# RESP3's types besides: a null, a boolean, a double, a big number, a verbatim string, a blob
# error; then aggregates: an array, a set or a push of n, a map or an attribute of n pairs
# (an attribute followed by the reply it annotates: one message)
resp3_scalars = st.one_of(
    scalars,
    st.just(b"_\r\n"),
    st.sampled_from([b"#t\r\n", b"#f\r\n", b",inf\r\n", b",-inf\r\n", b",nan\r\n"]),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda number: b",%r\r\n" % number),
    st.integers(-2**90, 2**90).map(lambda number: b"(%d\r\n" % number),   # within a line bound
    st.binary(max_size=20).map(lambda data: b"=%d\r\ntxt:%s\r\n" % (len(data) + 4, data)),
    st.binary(max_size=20).map(lambda data: b"!%d\r\n%s\r\n" % (len(data), data)),
)


def resp3_aggregate(elements):
    listed = st.tuples(st.sampled_from(b"*~>"), st.lists(elements, max_size=4)).map(
        lambda made: b"%c%d\r\n" % (made[0], len(made[1])) + b"".join(made[1]))
    pairs = st.tuples(st.sampled_from(b"%|"), st.lists(st.tuples(elements, elements), max_size=3),
                      elements).map(
        lambda made: b"%c%d\r\n" % (made[0], len(made[1])) + b"".join(map(b"".join, made[1])) +
        (made[2] if made[0] == ord("|") else b""))
    return st.one_of(listed, pairs)


resp3_replies = st.recursive(resp3_scalars, resp3_aggregate, max_leaves=20)


def frame_stream(chunks):
    """What a pool does: buffer the chunks as they come and cut a reply off whenever
    reply_size() says one has ended. Returns the replies and the bytes left over."""
    framed, buffer = [], b""
    for chunk in chunks:
        buffer += chunk
        while (size := reply_size(buffer)) is not None:
            framed.append(buffer[:size])
            buffer = buffer[size:]
    return framed, buffer


def frame_stream_keeping_place(chunks):
    """The same as the pool does it: one parser per reply, fed the buffer as it grows."""
    framed, buffer, size = [], bytearray(), RESP.reply_parser()
    for chunk in chunks:
        buffer += chunk
        while (end := size(buffer)) is not None:
            framed.append(bytes(buffer[:end]))
            del buffer[:end]
            size = RESP.reply_parser()
    return framed, bytes(buffer)


def cut(data, points):
    points = sorted({point % (len(data) + 1) for point in points})
    edges = [0] + points + [len(data)]
    return [data[start:end] for start, end in zip(edges, edges[1:])]


# --- the properties ---------------------------------------------------------------------

@settings(max_examples=EXAMPLES, deadline=None)
@given(sent=st.lists(replies, min_size=1, max_size=5),
       points=st.lists(st.integers(0, 10**6), max_size=12))
def test_any_replies_cut_anywhere_are_framed_back_exactly_as_sent(sent, points):
    framed, left = frame_stream(cut(b"".join(sent), points))
    assert framed == sent and left == b""


@settings(max_examples=EXAMPLES, deadline=None)
@given(sent=st.lists(replies, min_size=1, max_size=5),
       points=st.lists(st.integers(0, 10**6), max_size=12))
def test_a_parser_that_keeps_its_place_frames_any_replies_cut_anywhere_as_sent(sent, points):
    framed, left = frame_stream_keeping_place(cut(b"".join(sent), points))
    assert framed == sent and left == b""


def frame_stream_while_fresh(chunks, new_parser):
    """One parser for as long as it is fresh (it read each message in one pass), a new one
    only after a message it read step by step. Returns the messages and the parsers made."""
    framed, buffer, parser, made = [], bytearray(), new_parser(), 1
    for chunk in chunks:
        buffer += chunk
        while (end := parser(buffer)) is not None:
            framed.append(parser.message(buffer[:end]))
            del buffer[:end]
            if not parser.fresh:
                parser, made = new_parser(), made + 1
    return framed, made


@settings(max_examples=EXAMPLES, deadline=None)
@given(sent=st.lists(replies, min_size=1, max_size=5),
       points=st.lists(st.integers(0, 10**6), max_size=12))
def test_a_parser_that_read_a_message_in_one_pass_kept_nothing_and_reads_the_next(sent, points):
    framed, _ = frame_stream_while_fresh(cut(b"".join(sent), points), RESP.reply_parser)
    assert framed == sent


def test_a_parser_is_fresh_after_a_whole_common_reply_and_request_and_not_after_pieces():
    get, put = b"*2\r\n$3\r\nGET\r\n$1\r\na\r\n", b"*3\r\n$3\r\nSET\r\n$1\r\na\r\n$2\r\n\r\n\r\n"
    assert frame_stream_while_fresh([get + put], RESP.request_parser) == ([get, put], 1)
    assert frame_stream_while_fresh([b"$5\r\nhello\r\n+OK\r\n:1\r\n*1\r\n$0\r\n\r\n"],
                                    RESP.reply_parser)[1] == 1
    assert frame_stream_while_fresh([b"$5\r\nhel", b"lo\r\n+OK\r\n"], RESP.reply_parser) == (
        [b"$5\r\nhello\r\n", b"+OK\r\n"], 2)
    assert frame_stream_while_fresh([b"*1\r\n:1\r\n+OK\r\n"], RESP.reply_parser)[1] == 2


@settings(max_examples=EXAMPLES, deadline=None)
@given(sent=st.lists(resp3_replies, min_size=1, max_size=5), points=st.lists(st.integers(0, 10**6),
                                                                            max_size=12))
def test_any_resp3_replies_cut_anywhere_are_framed_back_exactly_as_sent(sent, points):
    framed, left = frame_stream_keeping_place(cut(b"".join(sent), points))
    assert framed == sent and left == b""
    assert frame_stream(cut(b"".join(sent), points)) == (sent, b"")


@settings(max_examples=EXAMPLES, deadline=None)
@given(reply=replies, ends=st.lists(st.integers(0, 10**6), min_size=1, max_size=8))
def test_a_strict_prefix_of_a_reply_is_unfinished_and_the_whole_fits_any_command_type(reply, ends):
    for end in {end % len(reply) for end in ends} | {0, len(reply) - 1}:
        assert reply_size(reply[:end]) is None
    assert reply_size(reply) == len(reply)
    assert RESP.fits(b"EVALSHA f00d 0\r\n", reply)   # a script's reply may be of any type


# --- a message too long to keep, read to its end and dropped --------------------------------

KEEP = 40   # bytes a dropping parser keeps of a message here: most drawn replies are within it
cuts = st.lists(st.integers(0, 10**6), max_size=12)


def frame_dropping(chunks, new_parser):
    """What SessionProxy does with RESP: Frames over a dropping parser. Returns the messages
    taken and the most bytes Frames held unread at once."""
    frames, taken, held = Frames(new_parser), [], 0
    for chunk in chunks:
        frames.feed(chunk)
        held = max(held, len(frames.unread))
        while (message := frames.take()) is not None:
            taken.append(message)
        held = max(held, len(frames.unread))
    assert frames.rest() == b""
    return taken, held


@settings(max_examples=EXAMPLES, deadline=None)
@given(sent=st.lists(replies, min_size=1, max_size=8), point=st.integers(0, 10**6))
def test_ends_finds_only_where_replies_end_reading_ahead_and_keeps_the_parser_fresh(sent, point):
    stream = b"".join(sent)
    boundaries = list(itertools.accumulate(map(len, sent)))
    parser = RESP.reply_parser()
    found = parser.ends(bytearray(stream[:point % (len(stream) + 1)]))
    assert found == boundaries[:len(found)] and parser.fresh


def test_ends_reads_ahead_the_common_shapes_and_stops_at_the_first_that_is_not_whole():
    replies = b"$1\r\na\r\n+OK\r\n*1\r\n$0\r\n\r\n*1\r\n:1\r\n$2\r\nhi\r\n"
    assert RESP.reply_parser().ends(bytearray(replies)) == [7, 12, 22]   # an integer in an array
    get = b"*2\r\n$3\r\nGET\r\n$1\r\na\r\n"
    assert RESP.request_parser().ends(bytearray(get * 2 + get[:-1])) == [20, 40]
    assert RESP.request_parser().ends(bytearray(b"GET a\r\n" + get)) == []   # inline: step by step


def test_take_all_keeps_a_fresh_parser_from_read_to_read_and_take_makes_one_a_message():
    made = []

    def new_parser():
        made.append(RESP.reply_parser())
        return made[-1]
    frames = Frames(new_parser)
    frames.feed(b"$1\r\na\r\n+OK\r\n$5\r\nhel")
    assert frames.take_all() == ([b"$1\r\na\r\n", b"+OK\r\n"], None) and len(made) == 1
    frames.feed(b"lo\r\n:1\r\n")   # the rest of this read, message by message
    assert frames.take_all() == ([b"$5\r\nhello\r\n", b":1\r\n"], None) and len(made) == 3
    frames.feed(b"+OK\r\n-ERR x\r\n")
    assert frames.take_all() == ([b"+OK\r\n", b"-ERR x\r\n"], None)
    assert (len(made), frames.rest()) == (3, b"")


@settings(max_examples=EXAMPLES, deadline=None)
@given(sent=st.lists(replies, min_size=1, max_size=6), points=cuts)
def test_take_all_gives_every_reply_cut_anywhere_as_sent_and_keeps_what_has_not_ended(sent, points):
    frames, taken = Frames(RESP.reply_parser), []
    for chunk in cut(b"".join(sent), points):
        frames.feed(chunk)
        messages, error = frames.take_all()
        assert error is None and all(type(message) is bytes for message in messages)
        taken += messages
    assert taken == sent and frames.rest() == b""


def test_take_all_gives_the_messages_before_bytes_no_message_is_and_the_error_they_raise():
    frames = Frames(RESP.request_parser)
    get = b"*2\r\n$3\r\nGET\r\n$1\r\na\r\n"
    frames.feed(get + b"PING\r\n" + get + b"*1\r\n:1\r\n" + get)
    messages, error = frames.take_all()
    assert messages == [get, b"PING\r\n", get] and isinstance(error, ValueError)
    lines = Frames(LINES.request_parser)
    lines.feed(b"GET a\nGET b\nGET c")
    assert lines.take_all() == ([b"GET a\n", b"GET b\n"], None) and lines.rest() == b"GET c"


def dropping(**options):
    return lambda: Parser(KEEP, overlong="drop", **options)


@settings(max_examples=EXAMPLES, deadline=None)
@given(sent=st.lists(replies, min_size=1, max_size=5), points=cuts)
def test_a_dropping_parser_passes_short_replies_whole_and_reads_long_ones_to_the_end(sent, points):
    chunks = cut(b"".join(sent), points)
    taken, held = frame_dropping(chunks, dropping())
    assert len(taken) == len(sent)
    for message, reply in zip(taken, sent):
        if len(reply) <= KEEP:
            assert type(message) is bytes and message == reply
        else:   # its length, and its first bytes (as many as had come when the first went)
            assert isinstance(message, Overlong) and message.size == len(reply)
            assert 0 < len(message.head) <= Overlong.HEAD and reply.startswith(message.head)
    assert held <= KEEP + max(map(len, chunks)) + 2   # what it keeps, one read, a line's end


def test_a_reply_past_the_bound_is_the_error_that_answers_it_and_a_request_one_never_sent():
    long_reply = b"*3\r\n$20\r\n" + b"v" * 20 + b"\r\n$20\r\n" + b"w" * 20 + b"\r\n:1\r\n"
    [dropped, after], _ = frame_dropping([long_reply + b"+OK\r\n"], dropping())
    assert bytes(dropped) == (b"-ERR upstream: a reply of %d bytes is too long to pass on: longer "
                              b"than the 40 a pool keeps, so it was read to its end and dropped\r\n"
                              % len(long_reply))
    assert (dropped.size, dropped.head, after) == (len(long_reply), long_reply, b"+OK\r\n")
    request = b"*2\r\n$3\r\nSET\r\n$50\r\n" + b"x" * 50 + b"\r\n"
    [dropped, after], _ = frame_dropping([request[:7], request[7:] + b"PING\r\n"],
                                         dropping(request=True))
    assert bytes(dropped) == (b"-ERR tcp-proxy: a request of %d bytes is too long: longer than "
                              b"the 40 a pool keeps, so it was read to its end and dropped, never "
                              b"sent\r\n" % len(request))
    assert after == b"PING\r\n"


def test_a_dropping_parser_still_refuses_what_no_message_is_and_bounds_one_line():
    for malformed in (b"$50\r\n" + b"x" * 50 + b"!!", b"*1\r\n:1.5\r\n", b"+" + b"o" * (KEEP + 1)):
        with pytest.raises(ValueError):
            frame_dropping([malformed], dropping())
    with pytest.raises(ValueError, match="longer than redis-server takes in a request"):
        frame_dropping([b"*1\r\n$600000000\r\n"], dropping(request=True))


def test_a_dropping_parser_reads_a_long_reply_in_pieces_once_and_keeps_its_bound_and_a_piece():
    reply = b"*%d\r\n" % 50_000 + b"$4\r\nvvvv\r\n" * 50_000   # 500 kB; it keeps 64 kB
    pieces = [reply[start:start + 4096] for start in range(0, len(reply), 4096)]
    parsers = []

    def new_parser():
        parsers.append(Parser(1 << 16, overlong="drop"))
        return parsers[-1]

    [dropped], held = frame_dropping(pieces, new_parser)
    assert (dropped.size, parsers[0].lines) == (len(reply), 50_001)   # each line parsed once
    assert held <= (1 << 16) + 4096


# --- a message too long to keep, passed on in pieces as it arrives -------------------------------

def frame_passing(chunks, new_parser):
    """What SessionProxy does with RESP: Frames over a passing parser. Returns each message as
    it was handed on (a whole one, or the pieces of a long one joined, with its PassedEnd end) and
    the most bytes Frames held unread at once."""
    frames, messages, pieces, held = Frames(new_parser), [], None, 0
    for chunk in chunks:
        frames.feed(chunk)
        while (taken := frames.take()) is not None:
            if isinstance(taken, Head):
                assert pieces is None   # a Head starts a long message, and only one
                pieces = [taken]
            elif isinstance(taken, Piece):
                pieces.append(taken)
            elif isinstance(taken, PassedEnd):
                messages.append((b"".join(pieces), taken))
                pieces = None
            else:
                assert pieces is None   # nothing whole inside a long message's pieces
                messages.append((taken, None))
        held = max(held, len(frames.unread))
    assert frames.rest() == b"" and pieces is None
    return messages, held


@settings(max_examples=EXAMPLES, deadline=None)
@given(sent=st.lists(resp3_replies, min_size=1, max_size=5), points=cuts)
def test_a_passing_parser_hands_long_replies_on_in_pieces_that_join_back_to_them_within_its_bound(
        sent, points):
    chunks = cut(b"".join(sent), points)
    messages, held = frame_passing(chunks, lambda: Parser(KEEP, overlong="pass"))
    assert [message for message, _ in messages] == sent
    for (message, end), reply in zip(messages, sent):
        if end is not None:   # passed on: what is known of it, as an Overlong knows it
            assert (end, end.size, end.limit) == (b"", len(reply), KEEP)
            assert reply.startswith(end.head) and 0 < len(end.head) <= Overlong.HEAD
    assert held <= KEEP + max(map(len, chunks)) + 2   # what it keeps, one read, a line's end


def test_a_passing_parser_passes_a_value_of_redis_own_limit_and_refuses_a_byte_more_in_a_request():
    """512 MB: redis-server's proto-max-bulk-len. Its first bytes are a Head at once; the
    parser keeps none of it (what passes is counted, not held)."""
    header = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$%d\r\n" % MAX_BULK
    frames = Frames(lambda: RESP.request_parser(passing=True))
    frames.feed(header + b"v" * 4096)
    head = frames.take()
    assert isinstance(head, Head) and head == header + b"v" * 4096 and frames.unread == b""
    reply = Frames(lambda: RESP.reply_parser(passing=True))
    reply.feed(b"$%d\r\nvvvv" % MAX_BULK)
    assert isinstance(reply.take(), Head)
    with pytest.raises(ValueError, match="longer than redis-server takes in a request"):
        Frames(lambda: RESP.request_parser(passing=True), b"*1\r\n$%d\r\n" % (MAX_BULK + 1)).take()


@pytest.mark.parametrize("depth", [1, 2, 3000])
def test_arrays_nested_deeper_than_pythons_recursion_limit_are_framed(depth):
    reply = b"*1\r\n" * depth + b"$5\r\nhello\r\n"
    assert reply_size(reply + b"+next\r\n") == len(reply)


# --- the cases a reader checks by hand -------------------------------------------------------

@pytest.mark.parametrize("buffer, size", [
    (b"$5\r\nhello\r\n$5\r\nworld\r\n", 11),   # GET's reply: two lines, one reply
    (b"$5\r\nhello\r\n", 11),
    (b"$5\r\nhello\r", None),
    (b"$5\r\n", None),                            # where a line framing stops
    (b"$-1\r\n+OK\r\n", 5),                       # GET of a missing key
    (b"*-1\r\n", 5),
    (b"*0\r\n", 4),
    (b"*2\r\n*1\r\n:1\r\n$3\r\na\r\n\r\n", 21),  # a bulk string may hold \r\n
    (b"*2\r\n*1\r\n:1\r\n", None),
    (b"-ERR wrong type\r\n", 17),
    (b":-42\r\n", 6),
    (b"", None),
    (b"%2\r\n+a\r\n:1\r\n+b\r\n_\r\n", 19),                # RESP3: a map of two pairs
    (b"%2\r\n+a\r\n:1\r\n+b\r\n", None),
    (b"~2\r\n#t\r\n,1.5\r\n", 14),                           # a set, a boolean, a double
    (b">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$2\r\nhi\r\n", 33),   # a push
    (b"|1\r\n+ttl\r\n:3\r\n$2\r\nhi\r\n+next\r\n", 22),          # an attribute, then its reply
    (b"|1\r\n+ttl\r\n:3\r\n", None),                           # an attribute alone is no reply
    (b"=8\r\ntxt:abcd\r\n(12345678901234567890123\r\n", 14),   # a verbatim string
    (b"!9\r\nERR\r\nsome\r\n", 15),                           # a blob error may hold \r\n
    (b"_\r\n", 3),
], ids=lambda value: repr(value) if isinstance(value, bytes) else str(value))
def test_reply_size_by_hand(buffer, size):
    assert RESP.reply_size(buffer) == size
    assert RESP.reply_size(bytearray(buffer)) == size


@pytest.mark.parametrize("buffer", [
    b"hello\r\n",            # the tail of a bulk string, read as if it were a reply
    b"$5\r\nhello!!\r\n",    # more bytes than the length says
    b"$-2\r\n", b"$05\r\nhello\r\n", b"$x\r\n", b"*-2\r\n", b":1.5\r\n", b":\r\n",
    b"+OK\n",                # a bare \n
    b"\r\n",
    b"$2000000\r\n",         # longer than max_reply: it could never be buffered
    b"%-1\r\n", b"~-1\r\n", b"=-1\r\n", b"=3\r\ntxt\r\n", b"#x\r\n", b"_x\r\n", b",1,5\r\n",
    b"(1.5\r\n", b".\r\n", b"%1000000\r\n",
])
def test_bytes_no_reply_starts_with_are_a_value_error(buffer):
    with pytest.raises(ValueError):
        RESP.reply_size(buffer)


@pytest.mark.parametrize("streamed", [b"$?\r\n;4\r\nhell\r\n;0\r\n", b"*?\r\n:1\r\n.\r\n",
                                      b"%?\r\n", b"~?\r\n"])
def test_a_streamed_resp3_message_is_refused_saying_redis_server_never_sends_one(streamed):
    with pytest.raises(ValueError, match="a streamed RESP3 message .*redis-server never sends one"):
        RESP.reply_size(streamed)


def test_fits_wants_one_whole_reply_of_a_type_the_command_can_get():
    assert RESP.fits(b"GET a\r\n", b"$5\r\nhello\r\n")
    assert RESP.fits(b"GET a\r\n", b"$-1\r\n")
    assert RESP.fits(b"get a\r\n", b"-ERR wrong type\r\n")
    assert not RESP.fits(b"GET a\r\n", b"$5\r\n")          # the head of a reply
    assert not RESP.fits(b"GET b\r\n", b"hello\r\n")       # the tail of another's
    assert not RESP.fits(b"GET a\r\n", b"+OK\r\n")         # SET's kind of answer
    assert not RESP.fits(b"GET a\r\n", b"$1\r\na\r\n+OK\r\n")   # two replies
    assert RESP.fits(b"PING\r\n", b"+PONG\r\n")
    assert RESP.max_reply == 1 << 20


# --- the real server (redis_server.RedisServer, demo.py --part3) ----------------------------------

HERE = ROOT


def test_redis_server_is_stopped_and_waited_for_and_its_directory_removed_when_the_block_fails():
    need_redis()
    with pytest.raises(RuntimeError, match="a scenario failed"):
        with redis_server.RedisServer() as redis:
            process, directory = redis.process, pathlib.Path(redis._directory.name)
            control = redis_server.RedisControl(redis.addr)
            assert control.command("PING") == b"+PONG\r\n"
            assert control.command("CONFIG GET save") == b"*2\r\n$4\r\nsave\r\n$0\r\n\r\n"
            assert control.command("CONFIG GET appendonly") == (
                b"*2\r\n$10\r\nappendonly\r\n$2\r\nno\r\n")
            control.close()
            raise RuntimeError("a scenario failed")
    assert process.returncode is not None and not directory.exists()


def test_redis_server_tries_another_port_when_its_first_one_is_taken(monkeypatch):
    need_redis()
    with socket.create_server(("127.0.0.1", 0)) as squatter:
        ports = iter([squatter.getsockname()[1], kit.free_port()])
        monkeypatch.setattr(redis_server, "free_port", lambda: next(ports))
        with redis_server.RedisServer() as redis:
            assert redis.addr[1] != squatter.getsockname()[1]
            control = redis_server.RedisControl(redis.addr)
            assert control.command("PING") == b"+PONG\r\n"
            control.close()


def test_demo_part3_prints_the_checked_in_transcript():
    need_redis()
    run = subprocess.run([sys.executable, "demo.py", "--part3"], cwd=HERE, capture_output=True,
                         timeout=60)
    assert run.stderr == b"" and run.returncode == 0
    assert run.stdout == (HERE / "transcripts" / "part3.txt").read_bytes()


def test_demo_part3_without_redis_prints_one_line_on_how_to_install_it_and_exits_successfully():
    run = subprocess.run([sys.executable, "demo.py", "--part3"], cwd=HERE, capture_output=True,
                         timeout=60, env={**os.environ, "PATH": "/nonexistent"})
    assert (run.stdout.decode(), run.returncode) == (redis_server.INSTALL_HINT + "\n", 0)
    assert "apt-get install redis-server" in redis_server.INSTALL_HINT


# --- resp.RESP inside the pool: SessionProxy(framing=resp.RESP) -----------------------------------

class ScriptedRedis(Server):
    """A fake Redis: the reply to each request line is the next of `replies`, each written
    as its list of parts; before part k > 1 it calls between(reply number, k)."""

    def __init__(self, replies, between=lambda reply_number, part: None):
        super().__init__()
        self.replies, self.between = list(replies), between

    def handle(self, conn):
        for number, _ in enumerate(read_lines(conn), 1):
            for part_number, part in enumerate(self.replies[number - 1], 1):
                if part_number > 1:
                    self.between(number, part_number)
                conn.sendall(part)


def ask_through(proxy, requests):
    """Send each request through the proxy; read each reply whole, framed as RESP."""
    with socket.create_connection(proxy.addr, timeout=10) as sock:
        reader = types.SimpleNamespace(sock=sock, unread=b"")   # what read_resp() reads from
        replies = []
        for request in requests:
            sock.sendall(request)
            replies.append(redis_server.read_resp(reader))
        return replies


def test_the_resp_pool_waits_through_a_reply_cut_after_its_length_line_and_inside_an_array():
    proxy = None

    def until_the_pool_went_back_for_more(reply_number, part):
        proxy.wait_partial_replies(sum(len(parts) - 1 for parts in cut_replies[:reply_number - 1])
                                   + part - 1)

    cut_replies = [
        # where a line framing stops
        [b"$5\r\n", b"hello\r\n"],
        # inside a nested array
        [b"*2\r\n$3\r\none\r\n", b"*1\r\n:7", b"\r\n"]]
    # the noqa below, F811: the hook above reads proxy
    with ScriptedRedis(cut_replies, until_the_pool_went_back_for_more) as upstream, \
            SessionProxy(upstream.addr, framing=RESP) as proxy:   # noqa: F811
        replies = ask_through(proxy, [b"GET a\r\n", b"LRANGE l 0 -1\r\n"])
        assert replies == [b"$5\r\nhello\r\n", b"*2\r\n$3\r\none\r\n*1\r\n:7\r\n"]
        assert (proxy.opened, proxy.released, proxy.dirty, proxy.partial_replies) == (1, 2, 0, 3)


def test_the_resp_pool_closes_a_connection_with_bytes_past_a_reply_and_refuses_a_wrong_type_reply():
    with ScriptedRedis([[b"$5\r\nhello\r\n+EXTRA\r\n"], [b"+OK\r\n"]]) as upstream, \
            SessionProxy(upstream.addr, framing=RESP) as proxy:
        first = ask_through(proxy, [b"GET a\r\n"])
        assert first == [b"$5\r\nhello\r\n"]   # the reply stands; the connection does not
        assert (proxy.opened, proxy.dirty) == (1, 1)
    with ScriptedRedis([[b"+OK\r\n"]]) as upstream, \
            SessionProxy(upstream.addr, framing=RESP) as proxy:
        with socket.create_connection(proxy.addr, timeout=10) as sock:
            sock.sendall(b"GET a\r\n")
            reply = next(read_lines(sock))
        # RESP's form
        assert reply == (b"-ERR upstream: out of step: a reply of 5 bytes "
                         b"does not answer b'GET a\\r\\n'\r")
        assert proxy.dirty == 1


def test_a_reply_longer_than_the_pool_keeps_costs_its_client_an_error_and_the_connection_goes_on():
    """One client's LRANGE of 1.2 MB, past max_reply (1 MiB). Before: the connection was
    closed as out of step; on ManagedProxy every call pipelined on it was lost too (the
    same for it comes with its reader on the event loop). Now the pool reads the reply to
    its end and drops it, that client gets an error that says too long, and the next
    request goes on the same connection."""
    need_redis()
    elements = 120_000   # of 4 bytes each: a reply of 1,200,009 bytes
    with redis_server.RedisServer() as redis:
        control = redis_server.RedisControl(redis.addr)
        for _ in range(elements // 10_000):
            control.command("RPUSH long " + " ".join(["vvvv"] * 10_000))
        control.command("SET short fine")
        control.close()
        with SessionProxy(redis.addr, framing=RESP, pool_cap=1) as proxy:
            replies = ask_through(proxy, [b"LRANGE long 0 -1\r\n", b"GET short\r\n"])
            assert replies == [b"-ERR upstream: a reply of 1200009 bytes is too long to pass on: "
                               b"longer than the 1048576 a pool keeps, so it was read to its end "
                               b"and dropped\r\n", b"$4\r\nfine\r\n"]
            assert (proxy.opened, proxy.released, proxy.dirty, proxy.discarded) == (1, 2, 0, 0)
