"""tcp_proxy: three proxies between clients and a line-protocol server, and the server.

The lesson: a connection pool's checkin is a parse. A pool may lend a connection
to the next borrower only once the last reply has ended, and only the protocol
knows where a reply ends; TCP delivers bytes, not messages.

Map of the module, in reading order (COMMENTARY.md walks it in the same order):

    answer(), read_lines()   the line protocol: GET key -> key=VVVVVVVVVVVV, PING -> PONG
    Hooks                    scaffolding: counters of real events, and wait_<counter>(n)
    Server                   scaffolding: listen on 127.0.0.1:0, a thread per connection;
                             close() joins every thread and closes every socket
    Upstream                 the server behind every proxy; it frames its input honestly
    Relay                    the pump shared by the two protocol-blind relays
    NaiveProxy               one upstream socket shared by all clients; replies go to the
                             client that wrote last, or to every client
    LineFraming, LINES       where a reply ends, and which replies can answer a request
    FramedProxy              a pool: one borrow per request, checked back in when the
                             reply is over, judged by its framing or by a silence; with
                             the framing it refuses any connection that is out of step
    PassthroughProxy         one upstream connection per client; the layer-4 baseline

The hooks: every object counts events in named counters (see each class's
`counters`) and offers wait_<counter>(n), which blocks until that counter
reaches n and raises TimeoutError, naming every counter, if it does not.
demo.py sequences every step on them instead of sleeping.

The order a request takes through FramedProxy:
    client bytes -> requests() (the framing says where each ends) -> refusal() -> exchange():
    checkout() (a quiet idle connection, or a new one) -> sendall -> read_reply() -> in_step()
    -> checkin() -> the reply to the client
"""
import collections
import contextlib
import itertools
import math
import os
import queue
import select
import signal
import socket
import sys
import threading
import time

MAX_LINE = 64 * 1024     # the longest line anyone here will buffer
CHUNK = 4096             # bytes asked of one recv()
CONNECT_TIMEOUT = 1.5    # seconds a connect to an upstream may take (close() waits at most this)
ACCEPT_BACKOFF = 0.05    # seconds an accept loop rests after accept() fails (out of descriptors)
LISTEN_BACKLOG = 65535   # connects the kernel queues before accept(); it caps this at its own limit
REAP_EVERY = 1024        # threads started between two sweeps of finished ones from close()'s list
LOG_LINE_MAX = 200       # bytes of each line a request log keeps: 1000 lines hold at most 200 kB


# --- the line protocol ------------------------------------------------------

def answer(line):
    """The upstream's reply to one request line (without its b"\\n"), b"\\n" included."""
    command, *keys = line.rstrip(b"\r").split(b" ")
    if command == b"PING" and not keys:
        return b"PONG\n"
    if command == b"GET" and len(keys) == 1 and keys[0]:
        return keys[0] + b"=" + keys[0][:1].upper() * 12 + b"\n"
    return b"ERR expected 'GET <key>' or 'PING', got '%s'\n" % line[:40]


class LineTooLong(ValueError):
    """A peer sent more than MAX_LINE bytes without a b"\\n"."""


def recv(sock, flags=0):
    """One recv(); a reset or a socket shut down by close() reads as EOF (b"")."""
    with contextlib.suppress(OSError):
        return sock.recv(CHUNK, flags)
    return b""


def read_lines(sock, on_bytes=lambda n: None):
    """Yield each line (without b"\\n") however the bytes were cut; return at EOF.

    A recv() may hold half a line or three: lines already buffered are yielded
    without another recv(). Raises LineTooLong instead of buffering past MAX_LINE.
    """
    buffer = b""
    while True:
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            yield line
        if len(buffer) > MAX_LINE:
            raise LineTooLong(f"line longer than {MAX_LINE} bytes")
        if not (data := recv(sock)):
            return
        on_bytes(len(data))
        buffer += data


def more_of_reply(sock):
    """The next bytes of a reply. EOF before the reply's end is an error, and so is
    silence longer than the socket's timeout (TimeoutError)."""
    if not (data := sock.recv(CHUNK)):
        raise ConnectionResetError("upstream closed mid-reply")
    return data


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


