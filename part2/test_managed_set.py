"""ManagedSet's claims (part2/managed_set.py): the pick as plain functions of the loads,
and on a live set; call() and idempotent_call() and their retries; its own cache, which
fails over and never refuses everything; callbacks and shut_down() from them."""
import contextlib
import threading
import time

import pytest

from conftest import closed_port_addr
from part2.managed import (ClusterServiceUnavailable, CommunicationError, ManagedSet, MessageLost,
                           ReliabilityCache, VirtualClock, global_rcache)
from part2.managed_demo import in_background, outcome
from part2.managed_set import choose, service_order
from part2.pipeline import ClientStream, Pipeline
from scaffolding.faults import FaultyUpstream
from ground.server import Hooks
from tcp_proxy import LINES, answer

A, B = ("127.0.0.2", 7001), ("127.0.0.2", 7002)   # nothing listens there
OTHER_HOST = ("127.0.0.3", 7001)


# --- the pick, as plain functions of the loads ----------------------------------------------

def test_choose_takes_an_idle_client_then_a_new_one_then_the_least_busy_below_the_max_then_none():
    room, norm, most = 2, 1, 2
    chosen = [choose(pending, room, norm, most) for pending in ([], [1], [1, 1], [2, 1], [2, 2])]
    assert chosen == [0, 1, 0, 1, None]   # new, new, the least busy (first of a tie), again, none


def test_choose_prefers_an_idle_client_to_a_busy_one_wherever_it_stands_and_has_no_max_by_default():
    assert choose([1, 0], 2, 1, None) == 1
    assert choose([1, 1], 2, 1, None) == 0   # both busy, no room: the least busy, first by position
    assert choose([40, 7], 2, 1, None) == 1   # no limit: busy is never full


def test_below_pending_calls_norm_the_busiest_client_is_packed_as_in_ocamlnet():
    norm = 3
    assert [choose(pending, 2, norm, None) for pending in ([0], [1], [2], [3])] == [0, 0, 0, 1]
    # both below the norm: the busier; the other idles out
    assert choose([2, 1], 2, norm, None) == 0


def test_balance_load_orders_services_by_pending_calls_and_failover_by_position_tried_ones_last():
    # balance_load: by load, then position
    assert list(service_order(3, [1, 0, 0], ())) == [1, 2, 0]
    assert list(service_order(3, None, ())) == [0, 1, 2]        # failover: by position
    assert list(service_order(3, None, {0, 1})) == [2, 0, 1]
    assert list(service_order(3, [0, 5, 1], {2})) == [0, 1, 2]


# --- the pick on a live set ------------------------------------------------------------------

def test_a_live_set_spreads_pending_calls_as_choose_says_and_refuses_once_every_client_is_full():
    with FaultyUpstream(every="skip") as silent:   # every call stays pending
        managed_set = ManagedSet([(silent.addr, 2)], pending_calls_max=2)
        calls = [in_background(managed_set.call, b"GET %d\n" % n) for n in range(4)]
        managed_set.wait_picks(4)
        assert [client.pending_calls for client in managed_set.clients[0]] == [2, 2]
        assert outcome(managed_set.call, b"GET e\n").startswith("ClusterServiceUnavailable")
        assert (managed_set.picks, managed_set.refusals, managed_set.load()) == (4, 1, [4])
        managed_set.shut_down()
        assert [call.result() for call in calls] == ["MessageLost: client shut down"] * 4


