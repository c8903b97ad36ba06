"""What every test shares: the guard, the order tests are dealt out in, and the helpers
the test files import.

The guard: no test may leave a thread running or a socket unclosed, nor make Python
ignore an exception (one raised in __del__, say, which Python can only print).

An open socket that is dropped warns (ResourceWarning) when it is freed; one caught in
a reference cycle waits for the cycle collector. So the guard keeps a weak reference to
every socket made during a test and collects only when one of them is still open at
the end; a socket still open after that is reachable, and left open: that fails too.
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

# sys.unraisablehook appends each exception Python ignored; the guard reads it
ignored_during_test = []


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


# --- the order tests are dealt out in ---------------------------------------------------

def pytest_collection_modifyitems(items):
    """Tests marked `slow` go first, so no worker is left running one after the rest finish."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


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


def closed_port_addr():
    """An address where nothing listens: a port the OS gave out and took back."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        return listener.getsockname()


def need_wild_venvs(wild):
    """Skip without the pinned redis-py venvs that `make wild-venvs` makes (`wild` is the
    incident's module, passed in so this file imports nothing of the project), except in CI."""
    missing = [version for version in wild.VERSIONS if not wild.venv_python(version).exists()]
    if missing:
        reason = (f"no venv for redis-py {', '.join(missing)}: `make wild-venvs` makes them "
                  "from the package index")
        if os.environ.get("CI") == "true":
            pytest.fail(reason + "; CI must run the wild scenario")
        pytest.skip(reason)
