"""`python3 -m part3 serve`: the Redis pools as a command, in front of a real redis-server,
driven by redis-cli; its stats port; its end on a signal."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

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


# The line serve logs where its upstream user may run what the pool refuses (a stock
# redis-server's default user may) and may make a user: its connections run as one of its own.
OWN_USER = re.compile(r"\S+ \S+ part3\.serve: the upstream user may run FLUSHALL, [A-Z, ]+ "
                      r"and \d+ more, which the pool refuses, and so could any script: the "
                      r"pool's connections run as ACL user tcp-proxy, whose rules are the command "
                      r"table's \(`python3 -m part3 acl` prints them\)\n")


def ended(command, own_user=True):
    """Its exit status and what it wrote on stderr after SIGTERM, but the line that says its
    connections run as its own user (which must be there, unless own_user=False)."""
    command.send_signal(signal.SIGTERM)
    out, err = command.communicate(timeout=START_TIMEOUT)
    if own_user:
        err, said = OWN_USER.subn("", err, count=1)
        assert said, f"serve did not say its connections run as a user of its own: {err!r}"
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
        assert stats["refused.FLUSHALL"] == 1   # each refusal, by the command refused
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


# --- a script has no more rights than a client of the pool -----------------------------------

FLUSHING_LIBRARY = ("#!lua name=flushing\n"
                    "redis.register_function('flush', "
                    "function() return redis.call('FLUSHALL') end)")
DENIED = "ERR The user executing the script can't run this command or subcommand"


def everything(control):
    """Every database's keys and values, as the control connection reads them."""
    found = {}
    for database in range(4):
        control.command(f"SELECT {database}")
        for key in sorted(control.command("KEYS *").split(b"\r\n")[2::2]):
            found[database, key] = control.command(f"GET {key.decode()}")
    control.command("SELECT 0")
    return found


@pytest.fixture
def stocked(redis):
    """The module's redis-server with a key in databases 0 and 1, and a control connection."""
    control = redis_server.RedisControl(redis.addr)
    for database, value in ((0, "zero"), (1, "one")):
        control.command(f"SELECT {database}")
        control.command(f"SET kept {value}")
    control.command("SELECT 0")
    try:
        yield redis, control
    finally:
        control.close()


@pytest.mark.parametrize("kind", ["framed", "managed"])
def test_through_serve_no_script_can_flush_or_swap_the_databases_but_one_on_keys_runs(
        stocked, kind):
    redis, control = stocked
    before = everything(control)
    command, port, _ = started("--upstream", f"127.0.0.1:{redis.addr[1]}", "--kind", kind,
                               "--listen", "127.0.0.1:0")
    try:
        assert cli(port, "EVAL", "return redis.call('FLUSHALL')", "0").startswith(DENIED)
        assert cli(port, "EVAL", "return redis.call('SWAPDB', 0, 1)", "0").startswith(DENIED)
        assert cli(port, "FUNCTION", "LOAD", "REPLACE", FLUSHING_LIBRARY) == "flushing"
        assert cli(port, "FCALL", "flush", "0").startswith(DENIED)
        assert everything(control) == before
        assert cli(port, "EVAL", "return redis.call('SET', KEYS[1], ARGV[1])", "1", "k", "v") == \
            "OK"
        assert cli(port, "EVAL", "return redis.call('GET', KEYS[1])", "1", "k") == "v"
    finally:
        assert ended(command) == (0, "")


def test_a_pool_whose_upstream_user_has_the_printed_rule_forwards_scripts_as_they_are(stocked):
    redis, control = stocked
    secret = {"UPSTREAM_PASSWORD": "rule-secret"}
    rule = subprocess.run([sys.executable, "-m", "part3", "acl", "--user", "app", "--upstream",
                           f"127.0.0.1:{redis.addr[1]}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=START_TIMEOUT, env=without_passwords() | secret)
    assert rule.returncode == 0 and rule.stdout.startswith("ACL SETUSER app reset on #")
    installed = subprocess.run(["redis-cli", "-p", str(redis.addr[1])], input=rule.stdout,
                               capture_output=True, text=True, timeout=START_TIMEOUT)
    assert installed.stdout == "OK\n"
    command, port, _ = started("--upstream", f"127.0.0.1:{redis.addr[1]}", "--listen",
                               "127.0.0.1:0", "--upstream-user", "app", environ=secret)
    try:
        assert cli(port, "EVAL", "return redis.call('FLUSHDB')", "0").startswith(DENIED)
        assert cli(port, "EVAL", "return redis.call('GET', KEYS[1])", "1", "kept") == "zero"
        assert b"user=app " in control.command("CLIENT LIST")   # the pool's own connection
    finally:
        assert ended(command, own_user=False) == (0, "")   # the user is confined: nothing to say


def test_a_user_that_may_flush_but_not_make_users_has_scripts_refused_naming_the_remedy(stocked):
    redis, control = stocked
    control.command("ACL SETUSER flusher reset on >flusher-secret ~* &* +@all -@admin")
    command, port, _ = started("--upstream", f"127.0.0.1:{redis.addr[1]}", "--listen",
                               "127.0.0.1:0", "--upstream-user", "flusher",
                               environ={"UPSTREAM_PASSWORD": "flusher-secret"})
    try:
        assert cli(port, "EVAL", "return redis.call('FLUSHALL')", "0").startswith(
            "ERR tcp-proxy: EVAL runs a script, which calls commands as the pool's upstream user")
        assert cli(port, "GET", "kept") == "zero"
    finally:
        status, err = ended(command, own_user=False)
    assert status == 0 and re.fullmatch(
        r"\S+ \S+ part3\.serve: scripts are refused: the upstream user may run FLUSHALL, FLUSHDB, "
        r"SWAPDB and \d+ more, which the pool refuses, and may not make a user to confine them; "
        r"install the rule `python3 -m part3 acl` prints and use its user \(--upstream-user\)\n",
        err)


@pytest.mark.parametrize("kind", ["framed", "managed"])
def test_the_pools_own_user_is_made_again_on_a_server_restarted_since(kind):
    need_redis()
    with redis_server.RedisServer() as server:
        command, port, _ = started("--upstream", f"127.0.0.1:{server.addr[1]}", "--kind", kind,
                                   "--listen", "127.0.0.1:0")
        try:
            assert cli(port, "SET", "k", "before") == "OK"
            server.kill_and_restart()   # its users, the pool's own among them, are gone
            deadline = time.monotonic() + START_TIMEOUT
            while cli(port, "SET", "k", "after") != "OK":   # a connection that knew the old
                assert time.monotonic() < deadline          # server may fail one request
            assert cli(port, "EVAL", "return redis.call('FLUSHALL')", "0").startswith(DENIED)
            assert cli(port, "GET", "k") == "after"
        finally:
            status, err = ended(command)
    assert status == 0
