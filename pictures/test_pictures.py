"""The pictures in pictures/ are what the scenarios draw now, byte for byte, and each
run that draws one is the demo's own run (it prints the transcript's lines).

The scenarios run once for the whole module (the `runs` fixture); each test reads
what that run recorded."""
import re
import socket
import time

import pytest

import demo
from part2 import managed
from pictures import draw as pictures
from conftest import ROOT, transcript_section
from scaffolding import faults, kit
from tcp_proxy import FramedProxy, NaiveProxy, Upstream

HERE = ROOT
WRAPPED = [(NaiveProxy, "forward"), (NaiveProxy, "route"), (FramedProxy, "checkout"), (FramedProxy, "count"),
           (Upstream, "reply"), (Upstream, "__init__"), (kit.Client, "__init__"), (kit.Client, "send"),
           (managed.ManagedClient, "_deliver"), (managed.ManagedClient, "count"), (managed.ManagedSet, "_note"),
           (managed.ReliabilityCache, "count"), (faults.FaultyUpstream, "close"), (socket.socket, "sendall")]


def own_attributes():
    return {(owner, name): vars(owner).get(name) for owner, name in WRAPPED}


@pytest.fixture(scope="module")
def runs():
    """Every picture's scenario run once: the runs, the seconds they took, and the
    classes' own attributes before and after."""
    before = own_attributes()
    started = time.monotonic()
    recorded = pictures.record_all()
    return recorded, time.monotonic() - started, before, own_attributes()


def test_every_checked_in_picture_is_what_its_scenario_draws_now(runs):
    svgs = pictures.render_all(runs[0])
    checked_in = sorted(path.name for path in (HERE / "pictures").glob("*.svg")
                        if not path.name.startswith("part3-"))   # test_pictures_part3.py checks those
    assert checked_in == sorted(svgs)
    for name, svg in svgs.items():
        assert (HERE / "pictures" / name).read_text(encoding="utf-8") == svg, \
            f"pictures/{name} is stale: run `make pictures` and look at the result"


def test_every_picture_has_a_title_and_shows_no_address_or_port(runs):
    for name, svg in pictures.render_all(runs[0]).items():
        assert re.search(r"<title>[^<]{10,}</title>", svg), name
        shown = " ".join(re.findall(r"<text[^>]*>([^<]*)</text>", svg))
        assert "127.0.0.1" not in shown, name
        assert [figure for figure in re.findall(r"\d+", shown) if int(figure) >= 1024] == [], name


def test_all_the_scenarios_behind_the_pictures_run_in_under_six_seconds(runs):
    assert runs[1] < 6.0   # about 0.7 s on an idle machine; the margin is for a loaded one


def test_the_recorder_puts_every_method_back(runs):
    _, _, before, after = runs
    assert after == before
    assert before[(socket.socket, "sendall")] is None   # inherited from _socket.socket, never wrapped for good


def test_the_runs_that_draw_scenarios_1_and_2_print_the_transcripts_lines(runs):
    recorded = runs[0]
    assert recorded["interleave.svg"][1] == transcript_section(
        "demo.txt", "Two clients' bytes interleave on one upstream socket")
    assert recorded["headline.svg"][1] == transcript_section(
        "demo.txt", "Whole requests, one after the other")


def test_the_runs_that_draw_part_two_print_the_managed_transcripts_lines(runs):
    recorded = runs[0]
    assert recorded["dirty-return.svg"][1] == transcript_section(
        "managed.txt", "The dirty return: a timed-out call's late reply")
    assert recorded["failover-windows.svg"][1] == transcript_section(
        "managed.txt", "Failover with a reliability cache, on the virtual clock")


def test_the_release_picture_counts_what_the_transcript_says_8_of_8_framed_0_of_8_timeout(runs):
    found = pictures.trials(runs[0]["release.svg"][0])
    assert found["framed"][1] == 8 and found["timeout"][1] == 0
    assert pictures.tally(found["framed"][0])[4] == pictures.tally(found["timeout"][0])[4] == 8
    rows = transcript_section("demo.txt", "Release rule x upstream write pattern, pool cap 1")
    assert "framed   in two parts, paused between    8/8" in rows
    assert "timeout  in two parts, paused between    0/8" in rows


