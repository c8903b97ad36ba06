"""scaffolding.faults: pools and upstreams that lie, for the scenarios and the tests.
A reader of the lesson need not read this module: each class breaks one promise on
purpose, so that a scenario can show what the lesson's checks prevent.

    TrustingPool       FramedProxy with its out-of-step checks switched off
    DishonestUpstream  an Upstream that breaks the protocol on every reply (Part one)
    FaultyUpstream     an Upstream that fails the next n replies, or goes silent, deaf
                       or away (Part two)
"""
import collections
import socket
import threading

from tcp_proxy import LINES, MAX_LINE, FramedProxy, Upstream, shutdown

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


class DishonestUpstream(Upstream):
    """An upstream that breaks the protocol in one way, its `mode`:
      extra        every reply followed by EXTRA, in the same write
      extra-later  every reply, then later(k) is called, then EXTRA in a write of its own
      drop-first   the first reply is never written; the rest are
      endless      every reply replaced by MAX_LINE + 1 bytes with no b"\\n"
      hang-up      the connection closed after each reply
      mid-reply    the first 6 bytes of a reply, then the connection closed
      silent       nothing is ever written
    """
    MODES = ("extra", "extra-later", "drop-first", "endless", "hang-up", "mid-reply", "silent")
    counters = {**Upstream.counters, "extras": 0}
    # extras  lines nobody asked for, written in full; bumped after their sendall()

    def __init__(self, mode, later=lambda reply_number: None, **options):
        if mode not in self.MODES:
            raise ValueError(f"mode is one of {self.MODES}, not {mode!r}")
        super().__init__(**options)
        self.mode, self.later = mode, later
        self._written = 0   # replies this upstream has been asked to write

    def reply(self, conn, data):
        self._written += 1
        if self.mode == "silent" or (self.mode == "drop-first" and self._written == 1):
            return
        if self.mode == "mid-reply":
            conn.sendall(data[:6])
            conn.shutdown(socket.SHUT_RDWR)
            return
        if self.mode == "endless":
            data = b"x" * (MAX_LINE + 1)
        super().reply(conn, data + EXTRA if self.mode == "extra" else data)
        if self.mode == "extra-later":
            self.later(self._written)
            conn.sendall(EXTRA)
        if self.mode.startswith("extra"):
            self.count("extras")
        if self.mode == "hang-up":
            conn.shutdown(socket.SHUT_RDWR)


class FaultyUpstream(Upstream):
    """An Upstream that can misbehave; used only by the scenarios below and the tests.

      close(), then restart()   stop, then listen again on the same port
      fail_next(n, how)         the next n replies: "drop" closes the connection
                                instead; "cut" sends half the reply, then closes;
                                "skip" never sends it and carries on; "extra"
                                sends it, then the same line again, unasked
      silent=True               accept and read, never answer
      hold={1, 2}               hold replies 1 and 2 (counted from 1) until release()
      on_connect="close"        close every connection as soon as it is accepted
      on_connect="deaf"         accept, never read a byte, keep it open until close()
    """
    counters = {**Upstream.counters, "faults": 0, "held": 0}
    # faults  replies dropped, cut, skipped or doubled; bumped by reply()
    # held    replies stopped by `hold`; bumped as one starts waiting for release()

    FAULTS = ("drop", "cut", "skip", "extra")

    def __init__(self, silent=False, hold=(), on_connect="serve", **upstream_options):
        if on_connect not in ("serve", "close", "deaf"):
            raise ValueError(f"on_connect is 'serve', 'close' or 'deaf', not {on_connect!r}")
        super().__init__(pause=self._hold, **upstream_options)
        self.silent, self.hold, self.on_connect = silent, set(hold), on_connect
        self.faults_due = collections.deque()
        self._released = threading.Event()

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
        if how not in self.FAULTS:
            raise ValueError(f"how is one of {self.FAULTS}, not {how!r}")
        self.faults_due.extend([how] * n)

    def reply(self, conn, data):
        if self.silent:
            return
        if self.faults_due:
            how = self.faults_due.popleft()
            self.count("faults")
            if how == "skip":
                return
            if how == "extra":
                super().reply(conn, data)
                conn.sendall(data)   # a line nobody asked for
                return
            if how == "cut":
                conn.sendall(data[:len(data) // 2])
            shutdown(conn)   # the reading thread sees EOF; the rest of the queue goes nowhere
            raise ConnectionAbortedError(f"fault injected: {how}")
        super().reply(conn, data)

    def restart(self):
        """Listen again on the port close() released (create_server sets SO_REUSEADDR)."""
        with self._lock:
            if not self.closed:
                raise RuntimeError("restart() follows close()")
            self._sockets, self.closed = set(), False
        self.listen(self.addr)
