"""COMMENTARY.md's "Break it yourself" exercises, each answer checked by running it
(tests/exercises.py reads them and applies each). The answer states its evidence in
one of two ways:

- a ```broken block: lines the changed project prints (stdout or stderr),
  contiguous, and which the unchanged project's transcript does not hold, so the
  check could fail;
- for a pytest command, the names of the tests that fail (`test_...`); the
  unchanged project passes them, which the rest of the suite proves.

Each change is applied to a copy of the project in a temporary directory; every
copy's command runs at once, in parallel, so the module costs about as long as its
slowest exercise. Scaffolding, named: each copy's hook timeout is cut to a couple of
seconds, so an exercise whose answer is "the demo gives up waiting" does not wait
the full ten.
"""
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.exercises import EXERCISES, RUN_TIMEOUT, WHY, Exercise, apply, edited
from tests.prose import HERE, contiguous_at

# one worker runs the module: its runs fixture runs every changed copy once
pytestmark = [pytest.mark.xdist_group("test_exercises"), pytest.mark.slow]


def start(exercise, directory):
    """Start the exercise's command in its changed copy; it runs while the others do."""
    words = exercise.command.split()
    argv = [sys.executable] + words[1:]   # python3 or .venv/bin/python: this interpreter
    if words[1:3] == ["-m", "pytest"]:
        argv[3:3] = ["-p", "no:cacheprovider"]
    return subprocess.Popen(argv, cwd=directory, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finish(process):
    out, err = process.communicate(timeout=RUN_TIMEOUT)
    return process.returncode, out, err


def golden_lines():
    return [line for path in (HERE / "transcripts").glob("*.txt")
            for line in path.read_text(encoding="utf-8").splitlines()]


def verdict(exercise, returncode, out, err):
    """What is false about the exercise's answer after its run (empty: all of it holds)."""
    problems = []
    printed = out.splitlines() + err.splitlines()
    for block in exercise.broken:
        if contiguous_at(golden_lines(), block) >= 0:
            problems.append(f"the unchanged transcript already holds {block[0]!r}...: "
                            "this evidence shows nothing")
        if contiguous_at(printed, block) < 0:
            problems.append(f"the changed project did not print {block!r}")
    for name in exercise.failing:
        if not re.search(rf"^FAILED \S+::{name}\b", out, re.M):
            problems.append(f"{name} did not fail")
    if exercise.failing and returncode == 0:
        problems.append("the named tests all passed")
    return problems



def controls():
    """Two harmless changes (a comment added), each claiming one kind of a real exercise's
    evidence and only that kind, so that each check is shown to reject what a run did not
    show: the printed lines of one, the failing tests of another."""
    harmless = (["import contextlib"], ["import contextlib   # changed, harmlessly"])
    shown = next(e for e in EXERCISES if e.broken and not e.failing)
    failed = next(e for e in EXERCISES if e.failing)
    return [Exercise("control-broken", "tcp_proxy.py", *harmless, shown.command, shown.broken, [],
                     shown.fence_line),
            Exercise("control-failing", "tcp_proxy.py", *harmless, failed.command, [],
                     failed.failing, failed.fence_line)]


CONTROLS = controls()


@pytest.fixture(scope="module")
def runs():
    """Every exercise's changed copy, and the controls', run all at once: number ->
    why the change could not be made, or the run's (return code, stdout, stderr)."""
    with tempfile.TemporaryDirectory() as scratch:
        started, results = {}, {}
        for exercise in EXERCISES + CONTROLS:
            directory = Path(scratch) / f"exercise-{exercise.number}"
            directory.mkdir()
            problem = (apply(exercise, directory) if exercise.module and exercise.command
                       else "incomplete")
            if problem:
                results[exercise.number] = problem
            else:
                started[exercise.number] = start(exercise, directory)
        for number, process in started.items():
            results[number] = finish(process)
        yield results


def test_the_commentary_holds_at_least_six_exercises_each_complete():
    assert len(EXERCISES) >= 6
    for exercise in EXERCISES:
        assert exercise.module and (HERE / exercise.module).exists(), exercise
        assert exercise.removed and len(exercise.removed) <= 1 and len(exercise.added) <= 1, (
            f"{exercise}: a one-line change removes one line and adds at most one")
        assert exercise.command, f"{exercise}: the question names no command to run"
        assert exercise.broken or exercise.failing, f"{exercise}: the answer states no evidence"


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: f"exercise{e.number}")
def test_each_diff_as_printed_applies_to_one_place_and_leaves_python_that_compiles(exercise):
    source = (HERE / exercise.module).read_text(encoding="utf-8")
    changed = edited(exercise, source)
    assert not changed.startswith(WHY), changed
    compile(changed, exercise.module, "exec")   # a SyntaxError or IndentationError fails it


def test_a_diff_line_indented_otherwise_than_the_source_applies_nowhere():
    """A removed line must match a whole line of the source: the same line at another
    indentation is another program, and a substring match would have run that one."""
    line = ("                self.last = client   "
            "# looks like the decision; scenario 3 shows it is not the fix")
    assert line in (HERE / "tcp_proxy.py").read_text(encoding="utf-8").splitlines()
    shallower = Exercise(0, "tcp_proxy.py", [line[4:]], [], None, [], [], 0)
    assert edited(shallower, (HERE / "tcp_proxy.py").read_text(encoding="utf-8")).startswith(
        f"{WHY}tcp_proxy.py holds the removed lines 0 times")


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: f"exercise{e.number}")
def test_each_exercise_answer_is_what_its_changed_copy_shows(exercise, runs):
    result = runs[exercise.number]
    assert not isinstance(result, str), f"{exercise}: {result}"
    assert verdict(exercise, *result) == [], exercise


@pytest.mark.parametrize("control", CONTROLS, ids=lambda e: e.number)
def test_the_check_rejects_evidence_that_a_harmless_change_does_not_show(control, runs):
    result = runs[control.number]
    assert not isinstance(result, str), f"{control}: {result}"
    assert result[0] == 0, "the harmless change broke the run"
    rejected = "the changed project did not print" if control.broken else "did not fail"
    assert [problem for problem in verdict(control, *result) if rejected in problem] != []