def test_threads_that_pick_then_call_at_once_spread_over_the_set_each_its_own_reply():
    """pick() reserves the client for the call its thread makes next: thirty threads that
    all pick before any calls find three clients busy in turn, not one idle thirty times."""
    with contextlib.ExitStack() as stack:
        upstreams = [stack.enter_context(FaultyUpstream()) for _ in range(3)]
        managed_set = ManagedSet([(upstream.addr, 1) for upstream in upstreams])
        picked = threading.Barrier(30)

        def pick_then_call(number):
            client, _ = managed_set.pick()
            picked.wait(Hooks.hook_timeout)   # every pick made before any call
            return client.call(b"GET k%d\n" % number)
        calls = [in_background(pick_then_call, number) for number in range(30)]
        assert [call.result() for call in calls] == [
            answer(b"GET k%d" % number)[:-1].decode() for number in range(30)]
        served = [upstream.requests for upstream in upstreams]
        assert min(served) >= 5 and sum(served) == 30, served
        assert [client.reserved for clients in managed_set.clients for client in clients] == \
            [0, 0, 0]
        managed_set.shut_down()


def test_a_reservation_given_back_unused_counts_no_more():
    with FaultyUpstream() as upstream:
        managed_set = ManagedSet([(upstream.addr, 2)])
        client, _ = managed_set.pick()
        assert managed_set.load() == [1]
        client.release()
        assert managed_set.load() == [0]
        assert client.call(b"GET a\n") == b"a=AAAAAAAAAAAA\n" and client.reserved == 0
        managed_set.shut_down()


def test_pick_skips_services_the_cache_has_disabled():
    cache = ReliabilityCache(policy="independent", clock=VirtualClock())
    managed_set = ManagedSet([(A, 1), (B, 1)], policy="failover", rcache=cache)
    cache.record_error(A)
    assert managed_set.pick()[1] == 1
    managed_set.shut_down()


def test_difference_pick_asks_the_cache_about_every_service_before_it_chooses():
    asked = []
    managed_set = ManagedSet([(A, 1), (B, 1)], policy="failover",
                             rcache=ReliabilityCache(
                                 availability=lambda addr: asked.append(addr) or True))
    assert managed_set.pick()[1] == 0 and asked == [A, B]
    managed_set.shut_down()


def test_an_abandoned_call_counts_in_load_so_the_next_pick_opens_another_connection():
    clock = VirtualClock()
    with FaultyUpstream(hold={1}) as upstream:
        managed_set = ManagedSet([(upstream.addr, 2)], clock=clock, msg_timeout=1.0)
        late = in_background(managed_set.call, b"GET a\n")
        upstream.wait_requests(1)
        upstream.wait_held(1)   # reply 1 is the one held: no later reply takes its number
        clock.advance(1.0)
        assert late.result() == "MessageTimeout: no reply within 1.0s"
        # call() does not retry a timeout
        assert managed_set.load() == [1] and managed_set.attempts == 1
        client, _ = managed_set.pick()
        assert client is managed_set.clients[0][1]
        assert client.call(b"GET b\n") == b"b=BBBBBBBBBBBB\n"
        upstream.release()
        managed_set.clients[0][0].wait_discarded(1)
        assert managed_set.load() == [0]
        managed_set.shut_down()


def test_a_silent_upstream_behind_a_capped_set_never_wedges_it():
    clock = VirtualClock()
    with FaultyUpstream(every="skip") as upstream:
        managed_set = ManagedSet([(upstream.addr, 1)], pending_calls_max=1, msg_timeout=1.0,
                                 idle_timeout=5.0, clock=clock)
        for number, at in enumerate((0.0, 10.0, 100.0, 1000.0), start=1):
            clock.advance(at - clock.now())
            late = in_background(managed_set.call, b"GET a\n")
            managed_set.wait_picks(number)
            client = managed_set.clients[0][0]
            client.wait_written(number)
            clock.advance(1.0)
            assert late.result() == "MessageTimeout: no reply within 1.0s"
            assert managed_set.load() == [1]   # the abandoned call, owed for one msg_timeout more
            clock.advance(1.0)
            client.wait_errors(number)
            assert managed_set.load() == [0] and client.state == "down"
        assert client.transition_log[-1] == ("up", "down", "an abandoned call's reply is overdue")
        assert (client.errors, client.connects, managed_set.refusals) == (4, 4, 0)
        managed_set.shut_down()