def loggable(line):
    """A log's copy of a line: its first LOG_LINE_MAX bytes, as text."""
    return line[:LOG_LINE_MAX].decode("utf-8", "replace")


# --- scaffolding: hooks and the server lifecycle ----------------------------

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
    workers=N (scaffolding, for the bench and the serve command): N processes, each a copy
    of this server listening on the same port (SO_REUSEPORT: the kernel deals connections
    out among them), so a relay uses every core; the counters count this process's share.

    Methods a subclass may override:
      handle(conn)              serve one accepted connection until it ends (every subclass does)
      serve_connection(conn)    runs on the connection's own thread, around handle(); a mixin
                                that must prepare the thread first overrides it and calls super()
      close()                   extend it to release what the subclass holds, then call super()
      spawn(target, *args)      start a thread close() will join; a test may make it fail as a
                                system out of threads does (RuntimeError): the accept loop goes on
    """
    counters = {"connections": 0, "opened": 0}
    # connections  accepted on .addr; bumped by the accept loop
    # opened       opened by this object to its upstream; bumped by connect()
    # where __init__ listens; None is 127.0.0.1, port 0; a subclass may say ("::1", 0)
    listen_addr = None

    def __init__(self, workers=1):
        super().__init__()
        # _lock guards the threads and sockets to join and close, `closed`, and any state a
        # subclass shares between threads; close() notifies it, so waiters see `closed`
        self._lock = threading.Condition()
        self._threads = []
        self._sockets = set()
        self.closed = False
        self.workers = workers
        self._worker_pids = []   # the other workers' processes, ended by close()
        self.listen(self.listen_addr or ("127.0.0.1", 0))

    def listen(self, addr):
        """Listen on addr (port 0: a free port, then in .addr) and start accepting."""
        # the address family from the address itself: "::1" is IPv6
        family = socket.getaddrinfo(*host_and_port(addr), type=socket.SOCK_STREAM)[0][0]
        self._listener = socket.create_server(addr, family=family, backlog=LISTEN_BACKLOG,
                                              reuse_port=self.workers > 1)
        self.addr = self._listener.getsockname()
        for _ in range(self.workers - 1):
            self._start_worker(family)
        self.spawn(self._accept_loop)

    def _start_worker(self, family):
        """Fork a process that accepts on a listener of its own, on the same port, until close()
        sends it SIGTERM; it then closes as this server does."""
        if pid := os.fork():
            self._worker_pids.append(pid)
            return
        try:
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))   # wakes accept(); close() below
            self._listener.close()
            self._listener = socket.create_server(self.addr, family=family, backlog=LISTEN_BACKLOG,
                                                  reuse_port=True)
            self._worker_pids = []
            self._accept_loop()
        finally:
            self.close()
            os._exit(0)

    def handle(self, conn):
        """Serve one accepted connection until it ends; each subclass says how."""

    def _accept_loop(self):
        while not self.closed:
            try:
                conn, _ = self._listener.accept()
            except OSError:   # close() woke it (then stop), or EMFILE, ENFILE, an aborted connect:
                time.sleep(0 if self.closed else ACCEPT_BACKOFF)   # rest a moment, go on
                continue
            try:   # no error ends the loop: a thread that cannot start costs this one connection
                self.track(conn)   # after close(), track() shuts it down at once
                self.count("connections")
                self.spawn(self.serve_connection, conn)
            except Exception:   # RuntimeError, can't start new thread: they free up as clients go
                self.forget(conn)
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
            self.forget(conn)

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
        for pid in self._worker_pids:
            os.kill(pid, signal.SIGTERM)
            os.waitpid(pid, 0)

    def __exit__(self, *exc_info):
        self.close()


# --- the upstream ------------------------------------------------------------

class Upstream(Server):
    """The line-protocol server. It keeps its own framing buffer (read_lines), so
    it is never fooled by how a recv() cut the bytes, only by what they say.

    Scaffolding knobs, used only by demo.py and the tests:
      gate=N        hold every reply until N requests have arrived in total
      split_at=K    write each reply in two parts, its first K bytes, then the rest
      pause(k)      called before the rest of reply k (counted from 1) when
                    split_at is set, else before the whole of it
    """
    counters = {**Server.counters, "bytes_in": 0, "requests": 0, "replies": 0}
    # bytes_in  bytes received from all connections; bumped per recv()
    # requests  request lines parsed; bumped per line, after it joins `parsed`
    # replies   replies written in full; bumped after the last sendall()

    def __init__(self, gate=0, split_at=None, pause=None):
        super().__init__()
        self.gate = gate
        self.split_at = split_at
        self.pause = pause or (lambda number: None)
        self._reply_numbers = itertools.count(1)   # numbers replies for pause()
        self.parsed = collections.deque(maxlen=1000)   # the latest request lines, loggable()

    def handle(self, conn):
        """Read and parse on this thread; a writer thread sends the replies in order,
        so a held reply (gate, pause) never stops the reading. The queue between them
        is bounded: a client that does not read its replies is, in turn, not read."""
        replies = queue.Queue(64)   # a reply that finds it full waits, and so does the reading
        writer = self.spawn(self._write_replies, conn, replies)
        try:
            for line in read_lines(conn, lambda n: self.count("bytes_in", n)):
                self.parsed.append(loggable(line))
                self.count("requests")
                replies.put(answer(line))
        finally:
            replies.put(None)   # end of input: the writer drains what is queued, then stops
            writer.join()

    def _write_replies(self, conn, replies):
        while (data := replies.get()) is not None:   # taken even when the client has gone,
            with contextlib.suppress(OSError):       # so the reader never waits on a full queue
                self.reply(conn, data)

    def reply(self, conn, data):
        if self.gate:   # scaffolding: held until `gate` requests are in, or until close()
            self.wait_until(lambda: self.requests >= self.gate or self.closed, "the gate")
        number = next(self._reply_numbers)
        cut = self.split_at or 0
        conn.sendall(data[:cut])   # nothing at all unless split_at is set
        self.pause(number)
        conn.sendall(data[cut:])
        self.count("replies")


# --- the two protocol-blind relays -------------------------------------------

class Relay(Server):
    """What NaiveProxy and PassthroughProxy share: a pump that copies bytes and
    never looks inside them. They differ only in where the upstream socket comes from."""

    def pump(self, source, deliver, counter):
        """Copy bytes from source to deliver() until EOF, adding their count to counter."""
        with contextlib.suppress(OSError):   # the far side has gone: stop as at EOF
            while data := recv(source):
                deliver(data)   # the whole data path
                self.count(counter, len(data))


class NaiveProxy(Relay):
    """One upstream socket, opened once and shared by every client.

    Client bytes go up as they arrive. Upstream bytes go to the client that wrote
    last (routing="last") or to every client (routing="broadcast"): the only two
    rules possible, because a reply does not say whose request it answers.
    """
    counters = {**Server.counters, "forwarded": 0, "routed": 0}
    # forwarded  client bytes written upstream; bumped by the client's pump
    # routed     upstream bytes handed to clients (once, however many copies)

    def __init__(self, upstream_addr, routing="last"):
        if routing not in ("last", "broadcast"):
            raise ValueError(f"routing is 'last' or 'broadcast', not {routing!r}")
        super().__init__()
        self.routing = routing
        self.clients = []   # connected clients, in arrival order
        self.last = None    # the client whose bytes went up most recently
        self._sending = threading.Lock()   # held by forward() across its write to the upstream
        try:
            self.upstream = self.connect(upstream_addr)
        except BaseException:   # a proxy that cannot reach its upstream leaves nothing open
            self.close()
            raise
        self.spawn(self._downstream)

    def handle(self, client):
        with self._lock:
            self.clients.append(client)
        self.pump(client, lambda data: self.forward(client, data), "forwarded")
        with self._lock:
            self.clients.remove(client)

    def forward(self, client, data):
        with self._sending:   # one chunk goes up whole, and `last` names its sender
            with self._lock:   # held for the name only: route() needs it while the write waits
                self.last = client   # looks like the decision; scenario 3 shows it is not the fix
            self.upstream.sendall(data)

    def _downstream(self):
        self.pump(self.upstream, self.route, "routed")
        shutdown(self.upstream)   # a client that writes from now on fails, and is closed
        with self._lock:   # the upstream is gone: tell every client
            for client in self.clients:
                shutdown(client, socket.SHUT_WR)

    def route(self, data):
        with self._lock:
            targets = list(self.clients) if self.routing == "broadcast" else [self.last]
        for client in filter(None, targets):
            with contextlib.suppress(OSError):   # a client that has gone; the rest get theirs
                client.sendall(data)


# --- the pool that parses ----------------------------------------------------

class Piece(bytes):
    """Bytes of a message too long to keep, as a passing parser lets go of them (Frames)."""


class Head(Piece):
    """A long message's first piece: what a pool judges it by (its command, its reply type)."""


