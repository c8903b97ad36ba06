"""bench.placement: where a connection's threads run, for the bench's relays. A
reader of the lesson need not read this module: it changes no byte a proxy sends,
only which CPU runs the threads that send them.

    OneCpuPerGroup   a mixin for any ground.server.Server: each connection's threads run
                     on one CPU, shared by the server's connections until it holds
                     sockets_per_cpu more sockets, then the next CPU (Linux only)
    placed(cls)      cls with the mixin applied, as the bench's rows use it

Why (BENCH.md, "Which mechanism costs what"): only one thread runs Python at a time.
Threads spread over two CPUs pass that turn on with wake-ups sent from core to core,
which cost a relay a third to over half of its CPU; on one CPU each hand-off is a
plain switch. Groups, not one CPU for all: thousands of threads woken at once on one
run queue starve the thread that holds the turn.
"""
import contextlib
import os

CAN_PLACE = hasattr(os, "sched_setaffinity")


class OneCpuPerGroup:
    """Mixin: pin each connection's thread (and the threads it starts) to its group's CPU.
    Overrides Server.serve_connection(), the seam that runs on the connection's thread."""
    sockets_per_cpu = 256   # sockets a CPU takes before the next connections go to the next CPU

    def serve_connection(self, conn):
        if CAN_PLACE and self.sockets_per_cpu:
            cpus = sorted(os.sched_getaffinity(os.getpid()))   # the process's, not this thread's
            # processes start apart
            group = os.getpid() + self.open_socket_count() // self.sockets_per_cpu
            with contextlib.suppress(OSError):   # a CPU taken away since: stay where the OS put it
                os.sched_setaffinity(0, {cpus[group % len(cpus)]})
        super().serve_connection(conn)


def placed(server_class, sockets_per_cpu=OneCpuPerGroup.sockets_per_cpu):
    """server_class with OneCpuPerGroup applied; sockets_per_cpu=0 places nothing."""
    return type(f"Placed{server_class.__name__}", (OneCpuPerGroup, server_class),
                {"sockets_per_cpu": sockets_per_cpu})
