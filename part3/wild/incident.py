"""part3.wild.incident: redis-py's 2023 cancelled-reply leak (CVE-2023-28858/28859),
with the real library.

Part three showed the bug's class on the project's own pools. Here the client is
redis-py itself, from the package index, each version in its own virtual
environment (`make wild` makes them): its asyncio client and a pool of one
connection, in front of a private redis-server, with a small relay between them
that holds every reply to GET until the scenario lets exactly one through.

Map of the module, in reading order:

    words(request)      a request's words: redis-py sends each command as a RESP array
                        of bulk strings, framed here by Frames like a reply
    Exchange            one request the relay carried, and what became of its reply
                        ("passed", "held", then "let through" or "dropped")
    Conversation        one client connection: its socket, its own redis-server
                        connection, its exchanges
    HoldingRelay        Server: requests parsed and counted; replies framed
                        by Frames; a reply to GET written only when a credit
                        allows it, the oldest first; replies to anything else pass
    Client              what one redis-py client (a task) asked and what it got
    Reading             scaffolding on the client's side: a task waits for bytes
    Scenario            one run, on one event loop: A cancelled while its reply is
                        held, then B, C, D (`control`: A's reply let through first)
    report(), carriers()   the rows, and the verdict computed from them
    main()              `python -m part3.wild` in a venv: that version's transcript;
                        `python3 -m part3.wild --all` (make wild): every pinned venv's;
                        `--table-row`: one JSON row for part3.wild.table; `--record`:
                        the rows and the relay's log for pictures/draw_wild.py

The order of events in the cancelled scenario (every wait is on a hook):

    A sends GET a ............ the relay parses it (gets = 1); its reply stays held
    A waits to read .......... Reading sees a task parked in the read of the reply
    A is cancelled ........... redis-py 4.5.1 puts the connection back in the pool,
                               the reply to GET a still on its way; 4.5.5 closes it
    B sends GET b ............ gets = 2; the scenario grants one credit, and the
                               relay lets the oldest reply whose client is still
                               there through: on 4.5.1 that is a's, to B
    C, then D ................ the same, one credit each

The control differs in one step: A's reply is let through (released = 1, or dropped
if A's connection is already closed) before B borrows the connection, so redis-py's
own check at checkout sees bytes nobody asked for ("Connection has data") and
opens a new connection.

The transcript is the same bytes on every run: no port, time or id is printed,
nothing sleeps, and a step waits only on the relay's counters, on Reading, or on a
client task's end (which the scenario counts on the relay's hooks).
"""
import asyncio
import collections
import concurrent.futures
import contextlib
import json
import re
import select
import socket
import subprocess
import sys
import threading
from pathlib import Path

from ground.frames import Frames
from ground.server import Hooks, Server, recv, shutdown
from tcp_proxy import more_of_reply
from part3 import resp
from part3.redis_server import INSTALL_HINT, RedisServer, redis_available

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = ("4.5.1", "4.5.5", "8.1.0")   # affected, fixed, the newest the index served (pinned)
KEYS = "abcd"                            # client A asks for a, B for b, ...
STEP_TIMEOUT = 5.0                       # seconds a client task may take once its reply is out
HUNG_UP = select.POLLHUP | select.POLLERR | getattr(select, "POLLRDHUP", 0)


def venv_python(version):
    return ROOT / f".venv-redis-{version}" / "bin" / "python"


def words(request):
    """The words of one request: a RESP array of bulk strings, as redis-py sends them."""
    if not request.startswith(b"*"):
        raise ValueError(f"not a command array: {request[:40]!r}")
    found, position = [], request.index(b"\r\n") + 2
    while position < len(request):
        line_end = request.index(b"\r\n", position)
        start = line_end + 2
        found.append(request[start:start + int(request[position + 1:line_end])])
        position = start + len(found[-1]) + 2
    return found


