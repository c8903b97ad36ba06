"""part3.wild.incident: the relay that holds replies, and the transcript of the real redis-py
through it.

The transcript test needs the pinned venvs `make test` makes (make wild-venvs) and
redis-server; without them it skips, except under CI=true, where it fails. The relay's
own tests need only redis-server, and raw sockets.
"""
import select
import socket
import subprocess
import sys

import pytest

from conftest import ROOT, need_redis, need_wild_venvs
from part3.wild import incident
from part3.redis_server import RedisServer

TIMEOUT = 10.0   # seconds any read below may wait


def command(*words):
    """A request as redis-py sends it: a RESP array of bulk strings."""
    return b"*%d\r\n" % len(words) + b"".join(b"$%d\r\n%s\r\n" % (len(w), w) for w in words)


def pending(sock):
    """True if bytes (or an EOF) are waiting on sock now."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


def read_exactly(sock, size):
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, f"EOF after {data!r}"
        data += chunk
    return data


@pytest.fixture
def redis():
    need_redis()
    with RedisServer() as server:
        incident.store(server.addr)
        yield server


def test_words_of_a_command_array_keep_a_value_with_a_line_break_whole():
    assert incident.words(command(b"GET", b"a")) == [b"GET", b"a"]
    assert incident.words(command(b"ECHO", b"x\r\ny")) == [b"ECHO", b"x\r\ny"]
    with pytest.raises(ValueError, match="not a command array"):
        incident.words(b"GET a\r\n")


def test_relay_lets_one_whole_reply_through_per_credit_on_one_connection(redis):
    with incident.HoldingRelay(redis.addr) as relay, \
            socket.create_connection(relay.addr, TIMEOUT) as client:
        client.sendall(command(b"GET", b"a") + command(b"GET", b"b"))
        relay.wait_gets(2)
        assert not pending(client) and relay.released == 0
        relay.let_through()
        relay.wait_released(1)
        assert read_exactly(client, 17) == b"$10\r\nvalue-of-a\r\n"
        assert not pending(client) and relay.released == 1
        relay.let_through()
        relay.wait_released(2)
        assert read_exactly(client, 17) == b"$10\r\nvalue-of-b\r\n"
        assert (relay.credits, relay.released, relay.dropped) == (2, 2, 0)


def test_relay_passes_a_reply_to_anything_but_get_with_no_credit(redis):
    with incident.HoldingRelay(redis.addr) as relay, \
            socket.create_connection(relay.addr, TIMEOUT) as client:
        client.sendall(command(b"PING"))
        assert read_exactly(client, 7) == b"+PONG\r\n"
        relay.wait_requests(1)   # counted once sent on, which may be after the reply is back
        assert (relay.requests, relay.gets, relay.credits) == (1, 0, 0)


def test_relay_drops_the_held_reply_of_a_client_that_hung_up_and_the_credit_goes_to_the_next(redis):
    with incident.HoldingRelay(redis.addr) as relay:
        with socket.create_connection(relay.addr, TIMEOUT) as first:
            first.sendall(command(b"GET", b"a"))
            relay.wait_gets(1)
        with socket.create_connection(relay.addr, TIMEOUT) as second:
            second.sendall(command(b"GET", b"b"))
            relay.wait_gets(2)
            relay.let_through()
            relay.wait_released(1)
            assert read_exactly(second, 17) == b"$10\r\nvalue-of-b\r\n"
            relay.wait_dropped(1)
            fates = [[(e.name(), e.fate) for e in c.exchanges] for c in relay.conversations]
            assert fates == [[("GET a", "dropped")], [("GET b", "let through")]]


def test_verdict_is_computed_from_the_rows_of_b_c_and_d():
    scenario = incident.Scenario(redis=None, mode="plain")
    outcomes = {"mixed up": ["got value-of-a", "got value-of-b", "got value-of-c"],
                "failed": ["raised ConnectionError: Too many connections"] * 3,
                "clean": ["got value-of-b", "got value-of-c", "got value-of-d"]}
    for verdict, rows in outcomes.items():
        for client, outcome in zip(scenario.clients[1:], rows):
            client.outcome = outcome
        assert scenario.verdict() == verdict


def test_wild_without_the_venvs_prints_one_line_on_how_to_make_them_and_exits_successfully(
        monkeypatch, capsys, tmp_path):
    need_redis()
    monkeypatch.setattr(incident, "venv_python",
                        lambda version: tmp_path / version / "bin" / "python")
    assert incident.run_all() == 0
    assert capsys.readouterr().out == (
        "part3.wild: no virtual environment for redis-py 4.5.1, 4.5.5, 8.1.0; "
        "`make wild-venvs` makes them (it needs the package index)\n")


@pytest.mark.slow
def test_make_wild_prints_the_checked_in_transcript_mixed_up_on_the_leaking_release_clean_after():
    need_redis()
    need_wild_venvs(incident)
    run = subprocess.run([sys.executable, "-m", "part3.wild", "--all"], cwd=ROOT,
                         capture_output=True, timeout=180)
    assert run.stderr == b"" and run.returncode == 0
    assert run.stdout == (ROOT / "transcripts" / "wild.txt").read_bytes()
    verdicts = [line.split("(")[0].strip() for line in run.stdout.decode().splitlines()
                if "verdict:" in line]
    assert verdicts == ["verdict: mixed up"] + ["verdict: clean"] * 5
