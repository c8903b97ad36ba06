"""tests.prose: reading COMMENTARY.md for the tests that check it (test_commentary,
test_exercises). Not a test file: helpers both of them call at collection time,
where a fixture cannot reach.
"""
import re
from pathlib import Path

ROOT = Path(__file__).parent.parent   # the project's root
HERE = ROOT
COMMENTARY = HERE / "COMMENTARY.md"
TRANSCRIPTS = [HERE / "transcripts" / name
               for name in ("demo.txt", "managed.txt", "part3.txt", "wild.txt")]

FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})[ \t]*([^\s`]*)")
MODULE = re.compile(r"`([\w./-]+\.py)`")


# --- reading the markdown --------------------------------------------------------

def text():
    return COMMENTARY.read_text(encoding="utf-8")


def fenced_blocks(source=None):
    """Every fenced block as (info, body lines, line number of its fence, the
    paragraph just before it), body lines unindented as CommonMark does."""
    lines = (source if source is not None else text()).splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence, info = opening.groups()
        end = i + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        body = [line[min(len(indent), len(line) - len(line.lstrip(" "))):]
                for line in lines[i + 1:end]]
        before, above = [], i
        while above > 0 and not lines[above - 1].strip():
            above -= 1   # the blank lines between the paragraph and its block
        for line in reversed(lines[:above]):
            if not line.strip() or FENCE.match(line):
                break
            before.insert(0, line)
        blocks.append((info, body, i + 1, "\n".join(before)))
        i = end + 1
    return blocks


def blocks_of(kind):
    return [block for block in fenced_blocks() if block[0] == kind]


def without_fences(source):
    """The text with every fenced block blanked out, line numbers kept."""
    lines = source.splitlines()
    for _, body, fence_line, _ in fenced_blocks(source):
        for number in range(fence_line - 1, fence_line + len(body) + 1):
            if number < len(lines):
                lines[number] = ""
    return "\n".join(lines)


def headings(source=None):
    """(level, title) of every ATX heading outside fenced blocks."""
    found = re.findall(r"^(#{1,6})\s+(.+?)\s*#*\s*$", without_fences(source or text()), re.M)
    return [(len(hashes), title) for hashes, title in found]


def section(title_pattern, source=None):
    """The text under the first heading matching title_pattern, up to the next
    heading of the same level or higher."""
    source = source or text()
    lines = source.splitlines()
    blanked = without_fences(source).splitlines()
    start = level = None
    for number, line in enumerate(blanked):
        heading = re.match(r"^(#{1,6})\s+(.+)", line)
        if heading and start is None and re.search(title_pattern, heading.group(2), re.I):
            start, level = number, len(heading.group(1))
        elif heading and start is not None and len(heading.group(1)) <= level:
            return "\n".join(lines[start:number])
    return "\n".join(lines[start:]) if start is not None else ""


def contiguous_at(haystack, needle, start=0):
    """The first index >= start where needle sits contiguous in haystack, else -1."""
    for index in range(start, len(haystack) - len(needle) + 1):
        if haystack[index:index + len(needle)] == needle:
            return index
    return -1


def runs(lines):
    """A slice split at its elision lines (`...`), empty runs dropped."""
    found, current = [], []
    for line in lines:
        if line.strip() == "...":
            found.append(current)
            current = []
        else:
            current.append(line)
    return [run for run in found + [current] if run]


def transcripts():
    return {path.name: path.read_text(encoding="utf-8").splitlines()
            for path in TRANSCRIPTS if path.exists()}


# --- the running prose -------------------------------------------------------------

def running_prose(source=None):
    """The paragraphs a reader reads as sentences: no fenced block, heading, table row,
    picture or HTML tag; inline code counts as one word."""
    kept = []
    for paragraph in re.split(r"\n\s*\n", without_fences(source or text())):
        lines = [line for line in paragraph.splitlines()
                 if line.strip() and not re.match(r"\s*(#|\||!\[)", line)]
        if not lines:
            continue
        words = re.sub(r"<[^>]+>", " ", " ".join(lines))
        words = re.sub(r"`[^`]*`", "CODE", words)
        words = re.sub(r"\]\([^)]*\)", "]", words)   # a link's target is not read
        kept.append(" ".join(words.split()))
    return kept


def style(source=None):
    """(words per sentence, colons per 100 words, semicolons per 100 words) of the running
    prose. A sentence ends at ., ! or ? before a space and a capital, a digit, a bracket or
    a quote, and at a paragraph's end; colons inside a code span were dropped with it."""
    words = sentences = colons = semicolons = 0
    for paragraph in running_prose(source):
        words += len(paragraph.split())
        sentences += 1 + len(re.findall(r"[.!?][)\"']?\s+(?=[A-Z0-9(\"'*_C])", paragraph))
        colons += paragraph.count(":")
        semicolons += paragraph.count(";")
    return (round(words / sentences, 1), round(100 * colons / words, 2),
            round(100 * semicolons / words, 2))