class Exchange:
    """One request the relay carried, and what became of its reply."""

    def __init__(self, connection, request_words):
        self.connection, self.words = connection, request_words
        self.held = request_words[0].upper() == b"GET"   # only GET's replies wait for a credit
        self.fate = "passed" if not self.held else "held"   # then "let through" or "dropped"

    def name(self):
        """GET a; another command by its first three words (CLIENT SETINFO LIB-VER), not its
        value, which names the version."""
        shown = self.words[:2] if self.held else self.words[:3]
        return " ".join(word.decode("utf-8", "replace") for word in shown)


class Conversation:
    """One client connection: its socket, its own connection to redis-server, its exchanges."""

    def __init__(self, number, client):
        self.number, self.client, self.upstream = number, client, None
        self.exchanges = []                   # every request, in arrival order
        self.unanswered = collections.deque()   # exchanges whose reply has not come back yet
        self.gone = False                     # the client has hung up (set by its reader)


class HoldingRelay(Server):
    """Between redis-py and redis-server: every reply to GET is held until a credit.

    One credit lets one whole reply (framed by Frames) through, the reply to
    the oldest GET still held whose client has not hung up; a held reply whose client
    has hung up is dropped, and spends no credit. Replies to other commands (the
    CLIENT SETINFO newer redis-py sends on connect) pass at once.
    """
    counters = {**Server.counters, "requests": 0, "gets": 0, "credits": 0,
                "released": 0, "dropped": 0, "ended": 0}
    # requests  requests parsed, any command; bumped by the client's reader once sent on
    # gets      GET requests among them; bumped with requests; the scenario waits on it
    #           ("B has asked") before it grants a credit
    # credits   replies to GET the scenario allows; bumped by let_through(); the reply
    #           threads wait on it
    # released  held replies written to their client; bumped by the reply thread after
    #           sendall(); the control waits on released + dropped before B borrows
    # dropped   held replies never written, their client gone; bumped by whoever sees it
    # ended     client tasks that have ended; bumped by the scenario (a task that fails
    #           before it asks is not waited for), read by no relay code

    def __init__(self, upstream_addr):
        super().__init__()
        self.upstream_addr = upstream_addr
        self.conversations = []   # every client connection, numbered from 1 in accept order
        self.held = []            # exchanges held, oldest first; guarded by self._changed
        self.spent = 0            # credits used so far; guarded by self._changed

    def let_through(self):
        """Allow one more held reply through (scaffolding: the scenario's only lever)."""
        self.count("credits")

    def handle(self, client):
        with self._changed:
            conversation = Conversation(len(self.conversations) + 1, client)
            self.conversations.append(conversation)
        conversation.upstream = self.connect(self.upstream_addr)
        replies = self.spawn(self._replies, conversation)
        try:
            self._requests(conversation)
        finally:   # the client has gone: its held replies will never be read
            with self._changed:
                conversation.gone = True
                for exchange in [e for e in self.held if e.connection is conversation]:
                    self._drop(exchange)
            shutdown(conversation.upstream, socket.SHUT_WR)   # redis-server then hangs up
            replies.join()
            self.forget(conversation.upstream)

    def _requests(self, conversation):
        """Parse the client's requests (RESP arrays) and send each on, whole."""
        frames = Frames(resp.RESP.reply_parser)   # an array frames like a reply
        while data := recv(conversation.client):
            frames.feed(data)
            while (request := frames.take()) is not None:
                exchange = Exchange(conversation, words(request))
                with self._changed:   # noted before it is sent: its reply may come back at once
                    conversation.exchanges.append(exchange)
                    conversation.unanswered.append(exchange)
                    if exchange.held:
                        self.held.append(exchange)
                conversation.upstream.sendall(request)
                self.count("requests")
                if exchange.held:
                    self.count("gets")

    def _replies(self, conversation):
        """Frame redis-server's replies; write each when its turn comes."""
        frames = Frames(resp.RESP.reply_parser)
        while data := recv(conversation.upstream):
            frames.feed(data)
            while (reply := frames.take()) is not None:
                with self._changed:
                    exchange = conversation.unanswered.popleft()
                    if exchange.held:
                        self._changed.wait_for(lambda: self._turn(exchange))   # close() notifies
                    if exchange.fate in ("dropped", "held"):   # dropped, or the relay is closing
                        continue
                with contextlib.suppress(OSError):
                    conversation.client.sendall(reply)
                if exchange.held:
                    self.count("released")

    def _turn(self, exchange):
        """True once exchange may be written or never will be. Called with self._changed held."""
        while self.held and self._hung_up(self.held[0].connection):
            self._drop(self.held[0])
        if exchange.fate == "dropped" or self.closed:
            return True
        if self.held[0] is exchange and self.credits > self.spent:
            self.spent += 1
            self.held.pop(0)
            exchange.fate = "let through"
            return True
        return False

    @staticmethod
    def _hung_up(conversation):
        """The client closed its connection: its reader saw the EOF, or the kernel has it
        (a FIN or a reset that arrived before the request now being answered)."""
        if conversation.gone:
            return True
        poller = select.poll()
        poller.register(conversation.client, select.POLLIN | HUNG_UP)
        return any(events & HUNG_UP for _, events in poller.poll(0))

    def _drop(self, exchange):
        self.held.remove(exchange)
        exchange.fate = "dropped"
        self.count("dropped")


