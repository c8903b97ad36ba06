"""Part three's pictures in pictures/ are what its scenarios draw now, byte for byte,
and the run that draws each one is the demo's own run (it prints the transcript's lines).

The scenarios run once for the whole module (the `runs` fixture), against a real
redis-server where they need one: without it these tests skip, except under CI=true,
where they fail (test_resp.need_redis)."""
import time
from pathlib import Path

import pytest

import pictures_part3
import tcp_proxy
from test_pictures import transcript_section
from test_resp import need_redis
from tcp_proxy import FramedProxy

HERE = Path(__file__).parent
WRAPPED = [(FramedProxy, "handle"), (FramedProxy, "exchange"), (FramedProxy, "read_reply")]


@pytest.fixture(scope="module")
def runs():
    """Every picture's scenarios run once: {file name: (Recorder, printed)}, the seconds
    that took, and the wrapped attributes before and after."""
    need_redis()
    before = [vars(owner).get(name) for owner, name in WRAPPED] + [tcp_proxy.more_of_reply]
    started = time.monotonic()
    recorded = {name: record() for name, (record, _) in pictures_part3.PICTURES.items()}
    seconds = time.monotonic() - started
    after = [vars(owner).get(name) for owner, name in WRAPPED] + [tcp_proxy.more_of_reply]
    return recorded, seconds, before, after


def test_the_checked_in_part3_pictures_are_exactly_the_ones_drawn():
    checked_in = sorted(path.name for path in (HERE / "pictures").glob("part3-*.svg"))
    assert checked_in == sorted(pictures_part3.PICTURES)


@pytest.mark.parametrize("name", sorted(pictures_part3.PICTURES))
def test_each_part3_picture_is_what_its_scenarios_draw_now_byte_for_byte(runs, name):
    recorder, _ = runs[0][name]
    drawn = pictures_part3.PICTURES[name][1](recorder).render()
    assert drawn == (HERE / "pictures" / name).read_text(encoding="utf-8"), \
        f"pictures/{name} is stale: run `make pictures` and look at it"


def test_recording_changes_nothing_the_scenarios_print_and_every_wrap_is_undone(runs):
    recorded, seconds, before, after = runs
    _, printed = recorded["part3-redis-line-pool.svg"]
    expected = (transcript_section("part3.txt", "A pool that frames Redis replies by line: "
                                   "the tail goes to the next borrower")
                + transcript_section("part3.txt", "The pool framed by RESP: 0 wrong"))
    assert printed == expected
    assert before == after
    assert seconds < 10


def test_the_line_pool_recording_shows_the_tail_of_as_reply_delivered_to_b(runs):
    recorder, _ = runs[0]["part3-redis-line-pool.svg"]
    reads = [event[1:] for event in pictures_part3.scenario_events(recorder, "line-pool") if event[0] == "read"]
    assert [(client, reply) for client, _, _, _, reply, _ in reads] == [
        ("A", b"$5\r\n"), ("B", b"hello\r\n"), ("C", b"$5\r\n")]
    replies, _ = pictures_part3.redis_stream(pictures_part3.scenario_events(recorder, "line-pool"), 1)
    assert replies == [("A", b"$5\r\nhello\r\n"), ("B", b"$5\r\nworld\r\n")]
