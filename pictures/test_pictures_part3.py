"""Part three's pictures in pictures/ are what its scenarios draw now, byte for byte,
and the run that draws each one is the demo's own run (it prints the transcript's lines).

Each picture's scenarios run once for the whole module (the `runs` fixture). The
Redis ones need a real redis-server: without it their tests skip, except under
CI=true, where they fail (conftest.need_redis)."""
import shutil
import time

import pytest

from pictures import draw_part3 as pictures_part3
from pictures import draw_wild
from pictures.record import Connected, Dropped, Got, RedisRead, TaggedSent, Timeout, UpstreamReady, UpstreamWrote
from part3 import tagged
import tcp_proxy
from conftest import ROOT, need_redis, transcript_section
from tcp_proxy import FramedProxy

# One worker runs all of these under `make test`'s --dist loadgroup: the runs
# fixture (every Part three picture's scenarios) runs once per worker that needs it.
pytestmark = pytest.mark.xdist_group("test_pictures_part3")

HERE = ROOT
TAPPED = [(FramedProxy, "handle"), (FramedProxy, "exchange"), (FramedProxy, "read_reply"),
          (tcp_proxy, "more_of_reply"), (tagged.TaggedClient, "__init__"), (tagged.TaggedClient, "call"),
          (tagged.TaggedClient, "count"), (tagged.TaggedClient, "on_event"), (tagged.TaggedUpstream, "count"),
          (tagged, "key_of")]
NEEDS_REDIS = {"part3-redis-line-pool.svg"}
SECTIONS = {   # picture -> the transcript sections its run prints
    "part3-redis-line-pool.svg": ["A pool that frames Redis replies by line: the tail goes to the next borrower",
                                  "The pool framed by RESP: 0 wrong"],
    "part3-head-of-line.svg": ["Request ids: replies out of order, each to its caller",
                               "A slow key and the fast keys behind it",
                               "A timed-out call's late reply, dropped by id"],
    "part3-late-reply.svg": ["Request ids: replies out of order, each to its caller",
                             "A slow key and the fast keys behind it",
                             "A timed-out call's late reply, dropped by id"],
    "part3-tagged-out-of-order.svg": ["Request ids: replies out of order, each to its caller",
                                      "A slow key and the fast keys behind it",
                                      "A timed-out call's late reply, dropped by id"],
}


def own_attributes():
    return [vars(owner).get(name) for owner, name in TAPPED]


@pytest.fixture(scope="module")
def runs():
    """{picture: (Recorder, printed, seconds, wrapped attributes before, after)}, each
    recorder run once however many pictures share it; the Redis ones only with redis-server."""
    found, by_recorder = {}, {}
    for name, (record, _) in pictures_part3.PICTURES.items():
        if name in NEEDS_REDIS and not shutil.which("redis-server"):
            continue
        if record not in by_recorder:
            before = own_attributes()
            started = time.monotonic()
            recorder, printed = record()
            by_recorder[record] = (recorder, printed, time.monotonic() - started, before, own_attributes())
        found[name] = by_recorder[record]
    return found


def run_of(runs, name):
    if name in NEEDS_REDIS:
        need_redis()
    return runs[name]


def test_the_checked_in_part3_pictures_are_exactly_the_ones_drawn():
    checked_in = sorted(path.name for path in (HERE / "pictures").glob("part3-*.svg")
                        if path.name != draw_wild.NAME)   # drawn from the redis-py venvs: part3/test_wild.py
    assert checked_in == sorted(pictures_part3.PICTURES)


@pytest.mark.parametrize("name", sorted(pictures_part3.PICTURES))
def test_each_part3_picture_is_what_its_scenarios_draw_now_byte_for_byte(runs, name):
    recorder = run_of(runs, name)[0]
    drawn = pictures_part3.PICTURES[name][1](recorder).render()
    assert drawn == (HERE / "pictures" / name).read_text(encoding="utf-8"), \
        f"pictures/{name} is stale: run `make pictures` and look at it"


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_recording_changes_nothing_the_scenarios_print_and_every_wrap_is_undone(runs, name):
    _, printed, seconds, before, after = run_of(runs, name)
    assert printed == "".join(transcript_section("part3.txt", title) for title in SECTIONS[name])
    assert before == after
    assert seconds < 10