class Passed(bytes):
    """The end of a message handed on in pieces: no bytes of its own (they went before it);
    a framing's own kind says more (resp.Passed: its size and first bytes)."""


class Frames:
    """The one framing loop of the house: bytes in as they arrive, whole messages out.

    feed(data) adds what a read gave; take() returns the next whole message, or None
    while it has not ended; take_all() every whole message now in, and the error that
    stopped it, if one did; rest() is what was read past the messages taken. The
    parser (new_parser() makes one: a size(buffer) that keeps its place) reads each
    byte once, however the reads cut the message. No socket: Part one's threads feed
    it from recv(), Part two's event loop from its turn. A parser with a message()
    makes the message from the bytes kept of it: resp.Parser(overlong="drop") reads one
    too long to keep to its end, deleting from the buffer what it will not read again,
    and gives the error that answers it, so the bytes kept stay bounded. A parser that
    is `fresh` (it reads a message whole in one pass, keeping nothing) has ends(buffer),
    which reads ahead: take_all() cuts every message it found whole with one copy, and
    keeps the parser for the next read; a new one is made after a message take() read.
    One made to pass a long message on (overlong="pass") keeps what it lets go of in
    `passed`: take() gives it piece by piece, a Head, a Piece for each read of it, then a
    Passed at its end (take_all() is for parsers that keep or drop, not pass).
    """

    def __init__(self, new_parser, data=b""):
        self._new_parser, self._parser = new_parser, new_parser()
        self.unread = bytearray(data)   # read, not yet part of a message taken
        self.pieces = collections.deque()   # a long message's pieces, not yet taken

    def feed(self, data):
        self.unread += data

    def take(self):
        """The next whole message (or a piece of a long one), or None; ValueError (the
        parser's) for bytes no message is."""
        if self.pieces:
            return self.pieces.popleft()
        unread, parser, message = self.unread, self._parser, None
        if unread and (size := parser(unread)) is not None:   # a parser says nothing of b""
            message = getattr(parser, "message", bytes)(unread[:size])
            del unread[:size]   # from the front of a bytearray: no copy of the rest
            self._parser = self._new_parser()
        if passed := getattr(parser, "passed", None):   # a long message's pieces, its end last
            self.pieces.extend(passed)
            passed.clear()
            return self.pieces.popleft()
        return message

    def take_all(self):
        """(every whole message now in, in order; the ValueError the parser raised at the
        first bytes no message is, or None). Those bytes stay unread."""
        unread, parser, messages = self.unread, self._parser, []
        if getattr(parser, "fresh", False) and (ends := parser.ends(unread)):
            last, start = ends[-1], 0
            taken = bytes(unread if last == len(unread) else unread[:last])   # one copy for all
            del unread[:last]
            for end in ends:
                messages.append(taken[start:end])
                start = end
        try:
            while unread and (message := self.take()) is not None:   # the rest, step by step
                messages.append(message)
        except ValueError as error:
            return messages, error
        return messages, None

    def rest(self):
        return bytes(self.unread)


