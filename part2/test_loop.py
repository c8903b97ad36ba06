"""The clocks' and the loop's claims (part2/clock.py, part2/loop.py): time moves only in
advance(), which wakes the loop; a turn reads, places what the reads gathered, runs what
other threads handed over, fires the deadlines passed, sends once per transport, then makes
its callbacks, its completions and its hook wake-ups; no error ends a turn. A transport
sends at once what is written outside the reads, and stops reading when told."""
import math
import re
import select
import socket
import threading
import time

import pytest

from conftest import ROOT
from part2 import clock as clocks
from part2.calls import BlockingCall, ManagedError
from part2.hooks import Counted
from part2.loop import READ, Loop, Poller, Transport
from part2.managed import ReliabilityCache, VirtualClock
from part2.managed_demo import in_background
from ground.server import Hooks

LESSON_MODULES = ["clock", "hooks", "cache", "calls", "loop", "pipeline", "connection",
                  "client", "managed_set", "proxy", "lease"]


def started(clock=None):
    loop = Loop(clock)
    loop.start()
    return loop


# --- the clocks ------------------------------------------------------------------------

def test_a_deadline_on_a_virtual_clock_fires_only_once_advance_passes_it():
    clock = VirtualClock(start=2.0)
    loop, fired = started(clock), threading.Event()
    loop.hand(lambda: loop.at(5.0, fired.set))
    loop.wait_turns(1)
    turns = loop.turns
    clock.advance(2.5)
    loop.wait_turns(turns + 1)   # advance() woke the loop; its turn found nothing due
    assert clock.now() == 4.5 and not fired.is_set()
    clock.advance(0.5)
    assert fired.wait(Hooks.hook_timeout) and clock.now() == 5.0
    loop.shut_down()


def test_virtual_clock_advance_refuses_nan_inf_and_negatives_and_moves_nothing():
    clock = VirtualClock(start=1.0)
    for bad in (math.nan, math.inf, -math.inf, -0.5):
        with pytest.raises(ValueError, match="forward"):
            clock.advance(bad)
    clock.advance(0.5)
    assert clock.now() == 1.5


def test_every_clock_method_the_code_calls_is_documented_and_offered_by_both_clocks():
    sources = "".join((ROOT / "part2" / f"{name}.py").read_text(encoding="utf-8")
                      for name in LESSON_MODULES)
    called = set(re.findall(r"clock\.(\w+)\(", sources))
    assert called == {"now", "watch", "unwatch"}
    for method in called | {"passes"}:
        assert f"{method}" in clocks.__doc__, method
        assert hasattr(clocks.RealClock(), method) and hasattr(VirtualClock(), method)


def test_a_turn_waits_for_a_real_deadline_and_for_a_virtual_one_until_advance_wakes_it():
    for clock in (clocks.RealClock(), VirtualClock()):
        loop, fired = Loop(clock), []
        loop.at(clock.now() + 0.05, lambda: fired.append("fired"))
        mover = threading.Thread(target=lambda: None)
        if not clock.passes:   # nothing but advance() brings its deadline: moved from a thread
            mover = threading.Thread(target=lambda: time.sleep(0.05) or clock.advance(0.05))
        mover.start()
        loop.run_once()   # real time: select() waits for the deadline; virtual: until woken
        mover.join()
        assert fired == ["fired"]
        loop.at(clock.now() - 1, lambda: fired.append("past"))
        loop.run_once()   # a deadline passed wants no wait at all
        assert fired[-1] == "past"
        loop.shut_down()


# --- the turn ---------------------------------------------------------------------------

