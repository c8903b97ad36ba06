"""managed_demo: the scenarios of `python3 demo.py --managed`, one per production feature.

Each scenario shows one failure the toy's pool cannot survive and the managed
layer's answer to it, on real sockets. The transcript is the same bytes on every
run: nothing printed carries a port, a real time or a thread id; times shown as
t=1.0s are read from a VirtualClock, and no step sleeps. Every step waits on a
hook (wait_<counter>(n)) or moves the virtual clock.
"""
import contextlib
import socket

from part2.managed import (ManagedClient, ManagedError, ManagedProxy, ManagedSet, ReliabilityCache,
                           VirtualClock)
from scaffolding import kit
from scaffolding.faults import FaultyUpstream
from ground.server import Hooks
from tcp_proxy import read_lines


# --- the demo's helpers ---------------------------------------------------------

def outcome(function, *args):
    """What a call gave, as the transcript shows it: the reply line or the ManagedError."""
    return kit.outcome(function, *args, expected=ManagedError)


def in_background(function, *args):
    """The call on a thread of its own; .result() joins it (a ManagedError is an outcome)."""
    return kit.Background(function, *args, expected=ManagedError)


def ask(addr, requests):
    """A proxy client: send each request line, wait for its reply; return the replies."""
    replies = []
    with socket.create_connection(addr, timeout=Hooks.hook_timeout) as sock:   # a hang reads as EOF
        lines = read_lines(sock)
        for request in requests:
            sock.sendall(request.encode() + b"\n")
            replies.append(next(lines, b"<EOF>").decode())
    return replies


def show_transitions(client, first=0):
    for before, after, reason in list(client.transition_log)[first:]:
        print(f"    {before} -> {after}: {reason}")


def right(request, reply):
    """The verdict on one reply as printed: its own value, an error, or a value that is not
    its own."""
    key = request.split()[1]
    if reply == f"{key}={key[0].upper() * 12}":
        return "right"
    return "WRONG" if "=" in reply.split(":")[0] else "an error, not a value"


# --- the scenarios ----------------------------------------------------------------

def dirty_return():
    # each label says what is set, never what follows: an exercise can change the outcome
    variants = [("a client that forgets a timed-out call (the bug)", {"late_replies": "forget"}),
                ("managed, msg_timeout not fatal (the default)", {}),
                ("managed, msg_timeout_is_fatal=True", {"msg_timeout_is_fatal": True})]
    for label, options in variants:
        clock = VirtualClock()
        with FaultyUpstream(hold={1}) as upstream:
            client = ManagedClient(upstream.addr, msg_timeout=1.0, clock=clock, **options)
            print(f"{label}:")
            first = in_background(client.call, b"GET apple\n")
            upstream.wait_held(1)   # apple's reply is the held one: no later reply takes its number
            clock.advance(1.0)
            print(f"  t={clock.now()}s GET apple  -> {first.result()}")
            print(f"  pending calls after the timeout: {client.pending_calls}")
            second = in_background(client.call, b"GET banana\n")
            client.wait_sent(2)
            upstream.release()   # apple's reply, late, then banana's
            reply = second.result()
            print(f"  GET banana -> {reply}   {right('GET banana', reply)}")
            if options.get("late_replies"):
                client.wait_errors(1)   # banana's reply then finds no call waiting for it
            print(f"  late replies discarded: {client.discarded}; connections: {client.connects}; "
                  f"errors: {client.errors}")
            show_transitions(client, first=2)
            client.shut_down()


def restart():
    with FaultyUpstream() as upstream:
        client = ManagedClient(upstream.addr)
        print("GET one ->", outcome(client.call, b"GET one\n"))
        upstream.close()   # the upstream stops: the idle connection gets an EOF
        client.wait_transitions(3)
        print("the upstream stops while the client is idle:")
        show_transitions(client, first=2)
        print(f"  errors counted: {client.errors}")
        upstream.restart()
        print("upstream back on the same port; GET two ->", outcome(client.call, b"GET two\n"))
        print(f"  connections made: {client.connects}")
        upstream.fail_next(1)   # the connection dies with the next call in flight
        print("a call in flight when the connection dies: GET three ->",
              outcome(client.call, b"GET three\n"))
        show_transitions(client, first=5)
        client.shut_down()

        clock, attempts = VirtualClock(), []
        managed_set = ManagedSet([(upstream.addr, 1)], clock=clock, idempotent_wait=5.0,
                                 on_event=lambda source, event: attempts.append(event)
                                 if event[0] == "attempt" else None)
        upstream.fail_next(1)
        call = in_background(managed_set.idempotent_call, b"GET four\n")
        managed_set.wait_retries(1)
        clock.advance(5.0)
        print(f"the same through idempotent_call: GET four -> {call.result()}")
        for _, number, _, result in attempts:
            print(f"  attempt {number}: {result}")
        print(f"  attempts: {managed_set.attempts}, retries: {managed_set.retries}, "
              f"t={clock.now()}s")
        managed_set.shut_down()


def initial_ping():
    for label, silent in (("an upstream that accepts and never answers", True),
                          ("an upstream that answers", False)):
        clock = VirtualClock()
        with FaultyUpstream(every="skip" if silent else None) as upstream:
            client = ManagedClient(upstream.addr, initial_ping=True, msg_timeout=1.0, clock=clock)
            print(f"{label}, two calls waiting on the initial ping:")
            calls = [in_background(client.call, b"GET secret\n"),
                     in_background(client.call, b"GET other\n")]
            client.wait_calls(2)
            upstream.wait_requests(1)
            if silent:   # both calls wait on the ping: the one that sent it, and the other
                client.wait_waiting(2)
                clock.advance(1.0)
            for request, call in zip(("GET secret", "GET other"), calls):
                print(f"  {request:<10} -> {call.result()}")
            first, *rest = upstream.parsed   # the two calls may go in either order
            print(f"  the upstream received: {', '.join([first] + sorted(rest))}")
            print(f"  errors counted: {client.errors}")
            client.shut_down()


