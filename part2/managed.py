"""managed: the reliability layer a production pool adds, after Ocamlnet's Rpc_proxy.

tcp_proxy.py ends with a pool that parses. This module keeps that lesson (a reply
ends where its framing says, and only then is the connection free) and adds what
the toy leaves out: reconnecting, health checks, disabling a failing upstream for
a while, failover, back-pressure, timeouts and retries, over the same line
protocol, or over any framing FramedProxy takes (framing=resp.RESP: Redis).

Map of the module, in reading order:

    RealClock, VirtualClock   every timer reads one of these; the virtual one moves
                              only when advance() is called, so timed behaviour is
                              demonstrated and tested without sleeping. A clock of
                              your own needs all five methods the code calls:
                              now(), sleep(seconds), wait(condition, deadline),
                              watch(condition) and unwatch(condition)
    ManagedError and its five subclasses, the failures a caller can see
    call_back(), CallbackLock how every callback is made (one that raises is counted);
                              a lock whose callbacks wait until it is let go
    ReliabilityCache          counts errors per port; disables a port (and under a
                              host policy its host) for 1, 2, 4 ... 64 s;
                              global_rcache() is the shared one, policy "none"
    Call, OwedCalls           one request and its deadline; the calls a connection
                              owes, oldest first (no lock, socket or thread)
    Connection                one socket, its OwedCalls, writing under a deadline,
                              the idle deadline the watchdog keeps
    ConnectionThreads         a client's reader and watchdog threads, split out of it
    ManagedClient             one upstream connection at a time, remade on demand;
                              states down -> connecting -> up; several calls may be
                              pending on it, their replies matched in order
    ManagedSet                clients over several services: pick(), call(),
                              idempotent_call() with retries
    ManagedProxy              FramedProxy's client loop, its exchange() done by a ManagedSet;
                              framing= (tcp_proxy.LINES, or resp.RESP) reaches every client

Threads: each connection has a reader thread, and a watchdog thread when it has a
deadline to keep (idle_timeout > 0, or msg_timeout >= 0 and not fatal); shut_down()
ends and joins them. Callers block in call() on the client's condition, which the
clock wakes at their deadline. Callbacks (on_event, availability) are never called
with a lock held: a client queues them and calls them once it lets go of its lock.
A callback that raises changes nothing but a counter, callback_errors, of the object
whose callback it is; the first is logged, with its traceback; the rest still run.

Defaults, as Ocamlnet's unless marked: a ManagedClient has no msg_timeout, no
idle_timeout, no ping and the global cache (policy "none": never disables); a
timeout of inf (or of NEVER seconds and more) is none, as a negative one is, and NaN
is a ValueError. A ManagedSet (so a ManagedProxy) has no limit on pending calls (it
pipelines once its connections are busy) and idempotent_max 3. Beyond Ocamlnet,
chosen so that a one-service ManagedProxy answers as its user would expect:
  - given no rcache, a cache of its own, derived from the global one with policy
    "independent", so it fails over out of the box; and that cache never refuses
    every service (Envoy's "panic"): with all disabled, a call tries the one whose
    window ends first, so one service is never refused because of its own errors
  - a retry goes first, and at once, to a service this call has not tried; a request
    that never left (a refused connect) with every enabled service tried fails at
    once: against a port nobody listens on, the ERR comes in a millisecond, where
    Ocamlnet's rule (wait 5 s, connect again, twice) gave it after 10 s
  - idempotent_wait 1 s (Ocamlnet: 5 s), only before a service is tried again: the
    length of the first disable window, so the retry comes as the window ends, and a
    client waits about a second, not five, for the retry of a lost request

Out of step: the line protocol has no request ids, so a reply is matched to the
oldest call owed; a reply that cannot answer that call (framing.fits), bytes the
framing cannot read or longer than its max_reply, or a reply when no call is owed,
prove the connection out of step, and it is ended: every call owed on it gets
MessageLost, never another call's reply.

Where this differs from Ocamlnet, on purpose (each pinned by a test):
  - a timed-out call's reply is still owed (no request ids to drop it by), so the
    call counts as pending until its reply comes; msg_timeout later, or past
    ABANDONED_MAX abandoned calls, the connection ends with one error
  - a set given no cache fails over (above); a retry that has an enabled service
    not yet tried goes there at once, where Ocamlnet waits idempotent_wait before
    every retry and picks in the same order again
  - host policies disable a loopback host too (Ocamlnet never disables 127.0.0.1),
    since every upstream here is on loopback
  - a recovered port's host stays disabled until the latest open window of its
    other failing ports; Ocamlnet's fold gives up on the host when it meets an
    expired window first, which depends on its hash table's order
  - at or above pending_calls_norm, pick() takes the least busy client below the
    max; Ocamlnet takes whichever load level its hash table lists first
  - pick() asks the cache about every service before it chooses (no lock held),
    where Ocamlnet asks service by service until one gives a client

The faults the scenarios need (an upstream that stops, restarts on the same port,
drops, cuts, skips or doubles a reply, never answers, closes at once or never reads)
are scaffolding, in scaffolding/faults.py (FaultyUpstream).

The order a request takes through ManagedProxy:
    client line -> FramedProxy.handle() -> exchange() -> ManagedSet.call(): pick()
    -> ManagedClient.call(): one deadline -> usable connection (connect, initial ping)
    -> send (wait for the write turn, write) -> the reader thread matches the reply
    to the oldest call owed, if it fits -> back to the client
"""
import collections
import contextlib
import logging
import math
import select
import socket
import threading
import time

from tcp_proxy import LINES, FramedProxy, Hooks, Server, recv, shutdown

LOG = logging.getLogger(__name__)


# --- time --------------------------------------------------------------------

class RealClock:
    """Monotonic time; waits are real.

    The interface every clock offers, and all of it is used:
      now()                        the time, in seconds
      sleep(seconds)               block until now() has moved on by seconds
      wait(condition, deadline)    with `condition` held: block until it is notified
                                   or now() reaches deadline (None: no limit)
      watch(condition)             from now on, notify `condition` whenever time jumps
      unwatch(condition)           stop doing so (a client or set that shuts down)
    """

    def now(self):
        return time.monotonic()

    def sleep(self, seconds):
        time.sleep(max(seconds, 0))

    def wait(self, condition, deadline):
        """Wait on a held condition until notified or until deadline (None: no limit)."""
        if deadline is None:
            condition.wait()
        else:   # a far deadline waits as long as a lock can (threading raises OverflowError beyond)
            condition.wait(min(max(deadline - self.now(), 0), threading.TIMEOUT_MAX))

    def watch(self, condition):
        """Nothing to do: real time passes by itself."""

    unwatch = watch


