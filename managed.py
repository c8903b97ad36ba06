"""managed: the reliability layer a production pool adds, after Ocamlnet's Rpc_proxy.

tcp_proxy.py ends with a pool that parses. This module keeps that lesson (a reply
ends at its b"\\n", and only then is the connection free) and adds what the toy
leaves out: reconnecting, health checks, disabling a failing upstream for a
while, failover, back-pressure, timeouts and retries, over the same line protocol.

Map of the module, in reading order:

    RealClock, VirtualClock   every timer reads one of these; the virtual one moves
                              only when advance() is called, so timed behaviour is
                              demonstrated and tested without sleeping. A clock of
                              your own needs all five methods the code calls:
                              now(), sleep(seconds), wait(condition, deadline),
                              watch(condition) and unwatch(condition)
    ManagedError and its five subclasses, the failures a caller can see
    ReliabilityCache          counts errors per port (and per host); disables a port
                              for 1, 2, 4 ... 64 s; global_rcache() is the shared one
    ManagedClient             one upstream connection at a time, remade on demand;
                              states down -> connecting -> up; several calls may be
                              pending on it, their replies matched in order
    ManagedSet                clients over several services: pick(), call(),
                              idempotent_call() with retries
    ManagedProxy              FramedProxy's client loop, its exchange() done by a ManagedSet

Threads: each connection has a reader thread, and with idle_timeout > 0 an idle
watchdog; shut_down() ends and joins them. Callers block in call() on the client's
condition, which the clock wakes at their deadline.

The faults the scenarios need (an upstream that stops, restarts on the same port,
drops or cuts a reply, or never answers) are scaffolding, in managed_demo.py.

The order a request takes through ManagedProxy:
    client line -> FramedProxy.handle() -> exchange() -> ManagedSet.call(): pick()
    -> ManagedClient.call(): usable connection (connect, initial ping) -> send
    -> the reader thread matches the reply to the oldest pending call -> back to the client
"""
import collections
import contextlib
import math
import socket
import threading
import time

from tcp_proxy import FramedProxy, Hooks, LineTooLong, Server, read_lines, shutdown


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
        condition.wait(None if deadline is None else max(deadline - self.now(), 0))

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
        if seconds < 0:
            raise ValueError(f"time only moves forward, not by {seconds}")
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
    """Errors in a row for one port or one host, and its disable window."""

    def __init__(self, first_window):
        self.errors = 0
        self.disabled_until = -math.inf   # clock time the current window ends
        self.window = first_window   # length of the next window; doubles per disable