# --- calls and their retries ----------------------------------------------------------------

def test_a_malformed_request_is_refused_before_any_pick():
    managed_set = ManagedSet([(A, 1)], pending_calls_max=1)
    for request in (b"GET a", b"GET a\nGET b\n", "GET a\n"):
        with pytest.raises(ValueError, match="one line"):
            managed_set.call(request)
    assert (managed_set.picks, managed_set.attempts, managed_set.clients) == (0, 0, [[]])
    managed_set.shut_down()


def test_call_retries_a_refused_connection_on_the_next_service():
    clock = VirtualClock()
    cache = ReliabilityCache(policy="independent", clock=clock)
    with FaultyUpstream() as upstream:
        managed_set = ManagedSet([(closed_port_addr(), 1), (upstream.addr, 1)], policy="failover",
                                 rcache=cache, clock=clock, idempotent_wait=0)
        assert managed_set.call(b"GET a\n") == b"a=AAAAAAAAAAAA\n"
        assert (managed_set.attempts, managed_set.retries, cache.errors) == (2, 1, 1)
        managed_set.shut_down()


def test_call_never_retries_a_sent_request_but_idempotent_call_does_after_idempotent_wait():
    clock = VirtualClock()
    with FaultyUpstream() as upstream:
        # Ocamlnet's default: never disables
        managed_set = ManagedSet([(upstream.addr, 1)], clock=clock, idempotent_wait=5.0,
                                 rcache=ReliabilityCache(clock=clock))
        upstream.fail_next(1)
        with pytest.raises(MessageLost):
            managed_set.call(b"GET a\n")
        assert (managed_set.attempts, list(upstream.parsed)) == (1, ["GET a"])
        upstream.fail_next(1)
        call = in_background(managed_set.idempotent_call, b"GET b\n")
        managed_set.wait_retries(1)
        clock.advance(4.9)
        assert call._thread.is_alive() and list(upstream.parsed) == ["GET a", "GET b"]
        clock.advance(0.1)
        assert call.result() == "b=BBBBBBBBBBBB"
        assert (managed_set.attempts, managed_set.retries) == (3, 1)
        managed_set.shut_down()


def test_idempotent_max_counts_attempts_one_call_and_two_retries_by_default():
    with FaultyUpstream() as upstream:
        managed_set = ManagedSet([(upstream.addr, 1)], idempotent_wait=0, rcache=ReliabilityCache())
        upstream.fail_next(5)
        with pytest.raises(MessageLost):
            managed_set.idempotent_call(b"GET a\n")
        assert (managed_set.attempts, managed_set.retries, upstream.faults) == (3, 2, 3)
        managed_set.shut_down()
    with pytest.raises(ValueError, match="at least 1"):
        ManagedSet([(A, 1)], idempotent_max=0)


def test_back_pressure_is_not_retried_by_call_but_is_by_idempotent_call():
    with FaultyUpstream(every="skip") as silent:
        managed_set = ManagedSet([(silent.addr, 1)], pending_calls_max=1, idempotent_wait=0)
        busy = in_background(managed_set.call, b"GET busy\n")   # the only client, full
        managed_set.wait_picks(1)
        with pytest.raises(ClusterServiceUnavailable):
            managed_set.call(b"GET a\n")
        assert managed_set.attempts == 2
        with pytest.raises(ClusterServiceUnavailable):
            managed_set.idempotent_call(b"GET a\n")
        assert (managed_set.attempts, managed_set.refusals) == (5, 4)
        managed_set.shut_down()
        assert busy.result() == "MessageLost: client shut down"


def test_shut_down_cuts_a_retry_wait_short():
    with FaultyUpstream() as upstream:
        managed_set = ManagedSet([(upstream.addr, 1)], idempotent_wait=60.0)
        upstream.fail_next(1)
        call = in_background(managed_set.idempotent_call, b"GET a\n")
        managed_set.wait_retries(1)
        started = time.monotonic()
        managed_set.shut_down()
        assert call.result() == "ManagedError: set shut down" and time.monotonic() - started < 5


