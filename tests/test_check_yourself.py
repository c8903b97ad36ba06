"""COMMENTARY.md's commands that no exercise runs, each run as printed and checked against
what the commentary says it shows:

- "Check yourself": each question whose <summary> holds a command in <code> (a program
  and its arguments, HTML entities unescaped) runs it from the project's root, and its
  check holds the folded answer against the output, reading the answer's numbers where
  it states them;
- appendix A.1's ```sh recipe (a scratch copy, one line of demo.py deleted by `sed`,
  forty runs of scenario 1 tallied by hash);
- section 10's ```sh recipe (the scratch copy every exercise starts from).

A recipe runs in bash from the project's root as printed, with one substitution, named:
its scratch folder (the one /tmp/ path it names) becomes a folder of the test's own, so
that a run neither needs nor clobbers /tmp. `python3` is this suite's interpreter: its
folder leads PATH. Every command and recipe starts at once, in parallel, so the module
costs about as long as its slowest run (A.1's forty demos).

Each check is shown to fail: a question's command broken (a name misspelt), an answer
that states another number, a `sed` pattern that matches no line, a tally short of its
runs, a copy short of a tracked file.
"""
import html
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.prose import HERE, fenced_blocks, section, text

# one worker runs the module: its runs fixture starts every command once
pytestmark = [pytest.mark.xdist_group("test_check_yourself"), pytest.mark.slow]

RUN_TIMEOUT = 120   # seconds; a run that takes this long is a bug in the commentary
SCRATCH = re.compile(r"/tmp/[\w.-]+")
ENVIRONMENT = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}"
                                     f"{os.environ.get('PATH', '')}"}


# --- reading the commentary -----------------------------------------------------------

class Question:
    """One "Check yourself" question: its summary, the command in it, the folded answer."""

    def __init__(self, number, summary, command, answer):
        self.number, self.summary, self.command, self.answer = number, summary, command, answer

    def __repr__(self):
        return f"question {self.number}: {self.command}"


def questions(source=None):
    """Every <details> of section 9 that holds a command in its <summary>."""
    found = []
    part = section(r"Check yourself", source)
    for summary, answer in re.findall(r"<summary>(.*?)</summary>(.*?)</details>", part, re.S):
        codes = [html.unescape(code) for code in re.findall(r"<code>(.*?)</code>", summary, re.S)]
        commands = [code.strip() for code in codes if " " in code.strip()]
        if not commands:
            continue
        number = re.match(r"\s*(\d+)", summary)
        prose = html.unescape(re.sub(r"<code>.*?</code>", "CODE", summary, flags=re.S))
        found.append(Question(number.group(1) if number else f"#{len(found) + 1}",
                              prose, commands[-1] if len(commands) == 1 else commands,
                              html.unescape(answer).strip()))
    return found


def recipe(title_pattern, source=None):
    """The first ```sh block under the heading matching title_pattern, as one script."""
    blocks = [body for info, body, _, _ in fenced_blocks(section(title_pattern, source))
              if info == "sh"]
    return "\n".join(blocks[0]) + "\n" if blocks else ""


def scratch_of(script):
    """The one /tmp/ path a recipe names (its scratch folder), or None."""
    paths = set(SCRATCH.findall(script))
    return paths.pop() if len(paths) == 1 else None


def numbers(answer):
    """The whole numbers the answer states, in order; a fraction's parts (8/8) are not."""
    return [int(n) for n in re.findall(r"(?<![\w/.])\d+(?![\w/.])", answer)]


QUESTIONS = questions()
A1_RECIPE = recipe(r"^A\.1\b")
BREAK_RECIPE = recipe(r"Break it yourself")


# --- what each command shows ----------------------------------------------------------
# A check takes the question and its run's output, and returns what is false about the
# answer (empty: all of it holds).

def pool_rows(out):
    """pool_cap -> connections opened, from scenario 5's table."""
    return {int(cap): int(opened) for cap, opened in
            re.findall(r"^\s*(\d+)\s+\d+/\d+\s+(\d+)\s+[\d.]+\s*$", out, re.M)}


def check_pool(question, out):
    """The answer's first number is the connections opened at the question's cap, by as
    many clients as the question says."""
    cap = re.search(r"\bcap\D{0,12}?(\d+)", question.summary)
    clients = re.search(r"(\d+) clients", question.summary)
    shown_clients = re.search(r"(\d+) clients", out)
    if not (cap and clients and numbers(question.answer)):
        return ["the question names no cap or no clients, or the answer no number"]
    problems, expected = [], numbers(question.answer)[0]
    if not shown_clients or shown_clients.group(1) != clients.group(1):
        problems.append(f"the demo does not run {clients.group(1)} clients")
    opened = pool_rows(out).get(int(cap.group(1)))
    if opened != expected:
        problems.append(f"at cap {cap.group(1)} the demo opens {opened}, not {expected}")
    return problems


