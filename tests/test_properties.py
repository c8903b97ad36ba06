"""Randomized proof that the pools never hand one client another client's reply.

What is random in each example (hypothesis draws it, and prints the example
that fails):
  - how many clients (1-12) talk at once, and how many requests each sends (1-10);
  - where each client's byte stream is cut into writes: a cut may fall inside a
    line, and one write may carry several lines;
  - the pool cap of FramedProxy (1-12);
  - where the upstream cuts each of its replies (CuttingUpstream, seeded).
The claim checked: every client reads back exactly the replies to its own
requests, in the order it sent them, and nothing else.

The normal suite runs 80 examples in all, shared among the proxies (SHARES):
each client of an example costs about 5 ms of CPU, and the suite has a budget of
20 s for everything on this machine's two cores (it was 200 examples, then 120).
No example database is kept, so every run of the suite draws 80 new ones.
`make soak` (SOAK=10000) shares 10,000 the same way.
"""
import os
import random
import socket
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ground.server import recv
from tcp_proxy import answer, FramedProxy, PassthroughProxy, Upstream

EXAMPLES = int(os.environ.get("SOAK", "80"))   # in all, over every proxy
CLIENT_TIMEOUT = 10.0   # a client that waits longer than this has found a hang

from part2 import managed

# Each proxy's share of EXAMPLES. FramedProxy's checkin is the lesson and the
# managed proxy pipelines, so they get the most; PassthroughProxy shares nothing
# between clients and needs the fewest.
SHARES = {"framed": 0.5, "managed": 0.3, "passthrough": 0.2}


def examples_for(proxy_name):
    return max(1, round(EXAMPLES * SHARES[proxy_name]))


class CuttingUpstream(Upstream):
    """An Upstream that writes each reply in one to four pieces, cut at points a
    seeded random chooses, so a proxy's recv() may end anywhere inside a reply."""

    def __init__(self, seed):
        super().__init__()
        self.cut_chooser = random.Random(seed)
        self.pieces_sent = 0   # more pieces than replies means some reply was cut

    def reply(self, conn, data):
        with self._lock:   # one Random shared by every connection's writer thread
            piece_count = self.cut_chooser.randint(1, min(4, len(data)))
            cuts = sorted(self.cut_chooser.sample(range(1, len(data)), piece_count - 1))
            self.pieces_sent += piece_count
        for start, end in zip([0] + cuts, cuts + [len(data)]):
            conn.sendall(data[start:end])
            time.sleep(0)   # let the proxy's reader run between pieces
        self.count("replies")


# --- the scenario: what hypothesis draws ------------------------------------------

def request_lines(client_number, request_count, padding):
    """Requests whose replies name their sender and their position, so a reply
    that went to the wrong client, or out of order, cannot pass for a right one."""
    return [b"GET c%dr%d%s\n" % (client_number, number, b"x" * padding[number])
            for number in range(request_count)]


@st.composite
def client_scripts(draw, client_number):
    """One client's requests and the writes its byte stream is cut into."""
    request_count = draw(st.integers(1, 10))
    padding = draw(st.lists(st.integers(0, 30), min_size=request_count, max_size=request_count))
    stream = b"".join(request_lines(client_number, request_count, padding))
    cuts = draw(st.lists(st.integers(1, len(stream) - 1), max_size=12, unique=True))
    cuts.sort()
    writes = [stream[start:end] for start, end in zip([0] + cuts, cuts + [len(stream)])]
    return writes


@st.composite
def scenarios(draw):
    client_count = draw(st.integers(1, 12))
    return {
        "clients": [draw(client_scripts(number)) for number in range(client_count)],
        "pool_cap": draw(st.integers(1, 12)),
        "upstream_seed": draw(st.integers(0, 2**32 - 1)),
    }


def expected_replies(writes):
    lines = b"".join(writes).split(b"\n")[:-1]
    return b"".join(answer(line) for line in lines)


# --- running one scenario --------------------------------------------------------

def talk(addr, writes, received, index):
    """One client: send each write, say EOF, then read until the proxy closes."""
    with socket.create_connection(addr, timeout=CLIENT_TIMEOUT) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)   # each write its own segment
        for data in writes:
            sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        reply = b""
        while data := recv(sock):
            reply += data
        received[index] = reply