class ReliabilityCache(Hooks):
    """Which ports (and hosts) have failed lately, and until when they are disabled.

    An entry exists only while a port keeps failing: a success deletes it. Errors
    reaching `threshold` disable the port for disable_timeout_min seconds; each
    further disable doubles the window, up to disable_timeout_max; errors while a
    window is open do not extend it. A derived cache has its own settings (those
    not given are read live from its parent), forwards every error and success to
    its parent, and enables a port only if its parent does too.

    A setting given as None is inherited: read live from the parent, or for a cache
    without one the default (a RealClock for the clock). derive() passes None for
    every setting it is not given; a cache built with parent= directly owns the
    defaults of the settings it is not given, except availability and clock.
    """
    counters = {"errors": 0, "successes": 0, "disables": []}
    # errors     record_error() calls; successes  record_success() calls
    # disables   (key, start, end, reason) per window opened; key is an (ip, port) or an ip

    def __init__(self, policy="none", threshold=1, disable_timeout_min=1.0, disable_timeout_max=64.0,
                 availability=None, clock=None, *, parent=None, on_event=None):
        super().__init__()
        self.parent, self.on_event = parent, on_event
        self._config = {} if parent else dict(DEFAULTS)   # a derived cache holds only what it overrides
        self.configure(policy=policy, threshold=threshold, disable_timeout_min=disable_timeout_min,
                       disable_timeout_max=disable_timeout_max, availability=availability, clock=clock)
        self._lock = threading.Lock()   # guards _entries
        self._entries = {}              # (ip, port) or ip -> Entry

    def configure(self, **config):
        """Change settings in place, for every user of this cache, at any time; None
        means inherited. A rejected change (TypeError for an unknown setting,
        ValueError for a bad value) changes nothing."""
        unknown = set(config) - set(DEFAULTS)
        if unknown:
            raise TypeError(f"unknown settings: {sorted(unknown)}")
        changed = dict(self._config)   # checked whole before it replaces the live one
        for name, value in config.items():
            if value is not None:
                changed[name] = value
            elif self.parent:
                changed.pop(name, None)   # read live from the parent again
            else:
                changed[name] = DEFAULTS[name]
        if not self.parent and changed["clock"] is None:
            changed["clock"] = RealClock()
        check_policy(self.setting("policy", changed))
        if self.setting("threshold", changed) < 1 or not 0 < self.setting(
                "disable_timeout_min", changed) <= self.setting("disable_timeout_max", changed):
            raise ValueError("threshold >= 1 and 0 < disable_timeout_min <= disable_timeout_max")
        self._config = changed   # one assignment: no reader sees a rejected or half-made config

    def setting(self, name, config=None):
        """A setting's value: this cache's own (or `config`'s), else the parent's."""
        config = self._config if config is None else config
        return config[name] if name in config else self.parent.setting(name)

    @property
    def clock(self):
        return self.setting("clock")

    def derive(self, **config):
        """A cache whose errors also count here, with its own settings; those not
        given (or given as None), the clock included, are read live from this one."""
        return ReliabilityCache(**{**dict.fromkeys(DEFAULTS), **config}, parent=self, on_event=self.on_event)

    def _host_keys(self, addr):
        policy = self.setting("policy")
        if policy == "any_failing_port_disables_host" or policy == ("failing_port_disables_host", addr[1]):
            return [addr, addr[0]]   # the port's own entry, and its host's
        return [addr]

    def record_error(self, addr):
        self.count("errors")
        if self.setting("policy") != "none":
            now = self.clock.now()
            with self._lock:
                opened = [self._error(key, now) for key in self._host_keys(addr)]
            for window in filter(None, opened):
                self.count("disables", window)
                if self.on_event:
                    self.on_event(self, ("disabled",) + window)
        if self.parent:
            self.parent.record_error(addr)

    def _error(self, key, now):
        """Count one error against key; return the window it opens, if it opens one."""
        entry = self._entries.setdefault(key, Entry(self.setting("disable_timeout_min")))
        entry.errors += 1
        if now < entry.disabled_until:
            return None   # already disabled: an error now does not extend the window
        if entry.errors < self.setting("threshold"):
            return None
        window = min(entry.window, self.setting("disable_timeout_max"))   # a max lowered since still caps it
        entry.disabled_until = now + window
        reason = f"{entry.errors} error(s) in a row, threshold {self.setting('threshold')}"
        if isinstance(key, str):
            reason = "host disabled: " + reason
        entry.window = min(window * 2, self.setting("disable_timeout_max"))
        return key, now, entry.disabled_until, reason

    def record_success(self, addr):
        self.count("successes")
        with self._lock:   # a success forgets the past: counter and window start over
            for key in (addr, addr[0]):
                self._entries.pop(key, None)
        if self.parent:
            self.parent.record_success(addr)

    def is_enabled(self, addr):
        """True unless this port, its host, the availability hook or a parent says no."""
        availability = self.setting("availability")
        if availability and not availability(addr):
            return False
        now = self.clock.now()
        with self._lock:
            for key in (addr, addr[0]) if self.setting("policy") != "none" else ():
                entry = self._entries.get(key)
                if entry and now < entry.disabled_until:
                    return False
        return self.parent.is_enabled(addr) if self.parent else True


_GLOBAL_RCACHE = ReliabilityCache()   # policy "none": it has no effect until configured


def global_rcache():
    """The cache every client uses unless it is given another."""
    return _GLOBAL_RCACHE


def set_global_rcache_config(**config):
    """Reconfigure the global cache in place; every user sees the change at once.
    An unknown setting is a TypeError and a bad value a ValueError; either changes nothing."""
    _GLOBAL_RCACHE.configure(**config)


# --- the managed client ------------------------------------------------------

class Call:
    """One request in progress, and how it ended."""

    def __init__(self, deadline, is_ping=False):
        self.deadline, self.is_ping = deadline, is_ping
        self.reply = None       # the reply line, once it has arrived
        self.error = None       # the ManagedError that ended it instead
        self.abandoned = False  # timed out, not fatally: its reply is still owed and discarded