def test_the_timeout_rule_hands_b_the_tail_of_as_answer_and_c_the_tail_of_bs(runs):
    events, _ = pictures.trials(runs[0]["release.svg"][0])["timeout"]
    assert [event[2:4] for event in events if event[0] == "read"][:3] == [
        ("A", b"alpha="), ("B", b"AAAAAAAAAAAA\nbravo="), ("C", b"BBBBBBBBBBBB\ncharli")]


def test_the_interleave_strip_holds_the_19_bytes_and_the_two_requests_nobody_sent(runs):
    recorder = runs[0]["interleave.svg"][0]
    assert pictures.coalesce(recorder.of_kind("forwarded")) == [
        ("A", b"GET alp"), ("B", b"GET beta\n"), ("A", b"ha\n")]
    assert pictures.request_owners(recorder) == [("GET alpGET beta", ["A", "B"]), ("ha", ["A"])]


def test_the_headline_run_delivers_both_replies_to_b_and_the_picture_marks_alphas_red(runs):
    recorder = runs[0]["headline.svg"][0]
    assert pictures.deliveries(recorder) == [
        (b"alpha=AAAAAAAAAAAA\n", [("B", b"alpha=AAAAAAAAAAAA\n")]),
        (b"beta=BBBBBBBBBBBB\n", [("B", b"beta=BBBBBBBBBBBB\n")])]
    svg = pictures.draw_headline(recorder).render()
    assert 'font-weight="bold">alpha=AAAAAAAAAAAA\\n</text>' in svg


def test_a_different_run_draws_a_different_picture_broadcast_writes_to_a_and_b():
    recorder, _ = pictures.record_naive_relay(demo.broadcast)
    targets = [[client for client, _ in pieces] for _, pieces in pictures.deliveries(recorder)]
    assert targets and all(clients == ["A", "B"] for clients in targets)   # one read or two: the scheduler's
    svg = pictures.draw_headline(recorder).render()
    assert svg != (HERE / "pictures" / "headline.svg").read_text(encoding="utf-8")
    assert "(routing: broadcast)" in svg


def test_the_dirty_return_hands_apples_reply_to_banana_only_when_the_timed_out_call_is_forgotten(runs):
    recorder = runs[0]["dirty-return.svg"][0]
    handed = {options: [(what, tone) for _, what, tone, *_ in pictures.dirty_steps(events) if what]
              for options, events in pictures.variants(recorder)}
    assert handed == {
        ("forget", False): [("it leaves the queue", pictures.INK),
                            ("handed to banana: WRONG", pictures.RED), ("no call is owed it", pictures.INK)],
        ("discard", False): [("it stays owed, abandoned", pictures.INK),
                             ("discarded: apple gave up", pictures.GREEN), ("handed to banana", pictures.GREEN)],
        ("discard", True): [("its connection is destroyed", pictures.INK), ("handed to banana", pictures.GREEN)]}


def test_the_failover_picture_has_as_windows_0_to_1_1_to_3_and_3_to_7_seconds(runs):
    recorder = runs[0]["failover-windows.svg"][0]
    assert [(name, start, end) for name, start, end, _ in recorder.of_kind("disabled")] == [
        ("A", 0.0, 1.0), ("A", 1.0, 3.0), ("A", 3.0, 7.0)]
    assert [t for t, _ in recorder.of_kind("call")] == [0.0, 0.5, 1.0, 3.0, 4.0, 7.0]


def test_the_dishonest_run_prints_the_transcripts_lines_and_the_picture_counts_what_it_says(runs):
    recorder, printed = runs[0]["dishonest.svg"]
    assert printed == transcript_section("demo.txt", "An upstream that says one line nobody asked for")
    found = pictures.trials(recorder, by_kind=True)
    # (right, another client's answer, dirty connections closed, connections opened, borrows)
    assert pictures.tally(found["TrustingPool"][0]) == (1, 1, 0, 1, 6)
    assert pictures.tally(found["FramedProxy"][0]) == (6, 0, 6, 6, 6)
    assert "right 1/6   another client's answer 1" in printed
    assert "right 6/6   another client's answer 0   dirty connections closed 6" in printed
