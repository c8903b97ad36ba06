"""framed: SessionProxy, Part one's FramedProxy for a framing whose sessions keep state
(RESP), the pool `python3 -m part3 serve --kind framed` runs. A reader of Part one need not
read it: what it adds to FramedProxy is what a real protocol needs, and Part one's does not.

    SessionProxy   handle() through each client's session and the pool's lender
                   (part3/lending.py), a stream through part3/streams.py; a request or a
                   reply too long to keep in pieces; a client that cannot be framed drained;
                   a deadline for each request's arrival, each whole reply, each idle hold;
                   past its client limit, a client told so

The order a request takes: requests() (framed, within request_timeout) -> next_request() ->
Lending.serve(): the session admits it, the lender lends a connection, exchange() -> the
reply to the client. What FramedProxy's own handle() and requests() did, these do instead.
"""
import contextlib
import socket
import time

from ground.frames import Frames, Piece
from ground.server import CHUNK, ready, shutdown
import part3.streams as streams
from part3.lending import Lending
from part3.resp import RESP
from tcp_proxy import FramedProxy, more_of_reply, OutOfStep


class SessionProxy(FramedProxy):
    """Part one's FramedProxy for a framing whose sessions keep state (RESP): a lender of its
    own (Lending) serves each client's requests as its session says; a request or a reply
    too long to keep goes on in pieces as it arrives; a client whose bytes cannot be framed
    is told why, then read to its end (drain_timeout, 5 s, at most), so that it reads the
    error and not a reset.

    Every lend has an end. A request has request_timeout (10 s) to arrive whole, from its
    first byte, a long one passed on in pieces too; a whole reply has exchange_timeout (10 s),
    however it trickles, besides each silence's (reply_timeout); a connection a client holds
    (MULTI, WATCH) is taken from it after hold_timeout (30 s) without a request, and the rest
    of its transaction refused, saying why.

    Methods a subclass may override: FramedProxy's, and upstream_lost(sock, error) (serve's
    LoggedSessionProxy logs each connection closed after an error)."""
    drain_timeout = 5.0   # seconds a client whose bytes cannot be framed is read, after its error

    def __init__(self, upstream_addr, pool_cap=1, framing=RESP, exchange_timeout=10.0,
                 request_timeout=10.0, hold_timeout=30.0, **options):
        self.exchange_timeout = exchange_timeout
        self.request_timeout = request_timeout
        self.hold_timeout = hold_timeout
        self.lending = Lending(self, framing)   # before any client: FramedProxy starts accepting
        super().__init__(upstream_addr, pool_cap, framing=framing, **options)

    def handle(self, client):
        session = self.framing.session(self.lending)   # what the pool answers, before any borrow
        session.addresses = (client.getpeername(), client.getsockname())
        requests = self.requests(client, session)
        try:
            while (request := self.next_request(client, requests)) is not None:
                self.lending.serve(session, client, request, requests)
        except ValueError as error:   # raised by requests() while a long request's pieces came
            client.sendall(self.framing.error(str(error)))
            self.drain(client)
        finally:
            self.lending.close(session)   # what the client held (a transaction): never lent

    def requests(self, client, session):
        """Yield each whole request the client sends, in order (ValueError if malformed, and if
        one is not whole within request_timeout of its first byte): one too long to keep comes
        as a Head, the rest of it as it arrives, then a Passed. A client that holds a
        connection and sends nothing for hold_timeout loses it (Lending.expire())."""
        frames = Frames(lambda: self.framing.request_parser(passing=True))
        begun = None      # when the request now arriving began
        while True:
            while (request := frames.take()) is not None:
                yield request
            if frames.midway():
                begun = begun or time.monotonic()
                timeout = begun + self.request_timeout - time.monotonic()
            else:
                begun = None
                timeout = self.hold_timeout if session.holds else None
            try:
                if timeout is not None and timeout <= 0:
                    raise TimeoutError
                client.settimeout(timeout)
                data = client.recv(CHUNK)
            except TimeoutError:
                if begun is not None:
                    raise ValueError(f"tcp-proxy: no whole request within "
                                     f"{self.request_timeout:g} s") from None
                self.lending.expire(session, f"held its connection {self.hold_timeout:g} s "
                                             f"without a request")
                continue
            except OSError:   # a reset: as at EOF
                return
            if not data:
                return
            frames.feed(data)

    def next_request(self, client, requests):
        """The client's next whole request; None at EOF, or after one the framing cannot read
        (the client is told why: nothing after it can be framed)."""
        try:
            return next(requests, None)
        except ValueError as error:   # only the framing's: an exchange's are not raised here
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

    def read_reply(self, sock, buffer=b"", passing=None):
        """FramedProxy's read_reply(), within one deadline for the whole reply; (`buffer`: bytes
        read past a sync's replies). A reply longer than the framing keeps is read to its end
        and answered by the error its parser gives (it costs that client), or, given passing(),
        handed on piece by piece as it arrives, and ends with its Passed."""
        deadline = time.monotonic() + self.exchange_timeout
        if self.release == "timeout":
            buffer = bytearray(buffer)
            buffer += self.more_before(sock, deadline)
            while ready(sock, timeout=self.release_timeout):
                buffer += self.more_before(sock, deadline)
            return bytes(buffer), b""
        frames = Frames(lambda: self.framing.reply_parser(bool(passing)), buffer)   # once each
        try:
            while (reply := frames.take()) is None or isinstance(reply, Piece):
                if reply is not None:
                    passing(reply)   # a piece of a long reply, on its way to the client
                    continue
                if frames.unread:
                    self.count("partial_replies")
                frames.feed(self.more_before(sock, deadline))
        except ValueError as error:   # bytes no reply starts with: the upstream is out of step
            raise OutOfStep(f"out of step: {error}") from None
        return reply, frames.rest()

    def more_before(self, sock, deadline):
        """The reply's next bytes, waiting no longer than reply_timeout, nor past the deadline."""
        try:
            if (remaining := deadline - time.monotonic()) <= 0:
                raise TimeoutError("the deadline has passed")
            sock.settimeout(min(self.reply_timeout or remaining, remaining))
            return more_of_reply(sock)
        except TimeoutError:
            if time.monotonic() < deadline:
                raise   # a silence longer than reply_timeout: the socket's own "timed out"
            raise TimeoutError(f"no whole reply within {self.exchange_timeout:g} s") from None

    def close(self):
        self.lending.close_all()   # first: a thread waiting for a connection of its own ends
        super().close()

    def upstream_lost(self, sock, error):
        """An upstream connection is closed after an error (error): a subclass may log it."""

    def turned_away_message(self):
        return self.framing.error("max number of clients reached")   # redis-server's words

    def stream(self, session, client, request, requests):
        """A request that made the client's connection a stream, and the client's requests
        from then on, until it ends (part3/streams.py)."""
        streams.serve(self.lending, session, client, request, requests)

    def in_step(self, request, reply, rest, fits=None):
        """FramedProxy's in_step(), with the session's fit (fits()) where it has one."""
        if self.release == "framed" and not (fits or self.framing.fits)(request, reply):
            raise OutOfStep(f"out of step: a reply of {len(reply)} bytes "
                            f"does not answer {request[:40]!r}")
        return self.release == "timeout" or not rest
