"""COMMENTARY.md, kept honest: each test checks one kind of claim the commentary
makes, against the code and the demo's checked-in transcripts,
so a change that makes the text stale turns `make test` red.

The rules the tests enforce, written for the merged file as much as for Part one:

- A fenced block with the info string `transcript` is a slice of the demo's
  output: its lines appear, in order and contiguous, in one checked-in transcript
  (transcripts/demo.txt, which test_tcp_proxy.py proves is what `python3 demo.py`
  prints, or transcripts/managed.txt once it exists). A slice may not straddle two.
- A fenced block with the info string `python` is a slice of a module: its lines
  appear contiguous in the module named by the last backticked `*.py` in the
  paragraph just before the block, compared exactly, indentation included. A
  line that is only `...` elides: it splits the slice into runs, each run is
  checked on its own, and the runs must appear in the module in that order.
- Every fenced block says what it holds (an info string); a block that is
  neither `transcript` nor `python` is not checked against anything.
- Figures: in Part one and the appendix (not Part two),
  every numeral in the prose sits inside a phrase that figures() below builds
  from the code, or is a reference (an RFC, a CVE, an issue or section number, a
  year, a version), or stands in a paragraph that says it is "one run" and names
  the `python3 ...` command that produced it. Fenced blocks, inline code, URLs
  and headings are not prose; inline code in Part one that carries a digit must
  be a command or appear verbatim in one of the project's modules.

    python3 test_commentary.py    prints how many slices the tests check
"""
import inspect
import re
from pathlib import Path

import pytest

import demo
from scaffolding import kit
from ground.frames import MAX_LINE
from ground.server import Hooks, Server
from tcp_proxy import answer, FramedProxy

from tests import prose
from tests.prose import (COMMENTARY, HERE, MODULE, blocks_of, contiguous_at, fenced_blocks,
                         headings, runs, section, text, transcripts, without_fences)


# --- slices ------------------------------------------------------------------------

def slice_id(block):
    return f"line{block[2]}"


@pytest.mark.parametrize("block", blocks_of("transcript"), ids=slice_id)
def test_transcript_slice_is_contiguous_output_of_the_demo(block):
    _, body, fence_line, _ = block
    assert body, f"the transcript block at line {fence_line} is empty"
    homes = [name for name, lines in transcripts().items() if contiguous_at(lines, body) >= 0]
    assert homes, (f"the transcript slice at line {fence_line} is not contiguous in any of "
                   f"{sorted(transcripts())}: rerun the demo and copy it again")


@pytest.mark.parametrize("block", blocks_of("python"), ids=slice_id)
def test_python_slice_is_contiguous_in_the_module_named_just_before_it(block):
    _, body, fence_line, before = block
    named = MODULE.findall(before)
    assert named, (f"the python block at line {fence_line} has no backticked *.py in the "
                   f"paragraph before it, so nothing says what it quotes")
    module = HERE / named[-1]
    assert module.exists(), (f"the python block at line {fence_line} quotes {named[-1]}, "
                             f"which does not exist")
    source = module.read_text(encoding="utf-8").splitlines()
    position = 0
    for run in runs(body):
        found = contiguous_at(source, run, position)
        assert found >= 0, (f"the python block at line {fence_line} is not a contiguous slice "
                            f"of {named[-1]} from its line {position + 1} on; "
                            f"first line: {run[0]!r}")
        position = found + len(run)


def test_commentary_quotes_every_scenario_of_the_demo_as_a_transcript_slice():
    quoted = [line for _, body, _, _ in blocks_of("transcript") for line in body]
    titles = [line for line in transcripts()["demo.txt"] if line.startswith("== ")]
    assert titles and [title for title in titles if title not in quoted] == []


def test_every_fenced_block_says_what_it_holds():
    unlabelled = [line for info, _, line, _ in fenced_blocks() if not info]
    assert unlabelled == [], f"fenced blocks with no info string at lines {unlabelled}"


# --- links, sections, questions ------------------------------------------------------

def slug(title):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    title = re.sub(r"`|\*|_(?=\w)|(?<=\w)_", "", title).strip().lower()
    return re.sub(r"[^\w\- ]", "", title).replace(" ", "-")