# --- a turn's requests, in batches ------------------------------------------------------------

class Counts:
    answered = failed = 0


class Written:
    def __init__(self):
        self.out = bytearray()

    def write(self, data):
        self.out += data


class Owner:
    """Stands in for a set: what each request a lost connection left owed went on with."""

    def __init__(self):
        self.alone = []

    def attempt_failed(self, request, error):
        self.alone.append((request.client, request.data, request.attempts, request.service,
                           type(error)))


def streams_with_requests(*reads):
    """A ClientStream per read, each given its read: (streams, the requests they made)."""
    streams, gathered = [], []
    for data in reads:
        stream = ClientStream(LINES, Counts(), Written())
        stream.gather = gathered.extend
        stream.received(data)
        streams.append(stream)
    return streams, gathered


def test_a_turns_requests_go_in_one_write_and_if_it_is_lost_each_owed_one_goes_on_alone():
    streams, requests = streams_with_requests(b"GET a\nGET b\n", b"GET c\n")
    owner = Owner()
    for request in requests:
        request.placer, request.attempts, request.service = owner, 1, 0
    core = Pipeline(LINES)
    assert core.queue(requests) == b"GET a\nGET b\nGET c\n"
    settled, _ = core.feed(answer(b"GET a"))   # the first reply, then the connection is lost
    for request, reply in settled:
        request.client.replied(request, reply)
    for request in core.lose():
        request.fail(MessageLost("upstream closed the connection"))
    assert bytes(streams[0].transport.out) == answer(b"GET a") and not streams[1].transport.out
    assert owner.alone == [(streams[0], b"GET b\n", 1, 0, MessageLost),
                           (streams[1], b"GET c\n", 1, 0, MessageLost)]   # in the write's order


def test_a_turns_requests_with_a_choice_of_clients_are_picked_one_by_one_one_write_per_client():
    sent = []
    with FaultyUpstream(every="skip") as silent:   # every call stays pending
        managed_set = ManagedSet([(silent.addr, 3)], on_event=lambda client, event: sent.append(
            client) if event[0] == "sent" else None)
        streams, requests = streams_with_requests(*[b"GET %d\n" % number for number in range(4)])
        managed_set.loop.ask(managed_set.gather, requests)   # placed once the next reads are over
        silent.wait_requests(4)
        clients = managed_set.clients[0]
        # picked as one by one: a new client each, while there is room; then the least busy
        assert [client.pending_calls for client in clients] == [2, 1, 1]
        assert sorted(map(clients.index, sent)) == [0, 1, 2]   # one write each
        assert (managed_set.picks, managed_set.attempts) == (4, 4)
        managed_set.shut_down()
    assert [bytes(stream.transport.out) for stream in streams] == [
        b"ERR MessageLost: client shut down\n"] * 4


# --- the set's own cache: failover out of the box, and never refusing everything ------------

def test_failover_with_no_cache_given_answers_every_call_and_skips_a_dead_a_until_its_window_ends():
    clock = VirtualClock()
    with FaultyUpstream() as live:
        attempts = []
        managed_set = ManagedSet([(closed_port_addr(), 1), (live.addr, 1)], policy="failover",
                                 clock=clock,
                                 on_event=lambda source, event: attempts.append(event[2:])
                                 if event[0] == "attempt" else None)
        tried = []
        for at in (0.0, 0.5, 1.0, 2.0, 3.0):
            clock.advance(at - clock.now())
            attempts.clear()
            call = in_background(managed_set.call, b"GET k\n")
            assert call.result() == "k=KKKKKKKKKKKK"
            tried.append([index for index, _ in attempts])
        assert tried == [[0, 1], [1], [0, 1], [1], [0, 1]]   # A's windows: 0 to 1 s, then 1 to 3 s
        assert clock.now() == 3.0 and managed_set.retries == 3   # no retry waited: B was untried
        assert managed_set.rcache.setting("policy") == "independent"
        assert global_rcache().setting("policy") == ReliabilityCache().setting("policy") == "none"
        managed_set.shut_down()


