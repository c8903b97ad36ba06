"""`python3 -m part3 serve`: the Redis pools as a command, in front of a real redis-server,
driven by redis-cli; its stats port; its end on a signal."""
import json
import os
import re
import signal
import socket
import subprocess
import sys

import pytest

from conftest import ROOT, need_redis
from part3 import serve
from part3 import redis_server

START_TIMEOUT = 10.0   # seconds the command may take to say where it listens


@pytest.fixture(scope="module")
def redis():
    need_redis("redis-cli")
    with redis_server.RedisServer() as server:
        yield server


def without_passwords():
    return {name: value for name, value in os.environ.items()
            if name not in ("POOL_PASSWORD", "UPSTREAM_PASSWORD", "REDISCLI_AUTH")}


def started(*arguments, environ=None):
    """The command running, and (its address, its stats address) from the line it prints."""
    command = subprocess.Popen([sys.executable, "-m", "part3", "serve", *arguments], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=without_passwords() | (environ or {}))
    line = command.stdout.readline()
    found = re.fullmatch(r"listening on 127\.0\.0\.1:(\d+)"
                         r"(?:; stats on 127\.0\.0\.1:(\d+))?\n", line)
    if not found:
        command.kill()
        command.communicate()
        raise AssertionError(f"the command said {line!r}")
    return command, int(found[1]), found[2] and int(found[2])


def ended(command):
    """Its exit status and what it wrote on stderr, after SIGTERM."""
    command.send_signal(signal.SIGTERM)
    out, err = command.communicate(timeout=START_TIMEOUT)
    return command.returncode, err


def cli(port, *words, password=None):
    """redis-cli's answer; a password goes in REDISCLI_AUTH, where redis-cli looks for one."""
    environ = without_passwords() | ({"REDISCLI_AUTH": password} if password else {})
    run = subprocess.run(["redis-cli", "-p", str(port), *words], capture_output=True, text=True,
                         timeout=START_TIMEOUT, env=environ)
    return run.stdout.strip()


@pytest.mark.parametrize("kind", ["framed", "managed"])
def test_serve_runs_a_pool_redis_cli_uses_reports_its_counters_and_ends_cleanly_on_sigterm(
        redis, kind):
    command, port, stats_port = started("--upstream", f"127.0.0.1:{redis.addr[1]}", "--kind", kind,
                                        "--listen", "127.0.0.1:0", "--stats", "127.0.0.1:0",
                                        "--size", "2")
    try:
        assert cli(port, "SET", f"served:{kind}", "yes") == "OK"
        assert cli(port, "GET", f"served:{kind}") == "yes"
        assert cli(port, "FLUSHALL").startswith("ERR tcp-proxy: FLUSHALL")   # refused by policy
        with socket.create_connection(("127.0.0.1", stats_port), timeout=START_TIMEOUT) as sock:
            stats = json.loads(sock.makefile("rb").read())
        assert stats["connections"] == 3
        opened = stats["opened"] if kind == "framed" else stats["upstream.connects"]
        assert 1 <= opened <= 2
    finally:
        status, err = ended(command)
    assert (status, err) == (0, "")


def test_serve_passes_a_command_allowed_by_name(redis):
    command, port, _ = started("--upstream", f"127.0.0.1:{redis.addr[1]}",
                               "--listen", "127.0.0.1:0", "--allow", "FLUSHDB")
    try:
        assert cli(port, "FLUSHDB") == "OK"
    finally:
        assert ended(command) == (0, "")


def test_a_bad_address_is_refused_with_usage_before_anything_starts():
    run = subprocess.run([sys.executable, "-m", "part3", "serve", "--upstream", "nowhere"],
                         cwd=ROOT, capture_output=True, text=True, timeout=START_TIMEOUT)
    assert run.returncode == 2 and "an address is HOST:PORT, not 'nowhere'" in run.stderr


def test_an_address_reads_host_and_port_and_brackets_around_ipv6():
    assert serve.address("127.0.0.1:6379") == ("127.0.0.1", 6379)
    assert serve.address("[::1]:6380") == ("::1", 6380)
    assert serve.shown(("::1", 6380, 0, 0)) == "[::1]:6380"


@pytest.fixture
def guarded(redis):
    """The module's redis-server asking a password of its clients, for one test."""
    control = redis_server.RedisControl(redis.addr)
    control.command("CONFIG SET requirepass upstream-secret")
    control.command("AUTH upstream-secret")
    try:
        yield redis
    finally:
        control.command("CONFIG SET requirepass ''")
        control.close()


@pytest.mark.parametrize("kind", ["framed", "managed"])
def test_serve_asks_its_clients_its_own_password_and_says_its_own_upstream(guarded, kind):
    passwords = {"POOL_PASSWORD": "client-secret", "UPSTREAM_PASSWORD": "upstream-secret"}
    command, port, _ = started("--upstream", f"127.0.0.1:{guarded.addr[1]}", "--kind", kind,
                               "--listen", "127.0.0.1:0", environ=passwords)
    try:
        assert cli(port, "GET", "k").startswith("NOAUTH")
        assert cli(port, "SET", "k", "v", password="client-secret") == "OK"
        assert cli(port, "GET", "k", password="client-secret") == "v"
        assert cli(port, "AUTH", "upstream-secret").startswith("WRONGPASS")   # not the server's
    finally:
        assert ended(command) == (0, "")


def test_a_user_without_a_password_in_the_environment_is_refused_before_anything_starts():
    run = subprocess.run([sys.executable, "-m", "part3", "serve", "--upstream", "127.0.0.1:1",
                          "--user", "app"], cwd=ROOT, capture_output=True, text=True,
                         timeout=START_TIMEOUT, env=without_passwords())
    assert run.returncode == 2 and "--user needs a password in POOL_PASSWORD" in run.stderr
