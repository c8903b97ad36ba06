"""loop: the one event loop Part two runs on, after Ocamlnet's event system (esys) and
asyncio's selector loop.

    Loop       a poller, the deadlines it keeps on an injected clock, and one turn: read
               what is readable, place what the reads gathered, take what other threads
               handed over, fire the deadlines the clock has passed, one send per transport
               with bytes waiting; then, the turn's work over, its callbacks, completions
               and hook wake-ups, in that order
    Transport  one socket on the loop, a client's or an upstream's: it reads for its
               protocol, keeps the bytes not yet sent (a bound in bytes), sends them,
               stops and starts reading, closes

A protocol is what a transport reads for: received(data); hung_up(reason): None for the
peer's EOF (or a reset; the transport reads no more, the protocol closes it when it is
done), else why a send or the connect failed (it is closed); connected(), for a transport
made while connecting; overflowed(), for one whose peer reads less than its limit.
The loop writes nothing on a protocol: its bookkeeping is the transport's own.

Who turns it: a thread its owner starts (start(); shut_down() ends and joins it), or the
owner itself, one run_once() at a time; other threads reach it through what it inherits
(part2/handoff.py: hand(), ask(), complete()). Every deadline is the clock's: on a
VirtualClock time moves only in advance(), which wakes the loop; no one sleeps.
"""
import heapq
import itertools
import os
import select
import socket

from part2.calls import reason_of
from part2.clock import RealClock
from part2.handoff import HandOff
from part2.hooks import MANAGED_LOG, call_back

READ, WRITE = select.POLLIN, select.POLLOUT   # epoll's own bits are the same
TROUBLE = select.POLLHUP | select.POLLERR      # reported whatever is asked: ready both ways
SELECT_MAX = 3600.0       # seconds one select() may wait (epoll's limit is weeks); then it looks on
INBOX_SIZE = 256 * 1024   # bytes one recv_into() may bring: the loop's one buffer, read in turn


class Poller:
    """The kernel's readiness queue, asked once a turn: epoll where there is one, else poll()
    (neither has select()'s limit at descriptor 1023); for each socket watched, its handler."""

    def __init__(self, epoll=hasattr(select, "epoll")):
        self.epoll = epoll
        self.queue = select.epoll() if self.epoll else select.poll()
        self.watched = {}   # descriptor -> (socket, handler)
        # poll(timeout): [(descriptor, events)] of the sockets ready, waiting at most timeout
        # seconds; epoll's own, with no call of ours in between (poll() counts milliseconds)
        self.poll = self.queue.poll if self.epoll else self._poll_in_milliseconds

    def register(self, sock, events, handler):
        self.queue.register(sock.fileno(), events)
        self.watched[sock.fileno()] = (sock, handler)

    def modify(self, sock, events):
        self.queue.modify(sock.fileno(), events)

    def unregister(self, sock):
        """Watched no more (one never watched: nothing to do; one closed: forgotten)."""
        fd = sock.fileno()
        if fd < 0:   # closed: the kernel has forgotten it already
            for fd, (watched, _) in list(self.watched.items()):
                if watched is sock:
                    del self.watched[fd]
        elif self.watched.pop(fd, None) is not None:
            self.queue.unregister(fd)

    def _poll_in_milliseconds(self, timeout):
        return self.queue.poll(timeout * 1000)

    def close(self):
        for sock, _ in list(self.watched.values()):
            sock.close()   # what an owner left open: closed, never leaked
        self.watched.clear()
        if self.epoll:
            self.queue.close()


class Timer:
    """One deadline on the loop's clock; cancel() keeps it from firing."""
    __slots__ = ("when", "function", "cancelled")

    def __init__(self, when, function):
        self.when, self.function, self.cancelled = when, function, False

    def cancel(self):
        self.cancelled = True


