"""scaffolding.kit: the demo clients every part's scenarios use. A reader of the
lesson need not read this module: it opens sockets, remembers what they sent, and
formats what they received; nothing in it decides anything a proxy does.

    Client, clients()         named demo clients (A, B, ...) that remember what they sent
    request(), keys_for()     what the clients ask: GET alpha1, alpha2, ...
    ask_in_turn()             send, wait for the line, count the right answers
    run_concurrently()        one thread per client, joined before it returns
    Background, outcome()     a call on a thread of its own, and what it gave as one line
    show(), sent_line(), parsed_line()   how the transcripts print bytes and requests
    free_port()               a port nothing listens on now (for programs that need a number)
"""
import socket
import threading

from ground.server import Hooks
from tcp_proxy import answer

CLIENT_NAMES = "ABCDEFGH"
KEY_WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]
ROUNDS = 3   # requests per client in the many-client scenarios
READ_TIMEOUT = 10.0   # a demo client that waits longer than this has found a bug


class Client:
    """One demo client: a named socket that remembers what it sent."""

    def __init__(self, name, addr, timeout=READ_TIMEOUT):
        self.name, self.sent, self.unread = name, [], b""
        self.sock = socket.create_connection(addr)
        self.sock.settimeout(timeout)

    def send(self, data):
        self.sent.append(data)
        self.sock.sendall(data)

    def read_line(self):
        """The next line, b"\\n" included (at EOF, what is left). A read that times out
        raises and loses nothing: the line can still be read later."""
        while b"\n" not in self.unread:
            data = self.sock.recv(4096)
            if not data:
                line, self.unread = self.unread, b""
                return line
            self.unread += data
        line, self.unread = self.unread.split(b"\n", 1)
        return line + b"\n"

    def read_to_eof(self):
        received, self.unread = self.unread, b""
        while data := self.sock.recv(4096):
            received += data
        return received

    def close(self):
        self.sock.close()


def clients(stack, addr, count, **options):
    """`count` connected clients named A, B, ..., closed when `stack` closes."""
    made = [Client(name, addr, **options) for name in CLIENT_NAMES[:count]]
    for client in made:
        stack.callback(client.close)
    return made


def request(key):
    return b"GET %s\n" % key.encode()


def keys_for(index, rounds=ROUNDS):
    """Client `index` asks for its own word with a round number: alpha1, alpha2, ..."""
    return [f"{KEY_WORDS[index]}{round_number}" for round_number in range(1, rounds + 1)]


def ask_in_turn(client, keys):
    """Send each request and wait for one reply line; return how many were right."""
    right = 0
    for key in keys:
        client.send(request(key))
        right += client.read_line() == answer(request(key)[:-1])
    return right


def run_concurrently(work, *argument_lists):
    """Run work(*arguments) for each argument list on its own thread; return the results."""
    results = [None] * len(argument_lists)

    def run(index, arguments):
        results[index] = work(*arguments)

    threads = [threading.Thread(target=run, args=(index, arguments))
               for index, arguments in enumerate(argument_lists)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def show(data):
    """Bytes as Python writes them, so every b"\\n" is visible, with their count."""
    return f"{data!r} ({len(data)} bytes)"


def sent_line(client):
    return f"  {client.name} sent      " + "  then  ".join(repr(data) for data in client.sent)


def parsed_line(upstream):
    return "  upstream parsed  " + ", ".join(repr(line) for line in upstream.parsed)


def outcome(function, *args, expected=()):
    """What a call gave, as a transcript shows it: the reply line, or the error if
    it is one of the `expected` kinds."""
    try:
        result = function(*args)
    except expected as error:
        return f"{type(error).__name__}: {error}"
    return result.decode().rstrip("\n") if isinstance(result, bytes) else result


class Background:
    """Run outcome(function, *args) on a thread; result() joins it. An error that is
    not `expected` is a bug: result() raises it again."""

    def __init__(self, function, *args, expected=()):
        self._result = None
        self._error = None
        self._thread = threading.Thread(target=self._run, args=(function, args, expected),
                                        daemon=True)
        self._thread.start()

    def _run(self, function, args, expected):
        try:
            self._result = outcome(function, *args, expected=expected)
        except Exception as error:
            self._error = error

    def result(self):
        """The outcome; TimeoutError if the thread is still running after a hook's patience."""
        self._thread.join(Hooks.hook_timeout)
        if self._thread.is_alive():
            raise TimeoutError("gave up waiting for a call in the background")
        if self._error:
            raise self._error
        return self._result


def free_port():
    """A port nothing listens on now. Another process may take it before the caller
    binds it: a caller that must bind it itself tries again with a new one."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
