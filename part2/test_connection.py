"""A connection's life (part2/connection.py), through ManagedClient on real sockets:
connecting and the initial ping, the EOFs and errors that end it, replies out of step,
writes under their deadline, idle timeouts, and the bounds on what it keeps."""
import os
import resource
import socket
import time

import pytest

from conftest import closed_port_addr
from part2 import client as clients
from part2 import connection as connections
from part2.managed import (CommunicationError, ManagedClient, MessageLost, MessageTimeout,
                           ReliabilityCache, VirtualClock)
from part2.loop import Loop
from part2.managed_demo import in_background, outcome
from scaffolding.faults import FaultyUpstream
from ground.frames import MAX_LINE
from tcp_proxy import LineFraming


# --- connecting and the initial ping -----------------------------------------------------

def test_connect_refused_is_a_communication_error_counted_as_an_error():
    cache = ReliabilityCache()
    client = ManagedClient(closed_port_addr(), rcache=cache)
    with pytest.raises(CommunicationError, match="cannot connect"):
        client.call(b"GET a\n")
    assert (client.state, client.errors, cache.errors) == ("down", 1, 1)
    client.shut_down()


def test_a_failed_initial_ping_fails_every_waiting_call_and_sends_no_user_request():
    clock = VirtualClock()
    with FaultyUpstream(every="skip") as upstream:
        client = ManagedClient(upstream.addr, initial_ping=True, msg_timeout=1.0, clock=clock)
        calls = [in_background(client.call, b"GET secret\n") for _ in range(2)]
        client.wait_calls(2)
        upstream.wait_requests(1)
        # both wait on the ping: advanced sooner, one could time out as "no connection"
        client.wait_waiting(2)
        assert client.state == "connecting"
        clock.advance(1.0)
        assert [call.result() for call in calls] == [
            "MessageTimeout: initial ping not answered within 1.0s"] * 2
        assert list(upstream.parsed) == ["PING"] and client.errors == 1
        client.shut_down()


def test_a_deadline_passing_once_the_ping_is_sent_is_a_timeout_not_a_lost_message():
    """The clock moves in the callback that hears the ping sent: its deadline has passed when
    the next turn looks. (With a thread per connection the write itself could come late: a
    request not written in time. On the loop the ping is written in the turn it is queued.)"""
    clock = VirtualClock()

    def deadline_passes_once_the_ping_is_sent(client, event):
        if event[0] == "sent" and event[-1] == b"PING\n":
            clock.advance(1.0)

    with FaultyUpstream(every="skip") as upstream:
        client = ManagedClient(upstream.addr, initial_ping=True, msg_timeout=1.0, clock=clock,
                               on_event=deadline_passes_once_the_ping_is_sent,
                               rcache=ReliabilityCache())
        with pytest.raises(MessageTimeout, match="initial ping not answered within 1.0s"):
            client.call(b"GET a\n")
        assert (client.state, client.errors, client.sent) == ("down", 1, 1)
        ended = ("connecting", "down", "initial ping not answered in time")
        assert client.transition_log[-1] == ended
        upstream.wait_requests(1)
        assert list(upstream.parsed) == ["PING"]
        client.shut_down()


def test_on_the_real_clock_an_unanswered_initial_ping_times_out_before_its_caller_gives_up():
    with FaultyUpstream(every="skip") as upstream:
        cache = ReliabilityCache()
        # 0.5 s, not 0.05: the connect and the ping's write must be done by the deadline, and on a
        # loaded machine 0.05 s once ran out before the write (the test above has that case)
        client = ManagedClient(upstream.addr, rcache=cache, initial_ping=True, msg_timeout=0.5)
        with pytest.raises(MessageTimeout, match="initial ping not answered within 0.5s"):
            client.call(b"GET a\n")
        assert (client.state, client.errors, cache.errors) == ("down", 1, 1)
        assert client.transition_log[-1] == ("connecting", "down",
                                             "initial ping not answered in time")
        upstream.wait_requests(1)
        assert list(upstream.parsed) == ["PING"]
        client.shut_down()


