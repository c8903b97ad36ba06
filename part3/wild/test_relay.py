"""part3.wild.relay: the exercise in COMMENTARY.md's "Where the parse lives in the pools",
with redis-py from the project's venv as "your client", and what the exercise says to look
for checked in the relay's log. Needs redis-server.
"""
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import redis

from conftest import ROOT, need_redis
from part3.redis_server import read_resp
from part3.wild.relay import HOLD

COMMAND = "python3 -m part3.wild relay"
TIMEOUT = 10.0   # seconds the relay may take to start, or to end once told


class Relay:
    """The relay as the commentary's command starts it: its address, then its log."""

    def __enter__(self):
        assert f"`{COMMAND}`" in (ROOT / "COMMENTARY.md").read_text(encoding="utf-8")
        argv = [sys.executable] + COMMAND.split()[1:]
        self.process = subprocess.Popen(argv, cwd=ROOT, text=True, stdout=subprocess.PIPE)
        first = self.process.stdout.readline()
        found = re.search(r"relay on ([\d.]+):(\d+)", first)
        assert found, f"the relay printed no address: {first!r}"
        self.addr = (found.group(1), int(found.group(2)))
        self.lines = queue.Queue()   # every line after the address, as the relay prints it
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        return self

    def _read(self):
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_line(self, line, within=HOLD + TIMEOUT):
        """Read the relay's lines until one ends with `line` (a held reply's fate is told
        once its client has gone or its hold is over), within a deadline; the lines read are
        kept for log()."""
        self.read = getattr(self, "read", [])
        deadline = time.monotonic() + within
        while (left := deadline - time.monotonic()) > 0:
            try:
                self.read.append(self.lines.get(timeout=left))
            except queue.Empty:
                break
            if self.read[-1].endswith(line):
                return
        raise AssertionError(f"the relay never printed {line!r}: {self.read}")

    def log(self):
        """Every line the relay printed after its address, once it has ended."""
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=TIMEOUT)
        self.reader.join(TIMEOUT)
        assert self.process.returncode == 0
        rest = []
        while not self.lines.empty():
            rest.append(self.lines.get())
        return getattr(self, "read", []) + rest

    def __exit__(self, *exc_info):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=TIMEOUT)
        self.reader.join(TIMEOUT)
        self.process.stdout.close()


def connection_of(log, request):
    """The number of the connection that carried request's first arrival."""
    return next(int(m.group(1)) for line in log
                if (m := re.fullmatch(rf"connection (\d+): {request}", line)))


@pytest.mark.slow
def test_your_client_through_the_relay_closes_the_connection_that_owed_a_reply():
    need_redis()
    with Relay() as relay:
        client = redis.Redis(*relay.addr, socket_timeout=0.2)   # its default Retry kept
        with pytest.raises(redis.TimeoutError):
            client.get("slow")
        assert client.get("a") == b"value-of-a"
        client.close()
        relay.wait_line(": GET slow's reply dropped, its client gone")
        log = relay.log()
    first, then = connection_of(log, "GET slow"), connection_of(log, "GET a")
    assert then != first   # GET a went on a new connection ...
    # ... because the one that owed GET slow's reply was closed, so the reply reached no one
    assert f"connection {first}: GET slow's reply dropped, its client gone" in log
    assert sum(line.endswith(": GET slow") for line in log) > 1   # and redis-py sent it again


def test_a_connection_lent_on_with_the_reply_owed_gives_the_next_request_the_held_reply():
    need_redis()
    with Relay() as relay:
        with socket.create_connection(relay.addr, timeout=TIMEOUT) as sock:
            sock.sendall(b"*2\r\n$3\r\nGET\r\n$4\r\nslow\r\n")   # its caller gives up
            sock.sendall(b"*2\r\n$3\r\nGET\r\n$1\r\na\r\n")      # the next borrower's

            class Reader:   # what read_resp() reads from
                unread = b""
            Reader.sock = sock
            assert read_resp(Reader) == b"$13\r\nvalue-of-slow\r\n"   # GET a got slow's
        log = relay.log()
    assert f"connection 1: GET slow's reply written, {HOLD:g} s late" in log
