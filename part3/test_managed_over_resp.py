"""Part two's pool with Part three's framing: the socket-free pipeline, a managed client and
ManagedProxy, each framing RESP (part3/resp.py) where Part two's own tests frame lines.
A reply RESP cannot frame is out of step; a client pipelines behind a blocked call; the proxy
answers its own errors in RESP and gives many threads their own values over one connection."""
import contextlib
import random
import socket
import string
import types

import pytest

from conftest import need_redis
from part2.calls import MessageLost, Run
from part2.managed import ManagedClient, ManagedProxy
from part2.managed_demo import in_background, outcome
from part2.pipeline import OutOfStep, Pipeline
from part3.redis_server import RedisControl, read_resp, redis_and_control
from part3.resp import RESP, Resp
from scaffolding import kit
from scaffolding.faults import FaultyUpstream
from ground.server import Hooks


class Sink:
    """A run's sink that keeps nothing: these tests look at what the pipeline raises."""

    def replied(self, run, replies):
        pass

    def failed(self, run, error):
        pass


# --- replies RESP cannot frame ---------------------------------------------------------------

def test_bytes_resp_cannot_frame_are_out_of_step_in_the_socket_free_pipeline():
    core = Pipeline(RESP, lambda run, replies, first: None, True)
    core.queue(Run([b"GET a\r\n"], Sink()))
    with pytest.raises(OutOfStep, match="resp.RESP cannot frame"):
        core.feed(b"a=AAAAAAAAAAAA\n")


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

class Told:
    """What a run's sink was told, in order."""

    def __init__(self):
        self.told = []

    def replied(self, run, replies):
        self.told += [("reply", reply) for reply in replies]

    def failed(self, run, error):
        self.told.append(("failed", type(error).__name__, len(run.requests) - run.answered))


def resp_pipeline(framing):
    return Pipeline(framing, lambda run, replies, first: None, True)


def resp_array(*items):
    return b"*%d\r\n" % len(items) + b"".join(b"$%d\r\n%s\r\n" % (len(i), i) for i in items)


GET_K = resp_array(b"GET", b"k")
HELLO_MAP = b"%1\r\n$6\r\nserver\r\n$5\r\nredis\r\n"
HELLO_ARRAY = b"*2\r\n$6\r\nserver\r\n$5\r\nredis\r\n"


def test_a_run_whose_state_differs_goes_after_the_sync_that_brings_the_connection_to_it():
    core = resp_pipeline(RESP)
    sinks = [Told() for _ in range(3)]
    for sink, state in zip(sinks, [(3, 1, False, None), (3, 1, False, None), (2, 0, False, None)]):
        core.queue(Run([GET_K], sink, state=state))
    assert bytes(core.out) == (resp_array(b"HELLO", b"3") + resp_array(b"SELECT", b"1") +
                               GET_K + GET_K +   # the second: the queue's end is there already
                               resp_array(b"HELLO", b"2") + resp_array(b"SELECT", b"0") + GET_K)
    core.feed(HELLO_MAP + b"+OK\r\n" + b"$3\r\none\r\n" + b"$3\r\ntwo\r\n" + HELLO_ARRAY +
              b"+OK\r\n" + b"$5\r\nthree\r\n")
    assert [sink.told for sink in sinks] == [[("reply", b"$3\r\none\r\n")],
                                             [("reply", b"$3\r\ntwo\r\n")],
                                             [("reply", b"$5\r\nthree\r\n")]]


def test_a_sync_answered_with_an_error_is_out_of_step_and_no_client_sees_its_reply():
    core = resp_pipeline(RESP)
    sink = Told()
    core.queue(Run([GET_K], sink, state=(2, 4, False, None)))
    with pytest.raises(OutOfStep) as raised:
        core.feed(b"-ERR DB index is out of range\r\n" + b"$3\r\nold\r\n")
    assert str(raised.value) == ("the connection could not take a client's state: SELECT was "
                                 "answered -ERR DB index is out of range")
    assert core.lose(MessageLost("out of step")) == 1
    assert sink.told == [("failed", "MessageLost", 1)]


def test_a_run_that_asks_no_state_takes_the_connection_as_it_is_after_the_pools_own_auth():
    core = resp_pipeline(Resp(upstream_password="secret"))
    core.queue(Run([GET_K], Told()))   # a thread's call: no state of its own
    core.queue(Run([GET_K], Told(), state=RESP.fresh_state))   # as the connection was opened
    assert bytes(core.out) == resp_array(b"AUTH", b"secret") + GET_K + GET_K
