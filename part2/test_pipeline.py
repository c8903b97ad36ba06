"""The socket-free core's claims (part2/pipeline.py, part2/calls.py), with bytes and no socket,
thread or clock: replies settle the oldest request owed, each fit-checked; a connection
lost turns every reply owed into an error, in order; a proxy client's replies come out
in its own order, whichever connection brought them."""
import pytest

from part2.calls import MessageLost, MessageTimeout, Run
from part2.pipeline import ClientStream, OutOfStep, Pipeline, hand_out
from ground.frames import MAX_LINE
from tcp_proxy import LINES, answer


class Sink:
    """What a run's sink was told, in order."""

    def __init__(self):
        self.told = []

    def replied(self, run, replies):
        self.told += [("reply", reply) for reply in replies]

    def failed(self, run, error):
        self.told.append(("failed", type(error).__name__, len(run.requests) - run.answered))


class Counts:
    answered = failed = 0


def pipeline(framing=LINES, check_fit=True):
    settled = []
    def note(run, replies, first):
        settled.append((run, len(replies), first))
    core = Pipeline(framing, note, check_fit)
    return core, settled


def run_of(*keys, sink=None):
    return Run([b"GET %s\n" % key for key in keys], sink or Sink())


def replies_to(*keys):
    return b"".join(answer(b"GET %s" % key) for key in keys)


# --- requests out ------------------------------------------------------------------------

def test_runs_go_out_in_the_order_queued_and_each_is_written_once_its_last_byte_is():
    core, _ = pipeline()
    first, second = run_of(b"a", b"b"), run_of(b"c")
    core.queue(first)
    core.queue(second)
    assert bytes(core.out) == b"GET a\nGET b\nGET c\n" and list(core.owed) == [first, second]
    assert core.wrote(11) == [] and not core.is_written(first)   # one byte of b's line unwritten
    assert core.wrote(1) == [first] and core.is_written(first) and not core.is_written(second)
    assert core.wrote(6) == [second] and core.out == bytearray()


# --- replies in --------------------------------------------------------------------------

def test_each_reply_however_the_reads_cut_it_settles_the_oldest_request_owed():
    core, settled = pipeline()
    sinks = [Sink(), Sink()]
    core.queue(run_of(b"a", b"b", sink=sinks[0]))
    core.queue(run_of(b"c", sink=sinks[1]))
    stream = replies_to(b"a", b"b", b"c")
    for start in range(0, len(stream), 5):   # cut every 5 bytes, inside replies
        core.feed(stream[start:start + 5])
    assert sinks[0].told == [("reply", answer(b"GET a")), ("reply", answer(b"GET b"))]
    assert sinks[1].told == [("reply", answer(b"GET c"))]
    assert [(count, first) for _, count, first in settled] == [(1, 0), (1, 1), (1, 0)]
    assert not core.owed and core.answered


def test_one_read_of_many_replies_settles_each_run_once_with_its_share():
    core, settled = pipeline()
    runs = [run_of(b"a", b"b"), run_of(b"c", b"d", b"e")]
    for run in runs:
        core.queue(run)
    core.feed(replies_to(b"a", b"b", b"c", b"d"))
    assert settled == [(runs[0], 2, 0), (runs[1], 2, 0)]
    core.feed(replies_to(b"e"))
    assert settled[-1] == (runs[1], 1, 2) and not core.owed


def test_a_reply_that_does_not_fit_is_out_of_step_and_reaches_no_sink():
    core, settled = pipeline()
    sink = Sink()
    core.queue(run_of(b"a", sink=sink))
    with pytest.raises(OutOfStep, match="does not fit") as raised:
        core.feed(answer(b"GET b"))
    assert raised.value.reply == answer(b"GET b") and raised.value.run.requests == [b"GET a\n"]
    assert sink.told == [] and settled == []


def test_the_replies_before_a_misfit_are_told_before_it_is_raised():
    core, _ = pipeline()
    sink = Sink()
    core.queue(run_of(b"a", b"b", sink=sink))
    with pytest.raises(OutOfStep):
        core.feed(replies_to(b"a", b"x"))
    assert sink.told == [("reply", answer(b"GET a"))]