def test_a_one_service_set_never_refuses_because_of_one_lost_message():
    clock = VirtualClock()
    with FaultyUpstream() as upstream:
        managed_set = ManagedSet([(upstream.addr, 1)], clock=clock)
        upstream.fail_next(1)
        assert outcome(managed_set.call, b"GET a\n") == (
            "MessageLost: upstream closed the connection")
        # disabled for 1 s, and the only one
        assert not managed_set.rcache.is_enabled(upstream.addr)
        assert managed_set.call(b"GET b\n") == b"b=BBBBBBBBBBBB\n"
        assert (managed_set.refusals, managed_set.panics, clock.now()) == (0, 1, 0.0)
        managed_set.shut_down()


def test_a_set_of_one_connection_asks_the_cache_once_a_pick_and_obeys_a_callback_that_refuses():
    asked, answer = [], [True]
    cache = ReliabilityCache(availability=lambda addr: asked.append(addr) or answer[0])
    with FaultyUpstream() as upstream:
        managed_set = ManagedSet([(upstream.addr, 1)], rcache=cache)
        assert managed_set.call(b"GET a\n") == b"a=AAAAAAAAAAAA\n"
        assert managed_set.call(b"GET b\n") == b"b=BBBBBBBBBBBB\n"
        assert asked == [upstream.addr] * 2 and managed_set.lone is managed_set.clients[0][0]
        answer[0] = False
        assert outcome(managed_set.call, b"GET c\n").startswith("ClusterServiceUnavailable")
        assert asked == [upstream.addr] * 3 and managed_set.refusals == 1
        managed_set.shut_down()


def test_with_every_service_disabled_by_its_own_cache_a_set_tries_the_one_whose_window_ends_first():
    clock = VirtualClock()
    with FaultyUpstream() as b:
        dead_a = closed_port_addr()
        managed_set = ManagedSet([(dead_a, 1), (b.addr, 1)], policy="failover", clock=clock)
        managed_set.rcache.record_error(b.addr)   # B disabled from 0 to 1 s
        clock.advance(0.5)
        managed_set.rcache.record_error(dead_a)   # A from 0.5 to 1.5 s: B's window ends first
        assert managed_set.call(b"GET k\n") == b"k=KKKKKKKKKKKK\n"
        assert (managed_set.attempts, managed_set.panics, managed_set.refusals) == (1, 1, 0)
        managed_set.rcache.record_error(b.addr)   # B again, from 0.5 to 2.5 s: now A's ends first
        assert outcome(managed_set.call, b"GET k\n") == (
            "CommunicationError: cannot connect: Connection refused")
        # A refused; no service left untried
        assert (managed_set.attempts, managed_set.panics) == (2, 2)
        # a callback that refuses is obeyed
        managed_set.rcache.configure(availability=lambda addr: False)
        assert outcome(managed_set.call, b"GET k\n").startswith("ClusterServiceUnavailable")
        managed_set.shut_down()
    # a cache the user gives: Ocamlnet's rule
    given = ReliabilityCache(policy="independent", clock=clock)
    ocamlnet = ManagedSet([(A, 1)], rcache=given, clock=clock)
    given.record_error(A)
    with pytest.raises(ClusterServiceUnavailable):
        ocamlnet.pick()
    ocamlnet.shut_down()


# --- callbacks ---------------------------------------------------------------------------------

