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
from pictures.record import Attempt, Disabled, Forwarded, SetCall, Step
from pictures.svg import RED, colours, visible
from conftest import ROOT, transcript_section
from scaffolding import faults, kit
from tcp_proxy import FramedProxy, NaiveProxy, Upstream

# One worker runs all of these under `make test`'s --dist loadgroup: the runs
# fixture (every picture's scenarios) runs once per worker that needs it.
pytestmark = pytest.mark.xdist_group("test_pictures")

HERE = ROOT
TAPPED = [(NaiveProxy, "forward"), (NaiveProxy, "route"), (FramedProxy, "checkout"),
          (FramedProxy, "exchange"), (FramedProxy, "checkin"), (Upstream, "reply"),
          (Upstream, "__init__"),
          (kit.Client, "__init__"), (kit.Client, "send"), (managed.ManagedClient, "__init__"),
          (managed.ManagedSet, "call"),
          (faults.FaultyUpstream, "reply"), (faults.FaultyUpstream, "close"),
          (faults.FaultyUpstream, "restart"),
          (demo, "release_received"), (demo, "dishonest_trial")]


def own_attributes():
    return {(owner, name): vars(owner).get(name) for owner, name in TAPPED}


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
    # test_pictures_part3.py checks those
    checked_in = sorted(path.name for path in (HERE / "pictures").glob("*.svg")
                        if not path.name.startswith("part3-"))
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
    # an own method put back (an inherited one: Part three's)
    assert before[(Upstream, "__init__")] is not None


def test_the_recorder_taps_no_private_method_and_no_socket():
    source = (HERE / "pictures" / "record.py").read_text(encoding="utf-8")
    tapped = re.findall(r"\.tap\((?:[\w.]+), \"(\w+)\"", source)
    assert len(tapped) > 15 and not [name for name in tapped
                                     if name.startswith("_") and not name.endswith("__")]
    assert "socket" not in re.findall(r"\.tap\(([\w.]+),", source)
    assert vars(socket.socket).get("sendall") is None


def test_the_runs_that_draw_the_first_two_scenarios_print_the_transcripts_lines(runs):
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


def test_release_run_is_the_demos_own_and_picture_counts_right_answers_per_rule_and_pattern(runs):
    recorder, printed = runs[0]["release.svg"]
    assert printed == transcript_section("demo.txt",
                                         "Release rule x upstream write pattern, pool cap 1")
    found = pictures.trials(recorder)
    assert {label: pictures.tally(lent)[0] for label, (lent, _) in found.items()} == {
        ("framed", False): 8, ("framed", True): 8, ("timeout", False): 8, ("timeout", True): 0}
    assert (pictures.tally(found["framed", True][0])[4]
            == pictures.tally(found["timeout", True][0])[4] == 8)


def test_the_timeout_rule_hands_b_the_tail_of_as_answer_and_c_the_tail_of_bs(runs):
    lent, _ = pictures.trials(runs[0]["release.svg"][0])["timeout", True]
    assert [(b.client, b.reply) for b in lent][:3] == [
        ("A", b"alpha="), ("B", b"AAAAAAAAAAAA\nbravo="), ("C", b"BBBBBBBBBBBB\ncharli")]
    # (outline, bytes): the framed rows' 6, then these
    boxes = re.findall(r'stroke="(#\w+)" stroke-width="[\d.]+" rx="3"/>\n'
                       r'<text [^>]*>([^<]*)</text>',
                       pictures.render_all(runs[0])["release.svg"])
    assert boxes[6:9] == [(colours("A")[1], "alpha="), (RED, "AAAAAAAAAAAA\\n"),
                          (colours("B")[1], "bravo=")]


def test_the_interleave_strip_holds_every_forwarded_byte_and_the_requests_nobody_sent(runs):
    recorder = runs[0]["interleave.svg"][0]
    assert b"".join(e.data for e in recorder.of(Forwarded)) == b"GET alpGET beta\nha\n"
    assert ("".join(e.client * len(e.data) for e in recorder.of(Forwarded))
            == "A" * 7 + "B" * 9 + "A" * 3)
    assert pictures.request_owners(recorder) == [("GET alpGET beta", ["A", "B"]), ("ha", ["A"])]


def test_the_headline_run_delivers_both_replies_to_b_and_the_picture_marks_alphas_red(runs):
    recorder = runs[0]["headline.svg"][0]
    assert pictures.deliveries(recorder) == [
        (b"alpha=AAAAAAAAAAAA\n", [("B", b"alpha=AAAAAAAAAAAA\n")]),
        (b"beta=BBBBBBBBBBBB\n", [("B", b"beta=BBBBBBBBBBBB\n")])]
    svg = pictures.draw_headline(recorder).render()
    assert 'font-weight="bold">alpha=AAAAAAAAAAAA\\n</text>' in svg


def test_a_different_run_draws_a_different_picture_broadcast_writes_to_a_and_b():
    recorder, _ = pictures.record_part_one(demo.broadcast)
    targets = [[client for client, _ in pieces] for _, pieces in pictures.deliveries(recorder)]
    # one read or two: the scheduler's
    assert targets and all(clients == ["A", "B"] for clients in targets)
    svg = pictures.draw_headline(recorder).render()
    assert svg != (HERE / "pictures" / "headline.svg").read_text(encoding="utf-8")
    assert "(routing: broadcast)" in svg


