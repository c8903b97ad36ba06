"""A pool's room for clients: past its client limit, or out of descriptors, a client gets
redis-server's own refusal ("max number of clients reached") and its connection's end at
once, never a wait in the kernel's queue; the pool serves again as clients leave. Both kinds,
in the process and through `python3 -m part3 serve` with a file limit of its own."""
import contextlib
import os
import resource
import re
import selectors
import socket
import subprocess
import sys
import time

import pytest

from conftest import ROOT
from part3.conftest import POOL_KINDS, array, make_pool

REFUSAL = b"-ERR max number of clients reached\r\n"
ANSWER_WITHIN = 2.0   # seconds every client has for its PONG or its refusal


def limited(pool_kind, redis, clients):
    """The kind's pool, serving `clients` at once."""
    made = make_pool(pool_kind, redis)
    made.max_clients = clients   # read by the accept loop as each connection comes
    return made


@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_past_its_client_limit_a_client_is_refused_at_once_and_served_once_one_leaves(
        redis, clients, pool_kind):
    with limited(pool_kind, redis, 2) as proxy:
        first, second = clients(proxy.addr, 2)
        assert first.ask("PING") == second.ask("PING") == [b"+PONG\r\n"]
        third = clients(proxy.addr)
        assert third.read() == REFUSAL
        assert third.sock.recv(1) == b""
        first.close()
        deadline = time.monotonic() + ANSWER_WITHIN
        while (late := clients(proxy.addr)).ask("PING") != [b"+PONG\r\n"]:   # once it is gone
            assert time.monotonic() < deadline
            late.close()
        assert proxy.turned_away >= 1


@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_clients_that_find_the_pool_out_of_descriptors_get_pong_or_the_refusal_at_once(
        redis, clients, pool_kind):
    """An accept that has begun holds the descriptor it will give (SessionProxy's accept
    thread waits in one): the first client may be served with it, the next ones are refused."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with make_pool(pool_kind, redis) as proxy:
        assert clients(proxy.addr).ask("PING") == [b"+PONG\r\n"]   # its upstream connection
        late = [socket.socket() for _ in range(3)]   # their descriptors taken now, not the pool's
        fillers = []
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 4096), hard))
            with contextlib.suppress(OSError):
                while True:   # every descriptor the process may have, taken
                    fillers.append(open(os.devnull, "rb"))
            answers = []
            for sock in late:
                sock.settimeout(ANSWER_WITHIN)
                sock.connect(proxy.addr)
                sock.sendall(array("PING"))
                answers.append(sock.recv(100))
            assert set(answers) <= {b"+PONG\r\n", REFUSAL} and REFUSAL in answers
        finally:
            for filler in fillers:
                filler.close()
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            for sock in late:
                sock.close()
        assert clients(proxy.addr).ask("PING") == [b"+PONG\r\n"]
        assert proxy.turned_away == answers.count(REFUSAL)


def with_files(count):
    """What a child process runs first: a limit of `count` open files, soft and hard."""
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (count, count))


@pytest.mark.parametrize("kind", ["framed", "managed"])
def test_a_thousand_clients_at_a_pool_of_512_files_each_get_pong_or_the_refusal_at_once(
        redis, kind):
    """Before: about half were served and the rest left in the listen queue, no reply and no
    close, and a new client timed out."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 1200:
        pytest.skip(f"this process may open {hard} files, not the 1,200 the clients need")
    command = subprocess.Popen(
        [sys.executable, "-m", "part3", "serve", "--upstream", f"127.0.0.1:{redis.addr[1]}",
         "--kind", kind, "--listen", "127.0.0.1:0"], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True, preexec_fn=with_files(512))
    sockets = []
    try:
        port = int(re.fullmatch(r"listening on 127\.0\.0\.1:(\d+)\n", command.stdout.readline())[1])
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
        answers = pings(port, 1000, sockets)
        assert set(answers) <= {b"+PONG\r\n", REFUSAL} and len(answers) == 1000
        assert 0 < answers.count(REFUSAL) < 1000
        for sock in sockets:
            sock.close()
        sockets.clear()
        assert pings(port, 1, sockets) == [b"+PONG\r\n"]   # served again, once they have gone
    finally:
        for sock in sockets:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        command.terminate()
        command.communicate(timeout=10)


def pings(port, count, sockets):
    """count clients connected at once, each sending PING: what each got within ANSWER_WITHIN
    (the refusal, read to its end, or PONG); a client that got nothing fails the test."""
    selector = selectors.DefaultSelector()
    got = {}
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setblocking(False)
        sockets.append(sock)
        with contextlib.suppress(OSError):   # one turned away may already be gone
            sock.send(array("PING"))
        got[sock] = b""
        selector.register(sock, selectors.EVENT_READ)
    deadline = time.monotonic() + ANSWER_WITHIN
    while any(not answer.endswith(b"\r\n") for answer in got.values()):
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"{sum(not a for a in got.values())} clients got no answer in time"
        for key, _ in selector.select(remaining):
            with contextlib.suppress(OSError):
                got[key.fileobj] += key.fileobj.recv(100)
            if got[key.fileobj].endswith(b"\r\n"):
                selector.unregister(key.fileobj)
    selector.close()
    return list(got.values())
