"""The demos' verdict lines are computed from the rows above them, so a broken
run prints a verdict that says it is broken. Two of COMMENTARY.md's exercises
break Part one's demo; each is applied to a copy of the project (as
tests/exercises.py does) and the verdict it prints must match its own rows. The
verdict functions are also fed rows by hand, for the cases no exercise reaches.
"""
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import demo
from tests.exercises import EXERCISES, RUN_TIMEOUT, apply
from tcp_proxy import answer


def exercise_that_removes(line):
    found = [exercise for exercise in EXERCISES
             if any(line in removed for removed in exercise.removed)]
    assert len(found) == 1, f"no single exercise removes {line!r}"
    return found[0]


def verdict_of(exercise, *arguments):
    """Apply the exercise to a copy, run `python3 demo.py ARGUMENTS`; its verdict lines."""
    with tempfile.TemporaryDirectory() as scratch:
        problem = apply(exercise, Path(scratch))
        assert problem is None, problem
        run = subprocess.run([sys.executable, "demo.py", *arguments], cwd=scratch,
                             capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert run.returncode == 0, run.stderr
    return [line for line in run.stdout.splitlines() if "verdict:" in line]


# --- the exercises: the verdict changes with the rows ---------------------------------

def test_keeping_bytes_past_a_reply_makes_the_fit_check_answer_each_with_an_error():
    exercise = exercise_that_removes("return reply, frames.rest()")   # exercise 10.2
    assert verdict_of(exercise, "--only", "dishonest") == [
        "  verdict: the pool that trusts hands out 4 of 6 wrong; "
        "the pool that checks closes the connection it was read on and hands out nothing wrong "
        "(6 of 6 answered with an error)"]


def test_without_the_last_writer_line_the_headline_verdict_says_b_holds_neither():
    exercise = exercise_that_removes("self.last = client")   # exercise 10.6
    assert verdict_of(exercise, "--only", "headline") == [
        "  verdict: B holds neither answer (0 bytes); A, who asked for alpha, holds 0"]


# --- the verdict functions, fed rows by hand -------------------------------------------

ALPHA, BETA = answer(b"GET alpha"), answer(b"GET beta")


def test_headline_verdict_names_what_b_holds():
    assert demo.headline_verdict({"A": b"", "B": ALPHA + BETA}) == (
        "  verdict: B holds alpha's answer and its own (37 bytes); A, who asked for alpha, holds 0")
    assert demo.headline_verdict({"A": ALPHA, "B": BETA}) == (
        "  verdict: B holds its own (18 bytes); A, who asked for alpha, holds 19")


def test_broadcast_verdict_claims_a_leak_to_all_only_when_each_holds_anothers():
    assert demo.broadcast_verdict({"A": ALPHA + BETA, "B": ALPHA + BETA}).endswith(
        "both clients hold both answers (37 and 37 bytes): "
        "the other routing rule leaks to everyone")
    assert demo.broadcast_verdict({"A": ALPHA, "B": ALPHA + BETA}) == (
        "  verdict: A holds its own; B holds alpha's answer and its own (19 and 37 bytes): "
        "1 of 2 clients hold another's answer")


def test_interleave_verdict_counts_lost_bytes_and_requests_nobody_sent():
    assert demo.interleave_verdict([[b"GET alpha\n"]], 10, 10, ["GET alpha"]) == (
        "  verdict: nothing lost, nothing doubled, "
        "and the upstream parsed 0 requests that nobody sent")
    assert "4 bytes lost or doubled" in demo.interleave_verdict([[b"GET alpha\n"]], 10, 6, [])


def test_pool_caps_verdict_reports_wrong_rows_and_a_broken_growth_rule():
    assert demo.pool_caps_verdict([(1, 24, 1), (16, 20, 3)], asked=24, in_flight=8) == (
        "  verdict: wrong answers on 1 of 2 rows; connections opened do not follow "
        "min(pool_cap, requests in flight)")


def test_release_verdict_follows_the_framed_and_timeout_rows():
    broken = {("framed", False): 8, ("framed", True): 0,
              ("timeout", False): 8, ("timeout", True): 0}
    assert demo.release_verdict(broken, asked=8, paused=(1, 7)) == (
        "  verdict: the framed pool gets 0/8 when the reply pauses; the timeout rule ends a reply "
        "at its pause, and 7 of 8 clients begin with the end of someone else's answer")
    # the tail row does not add up: no story
    assert demo.release_verdict(broken, asked=8, paused=(0, 3)).endswith(
        "the timeout pool gets 0/8 when the reply pauses")
    healed = {**broken, ("framed", True): 8, ("timeout", True): 8}
    assert demo.release_verdict(healed, asked=8) == (
        "  verdict: the delimiter never notices the pause; the timeout pool survives the pause too")


def test_paused_deliveries_counts_the_own_head_and_the_ends_of_other_answers():
    alpha, bravo, charlie = (answer(b"GET " + word) for word in (b"alpha", b"bravo", b"charlie"))
    received = [("alpha", alpha[:6]),   # the first borrower: its head, then the pause
                ("bravo", alpha[6:] + bravo[:6]),   # the tail of alpha's answer, then its own head
                # bravo's answer whole: bravo's borrower stopped before it came
                ("charlie", bravo)]
    assert demo.paused_deliveries(received) == (1, 2)
    assert demo.paused_deliveries([("alpha", alpha), ("bravo", bravo)]) == (0, 0)


def test_passthrough_serialised_and_half_close_verdicts_follow_their_rows():
    assert demo.passthrough_verdict(20, 24, 8, 2) == (
        "  verdict: 4 of 24 answers wrong, and 8 client connections on 2 upstream")
    assert demo.serialised_verdict(23, 24) == (
        "  verdict: the blind relay gets 1 of 24 wrong even with one answer in flight")
    assert demo.half_close_verdict({True: b"", False: b""}, ALPHA) == (
        "  verdict: passing the EOF on as a half-close delivers 0 of its 19 bytes; "
        "closing forgets that the other direction was still open")


def test_dishonest_verdict_computes_the_growing_shift_from_what_each_borrower_read():
    expected = {"A": [b"a1\n", b"a2\n", b"a3\n"], "B": [b"b1\n", b"b2\n", b"b3\n"]}
    shifted = {"A": [b"a1\n", b"b1\n", b"a2\n"], "B": [b"EXTRA\n"] * 3}   # scenario 9's rows
    rows = {"TrustingPool": (shifted, 1, 0), "FramedProxy": (expected, 6, 6)}
    assert demo.dishonest_verdict(rows, expected).startswith(
        "  verdict: in turn, the borrowers read 0, 1, 2, 3, 4, 5 lines behind their own answers: "
        "each lie adds one; ")


@pytest.mark.parametrize("trusting_right", [6, 1])
def test_dishonest_verdict_says_what_the_trusting_pool_did(trusting_right):
    expected = {"A": [b"a1\n", b"a2\n", b"a3\n"], "B": [b"b1\n", b"b2\n", b"b3\n"]}
    shuffled = {"A": [b"b1\n", b"a2\n", b"a3\n"], "B": [b"a1\n", b"b2\n", b"b3\n"]}
    rows = {"TrustingPool": (expected if trusting_right == 6 else shuffled, trusting_right, 0),
            "FramedProxy": (expected, 6, 6)}
    trust = ("the pool that trusts hands out every answer right" if trusting_right == 6
             else "the pool that trusts hands out 5 of 6 wrong")
    assert demo.dishonest_verdict(rows, expected) == (
        f"  verdict: {trust}; the pool that checks closes the connection it was read on "
        f"and hands out nothing wrong")


# --- Part three's verdicts, fed rows by hand (no redis-server needed) --------------------

def test_part_three_verdicts_follow_their_rows():
    from part3 import part3_demo as part3
    job, value = b"*2\r\n$6\r\njobs-a\r\n$5\r\nhello\r\n", b"$5\r\nworld\r\n"
    assert part3.naive_redis_verdict({"A": job, "B": value}, job, value) == (
        "  verdict: B holds its own value (11 bytes); A holds 27. A's job did not reach B")
    values = {"a": "hello", "b": "world"}
    assert part3.line_pool_verdict([b"$5\r\n", b"$5\r\n"], values) == (
        "  verdict: the line framing stops after b'$5\\r\\n'; B read b'$5\\r\\n', not A's value")
    assert part3.checked_line_pool_verdict(0, 2, 1, 3) == (
        "  verdict: 0 of 3 right, 2 closed as out of step, 1 values delivered to another client")
    assert part3.resp_pool_verdict(21, 24) == (
        "  verdict: 3 of 24 wrong: the pool lent the connection before a reply's end")
    assert part3.out_of_order_verdict(["1 alpha=A", "2 bravo=B"], 1, 2) == (
        "  verdict: the replies left in the order alpha, bravo; 1 of 2 callers got another's reply")
    assert part3.slow_key_verdict(False, 1, 3) == (
        "  verdict: with ids the fast calls still waited for the slow one; "
        "in order, it held back 1 of the 3 replies behind it")
    assert part3.late_reply_verdict([1], 1, False) == (
        "  verdict: the late reply carried id 1, which no call is owed any more: dropped, "
        "but the connection did not serve on")


# --- Part two's per-reply verdict --------------------------------------------------------

def test_managed_reply_verdict_tells_an_error_from_another_keys_value():
    from part2.managed_demo import right
    assert right("GET banana", "banana=BBBBBBBBBBBB") == "right"
    assert right("GET banana", "apple=AAAAAAAAAAAA") == "WRONG"
    assert right("GET banana",
                 "MessageLost: upstream out of step: a reply did not fit its request") == (
        "an error, not a value")