def check_printed(question, out):
    """The command prints one number: the answer's first."""
    if not numbers(question.answer):
        return ["the answer states no number"]
    if out.strip() != str(numbers(question.answer)[0]):
        return [f"printed {out.strip()!r}, not {numbers(question.answer)[0]}"]
    return []


def check_release(question, out):
    """The row the question quotes shows the answer's first fraction, and the rows below it
    the answer's next ones ("the row below, 0/8")."""
    quoted = re.search(r"[\"\u201c]([^\"\u201d]+)[\"\u201d]", question.summary)
    fractions = re.findall(r"\b\d+/\d+\b", question.answer)
    if not (quoted and fractions):
        return ["the question quotes no row, or the answer states no fraction"]
    words = [part.strip() for part in quoted.group(1).split(",")]
    named = re.compile(r"^\s*" + r"\s+".join(map(re.escape, words)) + r"\s+\d+/\d+\s*$")
    rows = [line for line in out.splitlines() if re.search(r"\s\d+/\d+\s*$", line)]
    at = [n for n, row in enumerate(rows) if named.match(row)]
    if len(at) != 1:
        return [f"the demo prints {len(at)} rows {quoted.group(1)!r}, not one"]
    shown = [row.split()[-1] for row in rows[at[0]:at[0] + len(fractions)]]
    return [] if shown == fractions else [f"from {quoted.group(1)!r} on the demo shows "
                                          f"{shown}, not {fractions}"]


def check_race(question, out):
    """Routing "last", by trials: the answer's "with 1 client, none" is held here (none
    wrong in any trial: one client is always the last writer); its "with 2 clients, most
    trials go wrong" depends on the machine, so only that row's presence is checked, one
    count per trial, each within the requests made."""
    trials = re.search(r"--trials (\d+)", question.command)
    problems = []
    for clients in (1, 2):
        row = re.search(rf"^\s*{clients} clients?\s+\(of (\d+)\).*\(per trial: ([\d ]+)\)",
                        out, re.M)
        if not row:
            problems.append(f"no row for {clients} client(s)")
            continue
        counts = [int(n) for n in row.group(2).split()]
        if trials and len(counts) != int(trials.group(1)):
            problems.append(f"{clients} client(s): {len(counts)} trials, not {trials.group(1)}")
        if clients == 1 and any(counts):
            problems.append(f"1 client: wrong answers {counts}, not none")
        if any(count > int(row.group(1)) for count in counts):
            problems.append(f"{clients} clients: more wrong answers than requests")
    return problems


# (what picks the command out, its check, whether the check reads numbers from the answer)
CHECKS = [(re.compile(r"^python3 demo\.py --only pool$"), check_pool, True),
          (re.compile(r"^python3 -c .*\bprint\("), check_printed, True),
          (re.compile(r"^python3 demo\.py --only release$"), check_release, True),
          (re.compile(r"^python3 demo\.py --race\b"), check_race, False)]


def checks_of(question):
    return [check for pattern, check, _ in CHECKS if pattern.search(question.command)]


def verdict(question, returncode, out, err):
    """What is false about the question's answer after its command ran."""
    found = checks_of(question)
    if len(found) != 1:
        return [f"{len(found)} checks know this command, not one"]
    ran = [] if returncode == 0 else [f"exit {returncode}: {err.strip()[-300:]}"]
    return ran + found[0](question, out)


def sed_verdict(original, edited):
    """The `sed` of A.1 deleted exactly one line, and only that."""
    before, after = original.splitlines(), edited.splitlines()
    if len(before) - len(after) != 1:
        return [f"the sed deleted {len(before) - len(after)} lines, not one"]
    if not any(before[:n] + before[n + 1:] == after for n in range(len(before))):
        return ["the sed changed more than one line"]
    return []


def tally_verdict(out, runs):
    """A.1's output: lines of `count sha256`, the counts summing to the runs."""
    lines = out.splitlines()
    tallied = [re.fullmatch(r"\s*(\d+) [0-9a-f]{64}  -", line) for line in lines]
    if not lines or not all(tallied):
        return [f"not lines of count and hash: {out!r}"]
    total = sum(int(match.group(1)) for match in tallied)
    return [] if total == runs else [f"the counts sum to {total}, not {runs}"]


