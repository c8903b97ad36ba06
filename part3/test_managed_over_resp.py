"""Part two's pool with Part three's framing: the socket-free pipeline, a managed client and
ManagedProxy, each framing RESP (part3/resp.py) where Part two's own tests frame lines.
A reply RESP cannot frame is out of step; a client pipelines behind a blocked call; the proxy
answers its own errors in RESP and gives many threads their own values over one connection."""
import contextlib
import random
import socket
import string
import types

from conftest import need_redis
from part2.managed import ManagedClient, ManagedProxy, Pipeline, Request
from part2.managed_demo import in_background, outcome
from part3.redis_server import RedisControl, read_resp, redis_and_control
from part3.resp import RESP, Resp
from scaffolding import kit
from scaffolding.faults import FaultyUpstream
from ground.server import Hooks, shutdown
from tcp_proxy import PassthroughProxy


# --- replies RESP cannot frame ---------------------------------------------------------------

def test_bytes_resp_cannot_frame_are_out_of_step_in_the_socket_free_pipeline():
    core = Pipeline(RESP)
    core.queue([Request(None, b"GET a\r\n")])
    settled, misstep = core.feed(b"a=AAAAAAAAAAAA\n")
    assert settled == [] and "resp.RESP cannot frame" in misstep.reason


def test_a_reply_the_framing_cannot_read_is_out_of_step_and_costs_the_call_owed_message_lost():
    # it answers in the toy protocol: no RESP reply ends with a bare \n
    with FaultyUpstream() as upstream:
        client = ManagedClient(upstream.addr, framing=RESP)
        assert outcome(client.call, b"GET a\r\n").startswith(
            "MessageLost: upstream out of step: a reply resp.RESP cannot frame "
            "(a RESP line ended by a bare \\n")
        assert (client.errors, client.replies, client.state) == (1, 0, "down")
        client.shut_down()


# --- a managed client before a real redis-server ----------------------------------------------

def test_a_managed_client_over_resp_pipelines_behind_a_blocked_call_and_matches_replies_in_order():
    need_redis()
    with contextlib.ExitStack() as stack:
        redis, control = redis_and_control(stack)
        values = [b"one", b"two", b"three", b"four"]
        for n, value in enumerate(values):
            assert control.command(f"SET pipelined:{n} {value.decode()}") == b"+OK\r\n"
        client = ManagedClient(redis.addr, framing=RESP)
        stack.callback(client.shut_down)
        # Redis answers nothing behind it until a push
        blocked = in_background(client.call, b"BLPOP gate 0\r\n")
        client.wait_written(1)
        gets = []
        for n in range(4):
            gets.append(in_background(client.call, b"GET pipelined:%d\r\n" % n))
            client.wait_written(n + 2)
        # five on one connection
        assert (client.replies, client.pending_calls, client.connects) == (0, 5, 1)
        assert control.command("LPUSH gate x") == b":1\r\n"
        # outcome() drops the last b"\n"
        assert blocked.result() == "*2\r\n$4\r\ngate\r\n$1\r\nx\r"
        assert [get.result() for get in gets] == [f"${len(value)}\r\n{value.decode()}\r"
                                                  for value in values]


# --- ManagedProxy over RESP -------------------------------------------------------------------

def test_a_managed_proxy_over_resp_writes_its_errors_in_resp_for_a_redis_client():
    upstream = FaultyUpstream()
    upstream.close()
    try:
        with ManagedProxy([(upstream.addr, 1)], framing=RESP) as proxy, \
                socket.create_connection(proxy.addr, timeout=5) as client:
            client.sendall(b"*2\r\n$3\r\nGET\r\n$1\r\na\r\n")
            assert client.recv(4096) == (
                b"-ERR CommunicationError: cannot connect: Connection refused\r\n")
    finally:
        upstream.close()


def test_a_managed_proxy_over_resp_gives_many_threads_their_own_random_values_on_one_connection():
    need_redis()
    with contextlib.ExitStack() as stack:
        redis, control = redis_and_control(stack)
        proxy = stack.enter_context(ManagedProxy([(redis.addr, 1)], framing=RESP))

        def wrong_values(seed):
            """SET random keys to random values directly, then GET each through the proxy; count
            the wrong ones."""
            chooser = random.Random(seed)
            direct = RedisControl(redis.addr)
            wrong = 0
            with (contextlib.closing(direct),
                  socket.create_connection(proxy.addr, timeout=Hooks.hook_timeout) as sock):
                reader = types.SimpleNamespace(sock=sock, unread=b"")
                for _ in range(50):
                    key = f"managed:{seed}:{chooser.randrange(10 ** 9)}"
                    value = "".join(chooser.choices(string.ascii_letters + string.digits,
                                                    k=chooser.randint(1, 40)))
                    assert direct.command(f"SET {key} {value}") == b"+OK\r\n"
                    # an inline command, as redis-server reads them
                    sock.sendall(f"GET {key}\r\n".encode())
                    wrong += read_resp(reader) != f"${len(value)}\r\n{value}\r\n".encode()
            return wrong
        workers = [kit.Background(wrong_values, seed) for seed in range(8)]
        assert [worker.result() for worker in workers] == [0] * 8
        (client,) = proxy.managed_set.clients[0]
        assert (proxy.answered, proxy.failed, client.connects, client.errors) == (400, 0, 1, 0)
        readers = [line for line in control.command("CLIENT LIST").split(b"\n")
                   if b" cmd=get " in line]
        # every GET came over one connection (the direct ones last sent SET)
        assert len(readers) == 1


