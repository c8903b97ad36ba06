"""tcp_proxy: three proxies between clients and a line-protocol server, and the server.

The lesson: a connection pool's checkin is a parse. A pool may lend a connection
to the next borrower only once the last reply has ended, and only the protocol
knows where a reply ends; TCP delivers bytes, not messages.

Map of the module, in reading order (COMMENTARY.md walks it in the same order):

    answer(), read_lines()   the line protocol: GET key -> key=VVVVVVVVVVVV, PING -> PONG
    Upstream                 the server behind every proxy; it frames its input honestly
    Relay                    the pump shared by the two protocol-blind relays
    NaiveProxy               one upstream socket shared by all clients; replies go to the
                             client that wrote last, or to every client
    LineFraming, LINES       where a request and a reply end, and which replies can answer
                             a request
    OutOfStep                what an upstream that said what no request asked for raises
    FramedProxy              a pool: one borrow per request, checked back in when the
                             reply is over, judged by its framing or by a silence; with
                             the framing it refuses any connection that is out of step
    PassthroughProxy         one upstream connection per client; the layer-4 baseline

What they stand on, in ground/ (scaffolding a Part-one reader need not open, but where
COMMENTARY.md sends them): ground/server.py's Server, a thread per connection, whose
close() joins every thread and closes every socket, and its Hooks: every object counts
events in named counters (see each class's `counters`) and offers wait_<counter>(n), which
blocks until that counter reaches n, so demo.py sequences every step on them instead of
sleeping; ground/frames.py's Frames, the loop every reader in the house frames with.

The order a request takes through FramedProxy:
    client bytes -> requests() (the framing says where each ends) -> refusal() -> exchange():
    checkout() (a quiet idle connection, or a new one) -> sendall -> read_reply() -> in_step()
    -> checkin() -> the reply to the client
"""
import collections
import contextlib
import itertools
import queue
import socket
import threading

from ground.frames import MAX_LINE, Frames, LineEnd, LineTooLong
from ground.server import CHUNK, Server, host_and_port, ready, recv, shutdown
from ground.session import Session

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


def loggable(line):
    """A log's copy of a line: its first LOG_LINE_MAX bytes, as text."""
    return line[:LOG_LINE_MAX].decode("utf-8", "replace")



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

class LineFraming:
    """The toy protocol as the pool reads it: where a request and a reply end, which
    replies can answer a request, what it refuses, and how it writes an error.
    FramedProxy takes any object with these names."""
    max_reply = MAX_LINE   # a longer reply is a peer out of step, not a reply

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

    def reply_parser(self):
        """What reads one reply as it grows: it searches only bytes it has not seen (no line is
        passed on in pieces: one past MAX_LINE is out of step)."""
        return LineEnd().size

    def request_size(self, buffer):
        """The length of the whole request line at the start of buffer, None if it has not
        ended; a b"\\r" before its end, or MAX_LINE bytes and no end, is a ValueError."""
        return self.request_parser()(buffer)

    def request_parser(self):
        """What reads one request: a b"\\r" inside the line, or MAX_LINE bytes and no end, is a
        ValueError, so no byte the upstream might read as a line's end is ever sent."""
        return LineEnd(strict=True).size

    def refusal(self, request):
        """Why this request may not reach a pooled connection, or None: an empty one never does."""
        return "an empty request" if not request.strip() else None

    def session(self, lender=None):
        """What a pool that keeps sessions (Part two's) keeps of one client: nothing."""
        return Session(self, lender)

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
    (an empty request), and how an error is written; a client whose bytes cannot be
    framed gets that error, and nothing after it is read.
    The deadlines, each costing the client an error in the protocol's form: the upstream
    silent for reply_timeout (5 s) mid-reply; no connection free for a borrower within
    checkout_timeout (5 s).

    Methods a subclass may override (the demo's scenarios and Part three's pool do):
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

    def __init__(self, upstream_addr, pool_cap=1, release="framed", release_timeout=0.05,
                 framing=LINES, reply_timeout=5.0, checkout_timeout=5.0):
        if release not in ("framed", "timeout"):
            raise ValueError(f"release is 'framed' or 'timeout', not {release!r}")
        host_and_port(upstream_addr)   # a bad address is refused before anything starts
        self.upstream_addr = upstream_addr
        self.pool_cap = pool_cap
        self.framing = framing
        self.release = release
        self.release_timeout = release_timeout
        self.reply_timeout = reply_timeout
        self.checkout_timeout = checkout_timeout
        self.idle = []     # connections checked in, ready to lend; guarded by _lock, which
        self.open = 0      # checkin() notifies; open: idle or lent, never above pool_cap
        super().__init__()   # last: it starts accepting

    def handle(self, client):
        for request in self.requests(client):
            refusal = self.framing.refusal(request)   # the toy protocol's: an empty request
            if refusal:
                client.sendall(self.framing.error(f"tcp-proxy: {refusal}"))
            else:
                client.sendall(self.exchange(request))

    def requests(self, client):
        """Yield each whole request the client sends, in order, however its writes cut or
        join them; return at EOF, or once the framing finds bytes no request is (the client
        is told why: nothing after them can be framed)."""
        frames = Frames(self.framing.request_parser)
        try:
            while data := recv(client):
                frames.feed(data)
                while (request := frames.take()) is not None:
                    yield request
        except ValueError as error:   # only the framing's: an exchange's are not raised here
            client.sendall(self.framing.error(str(error)))

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

    def read_reply(self, sock, buffer=b""):
        """Read one reply; return it and the bytes read past its end. (`buffer`: bytes read
        earlier, scaffolding.faults.TrustingPool's.) A reply longer than the framing keeps
        is out of step.

        The load-bearing method: what it returns is what the client gets, and
        where it stops is where the pool believes the upstream has finished.
        """
        if self.release == "framed":   # over when the framing finds the reply's end
            frames = Frames(self.framing.reply_parser, buffer)
            try:
                while (reply := frames.take()) is None:
                    if len(frames.unread) > (longest := self.framing.max_reply):
                        raise OutOfStep(f"out of step: a reply longer than {longest} bytes")
                    if frames.unread:
                        self.count("partial_replies")
                    frames.feed(more_of_reply(sock))
            except ValueError as error:   # bytes no reply starts with: the upstream is out of step
                raise OutOfStep(f"out of step: {error}") from None
            return reply, frames.rest()
        # "timeout": over when the upstream, once it has begun, says nothing for release_timeout
        buffer = bytearray(buffer)   # grows in place: reading a long reply stays linear
        buffer += more_of_reply(sock)
        while ready(sock, timeout=self.release_timeout):
            buffer += more_of_reply(sock)
        return bytes(buffer), b""

    # The checks a production pool makes before it lends a connection again: the
    # upstream must not have said anything out of turn. scaffolding.faults.TrustingPool switches
    # them off, to show what they prevent; the timeout rule has no parse to check with.

    def in_step(self, request, reply, rest):
        """After a reply: raise OutOfStep if it cannot answer request (the framing's fits());
        return False if bytes came after it (the reply stands, the connection is closed),
        else True."""
        if self.release == "framed" and not self.framing.fits(request, reply):
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

    def __init__(self, upstream_addr, half_close=True):
        host_and_port(upstream_addr)   # a bad address is refused before anything starts
        self.upstream_addr = upstream_addr
        self.half_close = half_close
        super().__init__()   # last: it starts accepting

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