def test_every_relative_link_points_to_a_file_or_heading_that_exists():
    prose = re.sub(r"`[^`\n]*`", "", without_fences(text()))
    targets = re.findall(r"\]\(([^)\s]+)\)", prose) + re.findall(r'href="([^"]+)"', prose)
    anchors = {slug(title) for _, title in headings()}
    broken = []
    for target in targets:
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue   # a URL, checked by hand (see Further reading)
        path, _, anchor = target.partition("#")
        if path and not (COMMENTARY.parent / path).exists():
            broken.append(target)
        elif not path and anchor not in anchors:
            broken.append(target)
    assert broken == []


# The sections in the order the commentary reads: Part one's, the pointer to the
# bench, Part two, the appendix; each found by a loose keyword.
SECTION_ORDER = [r"orientation|start here", r"headline", r"problem", r"mental model",
                 r"reading the source|the source", r"the demo|scenario", r"boundary",
                 r"design decisions|roads not taken", r"simplified|production",
                 r"check yourself", r"break it yourself", r"further reading", r"measuring the cost",
                 r"part two", r"by default|defaults", r"appendix"]


def test_sections_appear_in_the_reading_order():
    titles = [title for _, title in headings()]
    position = 0
    for pattern in SECTION_ORDER:
        later = [i for i, title in enumerate(titles)
                 if i >= position and re.search(pattern, title, re.I)]
        assert later, f"no heading matching {pattern!r} after {titles[position - 1]!r}"
        position = later[0] + 1


def test_check_yourself_asks_a_handful_of_questions_each_answer_folded_under_a_summary():
    check_yourself = section(r"check yourself")
    questions = re.findall(r"<details>(.*?)</details>", check_yourself, re.S)
    assert check_yourself.count("<details>") == check_yourself.count("</details>") == len(questions)
    assert 6 <= len(questions) <= 10
    for question in questions:
        summary = re.search(r"<summary>(.+?)</summary>(.*)", question, re.S)
        assert summary and summary.group(1).strip() and summary.group(2).strip(), question[:80]


def test_every_picture_is_shown_with_a_one_line_caption_under_it():
    source = text()
    drawn = sorted(path.name for path in (HERE / "pictures").glob("*.svg"))
    shown = re.findall(r"^!\[[^\]]+\]\(pictures/([\w-]+\.svg)\)\n\*[^*\n]+\*$", source, re.M)
    assert drawn and sorted(shown) == drawn


# Each part's size in bytes at most: a reader's budget, so a new section is paid for by a cut.
PART_CAPS = {"Part one": 32_400, "Part two": 13_500, "Part three": 19_800, "Appendix": 3_000}
HEADLINE_WORDS = 1_500   # the headline transcript comes before this many words


def part(name, source=None):
    """One part of the commentary: its level-2 heading up to the next level-2 heading."""
    found = re.search(rf"^## {name}\b.*?(?=^## |\Z)", source or text(), re.M | re.S)
    return found.group() if found else ""


@pytest.mark.parametrize("name", PART_CAPS)
def test_each_part_stays_within_its_cap(name):
    size = len(part(name).encode("utf-8"))
    assert 0 < size <= PART_CAPS[name], f"{name} is {size} bytes"


THESIS = "A connection pool's checkin is a parse."
THESIS_WORDS = 1_000     # the thesis is said, in these words, within Part one's orientation
PART_ONE_WORDS = 4_600   # Part one's words at most, code and transcripts included


def test_the_thesis_is_said_in_the_first_thousand_words():
    source = text()
    assert THESIS in source, "the thesis sentence is gone"
    assert len(source[:source.index(THESIS)].split()) <= THESIS_WORDS


def test_part_one_stays_within_its_words():
    assert len(part("Part one").split()) <= PART_ONE_WORDS


WHOLE_WORDS = 10_000   # the whole commentary's words at most (`wc -w COMMENTARY.md`)
# The running prose's style at most (tests/prose.py's style(): words per sentence, colons
# and semicolons per 100 words), so that a full stop keeps doing what a colon would.
STYLE_CEILINGS = (13.0, 1.4, 0.4)


def test_the_whole_stays_within_its_words():
    assert len(text().split()) <= WHOLE_WORDS


def test_the_running_prose_keeps_short_sentences_and_few_colons_and_semicolons():
    measured = prose.style()
    assert all(value <= ceiling for value, ceiling in zip(measured, STYLE_CEILINGS)), measured


def test_the_style_count_ends_a_sentence_at_a_full_stop_and_counts_colons_outside_code():
    source = "## T\n\nOne two three. Four `a:b` five: six; seven.\n\n```sh\nx: y; z.\n```\n"
    assert prose.style(source) == (4.0, 12.5, 12.5)


