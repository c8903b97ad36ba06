"""loop: the one event loop Part two runs on, after Ocamlnet's event system (esys).

    Loop       a selector, the deadlines it keeps on an injected clock, and one turn:
               read what is readable, place what the reads gathered, take what other
               threads handed over, fire the deadlines the clock has passed, one send
               per socket with bytes waiting, then the turn's callbacks, completions
               and hook wake-ups, in that order
    Counted    tcp_proxy's Hooks for what the loop owns: its counters are plain integers
               the loop bumps, and their waiters are woken once per turn, not per event

Who turns it: a thread its owner starts (start(); shut_down() ends and joins it), or the
owner itself, one run_once() at a time. Another thread never touches what the loop owns:
it hands a function over (hand()), and the loop runs it in its next turn. A blocking call
from a thread (complete()) hands its start over and waits on its own completion; one made
on the loop's own thread in an on_event callback turns the loop itself until it is done, as
Ocamlnet's synchronous calls do (in the middle of a turn's work it is refused). Every
deadline is the clock's: on a VirtualClock time moves only in advance(), which wakes the
loop; no one sleeps.
"""
import collections
import heapq
import itertools
import selectors
import socket
import threading

from part2.calls import ManagedError
from part2.clock import RealClock
from part2.hooks import LOG, QuietHooks, call_back
READ, WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE
SELECT_MAX = 3600.0   # seconds one select() may wait (epoll's limit is weeks); it then looks again


class Timer:
    """One deadline on the loop's clock; cancel() keeps it from firing."""
    __slots__ = ("when", "function", "cancelled")

    def __init__(self, when, function):
        self.when, self.function, self.cancelled = when, function, False

    def cancel(self):
        self.cancelled = True


class Counted(QuietHooks):
    """Hooks for an object the loop owns. Its counters are plain integers, bumped on the
    loop's thread with no lock; the waiters of wait_<counter>() are woken once per turn,
    at its end, and only if there are any (see QuietHooks)."""

    def __init__(self, loop):
        super().__init__()
        self.loop = loop
        loop.counted.append(self)

    def count(self, name, amount=1):
        setattr(self, name, getattr(self, name) + amount)


