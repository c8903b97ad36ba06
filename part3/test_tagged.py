"""tagged.py: every reply reaches the call that owns its id, in any order, over one connection."""
import os
import socket
import threading

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from part3.tagged import (CallTimeout, ConnectionBroken, TaggedClient, TaggedUpstream, parse_tagged)
from ground.server import Server
from tcp_proxy import answer, read_lines

EXAMPLES = int(os.environ.get("SOAK", "25"))   # `make soak` raises it; the suite stays fast


def in_threads(work, arguments, started=lambda number: None):
    """Run work(argument) on a thread per argument; return {argument: result or the exception}.
    started(n) is called once the n-th thread has started (a hook to wait on before the next)."""
    results = {}

    def run(argument):
        try:
            results[argument] = work(argument)
        except Exception as error:   # the test asserts on it
            results[argument] = error

    threads = [threading.Thread(target=run, args=(argument,)) for argument in arguments]
    for number, thread in enumerate(threads, 1):
        thread.start()
        started(number)
    for thread in threads:
        thread.join()
    return results


def get(key):
    return b"GET %s\n" % key.encode()


def answer_in_order(upstream, keys):
    """A pause hook: the reply to keys[i] leaves only after i replies have been written."""
    position = {key: index for index, key in enumerate(keys)}
    return lambda key: upstream.wait_until(lambda: upstream.replies >= position[key]
                                           or upstream.closed,
                                           f"reply {position[key]} of {keys}")


class ScriptedUpstream(Server):
    """A lying upstream: after `after` request lines it writes `script`, then reads on."""

    def __init__(self, script, after):
        super().__init__()
        self.script, self.after = script, after

    def handle(self, conn):
        for number, _ in enumerate(read_lines(conn), 1):
            if number == self.after:
                conn.sendall(self.script)


# --- the protocol -------------------------------------------------------------------------

def test_parse_tagged_takes_a_plain_decimal_id_and_refuses_signs_leading_zeros_and_no_space():
    assert parse_tagged(b"12 GET k") == (12, b"GET k")
    assert parse_tagged(b"0 x") == (0, b"x")
    for line in (b"012 GET k", b"+1 x", b"-1 x", b"1x", b"GET k", b"", b" 1 x", b"1"):
        with pytest.raises(ValueError):
            parse_tagged(line)


# --- out of order, each to its caller -----------------------------------------------------

def test_replies_written_in_reverse_order_each_reach_their_own_caller():
    keys = ["alpha", "bravo", "charlie", "delta"]
    with TaggedUpstream() as upstream, TaggedClient(upstream.addr) as client:
        upstream.pause = answer_in_order(upstream, keys[::-1])
        results = in_threads(lambda key: client.call(get(key)), keys)
        assert results == {key: answer(get(key)[:-1]) for key in keys}
        assert upstream.connections == 1 and client.replies == 4
        upstream.wait_replies(4)
        assert [line.split(" ", 1)[1] for line in upstream.written] == [
            answer(get(key)[:-1]).decode().rstrip("\n") for key in keys[::-1]]   # the wire order


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), count=st.integers(1, 10))
def test_any_reply_order_with_some_calls_timed_out_gives_every_reply_to_its_caller(data, count):
    keys = [f"k{index}" for index in range(count)]
    order = data.draw(st.permutations(keys), label="the order the upstream answers in")
    gave_up = data.draw(st.sets(st.sampled_from(keys)), label="calls with msg_timeout=0")
    with TaggedUpstream() as upstream, TaggedClient(upstream.addr) as client:
        in_order = answer_in_order(upstream, order)

        def pause(key):
            if key in gave_up:   # its caller must have given up before the reply can leave
                client.wait_timeouts(len(gave_up))
            in_order(key)

        upstream.pause = pause

        def ask(key):
            return client.call(get(key), msg_timeout=0 if key in gave_up else None)

        # each call is on the wire before the next begins: a call with msg_timeout 0 has no
        # time to wait for its turn to write, and one never sent would have no late reply
        results = in_threads(ask, keys, started=lambda number: client.wait_sent(number))
        client.wait_dropped(len(gave_up))   # every late reply arrives, and is dropped by id
        for key in keys:
            if key in gave_up:
                assert isinstance(results[key], CallTimeout)
            else:
                assert results[key] == answer(get(key)[:-1])
        assert (client.replies, client.dropped, client.timeouts) == (
            count - len(gave_up), len(gave_up), len(gave_up))
        assert client.owed == {} and client.abandoned == {} and client.failure is None


# --- head of line ---------------------------------------------------------------------------

def test_a_held_slow_key_does_not_delay_the_fast_keys_sent_after_it():
    fast = ["a", "b", "c", "d", "e"]
    with TaggedUpstream() as upstream, TaggedClient(upstream.addr) as client:
        # the slow reply is held until every fast reply has reached its caller: with
        # head-of-line blocking this would wait for ever (a hook timeout)
        upstream.pause = lambda key: client.wait_replies(len(fast)) if key == "slow" else None
        slow = threading.Thread(target=lambda: results.update(slow=client.call(get("slow"))))
        results = {}
        slow.start()
        upstream.wait_requests(1)   # the slow request is on the wire first
        results.update(in_threads(lambda key: client.call(get(key)), fast))
        slow.join()
        assert upstream.parsed[0].endswith("GET slow")
        assert results == {key: answer(get(key)[:-1]) for key in fast + ["slow"]}