def test_the_headline_transcript_comes_early():
    source = text()
    headline = source.index("== 2. Whole requests, one after the other")
    assert len(source[:headline].split()) <= HEADLINE_WORDS


def test_a_part_ends_at_the_next_level_two_heading_and_nothing_else():
    source = "# T\n\n## Part one\n\nabc\n### 1. x\n\n## Part three: x\n\nlong\n\n## Appendix\n\nz\n"
    assert part("Part one", source) == "## Part one\n\nabc\n### 1. x\n\n"
    assert part("Part three", source) == "## Part three: x\n\nlong\n\n"


# --- figures -------------------------------------------------------------------------

def source_of(thing):
    return inspect.getsource(thing) if not isinstance(thing, Path) else thing.read_text()


def number_in(thing, pattern):
    """The integer a regular expression's group finds in some source: a figure the
    demo, the Makefile or a test fixes by writing it down."""
    found = re.search(pattern, source_of(thing))
    assert found, f"{pattern!r} no longer matches: the figure it read has moved"
    return int(found.group(1))


def figures():
    """Every phrase in which the commentary states a figure about the code, built
    here from the code, the demo or the tests, never typed in.
    Phrases are compared with their whitespace collapsed, however the text wraps.
    A phrase whose condition no longer holds drops out, and its figure turns up
    as unchecked."""
    alpha, beta, ha = answer(b"GET alpha"), answer(b"GET beta"), answer(b"ha")
    glued = answer(b"GET alpGET beta")
    a1, a2, b1 = len(b"GET alp"), len(b"ha\n"), len(b"GET beta\n")
    a_whole, b_whole = len(b"GET alpha\n"), len(b"GET beta\n")
    clients, rounds = len(kit.CLIENT_NAMES), kit.ROUNDS
    requests = clients * rounds
    caps = re.search(r"for cap in \(([\d, ]+)\)", source_of(demo.pool_caps)).group(1)
    top_cap = max(int(cap) for cap in caps.split(","))
    split = demo.SPLIT_AT
    timeout = inspect.signature(FramedProxy).parameters["release_timeout"].default
    pause = float(re.search(r"GC_PAUSE = ([\d.]+)", source_of(HERE / "test_tcp_proxy.py")).group(1))
    reruns = number_in(HERE / "test_tcp_proxy.py", r"for _ in range\((\d+)\)\]")
    check_runs = number_in(HERE / "Makefile", r"seq (\d+)")
    few_cap = number_in(HERE / "test_tcp_proxy.py",
                        r"FramedProxy\(upstream.addr, pool_cap=(\d+)\) as proxy:\n"
                        r"\s+assert demo.many_clients\(proxy.addr, count=\d+\)")
    few = number_in(HERE / "test_tcp_proxy.py", r"many_clients\(proxy.addr, count=(\d+)\)")
    few_opened = number_in(HERE / "test_tcp_proxy.py",
                           r"count=\d+\) == \d+\n\s+assert proxy.opened == (\d+)")
    phrases = [
        # the protocol
        f"and {len(alpha) - len(b'alpha=') - 1} copies of",
        f"{len(alpha)} bytes of alpha's reply, {len(beta)} of beta's",
        f"past {MAX_LINE} bytes",
        # scenario 1: the bytes add up
        f"{a1} + {b1} + {a2} = {a1 + b1 + a2} bytes went up",   # in arrival order
        f"error of {len(glued)} bytes and {len(ha)} bytes",
        f"both errors ({len(glued) + len(ha)} bytes)",
        # scenarios 2, 3 and 8: two replies, one owner
        f"its {a_whole} bytes, B its {b_whole} bytes",
        f"{len(alpha)} + {len(beta)} = {len(alpha) + len(beta)} bytes",
        f"the {len(alpha) + len(beta)} bytes of both replies",
        f"all {len(alpha)} bytes",
        # the clients, the rounds, the pool
        f"{len(demo.SCENARIOS)} scenarios",
        f"{clients} clients",
        f"{clients} × {rounds} = {requests} requests",
        f"{requests} requests",
        f"{requests} answers",
        f"{rounds} requests",
        f"{clients} client connections and {clients} upstream connections",
        f"the ratio {clients / clients:.1f}",
        f"{requests}/1 = {requests:.1f}",
        f"{requests}/{clients} = {requests / clients:.1f}",
        f"cap {top_cap} opens {min(top_cap, clients)}",
        f"cap of {top_cap}",
        f"min({top_cap}, {clients}) = {min(top_cap, clients)}",
        f"{min(top_cap, clients)} connections",
        f"at most {clients} requests",
        f"a cap of {few_cap} and {few} clients",
        f"{few_opened}: the pool grows",
        f"the {clients} client connections share 1 upstream connection",
        f"{clients}/1 = {clients:.1f}",
        # scenario 6: the paused reply
        f"first {split} bytes",
        f"{timeout} s",
        f"the release timeout is {timeout * 1000:g} ms",
        f"stops for {pause * 1000:g} ms",
        f"reply {timeout * 1000:g} ms into the pause",
        f"comes {(pause - timeout) * 1000:g} ms later",
        f"0/{clients}",
        f"{clients}/{clients}",
        # hooks, lifecycle, the tests that hold the transcript still
        f"{Hooks.hook_timeout:g} s",
        f"runs it {reruns} times",
        f"demo {check_runs} times",
    ]
    conditions = {
        "port 0": '("127.0.0.1", 0)' in source_of(Server.__init__),
        "exits 1": "return 1" in source_of(demo.run),
        "Nothing: 0 bytes": ('half_close_trial(False) == b""'
                             in source_of(HERE / "test_tcp_proxy.py")),
        "1 client": "for count in (1, 2)" in source_of(demo.race),
        "2 clients": "for count in (1, 2)" in source_of(demo.race),
    }
    return phrases + [phrase for phrase, holds in conditions.items() if holds]


