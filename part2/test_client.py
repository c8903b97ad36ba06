"""ManagedClient's claims (part2/client.py): a thread's call and its deadline, the two rules
for a timed-out call (and the forgetful one they replace), the cache asked first, bad
input, shut_down(), and the events a client tells, made on its loop's thread."""
import math
import threading

import pytest

from part2.managed import (ManagedClient, ManagedError, ManagedSet, ReliabilityCache,
                           ServiceUnavailable, VirtualClock)
from part2.managed_demo import in_background, outcome
from scaffolding.faults import FaultyUpstream
from ground.server import Hooks
from tcp_proxy import answer

A = ("127.0.0.2", 7001)   # nothing listens there


def test_a_client_made_on_its_own_turns_one_loop_on_a_thread_of_its_own_that_shut_down_joins():
    before = set(threading.enumerate())
    with FaultyUpstream() as upstream:
        client = ManagedClient(upstream.addr)
        replies = [client.call(b"GET %d\n" % n) for n in range(3)]
        assert replies == [answer(b"GET %d" % n) for n in range(3)]
        assert set(threading.enumerate()) - before - set(upstream._threads) == {client.loop.thread}
        client.shut_down()
        assert not client.loop.thread.is_alive() and client.loop.stopped


# --- a timed-out call ---------------------------------------------------------------------

def test_non_fatal_timeout_keeps_the_connection_the_late_reply_is_discarded_and_counts_as_pending():
    clock = VirtualClock()
    with FaultyUpstream(hold={1}) as upstream:
        client = ManagedClient(upstream.addr, msg_timeout=1.0, clock=clock)
        first = in_background(client.call, b"GET apple\n")
        client.wait_sent(1)
        upstream.wait_held(1)   # reply 1 is the one held: no later reply takes its number
        clock.advance(0.999)
        assert first._thread.is_alive()
        clock.advance(0.001)
        assert first.result() == "MessageTimeout: no reply within 1.0s"
        assert client.pending_calls == 1 and client.state == "up"
        second = in_background(client.call, b"GET banana\n")
        client.wait_sent(2)
        upstream.release()
        assert second.result() == "banana=BBBBBBBBBBBB"
        assert (client.discarded, client.connects, client.errors,
                client.pending_calls) == (1, 1, 0, 0)
        client.shut_down()


def test_fatal_timeout_destroys_the_connection_and_the_next_call_gets_its_own_reply():
    clock = VirtualClock()
    with FaultyUpstream(hold={1}) as upstream:
        client = ManagedClient(upstream.addr, msg_timeout=1.0, msg_timeout_is_fatal=True,
                               clock=clock)
        first = in_background(client.call, b"GET apple\n")
        client.wait_sent(1)
        upstream.wait_held(1)   # reply 1 is the one held: no later reply takes its number
        clock.advance(1.0)
        assert first.result() == "MessageTimeout: no reply within 1.0s"
        assert client.transition_log[-1] == ("up", "down", "message timeout (fatal)")
        assert client.call(b"GET banana\n") == b"banana=BBBBBBBBBBBB\n"
        assert (client.connects, client.errors, client.discarded) == (2, 1, 0)
        client.shut_down()


def test_after_a_fatal_timeout_the_other_calls_on_the_connection_are_lost_not_timed_out():
    clock = VirtualClock()
    with FaultyUpstream(hold={1}) as upstream:
        client = ManagedClient(upstream.addr, msg_timeout=1.0, msg_timeout_is_fatal=True,
                               clock=clock)
        first = in_background(client.call, b"GET a\n")
        client.wait_written(1)
        clock.advance(0.5)
        second = in_background(client.call, b"GET b\n")
        client.wait_written(2)
        clock.advance(0.5)
        assert first.result() == "MessageTimeout: no reply within 1.0s"
        assert second.result() == (
            "MessageLost: another call's fatal message timeout closed the connection")
        assert client.errors == 1
        client.shut_down()