def test_a_reply_when_none_is_owed_is_out_of_step():
    core, _ = pipeline()
    with pytest.raises(OutOfStep, match="no call was waiting") as raised:
        core.feed(b"EXTRA\n")
    assert raised.value.reply == b"EXTRA\n" and raised.value.run is None


def test_bytes_longer_than_the_framings_max_reply_are_out_of_step():
    core, _ = pipeline()
    core.queue(run_of(b"a"))
    with pytest.raises(OutOfStep, match=f"a reply longer than {MAX_LINE} bytes"):
        core.feed(b"x" * (MAX_LINE + 1))


def test_an_abandoned_run_keeps_its_place_and_its_replies_are_thrown_away():
    core, settled = pipeline()
    late, behind = Sink(), Sink()
    abandoned = run_of(b"a", sink=late)
    core.queue(abandoned)
    core.queue(run_of(b"b", sink=behind))
    abandoned.abandoned = True   # as the connection abandons it once its deadline passes
    core.feed(replies_to(b"a", b"b"))
    assert late.told == [] and behind.told == [("reply", answer(b"GET b"))]
    assert settled[0][0] is abandoned


def test_a_dropped_run_lets_its_reply_reach_the_run_behind_it_unless_the_fit_check_is_on():
    trusting, _ = pipeline(check_fit=False)   # the forgetful client of the demo's first scenario
    apple, banana = run_of(b"apple"), run_of(b"banana")
    for run in (apple, banana):
        trusting.queue(run)
    trusting.drop(apple)
    trusting.feed(answer(b"GET apple"))
    assert banana.sink.told == [("reply", answer(b"GET apple"))]   # the bug, shown
    checking, _ = pipeline()
    apple, banana = run_of(b"apple"), run_of(b"banana")
    for run in (apple, banana):
        checking.queue(run)
    checking.drop(apple)
    with pytest.raises(OutOfStep, match="does not fit"):
        checking.feed(answer(b"GET apple"))


# --- a lost connection ---------------------------------------------------------------------

def test_a_lost_connection_turns_every_request_still_owed_into_an_error_in_order():
    core, _ = pipeline()
    first, timed_out, last = Sink(), Sink(), Sink()
    runs = [run_of(b"a", b"b", sink=first), run_of(b"c", sink=timed_out),
            run_of(b"d", b"e", sink=last)]
    for run in runs:
        core.queue(run)
    runs[1].abandoned = True   # its caller was already told; its reply is owed all the same
    core.feed(replies_to(b"a"))
    assert core.lose(MessageLost("upstream closed the connection")) == 4
    assert first.told == [("reply", answer(b"GET a")), ("failed", "MessageLost", 1)]
    assert timed_out.told == [] and last.told == [("failed", "MessageLost", 2)]
    assert not core.owed and all(run.over() for run in runs)
    core.feed(replies_to(b"b"))   # what comes after is delivered to no one
    assert first.told[-1] == ("failed", "MessageLost", 1)


def test_what_an_event_shows_of_a_run_is_its_requests_still_owed_and_whether_it_was_abandoned():
    run = run_of(b"a", b"b")
    assert run.owing() == (b"GET a\nGET b\n", False)
    run.answered, run.abandoned = 1, True
    assert run.owing().request == b"GET b\n" and run.owing().abandoned
    run.fail(MessageTimeout("no reply"))   # an abandoned run's sink was told already
    assert run.sink.told == [] and run.over()


# --- a proxy client's stream ----------------------------------------------------------------

def test_requests_cut_anywhere_come_out_whole_as_one_run_per_read():
    stream = ClientStream(LINES, Counts())
    assert [entry.requests for entry in stream.feed(b"GET a\nGE")] == [[b"GET a\n"]]
    entries = stream.feed(b"T b\nGET c\n")
    assert [entry.requests for entry in entries] == [[b"GET b\n", b"GET c\n"]]
    assert stream.owed == 3 and len(stream.waiting) == 2


