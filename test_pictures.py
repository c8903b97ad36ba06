"""The pictures in pictures/ are what the scenarios draw now, byte for byte, and each
run that draws one is the demo's own run (it prints the transcript's lines)."""
import re
import socket
import time
from pathlib import Path

import pytest

import demo
import managed
import managed_demo
import pictures
from tcp_proxy import FramedProxy, NaiveProxy, Upstream

HERE = Path(__file__).parent


def transcript_section(transcript, title):
    """The lines a scenario printed under its `== n. title ==` line in a checked-in transcript."""
    text = (HERE / "transcripts" / transcript).read_text(encoding="utf-8")
    sections = re.split(r"^== \d+\. (.*) ==\n", text, flags=re.MULTILINE)
    return dict(zip(sections[1::2], sections[2::2]))[title].rstrip("\n") + "\n"


@pytest.fixture(scope="module")
def rendered():
    """Every picture rendered afresh once for the module, and how long that took."""
    started = time.monotonic()
    svgs = pictures.render_all()
    return svgs, time.monotonic() - started


def test_every_checked_in_picture_is_what_its_scenario_draws_now(rendered):
    svgs, _ = rendered
    checked_in = sorted(path.name for path in (HERE / "pictures").glob("*.svg"))
    assert checked_in == sorted(svgs)
    for name, svg in svgs.items():
        assert (HERE / "pictures" / name).read_text(encoding="utf-8") == svg, \
            f"pictures/{name} is stale: run `make pictures` and look at the result"


def test_every_picture_has_a_title_and_shows_no_port(rendered):
    svgs, _ = rendered
    for name, svg in svgs.items():
        assert re.search(r"<title>[^<]{10,}</title>", svg), name
        assert "127.0.0.1" not in svg, name


def test_all_the_pictures_render_in_under_two_seconds(rendered):
    _, seconds = rendered
    assert seconds < 2.0 * 3   # the target is 2 s; the margin is for a loaded machine


def test_the_runs_that_draw_scenarios_1_and_2_print_the_transcripts_lines():
    for scenario, title in ((demo.interleave, "Two clients' bytes interleave on one upstream socket"),
                            (demo.headline, "Whole requests, one after the other: B gets A's answer")):
        _, printed = pictures.record_naive_relay(scenario)
        assert printed == transcript_section("demo.txt", title)


def test_the_release_picture_counts_what_the_transcript_says_8_of_8_framed_0_of_8_timeout():
    found = pictures.trials(pictures.record_release())
    assert found["framed"][1] == (8, 8) and found["timeout"][1] == (0, 8)
    rows = transcript_section("demo.txt", "Release rule x upstream write pattern, pool cap 1")
    assert "framed   in two parts, paused between    8/8" in rows
    assert "timeout  in two parts, paused between    0/8" in rows


def test_the_interleave_strip_holds_the_19_bytes_and_the_two_requests_nobody_sent():
    recorder, _ = pictures.record_naive_relay(demo.interleave)
    assert pictures.coalesce(recorder.of_kind("forwarded")) == [
        ("A", b"GET alp"), ("B", b"GET beta\n"), ("A", b"ha\n")]
    assert pictures.request_owners(recorder) == [("GET alpGET beta", ["A", "B"]), ("ha", ["A"])]


def test_the_headline_run_delivers_both_replies_to_b_and_the_picture_marks_alphas_red():
    recorder, _ = pictures.record_naive_relay(demo.headline)
    assert pictures.deliveries(recorder) == [
        (b"alpha=AAAAAAAAAAAA\n", [("B", b"alpha=AAAAAAAAAAAA\n")]),
        (b"beta=BBBBBBBBBBBB\n", [("B", b"beta=BBBBBBBBBBBB\n")])]
    svg = pictures.draw_headline(recorder).render()
    assert 'font-weight="bold">alpha=AAAAAAAAAAAA\\n</text>' in svg


def test_a_different_run_draws_a_different_picture_broadcast_writes_to_a_and_b():
    recorder, _ = pictures.record_naive_relay(demo.broadcast)
    assert [clients for _, clients in [(reply, [c for c, _ in pieces])
                                      for reply, pieces in pictures.deliveries(recorder)]] == [
        ["A", "B"], ["A", "B"]]
    svg = pictures.draw_headline(recorder).render()
    assert svg != (HERE / "pictures" / "headline.svg").read_text(encoding="utf-8")
    assert "routed to A (routing: broadcast): B asked for it" in svg


def test_the_recorder_puts_every_method_back():
    before = {(owner, name): vars(owner).get(name) for owner, name in [
        (NaiveProxy, "forward"), (NaiveProxy, "route"), (FramedProxy, "checkout"),
        (FramedProxy, "count"), (Upstream, "reply"), (Upstream, "__init__"),
        (demo.Client, "__init__"), (demo.Client, "send"), (managed.ManagedClient, "_deliver"),
        (managed.ManagedClient, "count"), (managed.ManagedSet, "_note"), (managed.ReliabilityCache, "count"),
        (managed_demo.FaultyUpstream, "close")]}
    pictures.record_naive_relay(demo.interleave)
    pictures.record_release()
    pictures.record_managed(managed_demo.failover)
    after = {key: vars(key[0]).get(key[1]) for key in before}
    assert after == before
    assert "sendall" not in vars(socket.socket)


def test_the_runs_that_draw_part_two_print_the_managed_transcripts_lines():
    for scenario, title in ((managed_demo.dirty_return, "The dirty return: a timed-out call's late reply"),
                            (managed_demo.failover, "Failover with a reliability cache, on the virtual clock")):
        _, printed = pictures.record_managed(scenario)
        assert printed == transcript_section("managed.txt", title)


def test_the_dirty_return_hands_apples_reply_to_banana_only_when_the_timed_out_call_is_forgotten():
    recorder, _ = pictures.record_managed(managed_demo.dirty_return)
    handed = {options: [(what, tone) for _, what, tone, *_ in pictures.dirty_steps(events) if what]
              for options, events in pictures.variants(recorder)}
    assert handed == {
        ("forget", False): [("it leaves the queue", pictures.INK),
                            ("handed to banana: WRONG", pictures.RED), ("no call is owed it", pictures.INK)],
        ("discard", False): [("it stays owed, abandoned", pictures.INK),
                             ("discarded: apple gave up", pictures.GREEN), ("handed to banana", pictures.GREEN)],
        ("discard", True): [("its connection is destroyed", pictures.INK), ("handed to banana", pictures.GREEN)]}


def test_the_failover_picture_has_as_windows_0_to_1_1_to_3_and_3_to_7_seconds():
    recorder, _ = pictures.record_managed(managed_demo.failover)
    assert [(name, start, end) for name, start, end, _ in recorder.of_kind("disabled")] == [
        ("A", 0.0, 1.0), ("A", 1.0, 3.0), ("A", 3.0, 7.0)]
    assert [t for t, _ in recorder.of_kind("call")] == [0.0, 0.5, 1.0, 3.0, 4.0, 7.0]
