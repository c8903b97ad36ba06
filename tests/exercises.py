"""tests.exercises: reading COMMENTARY.md's "Break it yourself" exercises and applying
each to a copy of the project, for the tests that check them (test_exercises,
test_verdicts). Not a test file.

An exercise in the commentary is a ```diff block (a one-line change to the module
named, as for a python slice, by the last backticked *.py in the paragraph before
it), then a question that names one command to run (`python3 demo.py ...` or
`.venv/bin/python -m pytest ...`), then the answer folded under <details>. The diff is
applied exactly as printed: each removed line must be a whole line of the module,
indentation included, standing in one place.
"""
import functools
import os
import re
import shutil
from pathlib import Path

from tests.prose import HERE, MODULE, fenced_blocks, text

# what a run needs, with every *.py and *.pyc
COPIED = ["*.ini", "*.cfg", "*.toml", "transcripts/*.txt"]
HOOK_TIMEOUT = re.compile(r"^(\s*hook_timeout = )[\d.]+", re.M)
SHORT_HOOK_TIMEOUT = "2.0"   # scaffolding: a missing event is reported in 2 s, not 10
COMMAND = re.compile(r"`((?:python3|\.venv/bin/python) (?:demo\.py|-m pytest)[^`]*)`"
                     r"|<code>((?:python3|\.venv/bin/python) (?:demo\.py|-m pytest)[^<]*)</code>")
RUN_TIMEOUT = 120   # seconds; a run that takes this long is a bug in the exercise


class Exercise:
    """One exercise as the commentary states it: the change, the command, the evidence."""

    def __init__(self, number, module, removed, added, command, broken, failing, fence_line):
        self.number, self.module, self.removed, self.added = number, module, removed, added
        self.command, self.broken, self.failing, self.fence_line = (
            command, broken, failing, fence_line)

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
            failing=(re.findall(r"\b(test_\w+)", answer)
                     if "pytest" in (command and command.group(0) or "") else []),
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
        found += [Path(folder).relative_to(HERE) / name
                  for name in names if name.endswith((".py", ".pyc"))]
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
        return (f"{WHY}{exercise.module} holds the removed lines {len(found)} times, not once: "
                f"{exercise.removed!r}")
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
        # with its time, which a compiled copy is checked against
        shutil.copy2(HERE / path, target)
    module = directory / exercise.module
    changed = edited(exercise, module.read_text(encoding="utf-8"))
    if changed.startswith(WHY):
        return changed.removeprefix(WHY)
    module.write_text(changed, encoding="utf-8")
    hooks = directory / "ground" / "server.py"
    shortened, replaced = HOOK_TIMEOUT.subn(r"\g<1>" + SHORT_HOOK_TIMEOUT, hooks.read_text())
    if replaced != 1:
        return "ground/server.py no longer sets hook_timeout on a line of its own"
    hooks.write_text(shortened)
    return None


EXERCISES = exercises()