class Loop(HandOff):
    """A poller, a heap of deadlines, and the turn that serves them (see the module's map).

    What a handler registered with watch() (a listener) or a Transport's protocol may rely
    on: it is called on the loop's thread; after_reads(function) has function() called
    once the turn's reads are over (a set places what they gathered); queue_callback()
    makes a callback after the turn's work, with no state half changed; an exception in
    any of them is logged and counted (handler_errors), and the turn goes on."""
    counters = {"turns": 0, "handler_errors": 0}
    # turns           turns' work run; bumped at the end of each
    # handler_errors  handlers, timers or handed functions that raised; logged, the turn went on

    def __init__(self, clock=None):
        super().__init__()   # self.counted: the Counted objects it owns, woken as a turn ends
        self.clock = clock or RealClock()
        self.poller = Poller()
        self.poller.register(self._wake_out, READ, self._woken)
        self.inbox = memoryview(bytearray(INBOX_SIZE))   # every recv_into(): read, then given
        self._timers = []         # heap of (when, sequence, Timer)
        self._sequence = itertools.count()   # orders timers of the same instant as they were set
        self._after_reads = []    # functions to call once this turn's reads are over
        self._sending = []        # transports whose bytes this turn's send phase sends
        self._callbacks = []      # (owner, function, args) for the end of the turn
        self.gathering = False    # reads, or placing what they gathered: a write waits to be sent
        self.calling_back = False   # the turn's callbacks are being made
        self.clock.watch(self)

    # -- what the loop's own objects use --

    def watch(self, sock, events, handler):
        """handler(events) whenever sock is ready (a listener: a transport watches itself)."""
        self.poller.register(sock, events, handler)

    def unwatch(self, sock):
        self.poller.unregister(sock)

    def at(self, when, function):
        """Call function() in the first turn whose clock time is at or past `when`."""
        timer = Timer(when, function)
        heapq.heappush(self._timers, (when, next(self._sequence), timer))
        return timer

    def after_reads(self, function):
        """function() once this turn's reads are over, before anything else in it (listed
        after that, in the next turn's)."""
        self._after_reads.append(function)

    def queue_callback(self, owner, function, *args):
        self._callbacks.append((owner, function, args))

    # -- the turn --

    def run_once(self, block=True):
        """One turn's work, then (unless a callback of the turn before is being made, whose
        phase makes them next) its callbacks. With block=False, or work already waiting,
        select() does not wait; every step is inline, a call saved per turn."""
        clock, timers = self.clock, self._timers
        self.working = True
        timeout = 0
        if block and not (self._handed or self._after_reads or self._sending):   # else no wait
            while timers and timers[0][2].cancelled:
                heapq.heappop(timers)
            timeout = SELECT_MAX
            if timers:
                wait = timers[0][0] - clock.now()
                timeout = 0 if wait <= 0 else min(wait, SELECT_MAX) if clock.passes \
                    else SELECT_MAX   # a clock that jumps: advance() wakes the loop
        self.gathering = True
        watched = self.poller.watched
        for fd, events in self.poller.poll(timeout):
            if (entry := watched.get(fd)) is None:   # closed by a handler before it in the turn
                continue
            try:
                entry[1](events | READ | WRITE if events & TROUBLE else events)
            except Exception:   # a bug in a handler: logged, counted; the turn goes on
                self._raised()
        if self._after_reads:
            after_reads, self._after_reads = self._after_reads, []
            for function in after_reads:
                try:
                    function()
                except Exception:
                    self._raised()
        self.gathering = False
        while self._handed:
            function, args = self._handed.popleft()
            self._safely(function, *args)
        if timers and timers[0][0] <= (now := clock.now()):
            while timers and timers[0][0] <= now:
                timer = heapq.heappop(timers)[2]
                if not timer.cancelled:
                    self._safely(timer.function)
        if self._sending:
            sending, self._sending = self._sending, []
            for transport in sending:
                try:
                    transport.flush()
                except Exception:
                    self._raised()
        self.working = False
        self.turns += 1
        if self.calling_back:   # a call made in a callback: the callback phase makes them next
            return
        if self._callbacks or self.finished:
            self._end_turn()
            return
        for counted in self.counted:   # _end_turn()'s last step, inline: the common turn's end
            if counted.waiters:
                with counted._changed:
                    counted._changed.notify_all()

    def _safely(self, function, *args):
        try:
            function(*args)
        except Exception:   # a bug in a handler: logged, counted; the turn and the loop go on
            self._raised()

    def _raised(self):
        """In an except block: a handler raised; the first is logged, each is counted."""
        if not self.handler_errors:
            MANAGED_LOG.exception("a handler on the loop raised; the turn went on")
        self.handler_errors += 1

    def _end_turn(self):
        """The turn's callbacks (and those the turns they make queue), then its completions,
        then its hooks' wake-ups."""
        self.calling_back = True
        try:
            while self._callbacks:
                callbacks, self._callbacks = self._callbacks, []
                for owner, function, args in callbacks:
                    call_back(owner, function, *args)
        finally:
            self.calling_back = False
        finished, self.finished = self.finished, []
        for call in finished:
            call.waiter.release()
        for counted in self.counted:
            if counted.waiters:
                with counted._changed:
                    counted._changed.notify_all()

    # -- the end --

    def _close(self):
        with self._handing:
            self.stopped = True
        while self._handed:   # handed before the end: each finds its owner shut down, and says so
            function, args = self._handed.popleft()
            self._safely(function, *args)
        self._end_turn()
        self.clock.unwatch(self)
        self.poller.close()
        self._wake_in.close()