def run_clients(addr, scripts):
    """Run every client at once; return what each one read, in client order."""
    received = [None] * len(scripts)
    threads = [threading.Thread(target=talk, args=(addr, writes, received, index))
               for index, writes in enumerate(scripts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(2 * CLIENT_TIMEOUT)
    return received


def replies_through(make_proxy, scenario, upstream=None):
    """Run the scenario through make_proxy(upstream_addr, pool_cap); return what
    each client read, the proxy and the upstream (both closed by then)."""
    upstream = upstream or CuttingUpstream(scenario["upstream_seed"])
    with upstream, make_proxy(upstream.addr, scenario["pool_cap"]) as proxy:
        received = run_clients(proxy.addr, scenario["clients"])
    return received, proxy, upstream


def framed(addr, pool_cap):
    return FramedProxy(addr, pool_cap=pool_cap)


def passthrough(addr, pool_cap):
    return PassthroughProxy(addr)   # one upstream connection per client: no cap to set


class Coverage:
    """Tallies over a whole property run, so a test can show that the cases its
    claim is about (cut lines, several lines per write, cut replies) really ran."""

    def __init__(self):
        self.examples = self.writes_cutting_a_line = self.writes_of_several_lines = 0
        self.cut_replies = self.partial_replies_read = 0

    def add(self, scenario, proxy, upstream):
        self.examples += 1
        for writes in scenario["clients"]:
            self.writes_cutting_a_line += sum(not data.endswith(b"\n") for data in writes)
            self.writes_of_several_lines += sum(data.count(b"\n") > 1 for data in writes)
        self.cut_replies += upstream.pieces_sent - upstream.replies
        self.partial_replies_read += getattr(proxy, "partial_replies", 0)


# --- the properties ------------------------------------------------------------------

def run_property(proxy_name, make_proxy):
    coverage = Coverage()

    @settings(max_examples=examples_for(proxy_name), deadline=None, database=None, print_blob=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(scenarios())
    def every_client_gets_its_own_replies(scenario):
        received, proxy, upstream = replies_through(make_proxy, scenario)
        assert received == [expected_replies(writes) for writes in scenario["clients"]]
        coverage.add(scenario, proxy, upstream)

    every_client_gets_its_own_replies()
    return coverage


@pytest.mark.slow
def test_framed_proxy_gives_every_client_exactly_its_own_replies_in_order():
    coverage = run_property("framed", framed)
    assert coverage.examples == examples_for("framed")
    assert coverage.writes_cutting_a_line > 0 and coverage.writes_of_several_lines > 0
    assert coverage.cut_replies > 0
    assert coverage.partial_replies_read > 0   # the proxy did read replies in pieces


@pytest.mark.slow
def test_passthrough_proxy_gives_every_client_exactly_its_own_replies_in_order():
    coverage = run_property("passthrough", passthrough)
    assert coverage.examples == examples_for("passthrough")
    assert coverage.writes_cutting_a_line > 0 and coverage.writes_of_several_lines > 0
    assert coverage.cut_replies > 0


@pytest.mark.slow
def test_managed_proxy_gives_every_client_exactly_its_own_replies_in_order():
    coverage = run_property("managed",
                            lambda addr, pool_cap: managed.ManagedProxy([(addr, pool_cap)]))
    assert coverage.examples == examples_for("managed")
    assert coverage.writes_cutting_a_line > 0 and coverage.cut_replies > 0


# --- the claim can fail --------------------------------------------------------------

def test_a_pool_that_checks_in_on_a_silence_fails_the_claim():
    """The upstream pauses 150 ms after the first 3 bytes of each reply; the timeout
    pool takes 20 ms of silence for the end. It hands the client b"a=A" as the
    whole first reply, then the first reply's tail with the second's head as the
    second: the client never sees the last 13 bytes of its reply to GET b."""
    scenario = {"clients": [[b"GET a\nGET b\n"]], "pool_cap": 1}
    slow_upstream = Upstream(split_at=3, pause=lambda number: time.sleep(0.15))

    def timeout_pool(addr, pool_cap):
        return FramedProxy(addr, pool_cap=pool_cap, release="timeout", release_timeout=0.02)

    received, _, _ = replies_through(timeout_pool, scenario, slow_upstream)
    assert expected_replies(scenario["clients"][0]) == b"a=AAAAAAAAAAAA\nb=BBBBBBBBBBBB\n"
    assert received == [b"a=AAAAAAAAAAAA\nb=B"]