# --- the scenarios --------------------------------------------------------------------

class Client:
    """One redis-py task: the key it asked for and what came of it."""

    def __init__(self, name, key):
        self.name, self.key, self.outcome = name, key, None

    def row(self):
        return f"    {self.name}  GET {self.key}  {self.outcome}"

    def value(self):
        """The key whose value this client got, or None if it got no value."""
        match = re.fullmatch(r"got value-of-(\w)", self.outcome or "")
        return match and match.group(1)


def described(error):
    """An exception as the transcript shows it: its type and message, no address in it."""
    message = re.sub(r"127\.0\.0\.1:\d+", "the relay", str(error))
    raised = f"raised {type(error).__name__}"
    return f"{raised}: {message}" if message else raised


class Reading(contextlib.AbstractContextManager):
    """Scaffolding on the client's side: which tasks wait in an asyncio StreamReader for
    bytes (every redis-py version reads its socket through one).

    The relay's `gets` says A's request has arrived, not that A has begun to wait for
    the reply: A may still be inside the asyncio.wait_for() around its write (redis-py
    wraps the write in one when socket_timeout is set, and 8.1.0 sets 5 s by default),
    and Python 3.11's wait_for swallows a cancellation that lands as the write completes.
    A cancelled there reads on, with no cancellation. So A is cancelled only once it
    waits here, in the read of its reply.
    """

    def __init__(self):
        self.tasks = set()    # tasks inside StreamReader._wait_for_data now
        self.began = None     # a future the scenario awaits; set when a task starts to wait
        self._original = asyncio.StreamReader._wait_for_data

    def __enter__(self):
        original, tasks = self._original, self.tasks

        async def wait_for_data(reader, name):
            task = asyncio.current_task()
            tasks.add(task)
            if self.began and not self.began.done():
                self.began.set_result(None)
            try:
                return await original(reader, name)
            finally:
                tasks.discard(task)
        asyncio.StreamReader._wait_for_data = wait_for_data
        return self

    def __exit__(self, *exc_info):
        asyncio.StreamReader._wait_for_data = self._original

    async def wait(self):
        """Return once a task waits for bytes (now, or when one next begins to). With one
        client at work, that is its read: in its own task, or in the inner task some
        versions shield (4.3's pipeline, 4.4.4 and 4.5.4's every command)."""
        while not self.tasks:
            self.began = asyncio.get_running_loop().create_future()
            await asyncio.wait_for(self.began, STEP_TIMEOUT)


