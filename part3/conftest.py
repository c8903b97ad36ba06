"""What part3's session tests share (test_session_*.py, test_sessions.py): the pools a
client-level test runs through (POOL_KINDS), a raw RESP client, a private redis-server and
its control connection, and the waits and counts the tests read; what test_real_clients.py
and test_client_libraries.py share: both Redis proxies (REDIS_PROXIES) and redis-py as its
users make one. A reader of the lesson need not read it."""
import re
import socket
import time

import pytest

from conftest import need_redis
from part2.managed import ManagedProxy
from part3.resp import RESP
from part3 import redis_server
from part3.framed import SessionProxy

TIMEOUT = 5.0   # seconds a test's client waits for a reply before the test fails

# The pools a client-level test runs through: each keeps its clients' sessions.
POOL_KINDS = ["SessionProxy", "ManagedProxy"]


def make_pool(kind, redis, framing=RESP, pool_cap=4):
    if kind == "ManagedProxy":
        return ManagedProxy([(redis.addr, 1)], framing=framing)
    return SessionProxy(redis.addr, framing=framing, pool_cap=pool_cap)


# Both Redis proxies the project builds: the pool that lends a connection per request, and
# Part two's set, which pipelines every client over one connection (as twemproxy does).
REDIS_PROXIES = {
    "SessionProxy": lambda redis, pool_cap: SessionProxy(redis.addr, framing=RESP,
                                                         pool_cap=pool_cap),
    "ManagedProxy": lambda redis, pool_cap: ManagedProxy([(redis.addr, 1)], framing=RESP),
}


def array(*items):
    """A request as every client library writes it: an array of bulk strings."""
    items = [item if isinstance(item, bytes) else str(item).encode() for item in items]
    return b"*%d\r\n" % len(items) + b"".join(b"$%d\r\n%s\r\n" % (len(i), i) for i in items)


class Client:
    """One raw client connection: send() requests, read() whole RESP replies."""

    def __init__(self, addr, timeout=TIMEOUT):
        self.sock = socket.create_connection(addr, timeout=timeout)
        self.unread = b""   # what redis_server.read_resp() keeps between replies

    def send(self, *requests):
        self.sock.sendall(b"".join(array(*r.split()) if isinstance(r, str) else r
                                   for r in requests))

    def read(self):
        return redis_server.read_resp(self)

    def ask(self, *requests):
        self.send(*requests)
        return [self.read() for _ in requests]

    def close(self):
        self.sock.close()


@pytest.fixture(scope="module")
def redis():
    need_redis()
    with redis_server.RedisServer() as server:
        yield server


@pytest.fixture
def control(redis):
    connection = redis_server.RedisControl(redis.addr)
    connection.command("FLUSHALL")
    yield connection
    connection.close()


@pytest.fixture
def clients():
    """clients(addr, n): n connected Clients, closed at the test's end."""
    made = []

    def connect(addr, count=1):
        made.extend(Client(addr) for _ in range(count))
        return made[-count:] if count > 1 else made[-1]

    yield connect
    for client in made:
        client.close()


def wait_for(condition, what, timeout=TIMEOUT):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what}")
        time.sleep(0.01)


def server_clients(control):
    """redis-server's own list of its clients, the control's own left out."""
    listed = control.command("CLIENT LIST").decode().splitlines()[1:]
    return [line for line in listed if line and " cmd=client|list " not in line]


def direct_and_pooled(redis, control, proxy, requests):
    """The replies to requests directly from redis-server and through the pool, each on a
    fresh connection, with every `id` a client's number (the pool numbers its own) blanked."""
    replies = []
    for addr in (redis.addr, proxy.addr):
        client = Client(addr)
        try:
            replies.append([re.sub(rb"\$2\r\nid\r\n:\d+\r\n", b"$2\r\nid\r\n:N\r\n", reply)
                            for reply in client.ask(*requests)])
        finally:
            client.close()
    return replies


def lost(proxy):
    """What a pool counts of a client served badly: SessionProxy's connections checked in
    dirty or discarded, ManagedProxy's errors made and clients dropped."""
    if isinstance(proxy, ManagedProxy):
        return (proxy.failed, proxy.dropped)
    return (proxy.dirty, proxy.discarded)


def redis_py(proxy, **options):
    import redis as redis_py_module
    return redis_py_module.Redis(host=proxy.addr[0], port=proxy.addr[1], socket_timeout=10,
                                 **options)



def redis_py_client(proxy, **options):
    """redis-py as its users make one: its defaults (RESP3, HELLO 3 as it connects), a
    timeout the suite can wait out."""
    import redis as redis_py
    return redis_py.Redis(host=proxy.addr[0], port=proxy.addr[1], socket_timeout=30, **options)


@pytest.fixture(params=POOL_KINDS)
def pool_kind(request):
    return request.param



@pytest.fixture
def guarded():
    """A private redis-server that asks a password of its clients (upstream-secret)."""
    need_redis()
    with redis_server.RedisServer() as server:
        control = redis_server.RedisControl(server.addr)
        control.command("CONFIG SET requirepass upstream-secret")
        control.command("AUTH upstream-secret")
        try:
            yield server, control
        finally:
            control.close()