class Connection:
    """One socket of a ManagedClient and the calls whose replies it owes, oldest first."""

    def __init__(self):
        self.sock = None             # set once connected
        self.owed = collections.deque()
        self.failure = None          # the error that ended it, if an error did
        self.ended = False
        self.idle_since = None       # clock time the last reply left nothing owed


def fresh(error):
    """A new exception like `error`: one instance must not be raised in two threads."""
    return type(error)(*error.args)


def check_request(request):
    if not isinstance(request, bytes) or not request.endswith(b"\n") or request.count(b"\n") != 1:
        raise ValueError(f"a request is one line of bytes ending in b'\\n', not {request!r:.60}")


def peer_has_closed(sock):
    """True if the upstream's EOF is already waiting on this socket."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


class ManagedClient(Hooks):
    """One connection to one upstream at a time, made when a call needs it.

    A call on a down client connects; with initial_ping the new connection must
    answer PING before any request is sent, and calls wait in "connecting". An
    error takes the client down, counts once per connection, fails every call
    pending on it, and is never retried here. An EOF while nothing is owed (the
    upstream closed an idle connection) takes it down quietly; the next call
    reconnects. idle_timeout: < 0 never, 0 right after the last reply, > 0 seconds
    with nothing owed. msg_timeout bounds each call from its start, and the initial
    ping; it ends the connection only if msg_timeout_is_fatal, else the late reply
    is discarded when it arrives and counts as pending until then.

    Scaffolding: late_replies="forget" drops a timed-out call from the queue
    instead, so its reply goes to the next call: the bug demo scenario 1 shows.
    """
    counters = {"transitions": [], "calls": 0, "connects": 0, "sent": 0, "replies": 0, "discarded": 0,
                "errors": 0}
    # transitions  (from, to, reason) per state change; bumped by _move()
    # calls        calls begun; bumped by call() once its deadline is set
    # connects     sockets connected; bumped by _open()
    # sent         requests written, pings included; bumped by _send() before sendall
    # replies      replies handed to callers; bumped by the reader thread
    # discarded    late replies of abandoned calls thrown away; bumped by the reader thread
    # errors       failed connections (not failed calls); bumped by _end()

    def __init__(self, addr, *, rcache=None, initial_ping=False, idle_timeout=-1.0, msg_timeout=-1.0,
                 msg_timeout_is_fatal=False, clock=None, on_event=None, late_replies="discard"):
        if late_replies not in ("discard", "forget"):
            raise ValueError(f"late_replies is 'discard' or 'forget', not {late_replies!r}")
        super().__init__()
        self.addr = addr
        self.rcache = rcache or global_rcache()
        self.initial_ping, self.idle_timeout = initial_ping, idle_timeout
        self.msg_timeout, self.msg_timeout_is_fatal = msg_timeout, msg_timeout_is_fatal
        self.clock, self.on_event, self.late_replies = clock or RealClock(), on_event, late_replies
        self.state = "down"
        self.connection = None      # the Connection of states connecting and up
        self.reserved = 0           # picks by a ManagedSet whose call has not started
        self._calls = set()         # Calls begun and not settled (abandoned ones until their reply)
        self._threads = []
        self._shut = False
        self._lock = threading.Condition()   # guards all the above; notified on every change
        self._send_lock = threading.Lock()   # keeps the queue order equal to the wire order
        self.clock.watch(self._lock)

    @property
    def pending_calls(self):
        with self._lock:
            return len(self._calls) + self.reserved

    def reserve(self):
        with self._lock:
            self.reserved += 1

    def _move(self, state, reason):
        transition = (self.state, state, reason)
        self.state = state
        self._lock.notify_all()
        self.count("transitions", transition)
        if self.on_event:
            self.on_event(self, ("transition",) + transition)

    def call(self, request):
        """Send one request line and return its reply line, or raise a ManagedError."""
        check_request(request)
        deadline = None if self.msg_timeout < 0 else self.clock.now() + self.msg_timeout
        call = Call(deadline)
        with self._lock:
            self.reserved = max(self.reserved - 1, 0)   # a pick's reservation becomes this call
            self._calls.add(call)
        self.count("calls")
        try:
            connection = self._usable_connection(call)
            while not self._send(connection, call, request):   # it closed, idle, just now
                connection = self._usable_connection(call)
            with self._lock:
                return self._await(connection, call)
        finally:
            with self._lock:
                if not call.abandoned:
                    self._calls.discard(call)

    def _usable_connection(self, call):
        """The up connection, after connecting (and pinging) if the client is down."""
        while True:
            with self._lock:
                if self._shut:
                    raise ManagedError("client shut down")
                if not self.rcache.is_enabled(self.addr):
                    raise ServiceUnavailable("the reliability cache has disabled this port")
                connection = self.connection
                if self.state == "up":
                    if connection.owed or not peer_has_closed(connection.sock):
                        return connection
                    self._end(connection, "upstream closed the idle connection")
                    continue
                if self.state == "down":
                    self.connection = connection = Connection()
                    self._move("connecting", "a call needs a connection")
                else:
                    self._await_connecting(connection, call)
                    continue
            self._open(connection, call)
            if connection.failure:   # this caller's own connect failed: its error, not the cache's
                raise fresh(connection.failure)

    def _await_connecting(self, connection, call):
        """Wait while another call connects; fail with that attempt's error."""
        while self.connection is connection and self.state == "connecting" and not self._shut:
            ping = connection.owed[0] if connection.owed else None
            if ping and ping.deadline is not None and self.clock.now() >= ping.deadline:
                self._end(connection, "initial ping not answered in time",
                          MessageTimeout(f"initial ping not answered within {as_seconds(self.msg_timeout)}"))
            elif call.deadline is not None and self.clock.now() >= call.deadline:
                raise MessageTimeout(f"still connecting after {as_seconds(self.msg_timeout)}")
            else:
                deadlines = [d for d in (call.deadline, ping and ping.deadline) if d is not None]
                self.clock.wait(self._lock, min(deadlines, default=None))
        if connection.failure:
            raise fresh(connection.failure)

    def _open(self, connection, call):
        """Connect a Connection in state connecting; ping it, or declare the client up.

        The ping shares the deadline of the call that opened the connection, so it
        times out no later than any waiting call gives up, and its failure (counted
        once, the client down) is what every waiting call sees."""
        try:
            sock = socket.create_connection(self.addr)
        except OSError as error:
            with self._lock:
                self._end(connection, f"connect failed: {error.strerror}",
                          CommunicationError(f"cannot connect: {error.strerror}"))
            return
        with self._lock:
            if connection.ended:   # shut down while connecting
                sock.close()
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connection.sock = sock
            self.count("connects")
            self._spawn(self._read_replies, connection)
            if self.idle_timeout > 0:
                self._spawn(self._close_when_idle, connection)
            if not self.initial_ping:
                connection.idle_since = self.clock.now()
                self._move("up", "connected")
                return
        with contextlib.suppress(ManagedError):   # a failed ping fails the waiting calls instead
            self._send(connection, Call(call.deadline, is_ping=True), b"PING\n")

    def _spawn(self, target, *args):
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _send(self, connection, call, request):
        """Queue the call on the connection and write its request; False if the
        connection had ended quietly first (nothing was sent: the caller reconnects)."""
        with self._send_lock:   # queue order == wire order, so replies match calls
            with self._lock:
                if connection.ended:
                    if connection.failure:
                        raise fresh(connection.failure)
                    return False
                connection.owed.append(call)
                self.count("sent")
            try:
                connection.sock.sendall(request)
            except OSError as error:
                with self._lock:
                    self._end(connection, f"send failed: {error.strerror}",
                              MessageLost(f"send failed: {error.strerror}"))
        return True

    def _await(self, connection, call):
        """With the lock held: the call's reply, once the reader thread delivers it."""
        while call.reply is None and call.error is None:
            if call.deadline is not None and self.clock.now() >= call.deadline:
                self._time_out(connection, call)
            else:
                self.clock.wait(self._lock, call.deadline)
        if call.error:
            raise fresh(call.error)
        return call.reply

    def _time_out(self, connection, call):
        timeout = MessageTimeout(f"no reply within {as_seconds(self.msg_timeout)}")
        if self.msg_timeout_is_fatal:
            self._end(connection, "message timeout (fatal)", timeout)
        elif self.late_replies == "forget":   # scaffolding: the bug, as a real code path
            connection.owed.remove(call)
        else:   # the reply is still owed: it is discarded on arrival, and keeps the client busy
            call.abandoned = True
        raise timeout

    def _read_replies(self, connection):
        """The reader thread: each reply line settles the oldest call owed."""
        try:
            for line in read_lines(connection.sock):
                with self._lock:
                    self._deliver(connection, line + b"\n")
            problem = "upstream closed the connection"
        except LineTooLong:
            problem = "upstream sent an overlong line"
        with self._send_lock, self._lock:
            if connection.owed:
                self._end(connection, f"{problem} with {len(connection.owed)} call(s) owed",
                          MessageLost(problem))
            else:
                self._end(connection, "upstream closed the idle connection")
            connection.sock.close()

    def _deliver(self, connection, reply):
        if connection.ended:
            return
        if not connection.owed:
            self._end(connection, "a reply no call was waiting for", MessageLost("unexpected reply"))
            return
        call = connection.owed.popleft()   # the load-bearing line: a reply settles the oldest call owed
        if call.abandoned:
            self._calls.discard(call)
            self.count("discarded")
        elif call.is_ping:
            if reply != b"PONG\n":
                self._end(connection, "initial ping answered wrongly", MessageLost("bad answer to PING"))
                return
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

    def _close_when_idle(self, connection):
        """The idle watchdog thread: close the connection once nothing has been owed
        for idle_timeout seconds on the client's clock, with no call needed to notice."""
        with self._lock:
            while not connection.ended:
                deadline = None
                if self.state == "up" and not connection.owed:
                    deadline = connection.idle_since + self.idle_timeout
                    if self.clock.now() >= deadline:
                        self._end(connection, f"idle for {as_seconds(self.idle_timeout)}")
                        return
                self.clock.wait(self._lock, deadline)

    def _end(self, connection, reason, failure=None):
        """With the lock held: take a connection down for good. A failure is counted
        once (a connection ends once) and handed to every call it owes."""
        if connection.ended:
            return
        connection.ended = True
        if failure:
            connection.failure = failure
            self.rcache.record_error(self.addr)
        for call in connection.owed:
            if failure:
                call.error = failure
            if call.abandoned:   # its reply will never come and nobody waits: no longer pending
                self._calls.discard(call)
        if connection.sock:
            shutdown(connection.sock)   # wakes the reader thread, which closes the socket
        if self.connection is connection:
            self.connection = None
            self._move("down", reason)
        self._lock.notify_all()
        if failure:
            self.count("errors")   # last, so a waiter on it sees the whole change

    def shut_down(self):
        """Final: fail what is pending, close the connection, join every thread."""
        with self._lock:
            self._shut = True
            if self.connection:
                for call in self.connection.owed:
                    call.error = MessageLost("client shut down")
                self._end(self.connection, "shut down")
            self._lock.notify_all()
        for thread in self._threads:
            thread.join()
        self.clock.unwatch(self._lock)


