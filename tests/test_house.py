"""The house's rules, checked on the tree as it is: imports run one way, down the floors;
the lesson imports no scaffolding; no test module imports another; and the top level
holds only the card's files. Imports are read with `ast` (nothing is imported or run),
lazy ones inside functions included.

The floors, low to high; a file may import only from its own floor or a lower one:
    0  ground/: what the parts share (the threaded server, the framing loop, the session
       interface), importing none of them
    1  tcp_proxy.py, scaffolding/, conftest.py (the suite's leak guard and shared helpers)
    2  part2/
    3  part3/ (the incident's room part3/wild/ with it)
    4  the top: every other file in the root (demo.py, test_tcp_proxy.py), tests/, bench/,
       pictures/
A test file sits on the floor of the folder it is in, like the modules beside it; so a
test that needs a higher floor's code lives on that floor (Part two's pool framing RESP is
tested in part3/). A helper two test files share lives in conftest.py or in a module whose
name does not start with `test_`."""
import ast
import functools
import subprocess

import pytest

from conftest import ROOT

# One worker runs all of these under `make test`'s --dist loadgroup, so graph() (every module
# parsed, cached per process) is built once.
pytestmark = pytest.mark.xdist_group("test_house")

LESSON = {"ground", "ground.frames", "ground.server", "ground.session", "ground.workers",
          "tcp_proxy", "part2.managed", "part2.clock", "part2.hooks", "part2.cache", "part2.calls",
          "part2.handoff", "part2.loop", "part2.pipeline", "part2.connection", "part2.client",
          "part2.managed_set", "part2.proxy", "part2.downstream", "part2.lease", "part2.links",
          "part3.parser", "part3.words", "part3.resp", "part3.answers", "part3.session",
          "part3.commands", "part3.tagged", "part3.lending", "part3.framed", "part3.streams"}
FLOORS = {"ground": 0, "tcp_proxy": 1, "conftest": 1, "scaffolding": 1, "part2": 2, "part3": 3}
TOP_FLOOR = 4
TOP_LEVEL = {"tcp_proxy.py", "demo.py", "test_tcp_proxy.py", "COMMENTARY.md", "README.md",
             "Makefile", "conftest.py", "pytest.ini", "ruff.toml", "requirements-test.txt",
             ".gitignore", ".ci"}


def modules():
    """Every tracked Python module of the project, by its dotted name."""
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True,
                             text=True).stdout
    return {path[:-3].replace("/", ".").removesuffix(".__init__"): ROOT / path
            for path in tracked.split()}


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


def floor_of(module):
    """A dotted module's floor: that of its first name (a root file or a folder), else the top."""
    return FLOORS.get(module.split(".")[0], TOP_FLOOR)


def upward(edges):
    """Each import from a lower floor to a higher one, as (importer, imported) pairs."""
    return sorted((importer, imported) for importer, targets in edges.items()
                  for imported in targets if floor_of(imported) > floor_of(importer))


def is_test_module(module):
    return module.rsplit(".", 1)[-1].startswith("test_")


def test_imports_between_test_modules(edges):
    """Each import of one test module by another, as (importer, imported) pairs."""
    return sorted((importer, imported) for importer, targets in edges.items()
                  for imported in targets if is_test_module(importer) and is_test_module(imported))


test_imports_between_test_modules.__test__ = False   # a helper, though its name starts with test_


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


def test_no_file_imports_from_a_floor_above_its_own():
    assert upward(graph()) == []


def test_an_upward_import_is_found_even_inside_a_function(tmp_path):
    written = tmp_path / "kit.py"   # as if scaffolding/kit.py reached up to Part three lazily
    written.write_text("import socket\n\n\n"
                       "def helper():\n    from part3 import resp\n    return resp\n")
    known = modules()
    edges = {"scaffolding.kit": imports_of(written, known), "part3.resp": {"tcp_proxy"}}
    assert upward(edges) == [("scaffolding.kit", "part3"), ("scaffolding.kit", "part3.resp")]


def test_the_floors_put_the_lesson_below_its_scaffolding_users_and_the_top_above_all():
    floors = [floor_of(name) for name in ("ground.server", "tcp_proxy", "conftest",
                                          "scaffolding.kit", "part2.managed", "part3.resp",
                                          "part3.wild", "demo", "test_tcp_proxy",
                                          "tests.test_house", "bench.machinery", "pictures.draw")]
    assert floors == [0, 1, 1, 1, 2, 3, 3, 4, 4, 4, 4, 4]


def test_no_test_module_imports_another():
    assert test_imports_between_test_modules(graph()) == []


def test_an_import_of_one_test_module_by_another_is_found():
    edges = {"part2.test_proxy": {"part2.test_connection", "conftest"},
             "part2.proxy": {"tcp_proxy"}}
    assert test_imports_between_test_modules(edges) == [
        ("part2.test_proxy", "part2.test_connection")]


def test_lesson_modules_import_only_lesson_modules():
    edges = graph()
    assert {name: sorted(edges[name] - LESSON) for name in LESSON if edges[name] - LESSON} == {}


def test_the_top_level_holds_only_the_cards_files_configuration_and_folders():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True,
                             text=True).stdout.split()
    top_files = {path for path in tracked if "/" not in path}
    assert top_files - TOP_LEVEL == set()


def lesson_definitions():
    """Every class and every module-level constant (a name in capitals) of the lesson's
    modules (the ground floor, tcp_proxy.py, part2/, part3/; tests and the wild's room
    aside), as (name, module) pairs."""
    found = []
    for name, path in modules().items():
        if not name.startswith(("ground", "tcp_proxy", "part2", "part3")) or \
                is_test_module(name) or ".wild" in name or name.endswith("conftest"):
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                found.append((node.name, name))
            for target in node.targets if isinstance(node, ast.Assign) else ():
                for each in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if isinstance(each, ast.Name) and each.id.isupper():
                        found.append((each.id, name))
    return found


def test_a_name_means_one_thing_no_class_or_constant_is_defined_in_two_lesson_modules():
    where = {}
    for name, module in lesson_definitions():
        where.setdefault(name, []).append(module)
    assert {name: places for name, places in where.items() if len(places) > 1} == {}


def test_part_three_stands_on_part_twos_face_alone():
    """part3/ reaches Part two only through part2/managed.py, its public names (and its
    scenarios' helpers, part2/managed_demo.py, which a test may borrow)."""
    face = ("part2", "part2.managed", "part2.managed_demo")
    reaching = {(importer, imported) for importer, targets in graph().items()
                for imported in targets if importer.startswith("part3")
                and imported.startswith("part2") and imported not in face}
    assert reaching == set()
