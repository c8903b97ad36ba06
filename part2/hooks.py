"""hooks: the counters every object of Part two keeps, and how each of its callbacks is made.

    call_back()    how every callback of Part two is made: one that raises changes nothing
                   but its owner's callback_errors (the first is logged)
    QuietHooks     tcp_proxy's Hooks whose bumps take no lock while no one waits
    Counted        QuietHooks of an object a loop owns: bumped on the loop's thread, their
                   waiters woken once a turn
    Tallied        QuietHooks whose counters several threads bump at once (a shared cache's)
"""
import logging
import threading

from ground.server import Hooks

MANAGED_LOG = logging.getLogger("part2.managed")   # the face's name: the one a user configures

_FIRST_ERRORS = threading.Lock()   # guards every object's callback_error_logged


def call_back(owner, function, *args, otherwise=None):
    """Make one of owner's callbacks (on_event, availability). One that raises changes
    nothing but owner.callback_errors, and gives `otherwise` instead of a result; the
    first error of each owner is logged with its traceback, the rest only counted."""
    try:
        return function(*args)
    except Exception:
        with _FIRST_ERRORS:
            first = not getattr(owner, "callback_error_logged", False)
            owner.callback_error_logged = True
        if first:
            MANAGED_LOG.exception("a callback of %s raised; it changes nothing (later ones are "
                                  "only counted, in callback_errors)", type(owner).__name__)
        owner.count("callback_errors")
        return otherwise


class QuietHooks(Hooks):
    """Hooks whose bumps take no lock while no one waits: a waiter counts itself in, under
    the hook's condition, before it first looks at the counter, so a bump that finds no
    waiter came before that look (which sees it), and one that finds a waiter wakes it
    (loop.Counted, once a turn; Tallied, at once). A subclass bumps with no lock."""

    def __init__(self):
        super().__init__()
        self.waiters = 0   # threads in wait_until(); changed under the hook's condition

    def wait_until(self, ready, what, timeout=None):
        with self._changed:
            self.waiters += 1
            try:
                if not self._changed.wait_for(ready, timeout or self.hook_timeout):
                    raise TimeoutError(f"gave up waiting for {what}: {self!r}")
            finally:
                self.waiters -= 1


class Counted(QuietHooks):
    """Hooks for an object a loop owns. Its counters are plain integers, bumped on the
    loop's thread with no lock; the waiters of wait_<counter>() are woken once per turn,
    at its end, and only if there are any (see QuietHooks)."""

    def __init__(self, loop):
        super().__init__()
        self.loop = loop
        if loop is self:   # the loop itself, the first it wakes
            self.counted = []
        loop.counted.append(self)

    def count(self, name, amount=1):
        setattr(self, name, getattr(self, name) + amount)


class Tallied(QuietHooks):
    """QuietHooks whose counters several threads bump: the global cache is every set's
    parent, so every loop bumps it, and `+=` from two threads can lose a bump. Each thread
    adds to a tally of its own (one writer each); a counter reads as the sum of the tallies."""

    def __init__(self):
        super().__init__()
        for name in self.counters:   # read through __getattr__, as the sum of the tallies
            del self.__dict__[name]
        self._tallies = {}   # thread ident -> {counter: bumps}, each written by its thread alone

    def count(self, name, amount=1):
        tally = self._tallies.get(threading.get_ident())
        if tally is None:   # this thread's first bump
            tally = self._tallies[threading.get_ident()] = dict.fromkeys(self.counters, 0)
        tally[name] += amount
        if self.waiters:
            with self._changed:
                self._changed.notify_all()

    def __getattr__(self, attribute):   # only for names not found otherwise
        if attribute in type(self).counters:
            tallies = list(self._tallies.values())   # one copy: a thread may add its own meanwhile
            return self.counters[attribute] + sum(tally[attribute] for tally in tallies)
        return super().__getattr__(attribute)