# What is not a figure about the code: references and names that carry digits.
NOT_FIGURES = re.compile("|".join([
    r"RFC\s?\d+", r"§\s?[\d.]*\d", r"CVE-\d{4}-\d+", r"\bHTTP/\d(\.\d)?", r"\bPython \d+(\.\d+)*",
    r"\blayer[- ]\d\b", r"\bIPv\d\b", r"\b(19|20)\d\d\b", r"\b(issues?|PRs?|pull requests?)"
    r"( #?\d+(,| and| or|/)?)+", r"\b(sections?|scenarios?|questions?|exercises?|steps?|parts?) \d+"
    r"((,| and| to|-)+ ?\d+)*", r"\b[A-Z][\w-]*\d\w*\b", r"\b\w+\d+[a-z]\w*\b",
    r"\b\d+\.\d+(\.(\d+|x))+\b",
]), re.I)

NUMERAL = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w])")


def part_one(source=None):
    """The text Part one and the appendix own: everything but Part two (from the
    level-2 heading that names Part two up to the last heading that names the
    appendix)."""
    source = source or text()
    cut = re.search(r"^## .*part two.*$", source, re.I | re.M)
    appendix = ([None] + list(re.finditer(r"^#{1,6} .*appendix.*$", source, re.I | re.M)))[-1]
    if cut and appendix and cut.start() < appendix.start():
        return source[:cut.start()] + source[appendix.start():]
    return source


def measured(paragraph):
    """A paragraph that says it is one run's measurement and names its command."""
    return re.search(r"\bone run\b", paragraph, re.I) and re.search(r"`python3 [^`]+`", paragraph)


def flat(prose):
    """Prose with every run of whitespace made one space, so a phrase matches
    however the lines were wrapped."""
    return " ".join(prose.split())


def blank(pattern, line):
    return re.sub(pattern, lambda m: " " * len(m.group()), line)


def unchecked_figures(source=None):
    """(paragraph, numeral) for every numeral in Part one's prose that nothing checks."""
    phrases = [flat(phrase) for phrase in figures()]
    found = []
    for paragraph in re.split(r"\n\s*\n", without_fences(part_one(source))):
        if measured(paragraph):
            continue
        lines = [blank(r"^\s*(\d+\.|[-*>])\s", line) for line in paragraph.splitlines()
                 if not line.lstrip().startswith("#")]
        prose = flat(blank(r"<!--.*?-->|`[^`]*`|<code>.*?</code>|<summary>\s*\d+\.|\]\([^)]*\)"
                           r"|https?://\S+", " ".join(lines)))
        covered = [(m.start(), m.end()) for phrase in phrases
                   for m in re.finditer(re.escape(phrase), prose)]
        for numeral in NUMERAL.finditer(blank(NOT_FIGURES, prose)):
            if not any(start <= numeral.start() and numeral.end() <= end for start, end in covered):
                found.append((prose[:60], numeral.group()))
    return found


