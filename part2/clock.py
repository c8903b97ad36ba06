"""clock: the time every deadline of Part two is read on.

    RealClock      monotonic time; a loop blocks in select() until its next deadline
    VirtualClock   time that stands still until advance(): the demo and the tests move
                   it, and every loop watching it wakes to fire what the new time passed
    check_seconds(), unlimited(), as_seconds()   timeouts as users write them

A clock offers four methods, and the loop calls all of them: now(); timeout_until(deadline),
how long a select() may block before deadline comes (None: until something wakes it);
watch(loop) and unwatch(loop), which a clock that jumps uses to wake the loops reading it.
"""
import math
import threading
import time

NEVER = threading.TIMEOUT_MAX   # a timeout this long (about 292 years) or longer, inf too, is none


class RealClock:
    """Monotonic time: a deadline comes by itself, so a loop waits for it in select()."""

    def now(self):
        return time.monotonic()

    def timeout_until(self, deadline):
        if deadline is None:
            return None
        return min(max(deadline - self.now(), 0), NEVER)

    def watch(self, loop):
        """Nothing to do: real time passes by itself."""

    unwatch = watch


class VirtualClock:
    """Time that moves only when advance() is called; then every loop watching it wakes,
    and its next turn fires the deadlines the new time has passed. No one sleeps on it."""

    def __init__(self, start=0.0):
        self._now = start
        self._guard = threading.Lock()   # guards _watched: loops join and leave from their threads
        self._watched = set()

    def now(self):
        return self._now

    def timeout_until(self, deadline):
        """0 for a deadline already passed; else None: only advance() can bring it."""
        return 0 if deadline is not None and deadline <= self._now else None

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
    """A timeout a user wrote: a number, and not NaN (negative, inf or NEVER and more mean none)."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or math.isnan(seconds):
        raise ValueError(f"{name} is a number of seconds (negative or inf: none), not {seconds!r}")


def unlimited(seconds):
    """True for a timeout that is none: negative, inf, or too long for any wait to take."""
    return seconds < 0 or seconds >= NEVER


def as_seconds(value):
    """A configured time as messages show it: 1.0s, 0.05s."""
    return f"{float(value)}s"