def test_the_untagged_twin_writes_no_fast_reply_while_the_slow_one_before_it_is_held():
    with TaggedUpstream(tagged=False) as upstream:
        release = threading.Event()
        upstream.pause = lambda key: release.wait(10) if key == "slow" else None
        sock = socket.create_connection(upstream.addr)
        with sock:
            sock.sendall(b"GET slow\nGET a\nGET b\n")
            upstream.wait_ready(2)   # both fast replies are ready...
            # ...and none has been written: they wait their turn
            assert list(upstream.written) == []
            release.set()
            upstream.wait_replies(3)
            received = b""
            while received.count(b"\n") < 3:
                received += sock.recv(4096)
        assert received == answer(b"GET slow") + answer(b"GET a") + answer(b"GET b")


# --- timeouts -------------------------------------------------------------------------------

def test_a_timed_out_calls_late_reply_is_dropped_by_id_while_the_next_call_is_owed():
    with TaggedUpstream() as upstream, TaggedClient(upstream.addr, msg_timeout=0.01) as client:
        # the late reply leaves only once the next call has been sent, so it arrives while
        # another call is owed: an order-matched client would hand it to that call
        upstream.pause = lambda key: client.wait_sent(2) if key == "slow" else None
        with pytest.raises(CallTimeout, match="no reply within 0.01 s"):
            client.call(get("slow"))
        assert list(client.abandoned) == [1]   # its id, with the moment its reply is overdue
        assert client.call(get("next"), msg_timeout=-1) == answer(b"GET next")
        client.wait_dropped(1)
        assert (client.sent, client.replies, client.dropped, client.timeouts) == (2, 1, 1, 1)
        assert client.abandoned == {} and client.failure is None
        # no race with 10 ms
        assert client.call(get("after"), msg_timeout=-1) == answer(b"GET after")
        assert upstream.connections == 1


# --- out of step ------------------------------------------------------------------------------

@pytest.mark.parametrize("script, reason", [
    (b"1 first\n1 again\n", "a reply for id 1, which no call is owed"),
    (b"7 stranger\n", "a reply for id 7, which no call is owed"),
    (b"no id at all\n", "expected '<id> <line>', got b'no id at all'"),
], ids=["duplicate id", "unknown id", "no id"])
def test_a_reply_out_of_step_fails_every_owed_call_and_every_later_one(script, reason):
    # msg_timeout: a bug that left a call owed for ever would fail the test, not hang it
    with (ScriptedUpstream(script, after=2) as upstream,
          TaggedClient(upstream.addr, msg_timeout=5) as client):
        results = {}
        first = threading.Thread(
            target=lambda: results.update(first=outcome(client.call, get("x"))))
        first.start()
        client.wait_sent(1)
        results["second"] = outcome(client.call, get("y"))
        first.join()
        if script.startswith(b"1 first"):
            assert results["first"] == b"first\n"   # its own reply, which came before the lie
        else:
            assert results["first"] == f"ConnectionBroken: out of step: {reason}"
        assert results["second"] == f"ConnectionBroken: out of step: {reason}"   # never "again"
        assert outcome(client.call, get("z")) == f"ConnectionBroken: out of step: {reason}"
        assert client.broken == 1 and client.owed == {}


def outcome(function, *args):
    try:
        return function(*args)
    except (CallTimeout, ConnectionBroken) as error:   # the test asserts on which, and why
        return f"{type(error).__name__}: {error}"


def test_the_upstream_closing_fails_the_owed_call():
    with ScriptedUpstream(b"", after=1) as upstream, TaggedClient(upstream.addr) as client:
        caller = threading.Thread(
            target=lambda: results.update(call=outcome(client.call, get("x"))))
        results = {}
        caller.start()
        client.wait_sent(1)
        upstream.close()
        caller.join()
        assert results["call"] == "ConnectionBroken: the upstream closed the connection"


def test_close_fails_a_call_still_owed_and_later_calls():
    with TaggedUpstream() as upstream:
        hold = threading.Event()
        upstream.pause = lambda key: hold.wait(10)
        client = TaggedClient(upstream.addr)
        results = {}
        caller = threading.Thread(
            target=lambda: results.update(call=outcome(client.call, get("x"))))
        caller.start()
        upstream.wait_requests(1)
        client.close()
        caller.join()
        hold.set()
        assert results["call"] == "ConnectionBroken: the client was closed"
        assert outcome(client.call, get("y")) == "ConnectionBroken: the client was closed"
        client.close()   # again: nothing


def test_on_event_tells_of_each_request_with_its_id_before_writing_and_of_each_reply_line_got():
    told = []
    with TaggedUpstream() as upstream, TaggedClient(upstream.addr) as client:
        client.on_event = lambda source, event: told.append((source is client,) + event)
        assert client.call(b"GET a\n") == b"a=AAAAAAAAAAAA\n"
        assert client.call(b"GET b\n") == b"b=BBBBBBBBBBBB\n"
    assert told == [(True, "sent", b"1 GET a\n"), (True, "got", b"1 a=AAAAAAAAAAAA"),
                    (True, "sent", b"2 GET b\n"), (True, "got", b"2 b=BBBBBBBBBBBB")]
