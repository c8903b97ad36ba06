"""The reliability cache's claims (part2/cache.py): windows, thresholds, policies, derived
caches, settings and callbacks, each pinned with exact figures, on a VirtualClock."""
import inspect
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from part2 import cache as caches
from part2.managed import ManagedClient, RealClock, ReliabilityCache, VirtualClock
from part2.managed_demo import in_background

A, B = ("127.0.0.2", 7001), ("127.0.0.2", 7002)   # cache keys only: nothing listens there
OTHER_HOST = ("127.0.0.3", 7001)


# --- windows and thresholds ---------------------------------------------------------

def test_disable_windows_double_from_the_min_to_the_max_then_stay_there_and_a_success_resets_them():
    clock = VirtualClock()
    cache = ReliabilityCache(policy="independent", clock=clock)
    windows = []
    for _ in range(9):
        cache.record_error(A)
        _, start, end, _ = cache.windows[-1]
        windows.append(end - start)
        clock.advance(end - clock.now())   # to the first instant the port is enabled again
    assert windows == [1, 2, 4, 8, 16, 32, 64, 64, 64]
    cache.record_success(A)
    cache.record_error(A)
    _, start, end, _ = cache.windows[-1]
    assert end - start == 1.0


def test_threshold_counts_errors_in_a_row_and_errors_while_disabled_do_not_extend_the_window():
    clock = VirtualClock()
    cache = ReliabilityCache(policy="independent", threshold=3, clock=clock)
    cache.record_error(A)
    cache.record_error(A)
    assert cache.is_enabled(A)
    cache.record_error(A)
    assert not cache.is_enabled(A) and cache.disables == 1
    clock.advance(0.5)
    cache.record_error(A)   # while disabled: counted, window unchanged
    assert cache.errors == 4 and cache.disables == 1 and cache.windows[0][2] == 1.0
    clock.advance(0.4999)
    assert not cache.is_enabled(A)
    clock.advance(0.0001)
    assert cache.is_enabled(A)   # from the instant now() >= disabled_until
    cache.record_error(A)        # still at or above the threshold: one error disables again
    assert cache.windows[-1][1:3] == (1.0, 3.0)


def test_policy_none_counts_errors_but_never_disables():
    cache = ReliabilityCache(clock=VirtualClock())
    for _ in range(5):
        cache.record_error(A)
    assert cache.errors == 5 and cache.disables == 0 and cache.is_enabled(A)


@settings(max_examples=200, deadline=None)
@given(threshold=st.integers(1, 3),
       steps=st.lists(st.sampled_from(["error", "success", 0.5, 1.0, 3.0, 70.0]), max_size=40))
def test_each_window_is_min_doubled_per_disable_since_last_success_capped_at_max(threshold, steps):
    clock = VirtualClock()
    cache = ReliabilityCache(policy="independent", threshold=threshold, clock=clock)
    errors = disables = opened = 0   # errors and disables since the last success; windows in all
    window_end = -1.0
    for step in steps:
        if step == "error":
            cache.record_error(A)
            errors += 1
            if clock.now() >= window_end and errors >= threshold:
                disables, opened = disables + 1, opened + 1
                window_end = clock.now() + min(2.0 ** (disables - 1), 64.0)
                assert cache.windows[-1][1:3] == (clock.now(), window_end)
        elif step == "success":
            cache.record_success(A)
            errors = disables = 0
            window_end = -1.0
        else:
            clock.advance(step)
        assert cache.disables == opened
        assert cache.is_enabled(A) == (clock.now() >= window_end)


def test_a_lowered_disable_timeout_max_caps_a_window_that_has_already_grown():
    clock = VirtualClock()
    cache = ReliabilityCache(policy="independent", clock=clock)
    for _ in range(4):   # windows of 1, 2, 4 and 8 s: the next would last 16
        cache.record_error(A)
        clock.advance(cache.windows[-1][2] - clock.now())
    cache.configure(disable_timeout_max=2.0)
    cache.record_error(A)   # the fifth window: 2 s, not 16
    clock.advance(2.0)
    cache.record_error(A)   # and the sixth stays at the new max
    assert [end - start for _, start, end, _ in cache.windows] == [1, 2, 4, 8, 2, 2]


# --- host policies --------------------------------------------------------------------

def test_any_failing_port_disables_its_host_but_not_another_loopback_host():
    cache = ReliabilityCache(policy="any_failing_port_disables_host", clock=VirtualClock())
    cache.record_error(A)
    assert not cache.is_enabled(B) and cache.is_enabled(OTHER_HOST)
    assert [key for key, *_ in cache.windows] == [A, "127.0.0.2"]


def test_failing_port_disables_host_only_for_the_named_port():
    cache = ReliabilityCache(policy=("failing_port_disables_host", 7002), clock=VirtualClock())
    cache.record_error(A)
    assert cache.is_enabled(B) and not cache.is_enabled(A)
    cache.record_error(B)
    assert not cache.is_enabled(("127.0.0.2", 9999)) and cache.is_enabled(OTHER_HOST)


def test_a_host_stays_disabled_until_its_last_failing_ports_window_ends():
    clock = VirtualClock()
    cache = ReliabilityCache(policy="any_failing_port_disables_host", clock=clock)
    third = ("127.0.0.2", 7003)
    cache.record_error(A)   # A and its host: 0 to 1 s
    clock.advance(0.5)
    cache.record_error(B)   # B: 0.5 to 1.5 s; the host ends with B's window, not its own
    cache.record_success(A)   # recomputed from B: still disabled until 1.5
    clock.advance(0.6)
    assert not cache.is_enabled(third)
    cache.record_success(third)   # no entry for that port: the host is not touched
    assert not cache.is_enabled(third)
    cache.record_success(B)
    assert cache.is_enabled(third)
    assert [(key, start, end) for key, start, end, _ in cache.windows] == [
        (A, 0.0, 1.0), ("127.0.0.2", 0.0, 1.0), (B, 0.5, 1.5), ("127.0.0.2", 0.5, 1.5)]


def test_difference_a_host_policy_disables_a_loopback_host_too():
    cache = ReliabilityCache(policy="any_failing_port_disables_host", clock=VirtualClock())
    cache.record_error(("127.0.0.1", 7001))   # Ocamlnet would exempt 127.0.0.1
    assert not cache.is_enabled(("127.0.0.1", 7002))


# --- derived caches and the global one ------------------------------------------------

def test_derived_cache_forwards_errors_and_successes_inherits_live_and_needs_its_parent():
    clock = VirtualClock()
    parent = ReliabilityCache(policy="independent", threshold=2, clock=clock)
    child = parent.derive(threshold=1)
    assert child.clock is clock and child.setting("policy") == "independent"
    child.record_error(A)
    assert parent.errors == 1 and not child.is_enabled(A) and parent.is_enabled(A)
    child.record_success(A)
    assert parent.successes == 1 and child.is_enabled(A)
    parent.record_error(A)
    parent.record_error(A)   # the parent disables: the child, which never saw these, follows
    assert not child.is_enabled(A) and (child.errors, parent.errors) == (1, 3)
    parent.configure(policy="none")   # inherited live, not copied at derive()
    assert child.setting("policy") == "none"


def test_a_setting_derived_as_none_is_inherited_the_clock_included():
    clock = VirtualClock()
    parent = ReliabilityCache(policy="independent", threshold=2, clock=clock)
    child = parent.derive(clock=None, threshold=None, disable_timeout_min=3.0)
    assert (child.clock is clock and child.setting("threshold") == 2
            and child.setting("policy") == "independent")
    child.record_error(A)
    child.record_error(A)
    assert not child.is_enabled(A) and child.windows[-1][1:3] == (0.0, 3.0)
    child.configure(disable_timeout_min=None)   # inherited again
    assert child.setting("disable_timeout_min") == 1.0


def test_global_cache_has_no_effect_until_configured_then_changes_in_place_for_every_user():
    clock = VirtualClock()
    client = ManagedClient(A, clock=clock)
    assert client.rcache is caches.global_rcache()
    caches.global_rcache().record_error(A)
    assert caches.global_rcache().is_enabled(A)
    try:
        caches.set_global_rcache_config(policy="independent", clock=clock)
        caches.global_rcache().record_error(A)
        assert not client.rcache.is_enabled(A)
    finally:
        caches.set_global_rcache_config(policy="none", clock=RealClock())
        caches.global_rcache().record_success(A)
        client.shut_down()


# --- counters ---------------------------------------------------------------------------

class Unlockable:
    """A hook's condition that may not be taken: entering it is a test failure."""

    def __enter__(self):
        raise AssertionError("a counter's bump took the hook's condition")


