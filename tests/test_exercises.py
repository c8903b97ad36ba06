"""COMMENTARY.md's "Break it yourself" exercises, each answer checked by running it.

An exercise in the commentary is a ```diff block (a one-line change to the module
named, as for a python slice, by the last backticked *.py in the paragraph before
it), then a question that names one command to run (`python3 demo.py ...` or
`.venv/bin/python -m pytest ...`), then the answer folded under <details>. The
answer states its evidence in one of two ways:

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
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.prose import HERE, MODULE, contiguous_at, fenced_blocks, text

# One worker runs all of these under `make test`'s --dist loadgroup: the runs
# fixture (nine changed copies of the project, each run) runs once per worker that needs it.
pytestmark = [pytest.mark.xdist_group("test_exercises"), pytest.mark.slow]

COPIED = ["*.ini", "*.cfg", "*.toml", "transcripts/*.txt"]   # what a run needs, with every *.py and *.pyc
HOOK_TIMEOUT = re.compile(r"^(\s*hook_timeout = )[\d.]+", re.M)
SHORT_HOOK_TIMEOUT = "2.0"   # scaffolding: a missing event is reported in 2 s, not 10
COMMAND = re.compile(r"`((?:python3|\.venv/bin/python) (?:demo\.py|-m pytest)[^`]*)`"
                     r"|<code>((?:python3|\.venv/bin/python) (?:demo\.py|-m pytest)[^<]*)</code>")
RUN_TIMEOUT = 120   # seconds; a run that takes this long is a bug in the exercise


class Exercise:
    """One exercise as the commentary states it: the change, the command, the evidence."""

    def __init__(self, number, module, removed, added, command, broken, failing, fence_line):
        self.number, self.module, self.removed, self.added = number, module, removed, added
        self.command, self.broken, self.failing, self.fence_line = command, broken, failing, fence_line

    def __repr__(self):
        return f"exercise {self.number} (line {self.fence_line}, {self.module})"


def exercises(source=None):
    """Every ```diff block of the commentary, with the question and answer after it."""
    source = source if source is not None else text()
    lines = source.splitlines()
    blocks = fenced_blocks(source)
    found = []
    for info, body, fence_line, before in blocks:
        if info != "diff":
            continue
        named = MODULE.findall(before)
        after_fence = "\n".join(lines[fence_line + len(body) + 1:])
        span = after_fence.split("</details>", 1)[0]
        answer = span.split("<details>", 1)[1] if "<details>" in span else ""
        question = span.split("<details>", 1)[0]
        command = COMMAND.search(question)
        span_start = fence_line + len(body) + 1
        span_end = span_start + span.count("\n") + 1
        broken = [b for kind, b, line, _ in blocks
                  if kind == "broken" and span_start < line <= span_end]
        found.append(Exercise(
            number=len(found) + 1,
            module=named[-1] if named else None,
            removed=[line[1:] for line in body if line.startswith("-")],
            added=[line[1:] for line in body if line.startswith("+")],
            command=(command.group(1) or command.group(2)) if command else None,
            broken=broken,
            failing=re.findall(r"\b(test_\w+)", answer) if "pytest" in (command and command.group(0) or "") else [],
            fence_line=fence_line))
    return found


@functools.cache   # every copy needs the same files; the tree does not change during a run
def project_files():
    """The files a run needs, relative to the project: every *.py, and COPIED. Hidden folders
    (.venv and the like: not the project's, and thousands of files) are not walked into.
    The compiled modules in __pycache__ come too: copied with their sources' times, they
    spare each of the nine runs compiling the modules afresh, and the one module an
    exercise changes is newer than its compiled copy, so Python compiles that one again."""
    found = [path.relative_to(HERE) for pattern in COPIED for path in HERE.glob(pattern)]
    for folder, subfolders, names in os.walk(HERE):
        subfolders[:] = [name for name in subfolders if not name.startswith(".")]
        found += [Path(folder).relative_to(HERE) / name for name in names if name.endswith((".py", ".pyc"))]
    return sorted(found)


WHY = "cannot apply: "   # what edited() returns in front of its reason


def places(exercise, source):
    """Where in source the exercise's removed lines stand, whole lines, indentation and all."""
    lines, removed = source.splitlines(), exercise.removed
    return [n for n in range(len(lines) - len(removed) + 1) if lines[n:n + len(removed)] == removed]


def edited(exercise, source):
    """The source with the exercise's diff applied exactly as printed, or WHY and the reason:
    the removed lines must stand, as whole lines, in exactly one place."""
    found = places(exercise, source)
    if len(found) != 1:
        return f"{WHY}{exercise.module} holds the removed lines {len(found)} times, not once: {exercise.removed!r}"
    lines = source.splitlines()
    start = found[0]
    lines[start:start + len(exercise.removed)] = exercise.added
    return "\n".join(lines) + "\n"


def apply(exercise, directory):
    """Copy the project into directory and make the exercise's change there.
    Returns None, or why the change could not be made."""
    for path in project_files():
        target = directory / path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(HERE / path, target)   # with its time, which a compiled copy is checked against
    module = directory / exercise.module
    changed = edited(exercise, module.read_text(encoding="utf-8"))
    if changed.startswith(WHY):
        return changed.removeprefix(WHY)
    module.write_text(changed, encoding="utf-8")
    hooks = directory / "tcp_proxy.py"
    shortened, replaced = HOOK_TIMEOUT.subn(r"\g<1>" + SHORT_HOOK_TIMEOUT, hooks.read_text())
    if replaced != 1:
        return "tcp_proxy.py no longer sets hook_timeout on a line of its own"
    hooks.write_text(shortened)
    return None


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


EXERCISES = exercises()


def controls():
    """Two harmless changes (a comment added), each claiming one kind of a real exercise's
    evidence and only that kind, so that each check is shown to reject what a run did not
    show: the printed lines of one, the failing tests of another."""
    harmless = (["import contextlib"], ["import contextlib   # changed, harmlessly"])
    shown = next(e for e in EXERCISES if e.broken and not e.failing)
    failed = next(e for e in EXERCISES if e.failing)
    return [Exercise("control-broken", "tcp_proxy.py", *harmless, shown.command, shown.broken, [],
                     shown.fence_line),
            Exercise("control-failing", "tcp_proxy.py", *harmless, failed.command, [], failed.failing,
                     failed.fence_line)]


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
            problem = apply(exercise, directory) if exercise.module and exercise.command else "incomplete"
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
    line = "                self.last = client   # looks like the decision; scenario 3 shows it is not the fix"
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
