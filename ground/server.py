"""ground.server: the threaded server every line server, relay and pool of the house is built
on, and the socket helpers they share. A reader of Part one need not open it, except where
COMMENTARY.md sends them (section 4.2): nothing in a proxy's mechanism reads these counters.

    recv(), ready(), shutdown(), host_and_port(), listener()   socket calls, with the errors
                          each caller would otherwise handle by hand
    Hooks                 counters of real events, and wait_<counter>(n) for each of them
    Server                listen on 127.0.0.1 (port 0), a thread per connection; close() joins
                          every thread and closes every socket
"""
import contextlib
import errno
import math
import os
import select
import socket
import threading
import time

from ground.frames import LineTooLong

CHUNK = 4096             # bytes asked of one recv()
CONNECT_TIMEOUT = 1.5    # seconds a connect to an upstream may take (close() waits at most this)
ACCEPT_BACKOFF = 0.05    # seconds an accept loop rests after accept() fails (out of descriptors)
LISTEN_BACKLOG = 65535   # connects the kernel queues before accept(); it caps this at its own limit
REAP_EVERY = 1024        # threads started between two sweeps of finished ones from close()'s list


def recv(sock, flags=0):
    """One recv(); a reset or a socket shut down by close() reads as EOF (b"")."""
    with contextlib.suppress(OSError):
        return sock.recv(CHUNK, flags)
    return b""


def ready(sock, events=select.POLLIN, timeout=None):
    """True once sock is ready for events within timeout seconds (None: no limit). poll(),
    not select(): select() fails on descriptors above 1023."""
    poller = select.poll()
    poller.register(sock, events)
    return bool(poller.poll(None if timeout is None else math.ceil(timeout * 1000)))


def shutdown(sock, how=socket.SHUT_RDWR):
    """shutdown() that tolerates a peer or a thread that got there first."""
    with contextlib.suppress(OSError):
        sock.shutdown(how)


def host_and_port(addr):
    """(host, port) of an address as getsockname() gives it: IPv4's 2-tuple or IPv6's 4-tuple."""
    if not isinstance(addr, (tuple, list)) or len(addr) not in (2, 4):
        raise ValueError(f"an address is (host, port) or IPv6's 4-tuple, not {addr!r}")
    return tuple(addr[:2])


def listener(addr, reuse_port=False):
    """A listening socket on addr, of the family the address itself says ("::1" is IPv6)."""
    family = socket.getaddrinfo(*host_and_port(addr), type=socket.SOCK_STREAM)[0][0]
    return socket.create_server(addr, family=family, backlog=LISTEN_BACKLOG,
                                reuse_port=reuse_port)


def out_of_descriptors(error):
    return error.errno in (errno.EMFILE, errno.ENFILE)


def turn_away(conn, message):
    """Tell a connection there is no room for it, and close it, reading first what it has
    sent, so the close does not reset the message before its client has read it."""
    with contextlib.suppress(OSError):
        conn.setblocking(False)
        conn.send(message)
        conn.shutdown(socket.SHUT_WR)
        while conn.recv(CHUNK):
            pass
    conn.close()


class Spare:
    """One descriptor held in reserve, so that a server out of descriptors can still accept
    the connection waiting, turn it away and close it. Without it, that client waits in the
    kernel's queue with no answer until a descriptor frees up, and so does the next."""

    def __init__(self):
        self.held = self._take()

    def turn_away_waiting(self, listener, message):
        """Give up the spare, accept the connection waiting, turn it away, take the spare
        again; how many were turned away (0 or 1). An accept with no descriptor fails before
        it looks for a connection, so none may be waiting: then nothing is done."""
        if self.held is None:   # another thread took the descriptor freed last time
            self.held = self._take()
            return 0
        if not ready(listener, timeout=0):
            return 0
        self.held.close()
        try:
            conn, _ = listener.accept()
        except OSError:
            conn = None
        if conn is not None:
            turn_away(conn, message)
        self.held = self._take()
        return conn is not None

    @staticmethod
    def _take():
        try:
            return open(os.devnull, "rb")
        except OSError:
            return None

    def close(self):
        if self.held is not None:
            self.held.close()
            self.held = None