# --- a client's state, synced in the pipeline --------------------------------------------------

def resp_array(*items):
    return b"*%d\r\n" % len(items) + b"".join(b"$%d\r\n%s\r\n" % (len(i), i) for i in items)


GET_K = resp_array(b"GET", b"k")
HELLO_MAP = b"%1\r\n$6\r\nserver\r\n$5\r\nredis\r\n"
HELLO_ARRAY = b"*2\r\n$6\r\nserver\r\n$5\r\nredis\r\n"


def test_a_request_whose_state_differs_goes_after_the_sync_that_brings_the_connection_to_it():
    core = Pipeline(RESP)
    requests = [Request(None, GET_K, state) for state in
                [(3, 1, False, None), (3, 1, False, None), (2, 0, False, None)]]
    assert core.queue(requests) == (resp_array(b"HELLO", b"3") + resp_array(b"SELECT", b"1") +
                                    GET_K + GET_K +   # the second: the queue's end is there already
                                    resp_array(b"HELLO", b"2") + resp_array(b"SELECT", b"0") +
                                    GET_K)
    settled, misstep = core.feed(HELLO_MAP + b"+OK\r\n" + b"$3\r\none\r\n" +
                                 b"$3\r\ntwo\r\n" + HELLO_ARRAY + b"+OK\r\n" +
                                 b"$5\r\nthree\r\n")
    assert misstep is None and [(request, reply) for request, reply in settled
                                if not request.sync] == [
        (requests[0], b"$3\r\none\r\n"), (requests[1], b"$3\r\ntwo\r\n"),
        (requests[2], b"$5\r\nthree\r\n")]


def test_a_sync_answered_with_an_error_is_out_of_step_and_no_client_sees_its_reply():
    core = Pipeline(RESP)
    request = Request(None, GET_K, (2, 4, False, None))
    core.queue([request])
    settled, misstep = core.feed(b"-ERR DB index is out of range\r\n" + b"$3\r\nold\r\n")
    assert misstep.reason == ("the connection could not take a client's state: SELECT was "
                              "answered -ERR DB index is out of range")
    assert settled == []   # the sync's reply goes to no one, the reply behind it is not read
    assert list(core.lose()) == [request]


def test_a_request_that_asks_no_state_takes_the_connection_as_it_is_after_the_pools_own_auth():
    core = Pipeline(Resp(upstream_password="secret"))
    data = core.queue([Request(None, GET_K)])   # a thread's call: no state of its own
    data += core.queue([Request(None, GET_K, RESP.fresh_state)])   # as the connection was opened
    assert data == resp_array(b"AUTH", b"secret") + GET_K + GET_K


# --- the pool's own syncs ---------------------------------------------------------------------

class CutsAtHello3(PassthroughProxy):
    """A relay in front of redis-server that ends both sides of any connection on which a
    `HELLO 3` goes up (the pool's own sync of a client's protocol), before it arrives."""

    def _one_way(self, source, sink, counter):
        def deliver(data):
            if counter == "forwarded" and b"HELLO\r\n$1\r\n3\r\n" in data:
                shutdown(source)
                shutdown(sink)
                return
            sink.sendall(data)
        self.pump(source, deliver, counter)
        shutdown(sink)


def test_a_connection_lost_with_its_own_sync_owed_fails_the_clients_request_and_nothing_else(
        redis):
    """The sync (HELLO 3) is the pool's own request: its loss tells no client, and the
    client's request behind it gets an error, the loop's handlers raising nothing."""
    with CutsAtHello3(redis.addr) as relay, \
            ManagedProxy([(relay.addr, 1)], framing=RESP) as proxy, \
            socket.create_connection(proxy.addr, timeout=Hooks.hook_timeout) as sock:
        reader = types.SimpleNamespace(sock=sock, unread=b"")
        sock.sendall(b"*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n")   # answered by the pool itself
        assert read_resp(reader).startswith(b"%")
        sock.sendall(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n")   # behind the sync to RESP3
        assert read_resp(reader) == b"-ERR MessageLost: upstream closed the connection\r\n"
        assert proxy.loop.handler_errors == 0