def failover():
    clock = VirtualClock()
    cache = ReliabilityCache(policy="independent", threshold=1, clock=clock)
    with FaultyUpstream() as first, FaultyUpstream() as second:
        names = {0: "A", 1: "B", None: "-"}
        attempts = []
        managed_set = ManagedSet([(first.addr, 1), (second.addr, 1)], policy="failover",
                                 rcache=cache, clock=clock, idempotent_wait=0.0,
                                 on_event=lambda source, event: attempts.append(event)
                                 if event[0] == "attempt" else None)
        first.close()
        print("A stopped; policy failover; cache: independent, threshold 1")
        for step in (0.0, 0.5, 0.5, 2.0, "restart A", 1.0, 3.0):
            if step == "restart A":
                first.restart()
                print("  A restarted")
                continue
            clock.advance(step)
            attempts.clear()
            reply = managed_set.call(b"GET k\n").decode().rstrip()
            tried = "; ".join(f"{names[index]} {result}" for _, _, index, result in attempts)
            print(f"  t={clock.now()}s GET k -> {reply}   tried: {tried}")
        print("disable windows of A:")
        for _, start, end, reason in cache.windows:
            print(f"  t={start}s to t={end}s ({end - start}s): {reason}")
        print(f"A enabled now: {cache.is_enabled(first.addr)}")
        managed_set.shut_down()


def balance_load():
    for policy in ("balance_load", "failover"):
        with contextlib.ExitStack() as stack:
            upstreams = [stack.enter_context(FaultyUpstream(hold=range(1, 10))) for _ in range(3)]
            managed_set = ManagedSet([(upstream.addr, 3) for upstream in upstreams], policy=policy)
            calls = [in_background(managed_set.call, b"GET burst\n") for _ in range(9)]
            managed_set.wait_picks(9)   # every pick made while no reply can come back
            for upstream in upstreams:
                upstream.release()
            good = sum(call.result() == "burst=BBBBBBBBBBBB" for call in calls)
            print(f"{policy}: 9 calls at once, 3 upstreams of 3 connections: {good}/9 right")
            print(f"  calls per upstream:       {[upstream.requests for upstream in upstreams]}")
            print(f"  connections per upstream: {[upstream.connections for upstream in upstreams]}")
            managed_set.shut_down()


def back_pressure():
    with FaultyUpstream(hold={1, 2}) as upstream:
        with ManagedProxy([(upstream.addr, 1)], pending_calls_max=2) as proxy:
            print("one connection, pending_calls_max=2; the upstream holds its first two replies")
            held = [in_background(ask, proxy.addr, [request]) for request in ("GET a", "GET b")]
            upstream.wait_requests(2)
            print(f"  third client, GET c -> {ask(proxy.addr, ['GET c'])[0]}")
            upstream.release()
            for request, call in zip(("GET a", "GET b"), held):
                print(f"  {request} -> {call.result()[0]}")
            print(f"  refused at once: {proxy.managed_set.refusals}; "
                  f"requests that reached the upstream: {upstream.requests}")


def pipelining():
    with FaultyUpstream(gate=8) as upstream:
        with ManagedProxy([(upstream.addr, 1)], pending_calls_max=8) as proxy:
            requests = [[f"GET {name.lower()}{n}" for n in range(3)] for name in "ABCDEFGH"]
            clients = [in_background(ask, proxy.addr, lines) for lines in requests]
            replies = [client.result() for client in clients]
            good = sum(right(request, reply) == "right"
                       for lines, answers in zip(requests, replies)
                       for request, reply in zip(lines, answers))
            print("8 clients x 3 requests through one upstream connection, pending_calls_max=8;")
            print("the upstream holds every reply until 8 requests have arrived:")
            print(f"  {good}/24 right; upstream connections: {upstream.connections}; "
                  f"managed connections: {len(proxy.managed_set.clients[0])}")


def idle_timeout():
    clock = VirtualClock()
    with FaultyUpstream() as upstream:
        client = ManagedClient(upstream.addr, idle_timeout=5.0, clock=clock)
        print(f"idle_timeout=5.0; t={clock.now()}s GET x ->", outcome(client.call, b"GET x\n"))
        clock.advance(4.0)
        print(f"  t={clock.now()}s state: {client.state}")
        clock.advance(1.0)
        client.wait_transitions(3)
        print(f"  t={clock.now()}s state: {client.state}, with no call made:")
        show_transitions(client, first=2)
        reply = outcome(client.call, b"GET y\n")
        print(f"  t={clock.now()}s GET y -> {reply}; connections made: {client.connects}")
        client.shut_down()


MANAGED_SCENARIOS = [
    ("dirty", "The dirty return: a timed-out call's late reply", dirty_return),
    ("restart", "Upstream restart: idle EOF, a lost call, idempotent retry", restart),
    ("ping", "Initial ping: nothing user-visible reaches a dead upstream", initial_ping),
    ("failover", "Failover with a reliability cache, on the virtual clock", failover),
    ("balance", "Load balancing against failover: one burst of calls", balance_load),
    ("pressure", "Back-pressure: pending_calls_max, then an ERR line at once", back_pressure),
    ("pipeline", "Pipelining: 24 requests over one connection, 8 in flight", pipelining),
    ("idle", "Idle timeout on the virtual clock", idle_timeout),
]
