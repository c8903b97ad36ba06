"""bench.trip: how long one request's trip through a pool is, in the project's own calls.
A reader of the lesson need not read it: it is how the commentary's count of a trip is made.

    python3 -m bench.trip [--list]

One steady `GET` (line protocol, the pool's upstream connection already open, three GETs
before it to take every first-time path) through FramedProxy (Part one) and ManagedProxy
(Part two), counted with a profile function on every thread the pools run: each call of a
function defined in this project, except the upstream's (Upstream's, answer, read_lines,
and whatever they call) and the counters' bookkeeping (Hooks, Counted), which no pool
needs for its trip. --list
prints each call in order, with its file.
"""
import argparse
import os
import socket
import sys
import threading
import time

from ground.server import Hooks
from part2.managed import ManagedProxy
from tcp_proxy import FramedProxy, Upstream

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
LEFT_OUT = ("Upstream", "Hooks", "Counted", "answer", "read_lines")
WARM_UPS = 3   # GETs before the counted one: connection open, every first-time path taken


class Trip:
    """Counts the project's calls while on; installed on every thread."""

    def __init__(self):
        self.on = False
        self.calls = []   # (file relative to the project, qualified name), in order
        self.lock = threading.Lock()

    def profile(self, frame, event, arg):
        if not self.on or event != "call":
            return
        code = frame.f_code
        path = os.path.abspath(code.co_filename)
        if not path.startswith(ROOT) or os.sep + ".venv" in path[len(ROOT) - 1:]:
            return
        name = code.co_qualname
        if name.startswith(LEFT_OUT) or os.path.basename(path) == "trip.py" or \
                upstreams(frame.f_back):
            return
        with self.lock:
            self.calls.append((os.path.relpath(path, ROOT), name))

    def files(self):
        return len({path for path, _ in self.calls})

    def changes(self):
        """How often the trip moves from one file to another."""
        paths = [path for path, _ in self.calls]
        return sum(1 for before, after in zip(paths, paths[1:]) if before != after)


def upstreams(frame):
    """True if the frame runs for the upstream: a caller of it is one of Upstream's."""
    while frame is not None:
        if frame.f_code.co_qualname.startswith("Upstream"):
            return True
        frame = frame.f_back
    return False


def get(sock):
    sock.sendall(b"GET alpha\n")
    reply = b""
    while not reply.endswith(b"\n"):
        data = sock.recv(4096)
        if not data:
            raise ConnectionError("the pool closed the connection")
        reply += data
    return reply


def one_trip(make_pool):
    """The calls of one steady GET through the pool make_pool(upstream_addr) makes."""
    trip = Trip()
    threading.setprofile(trip.profile)   # threads started from here on
    try:
        with Upstream() as upstream, make_pool(upstream.addr) as pool, \
                socket.create_connection(pool.addr, timeout=Hooks.hook_timeout) as sock:
            for _ in range(WARM_UPS):
                get(sock)
            time.sleep(0.2)   # the pool's threads settle: nothing of the warm-ups is counted
            trip.on = True
            get(sock)
            time.sleep(0.2)   # whatever the reply's write set going ends
            trip.on = False
    finally:
        threading.setprofile(None)
    return trip


POOLS = {"FramedProxy": lambda addr: FramedProxy(addr),
         "ManagedProxy": lambda addr: ManagedProxy([(addr, 1)])}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m bench.trip", description=__doc__.split(
        "\n")[0])
    parser.add_argument("--list", action="store_true", help="print each call, in order")
    options = parser.parse_args(argv)
    for label, make_pool in POOLS.items():
        trip = one_trip(make_pool)
        print(f"{label}: {len(trip.calls)} project calls in {trip.files()} files, "
              f"{trip.changes()} changes of file, for one steady GET")
        if options.list:
            for path, name in trip.calls:
                print(f"    {path}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