class Transport:
    """One socket on the loop and everything done to it (asyncio's selector transport).

    It reads what comes (one recv_into() the loop's buffer a turn) and gives it to its
    protocol; write() adds to `out`, the bytes not yet sent, and sends at once when
    nothing was waiting, except while the turn reads and places what they gathered (then
    in its send phase: a turn's replies to a client, or requests to a connection, leave
    in one send); the poller watches for room only while bytes
    are left over. pause() and resume() turn reading off and on; close() closes it, once.
    limit: `out` longer than that after a send means the peer does not read: the protocol
    is told overflowed(). sent(count), if given, hears each send's count (an upstream's
    written requests); when_drained(function, below) calls function() once out is shorter."""

    def __init__(self, loop, sock, protocol, *, connecting=False, limit=None, sent=None):
        self.loop, self.sock, self.protocol = loop, sock, protocol
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):   # a request goes as it is written
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.out = bytearray()
        self.limit, self.sent = limit, sent
        self.connecting = connecting   # a connect under way: its end reads as writable
        self.reading = True            # the protocol wants its bytes
        self.listed = False            # in the loop's send phase of this turn
        self.closed = False
        self.drained = []              # (function, below): told once out is shorter than below
        self.watching = WRITE if connecting else READ   # what the poller watches it for
        loop.poller.register(sock, self.watching, self.ready)

    def ready(self, events):
        """What the poller found: the connect over, bytes to read, room to send."""
        if self.connecting:
            self.connecting = False
            if failed := self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self.end(os.strerror(failed))
                return
            self._watch()
            self.protocol.connected()
            if self.out and not self.closed:   # what was written while it connected
                self.flush()
            return
        if events & READ:
            loop = self.loop
            try:
                count = self.sock.recv_into(loop.inbox)
            except BlockingIOError:
                count = None
            except OSError:   # a reset reads as an EOF
                count = 0
            if count:
                self.protocol.received(loop.inbox[:count])   # the protocol copies what it keeps
            elif count == 0:   # the peer's EOF: nothing more to read; it may still take bytes
                self.reading = False
                self._watch()
                self.protocol.hung_up(None)
                return
        if events & WRITE and not self.closed:
            self.flush()

    def write(self, data):
        if self.closed:
            return
        out = self.out
        if out or self.connecting:   # a send is arranged already
            out += data
        elif self.loop.gathering:   # the turn's send phase sends what its reads wrote, once
            out += data
            if not self.listed:
                self.listed = True
                self.loop._sending.append(self)
        else:   # nothing waits: try to send now
            out += data
            self.flush()

    def flush(self):
        """One send of what waits; then what the poller watches it for."""
        self.listed = False
        out = self.out
        if self.closed or self.connecting or not out:
            return
        try:
            count = self.sock.send(out)
        except BlockingIOError:
            count = 0
        except OSError as error:
            self.end(f"send failed: {reason_of(error)}")
            return
        del out[:count]
        if self.sent is not None and count:
            self.sent(count)
        if self.drained:
            self._tell_drained()
        if not self.closed and (WRITE if out else 0) != self.watching & WRITE:
            self._watch()   # room to send is watched for while bytes are left, limit or not
        if self.limit is not None and len(out) > self.limit and not self.closed:
            self.protocol.overflowed()

    def when_drained(self, function, below):
        """function() after the next send that leaves fewer than `below` bytes unsent."""
        if (function, below) not in self.drained:
            self.drained.append((function, below))

    def _tell_drained(self):
        waiting, self.drained = self.drained, []
        for function, below in waiting:
            if len(self.out) < below and not self.closed:
                function()
            else:
                self.drained.append((function, below))

    def pause(self):
        if self.reading:
            self.reading = False
            self._watch()

    def resume(self):
        if not self.reading:
            self.reading = True
            self._watch()

    def _watch(self):
        if self.closed or self.connecting:
            return
        events = (READ if self.reading else 0) | (WRITE if self.out else 0)
        if events == self.watching:
            return
        poller = self.loop.poller
        if not self.watching:
            poller.register(self.sock, events, self.ready)
        elif events:
            poller.modify(self.sock, events)
        else:
            poller.unregister(self.sock)
        self.watching = events

    def end(self, reason):
        """A send or the connect failed: closed, and the protocol told hung_up(reason)."""
        if not self.closed:
            self.close()
            self.protocol.hung_up(reason)

    def close(self):
        if not self.closed:
            self.closed = True
            self.out = bytearray()
            self.drained = []
            self.loop.unwatch(self.sock)
            self.sock.close()