def test_every_figure_in_part_one_is_computed_by_a_test_or_marked_as_one_run():
    assert unchecked_figures() == [], ("state these figures in a phrase figures() builds from "
                                       "the code, or mark the paragraph as one run with its "
                                       "command")


def test_code_in_part_one_that_carries_a_figure_is_a_command_or_quoted_from_a_module():
    modules = "\n".join(path.read_text(encoding="utf-8") for path in HERE.rglob("*.py")
                         if path.name != Path(__file__).name
                         # .venv-redis-* too
                         and not any(part.startswith(".venv") for part in path.parts))
    prose = without_fences(part_one())
    spans = re.findall(r"`([^`\n]+)`", prose) + re.findall(r"<code>(.*?)</code>", prose)
    assert [span for span in spans if re.search(r"\d", span)
            and not re.match(r"(python3|make)\b", span) and span not in modules
            and not (HERE / span).is_file()] == []   # a file's path is a name, not a figure


def test_every_figure_computed_here_is_stated_in_the_commentary():
    source = flat(text())
    assert [phrase for phrase in figures() if flat(phrase) not in source] == []


def part_two_defaults():
    """The rows of Part two's defaults table (in part2/managed.py's docstring, which section
    15 points to), built from the defaults that ManagedProxy and its parts declare: its own,
    ManagedClient's, ManagedSet's, the cache's."""
    from part2 import managed
    proxy = inspect.signature(managed.ManagedProxy).parameters
    client = inspect.signature(managed.ManagedClient).parameters
    managed_set = inspect.signature(managed.ManagedSet).parameters
    cache = managed.DEFAULTS
    no_limit = ("no limit" if managed_set["pending_calls_max"].default is None
                else managed_set["pending_calls_max"].default)
    max_clients = ("no limit" if managed.ManagedProxy.max_clients is None
                   else managed.ManagedProxy.max_clients)
    ping = {False: "off", True: "on"}[client["initial_ping"].default]
    fatal = {True: "fatal", False: "not fatal"}
    return [
        f"msg_timeout {proxy['msg_timeout'].default:g} s, "
        f"{fatal[proxy['msg_timeout_is_fatal'].default]} (ManagedClient, ManagedSet: "
        f"{client['msg_timeout'].default:g}, {fatal[client['msg_timeout_is_fatal'].default]}).",
        f"idle_timeout {client['idle_timeout'].default:g}.",
        f"initial_ping {ping}.",
        f"pending_calls_max / pending_calls_norm {no_limit} / "
        f"{managed_set['pending_calls_norm'].default}.",
        f"idempotent_max / idempotent_wait {managed_set['idempotent_max'].default} / "
        f"{managed_set['idempotent_wait'].default:g} s (Ocamlnet: 5 s).",
        f"threshold {cache['threshold']}, "
        f"windows of {cache['disable_timeout_min']:g} s doubling to "
        f"{cache['disable_timeout_max']:g} s.",
        f"request_timeout {proxy['request_timeout'].default:g} s ",
        f"hold_timeout {proxy['hold_timeout'].default:g} s ",
        f"checkout_timeout {proxy['checkout_timeout'].default:g} s ",
        f"max_clients {max_clients} ",
    ]


def test_part_two_defaults_table_states_the_defaults_managed_py_declares():
    from part2 import managed
    doc = managed.__doc__
    # the table lives in the docstring; section 15 points there
    assert "What you get by default" in doc and section(r"by default|defaults")
    defaults = flat(doc[doc.index("What you get by default"):])
    assert [row for row in part_two_defaults() if flat(row) not in defaults] == []


def test_the_figure_check_catches_an_unchecked_figure_and_spares_a_marked_one():
    stale = "# 1. Orientation\n\nThe pool opened 7 connections.\n"
    marked = "# 1. Orientation\n\nOne run of `python3 demo.py --race` opened 7 connections.\n"
    assert unchecked_figures(stale) == [("The pool opened 7 connections.", "7")]
    assert unchecked_figures(marked) == []


if __name__ == "__main__":
    print(f"{len(blocks_of('transcript'))} transcript slices and {len(blocks_of('python'))} "
          f"source slices checked; {len(figures())} computed figures")
