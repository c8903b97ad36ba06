"""clock: the time every deadline of Part two is read on.

    RealClock      monotonic time: it passes by itself, so a loop waits for its next
                   deadline in select()
    VirtualClock   time that stands still until advance(): the demo and the tests move
                   it, and every loop watching it wakes to fire what the new time passed
    check_seconds(), unlimited(), as_seconds()   timeouts as users write them

A clock offers now(); `passes`, true for time that moves by itself (a loop then waits in
select() until its next deadline; false: until something wakes it); and watch(loop) and
unwatch(loop), which a clock that jumps uses to wake the loops reading it.
"""
import math
import threading
import time

LONGEST_WAIT = threading.TIMEOUT_MAX   # a timeout this long (about 292 years) or more is none


class RealClock:
    """Monotonic time: a deadline comes by itself, so a loop waits for it in select()."""
    passes = True
    now = staticmethod(time.monotonic)   # read in C: the time costs no Python call

    def watch(self, loop):
        """Nothing to do: real time passes by itself."""

    unwatch = watch


class VirtualClock:
    """Time that moves only when advance() is called; then every loop watching it wakes,
    and its next turn fires the deadlines the new time has passed. No one sleeps on it."""
    passes = False

    def __init__(self, start=0.0):
        self._now = start
        self._guard = threading.Lock()   # guards _watched: loops join and leave from their threads
        self._watched = set()

    def now(self):
        return self._now

    def watch(self, loop):
        with self._guard:
            self._watched.add(loop)

    def unwatch(self, loop):
        with self._guard:
            self._watched.discard(loop)

    def advance(self, seconds):
        """Move time forward; wake every loop watching this clock."""
        if not 0 <= seconds < math.inf:   # NaN fails both comparisons
            raise ValueError(f"time only moves forward, by a finite number of seconds, "
                             f"not by {seconds}")
        self._now += seconds
        with self._guard:
            watching = list(self._watched)
        for loop in watching:
            loop.wake()


def check_seconds(name, seconds):
    """A timeout a user wrote: a number, and not NaN (negative, inf, or LONGEST_WAIT and more
    mean none)."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or math.isnan(seconds):
        raise ValueError(f"{name} is a number of seconds (negative or inf: none), not {seconds!r}")


def unlimited(seconds):
    """True for a timeout that is none: negative, inf, or too long for any wait to take."""
    return seconds < 0 or seconds >= LONGEST_WAIT


def as_seconds(value):
    """A configured time as messages show it: 1.0s, 0.05s."""
    return f"{float(value)}s"
