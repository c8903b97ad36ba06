"""The pictures in pictures/ are what the scenarios draw now, byte for byte, and each
run that draws one is the demo's own run (it prints the transcript's lines)."""
import re
import socket
import time
from pathlib import Path

import pytest

import demo
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
        (demo.Client, "__init__"), (demo.Client, "send")]}
    pictures.record_naive_relay(demo.interleave)
    pictures.record_release()
    after = {key: vars(key[0]).get(key[1]) for key in before}
    assert after == before
    assert "sendall" not in vars(socket.socket)
