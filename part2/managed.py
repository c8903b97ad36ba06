"""managed: Part two's public names in one place, the reliability layer a production pool
adds, after Ocamlnet's Rpc_proxy (COMMENTARY.md, sections 12 to 17, tells it).

The modules, from the lowest layer up:

    part2/clock.py        RealClock, VirtualClock: every deadline is read on one of these
    part2/hooks.py        the counters every object keeps; call_back(), how callbacks are made
    part2/cache.py        ReliabilityCache, global_rcache(): which upstreams failed lately
    part2/calls.py        the five errors; Run (requests owed replies in order) and Call
    part2/loop.py         Loop: the one event loop, its turn and its deadlines
    part2/pipeline.py     the socket-free core: replies matched to requests, in order
    part2/connection.py   one upstream connection's life: down -> connecting -> up
    part2/client.py       ManagedClient: one connection at a time, remade on demand
    part2/managed_set.py  ManagedSet: clients over services, the pick, the retries
    part2/proxy.py        ManagedProxy: every client connection on the loop
    part2/lease.py        what the proxy lends a client whose session keeps state

`from part2.managed import ManagedProxy` (or any name below) is how the demo, the
pictures, the bench and the tests reach them.
"""
from part2.cache import (DEFAULTS, POLICIES, ReliabilityCache, global_rcache,
                         set_global_rcache_config)
from part2.calls import (Call, ClusterServiceUnavailable, CommunicationError, ManagedError,
                         MessageLost, MessageTimeout, Run, ServiceUnavailable)
from part2.client import TRANSITIONS_KEPT, ManagedClient
from part2.clock import RealClock, VirtualClock
from part2.connection import ABANDONED_MAX, Connection
from part2.loop import Loop
from part2.managed_set import ManagedSet
from part2.pipeline import ClientStream, Pipeline
from part2.proxy import ManagedProxy

__all__ = ["ABANDONED_MAX", "DEFAULTS", "POLICIES", "TRANSITIONS_KEPT", "Call", "ClientStream",
           "ClusterServiceUnavailable", "CommunicationError", "Connection", "Loop",
           "ManagedClient", "ManagedError", "ManagedProxy", "ManagedSet", "MessageLost",
           "MessageTimeout", "Pipeline", "RealClock", "ReliabilityCache", "Run",
           "ServiceUnavailable", "VirtualClock", "global_rcache", "set_global_rcache_config"]