# --- the managed set ---------------------------------------------------------

class ManagedSet(Hooks):
    """Managed clients over equivalent services; services = [(addr, max_connections), ...].

    pick(), for each service in policy order ("balance_load": fewest pending calls
    first, ties by position; "failover": list order), skipping services the cache
    has disabled: a client with fewer than pending_calls_norm pending calls, else a
    new client if the service has room, else the least busy client below
    pending_calls_max (ties by position); else ClusterServiceUnavailable.
    """
    counters = {"picks": 0, "attempts": 0, "retries": 0, "refusals": 0}
    # picks     clients handed out by pick(); attempts  calls started by call()/idempotent_call()
    # retries   bumped once a retry's wait has its deadline; refusals  raised by pick()

    RETRIED_BY_CALL = (CommunicationError, ServiceUnavailable)   # the request never left
    RETRIED_BY_IDEMPOTENT_CALL = RETRIED_BY_CALL + (MessageLost, MessageTimeout, ClusterServiceUnavailable)

    def __init__(self, services, *, policy="balance_load", pending_calls_max=None, pending_calls_norm=1,
                 idempotent_max=3, idempotent_wait=5.0, clock=None, on_event=None, **client_options):
        if policy not in ("balance_load", "failover"):
            raise ValueError(f"policy is 'balance_load' or 'failover', not {policy!r}")
        if idempotent_max < 1:
            raise ValueError(f"idempotent_max counts attempts and must be at least 1, not {idempotent_max}")
        if not services or any(count < 1 for _, count in services):
            raise ValueError("services is a non-empty list of (addr, max_connections >= 1)")
        super().__init__()
        self.services, self.policy = list(services), policy
        self.pending_calls_max, self.pending_calls_norm = pending_calls_max, pending_calls_norm
        self.idempotent_max, self.idempotent_wait = idempotent_max, idempotent_wait
        self.clock, self.on_event = clock or RealClock(), on_event
        self.rcache = client_options.get("rcache") or global_rcache()
        self.client_options = client_options
        self.clients = [[] for _ in self.services]   # per service, in creation order
        self._lock = threading.Condition()   # guards clients and _shut; shut_down() notifies it
        self._shut = False
        self.clock.watch(self._lock)

    def load(self):
        """Pending calls per service, reservations included."""
        return [sum(client.pending_calls for client in clients) for clients in self.clients]

    def pick(self):
        """Reserve a client for one call; return (client, service index).

        The reservation counts as a pending call until that client's next call()
        starts, so two threads picking at once never get the same idle client.
        """
        with self._lock:
            if self._shut:
                raise ManagedError("set shut down")
            order = range(len(self.services))
            if self.policy == "balance_load":
                order = sorted(order, key=self.load().__getitem__)   # stable: ties keep list order
            for index in order:
                addr, room = self.services[index]
                if self.rcache.is_enabled(addr) and (client := self._pick_in(index, room)):
                    client.reserve()
                    self.count("picks")
                    return client, index
        self.count("refusals")
        raise ClusterServiceUnavailable("every connection of every service is busy or disabled")

    def _pick_in(self, index, room):
        clients = self.clients[index]
        pending = [client.pending_calls for client in clients]
        least = min(range(len(clients)), key=pending.__getitem__, default=None)   # first of the least busy
        if least is not None and pending[least] < self.pending_calls_norm:
            return clients[least]
        if len(clients) < room:
            clients.append(ManagedClient(self.services[index][0], clock=self.clock,
                                         on_event=self.on_event, **self.client_options))
            return clients[-1]
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
        check_request(request)
        for attempt in range(1, self.idempotent_max + 1):
            self.count("attempts")
            index = None   # stays None if pick() finds no client
            try:
                client, index = self.pick()
                reply = client.call(request)
            except retried as error:
                self._note("attempt", attempt, index, f"{type(error).__name__}: {error}")
                if attempt == self.idempotent_max:
                    raise
                self._wait_before_retry()
            else:
                self._note("attempt", attempt, index, "ok")
                return reply

    def _wait_before_retry(self):
        """idempotent_wait seconds on the set's clock; shut_down() cuts it short."""
        with self._lock:
            deadline = self.clock.now() + self.idempotent_wait
            self.count("retries")   # after the deadline is fixed: a waiter may advance the clock now
            while not self._shut and self.clock.now() < deadline:
                self.clock.wait(self._lock, deadline)
            if self._shut:
                raise ManagedError("set shut down")

    def _note(self, *event):
        if self.on_event:
            self.on_event(self, event)

    def shut_down(self):
        """Final: shut every client down."""
        with self._lock:
            self._shut = True
            self._lock.notify_all()
        for clients in self.clients:
            for client in clients:
                client.shut_down()
        self.clock.unwatch(self._lock)


# --- the proxy front -----------------------------------------------------------

class ManagedProxy(FramedProxy):
    """FramedProxy's client loop; each exchange() is a ManagedSet call."""
    counters = {**Server.counters, "answered": 0, "failed": 0}
    # answered  replies from an upstream passed back; failed  ERR lines made from a ManagedError

    def __init__(self, services, idempotent=False, **set_options):
        self.managed_set = ManagedSet(services, **set_options)
        self.managed_call = self.managed_set.idempotent_call if idempotent else self.managed_set.call
        Server.__init__(self)   # not FramedProxy's: its pool is replaced by the set

    def exchange(self, request):
        try:
            reply = self.managed_call(request)
        except ManagedError as error:
            self.count("failed")
            return b"ERR %s: %s\n" % (type(error).__name__.encode(), str(error).encode())
        self.count("answered")
        return reply

    def close(self):
        self.managed_set.shut_down()   # first: a handler waiting on an upstream gets an ERR
        super().close()