class LineEnd:
    """Where one line ends, as a parser Frames can use: it searches only bytes it has
    not seen. strict=True reads a request: a b"\\r" not at the line's end, or
    MAX_LINE bytes with no end, is a ValueError (LineTooLong for the second)."""

    def __init__(self, strict=False):
        self.strict = strict
        self.searched = 0      # bytes known to hold no b"\n"
        self.carriage = -1     # where the line's first b"\r" stands, once one has

    def size(self, buffer):
        end = buffer.find(b"\n", self.searched)
        if self.strict:
            self._check(buffer, len(buffer) if end < 0 else end)
        if end < 0:
            self.searched = len(buffer)
            return None
        return end + 1

    def _check(self, buffer, stop):
        if stop > MAX_LINE and stop == len(buffer):
            raise LineTooLong(f"line longer than {MAX_LINE} bytes")
        if self.carriage < 0:
            self.carriage = buffer.find(b"\r", self.searched, stop)
        if self.carriage >= 0 and buffer.count(b"\r", self.carriage, stop) < stop - self.carriage:
            # a b"\r" with more after it: not a line end, and not a byte to pass on
            raise ValueError(f"a \\r not followed by \\n: {bytes(buffer[:40])!r}")


class Session:
    """What a pool keeps of one client between its requests, and what it answers itself.

    admit(request) is None to send the request on, or the bytes the pool answers with
    (b"": nothing). The toy protocol's session keeps nothing: it refuses what the
    framing's refusal() names. Part three's Redis sessions keep more.

    FramedProxy hands each request to serve(client, request, requests), which here admits
    it and sends it on with one borrow (pool.exchange()); a session that keeps state for its
    client (Redis: a database, a transaction, a subscription) lends connections its own way
    (part3/lending.py). close() runs when the client has gone."""

    def __init__(self, framing, pool=None):
        self.framing, self.pool = framing, pool

    def admit(self, request):
        refusal = self.framing.refusal(request)
        return self.framing.error(f"tcp-proxy: {refusal}") if refusal else None

    def serve(self, client, request, requests):
        answer = self.admit(request)
        client.sendall(self.pool.exchange(request) if answer is None else answer)

    def close(self):
        """The client has gone: the toy's session holds nothing."""


