"""The leak guard in conftest.py, run on tests that leak: each kind of leak fails
its test, and a test that cleans up passes without a collection."""
import gc
import socket
import sys
import threading
from pathlib import Path

import conftest

CONFTEST = Path(__file__).parent.parent / "conftest.py"

LEAKING_TESTS = '''
import socket
import threading
import time

KEPT = []


def test_leaves_a_thread_running():
    threading.Thread(target=time.sleep, args=(0.2,), name="left-running").start()


def test_drops_an_open_socket_into_a_reference_cycle():
    cycle = [socket.socket()]
    cycle.append(cycle)   # only the cycle collector can free it, and the socket with it


def test_drops_an_open_socket():
    socket.socket()   # freed at once by reference counting


def test_keeps_a_socket_open():
    KEPT.append(socket.socket())


class RaisesWhenFreed:
    def __del__(self):
        raise ValueError("raised while being freed")


def test_makes_python_ignore_an_exception():
    RaisesWhenFreed()   # freed at once; Python can only print what __del__ raised


def test_closes_every_socket_it_opens():
    with socket.socket() as sock:
        cycle = [sock]
        cycle.append(cycle)
'''


def test_the_guard_fails_each_kind_of_leak_and_passes_a_clean_test(pytester, monkeypatch):
    # the inner conftest wraps socket.__init__ again; put the outer one back afterwards
    monkeypatch.setattr(socket.socket, "__init__", socket.socket.__init__)
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)   # and the hook it sets
    pytester.makeconftest(CONFTEST.read_text(encoding="utf-8"))
    pytester.makepyfile(test_leaking=LEAKING_TESTS)
    collections = []
    collect = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *generation: collections.append(collect(*generation)))
    try:
        # -rN: no summary, which under CI repeats each error in full
        result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:hypothesispytest",
                                    "-p", "no:unraisableexception", "-rN")
    finally:
        for thread in threading.enumerate():
            if thread.name == "left-running":
                thread.join()
        for sock in conftest.open_sockets():   # the one the inner test kept
            sock.close()
    result.assert_outcomes(passed=6, errors=5)   # each test's call passed; five teardowns failed
    output = result.stdout.str()
    assert "threads left running: [<Thread(left-running" in output
    assert output.count('resources left open: ["unclosed <socket.socket') == 2
    assert "sockets left open: [<socket.socket" in output
    assert ("exceptions ignored: ['ValueError: raised while being freed in "
            "<function RaisesWhenFreed.__del__") in output
    assert "ERROR test_leaking.py::test_closes_every_socket_it_opens" not in output
    # the guard collects only after the two tests that ended with a socket still open
    assert len(collections) == 2
