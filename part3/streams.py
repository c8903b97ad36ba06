"""streams: a client's stream (SUBSCRIBE, MONITOR) through SessionProxy, on a connection of
its own. A reader of Part one need not read it.

    serve()       the request that made the client's connection a stream, and every request
                  after it until the stream ends: a connection of its own, relayed to the
                  client by a thread (StreamRelay) while the client's requests go on it
    StreamRelay   the stream's two directions, and the barrier between them
"""
import contextlib
import threading

from ground.frames import Frames, Head, Passed, rest_of
from ground.server import recv, shutdown
from part3.lending import Refused
from tcp_proxy import OutOfStep


def serve(lending, session, client, request, requests):
    """A request that makes its connection a stream (SUBSCRIBE): a connection of its own,
    relayed to the client by a thread of its own (StreamRelay) while the client's next
    requests go on it, until the stream ends (the last unsubscribe, as the replies count
    them), the client leaves or asks to end; then it is closed, never pooled. Before the
    pool answers anything itself, a barrier: every reply owed has reached the client."""
    try:
        sock = lending.checkout_own()
    except Refused as error:
        session.lost()
        client.sendall(lending.framing.error(f"tcp-proxy: {error}"))
        return
    except OSError as error:
        session.lost()
        client.sendall(lending.framing.error(f"upstream: {error}"))
        return
    relay = None
    try:
        sync = session.sync(lending.carries.get(sock))   # one used before is made ready too
        sock.sendall(b"".join(sync))
        buffer = lending.read_synced(sock, session, sync)   # the stream's first bytes, if any
        relay = StreamRelay(lending.pool, sock, client, session, buffer)
        relay.send(request)
        while session.streams and not relay.ended:
            if (request := lending.pool.next_request(client, requests)) is None:
                return
            answer = session.admit(request)
            for _ in rest_of(requests) if isinstance(request, Head) else ():
                pass   # a long request is never sent on a stream: refused, read to its end
            if answer is None:
                relay.send(request)
                continue
            relay.settle()   # every reply owed before the pool's own answer goes first
            if not session.streams:
                relay.stop()   # the stream has ended (RESET, QUIT): nothing may follow
            relay.write(answer)
            if session.quitting:
                shutdown(client)
                return
    except (OSError, OutOfStep) as error:
        message = lending.framing.error(f"upstream: {error}")
        if relay:
            relay.write(message)
        else:
            client.sendall(message)
    finally:
        if relay:
            relay.stop()
        lending.checkin_own(sock, "discarded")   # a stream's: never lent again
        if session.streams:   # the upstream ended it: the subscriber is told by its end
            session.lost()
            shutdown(client)


class StreamRelay:
    """One stream's two directions (Lending.stream()): its connection's messages to the
    client as they come, each whole (a long one passed on as it arrives), by a thread of its
    own; the client's requests to it; and the barrier between them: after a request that
    settles, and before the pool's own answer, the session's barrier() goes too, and every
    reply owed before it has reached the client once the barrier's own reply is back."""

    def __init__(self, pool, sock, client, session, buffer):
        self.pool, self.sock, self.client, self.session = pool, sock, client, session
        self.writing = threading.Lock()   # each write to the client whole: relayed, or the pool's
        self.settled = threading.Condition()   # barriers sent and seen; the thread's end
        self.sent = self.seen = 0
        self.passing = False    # a long message is going to the client: `writing` is held
        self.ended = False      # the thread has stopped: the stream is over, whoever ended it
        self.stopping = False   # stop() ended it, not the upstream
        sock.settimeout(None)   # a stream is silent for as long as it likes
        self.thread = pool.spawn(self.run, buffer)

    def send(self, request):
        """A request on the stream; one that settles takes a barrier along, and is waited for."""
        barrier = self.session.barrier() if self.session.settles else b""
        with self.settled:
            self.sent += bool(barrier)
            target = self.sent
        self.sock.sendall(request + barrier)
        self.wait(target)

    def settle(self):
        """A barrier alone: every reply owed before it has reached the client once it returns."""
        with self.settled:
            self.sent += 1
            target = self.sent
        self.sock.sendall(self.session.barrier())
        self.wait(target)

    def wait(self, target):
        with self.settled:
            if not self.settled.wait_for(lambda: self.seen >= target or self.ended,
                                         self.pool.exchange_timeout):
                raise TimeoutError(f"no reply to the pool's barrier within "
                                   f"{self.pool.exchange_timeout:g} s")

    def write(self, data):
        with self.writing, contextlib.suppress(OSError):   # a client gone: its handler ends
            self.client.sendall(data)

    def stop(self):
        self.stopping = True
        shutdown(self.sock)   # wakes the thread's recv()
        if self.thread is not threading.current_thread():
            self.thread.join()

    def run(self, buffer):
        frames = Frames(lambda: self.pool.framing.reply_parser(passing=True), buffer)
        try:
            while True:
                while (message := frames.take()) is not None:
                    self.relay(message)
                if not (data := recv(self.sock)):
                    return
                frames.feed(data)
        except (ValueError, OSError) as error:   # out of step, or a client gone
            if not self.stopping and not self.passing:
                self.write(self.pool.framing.error(f"upstream: out of step: {error}"))
        finally:
            if self.passing:
                self.writing.release()
            with self.settled:
                self.ended = True
                self.settled.notify_all()
            if not self.stopping:   # the upstream ended it: so does the client's connection
                shutdown(self.client)

    def relay(self, message):
        """One message, or one piece of a long one: to the client, unless it is the reply to
        the pool's own barrier."""
        if isinstance(message, Head):
            self.writing.acquire()
            self.passing = True
        if self.passing:
            self.client.sendall(message)   # a Passed marker has no bytes: it is the end
            if isinstance(message, Passed):
                self.passing = False
                self.writing.release()
            return
        with self.settled:
            if not (theirs := self.session.pushed(message)):
                self.seen += 1
                self.settled.notify_all()
        if theirs:
            with self.writing:
                self.client.sendall(message)