def test_dirty_return_hands_apples_reply_to_banana_only_when_the_timed_out_call_is_forgotten(runs):
    steps = {}   # client -> its steps
    for step in runs[0]["dirty-return.svg"][0].of(Step):
        steps.setdefault(step.client, []).append(step)
    # (what the timeout or reply did, drawn red) after each request
    handed = {(client.late_replies, client.msg_timeout_is_fatal): [
        (row[-1].split(";")[0], row[-2]) for row in pictures.dirty_rows(events)
        if not row[-1].startswith("t=")]
        for client, events in steps.items()}
    assert handed == {
        ("forget", False): [("owes: nothing", False), ("to banana: WRONG", True),
                            ("no call was owed it", False)],
        ("discard", False): [("owes: apple (abandoned)", False),
                             ("discarded: apple gave up", False),
                             ("to banana", False)],
        ("discard", True): [("connection 1 closed", False), ("to banana", False)]}


def test_the_failover_picture_has_as_windows_each_twice_as_long_as_the_last(runs):
    recorder = runs[0]["failover-windows.svg"][0]
    a = recorder.of(Attempt)[0].set.services[0][0]   # A's address
    assert [(e.service, e.start, e.end) for e in recorder.of(Disabled)] == [
        (a, 0.0, 1.0), (a, 1.0, 3.0), (a, 3.0, 7.0)]
    assert [e.t for e in recorder.of(SetCall)] == [0.0, 0.5, 1.0, 3.0, 4.0, 7.0]


def test_the_dishonest_run_prints_the_transcripts_lines_and_the_picture_counts_what_it_says(runs):
    recorder, printed = runs[0]["dishonest.svg"]
    assert printed == transcript_section("demo.txt",
                                         "An upstream that says one line nobody asked for")
    found = pictures.trials(recorder)
    # (right, another client's answer, dirty connections closed, connections opened, borrows)
    assert pictures.tally(found["TrustingPool"][0]) == (1, 1, 0, 1, 6)
    assert pictures.tally(found["FramedProxy"][0]) == (6, 0, 6, 6, 6)
    assert "right 1/6   another client's answer 1" in printed
    assert "right 6/6   another client's answer 0   dirty connections closed 6" in printed


def svg_width(svg):
    return float(re.search(r'<svg [^>]*width="([\d.]+)"', svg).group(1))


def test_the_release_picture_stacks_its_trials_no_wider_than_the_other_pictures(runs):
    svgs = pictures.render_all(runs[0])
    assert svg_width(svgs["release.svg"]) <= max(svg_width(svg) for name, svg in svgs.items()
                                                 if name != "release.svg")
    assert svg_width(svgs["release.svg"]) < 1200


def test_dishonest_picture_shows_later_trustingpool_borrowers_taking_the_line_past_the_last(runs):
    # 6 writes of a reply and EXTRA
    written = pictures.trials(runs[0]["dishonest.svg"][0])["TrustingPool"][1]
    shown = re.findall(r">([^<]*)</text>", pictures.render_all(runs[0])["dishonest.svg"])
    # TrustingPool's rows: the boxes each borrower got,
    # drawn between "X sent ... got" and its verdict
    rows = []
    for start in [index + 1 for index, text in enumerate(shown) if text.endswith(" got")][:6]:
        rows.append(shown[start:next(i for i in range(start, len(shown))
                                     if shown[i] in ("right", "wrong"))])
    lines = b"".join(e.data for e in written).splitlines(keepends=True)
    # one line each, the one past the last borrower's
    assert rows == [[visible(line)] for line in lines[:6]]
    assert [row[0] for row in rows[1::2]] == ["EXTRA\\n"] * 3


def test_the_failover_picture_tries_a_only_as_each_window_ends_and_says_so(runs):
    recorder = runs[0]["failover-windows.svg"][0]
    tried_a, t = [], None   # the times of the calls that tried A
    for e in recorder.events:
        if isinstance(e, SetCall):
            t = e.t
        elif isinstance(e, Attempt) and e.index == 0 and t not in tried_a:
            tried_a.append(t)
    assert tried_a == [0.0] + [e.end for e in recorder.of(Disabled)] == [0.0, 1.0, 3.0, 7.0]
    svg = pictures.render_all(runs[0])["failover-windows.svg"]
    assert svg.count(">B ok</text>") == 5 and svg.count(">A CommunicationError</text>") == 3
    assert ">A ok</text>" in svg


def test_the_failover_picture_says_a_restarted_only_after_a_call_had_failed_on_it(runs):
    recorder = runs[0]["failover-windows.svg"][0]
    order = [(type(e).__name__, e.t) for e in recorder.events
             if type(e).__name__ in ("SetCall", "Service")]
    assert (order.index(("SetCall", 3.0)) < order.index(("Service", 3.0))
            < order.index(("SetCall", 4.0)))
    svg = pictures.render_all(runs[0])["failover-windows.svg"]
    assert (">restarted at t=3.0s, after that call</text>" in svg
            and ">A, the upstream</text>" in svg)
