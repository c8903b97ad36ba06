"""What every test shares, in three parts: the guard, the session's own costs, and the
helpers the test files import.

The guard: no test may leave a thread running or a socket unclosed, nor make
Python ignore an exception (one raised in __del__, say, which Python can only print).

An open socket that is dropped warns (ResourceWarning) when it is freed. Reference
counting frees most at once; one caught in a reference cycle waits for the cycle
collector, and a full gc.collect() after every test costs seconds of the suite.
So the guard keeps a weak reference to every socket made during a test and runs
the collector only when one of them is still open at the end: the only case in
which an unclosed socket can be lying in unreachable garbage. A socket still open
after that collection is reachable, and left open: that fails the test too.

pytest's own watch for ignored exceptions (its unraisableexception plugin) is
turned off in pytest.ini: it reports them only as warnings, and at the end of each
of the four processes of `make test` it runs the collector five times over, a
tenth of a second each in a worker here. The guard fails the test instead.
"""
import gc
import os
import re
import shutil
import socket
import sys
import threading
import warnings
import weakref
from pathlib import Path

import pytest

ROOT = Path(__file__).parent   # the project's root: transcripts/, pictures/, the card's files
pytest_plugins = ["pytester"]   # test_conftest.py runs this guard on tests that leak

made_during_test = weakref.WeakSet()   # every socket.socket made since the running test began
original_socket_init = socket.socket.__init__


def tracked_socket_init(self, *args, **kwargs):
    """socket.socket.__init__, noting the socket (accept() makes its sockets through it too)."""
    original_socket_init(self, *args, **kwargs)
    made_during_test.add(self)


socket.socket.__init__ = tracked_socket_init

ignored_during_test = []   # sys.unraisablehook appends each exception Python ignored; the guard reads it


def note_ignored(unraisable):
    """sys.unraisablehook: print what Python ignored, as Python would (so that one ignored
    between tests is seen too), and keep it for the guard to fail the test with."""
    sys.__unraisablehook__(unraisable)
    ignored = f"{unraisable.exc_type.__name__}: {unraisable.exc_value} in {unraisable.object!r}"
    ignored_during_test.append(ignored)


sys.unraisablehook = note_ignored


def open_sockets():
    return [sock for sock in list(made_during_test) if sock.fileno() != -1]


@pytest.fixture(autouse=True)
def no_leaks():
    """Fail a test that leaves a thread alive, lets a socket be freed unclosed, keeps
    one open, or makes Python ignore an exception."""
    before = set(threading.enumerate())
    made_during_test.clear()
    ignored_during_test.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        yield
        if open_sockets():   # maybe garbage in a cycle: collecting it warns
            gc.collect()
    leaked = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert not leaked, f"threads left running: {leaked}"
    unclosed = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert not unclosed, f"resources left open: {unclosed}"
    still_open = open_sockets()
    assert not still_open, f"sockets left open: {still_open}"
    assert not ignored_during_test, f"exceptions ignored: {ignored_during_test}"


# --- the session's own costs: the order tests are dealt out in, the cycle collector ------

def pytest_collection_modifyitems(items):
    """Tests marked `slow` (a second or more here) go first, in their own order. `make test`
    deals tests out to its workers in collection order; a slow one dealt out last keeps
    its worker busy after the others have run dry, while dealt out first the short ones
    fill in around it."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_collection_finish(session):
    """What is alive once the tests are collected (modules, hypothesis, the tests) lives to
    the end: frozen, it is no longer walked by each full collection. Here that was about
    0.2 s of a worker's run."""
    gc.freeze()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """Everything alive now dies with the process: frozen, it is not walked by the
    collection Python makes on the way out (0.4 s of a process's exit here, 0.1 s frozen)."""
    gc.freeze()


# --- helpers the test files share (imported as `from conftest import ...`) -------------

def need_redis(*tools):
    """Skip without redis-server (and each of `tools`, e.g. "redis-cli", Debian's redis-tools),
    except in CI (CI=true), where their absence is a failure."""
    for program in ("redis-server", *tools):
        if shutil.which(program) is None:
            if os.environ.get("CI") == "true":
                pytest.fail(f"{program} is not on PATH, and CI must run Part three's tests: "
                            "`make redis-server` installs it")
            pytest.skip(f"{program} is not on PATH (`make redis-server` installs it)")


def transcript_section(transcript, title):
    """The lines a scenario printed under its `== n. title ==` line in a checked-in transcript."""
    text = (ROOT / "transcripts" / transcript).read_text(encoding="utf-8")
    sections = re.split(r"^== \d+\. (.*) ==\n", text, flags=re.MULTILINE)
    return dict(zip(sections[1::2], sections[2::2]))[title].rstrip("\n") + "\n"