class VirtualClock(Hooks):
    """Time that stands still until advance(); then every sleeper and every watched
    condition is woken to look at the new time. The same five methods as RealClock
    (now, sleep, wait, watch, unwatch), and advance(seconds)."""
    counters = {"sleepers": 0}
    # sleepers  sleep() calls entered; bumped before the sleeper blocks

    def __init__(self, start=0.0):
        super().__init__()
        self._now = start
        self._tick = threading.Condition()   # guards _now and _watched; sleepers wait on it
        self._watched = set()                # conditions of objects that wait for deadlines

    def now(self):
        return self._now

    def sleep(self, seconds):
        with self._tick:
            deadline = self._now + seconds
            self.count("sleepers")
            while self._now < deadline:
                self._tick.wait()

    def wait(self, condition, deadline):
        # The caller checked its deadline while holding `condition`; advance() moves
        # the time before it takes `condition` to notify, so no wake-up is lost.
        condition.wait()

    def watch(self, condition):
        with self._tick:
            self._watched.add(condition)

    def unwatch(self, condition):
        with self._tick:
            self._watched.discard(condition)

    def advance(self, seconds):
        """Move time forward; wake every sleeper and every watched condition."""
        if not 0 <= seconds < math.inf:   # NaN fails both comparisons
            raise ValueError(f"time only moves forward, by a finite number of seconds, not by {seconds}")
        with self._tick:
            self._now += seconds
            self._tick.notify_all()
            watched = list(self._watched)
        for condition in watched:
            with condition:
                condition.notify_all()


def as_seconds(value):
    """A configured time as messages show it: 1.0s, 0.05s."""
    return f"{float(value)}s"


# --- the failures a caller sees ----------------------------------------------

class ManagedError(Exception):
    """Any failure of the managed layer; its message never names an address."""


class MessageLost(ManagedError):
    """The request may have reached the upstream, but its reply never came."""


class MessageTimeout(ManagedError):
    """No reply within msg_timeout (or no answer to the initial ping)."""


class CommunicationError(ManagedError):
    """Could not connect: the request was never sent."""


class ServiceUnavailable(ManagedError):
    """The reliability cache has disabled this port: the request was never sent."""


class ClusterServiceUnavailable(ManagedError):
    """No service of a set has a client to spare: the request was never sent."""


# --- callbacks ----------------------------------------------------------------

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
            LOG.exception("a callback of %s raised; it changes nothing (later ones are only counted, "
                          "in callback_errors)", type(owner).__name__)
        owner.count("callback_errors")
        return otherwise


class CallbackLock:
    """A lock (a condition, notified on every change) and the callbacks queued while
    it is held. They are made once it is let go, by the thread that lets it go
    through held(), never under it: a callback may call anything, the object whose
    lock it is included. A ManagedClient's lock is one."""

    def __init__(self):
        self.condition = threading.Condition()
        self._queued = []   # (owner, function, args), appended with the condition held

    def queue(self, owner, function, *args):
        """With the condition held: make owner's callback function(*args) once it is let go."""
        self._queued.append((owner, function, args))

    @contextlib.contextmanager
    def held(self):
        """Hold the condition; once it is let go, make every callback queued meanwhile."""
        try:
            with self.condition:
                yield
        finally:
            self.make_queued()

    def make_queued(self):
        """Make the callbacks queued so far, oldest first, each whatever the one before it did."""
        with self.condition:
            queued, self._queued = self._queued, []
        for owner, function, args in queued:
            call_back(owner, function, *args)


# --- the reliability cache ---------------------------------------------------

POLICIES = ("none", "independent", "any_failing_port_disables_host")
DEFAULTS = {"policy": "none", "threshold": 1, "disable_timeout_min": 1.0,
            "disable_timeout_max": 64.0, "availability": None, "clock": None}


def check_policy(policy):
    host_port = isinstance(policy, tuple) and len(policy) == 2 \
        and policy[0] == "failing_port_disables_host" and isinstance(policy[1], int)
    if policy not in POLICIES and not host_port:
        raise ValueError(f"policy is one of {POLICIES} or "
                         f"('failing_port_disables_host', port), not {policy!r}")


class Entry:
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


class ReliabilityCache(Hooks):
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
    # callback_errors  its on_event or availability raised; bumped by call_back(), for tests to wait on

    def __init__(self, policy="none", threshold=1, disable_timeout_min=1.0, disable_timeout_max=64.0,
                 availability=None, clock=None, *, parent=None, on_event=None):
        super().__init__()
        self.parent, self.on_event = parent, on_event
        # Its own settings first, then, read live, its parent's ChainMap (or the defaults): a setting
        # it does not hold is inherited. configure() swaps the own map whole, never edits it.
        self._settings = collections.ChainMap({}, parent._settings if parent else {**DEFAULTS, "clock": RealClock()})
        self.configure(policy=policy, threshold=threshold, disable_timeout_min=disable_timeout_min,
                       disable_timeout_max=disable_timeout_max, availability=availability, clock=clock)
        self._lock = threading.Lock()   # guards _entries and _hosts
        self._entries = {}              # (ip, port) -> Entry
        self._hosts = {}                # ip -> HostEntry, under a host policy only
        self.windows = collections.deque(maxlen=64)   # the latest (key, start, end, reason) windows;
                                                      # key is an (ip, port) or an ip

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
        if changed["threshold"] < 1 or not 0 < changed["disable_timeout_min"] <= changed["disable_timeout_max"]:
            raise ValueError("threshold >= 1 and 0 < disable_timeout_min <= disable_timeout_max")
        self._settings.maps[0] = own   # one assignment: no reader sees a rejected or half-made config

    def setting(self, name):
        """A setting's value: this cache's own, else its parent's (or the default)."""
        return self._settings[name]

    @property
    def clock(self):
        return self.setting("clock")

    def derive(self, **config):
        """A cache whose errors also count here, with its own settings; those not
        given (or given as None), the clock included, are read live from this one."""
        return ReliabilityCache(**{**dict.fromkeys(DEFAULTS), **config}, parent=self, on_event=self.on_event)

    def _disables_host(self, addr):
        policy = self.setting("policy")
        return policy == "any_failing_port_disables_host" or policy == ("failing_port_disables_host", addr[1])

    def record_error(self, addr):
        """Count an error against addr here and up the chain; call on_event for each window opened."""
        for on_event, cache, event in self.count_error(addr):
            call_back(cache, on_event, cache, event)

    def count_error(self, addr):
        """record_error() without making any callback: return the (on_event, cache, event)
        calls it owes, so a caller holding a lock can make them once it has let go."""
        self.count("errors")
        owed = []
        if self.setting("policy") != "none":
            now = self.clock.now()
            with self._lock:
                opened = self._error(addr, now)
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
        entry = self._entries.setdefault(addr, Entry(self.setting("disable_timeout_min")))
        entry.errors += 1
        if now < entry.disabled_until:
            return []   # already disabled: an error now does not extend the window
        if entry.errors < self.setting("threshold"):
            return []
        window = min(entry.window, self.setting("disable_timeout_max"))   # a max lowered since still caps it
        entry.disabled_until = now + window
        entry.window = min(window * 2, self.setting("disable_timeout_max"))
        reason = f"{entry.errors} error(s) in a row, threshold {self.setting('threshold')}"
        opened = [(addr, now, entry.disabled_until, reason)]
        if self._disables_host(addr):
            host = self._hosts.setdefault(addr[0], HostEntry())
            host.ports.add(addr)
            if entry.disabled_until > host.disabled_until:   # the host ends with its last port's window
                host.disabled_until = entry.disabled_until
                opened.append((addr[0], now, host.disabled_until, "host disabled: " + reason))
        return opened

    def record_success(self, addr):
        """A reply from addr: forget its errors, here and up the chain."""
        self.count("successes")
        with self._lock:
            if self._entries.pop(addr, None):   # Ocamlnet touches the host only if the port had an entry
                self._recompute_host(addr)
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
        """True unless this port, its host, this cache's availability callback or a parent says no."""
        if not self._available(addr):
            return False
        if self.clock.now() < self.window_end(addr):
            return False
        return self.parent.is_enabled(addr) if self.parent else True

    def enabled_but_for_windows(self, addr):
        """is_enabled() as if this cache had opened no window: its availability callback and its parents'
        say. A set asks it of the cache it made itself once that cache has disabled every service."""
        return self._available(addr) and (self.parent.is_enabled(addr) if self.parent else True)

    def window_end(self, addr):
        """The clock time this cache's own windows over addr (its port's, its host's) end; -inf if none."""
        with self._lock:
            port, host = self._entries.get(addr), self._hosts.get(addr[0])
            return max(port.disabled_until if port else -math.inf, host.disabled_until if host else -math.inf)

    def _available(self, addr):
        """What this cache's own availability callback says (a parent asks its own); one that raises says yes."""
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