class Hooks:
    """Named counters of real events, and wait_<counter>(n) for each of them.

    Scaffolding: nothing in a proxy's mechanism reads these counters; they exist
    so demo.py and the tests can wait for an event instead of sleeping.
    """
    counters = {}          # name -> start value; each class adds its own
    hook_timeout = 10.0    # seconds a wait_<counter>() may block before it raises

    def __init__(self):
        self._changed = threading.Condition()   # notified by count() on every bump
        self.__dict__.update(self.counters)   # every counter at its start value

    def count(self, name, amount=1):
        """Add `amount` to a counter and wake all waiters."""
        with self._changed:
            setattr(self, name, getattr(self, name) + amount)
            self._changed.notify_all()

    def wait_until(self, ready, what, timeout=None):
        """Block until ready() is true; raise TimeoutError naming `what` if it is not."""
        with self._changed:
            if not self._changed.wait_for(ready, timeout or self.hook_timeout):
                raise TimeoutError(f"gave up waiting for {what}: {self!r}")

    def __getattr__(self, attribute):   # called only for names not found otherwise
        name = attribute[len("wait_"):]
        if attribute.startswith("wait_") and name in self.counters:
            return lambda n, timeout=None: self.wait_until(
                lambda: getattr(self, name) >= n, f"{name} to reach {n}", timeout)
        raise AttributeError(attribute)

    def __repr__(self):
        counters = ", ".join(f"{name}={getattr(self, name)}" for name in self.counters)
        return f"<{type(self).__name__} {counters}>"