def test_a_success_counted_while_no_one_waits_takes_no_lock_here_or_in_the_parent():
    parent = ReliabilityCache()
    child = parent.derive()
    for cache in (parent, child):
        cache._changed = Unlockable()
    child.record_success(A)
    child.record_success(A)
    assert (child.successes, parent.successes) == (2, 2)


def test_the_caches_counters_lose_no_bump_from_threads_bumping_at_once_and_wake_a_waiter():
    parent = ReliabilityCache()
    child = parent.derive()
    waiter = in_background(lambda: parent.wait_successes(4 * 5000) or "woke")

    def bump():
        for _ in range(5000):
            child.record_success(A)
    threads = [threading.Thread(target=bump) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert waiter.result() == "woke" and (child.successes, parent.successes) == (20000, 20000)
    assert parent.waiters == 0 and repr(parent).startswith(
        "<ReliabilityCache errors=0, successes=20000")


# --- settings --------------------------------------------------------------------------

def test_bad_cache_settings_are_clear_errors():
    with pytest.raises(ValueError, match="policy"):
        ReliabilityCache(policy="sometimes")
    with pytest.raises(ValueError, match="threshold"):
        ReliabilityCache(threshold=0)
    with pytest.raises(TypeError, match="treshold"):
        ReliabilityCache(treshold=2)


def test_an_unknown_setting_is_a_type_error_everywhere_and_changes_nothing():
    cache = ReliabilityCache(policy="independent", threshold=2)
    for change in (cache.configure, cache.derive, caches.set_global_rcache_config):
        with pytest.raises(TypeError, match="treshold"):
            change(policy="any_failing_port_disables_host", treshold=5)
    assert (cache.setting("policy") == "independent"
            and caches.global_rcache().setting("policy") == "none")


def test_a_rejected_change_is_never_visible_even_while_it_is_checked():
    cache = ReliabilityCache()
    seen = []

    # a threshold that, when the check compares it, records the policy in force and fails
    class Spy:
        def __lt__(self, other):
            seen.append(cache.setting("policy"))
            return True

    with pytest.raises(ValueError, match="threshold"):
        cache.configure(policy="independent", threshold=Spy())
    assert seen == ["none"] and cache.setting("policy") == "none"


def test_a_rejected_setting_changes_nothing():
    cache = ReliabilityCache(policy="independent", threshold=2)
    with pytest.raises(ValueError):
        cache.configure(threshold=0, policy="none")
    assert (cache.setting("threshold"), cache.setting("policy")) == (2, "independent")


def test_the_cache_spells_out_the_contracts_signature():
    parameters = inspect.signature(ReliabilityCache).parameters
    assert {name: parameter.default for name, parameter in parameters.items()} == {
        "policy": "none", "threshold": 1, "disable_timeout_min": 1.0, "disable_timeout_max": 64.0,
        "availability": None, "clock": None, "parent": None, "on_event": None}
    assert [name for name, parameter in parameters.items()
            if parameter.kind is parameter.KEYWORD_ONLY] == ["parent", "on_event"]
    assert ReliabilityCache("independent", 2).setting("threshold") == 2
    assert ReliabilityCache("independent").setting("policy") == "independent"


# --- callbacks -------------------------------------------------------------------------

def test_the_availability_callback_is_asked_on_every_check():
    asked = []
    cache = ReliabilityCache(availability=lambda addr: asked.append(addr) or addr != B)
    assert cache.is_enabled(A) and not cache.is_enabled(B) and cache.is_enabled(A)
    assert asked == [A, B, A]


def test_a_derived_cache_asks_each_availability_callback_once():
    asked = []
    parent = ReliabilityCache(availability=lambda addr: asked.append("parent") or True)
    child = parent.derive(policy="independent")
    grandchild = child.derive(availability=lambda addr: asked.append("grandchild") or True)
    assert child.is_enabled(A) and grandchild.is_enabled(A)
    assert asked == ["parent", "grandchild", "parent"]


def test_a_raising_cache_callback_changes_nothing_but_its_count():
    def raises(*args):
        raise RuntimeError("a bug in the user's callback")
    cache = ReliabilityCache(policy="independent", availability=raises, on_event=raises,
                             clock=VirtualClock())
    assert cache.is_enabled(A)   # an availability callback that raises has no say
    cache.record_error(A)        # the window opens; its on_event raised
    assert (cache.disables, cache.callback_errors, cache.is_enabled(A)) == (1, 2, False)