class Scenario:
    """One run: a redis-server, the relay, one redis-py pool of one connection."""

    def __init__(self, redis, mode):
        self.redis, self.mode = redis, mode   # mode: "plain" (one GET) or "pipeline"
        self.clients = [Client(name, key) for name, key in zip("ABCD", KEYS)]

    async def run(self, control):
        import redis.asyncio   # the venv's redis-py, the library under test
        loop = asyncio.get_running_loop()
        with HoldingRelay(self.redis.addr) as relay, Reading() as reading, \
                concurrent.futures.ThreadPoolExecutor(1) as waiter:
            self.relay = relay

            async def wait(ready, what):
                await loop.run_in_executor(waiter, relay.wait_until, ready, what)

            host, port = relay.addr
            pool = redis.asyncio.ConnectionPool(host=host, port=port, max_connections=1, **resp2())
            client = redis.asyncio.Redis(connection_pool=pool)
            try:
                first, *rest = self.clients
                task = self.start(client, first)
                await wait(lambda: relay.gets >= 1, "A's GET")
                await reading.wait()   # A waits for its reply, which the relay holds
                task.cancel()
                await self.finish(task, first)
                if control:   # A's reply arrives before B borrows the connection
                    relay.let_through()
                    await wait(lambda: relay.released + relay.dropped >= 1, "A's reply let through")
                for number, other in enumerate(rest, start=2):
                    task = self.start(client, other)
                    await wait(lambda: relay.gets >= number or relay.ended >= number,
                               f"{other.name}'s GET")
                    if not task.done():
                        relay.let_through()
                    await self.finish(task, other)
                self.snapshot = [[(e.name(), e.fate) for e in c.exchanges]
                                 for c in relay.conversations]
            finally:
                await pool.disconnect()
        return self

    def start(self, client, who):
        async def ask():
            if self.mode == "plain":
                return await client.get(who.key)
            pipe = client.pipeline(transaction=False)
            try:
                pipe.get(who.key)
                return (await pipe.execute())[0]
            finally:
                await pipe.reset()
        task = asyncio.ensure_future(ask())
        task.add_done_callback(lambda _: self.relay.count("ended"))
        return task

    async def finish(self, task, who):
        try:
            value = await asyncio.wait_for(asyncio.shield(task), STEP_TIMEOUT)
            who.outcome = f"got {value.decode()}" if value is not None else "got nothing (nil)"
        except asyncio.CancelledError:
            who.outcome = "cancelled while its reply was held"
        except asyncio.TimeoutError:
            task.cancel()
            who.outcome = f"no reply within {STEP_TIMEOUT:g} s"
        except Exception as error:   # what redis-py raised is the finding
            who.outcome = described(error)

    def verdict(self):
        """'mixed up', 'failed' or 'clean', from B, C and D's rows."""
        later = self.clients[1:]
        if any(c.value() not in (None, c.key) for c in later):
            return "mixed up"
        if any(c.value() != c.key for c in later):
            return "failed"
        return "clean"


def resp2():
    """protocol=2 where redis-py takes it (5.0 on; 8.0 made RESP3 the default): the relay
    frames RESP2, Part three's framing. The code under test, the pool and
    Connection.read_response, is the same whichever parser reads the bytes."""
    import inspect
    from redis.asyncio import connection
    base = getattr(connection, "AbstractConnection", connection.Connection)   # 5.0 split it out
    return {"protocol": 2} if "protocol" in inspect.signature(base).parameters else {}


def version():
    import redis
    return redis.__version__


def store(addr):
    """SET each key to value-of-<key>, on a connection of the scenario's own."""
    with socket.create_connection(addr, timeout=Hooks.hook_timeout) as sock:
        frames = Frames(resp.RESP.reply_parser)
        for key in KEYS:
            sock.sendall(f"SET {key} value-of-{key}\r\n".encode())
            while (reply := frames.take()) is None:
                frames.feed(more_of_reply(sock))
            assert reply == b"+OK\r\n", reply


def run(mode, control):
    with RedisServer() as redis:
        store(redis.addr)
        return asyncio.run(Scenario(redis, mode).run(control))