# --- the managed client ------------------------------------------------------

ABANDONED_MAX = 64       # abandoned calls one connection may owe; one more ends it (a memory bound)
TRANSITIONS_KEPT = 64    # entries of a client's transition_log; older ones are dropped
SEND_RECHECK = 0.05      # real seconds a blocked write waits before it reads the clock again
NEVER = threading.TIMEOUT_MAX   # a timeout of this many seconds (about 292 years) or more, inf included, is none
PING = b"PING\n"         # the initial ping: a request of the toy protocol, and an inline command to Redis


def fresh(error):
    """A new exception like `error`: one instance must not be raised in two threads."""
    return type(error)(*error.args)


def check_request(request, framing=LINES):
    """A request is bytes holding exactly one whole request, as the framing's request_size()
    reads it (as FramedProxy.handle() reads them): never a part of one, never two."""
    if isinstance(request, bytes):
        with contextlib.suppress(ValueError):
            if framing.request_size(request) == len(request):
                return
    raise ValueError(f"a request is one whole request of bytes (for LINES, one line ending in b'\\n'), "
                     f"not {request!r:.60}")


def reason_of(error):
    """An exception's reason, as a transition or an error message gives it."""
    return (error.strerror if isinstance(error, OSError) else None) or str(error) or type(error).__name__


def check_seconds(name, seconds):
    """A timeout a user wrote: a number, and not NaN (negative, inf or NEVER and more mean none)."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or math.isnan(seconds):
        raise ValueError(f"{name} is a number of seconds (negative or inf: none), not {seconds!r}")


def unlimited(seconds):
    """True for a timeout that is none: negative, inf, or too long for any wait to take."""
    return seconds < 0 or seconds >= NEVER


def check_addr(addr):
    """An upstream's address: (host, port), or IPv6's (host, port, flowinfo, scope_id), as .addr gives it."""
    fields_ok = isinstance(addr, tuple) and len(addr) in (2, 4) and isinstance(addr[0], str) and addr[0] \
        and all(isinstance(field, int) and not isinstance(field, bool) for field in addr[1:])
    if not fields_ok or not 0 < addr[1] < 65536:
        raise ValueError(f"an address is (host, port) or (host, port, flowinfo, scope_id), "
                         f"a port from 1 to 65535, not {addr!r}")


def peer_has_closed(sock):
    """True if the upstream's EOF is already waiting on this socket."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


class Call:
    """One request in progress, its deadline, and how it ended."""

    def __init__(self, request, deadline, is_ping=False):
        self.request = request   # whole (never cut short: fits() judges a reply by all of it)
        self.deadline, self.is_ping = deadline, is_ping
        self.reply = None        # the reply line, once it has arrived
        self.error = None        # the ManagedError that ended it instead
        self.abandoned = False   # timed out, not fatally: its reply is still owed and discarded
        self.overdue_at = None   # for an abandoned call: when its missing reply ends the connection

    def expired(self, clock):
        return self.deadline is not None and clock.now() >= self.deadline

    def time_left(self, clock):
        """Seconds to the deadline on `clock`, at least a millisecond; None for no deadline."""
        return None if self.deadline is None else max(self.deadline - clock.now(), 0.001)


class OwedCalls:
    """The calls one connection owes replies to, oldest first: the order their
    requests were written in. A plain sequence, with no lock, socket or thread (the
    client's lock guards it), so its rules are tested on their own.

    The line protocol has no request ids: a reply can settle only the oldest call
    owed. So an abandoned call (timed out, not fatally) keeps its place until its
    reply comes, to be thrown away rather than given to the call behind it, and a
    connection that owes abandoned calls has deadlines of its own."""

    def __init__(self):
        self._calls = collections.deque()

    def __len__(self):
        return len(self._calls)

    def __iter__(self):
        return iter(self._calls)

    def __getitem__(self, index):
        return self._calls[index]

    def append(self, call):
        """A request is about to be written: its reply comes after every reply owed now."""
        self._calls.append(call)

    def popleft(self):
        """The oldest call, which the reply just framed settles."""
        return self._calls.popleft()

    def remove(self, call):
        """Forget a call, so its reply goes to the call behind it: the bug scenario 1 shows."""
        self._calls.remove(call)

    def abandoned(self):
        """How many owed calls nobody waits for: their replies are still coming."""
        return sum(call.abandoned for call in self._calls)

    def waited_for(self):
        """How many owed calls a caller still waits for."""
        return len(self._calls) - self.abandoned()

    def overdue_deadline(self):
        """When the oldest missing reply of an abandoned call ends the connection; None if none is abandoned."""
        return min((call.overdue_at for call in self._calls if call.abandoned), default=None)


