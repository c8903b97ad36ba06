"""managed: Part two's public names in one place, the reliability layer a production pool
adds, after Ocamlnet's Rpc_proxy (COMMENTARY.md, Part two, tells it).

The modules, from the lowest layer up:

    part2/clock.py        RealClock, VirtualClock: every deadline is read on one of these
    part2/hooks.py        the counters every object keeps; call_back(), how callbacks are made
    part2/cache.py        ReliabilityCache, global_rcache(): which upstreams failed lately
    part2/calls.py        the five errors; BlockingCall, what a thread's call waits on
    part2/loop.py         Loop, the one event loop and its turn; Transport, one socket on it
    part2/pipeline.py     the socket-free core: a Request from its client's read to its
                          reply; a connection's Pipeline; a proxy client's ClientStream
    part2/connection.py   one upstream connection's life: down -> connecting -> up
    part2/client.py       ManagedClient: one connection at a time, remade on demand
    part2/managed_set.py  ManagedSet: clients over services, the pick, the retries
    part2/proxy.py        ManagedProxy: a listener, and every client connection on the loop
    part2/downstream.py   ProxyClient: one client connection, its bounds and its deadlines
    part2/lease.py        what the proxy lends a client whose session keeps state: the
                          connections of a client's own (part2/links.py), a bounded resource

The order a request takes, with the files it passes through: the client's Transport
reads (loop.py) -> ClientStream.received(): framed, admitted, a Request (pipeline.py) ->
ManagedSet.gather(), placed once the turn's reads are over (managed_set.py) ->
Connection.send() (connection.py) -> Pipeline.queue(), its Transport's write -> the
reply: Connection.received(), Pipeline.feed() -> ClientStream.replied(), in its
client's order -> the client's Transport sends.

`from part2.managed import ManagedProxy` (or any name below) is how the demo, the
pictures, the bench and the tests reach them.

What you get by default (COMMENTARY.md, section 15, points here): ManagedProxy(services),
with services a list of (address, connections) and nothing else.

    msg_timeout        5 s, fatal (ManagedClient, ManagedSet: -1, not fatal). A call
                       unanswered that long ends its connection, and every call owed on
                       it gets an error.
    idle_timeout       -1. Connections stay open.
    initial_ping       off. A request is the first thing a new connection carries.
    pending_calls_max / pending_calls_norm
                       no limit / 1. Once every connection is busy, calls pipeline
                       behind the least busy one.
    idempotent_max / idempotent_wait
                       3 / 1 s (Ocamlnet: 5 s). call() retries only what never left, and
                       waits only before a service is tried again.
    cache              its own, the global one's but with policy "independent": threshold
                       1, windows of 1 s doubling to 64 s. It fails over, and never
                       refuses every service.
    request_timeout    10 s for a request begun to arrive whole; then the client is told,
                       and ends.
    hold_timeout       30 s from each request of a client holding a connection (MULTI,
                       WATCH) to its next; then the connection is closed, and the rest of
                       the transaction refused.
    checkout_timeout   5 s to wait for a connection of one's own; then an error.
    max_clients        no limit (a class attribute). Past it a client is told "max number
                       of clients reached", redis-server's own words (its
                       src/networking.c, acceptCommonHandler()), and closed.

The proxy's 5 s is FramedProxy's reply_timeout. A healthy redis-server answers every
command it shares a connection for at once, and a wait has a connection of its own.
ReliabilityCache() and global_rcache() keep Ocamlnet's policy, "none": they count errors
and never disable. A set's own cache never refuses everything. With every service
disabled, it lets a call try the one whose window ends first, much as Envoy's panic
threshold by default balances over every host once too few are healthy:

    envoyproxy.io/docs/envoy/latest/intro/arch_overview/upstream/load_balancing/panic_threshold

So a service refusing connects costs each call an ERR CommunicationError at once. With a
cache you give it, a set whose services are all disabled refuses the call. For a real
service, set msg_timeout just above the slowest reply you accept, initial_ping=True, and
an idle_timeout below the server's own.

Where this differs from Ocamlnet, and why. Each difference is pinned by a test. Ocamlnet's
sources cited are https://github.com/rgrinberg/ocamlnet/blob/master/src/rpc/ (rpc_proxy.mli,
rpc_proxy.ml, rpc_client.ml).

    Late replies. Ocamlnet forgets a timed-out call (rpc_client.ml: remove_pending_call).
        ONC RPC's reply carries its call's id, the XID (RFC 5531), so a late reply is
        dropped by id. Here the call stays owed (COMMENTARY.md, section 14.2): a line or
        RESP reply carries no id, and only the queue knows it is still coming.
    A set's own cache. A set given none derives one with policy "independent", so a
        failed service is skipped until its window ends (the set's policy stays
        balance_load). Ocamlnet's sets use the global cache, whose policy is `None`
        (rpc_proxy.mli, global_rcache_config).
    Retries. A retry goes at once to a service not tried. Ocamlnet waits idempotent_wait
        before every retry (rpc_proxy.ml, idempotent_async_call).
    Time. Ocamlnet's timers fire only while its event loop runs, which a synchronous call
        drives only until its reply (rpc_proxy.mli, on the idle timeout). Here the loop
        has a thread of its own (or its owner turns it), so scenario 8's idle timeout
        fires with no call. A call made in a callback, on the loop's thread, turns the
        loop until its reply.
"""
from part2.cache import (DEFAULTS, POLICIES, ReliabilityCache, global_rcache,
                         set_global_rcache_config)
from part2.calls import (BlockingCall, ClusterServiceUnavailable, CommunicationError,
                         ManagedError, MessageLost, MessageTimeout, ServiceUnavailable)
from part2.client import TRANSITIONS_KEPT, ManagedClient
from part2.clock import RealClock, VirtualClock
from part2.connection import ABANDONED_MAX, Connection
from part2.loop import INBOX_SIZE, Loop, Transport
from part2.managed_set import ManagedSet
from part2.pipeline import ClientStream, Misstep, Pipeline, Request
from part2.proxy import ManagedProxy

__all__ = ["ABANDONED_MAX", "DEFAULTS", "INBOX_SIZE", "POLICIES", "TRANSITIONS_KEPT",
           "BlockingCall", "ClientStream", "ClusterServiceUnavailable", "CommunicationError",
           "Connection", "Loop", "ManagedClient", "ManagedError", "ManagedProxy", "ManagedSet",
           "MessageLost", "MessageTimeout", "Misstep", "Pipeline", "RealClock", "ReliabilityCache",
           "Request", "ServiceUnavailable", "Transport", "VirtualClock", "global_rcache",
           "set_global_rcache_config"]