class LineFraming:
    """The toy protocol as the pool reads it: where a request and a reply end, which
    replies can answer a request, what it refuses, and how it writes an error.
    FramedProxy takes any object with these names."""
    max_reply = MAX_LINE   # a longer reply is a peer out of step, not a reply

    def reply_size(self, buffer):
        """The length of the whole reply at the start of buffer, or None if it has not ended."""
        end = buffer.find(b"\n")
        return None if end < 0 else end + 1

    def fits(self, request, reply, framed=False):
        """Whether reply has the whole shape of request's reply. GET k: k, "=", a value of 12
        copies of one byte, b"\n" (a key may hold "=": the value's length still pins it);
        anything else: exactly answer()'s PONG, or its ERR, which quotes this request.
        So a reply another request's answer could pass for is the same bytes as ours.
        A line past MAX_LINE may instead get the upstream's overlong ERR (see read_lines).
        Every byte is checked, framed (a reply a reader framed, as resp's fits() takes) or not."""
        line = request.removesuffix(b"\n")
        if len(line) > MAX_LINE and reply == b"ERR line longer than %d bytes\n" % MAX_LINE:
            return True
        expected = answer(line)
        if expected.startswith((b"ERR ", b"PONG\n")):   # no value: the request says every byte
            return reply == expected
        head = expected[:-13]   # b"k=": the key and the separator, before the value and b"\n"
        value = reply[len(head):-1]   # 12 copies of one byte, if the reply is a value at all
        return reply == head + value + b"\n" and len(value) == 12 == value.count(value[:1])

    def reply_parser(self, passing=False):
        """What reads one reply as it grows: it searches only bytes it has not seen (no line is
        passed on in pieces: one past MAX_LINE is out of step)."""
        return LineEnd().size

    def request_size(self, buffer):
        """The length of the whole request line at the start of buffer, None if it has not
        ended; a b"\\r" before its end, or MAX_LINE bytes and no end, is a ValueError."""
        return self.request_parser()(buffer)

    def request_parser(self, passing=False):
        return LineEnd(strict=True).size

    def refusal(self, request):
        """Why this request may not reach a pooled connection, or None: an empty one never does."""
        return "an empty request" if not request.strip() else None

    def session(self, pool=None):
        """What the pool keeps of one client between its requests (see Session)."""
        return Session(self, pool)

    def error(self, message):
        """An error in the protocol's own form: one ERR line."""
        return b"ERR %s\n" % message.replace("\n", " ").encode()


