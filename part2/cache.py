"""cache: which upstreams have failed lately.

    ReliabilityCache     counts errors in a row per port; disables a port (and under a
                         host policy its host) for 1, 2, 4 ... 64 s; derive() makes a
                         cache whose errors also count in its parent
    global_rcache()      the shared one, policy "none" (it never disables) until configured

A cache may be shared by several loops and threads: a write to its entries holds its lock;
its reads (is_enabled(), asked on a pick) take none, since each reads one entry's fields,
which a write replaces whole or sets one at a time; and its counters are tallies, which
take no lock either. `steady`, true while neither it nor a parent holds an entry or asks
an availability callback, lets a pick skip is_enabled() and a reply skip record_success():
both would say what steady says.
"""
import collections
import math
import threading
import weakref

from part2.clock import RealClock
from part2.hooks import Tallied, call_back

_RESTATING = threading.Lock()   # held while any cache's steady is made again

POLICIES = ("none", "independent", "any_failing_port_disables_host")
DEFAULTS = {"policy": "none", "threshold": 1, "disable_timeout_min": 1.0,
            "disable_timeout_max": 64.0, "availability": None, "clock": None}


def check_policy(policy):
    host_port = isinstance(policy, tuple) and len(policy) == 2 \
        and policy[0] == "failing_port_disables_host" and isinstance(policy[1], int)
    if policy not in POLICIES and not host_port:
        raise ValueError(f"policy is one of {POLICIES} or "
                         f"('failing_port_disables_host', port), not {policy!r}")


class PortEntry:
    """Errors in a row for one port, and its disable window."""

    def __init__(self, first_window):
        self.errors = 0
        self.disabled_until = -math.inf   # clock time the current window ends
        self.window = first_window   # length of the next window; doubles per disable


class HostEntry:
    """A host disabled by a host policy: it has no counter or window of its own;
    it ends when the last window of its failing ports ends (Ocamlnet's rule)."""

    def __init__(self):
        self.disabled_until = -math.inf
        self.ports = set()   # the (ip, port)s whose windows disabled this host


class ReliabilityCache(Tallied):
    """Which ports (and hosts) have failed lately, and until when they are disabled.

    An entry exists only while a port keeps failing: a success deletes it. Errors
    reaching `threshold` disable the port for disable_timeout_min seconds; each
    further disable doubles the window, up to disable_timeout_max; errors while a
    window is open do not extend it. Under a host policy a port's window also
    disables its host until the latest window of the host's failing ports ends; a
    success on a port that had an entry recomputes its host from the others. A
    derived cache has its own settings (those not given are read live from its
    parent), forwards every error and success to its parent, and enables a port
    only if its parent does too. Each cache asks only its own availability callback.

    A setting given as None is inherited: read live from the parent, or for a cache
    without one the default (a RealClock for the clock). derive() passes None for
    every setting it is not given; a cache built with parent= directly owns the
    defaults of the settings it is not given, except availability and clock.
    """
    counters = {"errors": 0, "successes": 0, "disables": 0, "callback_errors": 0}
    # errors     record_error() calls; successes  record_success() calls
    # disables   windows opened; bumped by record_error() after it logs the window in `windows`
    # callback_errors  its on_event or availability raised; bumped by call_back()

    def __init__(self, policy="none", threshold=1, disable_timeout_min=1.0,
                 disable_timeout_max=64.0, availability=None, clock=None, *, parent=None,
                 on_event=None):
        super().__init__()
        self.parent, self.on_event = parent, on_event
        self._lock = threading.Lock()   # guards _entries and _hosts
        self._entries = {}              # (ip, port) -> PortEntry
        self._hosts = {}                # ip -> HostEntry, under a host policy only
        self.children = weakref.WeakSet()   # the caches derived from it: their steady reads its
        self.steady = False             # see the module's map; kept by _restate()
        if parent is not None:
            parent.children.add(self)
        # Its own settings first, then, read live, its parent's ChainMap (or the defaults): a
        # setting it does not hold is inherited. configure() swaps the own map whole.
        inherited = parent._settings if parent else {**DEFAULTS, "clock": RealClock()}
        self._settings = collections.ChainMap({}, inherited)
        self.configure(policy=policy, threshold=threshold, disable_timeout_min=disable_timeout_min,
                       disable_timeout_max=disable_timeout_max, availability=availability,
                       clock=clock)
        self.windows = collections.deque(maxlen=64)   # the latest (key, start, end, reason);
                                                      # key: an (ip, port) or an ip

    def configure(self, **config):
        """Change settings in place, for every user of this cache, at any time; None
        means inherited. A rejected change (TypeError for an unknown setting,
        ValueError for a bad value) changes nothing."""
        unknown = set(config) - set(DEFAULTS)
        if unknown:
            raise TypeError(f"unknown settings: {sorted(unknown)}")
        own = dict(self._settings.maps[0])   # checked whole before it replaces the live one
        for name, value in config.items():
            if value is None:
                own.pop(name, None)   # inherited again: the parent's, live, or the default
            else:
                own[name] = value
        changed = collections.ChainMap(own, *self._settings.maps[1:])
        check_policy(changed["policy"])
        low, high = changed["disable_timeout_min"], changed["disable_timeout_max"]
        if changed["threshold"] < 1 or not 0 < low <= high:
            raise ValueError("threshold >= 1 and 0 < disable_timeout_min <= disable_timeout_max")
        self._settings.maps[0] = own   # one assignment: no reader sees a rejected or half-made one
        self._restate()

    def _restate(self):
        """steady again, here and in every cache derived from it (after each change to its
        entries or its own availability); one lock for every cache's, so the last to run
        reads the last change."""
        with _RESTATING:
            self._restate_locked()

    def _restate_locked(self):
        own = self._entries or self._hosts or self._settings.maps[0].get("availability")
        self.steady = not own and (self.parent is None or self.parent.steady)
        for child in list(self.children):
            child._restate_locked()

    def setting(self, name):
        """A setting's value: this cache's own, else its parent's (or the default)."""
        return self._settings[name]

    @property
    def clock(self):
        return self.setting("clock")

    def derive(self, **config):
        """A cache whose errors also count here, with its own settings; those not
        given (or given as None), the clock included, are read live from this one."""
        settings = {**dict.fromkeys(DEFAULTS), **config}
        return ReliabilityCache(**settings, parent=self, on_event=self.on_event)

    def _disables_host(self, addr):
        policy = self.setting("policy")
        return policy in ("any_failing_port_disables_host", ("failing_port_disables_host", addr[1]))

    def record_error(self, addr):
        """Count an error against addr here and up the chain; on_event hears each window opened."""
        for on_event, cache, event in self.count_error(addr):
            call_back(cache, on_event, cache, event)

    def count_error(self, addr):
        """record_error() without making any callback: return the (on_event, cache, event)
        calls it owes, so that a loop makes them with the rest of its turn's callbacks."""
        self.count("errors")
        owed = []
        if self.setting("policy") != "none":
            now = self.clock.now()
            with self._lock:
                opened = self._error(addr, now)
            self._restate()
            for window in opened:
                self.windows.append(window)
                self.count("disables")
                if self.on_event:
                    owed.append((self.on_event, self, ("disabled",) + window))
        if self.parent:
            owed += self.parent.count_error(addr)
        return owed

    def _error(self, addr, now):
        """Count one error against addr; return the windows it opens (the port's, its host's)."""
        entry = self._entries.setdefault(addr, PortEntry(self.setting("disable_timeout_min")))
        entry.errors += 1
        if now < entry.disabled_until:
            return []   # already disabled: an error now does not extend the window
        if entry.errors < self.setting("threshold"):
            return []
        window = min(entry.window, self.setting("disable_timeout_max"))   # a max lowered caps it
        entry.disabled_until = now + window
        entry.window = min(window * 2, self.setting("disable_timeout_max"))
        reason = f"{entry.errors} error(s) in a row, threshold {self.setting('threshold')}"
        opened = [(addr, now, entry.disabled_until, reason)]
        if self._disables_host(addr):
            host = self._hosts.setdefault(addr[0], HostEntry())
            host.ports.add(addr)
            if entry.disabled_until > host.disabled_until:   # it ends with its last port's window
                host.disabled_until = entry.disabled_until
                opened.append((addr[0], now, host.disabled_until, "host disabled: " + reason))
        return opened

    def record_success(self, addr):
        """A reply from addr: forget its errors, here and up the chain."""
        self.count("successes")
        if addr in self._entries:   # the common case, a port with no errors, takes no lock
            with self._lock:
                if self._entries.pop(addr, None):   # Ocamlnet: its host only if it had an entry
                    self._recompute_host(addr)
            self._restate()
        if self.parent:
            self.parent.record_success(addr)

    def _recompute_host(self, addr):
        """With the lock held: the host of a port that recovered stays disabled only
        until the latest open window of its other failing ports."""
        host = self._hosts.get(addr[0])
        if host is None:
            return
        host.ports.discard(addr)
        now = self.clock.now()
        ends = [self._entries[port].disabled_until for port in host.ports if port in self._entries
                and self._entries[port].errors >= self.setting("threshold")
                and now < self._entries[port].disabled_until]
        if ends:
            host.disabled_until = max(ends)
        else:
            del self._hosts[addr[0]]

    def is_enabled(self, addr):
        """True unless this port, its host, this cache's availability callback or a parent says no.
        Asked on every pick: kept short, the chain of parents walked in one call."""
        cache = self
        while cache is not None:
            availability = cache._settings.maps[0].get("availability")
            if availability and not call_back(cache, availability, addr, otherwise=True):
                return False
            if (cache._entries or cache._hosts) and cache.clock.now() < cache.window_end(addr):
                return False
            cache = cache.parent
        return True

    def enabled_but_for_windows(self, addr):
        """is_enabled() as if this cache had opened no window: its availability callback and its
        parents' say. A set asks it of its own cache once that has disabled every service."""
        return self._available(addr) and (self.parent.is_enabled(addr) if self.parent else True)

    def window_end(self, addr):
        """When this cache's own windows over addr (its port's, its host's) end, or -inf."""
        port, host = self._entries.get(addr), self._hosts.get(addr[0])   # no lock (see the map)
        ends = [entry.disabled_until for entry in (port, host) if entry]
        return max(ends, default=-math.inf)

    def _available(self, addr):
        """What this cache's own availability callback says (a parent asks its own); one that
        raises says yes."""
        availability = self._settings.maps[0].get("availability")
        return not availability or call_back(self, availability, addr, otherwise=True)


_GLOBAL_RCACHE = ReliabilityCache()   # policy "none": it has no effect until configured


def global_rcache():
    """The cache every client uses unless it is given another."""
    return _GLOBAL_RCACHE


def set_global_rcache_config(**config):
    """Reconfigure the global cache in place; every user sees the change at once.
    An unknown setting is a TypeError and a bad value a ValueError; either changes nothing."""
    _GLOBAL_RCACHE.configure(**config)