def test_an_initial_ping_on_a_dying_connection_raises_message_lost():
    with FaultyUpstream() as upstream:
        upstream.fail_next(1)
        client = ManagedClient(upstream.addr, initial_ping=True)
        with pytest.raises(MessageLost):
            client.call(b"GET a\n")
        assert list(upstream.parsed) == ["PING"]
        assert client.call(b"GET a\n") == b"a=AAAAAAAAAAAA\n"   # a new connection, a new ping
        assert list(upstream.parsed) == ["PING", "PING", "GET a"] and client.errors == 1
        client.shut_down()


def test_an_answered_initial_ping_is_a_success_that_resets_the_cache_entry():
    clock = VirtualClock()
    cache = ReliabilityCache(policy="independent", threshold=2, clock=clock)
    with FaultyUpstream(hold={2}) as upstream:   # the ping's reply passes, the request's is held
        client = ManagedClient(upstream.addr, rcache=cache, initial_ping=True, clock=clock)
        cache.record_error(upstream.addr)   # one error in a row: one short of the threshold
        call = in_background(client.call, b"GET a\n")
        upstream.wait_held(1)
        assert client.state == "up" and (cache.successes, client.replies) == (1, 0)
        cache.record_error(upstream.addr)   # one in a row again, not two: still enabled
        assert cache.is_enabled(upstream.addr) and cache.disables == 0
        upstream.release()
        assert call.result() == "a=AAAAAAAAAAAA"
        client.shut_down()


def test_an_accept_and_close_upstream_costs_one_connection_one_error_and_ends_by_the_deadline():
    with FaultyUpstream(on_connect="close") as upstream:
        # the EOF races the call's send and its own check: try both ways
        for attempt in range(1, 11):
            cache = ReliabilityCache()
            client = ManagedClient(upstream.addr, rcache=cache, msg_timeout=0.5)
            started = time.monotonic()
            with pytest.raises((CommunicationError, MessageLost),
                               match="upstream closed the connection"):
                client.call(b"GET a\n")
            assert time.monotonic() - started < 0.55
            assert (client.connects, client.errors, cache.errors, client.state) == (1, 1, 1, "down")
            client.shut_down()
        upstream.wait_connections(10)
        assert upstream.connections == 10


# --- how a connection ends: EOFs, errors, replies out of step ------------------------------

def test_idle_eof_takes_the_client_down_without_an_error_and_the_next_call_reconnects():
    with FaultyUpstream() as upstream:
        client = ManagedClient(upstream.addr, rcache=ReliabilityCache())
        assert client.state == "down"
        assert client.call(b"GET a\n") == b"a=AAAAAAAAAAAA\n" and client.state == "up"
        upstream.close()
        client.wait_transitions(3)
        upstream.restart()
        assert client.call(b"GET b\n") == b"b=BBBBBBBBBBBB\n"
        assert [t[:2] for t in client.transition_log] == [("down", "connecting"),
                                                       ("connecting", "up"),
                                                       ("up", "down"), ("down", "connecting"),
                                                       ("connecting", "up")]
        assert client.transition_log[2][2] == "upstream closed the idle connection"
        assert (client.errors, client.connects, client.rcache.errors) == (0, 2, 0)
        client.shut_down()


def test_a_call_handed_over_once_an_idle_eof_has_arrived_reconnects_without_an_error():
    """The EOF and the call wait for the same turn: the turn reads before it takes what was
    handed over, so the call finds the client down and connects, and nothing is lost."""
    with FaultyUpstream() as upstream:
        cache = ReliabilityCache()
        client = ManagedClient(upstream.addr, rcache=cache, loop=Loop())   # turned here
        client.call(b"GET a\n")
        upstream.close()   # the EOF reaches the kernel; no turn has read it yet
        upstream.restart()
        old = client.connection.transport.sock
        while old.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b"":
            time.sleep(0.001)
        assert client.call(b"GET b\n") == b"b=BBBBBBBBBBBB\n"
        assert client.transition_log[2] == ("up", "down", "upstream closed the idle connection")
        assert (client.errors, cache.errors, client.connects) == (0, 0, 2)
        assert list(upstream.parsed) == ["GET a", "GET b"]
        client.shut_down()
        client.loop.shut_down()


def test_upstream_restarts_on_the_same_port():
    upstream = FaultyUpstream()
    addr = upstream.addr
    upstream.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(addr).close()
    upstream.restart()
    client = ManagedClient(addr)
    assert client.call(b"PING\n") == b"PONG\n" and upstream.addr == addr
    client.shut_down()
    upstream.close()