class Loop(Counted):
    """A selector, a heap of deadlines, and the turn that serves them (see the module's map).

    What a handler registered with watch() may rely on: it is called with the events that
    are ready, on the loop's thread; after_reads(function) has function() called once
    the turn's reads are over (a proxy places what they gathered); flush_soon(writer) has
    writer.flush() called once, in this turn's send phase; queue_callback() makes a
    callback after the turn's work, with no state half changed; an exception in any of
    them is logged and counted (handler_errors), and the turn goes on."""
    counters = {"turns": 0, "handler_errors": 0}
    # turns           turns run; bumped at the end of each
    # handler_errors  handlers, timers or handed functions that raised; logged, the turn went on

    def __init__(self, clock=None):
        self.counted = []         # the Counted objects it owns, itself first: woken as a turn ends
        super().__init__(self)
        self.clock = clock or RealClock()
        self.selector = selectors.DefaultSelector()   # epoll on Linux: no limit at descriptor 1023
        self._wake_in, self._wake_out = socket.socketpair()   # a byte on it ends a select()
        for sock in (self._wake_in, self._wake_out):
            sock.setblocking(False)
        self.selector.register(self._wake_out, READ, self._woken)
        self._woke = False        # a wake-up byte is on its way: no need for another
        self._handed = collections.deque()   # (function, args) other threads handed over
        self._handing = threading.Lock()     # guards `stopped` against a hand() racing the end
        self._timers = []         # heap of (when, sequence, Timer)
        self._sequence = itertools.count()   # orders timers of the same instant as they were set
        self._after_reads = []    # functions to call once this turn's reads are over
        self._writers = []        # objects whose flush() this turn's send phase calls
        self._callbacks = []      # (owner, function, args) for the end of the turn
        self.finished = []        # Calls completed this turn; their threads wake at its end
        self.thread = None        # the thread that turns it, once started
        self.working = False      # a turn's work is under way (not its callbacks)
        self.stopping = False
        self.stopped = False
        self.clock.watch(self)

    # -- what the loop's own objects use --

    def watch(self, sock, events, handler):
        self.selector.register(sock, events, handler)

    def want(self, owner, events):
        """Watch owner.sock for `events` (0: none), owner.ready(events) its handler; owner.watching
        holds what is watched now, so an unchanged want costs no system call."""
        if events == owner.watching:
            return
        if not owner.watching:
            self.selector.register(owner.sock, events, owner.ready)
        elif events:
            self.selector.modify(owner.sock, events, owner.ready)
        else:
            self.selector.unregister(owner.sock)
        owner.watching = events

    def unwatch(self, sock):
        try:
            self.selector.unregister(sock)
        except (KeyError, ValueError):   # never watched, or already closed
            pass

    def forget(self, sock):
        """Stop watching sock and close it."""
        self.unwatch(sock)
        sock.close()

    def at(self, when, function):
        """Call function() in the first turn whose clock time is at or past `when`."""
        timer = Timer(when, function)
        heapq.heappush(self._timers, (when, next(self._sequence), timer))
        return timer

    def after_reads(self, function):
        """function() once this turn's reads are over, before anything else in it (listed
        after that, in the next turn's)."""
        self._after_reads.append(function)

    def flush_soon(self, writer):
        """writer.flush() in this turn's send phase (writer.flushing says it is listed)."""
        if not writer.flushing:
            writer.flushing = True
            self._writers.append(writer)

    def queue_callback(self, owner, function, *args):
        self._callbacks.append((owner, function, args))

    def finish(self, call):
        """A Call is done: its thread takes its outcome once this turn has ended."""
        call.done = True
        self.finished.append(call)

    # -- other threads --

    def hand(self, function, *args):
        """From any thread: run function(*args) on the loop in its next turn. False if
        the loop has stopped (nothing will run it)."""
        with self._handing:
            if self.stopped:
                return False
            self._handed.append((function, args))
        self.wake()
        return True

    def wake(self):
        """End the select() the loop is in (or its next one) at once."""
        if not self._woke:
            self._woke = True
            try:
                self._wake_in.send(b"\0")
            except OSError:   # full (a wake-up is pending anyway) or closed (the loop has ended)
                pass

    def _woken(self, events):
        try:
            while self._wake_out.recv(4096):
                pass
        except OSError:   # drained
            pass
        self._woke = False   # after the drain: a wake() from now on sends a byte it will not eat

    def on_loop_thread(self):
        """True where the loop's own work may run: its thread, or any thread if it has none."""
        return self.thread is None or self.thread is threading.current_thread()

    def complete(self, call, start):
        """Hand start() to the loop and wait until `call` is done; its outcome. On the loop's
        own thread the loop is turned here until then (a call made in an on_event callback);
        in the middle of a turn's work (an availability callback) that would turn the loop
        inside itself, so it is refused."""
        if self.working and self.on_loop_thread():
            raise ManagedError("a blocking call from inside a turn's work (an availability "
                               "callback) is refused: make it from on_event or another thread")
        if not self.hand(start):
            raise ManagedError("shut down")
        if self.on_loop_thread():
            while not call.done:
                self.run_once()
        else:
            call.waiter.acquire()   # released at the end of the turn that completed it
        return call.outcome()

    def ask(self, function, *args):
        """function(*args) run on the loop; its result, on whatever thread asks."""
        if self.on_loop_thread():
            return function(*args)
        answer = {}
        done = threading.Event()

        def run():
            try:
                answer["result"] = function(*args)
            except BaseException as error:   # given back to the asking thread, which raises it
                answer["error"] = error
            done.set()
        if not self.hand(run):
            raise ManagedError("shut down")
        done.wait()
        if "error" in answer:
            raise answer["error"]
        return answer.get("result")

    # -- the turn --

    def run_once(self, block=True):
        """One turn. With block=False (or work already waiting) select() does not wait."""
        clock = self.clock
        self.working = True
        timeout = 0
        if block and not (self._handed or self._after_reads or self._writers):   # else no wait
            timeout = clock.timeout_until(self._next_deadline())
            timeout = SELECT_MAX if timeout is None or timeout > SELECT_MAX else timeout
        for key, events in self.selector.select(timeout):
            try:
                key.data(events)
            except Exception:   # a bug in a handler: logged, counted; the turn goes on
                self._raised()
        after_reads, self._after_reads = self._after_reads, []
        for function in after_reads:
            self._safely(function)
        while self._handed:
            function, args = self._handed.popleft()
            self._safely(function, *args)
        self._fire_timers(clock.now())
        writers, self._writers = self._writers, []
        for writer in writers:
            try:
                writer.flush()
            except Exception:
                self._raised()
        self.working = False
        self._end_turn()

    def _next_deadline(self):
        timers = self._timers
        while timers and timers[0][2].cancelled:
            heapq.heappop(timers)
        return timers[0][0] if timers else None

    def _fire_timers(self, now):
        timers = self._timers
        while timers and timers[0][0] <= now:
            timer = heapq.heappop(timers)[2]
            if not timer.cancelled:
                self._safely(timer.function)

    def _safely(self, function, *args):
        try:
            function(*args)
        except Exception:   # a bug in a handler: logged, counted; the turn and the loop go on
            self._raised()

    def _raised(self):
        """In an except block: a handler raised; the first is logged, each is counted."""
        if not self.handler_errors:
            LOG.exception("a handler on the loop raised; the turn went on")
        self.handler_errors += 1

    def _end_turn(self):
        """The turn's callbacks (those they queue too), then its completions, then its hooks."""
        while self._callbacks:
            callbacks, self._callbacks = self._callbacks, []
            for owner, function, args in callbacks:
                call_back(owner, function, *args)
        finished, self.finished = self.finished, []
        for call in finished:
            call.waiter.release()
        self.turns += 1
        for counted in self.counted:
            if counted.waiters:
                with counted._changed:
                    counted._changed.notify_all()

    # -- the thread --

    def start(self, spawn=None):
        """Turn the loop on a thread of its own, started by spawn(target) (a Thread by default)."""
        self.thread = (spawn or start_thread)(self.run)

    def run(self):
        try:
            while not self.stopping:
                self.run_once()
        finally:
            self._close()

    def shut_down(self):
        """Stop the loop and close what it owns. From another thread, join its thread; from
        its own (a callback), it ends once the turn is over."""
        self.stopping = True
        if self.thread is None:
            self._close()
        elif self.thread is threading.current_thread():
            return
        else:
            self.wake()
            self.thread.join()

    def _close(self):
        with self._handing:
            self.stopped = True
        while self._handed:   # handed before the end: each finds its owner shut down, and says so
            function, args = self._handed.popleft()
            self._safely(function, *args)
        self._end_turn()
        self.clock.unwatch(self)
        for key in list(self.selector.get_map().values()):
            key.fileobj.close()   # what an owner left open: closed, never leaked
        self.selector.close()
        self._wake_in.close()


def start_thread(target):
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread
