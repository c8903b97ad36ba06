"""Part one's scaffolding claims, one test each: a hook that times out or does not exist says
so, close() joins every thread, closes every socket and waits out no gate, and workers share one
port. test_tcp_proxy.py holds the toy's own claims; conftest.py fails any test that leaves a
thread or a socket."""
import contextlib
import os
import socket
import threading
import time

import pytest

from scaffolding import kit
import tcp_proxy
from tcp_proxy import FramedProxy, NaiveProxy, PassthroughProxy, Upstream, answer


def connect(stack, addr):
    client = kit.Client("test", addr, timeout=5)
    stack.callback(client.close)
    return client


# --- hooks -------------------------------------------------------------------------

def test_a_hook_that_times_out_names_its_counter_its_target_and_every_counter():
    with Upstream() as upstream:
        with pytest.raises(TimeoutError) as raised:
            upstream.wait_requests(1, timeout=0.05)
    message = str(raised.value)
    assert "requests to reach 1" in message
    assert "<Upstream connections=0, opened=0, bytes_in=0, requests=0, replies=0>" in message


def test_an_unknown_hook_is_an_attribute_error():
    with Upstream() as upstream:
        with pytest.raises(AttributeError):
            upstream.wait_for_godot(1)


# --- close() -----------------------------------------------------------------------

def test_close_joins_every_thread_and_closes_every_socket():
    before = set(threading.enumerate())
    upstream = Upstream()
    proxies = [NaiveProxy(upstream.addr), FramedProxy(upstream.addr, pool_cap=2),
               PassthroughProxy(upstream.addr)]
    with contextlib.ExitStack() as stack:
        for proxy in proxies:
            client = connect(stack, proxy.addr)
            client.send(b"PING\n")
            assert client.read_line() == b"PONG\n"
        assert len(set(threading.enumerate()) - before) >= 10
        for server in proxies + [upstream]:   # clients still connected: close() must cut them
            server.close()
    assert set(threading.enumerate()) == before
    assert all(s.fileno() == -1 for server in proxies + [upstream] for s in server._sockets)


def test_close_does_not_wait_out_a_gate_that_was_never_reached():
    upstream = Upstream(gate=2)
    with contextlib.ExitStack() as stack:
        client = connect(stack, upstream.addr)
        client.send(b"GET alpha\n")
        upstream.wait_requests(1)
        started = time.monotonic()
        upstream.close()   # the writer holds alpha's reply at the gate
        assert time.monotonic() - started < upstream.hook_timeout / 2
        assert client.read_to_eof() == b""


# --- workers -----------------------------------------------------------------------

@pytest.mark.parametrize("proxy_class", [PassthroughProxy, FramedProxy])
def test_workers_share_the_port_each_serves_some_clients_and_close_ends_every_process(proxy_class):
    clients = 40   # the kernel deals them out by a hash: all to one listener has odds of 2**-39
    with Upstream() as upstream:
        with proxy_class(upstream.addr, workers=2) as proxy:
            for n in range(clients):
                with socket.create_connection(proxy.addr, timeout=5) as sock:
                    sock.sendall(b"GET k%d\n" % n)
                    assert next(tcp_proxy.read_lines(sock)) == answer(b"GET k%d" % n).rstrip(b"\n")
            upstream.wait_requests(clients)
            # this process's share; the other served the rest
            assert 0 < proxy.connections < clients
            (other,) = proxy._worker_pids
        with pytest.raises(ChildProcessError):   # reaped by close(): no such child any more
            os.waitpid(other, os.WNOHANG)
