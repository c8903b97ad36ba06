"""The house's rules, checked on the tree as it is: imports run one way,
the lesson imports no scaffolding, and the top level holds only the card's files.
Imports are read with `ast`, lazy ones inside functions included."""
import ast
import functools
import subprocess

import pytest

from conftest import ROOT

# One worker runs all of these under `make test`'s --dist loadgroup: graph() (every module
# parsed, 0.6 s) is cached per process, so it runs once per worker that needs it.
pytestmark = pytest.mark.xdist_group("test_house")

LESSON = {"tcp_proxy", "part2.managed", "part2.clock", "part2.cache", "part2.calls", "part2.loop",
          "part2.pipeline", "part2.connection", "part2.client", "part2.managed_set", "part2.proxy",
          "part2.lease",
          "part3.resp", "part3.commands", "part3.tagged", "part3.lending"}
TOP_LEVEL = {"tcp_proxy.py", "demo.py", "test_tcp_proxy.py", "COMMENTARY.md", "README.md", "Makefile",
             "conftest.py", "pytest.ini", "requirements-test.txt", ".gitignore", ".ci"}


def modules():
    """Every tracked Python module of the project, by its dotted name."""
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True).stdout
    return {path[:-3].replace("/", ".").removesuffix(".__init__"): ROOT / path for path in tracked.split()}


def imports_of(path, known):
    """The project modules a file imports, wherever in the file the import stands."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(name for name in names if name in known)
    return found


@functools.cache   # two tests read it; the tree does not change during a run
def graph():
    known = modules()
    return {name: imports_of(path, known) - {name} for name, path in known.items()}


def cycle_in(edges):
    """One import circle as a list of modules, or [] if the imports run one way."""
    state = {}

    def visit(node, trail):
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return trail[trail.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt, trail + [nxt])):
                return found
        state[node] = "done"
        return []

    for start in sorted(edges):
        if start not in state and (found := visit(start, [start])):
            return found
    return []


def test_no_module_imports_a_module_that_imports_it_directly_or_through_others():
    assert cycle_in(graph()) == []


def test_the_cycle_finder_finds_a_circle_of_three():
    assert cycle_in({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]


def test_lesson_modules_import_only_lesson_modules():
    edges = graph()
    assert {name: sorted(edges[name] - LESSON) for name in LESSON if edges[name] - LESSON} == {}


def test_the_top_level_holds_only_the_cards_files_configuration_and_folders():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    top_files = {path for path in tracked if "/" not in path}
    assert top_files - TOP_LEVEL == set()