class Connection:
    """One socket of a ManagedClient and the calls whose replies it owes (OwedCalls).

    It does the wire's work, which needs nothing of the client but its clock:
    writing under a deadline, closing the socket once nothing uses it, and telling
    the watchdog its next deadline. The client's lock guards every field; write()
    alone runs without it, and only one writer at a time (`writing`)."""

    def __init__(self):
        self.sock = None             # set once connected
        self.owed = OwedCalls()
        self.answered = False        # a reply (the ping's too) has come: an EOF may now be quiet
        self.writing = False         # a request is being written; the next writer waits its turn
        self.reading = False         # the reader thread runs; it closes the socket when done
        self.failure = None          # the error that ended it, if an error did
        self.ended = False
        self.idle_since = None       # clock time the last reply left nothing owed

    def write(self, request, deadline, clock):
        """Write all of request, never blocking past deadline on clock; False if the
        deadline came first. An OSError means the connection is broken."""
        unsent = memoryview(request)
        while unsent:
            if deadline is not None and clock.now() >= deadline:
                return False
            try:
                unsent = unsent[self.sock.send(unsent, socket.MSG_DONTWAIT):]
            except BlockingIOError:   # the upstream is not reading: wait for room, reading the clock again
                wait = SEND_RECHECK if deadline is None else min(max(deadline - clock.now(), 0), SEND_RECHECK)
                poller = select.poll()   # not select(): that fails on descriptors above 1023
                poller.register(self.sock, select.POLLOUT)
                poller.poll(wait * 1000)
        return True

    def close_if_unused(self):
        """Close an ended connection's socket once neither the reader thread nor a
        writer uses it (a descriptor closed under a thread may be reused by another socket)."""
        if self.ended and not self.reading and not self.writing and self.sock:
            self.sock.close()

    def idle_deadline(self, idle_timeout):
        """When the watchdog closes it for idleness: None while calls are owed, or with
        idle_timeout <= 0 or unlimited."""
        if idle_timeout <= 0 or unlimited(idle_timeout) or self.owed or self.idle_since is None:
            return None
        return self.idle_since + idle_timeout


class ConnectionThreads(Hooks):
    """The two threads a ManagedClient runs beside its callers, per connection: the
    reader, which settles calls with replies, and the watchdog, which keeps the
    connection's own deadlines. Split out to be read on their own; they work on
    the client's fields (see ManagedClient.__init__) under its lock, and end a
    connection only through its _end()."""

    # -- the reader thread --

    def _read_replies(self, connection):
        """The reader thread: each reply, framed by the client's framing, settles the oldest call owed."""
        buffer = bytearray()   # bytes read and not yet delivered: part of one reply, at most max_reply
        out_of_step = None     # why the bytes cannot be replies, if they cannot
        while True:
            try:
                size = self.framing.reply_size(buffer)
            except ValueError as error:   # bytes no reply starts with
                out_of_step = f"a reply {self.framing!r} cannot frame ({error})"
                break
            if size is not None:
                reply = bytes(buffer[:size])
                del buffer[:size]
                with self._lock:   # not _locked(): a callback that calls here would wait on this very thread
                    oldest = connection.owed[0] if connection.owed and not connection.ended else None
                    self._deliver(connection, reply)
                    self._tell("reply", connection, reply, oldest)
                continue
            if len(buffer) > self.framing.max_reply:   # FramedProxy.read_reply()'s bound, checked the same way
                out_of_step = f"a reply longer than {self.framing.max_reply} bytes"
                break
            if not (data := recv(connection.sock)):
                break
            buffer += data
        self._reader_finished(connection, out_of_step)

    def _reader_finished(self, connection, out_of_step):
        """The reader thread's last step: its stream has ended, or said what no reply says."""
        with self._locked():
            if out_of_step:
                self._end(connection, f"upstream out of step: {out_of_step}",
                          MessageLost(f"upstream out of step: {out_of_step}"))
            else:
                self._stream_ended(connection, "upstream closed the connection")
            connection.reading = False
            connection.close_if_unused()

    def _deliver(self, connection, reply):
        if connection.ended:
            return
        if not connection.owed:
            self._end(connection, "a reply no call was waiting for", MessageLost("unexpected reply"))
            return
        call = connection.owed[0]
        if self.late_replies != "forget" and not self.framing.fits(call.request, reply):
            self._end(connection, "a reply that does not fit its request",
                      MessageLost("upstream out of step: a reply did not fit its request"))
            return
        connection.owed.popleft()   # the load-bearing line: a reply settles the oldest call owed
        connection.answered = True
        if call.abandoned:
            self._calls.discard(call)
            self.count("discarded")
        elif call.is_ping:
            self._move("up", "initial ping answered")
        else:
            call.reply = reply
            self.count("replies")
        self.rcache.record_success(self.addr)   # a reply is the proof of health, not a connect
        if not connection.owed:
            connection.idle_since = self.clock.now()
            if self.idle_timeout == 0 and not call.is_ping:
                self._end(connection, "idle: closed after the last reply (idle_timeout 0)")
        self._lock.notify_all()

    def _stream_ended(self, connection, problem):
        """With the lock held: the upstream's EOF. Quiet only if the connection has
        carried a reply and owes no call anyone still waits for."""
        waited_for = connection.owed.waited_for()
        if waited_for:
            self._end(connection, f"{problem} with {waited_for} call(s) owed", MessageLost(problem))
        elif not connection.answered:
            self._end(connection, f"{problem} before any reply",
                      CommunicationError(f"{problem} before any reply"))
        else:   # Ocamlnet forgets a timed-out call: its reply, never come, is no error
            self._end(connection, "upstream closed the idle connection")

    # -- the watchdog thread --

    def _watch(self, connection):
        """The watchdog thread, on the client's clock, with no call needed: ends the
        connection once it has been idle for idle_timeout, or once an abandoned
        call's reply is overdue (one error, every call owed on it lost)."""
        with self._locked():
            while not connection.ended:
                idle_end = connection.idle_deadline(self.idle_timeout) if self.state == "up" else None
                overdue = connection.owed.overdue_deadline()
                if idle_end is not None and self.clock.now() >= idle_end:
                    self._end(connection, f"idle for {as_seconds(self.idle_timeout)}")
                elif overdue is not None and self.clock.now() >= overdue:
                    self._end(connection, "an abandoned call's reply is overdue",
                              MessageLost("a timed-out call's reply never came"))
                else:
                    deadlines = [deadline for deadline in (idle_end, overdue) if deadline is not None]
                    self.clock.wait(self._lock, min(deadlines, default=None))


class ManagedClient(ConnectionThreads):
    """One connection to one upstream at a time, made when a call needs it.

    A call on a down client connects; with initial_ping the new connection must
    answer PING before any request is sent, and calls wait in "connecting". An
    error takes the client down, counts once per connection, fails every call
    owed on it, and is never retried here. An EOF while nothing is owed, on a
    connection that has carried a reply, takes it down quietly (the upstream closed
    an idle connection) and the next call reconnects; on a connection that never
    carried a reply it is an error. idle_timeout: < 0 never, 0 right after the last
    reply, > 0 seconds with nothing owed.

    msg_timeout is one deadline per call, from its start: connecting, the initial
    ping, waiting for a turn to write, writing, every reconnect and the reply. It
    ends the connection only if msg_timeout_is_fatal (the other calls owed on it get
    MessageLost); else the call is abandoned: its reply is still owed, discarded on
    arrival, and counts as pending; if it has not come msg_timeout later, or more
    than ABANDONED_MAX are owed, the connection ends with one error. Replies are
    framed by `framing` (tcp_proxy.LINES, resp.RESP: reply_size(), fits(),
    max_reply); a reply that does not fit its request, bytes it cannot frame, or a
    reply nobody asked for end the connection (out of step): every call owed on it
    gets MessageLost, none another call's reply. A request is kept whole, however
    long: the fit check needs all of it.

    Callbacks (on_event, the cache's availability and on_event) are called with no
    lock held, so they may call anything, this client included: by the thread that
    queued them, or, for those the reader thread queues while its connection lives,
    by the next thread to let go of the lock (a caller it woke), never by the
    reader, whose connection a callback's call() may need. One that raises changes
    nothing but callback_errors. on_event(client, event) hears ("transition", before,
    after, reason), and, laid out as _tell() says, "sent" (the request), "timed out"
    (the call's request) and "reply" (the reply, the oldest call owed when it came):
    the seam pictures/ draws Part two through.

    Scaffolding: late_replies="forget" drops a timed-out call from the queue and
    trusts the next reply without checking it: the bug demo scenario 1 shows.

    Why one class of over 350 lines: its state machine, its calls' deadlines and
    the write turn change the same fields in one critical section, under one lock;
    what needs no lock of its own lives apart (OwedCalls, Connection, CallbackLock),
    and so do its two threads (ConnectionThreads).
    """
    counters = {"transitions": 0, "calls": 0, "connects": 0, "sent": 0, "written": 0, "replies": 0,
                "discarded": 0, "errors": 0, "waiting": 0, "callback_errors": 0}
    # transitions  state changes; bumped by _move(), which logs each in transition_log
    # calls        calls begun; bumped by call() once its deadline is set
    # connects     sockets connected; bumped by _open()
    # sent         requests queued to write, pings included; bumped by _send()
    # written      requests written in full; bumped by _send() after the write returns
    # replies      replies handed to callers; bumped by the reader thread
    # discarded    late replies of abandoned calls thrown away; bumped by the reader thread
    # errors       failed connections (not failed calls); bumped by _end()
    # waiting      calls that found another call's connect under way; bumped as _await_connecting() begins
    # callback_errors  its on_event raised; bumped by call_back(), for tests to wait on

    def __init__(self, addr, *, rcache=None, initial_ping=False, idle_timeout=-1.0, msg_timeout=-1.0,
                 msg_timeout_is_fatal=False, clock=None, on_event=None, late_replies="discard", framing=LINES):
        if late_replies not in ("discard", "forget"):
            raise ValueError(f"late_replies is 'discard' or 'forget', not {late_replies!r}")
        check_addr(addr)
        check_seconds("msg_timeout", msg_timeout)
        check_seconds("idle_timeout", idle_timeout)
        super().__init__()
        self.addr, self.framing = addr, framing
        self.rcache = rcache or global_rcache()
        self.initial_ping, self.idle_timeout = initial_ping, idle_timeout
        self.msg_timeout, self.msg_timeout_is_fatal = msg_timeout, msg_timeout_is_fatal
        self.clock, self.on_event, self.late_replies = clock or RealClock(), on_event, late_replies
        self.state = "down"
        self.connection = None      # the Connection of states connecting and up
        self.reserved = 0           # picks by a ManagedSet whose call has not started
        self.reserved_despite_cache = 0   # those of them a set made with every service disabled (see reserve())
        self.transition_log = collections.deque(maxlen=TRANSITIONS_KEPT)   # (from, to, reason), newest last
        self._calls = set()         # Calls begun and not settled (abandoned ones until their reply)
        self._threads = []
        self._shut = False
        self._guard = CallbackLock()
        self._lock = self._guard.condition   # guards all the above; notified on every change
        self.clock.watch(self._lock)

    @property
    def pending_calls(self):
        with self._lock:
            return len(self._calls) + self.reserved

    def reserve(self, despite_cache=False):
        """Count a pick as a pending call until a call() ends it. despite_cache: that call
        does not ask the cache first (its set's own cache has disabled every service)."""
        with self._lock:
            self.reserved += 1
            self.reserved_despite_cache += despite_cache

    def release(self):
        """Give back a pick's reservation without calling (call() ends one by itself)."""
        with self._lock:
            self._end_reservation()

    def _end_reservation(self):
        """With the lock held: one reservation fewer; True if it was made despite the cache."""
        self.reserved = max(self.reserved - 1, 0)
        despite = self.reserved_despite_cache > 0
        self.reserved_despite_cache = max(self.reserved_despite_cache - 1, 0)
        return despite

    # -- the lock and the callbacks --

    def _locked(self):
        """Hold the lock; once it is let go, make the callbacks queued meanwhile."""
        return self._guard.held()

    def _move(self, state, reason):
        transition = (self.state, state, reason)
        self.state = state
        self._lock.notify_all()
        self.transition_log.append(transition)
        self.count("transitions")
        if self.on_event:
            self._guard.queue(self, self.on_event, self, ("transition",) + transition)

    def _tell(self, kind, connection, *details):
        """With the lock held: queue on_event's (kind, clock time, connection, the (request,
        abandoned) of each call it owes now, whether it has ended, *details)."""
        if self.on_event:
            owed = tuple((call.request, call.abandoned) for call in connection.owed)
            event = (kind, self.clock.now(), connection, owed, connection.ended) + details
            self._guard.queue(self, self.on_event, self, event)

    def _record_error(self):
        """With the lock held: count the error in the cache now, its events later."""
        for on_event, cache, event in self.rcache.count_error(self.addr):
            self._guard.queue(cache, on_event, cache, event)

    # -- a call --

    def call(self, request):
        """Send one request and return its reply, or raise a ManagedError."""
        deadline = None if unlimited(self.msg_timeout) else self.clock.now() + self.msg_timeout
        with self._lock:
            despite_cache = self._end_reservation()   # first: even a rejected request ends its pick
            check_request(request, self.framing)
            call = Call(request, deadline)
            self._calls.add(call)
        self.count("calls")
        try:
            connection = self._usable_connection(call, despite_cache)
            while not self._send(connection, call, request):   # it closed, idle, just now
                connection = self._usable_connection(call, despite_cache)
            with self._locked():
                return self._await(connection, call)
        finally:
            with self._lock:
                if not call.abandoned:
                    self._calls.discard(call)

    def _await(self, connection, call):
        """With the lock held: the call's reply, once the reader thread delivers it."""
        while call.reply is None and call.error is None:
            if call.expired(self.clock):
                self._time_out(connection, call)
            else:
                self.clock.wait(self._lock, call.deadline)
        if call.error:
            raise fresh(call.error)
        return call.reply

    def _time_out(self, connection, call):
        timeout = MessageTimeout(f"no reply within {as_seconds(self.msg_timeout)}")
        if self.msg_timeout_is_fatal:   # Ocamlnet: the other calls on it are lost, not timed out
            self._end(connection, "message timeout (fatal)",
                      MessageLost("another call's fatal message timeout closed the connection"))
        elif self.late_replies == "forget":   # scaffolding: the bug, as a real code path
            connection.owed.remove(call)
        else:   # the reply is still owed: it is discarded on arrival, and keeps the client busy
            call.abandoned = True
            call.overdue_at = self.clock.now() + self.msg_timeout
            if connection.owed.abandoned() > ABANDONED_MAX:
                self._end(connection, f"more than {ABANDONED_MAX} abandoned calls owed",
                          MessageLost("too many replies overdue on the connection"))
            self._lock.notify_all()   # the watchdog has a new deadline to keep
        self._tell("timed out", connection, call.request)
        raise timeout

    # -- the state machine: down -> connecting -> up --

    def _usable_connection(self, call, despite_cache=False):
        """The up connection, after connecting (and pinging) if the client is down;
        MessageTimeout once the call's deadline has passed."""
        opened = None   # the connection this call made, if it made one
        while True:
            # no lock held: the availability callback may call anything
            if not despite_cache and not self.rcache.is_enabled(self.addr):
                raise ServiceUnavailable("the reliability cache has disabled this port")
            with self._locked():
                if self._shut:
                    raise ManagedError("client shut down")
                if opened and opened.failure:   # its own connection failed, maybe after _open(): no other
                    raise fresh(opened.failure)
                connection = self.connection
                if self.state == "up":
                    if connection.owed or not peer_has_closed(connection.sock):
                        return connection
                    self._stream_ended(connection, "upstream closed the connection")
                    if connection.failure:   # it never carried a reply: an error, not a reconnect
                        raise fresh(connection.failure)
                    continue
                if self.state == "connecting":
                    self._await_connecting(connection, call)
                    continue
                if call.expired(self.clock):   # every reconnect is under the call's one deadline
                    raise MessageTimeout(f"no connection within {as_seconds(self.msg_timeout)}")
                self.connection = connection = Connection()
                self._move("connecting", "a call needs a connection")
            opened = connection
            self._open(connection, call)
            if connection.failure:   # this caller's own connect failed: its error, not the cache's
                raise fresh(connection.failure)

    def _await_connecting(self, connection, call):
        """Wait while another call connects; fail with that attempt's error."""
        self.count("waiting")
        while self.connection is connection and self.state == "connecting" and not self._shut:
            ping = connection.owed[0] if connection.owed else None
            if ping and ping.expired(self.clock):
                self._end(connection, "initial ping not answered in time",
                          MessageTimeout(f"initial ping not answered within {as_seconds(self.msg_timeout)}"))
            elif call.expired(self.clock):
                raise MessageTimeout(f"still connecting after {as_seconds(self.msg_timeout)}")
            else:
                deadlines = [d for d in (call.deadline, ping and ping.deadline) if d is not None]
                self.clock.wait(self._lock, min(deadlines, default=None))
        if connection.failure:
            raise fresh(connection.failure)

    def _open(self, connection, call):
        """Connect a Connection in state connecting, within the call's time left;
        ping it, or declare the client up.

        The ping shares the deadline of the call that opened the connection, so it
        times out no later than any waiting call gives up, and its failure (counted
        once, the client down) is what every waiting call sees."""
        try:   # (host, port) of an IPv6 address connects as its 4-tuple does; a scope id is in the host
            sock = socket.create_connection(self.addr[:2], timeout=call.time_left(self.clock))
            sock.settimeout(None)   # reads block in the reader thread; writes keep their own deadline
        except Exception as error:   # OSError, and whatever else: the client must not stay connecting
            reason = reason_of(error)
            with self._locked():
                self._end(connection, f"connect failed: {reason}", CommunicationError(f"cannot connect: {reason}"))
            return
        with self._locked():
            if connection.ended:   # shut down while connecting
                sock.close()
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connection.sock = sock
            self.count("connects")
            try:
                self._spawn(self._read_replies, connection)
                connection.reading = True
                if self.idle_timeout > 0 and not unlimited(self.idle_timeout) or (
                        not unlimited(self.msg_timeout) and not self.msg_timeout_is_fatal):
                    self._spawn(self._watch, connection)
            except RuntimeError as error:   # can't start new thread: this connection ends, the client goes on
                self._end(connection, f"no thread for the connection: {error}",
                          CommunicationError(f"no thread for the connection: {error}"))
                connection.close_if_unused()
                return
            if not self.initial_ping:
                connection.idle_since = self.clock.now()
                self._move("up", "connected")
                return
        with contextlib.suppress(ManagedError):   # a failed ping fails the waiting calls instead
            self._send(connection, Call(PING, call.deadline, is_ping=True), PING)

    def _spawn(self, target, *args):
        """Start a thread shut_down() joins; listed only once it has started (a thread never
        started cannot be joined)."""
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]

    def _end(self, connection, reason, failure=None):
        """With the lock held: take a connection down for good. A failure is counted
        once (a connection ends once) and handed to every call it owes."""
        if connection.ended:
            return
        connection.ended = True
        if failure:
            connection.failure = failure
            self._record_error()
        for call in connection.owed:
            if failure:
                call.error = failure
            if call.abandoned:   # its reply will never come and nobody waits: no longer pending
                self._calls.discard(call)
        if connection.sock:
            shutdown(connection.sock)   # wakes the reader thread; the last of it and a writer closes the socket
        if self.connection is connection:
            self.connection = None
            self._move("down", reason)
        self._lock.notify_all()
        if failure:
            self.count("errors")   # last, so a waiter on it sees the whole change

    def shut_down(self):
        """Final: fail what is pending, close the connection, join every thread."""
        with self._locked():
            self._shut = True
            if self.connection:
                for call in self.connection.owed:
                    call.error = MessageLost("client shut down")
                self._end(self.connection, "shut down")
            self._lock.notify_all()
        current = threading.current_thread()
        for thread in self._threads:
            if thread is not current:   # a callback on this client's reader or watchdog: that thread
                thread.join()           # ends by itself once the callback returns
        self.clock.unwatch(self._lock)

    def owns_current_thread(self):
        """True on this client's reader or watchdog thread: in a callback made there."""
        return threading.current_thread() in self._threads

    # -- writing, under the call's deadline --

    def _send(self, connection, call, request):
        """Queue the call on the connection and write its request by the call's
        deadline; False if the connection had ended quietly first (nothing was sent:
        the caller reconnects). One writer at a time, so queue order is wire order."""
        with self._locked():
            while connection.writing and not connection.ended:
                if call.expired(self.clock):
                    raise MessageTimeout(f"request not sent within {as_seconds(self.msg_timeout)}")
                self.clock.wait(self._lock, call.deadline)
            if connection.ended:
                if connection.failure:
                    raise fresh(connection.failure)
                return False
            connection.writing = True
            connection.owed.append(call)
            self.count("sent")
            self._tell("sent", connection, request)
        written, broken = False, "interrupted"   # until write() returns or raises
        try:
            written = connection.write(request, call.deadline, self.clock)
            broken = None
        except Exception as error:   # OSError: it broke; anything else must not leave `writing` set either
            broken = reason_of(error)
        finally:
            self._after_write(connection, call, written, broken)
        return True

    def _after_write(self, connection, call, written, broken):
        """The write turn given back, and the connection ended unless the request went out whole."""
        with self._locked():
            connection.writing = False
            self._lock.notify_all()
            if broken:
                self._end(connection, f"send failed: {broken}", MessageLost(f"send failed: {broken}"))
            elif written:
                self.count("written")
            else:   # part of a request may be on the wire: the connection is unusable
                timeout = MessageTimeout(f"request not sent within {as_seconds(self.msg_timeout)}")
                # a ping is its connection's only call, and shares the deadline of the calls that
                # wait for the connection: what they see is that their deadline passed
                lost = timeout if call.is_ping else MessageLost("a request not written in time closed the connection")
                self._end(connection, "a request not written in time", lost)
                call.error = timeout
            connection.close_if_unused()


# --- the managed set ---------------------------------------------------------

class ManagedSet(Hooks):
    """Managed clients over equivalent services; services = [(addr, max_connections), ...].

    pick(), for each service in policy order ("balance_load": fewest pending calls
    first, ties by position; "failover": list order), services this call has
    already tried last, skipping services the cache has disabled: the busiest
    client with fewer than pending_calls_norm pending calls (ties by position: with
    the default norm 1, an idle client), else a new client if the service has room,
    else the least busy client below pending_calls_max (ties by position); else
    ClusterServiceUnavailable.

    Given no rcache, the set fails over out of the box: it derives its own cache
    from the global one with policy "independent" (threshold 1, windows 1 s doubling
    to 64 s), so a failed service is skipped until its window ends. That cache never
    refuses everything (Envoy's "panic"): once it has disabled every service, pick()
    takes the one whose window ends first, as if enabled, unless the global cache or
    an availability callback refuses it too; so a one-service set never refuses because
    of its own cache. A retry goes at once to an enabled service this call has not
    tried yet, and waits idempotent_wait only before trying a service again; a call
    whose request never left (a refused connect) with no such service left fails at
    once: waiting would only delay the error.
    """
    counters = {"picks": 0, "attempts": 0, "retries": 0, "refusals": 0, "panics": 0, "callback_errors": 0}
    # picks     clients handed out by pick(); attempts  calls started by call()/idempotent_call()
    # retries   bumped once a retry has its deadline (now, if no wait); refusals  raised by pick()
    # panics    picks made with every service disabled by the set's own cache; bumped by pick()
    # callback_errors  its on_event raised; bumped by call_back(), for tests to wait on

    RETRIED_BY_CALL = (CommunicationError, ServiceUnavailable)   # the request never left
    RETRIED_BY_IDEMPOTENT_CALL = RETRIED_BY_CALL + (MessageLost, MessageTimeout, ClusterServiceUnavailable)

    def __init__(self, services, *, policy="balance_load", pending_calls_max=None, pending_calls_norm=1,
                 idempotent_max=3, idempotent_wait=1.0, clock=None, on_event=None, rcache=None,
                 framing=LINES, **client_options):
        if policy not in ("balance_load", "failover"):
            raise ValueError(f"policy is 'balance_load' or 'failover', not {policy!r}")
        if idempotent_max < 1:
            raise ValueError(f"idempotent_max counts attempts and must be at least 1, not {idempotent_max}")
        check_seconds("idempotent_wait", idempotent_wait)
        if idempotent_wait < 0:
            raise ValueError(f"idempotent_wait is at least 0 seconds, not {idempotent_wait}")
        if not services or any(count < 1 for _, count in services):
            raise ValueError("services is a non-empty list of (addr, max_connections >= 1)")
        for addr, _ in services:
            check_addr(addr)   # before anything is made: a bad address leaves nothing behind
        super().__init__()
        self.services, self.policy = list(services), policy
        self.pending_calls_max, self.pending_calls_norm = pending_calls_max, pending_calls_norm
        self.idempotent_max, self.idempotent_wait = idempotent_max, idempotent_wait
        self.clock, self.on_event = clock or RealClock(), on_event
        self.own_cache = rcache is None   # its own cache never refuses every service (see pick())
        if rcache is None:   # beyond Ocamlnet, whose default cache never disables: a set of its own fails over
            rcache = global_rcache().derive(policy="independent", clock=clock)
            rcache.on_event = on_event   # its disable windows reach the set's on_event
        self.rcache = rcache
        self.framing = framing   # where a reply ends and which replies fit a request; every client's
        self.client_options = {**client_options, "rcache": self.rcache, "framing": framing}
        self.clients = [[] for _ in self.services]   # per service, in creation order
        self._lock = threading.Condition()   # guards clients and _shut; shut_down() notifies it
        self._shut = False
        self.clock.watch(self._lock)

    def load(self):
        """Pending calls per service, reservations included."""
        return [sum(client.pending_calls for client in list(clients)) for clients in self.clients]

    def pick(self, tried=()):
        """Reserve a client for one call; return (client, service index). Services
        in `tried` (indices) come after all the others.

        The reservation counts as a pending call until that client's next call()
        starts, so two threads picking at once never get the same idle client.
        With every service disabled by the set's own cache, the one whose window
        ends first (untried first) is picked as if enabled, and its call does not
        ask the cache.
        """
        # Asked before the lock is taken, every service each time: the availability callback may call anything.
        enabled = [self.rcache.is_enabled(addr) for addr, _ in self.services]
        panic = self._panic_pick(tried) if self.own_cache and not any(enabled) else None
        with self._lock:
            if self._shut:
                raise ManagedError("set shut down")
            order = range(len(self.services))
            if self.policy == "balance_load":
                order = sorted(order, key=self.load().__getitem__)   # stable: ties keep list order
            for index in sorted(order, key=lambda index: index in tried):   # untried services first
                if (enabled[index] or index == panic) and (client := self._pick_in(index, self.services[index][1])):
                    client.reserve(despite_cache=index == panic)
                    self.count("picks")
                    if index == panic:
                        self.count("panics")
                    return client, index
        self.count("refusals")
        raise ClusterServiceUnavailable("every connection of every service is busy or disabled")

    def _panic_pick(self, tried):
        """With every service disabled: the index of the one to try anyway, or None. Only the
        set's own cache is overruled: a service its parents or an availability callback refuse stays out."""
        allowed = [index for index, (addr, _) in enumerate(self.services)
                   if self.rcache.enabled_but_for_windows(addr)]
        ends = {index: self.rcache.window_end(self.services[index][0]) for index in allowed}
        return min(allowed, key=lambda index: (index in tried, ends[index], index), default=None)

    def _pick_in(self, index, room):
        clients = self.clients[index]
        pending = [client.pending_calls for client in clients]
        below_norm = [n for n in range(len(clients)) if pending[n] < self.pending_calls_norm]
        if below_norm:   # Ocamlnet packs: the busiest under norm, so the others can idle out
            return clients[max(below_norm, key=pending.__getitem__)]   # max keeps the first of a tie
        if len(clients) < room:
            clients.append(ManagedClient(self.services[index][0], clock=self.clock,
                                         on_event=self.on_event, **self.client_options))   # checked in __init__
            return clients[-1]
        least = min(range(len(clients)), key=pending.__getitem__, default=None)   # first of the least busy
        if least is not None and (self.pending_calls_max is None or pending[least] < self.pending_calls_max):
            return clients[least]
        return None

    def call(self, request):
        """Pick and call; retried only if the request never left this process."""
        return self._attempts(request, self.RETRIED_BY_CALL)

    def idempotent_call(self, request):
        """Pick and call, retrying lost and timed-out requests too: for idempotent requests only."""
        return self._attempts(request, self.RETRIED_BY_IDEMPOTENT_CALL)

    def _attempts(self, request, retried):
        check_request(request, self.framing)   # before any pick: a bad request reserves nothing
        tried = set()   # services this call has been sent to, or tried to be
        for attempt in range(1, self.idempotent_max + 1):
            self.count("attempts")
            index = None   # stays None if pick() finds no client
            try:
                client, index = self.pick(tried)
                tried.add(index)
                reply = client.call(request)
            except retried as error:
                self._note("attempt", attempt, index, f"{type(error).__name__}: {error}")
                untried = index is not None and self._untried_enabled(tried)
                if attempt == self.idempotent_max or (isinstance(error, self.RETRIED_BY_CALL) and not untried):
                    raise   # the last attempt; or it never left, every service was tried: a wait helps nobody
                self._wait_before_retry(0.0 if untried else self.idempotent_wait)
            else:
                self._note("attempt", attempt, index, "ok")
                return reply

    def _untried_enabled(self, tried):
        return any(index not in tried and self.rcache.is_enabled(addr)
                   for index, (addr, _) in enumerate(self.services))

    def _wait_before_retry(self, seconds):
        """seconds on the set's clock; shut_down() cuts the wait short."""
        with self._lock:
            deadline = self.clock.now() + seconds
            self.count("retries")   # after the deadline is fixed: a waiter may advance the clock now
            while not self._shut and self.clock.now() < deadline:
                self.clock.wait(self._lock, deadline)
            if self._shut:
                raise ManagedError("set shut down")

    def _note(self, *event):
        if self.on_event:
            call_back(self, self.on_event, self, event)

    def shut_down(self):
        """Final: shut every client down and join its threads. From a callback on a client's
        own thread, it joins every other thread (that one ends once the callback returns);
        called there while another thread shuts the set down, it returns at once, since
        that thread may be joining this one."""
        with self._lock:
            already = self._shut
            self._shut = True
            self._lock.notify_all()
        if already and any(client.owns_current_thread() for clients in self.clients for client in list(clients)):
            return
        for clients in self.clients:
            for client in list(clients):
                client.shut_down()
        self.clock.unwatch(self._lock)