def test_the_forgetful_knob_really_misdelivers_a_late_reply():
    clock = VirtualClock()
    with FaultyUpstream(hold={1}) as upstream:
        client = ManagedClient(upstream.addr, msg_timeout=1.0, clock=clock, late_replies="forget")
        first = in_background(client.call, b"GET apple\n")
        client.wait_sent(1)
        upstream.wait_held(1)   # reply 1 is the one held: no later reply takes its number
        clock.advance(1.0)
        first.result()
        second = in_background(client.call, b"GET banana\n")
        client.wait_sent(2)
        upstream.release()
        assert second.result() == "apple=AAAAAAAAAAAA"
        client.shut_down()


def test_user_timeouts_inf_or_too_long_for_a_wait_mean_never_and_nan_is_a_value_error():
    with FaultyUpstream() as upstream:
        for never in (math.inf, 1e10):
            for fatal in (False, True):
                client = ManagedClient(upstream.addr, msg_timeout=never, idle_timeout=never,
                                       msg_timeout_is_fatal=fatal, initial_ping=True)
                assert client.call(b"GET a\n") == b"a=AAAAAAAAAAAA\n" and client.state == "up"
                client.shut_down()
    for setting in ("msg_timeout", "idle_timeout"):
        for bad in (math.nan, "1.0", None):
            with pytest.raises(ValueError, match=setting):
                ManagedClient(A, **{setting: bad})
    for bad in (math.nan, -1.0):
        with pytest.raises(ValueError, match="idempotent_wait"):
            ManagedSet([(A, 1)], idempotent_wait=bad)


# --- before a call is sent, and after the client is shut down -------------------------------

def test_a_disabled_port_fails_at_once_with_service_unavailable_even_when_up():
    clock = VirtualClock()
    cache = ReliabilityCache(policy="independent", clock=clock)
    with FaultyUpstream() as upstream:
        client = ManagedClient(upstream.addr, rcache=cache, clock=clock)
        client.call(b"GET a\n")
        cache.record_error(upstream.addr)
        with pytest.raises(ServiceUnavailable):
            client.call(b"GET b\n")
        assert client.state == "up" and list(upstream.parsed) == ["GET a"]
        clock.advance(1.0)
        assert client.call(b"GET b\n") == b"b=BBBBBBBBBBBB\n"
        client.shut_down()


def test_bad_requests_and_settings_are_value_errors():
    client = ManagedClient(A)
    for request in (b"GET a", b"GET a\nGET b\n", "GET a\n"):
        with pytest.raises(ValueError, match="one line"):
            client.call(request)
    with pytest.raises(ValueError):
        ManagedClient(A, late_replies="keep")
    client.shut_down()
    with pytest.raises(ManagedError, match="shut down"):
        client.call(b"GET a\n")


def test_shut_down_fails_a_pending_call_and_joins_every_thread():
    with FaultyUpstream(every="skip") as upstream:
        client = ManagedClient(upstream.addr, idle_timeout=30.0)
        call = in_background(client.call, b"GET a\n")
        upstream.wait_requests(1)
        client.shut_down()
        assert call.result() == "MessageLost: client shut down"
        assert client.transition_log[-1] == ("up", "down", "shut down") and client.errors == 0


def test_shut_down_stops_counting_an_abandoned_call_as_pending():
    clock = VirtualClock()
    with FaultyUpstream(hold={1}) as upstream:
        client = ManagedClient(upstream.addr, msg_timeout=1.0, clock=clock)
        late = in_background(client.call, b"GET a\n")
        upstream.wait_held(1)
        clock.advance(1.0)
        assert late.result() == "MessageTimeout: no reply within 1.0s" and client.pending_calls == 1
        client.shut_down()
        assert client.pending_calls == 0 and client.state == "down"


# --- events and callbacks -------------------------------------------------------------------

