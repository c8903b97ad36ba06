"""Real clients with their defaults (redis-py 8 sync and asyncio, redis-cli, redis-benchmark)
through each pool kind (POOL_KINDS, part3/conftest.py); the sessions they rely on are tested
in test_session_*.py."""
import asyncio
import subprocess

import pytest

from conftest import need_redis
from part3.conftest import array, lost, make_pool, redis_py
from part3.resp import Resp


# --- real clients with their defaults, through each pool kind -------------------------------------

def the_issues_calls(client, other_db):
    """The calls of the table a new user of redis-py 8 writes first, with what each returned."""
    got = [client.set("k", "v"), client.get("k")]
    with client.pipeline() as pipe:
        got.append(pipe.set("p", 1).get("p").execute())
    with client.pipeline(transaction=False) as pipe:
        got.append(pipe.set("p", 2).get("p").execute())
    got += [other_db.get("k"), other_db.set("k", "one"), other_db.get("k"), client.get("k")]
    pubsub = client.pubsub()
    try:
        pubsub.subscribe("ch")
        got.append(pubsub.get_message(timeout=5))
        got.append(client.publish("ch", "hello"))
        got.append(pubsub.get_message(timeout=5))
    finally:
        pubsub.close()
    got += [client.blpop("q", timeout=1), client.rpush("q", "job"), client.blpop("q", timeout=1)]
    long = bytes(range(256)) * 8192   # 2 MB
    got += [client.set("long", long), client.get("long") == long]
    return got


def test_redis_py_with_its_defaults_does_every_call_of_the_table_as_it_does_directly(
        redis, control, pool_kind):
    import redis as redis_py_module
    direct = [redis_py_module.Redis(port=redis.addr[1], db=db, socket_timeout=10) for db in (0, 1)]
    try:
        expected = the_issues_calls(*direct)
    finally:
        for client in direct:
            client.close()
    control.command("FLUSHALL")
    with make_pool(pool_kind, redis) as proxy:
        pooled = [redis_py(proxy, db=db) for db in (0, 1)]
        try:
            assert the_issues_calls(*pooled) == expected
        finally:
            for client in pooled:
                client.close()


def test_redis_py_asyncio_with_its_defaults_sets_gets_pipelines_and_subscribes(
        redis, control, pool_kind):
    import redis.asyncio as redis_asyncio

    async def calls(port):
        client = redis_asyncio.Redis(port=port, socket_timeout=10)
        try:
            got = [await client.set("a", "1"), await client.get("a")]
            async with client.pipeline() as pipe:
                got.append(await pipe.incr("n").incr("n").execute())
            pubsub = client.pubsub()
            await pubsub.subscribe("ch")
            got.append(await pubsub.get_message(timeout=5))
            await client.publish("ch", "hi")
            got.append(await pubsub.get_message(timeout=5))
            await pubsub.aclose()
            return got
        finally:
            await client.aclose()

    with make_pool(pool_kind, redis) as proxy:
        assert asyncio.run(calls(proxy.addr[1])) == [
            True, b"1", [1, 2],
            {"type": "subscribe", "pattern": None, "channel": b"ch", "data": 1},
            {"type": "message", "pattern": None, "channel": b"ch", "data": b"hi"}]


def test_redis_py_with_a_password_authenticates_to_the_pool(redis, control, pool_kind):
    import redis as redis_py_module
    with make_pool(pool_kind, redis, framing=Resp(password="s3cret")) as proxy:
        for protocol in (3, 2):   # HELLO 3 AUTH, or AUTH then the rest
            client = redis_py(proxy, password="s3cret", protocol=protocol, db=1)
            try:
                assert client.set("k", protocol) is True and client.get("k") == b"%d" % protocol
            finally:
                client.close()
        stranger = redis_py(proxy, password="wrong")
        with pytest.raises(redis_py_module.AuthenticationError):
            stranger.get("k")
        stranger.close()


def test_redis_cli_speaks_resp3_through_the_pool_and_reads_its_maps(redis, control, pool_kind):
    need_redis("redis-cli")
    with make_pool(pool_kind, redis) as proxy:
        port = str(proxy.addr[1])
        runs = [subprocess.run(["redis-cli", "-3", "-p", port, *words], capture_output=True,
                               timeout=30)
                for words in (["HSET", "h", "f", "v"], ["HGETALL", "h"],
                              ["-n", "1", "HGETALL", "h"], ["MULTI"])]
    assert [run.stdout for run in runs] == [b"1\n", b"f v\n", b"\n", b"OK\n"]


@pytest.mark.slow
def test_redis_cli_pipe_has_every_one_of_its_many_commands_acknowledged(redis, control, pool_kind):
    need_redis("redis-cli")
    count = 100_000
    commands = b"".join(array("SET", f"pipe:{number}", number) for number in range(count))
    with make_pool(pool_kind, redis) as proxy:
        run = subprocess.run(["redis-cli", "-p", str(proxy.addr[1]), "--pipe"], input=commands,
                             capture_output=True, timeout=300)
    assert (run.returncode, run.stdout.splitlines()[-1]) == (0, b"errors: 0, replies: %d" % count)
    assert control.command("DBSIZE") == b":%d\r\n" % count


@pytest.mark.parametrize("pipeline", [1, 16])
def test_redis_benchmark_in_resp3_completes_get_and_set_with_no_error(
        redis, control, pool_kind, pipeline):
    need_redis("redis-benchmark")
    with make_pool(pool_kind, redis, pool_cap=8) as proxy:
        run = subprocess.run(["redis-benchmark", "-3", "-p", str(proxy.addr[1]), "-t", "get,set",
                              "-n", "400", "-c", "8", "-P", str(pipeline), "-q"],
                             capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
        assert run.returncode == 0, run
        assert [line.split(b":")[0] for line in run.stdout.replace(b"\r", b"\n").split(b"\n")
                if b"requests per second" in line] == [b"SET", b"GET"]
        assert lost(proxy) == (0, 0)
    assert control.command("STRLEN key:__rand_int__") == b":3\r\n"