def test_an_error_counts_once_per_connection_not_once_per_pending_call():
    with FaultyUpstream(hold={1}) as upstream:
        cache = ReliabilityCache()
        client = ManagedClient(upstream.addr, rcache=cache)
        calls = [in_background(client.call, b"GET %d\n" % n) for n in range(3)]
        upstream.wait_requests(3)
        upstream.wait_held(1)
        upstream.fail_next(1)   # reply 1 is already held past the fault check: reply 2 is dropped
        upstream.release()
        lost = "MessageLost: upstream closed the connection"
        results = [call.result() for call in calls]   # the three were sent in any order
        assert results.count(lost) == 2
        assert [f"{n}={n}" + str(n) * 11 for n, result in enumerate(results) if result != lost] == \
            [result for result in results if result != lost]
        assert (client.errors, cache.errors, client.pending_calls) == (1, 1, 0)
        assert client.transition_log[-1] == (
            "up", "down", "upstream closed the connection with 2 call(s) owed")
        # the client never retries by itself
        assert upstream.requests == 3 and client.connects == 1
        client.shut_down()


def test_a_reply_cut_mid_line_is_message_lost_never_a_short_reply():
    with FaultyUpstream() as upstream:
        upstream.fail_next(1, how="cut")
        client = ManagedClient(upstream.addr)
        with pytest.raises(MessageLost):
            client.call(b"GET apple\n")
        assert upstream.faults == 1 and client.call(b"GET b\n") == b"b=BBBBBBBBBBBB\n"
        client.shut_down()


def test_an_eof_while_only_an_abandoned_call_is_owed_is_quiet():
    clock = VirtualClock()
    with FaultyUpstream() as upstream:
        cache = ReliabilityCache()
        client = ManagedClient(upstream.addr, rcache=cache, msg_timeout=1.0, clock=clock)
        client.call(b"GET a\n")
        upstream.fail_next(1, how="skip")
        late = in_background(client.call, b"GET b\n")
        upstream.wait_faults(1)
        clock.advance(1.0)
        assert late.result() == "MessageTimeout: no reply within 1.0s"
        upstream.close()
        client.wait_transitions(3)
        assert (client.errors, cache.errors, client.pending_calls) == (0, 0, 0)
        assert client.transition_log[2] == (   # quiet, but not idle: a reply was owed still
            "up", "down", "upstream closed the connection, owing only replies no caller waits for")
        client.shut_down()


def test_the_framings_max_reply_bounds_a_reply_that_has_not_ended():
    class ShortLines(LineFraming):
        max_reply = 16

    # reply 2: its first 20 bytes, then held
    with FaultyUpstream(hold={2}, split_at=20) as upstream:
        client = ManagedClient(upstream.addr, framing=ShortLines())
        assert client.call(b"GET a\n") == b"a=AAAAAAAAAAAA\n"   # 15 bytes
        assert outcome(client.call, b"GET " + b"k" * 40 + b"\n") == \
            "MessageLost: upstream out of step: a reply longer than 16 bytes"
        upstream.release()
        assert (client.errors, client.state) == (1, "down")
        client.shut_down()
    # MAX_LINE + 1 bytes and no end: LINES' own bound
    with FaultyUpstream(every="endless") as endless:
        client = ManagedClient(endless.addr)
        assert outcome(client.call, b"GET a\n") == \
            f"MessageLost: upstream out of step: a reply longer than {MAX_LINE} bytes"
        client.shut_down()


# --- writes under their deadline ------------------------------------------------------------

def test_a_request_larger_than_buffers_to_a_deaf_upstream_times_out_and_so_does_the_one_behind():
    clock = VirtualClock()
    with FaultyUpstream(on_connect="deaf") as upstream:
        client = ManagedClient(upstream.addr, msg_timeout=0.5, clock=clock)
        big = in_background(client.call, b"GET " + b"k" * (64 << 20) + b"\n")
        client.wait_sent(1)   # the big request has the connection's write turn
        small = in_background(client.call, b"GET a\n")
        client.wait_calls(2)
        clock.advance(0.5)
        assert big.result() == "MessageTimeout: request not sent within 0.5s"
        assert small.result() in (
            "MessageTimeout: request not sent within 0.5s",
            "MessageLost: a request not written in time closed the connection")
        assert (client.sent, client.errors, client.state) == (1, 1, "down")
        client.shut_down()


