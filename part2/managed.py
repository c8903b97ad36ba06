"""managed: Part two's public names in one place, the reliability layer a production pool
adds, after Ocamlnet's Rpc_proxy (COMMENTARY.md, sections 12 to 17, tells it).

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