def test_the_line_pool_recording_shows_the_tail_of_as_reply_delivered_to_b(runs):
    recorder = run_of(runs, "part3-redis-line-pool.svg")[0]
    events = pictures_part3.scenario_events(recorder, "line-pool")
    assert [(e.client, e.reply) for e in events if isinstance(e, RedisRead)] == [
        ("A", b"$5\r\n"), ("B", b"hello\r\n"), ("C", b"$5\r\n")]
    replies, _ = pictures_part3.redis_stream(events, 1)
    assert replies == [("A", b"$5\r\nhello\r\n"), ("B", b"$5\r\nworld\r\n")]


def test_the_out_of_order_recording_has_ids_1_2_3_out_and_replies_3_1_2_back(runs):
    recorder = run_of(runs, "part3-tagged-out-of-order.svg")[0]
    events = pictures_part3.scenario_events(recorder, "out-of-order")
    assert [tuple(e) for e in events if isinstance(e, TaggedSent)] == [
        ("A", b"1 GET alpha\n"), ("B", b"2 GET bravo\n"), ("C", b"3 GET charlie\n")]
    assert [e.line for e in events if isinstance(e, Got)] == [
        b"3 charlie=CCCCCCCCCCCC", b"1 alpha=AAAAAAAAAAAA", b"2 bravo=BBBBBBBBBBBB"]


def test_the_slow_key_recording_has_the_fast_replies_pass_it_with_ids_and_wait_behind_it_without(runs):
    recorder = run_of(runs, "part3-head-of-line.svg")[0]
    events = pictures_part3.scenario_events(recorder, "slow-key")
    assert [tagged.parse_tagged(e.line)[0] for e in events if isinstance(e, Got)] == [2, 3, 4, 1]
    untagged = [e for e in events if isinstance(e, (UpstreamReady, UpstreamWrote)) and e.tagged is False]
    first_write = next(index for index, e in enumerate(untagged) if isinstance(e, UpstreamWrote))
    assert sorted(e.key for e in untagged[:first_write]) == ["a", "b", "c", "slow"]
    assert [e.line for e in untagged if isinstance(e, UpstreamWrote)] == [
        "slow=SSSSSSSSSSSS", "a=AAAAAAAAAAAA", "b=BBBBBBBBBBBB", "c=CCCCCCCCCCCC"]


def test_the_late_reply_recording_drops_id_1_after_its_call_gave_up_and_serves_ids_2_and_3(runs):
    recorder = run_of(runs, "part3-late-reply.svg")[0]
    events = pictures_part3.scenario_events(recorder, "late-reply")
    shown = [(type(e).__name__, *e) for e in events if isinstance(e, (TaggedSent, Timeout, Got, Dropped))]
    assert shown == [("TaggedSent", "A", b"1 GET slow\n"), ("Timeout", "A"), ("TaggedSent", "B", b"2 GET next\n"),
                     ("Got", b"1 slow=SSSSSSSSSSSS"), ("Dropped",), ("Got", b"2 next=NNNNNNNNNNNN"),
                     ("TaggedSent", "C", b"3 GET after\n"), ("Got", b"3 after=AAAAAAAAAAAA")]
    assert sum(isinstance(e, Connected) for e in events) == 1


def test_the_redis_picture_has_a_legend_colour_only_for_owners_whose_bytes_it_draws(runs):
    recorder = run_of(runs, "part3-redis-line-pool.svg")[0]
    svg = pictures_part3.draw_redis_line_pool(recorder).render()
    assert ">A's reply</text>" in svg and ">B's reply</text>" in svg and ">C's reply</text>" not in svg