def test_replies_leave_in_the_clients_order_whichever_entry_is_answered_first():
    counts = Counts()
    stream = ClientStream(LINES, counts)
    first = stream.feed(b"GET a\nGET b\n")[0]
    second = stream.feed(b"GET c\n")[0]
    second.replied(None, [answer(b"GET c")])   # another connection was quicker
    assert stream.out == bytearray()
    first.replied(None, [answer(b"GET a")])
    assert bytes(stream.out) == answer(b"GET a")
    first.replied(None, [answer(b"GET b")])
    assert bytes(stream.out) == replies_to(b"a", b"b", b"c") and stream.done() is False
    stream.out.clear()
    assert stream.done() and (counts.answered, stream.owed) == (3, 0)


class Told(ClientStream):
    """A stream that counts the times it is told bytes were added to out."""
    told = 0

    def writable(self):
        self.told += 1


def test_a_batchs_replies_go_each_to_its_own_client_in_one_loop_each_client_told_once():
    counts = Counts()
    streams = [Told(LINES, counts) for _ in range(2)]
    (early,), (other,) = streams[0].feed(b"GET a\nGET b\n"), streams[1].feed(b"GET c\n")
    (late,) = streams[0].feed(b"GET d\n")
    hand_out([late, other], [answer(b"GET d"), answer(b"GET c")])   # late: another connection's
    assert streams[0].out == bytearray() and bytes(streams[1].out) == answer(b"GET c")
    hand_out([early, early], [answer(b"GET a"), answer(b"GET b")])
    assert bytes(streams[0].out) == replies_to(b"a", b"b", b"d") and not streams[0].waiting
    assert [stream.told for stream in streams] == [2, 1]   # a's bytes; d's, once unparked
    assert (counts.answered, streams[0].owed, streams[1].owed) == (4, 0, 0)



def test_what_waits_behind_an_unanswered_entry_counts_in_the_backlog_until_it_is_written():
    stream = ClientStream(LINES, Counts())
    (early,), (late,) = stream.feed(b"GET a\n"), stream.feed(b"GET b\n")
    late.passing(None, b"b=BBB")   # pieces of a long reply, another connection's
    hand_out([late], [b"BBBBBBBBB\n"])
    assert (stream.out, stream.backlog()) == (bytearray(), len(answer(b"GET b")))
    hand_out([early], [answer(b"GET a")])
    assert bytes(stream.out) == replies_to(b"a", b"b") and stream.backlog() == len(stream.out)

def test_a_read_of_whole_requests_all_sent_on_is_queued_as_its_bytes_came_any_other_joined():
    stream = ClientStream(LINES, Counts())
    data = b"GET a\nGET b\n"
    assert stream.feed(data)[0].data is data   # no split and join: the bytes as read
    assert stream.feed(b"GET c\nGE")[0].data == b"GET c\n"   # a request begun: not all of it
    assert stream.feed(b"T d\n")[0].data == b"GET d\n"   # the end of one begun before
    assert [entry.data for entry in stream.feed(b"GET e\n\nGET f\n")] == [b"GET e\n", b"GET f\n"]


def test_the_pools_own_answers_and_errors_take_their_place_among_the_replies():
    counts = Counts()
    stream = ClientStream(LINES, counts)
    entries = stream.feed(b"GET a\n\nGET b\n")   # a blank line: the pool refuses it itself
    assert [entry.requests for entry in entries] == [[b"GET a\n"], [b"GET b\n"]]
    entries[1].replied(None, [answer(b"GET b")])
    entries[0].failed(None, MessageLost("upstream closed the connection"))
    assert bytes(stream.out) == (b"ERR MessageLost: upstream closed the connection\n"
                                 b"ERR tcp-proxy: an empty request\n" + answer(b"GET b"))
    assert (counts.answered, counts.failed) == (1, 1)


def test_a_request_the_framing_cannot_read_is_answered_after_the_earlier_ones_and_ends_the_stream():
    stream = ClientStream(LINES, Counts())
    (entry,) = stream.feed(b"GET a\nGET b\rc\nGET d\n")
    assert entry.requests == [b"GET a\n"] and stream.ended
    assert stream.feed(b"GET e\n") == []   # nothing after it is read
    entry.replied(None, [answer(b"GET a")])
    with pytest.raises(ValueError) as why:   # what the framing says of it, as FramedProxy says it
        LINES.request_size(b"GET b\rc\nGET d\n")
    assert bytes(stream.out) == answer(b"GET a") + LINES.error(str(why.value))
    assert stream.owed == 0 and not stream.waiting