def test_what_many_threads_hand_over_at_once_all_runs_on_the_loops_thread():
    loop, ran = started(), []
    def note(n, i):
        ran.append((n, i, threading.current_thread()))
    def hand_over(n):
        for i in range(200):
            loop.hand(note, n, i)
    threads = [threading.Thread(target=hand_over, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    loop.ask(lambda: None)   # handed after every other: once it has run, they all have
    assert sorted((n, i) for n, i, _ in ran) == [(n, i) for n in range(8) for i in range(200)]
    assert {on for _, _, on in ran} == {loop.thread}
    loop.shut_down()


def test_a_turns_callbacks_are_made_at_its_end_in_order_each_whatever_the_one_before_did():
    loop, owner, made = Loop(), ReliabilityCache(), []

    def note(number):
        made.append((number, list(during)))
        if number == 1:
            raise RuntimeError("a bug in the user's callback")
    during = []

    def work():
        during.append("work")
        for number in (1, 2, 3):
            loop.queue_callback(owner, note, number)
        assert made == []   # nothing is made while the turn's work runs
        during.clear()
    loop.hand(work)
    loop.run_once()
    assert made == [(1, []), (2, []), (3, [])] and owner.callback_errors == 1
    loop.run_once(block=False)
    assert len(made) == 3   # each made once
    loop.shut_down()


class Heard:
    """A transport's protocol that notes what it hears; fails=True raises on each read."""

    def __init__(self, fails=False):
        self.heard, self.fails = [], fails

    def received(self, data):
        self.heard.append(bytes(data))
        if self.fails:
            raise RuntimeError("a protocol's bug")

    def hung_up(self, reason):
        self.heard.append(("hung up", reason))

    def overflowed(self):
        self.heard.append("overflowed")


def transports(loop, count, **options):
    """count transports on the loop, each over one end of a socketpair: (transport, far end)."""
    made = []
    for _ in range(count):
        ours, theirs = socket.socketpair()
        made.append((Transport(loop, ours, Heard(**options)), theirs))
    return made


@pytest.mark.parametrize("epoll", [True, False] if hasattr(select, "epoll") else [False])
def test_the_poller_reports_a_ready_socket_once_watched_and_nothing_once_not(epoll):
    poller = Poller(epoll)
    ours, theirs = socket.socketpair()
    poller.register(ours, READ, print)
    theirs.send(b"x")
    assert poller.poll(1.0) == [(ours.fileno(), READ)]
    poller.unregister(ours)
    assert poller.poll(0) == [] and poller.watched == {}
    poller.close()
    ours.close()
    theirs.close()


def test_a_protocol_that_raises_is_counted_and_the_other_transports_still_read(caplog):
    loop = Loop()
    made = transports(loop, 2, fails=True) + transports(loop, 2)
    for _, theirs in made:
        theirs.send(b"x")
    loop.run_once()
    assert [transport.protocol.heard for transport, _ in made] == [[b"x"]] * 4
    assert loop.handler_errors == 2
    assert len([record for record in caplog.records if record.name == "part2.managed"]) == 1
    loop.shut_down()   # it closes the sockets it watches
    for _, theirs in made:
        theirs.close()


def test_what_the_reads_write_is_sent_in_the_send_phase_and_a_write_after_them_at_once():
    loop, order = Loop(), []
    (reader, theirs), (writer, far) = transports(loop, 2)

    def read(data):
        order.append("read")
        writer.write(b"during the reads")
        order.append(far.recv(100, socket.MSG_DONTWAIT) if select_ready(far) else "not yet")
        loop.after_reads(lambda: order.append("placed"))
        loop.after_reads(lambda: 1 / 0)   # a bug in one: counted, the others still run
        loop.after_reads(lambda: order.append("placed too"))
    reader.protocol.received = read
    theirs.send(b"x")
    loop.hand(order.append, "handed")
    loop.at(loop.clock.now(), lambda: order.append("deadline"))
    loop.run_once()
    assert order == ["read", "not yet", "placed", "placed too", "handed", "deadline"]
    assert far.recv(100) == b"during the reads" and loop.handler_errors == 1
    loop.hand(writer.write, b"handed over")   # outside the reads: sent at once, in its phase
    loop.hand(lambda: order.append(far.recv(100, socket.MSG_DONTWAIT)))
    loop.run_once()
    assert order[-1] == b"handed over" and not writer.out
    loop.shut_down()
    theirs.close()
    far.close()


def select_ready(sock):
    return bool(select.select([sock], [], [], 0)[0])


def test_a_paused_transport_reads_nothing_until_resumed_and_after_an_eof_no_more():
    loop = Loop()
    ((transport, theirs),) = transports(loop, 1)
    transport.pause()
    theirs.send(b"kept by the kernel")
    loop.run_once(block=False)
    assert transport.protocol.heard == []
    transport.resume()
    theirs.close()
    loop.run_once()
    loop.run_once(block=False)
    assert transport.protocol.heard == [b"kept by the kernel", ("hung up", None)]
    assert not transport.reading and not transport.closed   # its protocol closes it when done
    transport.close()
    assert transport.sock.fileno() == -1
    loop.shut_down()


def test_a_transport_whose_peer_reads_nothing_tells_its_protocol_once_past_its_limit():
    loop = Loop()
    ours, theirs = socket.socketpair()
    transport = Transport(loop, ours, Heard(), limit=1 << 16)
    loop.hand(transport.write, b"x" * (8 << 20))   # more than the kernel's buffers take
    loop.run_once()
    assert transport.protocol.heard == ["overflowed"] and len(transport.out) > 1 << 16
    loop.shut_down()
    theirs.close()


def test_a_handler_that_raises_is_logged_once_counted_and_the_turn_goes_on(caplog):
    loop, ran = Loop(), []
    for number in range(3):
        loop.hand(lambda: 1 / 0)
        loop.hand(ran.append, number)
    loop.run_once()
    assert ran == [0, 1, 2] and loop.handler_errors == 3
    assert len([record for record in caplog.records if record.name == "part2.managed"]) == 1
    loop.shut_down()


def test_a_counters_waiters_are_woken_once_a_turn_however_often_it_moved():
    loop = Loop()

    class Bumped(Counted):
        counters = {"bumps": 0}

    counted, wakes = Bumped(loop), []
    notify_all = counted._changed.notify_all
    counted._changed.notify_all = lambda: wakes.append(counted.bumps) or notify_all()
    waiter = in_background(lambda: counted.wait_bumps(3) or b"woke")
    while not counted.waiters:   # it counts itself in before it first looks
        threading.Event().wait(0.001)
    for _ in range(3):
        loop.hand(counted.count, "bumps")
    loop.run_once()
    assert waiter.result() == "woke" and wakes == [3]
    loop.run_once(block=False)
    assert wakes == [3]   # no waiter, no wake-up
    loop.shut_down()


def test_a_call_made_in_a_callback_on_the_loops_thread_turns_the_loop_until_it_is_done():
    loop, got, done = started(), [], threading.Event()

    def in_a_callback():
        call = BlockingCall(b"x", loop)
        loop.at(loop.clock.now(), lambda: call.replied(None, b"answer"))   # due now: a later turn
        got.append((loop.complete(call, lambda: None), loop.thread is threading.current_thread()))
        done.set()
    loop.hand(loop.queue_callback, ReliabilityCache(), in_a_callback)
    assert done.wait(Hooks.hook_timeout) and got == [(b"answer", True)]
    loop.shut_down()


def test_a_call_made_in_the_middle_of_a_turns_work_is_refused_with_a_clear_error():
    loop = started()
    with pytest.raises(ManagedError, match="from inside a turn's work"):
        # handed: it runs in a turn's work
        loop.ask(loop.complete, BlockingCall(b"x", loop), lambda: None)
    loop.shut_down()


def test_a_thread_waits_for_its_call_until_the_turn_that_completes_it_has_made_its_callbacks():
    loop, order = started(), []
    call = BlockingCall(b"x", loop)

    def start():
        order.append("start")
        loop.queue_callback(ReliabilityCache(), order.append, "callback")
        call.replied(None, b"answer")
    assert loop.complete(call, start) == b"answer"
    assert order == ["start", "callback"]
    loop.shut_down()


def test_shut_down_joins_the_thread_closes_every_socket_and_refuses_what_comes_after():
    clock = VirtualClock()
    loop = started(clock)
    near, far = socket.socketpair()
    loop.hand(loop.watch, near, 1, lambda events: None)   # its owner left it open: closed
    loop.ask(lambda: None)
    loop.shut_down()
    far.close()
    assert not loop.thread.is_alive() and near.fileno() == -1 and loop.stopped
    assert loop.hand(print) is False
    with pytest.raises(ManagedError, match="shut down"):
        loop.complete(BlockingCall(b"x", loop), lambda: None)
    clock.advance(1.0)   # it no longer watches the clock: nothing to wake


def test_shut_down_from_the_loops_own_thread_ends_it_once_the_turn_is_over():
    loop = started()
    loop.hand(loop.shut_down)
    loop.thread.join(Hooks.hook_timeout)
    assert not loop.thread.is_alive() and loop.stopped
    loop.shut_down()   # again, from here: nothing left to do


def test_a_deadline_further_off_than_a_select_can_wait_leaves_the_loop_turning():
    loop = started()
    loop.hand(lambda: loop.at(loop.clock.now() + 1e8, print))   # years: more than epoll can wait
    loop.wait_turns(1)
    loop.hand(lambda: None)
    loop.wait_turns(2)   # the select() between them waited, and came back
    assert loop.thread.is_alive() and loop.handler_errors == 0
    loop.shut_down()