LINES = LineFraming()


class OutOfStep(Exception):
    """An upstream connection said what no request asked for: it is never lent again."""


class FramedProxy(Server):
    """A pool of at most pool_cap upstream connections; one borrow per request.

    release="framed" checks a connection in once framing says the reply has ended,
    and only if it is in step (in_step(), quiet()); release="timeout" checks it in
    once the upstream has been silent for release_timeout seconds, and checks nothing.
    The framing also says where each request ends, what is refused before any borrow
    (an empty request; for Redis, what the command table does not forward), and how an
    error is written. A client whose bytes cannot be framed gets that error, then is read
    to its end (drain_timeout, 5 s, at most), so it reads the error and not a reset.
    The deadlines, each costing the client an error in the protocol's form: the upstream
    silent for reply_timeout (5 s) mid-reply; the whole reply not in within exchange_timeout
    (10 s), however it trickles; no connection free for a borrower within checkout_timeout (5 s).

    Methods a subclass may override (demo's scenarios and Part two do):
      handle(client)            read the client's requests, write each reply back
      requests(client)          the client's whole requests, in order, as the framing cuts them
      exchange(request)         one request's whole trip: checkout, send, read, check, checkin
      read_reply(sock, buffer)  where the reply ends: the load-bearing method
      in_step(request, reply, rest), quiet(sock)
                                the checks before a connection is lent again
    """
    counters = {**Server.counters, "released": 0, "discarded": 0, "dirty": 0, "partial_replies": 0}
    # released         checkins to the idle list; bumped by checkin()
    # discarded        connections closed after an error or a hang-up; bumped by checkin()
    # dirty            connections closed because the upstream was out of step; bumped by checkin()
    # partial_replies  framed reads that held part of a reply and went back for more
    framing = LINES   # what a subclass that skips __init__ (Part two's ManagedProxy) frames with
    drain_timeout = 5.0   # seconds a client whose bytes cannot be framed is read, after its error

    def __init__(self, upstream_addr, pool_cap=1, release="framed", release_timeout=0.05,
                 framing=LINES, reply_timeout=5.0, exchange_timeout=10.0, checkout_timeout=5.0,
                 workers=1):
        if release not in ("framed", "timeout"):
            raise ValueError(f"release is 'framed' or 'timeout', not {release!r}")
        host_and_port(upstream_addr)   # a bad address is refused before anything starts
        self.upstream_addr = upstream_addr
        self.pool_cap = pool_cap
        self.framing = framing
        self.release = release
        self.release_timeout = release_timeout
        self.reply_timeout = reply_timeout
        self.exchange_timeout = exchange_timeout
        self.checkout_timeout = checkout_timeout
        self.idle = []     # connections checked in, ready to lend; guarded by _lock, which
        self.open = 0      # checkin() notifies; open: idle or lent, never above pool_cap
        super().__init__(workers)   # last: it starts accepting (and any other workers)

    def handle(self, client):
        requests = self.requests(client)
        session = self.framing.session(self)   # what the pool answers itself, before any borrow
        try:
            while (request := self.next_request(client, requests)) is not None:
                session.serve(client, request, requests)   # admitted, then exchange()d
        finally:
            session.close()   # what the client held (a transaction) is closed, never lent

    def next_request(self, client, requests):
        """The client's next whole request; None at EOF, or after one the framing cannot read
        (the client is told why: nothing after it can be framed)."""
        try:
            return next(requests, None)
        except ValueError as error:   # only the framing's: an exchange's errors are not caught here
            client.sendall(self.framing.error(str(error)))
            self.drain(client)
            return None

    def drain(self, client):
        """After the last reply to a client whose bytes cannot be framed: say so (a FIN), then
        read and drop what it still sends until it stops, drain_timeout at most. A socket
        closed with bytes unread sends a reset, and a reset can reach the client before it has
        read the error (a client still writing a long request would see only the reset)."""
        shutdown(client, socket.SHUT_WR)
        deadline = time.monotonic() + self.drain_timeout
        with contextlib.suppress(OSError):   # a reset, or the deadline: either way, done
            while (remaining := deadline - time.monotonic()) > 0:
                client.settimeout(remaining)
                if not client.recv(CHUNK):
                    return

    def requests(self, client):
        """Yield each whole request the client sends, in order, however its writes cut or
        join them; return at EOF. The framing says where each ends (ValueError if malformed);
        one too long to keep comes as a Head, the rest of it as it arrives, then a Passed."""
        frames = Frames(lambda: self.framing.request_parser(passing=True))
        while data := recv(client):
            frames.feed(data)
            while (request := frames.take()) is not None:
                yield request

    def exchange(self, request):
        """Send one request upstream and return its reply, or an error if that fails."""
        sock = None
        outcome = "discarded"
        try:
            sock = self.checkout()
            sock.sendall(request)
            reply, rest = self.read_reply(sock)
            outcome = "released" if self.in_step(request, reply, rest) else "dirty"
            return reply
        except (OutOfStep, OSError) as error:
            outcome = "dirty" if isinstance(error, OutOfStep) else "discarded"
            return self.framing.error(f"upstream: {error}")
        finally:
            if sock:   # a connection that failed or is out of step is never lent again
                self.checkin(sock, outcome)

    def checkout(self):
        """Lend an idle connection that is quiet, else open one below the cap, else wait
        (checkout_timeout at most: TimeoutError)."""
        with self._lock:
            if not self._lock.wait_for(lambda: self.idle or self.open < self.pool_cap
                                       or self.closed, wait := self.checkout_timeout):
                raise TimeoutError(f"no upstream connection free within {wait:g} s")
            if self.closed:
                raise ConnectionAbortedError("proxy closed")
            while self.idle:   # each one that is not quiet is closed, freeing its slot
                if self.quiet(sock := self.idle.pop()):
                    return sock
            self.open += 1
        try:
            return self.connect(self.upstream_addr, self.reply_timeout)
        except BaseException:   # whatever the error (OSError, a bad address's ValueError)
            self.checkin(None, "discarded")   # the slot we reserved is free again
            raise

    def checkin(self, sock, outcome):
        """Park a connection whose exchange was "released"; close it if the outcome is
        "discarded" or "dirty". The outcome names the counter it bumps."""
        with self._lock:
            if outcome == "released":
                self.idle.append(sock)
            else:
                self.open -= 1
                if sock:   # None after a connect that failed: only its slot to free
                    self.forget(sock)
            self._lock.notify()
        self.count(outcome)

    def read_reply(self, sock, buffer=b"", passing=None):
        """Read one reply; return it and the bytes read past its end. (`buffer`: bytes read
        earlier: past a sync's replies, or scaffolding.faults.TrustingPool's.) A reply longer
        than the framing keeps is out of step, unless its parser reads it to its end and
        gives the error that answers it (RESP's does: it costs that client), or, given
        passing(), hands it on piece by piece as it arrives, and returns its Passed end.

        The load-bearing method: what it returns is what the client gets, and
        where it stops is where the pool believes the upstream has finished.
        """
        # for the whole reply, however it trickles
        deadline = time.monotonic() + self.exchange_timeout
        if self.release == "framed":   # over when the framing finds the reply's end
            frames = Frames(lambda: self.framing.reply_parser(bool(passing)), buffer)   # once each
            try:
                while (reply := frames.take()) is None or isinstance(reply, Piece):
                    if reply is not None:
                        passing(reply)   # a piece of a long reply, on its way to the client
                        continue
                    if len(frames.unread) > (longest := self.framing.max_reply):
                        raise OutOfStep(f"out of step: a reply longer than {longest} bytes")
                    if frames.unread:
                        self.count("partial_replies")
                    frames.feed(self.more_before(sock, deadline))
            except ValueError as error:   # bytes no reply starts with: the upstream is out of step
                raise OutOfStep(f"out of step: {error}") from None
            return reply, frames.rest()
        # "timeout": over when the upstream, once it has begun, says nothing for release_timeout
        buffer = bytearray(buffer)   # grows in place: reading a long reply stays linear
        buffer += self.more_before(sock, deadline)
        while ready(sock, timeout=self.release_timeout):
            buffer += self.more_before(sock, deadline)
        return bytes(buffer), b""

    def more_before(self, sock, deadline):
        """more_of_reply(), waiting no longer than reply_timeout, nor past the deadline."""
        try:
            if (remaining := deadline - time.monotonic()) <= 0:
                raise TimeoutError("the deadline has passed")
            sock.settimeout(min(self.reply_timeout or remaining, remaining))
            return more_of_reply(sock)
        except TimeoutError:
            if time.monotonic() < deadline:
                raise   # a silence longer than reply_timeout: the socket's own "timed out"
            raise TimeoutError(f"no whole reply within {self.exchange_timeout:g} s") from None

    # The checks a production pool makes before it lends a connection again: the
    # upstream must not have said anything out of turn. scaffolding.faults.TrustingPool switches
    # them off, to show what they prevent; the timeout rule has no parse to check with.

    def in_step(self, request, reply, rest, fits=None):
        """After a reply: raise OutOfStep if it cannot answer request (as fits() judges, or
        the framing's); return False if bytes came after it (the reply stands, the
        connection is closed), else True."""
        if self.release == "framed" and not (fits or self.framing.fits)(request, reply):
            raise OutOfStep(f"out of step: a reply of {len(reply)} bytes "
                            f"does not answer {request[:40]!r}")
        return self.release == "timeout" or not rest

    def quiet(self, sock):
        """Before a loan: True if the idle connection has said nothing since its last
        reply; else close it (bytes nobody asked for are dirty, an EOF is a hang-up)."""
        if self.release == "timeout" or not ready(sock, timeout=0):
            return True
        self.checkin(sock, "dirty" if recv(sock, socket.MSG_PEEK) else "discarded")
        return False


# --- the layer-4 baseline ----------------------------------------------------

class PassthroughProxy(Relay):
    """One upstream connection per client and a pump each way (what socat does).

    On EOF from one side, half_close=True passes it on with shutdown(SHUT_WR),
    leaving the other direction open; half_close=False ends the whole relay.
    """
    counters = {**Server.counters, "forwarded": 0, "returned": 0, "eofs": 0}
    # forwarded  client bytes written upstream; bumped by the client-to-upstream pump
    # returned   upstream bytes written to clients; bumped by the upstream-to-client pump
    # eofs       EOFs seen on either side; bumped after they are passed on

    def __init__(self, upstream_addr, half_close=True, workers=1):
        host_and_port(upstream_addr)   # a bad address is refused before anything starts
        self.upstream_addr = upstream_addr
        self.half_close = half_close
        super().__init__(workers)   # last: it starts accepting (and any other workers)

    def handle(self, client):
        upstream = self.connect(self.upstream_addr)
        back = self.spawn(self._one_way, upstream, client, "returned")
        self._one_way(client, upstream, "forwarded")
        back.join()
        self.forget(upstream)

    def _one_way(self, source, sink, counter):
        self.pump(source, sink.sendall, counter)
        if self.half_close:
            shutdown(sink, socket.SHUT_WR)   # "no more from this side"; replies still flow
        else:
            shutdown(source)                 # the whole relay ends, in both directions
            shutdown(sink)
        self.count("eofs")
