"""Shared test guards: no test may leave a thread running or a socket unclosed."""
import gc
import threading
import warnings

import pytest


@pytest.fixture(autouse=True)
def no_leaks():
    """Fail a test that leaves a thread alive or lets a socket be collected unclosed."""
    before = set(threading.enumerate())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        yield
        gc.collect()
    leaked = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert not leaked, f"threads left running: {leaked}"
    unclosed = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert not unclosed, f"resources left open: {unclosed}"
