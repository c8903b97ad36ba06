"""The socket-free core's claims (part2/pipeline.py), with bytes and no socket, thread or
clock: a reply settles the oldest request owed, each fit-checked, and what cannot be a
reply owed is a misstep; a lost connection gives back every request still owed, in order;
a proxy client's requests come out whole, and its replies leave in its own order,
whichever connection brought them."""
import pytest

from part2.calls import MessageLost
from part2.pipeline import ClientStream, Pipeline, Request
from ground.frames import MAX_LINE
from tcp_proxy import LINES, answer


class Told:
    """A request's client: what it was told, in order."""

    def __init__(self):
        self.told = []

    def replied(self, request, reply):
        self.told.append(("reply", reply))

    def failed(self, request, error):
        self.told.append(("failed", type(error).__name__))


class Counts:
    answered = failed = 0


class Written:
    """A transport that keeps what it is given: out, as if the client never read."""

    def __init__(self):
        self.out = bytearray()

    def write(self, data):
        self.out += data


def requests_for(*keys, client=None):
    client = client or Told()
    return [Request(client, b"GET %s\n" % key) for key in keys]


def replies_to(*keys):
    return b"".join(answer(b"GET %s" % key) for key in keys)


def stream(gathered=None):
    """A client's stream over a Written transport; what it gathers goes to `gathered`."""
    made = ClientStream(LINES, Counts(), Written())
    made.gather = (gathered if gathered is not None else []).extend
    return made


# --- requests out ------------------------------------------------------------------------

def test_requests_go_out_end_to_end_in_the_order_queued_each_knowing_where_its_bytes_end():
    core = Pipeline(LINES)
    first, second = requests_for(b"a", b"b"), requests_for(b"c")
    assert core.queue(first) == b"GET a\nGET b\n" and core.queue(second) == b"GET c\n"
    assert list(core.owed) == first + second
    assert [request.end for request in first + second] == [6, 12, 18]


# --- replies in --------------------------------------------------------------------------

def test_each_reply_however_the_reads_cut_it_settles_the_oldest_request_owed():
    core = Pipeline(LINES)
    owed = requests_for(b"a", b"b", b"c")
    core.queue(owed)
    data, settled = replies_to(b"a", b"b", b"c"), []
    for start in range(0, len(data), 5):   # cut every 5 bytes, inside replies
        pairs, misstep = core.feed(data[start:start + 5])
        assert misstep is None
        settled += pairs
    assert settled == [(request, answer(request.data[:-1])) for request in owed]
    assert not core.owed and core.answered


def test_a_reply_that_does_not_fit_is_a_misstep_after_the_replies_before_it():
    core = Pipeline(LINES)
    owed = requests_for(b"a", b"b")
    core.queue(owed)
    settled, misstep = core.feed(replies_to(b"a", b"x"))
    assert settled == [(owed[0], answer(b"GET a"))]
    assert (misstep.reason, misstep.reply, misstep.request) == (
        "a reply that does not fit its request", answer(b"GET x"), owed[1])
    assert misstep.lost == "upstream out of step: a reply did not fit its request"
    assert list(core.owed) == [owed[1]]   # it answered nothing


def test_a_reply_when_none_is_owed_is_a_misstep():
    settled, misstep = Pipeline(LINES).feed(b"EXTRA\n")
    assert settled == [] and (misstep.reason, misstep.reply) == (
        "a reply no call was waiting for", b"EXTRA\n")


def test_bytes_longer_than_the_framings_max_reply_are_a_misstep():
    core = Pipeline(LINES)
    core.queue(requests_for(b"a"))
    _, misstep = core.feed(b"x" * (MAX_LINE + 1))
    assert misstep.reason == f"upstream out of step: a reply longer than {MAX_LINE} bytes"


