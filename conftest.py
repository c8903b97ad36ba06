"""Shared test guards and helpers.

The guard: no test may leave a thread running or a socket unclosed.

An open socket that is dropped warns (ResourceWarning) when it is freed. Reference
counting frees most at once; one caught in a reference cycle waits for the cycle
collector, and a full gc.collect() after every test costs seconds of the suite.
So the guard keeps a weak reference to every socket made during a test and runs
the collector only when one of them is still open at the end: the only case in
which an unclosed socket can be lying in unreachable garbage. A socket still open
after that collection is reachable, and left open: that fails the test too.
"""
import gc
import os
import re
import shutil
import socket
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


def open_sockets():
    return [sock for sock in list(made_during_test) if sock.fileno() != -1]


@pytest.fixture(autouse=True)
def no_leaks():
    """Fail a test that leaves a thread alive, lets a socket be freed unclosed, or
    keeps one open."""
    before = set(threading.enumerate())
    made_during_test.clear()
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