def report(scenario):
    """The rows, then the verdict computed from them."""
    lines = [row.row() for row in scenario.clients]
    for number, exchanges in enumerate(scenario.snapshot, start=1):
        carried = ", ".join(name for name, _ in exchanges)
        lines.append(f"    relay connection {number} carried: {carried}")
    gets = [(number, name, fate) for number, exchanges in enumerate(scenario.snapshot, start=1)
            for name, fate in exchanges if fate != "passed"]
    for fate in ("let through", "dropped", "held"):
        chosen = [f"{name} (connection {number})" for number, name, fate_ in gets if fate_ == fate]
        if chosen:
            label = {"let through": "replies let through",
                     "dropped": "replies dropped, client gone",
                     "held": "replies still held at the end"}[fate]
            lines.append(f"    {label}: {', '.join(chosen)}")
    verdict = scenario.verdict()
    later = scenario.clients[1:]
    if verdict == "mixed up":
        detail = "; ".join(f"{c.name} got {c.value()}'s"
                           for c in later if c.value() not in (None, c.key))
    elif verdict == "failed":
        detail = ", ".join(c.name for c in later if c.value() != c.key) + " got no value"
    else:
        detail = "each of B, C, D got its own value"
    lines.append(f"    verdict: {verdict} ({detail}); {carriers(scenario)}")
    return lines


def carriers(scenario):
    """Which relay connection carried each client's GET, from the relay's log."""
    where = {}   # connection number -> the clients whose GET it carried
    owner = {f"GET {c.key}": c.name for c in scenario.clients}
    for number, exchanges in enumerate(scenario.snapshot, start=1):
        for name, _ in exchanges:
            if name in owner:
                where.setdefault(number, []).append(owner[name])
    if len(where) == 1:
        return f"one connection carried the GETs of {', '.join(*where.values())}"
    return "; ".join(f"connection {number} carried {', '.join(names)}'s"
                     for number, names in where.items())


def transcript():
    """This venv's redis-py through both scenarios, as printed lines."""
    settings = ", ".join(["max_connections=1"] + [f"{k}={v}" for k, v in resp2().items()])
    lines = [f"== redis-py {version()}, asyncio, a pool of one connection ({settings}) =="]
    titles = ((False, "cancelled: A cancelled while its reply is held, then B, C, D, "
                      "one reply let through each"),
              (True, "control: A cancelled, its reply let through before B borrows the connection"))
    for control, title in titles:
        lines.append(f"  {title}")
        lines += report(run("plain", control))
    return lines


def table_row():
    """For part3.wild.table: each mode's verdict and B's row, as one JSON line."""
    row = {"version": version()}
    for mode in ("plain", "pipeline"):
        scenario = run(mode, False)
        row[mode] = {"verdict": scenario.verdict(), "B": scenario.clients[1].outcome}
    return json.dumps(row)


def record():
    """For pictures/draw_wild.py: each scenario's rows and the relay's log, as JSON."""
    found = {"version": version()}
    for control, name in ((False, "cancelled"), (True, "control")):
        scenario = run("plain", control)
        found[name] = {"clients": [[c.name, c.key, c.outcome] for c in scenario.clients],
                       "connections": scenario.snapshot, "verdict": scenario.verdict()}
    return json.dumps(found)


def run_all():
    """Every pinned version's transcript, each from its own venv's python."""
    if not redis_available():
        print(INSTALL_HINT.replace("demo.py --part3", "part3.wild"))
        return 0
    missing = [v for v in VERSIONS if not venv_python(v).exists()]
    if missing:
        print(f"part3.wild: no virtual environment for redis-py {', '.join(missing)}; "
              f"`make wild-venvs` makes them (it needs the package index)")
        return 0
    # all at once (each venv's run has its own redis-server and relay), printed in VERSIONS' order
    runs = [subprocess.Popen([str(venv_python(v)), "-m", "part3.wild"], cwd=ROOT, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE) for v in VERSIONS]
    try:
        finished = [run.communicate(timeout=120) for run in runs]
    finally:
        for run in runs:
            if run.poll() is None:   # communicate() timed out: no run is left behind
                run.kill()
                run.wait()
    for number, (run, (out, err)) in enumerate(zip(runs, finished)):
        if run.returncode:
            sys.stderr.write(err)
            return run.returncode
        print(("\n" if number else "") + out, end="")
    return 0


def main(argv):
    if argv == ["--all"]:
        return run_all()
    if argv == ["--table-row"]:
        print(table_row())
        return 0
    if argv == ["--record"]:
        print(record())
        return 0
    print("\n".join(transcript()))
    leftover = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if leftover:   # every relay and executor thread is joined before its scenario returns
        raise SystemExit(f"part3.wild: threads outlived the scenarios: {leftover}")
    return 0