def test_every_transition_and_every_disable_reaches_on_event_with_its_reason():
    clock, events = VirtualClock(), []
    observe = lambda source, event: events.append((type(source).__name__,) + event)
    cache = ReliabilityCache(policy="independent", clock=clock, on_event=observe)
    managed_set = ManagedSet([(closed_port_addr(), 1)], rcache=cache, clock=clock, idempotent_max=1,
                             on_event=observe)
    with pytest.raises(CommunicationError):
        managed_set.call(b"GET a\n")
    assert [event[:4] for event in events] == [
        ("ManagedClient", "transition", "down", "connecting"),
        ("ReliabilityCache", "disabled", managed_set.services[0][0], 0.0),
        ("ManagedClient", "transition", "connecting", "down"),
        ("ManagedSet", "attempt", 1, 0)]
    assert all(event[-1] for event in events)   # every reason is a non-empty string
    assert events[2][-1] == "connect failed: Connection refused"
    managed_set.shut_down()


def test_callbacks_that_call_load_from_many_threads_never_deadlock():
    with FaultyUpstream() as upstream:
        loads = []
        cache = ReliabilityCache(availability=lambda addr: loads.append(managed_set.load()) or True)
        managed_set = ManagedSet([(upstream.addr, 4)], rcache=cache,
                                 on_event=lambda source, event: loads.append(managed_set.load()))
        workers = [in_background(lambda n=n: [managed_set.call(b"GET k%d\n" % n)
                                              for _ in range(200)])
                   for n in range(4)]
        assert [worker.result() for worker in workers] == [
            [b"k%d=KKKKKKKKKKKK\n" % n] * 200 for n in range(4)]
        # per call: pick() asks availability, the set notes the attempt, the client tells of its
        # request sent and of its reply; per client, its 2 transitions (a call the set placed is
        # not asked about again: the pick and the placing are one step of the loop)
        assert (managed_set.attempts == 800
                and len(loads) == 800 * 4 + 2 * len(managed_set.clients[0]))
        managed_set.shut_down()


def test_a_raising_attempt_callback_never_replaces_the_reply():
    def raises(*args):
        raise RuntimeError("a bug in the user's callback")
    with FaultyUpstream() as upstream:
        managed_set = ManagedSet([(upstream.addr, 1)], rcache=ReliabilityCache(), on_event=raises)
        assert managed_set.call(b"GET a\n") == b"a=AAAAAAAAAAAA\n"   # its "attempt ... ok" raised
        # the client's two transitions, its request sent and its reply raised too
        assert managed_set.callback_errors == 1 and managed_set.clients[0][0].callback_errors == 4
        managed_set.shut_down()


def test_shut_down_from_callbacks_on_the_loops_thread_shuts_every_client_and_ends_the_loop():
    clock = VirtualClock()
    returned = threading.Condition()   # notified as each callback's shut_down() returns
    # the clients whose up -> down callback shut the set down and returned
    shut_by = set()

    def on_event(source, event):
        if event[1:3] == ("up", "down"):   # an idle timeout: on the loop's thread, in its turn
            managed_set.shut_down()
            with returned:
                shut_by.add(source)
                returned.notify_all()
    with FaultyUpstream(gate=6) as upstream:   # no reply until six calls are in: six clients
        managed_set = ManagedSet([(upstream.addr, 6)], clock=clock, idle_timeout=5.0,
                                 on_event=on_event)
        calls = [in_background(managed_set.call, b"GET a\n") for _ in range(6)]
        assert [call.result() for call in calls] == ["a=AAAAAAAAAAAA"] * 6
        clients = list(managed_set.clients[0])
        assert len(clients) == 6
        clock.advance(5.0)   # one turn ends every connection; each callback shuts the set down
        with returned:
            assert returned.wait_for(lambda: len(shut_by) == 6, Hooks.hook_timeout), shut_by
        assert [client.state for client in clients] == ["down"] * 6
        assert [outcome(client.call, b"GET b\n") for client in clients] == [
            "ManagedError: client shut down"] * 6
        assert sum(client.callback_errors for client in clients) == 0
        # it ends after that turn
        assert not managed_set.loop.thread.is_alive() or managed_set.loop.stopping
        managed_set.shut_down()   # from here: joins the loop's thread
