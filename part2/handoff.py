"""handoff: how other threads reach a loop, and the thread that turns it (the base of
loop.Loop, which holds the turn itself).

    HandOff        hand() a function over to run in the loop's next turn; ask() for its
                   result; complete() a blocking call; wake() a select() that waits;
                   start() the loop's thread, run() it, shut_down() to end and join it
    start_thread() the thread a loop turns on, unless its owner starts one itself

Another thread never touches what the loop owns: it hands a function over, and the loop
runs it in its next turn. A blocking call from a thread (complete()) hands its start over
and waits on its own completion; one made in a callback, on the loop's own thread, turns
the loop's work until it is done, as Ocamlnet's synchronous calls do: no turn's work runs
inside another's, and the callbacks those turns queue are made after it, in the one place
callbacks are made. In the middle of a turn's work (an availability callback) such a
call would turn the loop inside itself, so it is refused.
"""
import collections
import socket
import threading

from part2.calls import ManagedError
from part2.hooks import Counted


class HandOff(Counted):
    """The loop's side that other threads see. A subclass provides run_once() and _close(),
    and watches the wake-up socket (_wake_out) with _woken() as its handler."""

    def __init__(self):
        super().__init__(self)
        self._wake_in, self._wake_out = socket.socketpair()   # a byte on it ends a select()
        for sock in (self._wake_in, self._wake_out):
            sock.setblocking(False)
        self._woke = False        # a wake-up byte is on its way: no need for another
        self._handed = collections.deque()   # (function, args) other threads handed over
        self._handing = threading.Lock()     # guards `stopped` against a hand() racing the end
        self.finished = []        # calls completed this turn; their threads wake at its end
        self.thread = None        # the thread that turns it, once started
        self.working = False      # a turn's work is under way (not its callbacks)
        self.stopping = False
        self.stopped = False

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

    def finish(self, call):
        """A call is done: its thread takes its outcome once this turn has ended."""
        call.done = True
        self.finished.append(call)

    def complete(self, call, start):
        """Hand start() to the loop and wait until `call` is done; its outcome. On the loop's
        own thread the loop's work is turned here until then (a call made in a callback, or
        by an owner that turns the loop itself); in the middle of a turn's work it is refused."""
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


def start_thread(target):
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread
