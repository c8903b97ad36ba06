"""Part three's pictures in pictures/ are what its scenarios draw now, byte for byte,
and the run that draws them is the demo's own run (it prints the transcript's lines).

The scenarios run once for the whole module (the `runs` fixture). They need a real
redis-server: without it these tests skip, except under CI=true, where they fail
(conftest.need_redis). The last test redraws part3-wild.svg from the pinned redis-py venvs
(conftest.need_wild_venvs)."""
import re
import shutil
import time

import pytest

from pictures import draw_part3 as pictures_part3
from pictures import draw_wild
from pictures.record import Got, RedisRead, Returned, TaggedSent, Waited, record_part3
from part3.framed import SessionProxy
from part3 import parser, tagged
from part3.wild import incident
from conftest import ROOT, need_redis, need_wild_venvs, transcript_section
from tcp_proxy import FramedProxy

# One worker runs all of these under `make test`'s --dist loadgroup: the runs
# fixture (every Part three picture's scenarios) runs once per worker that needs it.
pytestmark = pytest.mark.xdist_group("test_pictures_part3")

HERE = ROOT
TAPPED = [(FramedProxy, "handle"), (FramedProxy, "exchange"), (FramedProxy, "read_reply"),
          (SessionProxy, "handle"), (SessionProxy, "read_reply"),
          (tagged.TaggedClient, "__init__"), (tagged.TaggedClient, "call"),
          (tagged.TaggedClient, "on_event"),
          (tagged.TaggedUpstream, "wait_until")]
SECTIONS = [   # the transcript sections the run that draws them prints
    "A pool that frames Redis replies by line: the tail goes to the next borrower",
    "The pool framed by RESP: 0 wrong",
    "Request ids: replies out of order, each to its caller",
    "A slow key and the fast keys behind it",
    "A timed-out call's late reply, dropped by id",
]


def own_attributes():
    return [vars(owner).get(name) for owner, name in TAPPED]


@pytest.fixture(scope="module")
def runs():
    """({scenario: its events}, printed, seconds, wrapped attributes before, after), or None
    without redis-server."""
    if not shutil.which("redis-server"):
        return None
    before = own_attributes()
    started = time.monotonic()
    events, printed = record_part3()
    return events, printed, time.monotonic() - started, before, own_attributes()


def run_of(runs):
    need_redis()
    return runs


def test_the_checked_in_part3_pictures_are_exactly_the_ones_drawn():
    # drawn from the redis-py venvs: the last test here
    checked_in = sorted(path.name for path in (HERE / "pictures").glob("part3-*.svg")
                        if path.name != draw_wild.NAME)
    assert checked_in == sorted(pictures_part3.PICTURES)


@pytest.mark.parametrize("name", sorted(pictures_part3.PICTURES))
def test_each_part3_picture_is_what_its_scenarios_draw_now_byte_for_byte(runs, name):
    events = run_of(runs)[0]
    drawn = pictures_part3.PICTURES[name][1](events).render()
    assert drawn == (HERE / "pictures" / name).read_text(encoding="utf-8"), \
        f"pictures/{name} is stale: run `make pictures` and look at it"


def test_recording_changes_nothing_the_scenarios_print_and_every_wrap_is_undone(runs):
    _, printed, seconds, before, after = run_of(runs)
    assert printed == "".join(transcript_section("part3.txt", title) for title in SECTIONS)
    # wait_until, inherited, is not left as TaggedUpstream's own
    assert before == after and before[-1] is None
    assert seconds < 10


def test_the_line_pool_recording_shows_the_tail_of_as_reply_delivered_to_b(runs):
    events = run_of(runs)[0]["line_pool"]
    reads = [e for e in events if isinstance(e, RedisRead)]
    assert [(e.client, e.reply) for e in reads] == [("A", b"$5\r\n"), ("B", b"hello\r\n"),
                                                    ("C", b"$5\r\n")]
    # (whose reply, bytes, wrong)
    assert [got for _, got, _ in pictures_part3.redis_exchanges(reads)] == [
        [("A", b"$5\r\n", False)], [("A", b"hello\r\n", True)], [("B", b"$5\r\n", True)]]
    assert {e.pool for e in reads} == {"TrustingPool"}


def test_out_of_order_recording_sends_ids_in_order_gets_replies_out_of_order_each_to_its_call(runs):
    events = run_of(runs)[0]["out_of_order"]
    assert [e.line for e in events if isinstance(e, TaggedSent)] == [
        b"1 GET alpha\n", b"2 GET bravo\n", b"3 GET charlie\n"]
    assert [e.line for e in events if isinstance(e, Got)] == [
        b"3 charlie=CCCCCCCCCCCC", b"1 alpha=AAAAAAAAAAAA", b"2 bravo=BBBBBBBBBBBB"]
    assert sorted(tuple(e) for e in events if isinstance(e, Returned)) == [
        (b"1 GET alpha\n", b"alpha=AAAAAAAAAAAA\n"), (b"2 GET bravo\n", b"bravo=BBBBBBBBBBBB\n"),
        (b"3 GET charlie\n", b"charlie=CCCCCCCCCCCC\n")]


def test_slow_key_recording_has_the_fast_replies_pass_it_with_ids_and_wait_behind_it_without(runs):
    events = run_of(runs)[0]["slow_key"]
    assert [tagged.parse_tagged(e.line)[0] for e in events if isinstance(e, Got)] == [2, 3, 4, 1]
    untagged = [e for e in events if isinstance(e, Waited) and not e.upstream.tagged]
    # while GET slow is held; at the end
    assert [(e.ready, e.replies) for e in untagged] == [(3, 0), (4, 4)]
    assert list(untagged[0].upstream.written) == [
        "slow=SSSSSSSSSSSS", "a=AAAAAAAAAAAA", "b=BBBBBBBBBBBB", "c=CCCCCCCCCCCC"]


def test_the_late_reply_recording_drops_the_given_up_calls_id_and_serves_the_later_ones(runs):
    events = run_of(runs)[0]["late_reply"]
    assert [(type(e).__name__, *e)
            for e in events if isinstance(e, (TaggedSent, Got, Returned))] == [
        ("TaggedSent", b"1 GET slow\n"), ("Returned", b"1 GET slow\n", "CallTimeout"),
        ("TaggedSent", b"2 GET next\n"), ("Got", b"1 slow=SSSSSSSSSSSS"),
        ("Got", b"2 next=NNNNNNNNNNNN"),
        ("Returned", b"2 GET next\n", b"next=NNNNNNNNNNNN\n"), ("TaggedSent", b"3 GET after\n"),
        ("Got", b"3 after=AAAAAAAAAAAA"), ("Returned", b"3 GET after\n", b"after=AAAAAAAAAAAA\n")]
    assert {e.upstream.connections for e in events if isinstance(e, Waited)} == {1}


def test_the_resp_pool_recording_gives_every_client_whole_replies_over_one_connection(runs):
    reads = [e for e in run_of(runs)[0]["resp_pool"] if isinstance(e, RedisRead)]
    # the transcript's 24
    assert [len({e.via for e in part}) for part in (reads[:4], reads[4:], reads)] == [1, 8, 9]
    assert ([parser.reply_size(e.reply) == len(e.reply) and e.rest == b"" for e in reads]
            == [True] * 28)
    assert len({e.connection for e in reads}) == 1
    assert {e.pool for e in reads} == {"SessionProxy"}


def test_the_resp_crowd_is_drawn_a_row_per_client_each_its_own_whole_replies_in_its_order(runs):
    reads = [e for e in run_of(runs)[0]["resp_pool"] if isinstance(e, RedisRead)]
    crowd = [e for e in pictures_part3.redis_exchanges(reads) if e[0].via != reads[0].via]
    rows = pictures_part3.redis_rows(crowd, by_client=True)
    assert [(client, verdict) for client, _, verdict, _ in rows] == [
        (name, "each its whole reply") for name in "ABCDEFGH"]
    # B's row: its GETs in the order it sent them, each its own reply alone, unmarked
    assert rows[1][1] == [(b"GET bravo%d\r\n" % n, [("B", b"$6\r\nBRAVO%d\r\n" % n, False)])
                          for n in (1, 2, 3)]


def test_the_out_of_order_picture_hands_each_reply_from_the_client_to_the_caller_its_id_names(runs):
    svg = pictures_part3.draw_tagged_out_of_order(run_of(runs)[0]).render()
    # every arrow's label, top to bottom: through TaggedClient both ways
    labels = re.findall(r'<text x="[\d.]+" y="[\d.]+" font-size="13" fill="#222222">([^<]*)</text>',
                        svg)
    assert labels == [
        r"GET alpha\n", r"1 GET alpha\n", r"GET bravo\n", r"2 GET bravo\n",
        r"GET charlie\n", r"3 GET charlie\n",
        r"3 charlie=CCCCCCCCCCCC\n", r"charlie=CCCCCCCCCCCC\n",
        r"1 alpha=AAAAAAAAAAAA\n", r"alpha=AAAAAAAAAAAA\n",
        r"2 bravo=BBBBBBBBBBBB\n", r"bravo=BBBBBBBBBBBB\n"]
    assert [name for name in re.findall(r"id \d is (\w)'s call", svg)] == ["C", "A", "B"]


@pytest.mark.slow
def test_the_wild_picture_is_what_the_leaking_and_the_fixed_redis_py_draw_now_byte_for_byte():
    need_redis()
    need_wild_venvs(incident)
    drawn = draw_wild.draw({version: draw_wild.record(version)
                            for version in draw_wild.SHOWN}).render()
    assert (ROOT / "pictures" / draw_wild.NAME).read_text(encoding="utf-8") == drawn, \
        ("pictures/part3-wild.svg is stale: "
         "run `python3 -m pictures.draw_wild` and look at it")