# --- the proxy front -----------------------------------------------------------

class ManagedProxy(FramedProxy):
    """FramedProxy's client loop; each exchange() is a ManagedSet call.

    It pipelines by default, as Ocamlnet's set does (pending_calls_max has no
    limit): once every connection of a service is busy, further calls queue on the
    least busy one, replies matched in order. A lost, extra or mismatched reply is
    caught as out of step and costs the calls on that connection a MessageLost
    (an ERR line), never another client's reply; pass pending_calls_max=1 to keep
    one call per connection. framing= is FramedProxy's: with resp.RESP in front of
    redis-server, many clients' commands pipeline over one connection, each reply
    framed by RESP and checked by its fit, errors written in RESP's form.
    """
    counters = {**Server.counters, "answered": 0, "failed": 0}
    # answered  replies from an upstream passed back; failed  ERR lines made from a ManagedError

    def __init__(self, services, idempotent=False, framing=LINES, **set_options):
        self.framing = framing   # FramedProxy.handle() reads requests with it, as the set reads replies
        self.managed_set = ManagedSet(services, framing=framing, **set_options)
        self.managed_call = self.managed_set.idempotent_call if idempotent else self.managed_set.call
        Server.__init__(self)   # not FramedProxy's: its pool is replaced by the set

    def exchange(self, request):
        try:
            reply = self.managed_call(request)
        except ManagedError as error:
            self.count("failed")
            return self.framing.error(f"{type(error).__name__}: {error}")
        self.count("answered")
        return reply

    def close(self):
        self.managed_set.shut_down()   # first: a handler waiting on an upstream gets an ERR
        super().close()