def test_on_event_tells_of_each_request_sent_call_timed_out_and_reply_with_the_calls_owed_then():
    clock, told = VirtualClock(), []
    with FaultyUpstream(hold={1}) as upstream:
        client = ManagedClient(upstream.addr, msg_timeout=1.0, clock=clock,
                               on_event=lambda source, event: told.append(event))
        apple = in_background(client.call, b"GET apple\n")
        upstream.wait_held(1)
        clock.advance(1.0)
        assert apple.result() == "MessageTimeout: no reply within 1.0s"
        upstream.release()
        client.wait_discarded(1)   # apple's late reply: told in the turn that read it
        client.shut_down()
    steps = [event for event in told if event[0] != "transition"]
    assert [(kind, t, owed, ended) for kind, t, _, owed, ended, *_ in steps] == [
        ("sent", 0.0, ((b"GET apple\n", False),), False),
        ("timed out", 1.0, ((b"GET apple\n", True),), False),
        ("reply", 1.0, (), False)]
    assert steps[0][5] == steps[1][5] == b"GET apple\n"
    assert (steps[2][5] == b"apple=AAAAAAAAAAAA\n" and steps[2][6].request == b"GET apple\n"
            and steps[2][6].abandoned)
    assert len({id(event[2]) for event in steps}) == 1   # one connection, told as the same object


def test_a_callback_that_raises_is_counted_logged_once_and_changes_no_call_and_no_state(caplog):
    seen = []

    def on_event(source, event):
        seen.append(event[1:3] if event[0] == "transition" else event[0])
        raise RuntimeError("a bug in the user's callback")
    with FaultyUpstream() as upstream:
        client = ManagedClient(upstream.addr, idle_timeout=0, msg_timeout=5.0, on_event=on_event)
        # each call connects: 3 transitions
        replies = [client.call(b"GET %d\n" % n) for n in range(4)]
        assert replies == [b"%d=%d" % (n, n) + b"%d" % n * 11 + b"\n" for n in range(4)]
        assert seen == [("down", "connecting"), ("connecting", "up"), "sent", ("up", "down"),
                        "reply"] * 4
        assert (client.callback_errors, client.errors, client.connects,
                client.state) == (20, 0, 4, "down")
        client.shut_down()
    logged = [record for record in caplog.records if record.name == "part2.managed"]
    assert len(logged) == 1 and "ManagedClient" in logged[0].getMessage() and logged[0].exc_info


def test_a_callback_may_call_the_client_it_hears_from_even_on_the_initial_pings_answer():
    """The callback runs on the loop's thread, so its call turns the loop itself until its
    reply comes, as Ocamlnet's synchronous calls do; the caller's own call may return first."""
    with FaultyUpstream() as upstream:
        from_callback, heard = [], threading.Event()

        def on_event(source, event):
            if event[1:3] == ("connecting", "up") and not from_callback:
                # on the loop's thread, at a turn's end
                from_callback.append(client.call(b"GET h\n"))
                heard.set()
        client = ManagedClient(upstream.addr, initial_ping=True, msg_timeout=5.0, on_event=on_event)
        assert client.call(b"GET a\n") == b"a=AAAAAAAAAAAA\n"
        assert heard.wait(Hooks.hook_timeout) and from_callback == [b"h=HHHHHHHHHHHH\n"]
        assert list(upstream.parsed) == ["PING", "GET a", "GET h"]
        client.shut_down()


def test_a_blocking_call_from_an_availability_callback_is_refused_with_a_clear_error():
    """The cache is asked in the middle of a turn's work: a call there would turn the loop
    inside itself, so it is refused, and the pick it was asked for goes on."""
    with FaultyUpstream() as upstream:
        made = []

        def availability(addr):
            made.append(outcome(inner.call, b"GET inner\n"))   # on the loop's thread, mid-turn
            return True
        cache = ReliabilityCache(availability=availability)
        managed_set = ManagedSet([(upstream.addr, 1)], rcache=cache)
        inner = ManagedClient(upstream.addr, loop=managed_set.loop, rcache=ReliabilityCache())
        assert managed_set.call(b"GET a\n") == b"a=AAAAAAAAAAAA\n"
        assert made == ["ManagedError: a blocking call from inside a turn's work (an availability "
                        "callback) is refused: make it from on_event or another thread"]
        assert list(upstream.parsed) == ["GET a"]
        managed_set.shut_down()
