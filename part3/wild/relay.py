"""part3.wild.relay: a relay that holds one reply, for pointing your own client library at
(the exercise in COMMENTARY.md's "Where the parse lives in the pools you use"). A reader of
the lesson need not read it.

    python3 -m part3.wild relay

starts a private redis-server (no persistence) with two keys, `slow` and `a`, each holding
value-of-<key>, listens on a free port of 127.0.0.1 and prints its address. Each client
connection gets a redis-server connection of its own, as a pool's does. The reply to
`GET slow` is held HOLD seconds; every other reply passes, in order, behind it. A line on
stdout tells each request's first words, each held reply's fate (written, or dropped because
its client hung up first) and each connection's end. Ctrl-C (or SIGTERM) ends it.
"""
import contextlib
import signal
import socket
import threading

from ground.frames import Frames
from ground.server import Server, recv, shutdown
from part3 import resp
from part3.redis_server import INSTALL_HINT, RedisControl, RedisServer, redis_available
from part3.wild.incident import words

HOLD = 2.0                    # seconds the reply to GET slow is held
KEYS = ("slow", "a")          # each set to value-of-<key>


def shown(request_words):
    """A request as the log names it: its first two words, each cut to 30 characters."""
    return " ".join(word[:30].decode("utf-8", "replace") for word in request_words[:2])


class OneReplyHeld(Server):
    """Between your client and redis-server: each reply to GET slow held HOLD seconds."""

    def __init__(self, upstream_addr, hold=HOLD, say=print):
        super().__init__()
        self.upstream_addr, self.hold, self.say = upstream_addr, hold, say
        self.numbers = 0

    def handle(self, client):
        with self._lock:
            self.numbers += 1
            number = self.numbers
        upstream = self.connect(self.upstream_addr)
        gone, asked = threading.Event(), []   # asked: each request's words, oldest first
        replies = self.spawn(self._replies, number, client, upstream, gone, asked)
        frames = Frames(resp.RESP.reply_parser)   # a request array frames like a reply
        self.say(f"connection {number}: opened")
        try:
            while data := recv(client):
                frames.feed(data)
                while (request := frames.take()) is not None:
                    asked.append(words(request))
                    self.say(f"connection {number}: {shown(asked[-1])}")
                    upstream.sendall(request)
        finally:
            gone.set()
            self.say(f"connection {number}: closed by the client")
            shutdown(upstream, socket.SHUT_WR)   # redis-server then hangs up
            replies.join()
            self.forget(upstream)

    def _replies(self, number, client, upstream, gone, asked):
        frames = Frames(resp.RESP.reply_parser)
        while data := recv(upstream):
            frames.feed(data)
            while (reply := frames.take()) is not None:
                request = asked.pop(0)
                held = [word.upper() for word in request[:2]] == [b"GET", b"SLOW"]
                if held and not gone.wait(self.hold) and not self.closed:
                    self.say(f"connection {number}: GET slow's reply written, "
                             f"{self.hold:g} s late")
                elif held:
                    self.say(f"connection {number}: GET slow's reply dropped, its client gone")
                if not gone.is_set():
                    with contextlib.suppress(OSError):
                        client.sendall(reply)


def main(argv):
    if argv:
        print("usage: python3 -m part3.wild relay")
        return 2
    if not redis_available():
        print(INSTALL_HINT.replace("demo.py --part3", "part3.wild relay"))
        return 0
    stop = threading.Event()
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda *_: stop.set())
    with RedisServer() as redis:
        control = RedisControl(redis.addr)
        for key in KEYS:
            control.command(f"SET {key} value-of-{key}")
        control.close()
        with OneReplyHeld(redis.addr, say=lambda line: print(line, flush=True)) as relay:
            host, port = relay.addr
            print(f"relay on {host}:{port}, in front of a private redis-server; keys slow and a; "
                  f"GET slow's reply held {HOLD:g} s (Ctrl-C ends it)", flush=True)
            stop.wait()
    return 0