def test_a_dropped_request_lets_its_reply_reach_the_one_behind_it_unless_the_fit_check_is_on():
    trusting = Pipeline(LINES, check_fit=False)   # the forgetful client of the demo's scenario 1
    apple, banana = requests_for(b"apple", b"banana")
    trusting.queue([apple, banana])
    trusting.drop(apple)
    assert trusting.feed(answer(b"GET apple")) == ([(banana, answer(b"GET apple"))], None)
    checking = Pipeline(LINES)
    apple, banana = requests_for(b"apple", b"banana")
    checking.queue([apple, banana])
    checking.drop(apple)
    settled, misstep = checking.feed(answer(b"GET apple"))
    assert settled == [] and misstep.reason == "a reply that does not fit its request"


def test_a_lost_connection_gives_back_every_request_still_owed_in_order():
    core = Pipeline(LINES)
    owed = requests_for(b"a", b"b", b"c")
    core.queue(owed)
    core.feed(replies_to(b"a"))
    assert list(core.lose()) == owed[1:] and not core.owed


# --- a proxy client's stream ----------------------------------------------------------------

def test_requests_cut_anywhere_come_out_whole_one_request_each_in_the_clients_order():
    gathered = []
    client = stream(gathered)
    client.received(b"GET a\nGE")
    client.received(b"T b\nGET c\n")
    assert [request.data for request in gathered] == [b"GET a\n", b"GET b\n", b"GET c\n"]
    assert list(client.queue) == gathered and all(r.client is client for r in gathered)


def test_replies_leave_in_the_clients_order_whichever_request_is_answered_first():
    gathered = []
    client = stream(gathered)
    client.received(b"GET a\nGET b\nGET c\n")
    first, second, third = gathered
    client.replied(third, answer(b"GET c"))   # another connection was quicker
    assert client.transport.out == bytearray() and client.backlog() == len(answer(b"GET c"))
    client.replied(first, answer(b"GET a"))
    assert bytes(client.transport.out) == answer(b"GET a")
    client.replied(second, answer(b"GET b"))
    assert bytes(client.transport.out) == replies_to(b"a", b"b", b"c")
    assert client.backlog() == len(client.transport.out) and not client.queue
    assert client.counts.answered == 3


def test_a_long_replys_pieces_wait_behind_an_earlier_reply_and_count_in_the_backlog():
    gathered = []
    client = stream(gathered)
    client.received(b"GET a\nGET b\n")
    early, late = gathered
    assert client.passing(late, b"b=BBB") is client   # another connection's long reply
    client.replied(late, b"BBBBBBBBB\n")
    assert (client.transport.out, client.backlog()) == (bytearray(), len(answer(b"GET b")))
    client.replied(early, answer(b"GET a"))
    assert bytes(client.transport.out) == replies_to(b"a", b"b") and client.parked == 0


def test_the_pools_own_answers_and_errors_take_their_place_among_the_replies():
    gathered = []
    client = stream(gathered)
    client.received(b"GET a\n\nGET b\n")   # a blank line: the pool refuses it itself
    first, second = gathered
    client.replied(second, answer(b"GET b"))
    client.failed(first, MessageLost("upstream closed the connection"))
    assert bytes(client.transport.out) == (b"ERR MessageLost: upstream closed the connection\n"
                                           b"ERR tcp-proxy: an empty request\n" + answer(b"GET b"))
    assert (client.counts.answered, client.counts.failed) == (1, 1)


def test_a_request_the_framing_cannot_read_is_answered_after_the_earlier_ones_and_ends_it():
    gathered = []
    client = stream(gathered)
    client.received(b"GET a\nGET b\rc\nGET d\n")
    assert [request.data for request in gathered] == [b"GET a\n"] and client.ended
    client.received(b"GET e\n")   # nothing after it is read
    assert len(gathered) == 1
    client.replied(gathered[0], answer(b"GET a"))
    with pytest.raises(ValueError) as why:   # what the framing says of it, as FramedProxy says it
        LINES.request_size(b"GET b\rc\nGET d\n")
    assert bytes(client.transport.out) == answer(b"GET a") + LINES.error(str(why.value))
    assert not client.queue and client.held is None