def copy_verdict(tracked, copied, link):
    """Section 10's copy: the tracked files, and .venv linked to the project's."""
    problems = []
    if copied - {".venv"} != tracked:
        problems.append(f"missing {sorted(tracked - copied)[:5]}, "
                        f"extra {sorted(copied - tracked - {'.venv'})[:5]}")
    if link is None or link.resolve() != (HERE / ".venv").resolve():
        problems.append(f".venv is not a link to the project's: {link}")
    return problems


# --- running ----------------------------------------------------------------------

def start(script, cwd=HERE):
    return subprocess.Popen(["bash", "-c", script], cwd=cwd, env=ENVIRONMENT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(process):
    out, err = process.communicate(timeout=RUN_TIMEOUT)
    return process.returncode, out, err


def in_scratch(script, directory):
    """The recipe with its scratch folder (its one /tmp/ path) replaced by directory."""
    return script.replace(scratch_of(script), str(directory))


def through_sed(script):
    """A.1's recipe up to its `sed` line: the copy and the deletion, not the forty runs."""
    lines = script.splitlines()
    return "\n".join(lines[:next(n for n, line in enumerate(lines)
                                 if line.startswith("sed ")) + 1]) + "\n"


def sed_target(script):
    return re.search(r"^sed .* (\S+)$", script, re.M).group(1)


def tracked_files():
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=HERE, capture_output=True,
                            check=True).stdout.decode()
    return {name for name in listed.split("\0") if name}


def files_in(directory):
    """Every file under directory, relative, and each link as itself (not walked into)."""
    found = set()
    for folder, subfolders, names in os.walk(directory):
        for name in subfolders + names:
            path = Path(folder) / name
            if path.is_symlink() or not path.is_dir():
                found.add(str(path.relative_to(directory)))
    return found


def broken_question():
    """Question 2's command with a name misspelt (many_clients -> many_clientz), read from
    the commentary's text so changed: the command then fails."""
    broken = questions(text().replace("many_clients(", "many_clientz("))
    return next(q for q in broken if "many_clientz(" in q.command)


def broken_sed_recipe():
    """A.1's recipe with its sed pattern misspelt, so that it matches no line."""
    source = text().replace("/proxy.wait_routed(first_error)", "/proxy.wait_routed(first_errorz)")
    return recipe(r"^A\.1\b", source)


BROKEN_QUESTION = broken_question()
BROKEN_SED = broken_sed_recipe()
# the run of section 10's recipe goes on in the shell it leaves: it must have cd'd to the copy
AFTER_COPY = 'pwd -P\n.venv/bin/python -c "import pytest"\n'


@pytest.fixture(scope="module")
def runs():
    """Every command and recipe run at once: name -> (return code, stdout, stderr), and
    for the recipes, the scratch folder they made."""
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        a1, a1_broken, broken = scratch / "a1", scratch / "a1-broken", scratch / "broken"
        started = {question.number: start(question.command) for question in QUESTIONS}
        started["broken-question"] = start(BROKEN_QUESTION.command)
        started["a1"] = start(in_scratch(A1_RECIPE, a1))
        started["a1-broken-sed"] = start(in_scratch(through_sed(BROKEN_SED), a1_broken))
        started["break"] = start(in_scratch(BREAK_RECIPE, broken) + AFTER_COPY)
        results = {name: finish(process) for name, process in started.items()}
        yield {"results": results, "a1": a1, "a1-broken-sed": a1_broken, "break": broken}


# --- the commentary as it stands --------------------------------------------------------

def test_check_yourself_holds_questions_with_commands_each_known_to_one_check():
    assert len(QUESTIONS) >= 4
    for question in QUESTIONS:
        assert isinstance(question.command, str), f"{question}: one command per question"
        assert len(checks_of(question)) == 1, f"{question}: no check, or more than one"
    for pattern, _, _ in CHECKS:
        assert any(pattern.search(q.command) for q in QUESTIONS), (
            f"no question's command is {pattern.pattern}: the check is stale")


@pytest.mark.parametrize("question", QUESTIONS, ids=lambda q: f"question{q.number}")
def test_each_check_yourself_answer_is_what_its_command_shows(question, runs):
    assert verdict(question, *runs["results"][question.number]) == [], question


