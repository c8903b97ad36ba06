"""scaffolding.faults: pools and upstreams that lie, for the scenarios and the tests.
A reader of the lesson need not read this module: each class breaks one promise on
purpose, so that a scenario can show what the lesson's checks prevent.

    TrustingPool       FramedProxy with its out-of-step checks switched off
    FAULTS             the one vocabulary of faults an upstream can commit on a reply
    FaultyUpstream     an Upstream that commits one of them on every reply (Part one's
                       scenario 9 and its tests) or on the next n (Part two), holds
                       replies, or goes deaf or away
"""
import collections
import threading

from ground.frames import MAX_LINE
from ground.server import shutdown
from tcp_proxy import LINES, FramedProxy, Upstream


class TrustingPool(FramedProxy):
    """FramedProxy with its out-of-step checks switched off: bytes read past a reply
    wait for the next borrower as the start of its reply, and nothing is checked.
    The pool as it was before it learnt to refuse a dirty connection."""

    def __init__(self, upstream_addr, pool_cap=1, framing=LINES):
        super().__init__(upstream_addr, pool_cap=pool_cap, framing=framing)
        self.leftovers = {}   # upstream socket -> bytes read past its last reply

    def read_reply(self, sock, buffer=b""):
        reply, self.leftovers[sock] = super().read_reply(sock, self.leftovers.get(sock, b""))
        return reply, b""

    def in_step(self, request, reply, rest):
        return True

    def quiet(self, sock):
        return True


EXTRA = b"EXTRA\n"   # the line nobody asked for

FAULTS = {   # what an upstream does instead of writing a reply honestly
    "skip": "the reply is never written; the connection carries on",
    "drop": "the connection is closed instead of the reply",
    "cut": "the reply's first bytes (cut_at, else half), then the connection is closed",
    "hang-up": "the whole reply, then the connection is closed",
    "extra": "the reply and EXTRA, a line nobody asked for, in one write",
    "extra-later": "the reply; then later(k) is called; then EXTRA, in a write of its own",
    "endless": "instead of the reply, MAX_LINE + 1 bytes with no b'\\n'",
}


def check_fault(fault):
    if fault not in FAULTS:
        raise ValueError(f"a fault is one of {tuple(FAULTS)}, not {fault!r}")
    return fault


class FaultyUpstream(Upstream):
    """An Upstream that misbehaves on demand, in the vocabulary of FAULTS.

      every=FAULT            commit FAULT on every reply
      fail_next(n, FAULT)    commit FAULT on the next n replies (before `every` applies)
      cut_at=K               how many bytes "cut" writes (default: half the reply)
      later(k)               called between reply k and its EXTRA, for "extra-later"
      hold={1, 2}            hold replies 1 and 2 (counted from 1) until release()
      on_connect="close"     close every connection as soon as it is accepted
      on_connect="deaf"      accept, never read a byte, keep it open until close()
      close(), then restart()  stop, then listen again on the same port
    """
    counters = {**Upstream.counters, "faults": 0, "extras": 0, "held": 0}
    # faults  replies the upstream misbehaved on; bumped by reply() before it misbehaves
    # extras  lines nobody asked for, written in full; bumped after their sendall()
    # held    replies stopped by `hold`; bumped as one starts waiting for release()

    def __init__(self, every=None, hold=(), on_connect="serve", cut_at=None,
                 later=lambda reply_number: None, **upstream_options):
        if every is not None:
            check_fault(every)
        if on_connect not in ("serve", "close", "deaf"):
            raise ValueError(f"on_connect is 'serve', 'close' or 'deaf', not {on_connect!r}")
        super().__init__(pause=self._hold, **upstream_options)
        self.every = every
        self.hold = set(hold)
        self.on_connect = on_connect
        self.cut_at = cut_at
        self.later = later
        self.faults_due = collections.deque()   # faults for the next replies, oldest first
        self._released = threading.Event()
        self._reply_count = 0   # replies this upstream has been asked to write

    def _hold(self, number):
        if number in self.hold:
            self.count("held")
            self._released.wait()

    def release(self):
        self._released.set()

    def close(self):
        self.release()   # a held reply would keep close() waiting for its thread
        super().close()

    def handle(self, conn):
        if self.on_connect == "close":
            return   # the server closes the connection as soon as handle() returns
        if self.on_connect == "deaf":
            with self._lock:   # close() notifies it
                while not self.closed:
                    self._lock.wait()
            return
        super().handle(conn)

    def fail_next(self, n=1, how="drop"):
        self.faults_due.extend([check_fault(how)] * n)

    def reply(self, conn, data):
        self._reply_count += 1
        fault = self.faults_due.popleft() if self.faults_due else self.every
        if fault is None:
            super().reply(conn, data)
            return
        self.count("faults")
        if fault == "skip":
            return
        if fault == "endless":
            super().reply(conn, b"x" * (MAX_LINE + 1))
            return
        if fault in ("drop", "cut"):
            conn.sendall(data[:self.cut_at or len(data) // 2] if fault == "cut" else b"")
            shutdown(conn)   # the reading thread sees EOF; the rest of the queue goes nowhere
            return
        super().reply(conn, data + EXTRA if fault == "extra" else data)
        if fault == "extra-later":
            self.later(self._reply_count)
            conn.sendall(EXTRA)
        if fault.startswith("extra"):
            self.count("extras")
        if fault == "hang-up":
            shutdown(conn)

    def restart(self):
        """Listen again on the port close() released (create_server sets SO_REUSEADDR)."""
        with self._lock:
            if not self.closed:
                raise RuntimeError("restart() follows close()")
            self._sockets = set()
            self.closed = False
        self.listen(self.addr)