def test_a_write_that_must_wait_on_a_descriptor_select_cannot_watch_times_out_cleanly():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"needs 2,048 descriptors, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    # descriptors taking every number up to 1023, so the client's socket gets a higher one
    fillers = []
    try:
        while not fillers or fillers[-1] < 1024:
            fillers.append(os.open(os.devnull, os.O_RDONLY))
        with FaultyUpstream(on_connect="deaf") as upstream:
            # real time: the write must block, and wait
            client = ManagedClient(upstream.addr, msg_timeout=0.5)
            # more than buffers hold
            big = in_background(client.call, b"GET " + b"k" * (64 << 20) + b"\n")
            assert big.result() == "MessageTimeout: request not sent within 0.5s"
            assert (client.sent, client.written, client.errors, client.state) == (1, 0, 1, "down")
            assert client.transition_log[-1][2] == "a request not written in time"
            client.shut_down()
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# --- idle timeouts ----------------------------------------------------------------------------

def test_idle_timeout_fires_on_the_virtual_clock_with_no_call_to_notice_it():
    clock = VirtualClock()
    with FaultyUpstream() as upstream:
        client = ManagedClient(upstream.addr, idle_timeout=5.0, clock=clock)
        client.call(b"GET x\n")
        clock.advance(4.9)
        assert client.state == "up" and client.transitions == 2
        clock.advance(0.1)
        client.wait_transitions(3)
        assert client.transition_log[2] == ("up", "down", "idle for 5.0s") and client.errors == 0
        client.call(b"GET y\n")
        assert client.connects == 2
        client.shut_down()


def test_idle_timeout_zero_closes_right_after_the_last_reply_and_negative_never_closes():
    with FaultyUpstream() as upstream:
        eager, patient = ManagedClient(upstream.addr, idle_timeout=0), ManagedClient(upstream.addr)
        for client in (eager, patient):
            client.call(b"GET a\n")
            client.call(b"GET b\n")
        assert (eager.connects == 2 and "idle" in eager.transition_log[-1][2]
                and eager.state == "down")
        assert patient.connects == 1 and patient.state == "up"
        eager.shut_down()
        patient.shut_down()


def test_on_the_real_clock_a_message_timeout_and_an_idle_timeout_fire_by_themselves():
    with FaultyUpstream(every="skip") as silent, FaultyUpstream() as answering:
        waiting = ManagedClient(silent.addr, msg_timeout=0.05)
        started = time.monotonic()
        with pytest.raises(MessageTimeout):
            waiting.call(b"GET a\n")
        assert 0.05 <= time.monotonic() - started < 5
        idle = ManagedClient(answering.addr, idle_timeout=0.05)
        idle.call(b"GET a\n")
        idle.wait_transitions(3)
        assert idle.transition_log[2] == ("up", "down", "idle for 0.05s")
        waiting.shut_down()
        idle.shut_down()


# --- bounds -------------------------------------------------------------------------------------

def test_abandoned_calls_and_the_transition_log_are_bounded(monkeypatch):
    monkeypatch.setattr(connections, "ABANDONED_MAX", 2)
    clock = VirtualClock()
    with FaultyUpstream(every="skip") as upstream:
        client = ManagedClient(upstream.addr, msg_timeout=1.0, clock=clock)
        calls = []
        for number in (1, 2, 3):
            calls.append(in_background(client.call, b"GET a\n"))
            client.wait_written(number)
        clock.advance(1.0)
        assert [call.result() for call in calls] == ["MessageTimeout: no reply within 1.0s"] * 3
        client.wait_errors(1)
        assert client.transition_log[-1] == ("up", "down", "more than 2 abandoned calls owed")
        assert client.pending_calls == 0
        client.shut_down()
    with FaultyUpstream() as upstream:
        client = ManagedClient(upstream.addr, idle_timeout=0)
        for _ in range(30):
            client.call(b"GET a\n")
        assert (client.transitions == 90
                and len(client.transition_log) == clients.TRANSITIONS_KEPT == 64)
        client.shut_down()