@pytest.mark.parametrize("script", [A1_RECIPE, BREAK_RECIPE], ids=["A.1", "section10"])
def test_each_recipe_names_one_scratch_folder_under_tmp(script):
    assert script, "no ```sh recipe where the commentary had one"
    assert scratch_of(script), f"not one /tmp/ path in {script!r}"


def test_the_demos_race_recipe_deletes_one_line_then_tallies_every_run(runs):
    returncode, out, err = runs["results"]["a1"]
    target = sed_target(A1_RECIPE)
    assert sed_verdict((HERE / target).read_text(encoding="utf-8"),
                       (runs["a1"] / target).read_text(encoding="utf-8")) == []
    assert tally_verdict(out, int(re.search(r"\bseq (\d+)", A1_RECIPE).group(1))) == [], err


def test_the_break_it_recipe_copies_the_tracked_files_and_links_a_venv_with_pytest(runs):
    returncode, out, err = runs["results"]["break"]
    copy = runs["break"]
    assert returncode == 0, err   # the last line after the recipe: the import of pytest
    assert out.splitlines() == [str(copy.resolve())], "the recipe does not leave you in the copy"
    link = copy / ".venv" if (copy / ".venv").is_symlink() else None
    assert copy_verdict(tracked_files(), files_in(copy), link) == []


def test_a_command_is_read_from_code_in_the_summary_however_worded_entities_unescaped():
    source = ("### 9. Check yourself\n\n<details>\n<summary>7. Reworded: run "
              "<code>python3 -c &quot;print(2 &lt; 3)&quot;</code> and see, not "
              "<code>Upstream</code>.</summary>\n\nIt prints 1 &amp; more.\n</details>\n"
              "<details>\n<summary>8. No command here?</summary>\n\nNone.\n</details>\n"
              "### 10. Next\n")
    [question] = questions(source)
    assert (question.number, question.command) == ("7", 'python3 -c "print(2 < 3)"')
    assert question.answer == "It prints 1 & more."
    assert numbers(question.answer) == [1]


# --- each check can fail -----------------------------------------------------------------

def test_a_question_command_with_a_name_misspelt_fails_its_check(runs):
    assert BROKEN_QUESTION.command not in [q.command for q in QUESTIONS]
    problems = verdict(BROKEN_QUESTION, *runs["results"]["broken-question"])
    assert any("NameError: name 'many_clientz'" in p for p in problems), problems
    assert any(p.startswith("printed ''") for p in problems), problems


@pytest.mark.parametrize("question", [q for q in QUESTIONS
                                      if any(p.search(q.command) and reads
                                             for p, _, reads in CHECKS)],
                         ids=lambda q: f"question{q.number}")
def test_an_answer_stating_another_number_fails_against_the_same_run(question, runs):
    # the answer's first digits, a fraction's numerator too: 8/8 becomes 9/8
    first = re.search(r"(?<![\w.])(\d+)(?![\w.])", question.answer)
    assert first, f"{question}: the answer states no number"
    wrong = Question(question.number, question.summary, question.command,
                     question.answer[:first.start()] + str(int(first.group(1)) + 1)
                     + question.answer[first.end():])
    assert verdict(wrong, *runs["results"][question.number]) != []


def test_a_sed_pattern_that_matches_no_line_fails_the_recipes_check(runs):
    assert BROKEN_SED != A1_RECIPE and "first_errorz" in BROKEN_SED
    target = sed_target(BROKEN_SED)
    assert runs["results"]["a1-broken-sed"][0] == 0
    assert sed_verdict((HERE / target).read_text(encoding="utf-8"),
                       (runs["a1-broken-sed"] / target).read_text(encoding="utf-8")) == [
        "the sed deleted 0 lines, not one"]


def test_a_tally_short_of_its_runs_or_not_of_hashes_fails_the_recipes_check():
    line = f"     39 {'0' * 64}  -"
    assert tally_verdict(line, 40) == ["the counts sum to 39, not 40"]
    assert tally_verdict("", 40) != []
    assert tally_verdict(line + "\nTraceback (most recent call last):", 40) != []


def test_a_copy_short_of_a_tracked_file_or_its_link_fails_the_copys_check():
    tracked = {"demo.py", "tcp_proxy.py"}
    link = HERE / ".venv"
    assert copy_verdict(tracked, {"demo.py", ".venv"}, link) != []
    assert copy_verdict(tracked, tracked | {".venv", "stray.txt"}, link) != []
    assert copy_verdict(tracked, tracked | {".venv"}, None) != []
    assert copy_verdict(tracked, tracked | {".venv"}, link) == []