class Server(Hooks, contextlib.AbstractContextManager):   # which supplies `with`'s __enter__
    """Listen on 127.0.0.1 (or listen_addr), port 0; run handle(conn) in a thread per connection.

    close() (or leaving a `with` block) shuts every socket down, which wakes any
    thread blocked in recv(), joins every thread, then closes every socket.

    Methods a subclass may override:
      handle(conn)              serve one accepted connection until it ends (every subclass does)
      serve_connection(conn)    runs on the connection's own thread, around handle(); a mixin
                                that must prepare the thread first overrides it and calls super()
      close()                   extend it to release what the subclass holds, then call super()
      spawn(target, *args)      start a thread close() will join; a test may make it fail as a
                                system out of threads does (RuntimeError): the accept loop goes on
      start_accepting()         start the accept loop (ground/workers.py forks its copies first)
    """
    counters = {"connections": 0, "opened": 0}
    # connections  accepted on .addr; bumped by the accept loop
    # opened       opened by this object to its upstream; bumped by connect()
    max_clients = None   # connections served at once (None: no limit); the next is turned away
    # where __init__ listens; None is 127.0.0.1, port 0; a subclass may say ("::1", 0)
    listen_addr = None
    reuse_port = False   # SO_REUSEPORT: copies of this server share its port (ground/workers.py)

    def __init__(self):
        super().__init__()
        # _lock guards the threads and sockets to join and close, `closed`, and any state a
        # subclass shares between threads; close() notifies it, so waiters see `closed`
        self._lock = threading.Condition()
        self._threads = []
        self._sockets = set()
        self.closed = False
        self.serving = 0     # connections being served now, within max_clients
        self.turned_away = 0   # connections told there was no room (max_clients, or no
        # descriptor to serve them with) and closed: not a hook's counter, read by the stats
        self._spare = Spare()   # a descriptor to give up when there are no more
        try:
            self.listen(self.listen_addr or ("127.0.0.1", 0))
        except BaseException:   # a listen that fails leaves nothing open
            self._spare.close()
            raise

    def listen(self, addr):
        """Listen on addr (port 0: a free port, then in .addr) and start accepting."""
        self._listener = listener(addr, self.reuse_port)
        self.addr = self._listener.getsockname()
        self.start_accepting()

    def start_accepting(self):
        self.spawn(self._accept_loop)

    def handle(self, conn):
        """Serve one accepted connection until it ends; each subclass says how."""

    def _accept_loop(self):
        while not self.closed:
            try:
                conn, _ = self._listener.accept()
            except OSError as error:   # close() woke it (then stop), no descriptor, an abort:
                if out_of_descriptors(error) and not self.closed:   # the one waiting is told
                    turned = self._spare.turn_away_waiting(self._listener,
                                                           self.turned_away_message())
                    with self._lock:
                        self.turned_away += turned
                time.sleep(0 if self.closed else ACCEPT_BACKOFF)   # rest a moment, go on
                continue
            self.count("connections")
            if self.max_clients is not None and self.serving >= self.max_clients:
                self.turn_away(conn)
                continue
            try:   # no error ends the loop: a thread that cannot start costs this one connection
                self.track(conn)   # after close(), track() shuts it down at once
                with self._lock:
                    self.serving += 1
                self.spawn(self.serve_connection, conn)
            except Exception:   # RuntimeError, can't start new thread: they free up as clients go
                self._served(conn)
                time.sleep(ACCEPT_BACKOFF)

    def serve_connection(self, conn):
        """handle(conn) on the connection's thread; the connection is closed after, whatever
        happened."""
        try:
            with contextlib.suppress(OSError):   # a peer that vanished mid-talk is owed nothing
                try:
                    self.handle(conn)
                except LineTooLong as error:
                    conn.sendall(b"ERR %s\n" % str(error).encode())
        finally:   # whatever went wrong, the client sees its connection end
            self._served(conn)

    def _served(self, conn):
        with self._lock:
            self.serving -= 1
        self.forget(conn)

    def turn_away(self, conn):
        turn_away(conn, self.turned_away_message())
        with self._lock:
            self.turned_away += 1

    def turned_away_message(self):
        """What a connection turned away is told: nothing here; a pool says it in its
        protocol (redis-server's "max number of clients reached")."""
        return b""

    def spawn(self, target, *args):
        """Start a thread that close() will join."""
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:   # started under the lock, so close() never misses it
            # now and then (not on every accept) forget finished threads; never once close()
            # has begun: it scans the list, and would miss a thread added to a new one
            if len(self._threads) % REAP_EVERY == 0 and not self.closed:
                self._threads = [t for t in self._threads if t.is_alive()]
            thread.start()   # first: a thread that failed to start is not one to join
            self._threads.append(thread)
        return thread

    def track(self, sock):
        """Note a socket for close(); one made after close() is shut down at once."""
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self._sockets.add(sock)
            if self.closed:
                shutdown(sock)
        return sock

    def open_socket_count(self):
        """How many sockets this server holds open now, accepted and opened."""
        with self._lock:
            return len(self._sockets)

    def forget(self, sock):
        """Close a socket whose work is done."""
        with self._lock:
            self._sockets.discard(sock)
            sock.close()

    def connect(self, addr, read_timeout=None):
        """Open a tracked connection to addr (the upstream) within CONNECT_TIMEOUT;
        its reads then wait at most read_timeout seconds (None: as long as it takes)."""
        sock = self.track(socket.create_connection(host_and_port(addr), timeout=CONNECT_TIMEOUT))
        sock.settimeout(read_timeout)
        self.count("opened")
        return sock

    def close(self):
        """Stop accepting, end every conversation, join every thread, close every socket.
        Calling it again does nothing."""
        with self._lock:
            if self.closed:
                return
            for sock in self._sockets:
                shutdown(sock)
            self.closed = True   # only now: a thread that sees it can no longer send anything
            self._lock.notify_all()
        with self._changed:   # hook waiters too (Upstream's gate) must see `closed`
            self._changed.notify_all()
        shutdown(self._listener)   # wakes accept(), which now finds `closed`, and ends
        while alive := [t for t in self._threads if t.is_alive()]:
            for thread in alive:   # joined threads may have spawned others: look again
                thread.join()
        self._listener.close()
        for sock in self._sockets:   # what outlived its handler: pooled, shared sockets
            sock.close()
        self._spare.close()

    def __exit__(self, *exc_info):
        self.close()
