"""part3.redis_server: a private redis-server for Part three's scenarios and
tests. A reader of the lesson need not read this module: it starts a real Redis on
127.0.0.1, talks to it directly for setup, and stops it whatever happened.

    RedisServer        redis-server on a free port, no persistence, in a temporary
                       directory; close() stops it and waits for it;
                       kill_and_restart() crashes it and starts another on its port
    RedisControl       the scenario's own connection to Redis (SET, CLIENT PAUSE)
    read_resp()        one whole RESP reply from a socket, framed by ground.frames.Frames
    redis_and_control()  both, ended as an ExitStack unwinds
"""
import os
import select
import shutil
import socket
import subprocess
import tempfile
import time

from part3 import resp
from scaffolding.kit import free_port
from ground.frames import Frames
from ground.server import Hooks

INSTALL_HINT = ("demo.py --part3 needs redis-server on PATH; install it with "
                "'apt-get install redis-server' (Debian, Ubuntu) or 'brew install redis' (macOS)")


def redis_available():
    return shutil.which("redis-server") is not None


class RedisServer:
    """redis-server on 127.0.0.1, a free port, no persistence, in a temporary directory.

    Ready when its log says so (no polling). close() (or leaving a `with` block)
    stops it with SIGTERM, waits for it to exit (SIGKILL after stop_timeout), and
    removes the directory; it runs even when starting failed half way.
    """
    attempts = 3          # ports tried before giving up (a port taken between probe and bind)
    start_timeout = 10.0  # seconds for "Ready to accept connections" to appear in the log
    stop_timeout = 10.0   # seconds SIGTERM gets before SIGKILL

    def __init__(self):
        self.process, self.log = None, b""
        self._directory = tempfile.TemporaryDirectory(prefix="part3-redis-")
        try:
            for _ in range(self.attempts):
                port = free_port()
                if self._start(port):
                    self.addr = ("127.0.0.1", port)
                    return
                self._stop()
            raise OSError(f"redis-server did not start; its log ends: {self.log[-300:]!r}")
        except BaseException:
            self.close()
            raise

    def _start(self, port):
        """Start redis-server on port; True once its log says it is ready, False if it exited."""
        self.log = b""
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self._directory.name, "--daemonize", "no"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            cwd=self._directory.name)
        deadline = time.monotonic() + self.start_timeout
        output = self.process.stdout.fileno()
        while b"Ready to accept connections" not in self.log:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([output], [], [], remaining)[0]:
                raise TimeoutError(f"redis-server not ready after {self.start_timeout:g} s")
            data = os.read(output, 4096)
            if not data:   # it exited: most likely the port was taken after all
                return False
            self.log = (self.log + data)[-4096:]   # bounded: only the tail is ever shown
        return True

    def _stop(self):
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        process.stdout.close()

    def kill_and_restart(self):
        """SIGKILL redis-server (no goodbye to its clients), then start a new one on the same
        port; its data is gone, as after a crash without persistence."""
        self.process.kill()
        self._stop()
        if not self._start(self.addr[1]):
            raise OSError(f"redis-server did not start again; its log ends: {self.log[-300:]!r}")

    def close(self):
        """Stop redis-server and wait for it; remove its directory. Calling it again does
        nothing."""
        self._stop()
        self._directory.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


class RedisControl:
    """A direct connection to Redis for the scenario's own setup: SET, CLIENT PAUSE."""

    def __init__(self, addr):
        self.sock = socket.create_connection(addr, timeout=Hooks.hook_timeout)
        self.unread = b""

    def command(self, line):
        """Send one inline command; return its whole RESP reply."""
        self.sock.sendall(line.encode() + b"\r\n")
        return read_resp(self)

    def close(self):
        self.sock.close()


def read_resp(reader):
    """One whole RESP reply from reader.sock, keeping what is read past it in reader.unread."""
    frames = Frames(resp.RESP.reply_parser, reader.unread)   # keeps its place: parsed once
    while (reply := frames.take()) is None:
        data = reader.sock.recv(4096)
        if not data:
            raise ConnectionResetError(f"EOF in the middle of a reply: {frames.rest()!r}")
        frames.feed(data)
    reader.unread = frames.rest()
    return reply


def redis_and_control(stack):
    """A private redis-server and a control connection to it, both ended as the stack unwinds."""
    redis = stack.enter_context(RedisServer())
    control = RedisControl(redis.addr)
    stack.callback(control.close)
    return redis, control
