"""Real Redis clients with their defaults through both Redis pools, SessionProxy(framing=RESP)
and ManagedProxy(framing=RESP) (Part two's set, every client pipelined over one connection):
redis-cli, redis-py (pooled, and one client shared by threads) and redis-benchmark, each
checking that every value it reads is the one it wrote. The framing, refusals and deadlines
they rely on are test_real_clients.py's."""
import random
import subprocess
import threading

import pytest

from conftest import need_redis
from part2.managed import ManagedProxy
from part3.conftest import REDIS_PROXIES, redis_py_client


def upstream_errors(proxy):
    """Exchanges that ended in an error the proxy made: 0 when every reply came from Redis."""
    if isinstance(proxy, ManagedProxy):
        return proxy.failed
    return proxy.dirty + proxy.discarded


def random_pairs(rng, count, prefix):
    return {f"{prefix}:{rng.getrandbits(64):016x}": rng.randbytes(rng.randint(0, 300)).hex()
            for _ in range(count)}


@pytest.mark.parametrize("proxy_kind", REDIS_PROXIES)
def test_redis_cli_sets_and_gets_through_the_pool(redis, proxy_kind):
    need_redis("redis-cli")
    rng = random.Random(18)
    # each SET and each GET its own redis-cli, as a shell script runs it
    pairs = random_pairs(rng, 8, "cli")
    wrong = 0
    with REDIS_PROXIES[proxy_kind](redis, 2) as proxy:
        port = str(proxy.addr[1])
        for key, value in pairs.items():
            run = subprocess.run(["redis-cli", "-p", port, "SET", key, value],
                                 capture_output=True, timeout=30)
            assert (run.stdout, run.returncode) == (b"OK\n", 0), run
        for key, value in pairs.items():
            run = subprocess.run(["redis-cli", "-p", port, "GET", key], capture_output=True,
                                 timeout=30)
            wrong += run.stdout != value.encode() + b"\n"
        multi = subprocess.run(["redis-cli", "-p", port, "MULTI"], capture_output=True, timeout=30)
    assert wrong == 0
    assert multi.stdout == b"OK\n"   # pinned for the transaction, then closed as redis-cli goes


# RESP2 clients (protocol=2) and redis-py's defaults (RESP3) work through both pools.
PROTOCOLS = [pytest.param("ManagedProxy", 2, id="ManagedProxy-resp2"),
             pytest.param("SessionProxy", 2, id="SessionProxy-resp2"),
             pytest.param("ManagedProxy", None, id="ManagedProxy-defaults"),
             pytest.param("SessionProxy", None, id="SessionProxy-defaults")]


@pytest.mark.parametrize("proxy_kind, protocol", PROTOCOLS)
def test_redis_py_pooled_client_reads_back_every_value_it_wrote(redis, proxy_kind, protocol):
    rng = random.Random(1818)
    pairs = random_pairs(rng, 100, "py")   # each set, got and got again pipelined
    with REDIS_PROXIES[proxy_kind](redis, 4) as proxy:
        client = redis_py_client(proxy, protocol=protocol)
        try:
            for key, value in pairs.items():
                assert client.set(key, value) is True
            wrong = sum(client.get(key) != value.encode() for key, value in pairs.items())
            with client.pipeline(transaction=False) as pipe:   # pipelined: one write, many requests
                for key in pairs:
                    pipe.get(key)
                piped = pipe.execute()
        finally:
            client.close()
            client.connection_pool.disconnect()
    assert wrong == 0
    assert piped == [value.encode() for value in pairs.values()]


@pytest.mark.parametrize("proxy_kind, protocol", PROTOCOLS)
def test_several_threads_sharing_one_redis_py_client_each_read_their_own_values(
        redis, control, proxy_kind, protocol):
    threads_count = 8
    # pairs per thread: enough for the threads to interleave; the property tests carry the volume
    each = 20
    wrong = [0] * threads_count
    with REDIS_PROXIES[proxy_kind](redis, 3) as proxy:
        client = redis_py_client(proxy, max_connections=threads_count, protocol=protocol)

        def work(index):
            rng = random.Random(index)
            for key, value in random_pairs(rng, each, f"thread{index}").items():
                client.set(key, value)
                wrong[index] += client.get(key) != value.encode()

        threads = [threading.Thread(target=work, args=(index,)) for index in range(threads_count)]
        try:
            for thread in threads:
                thread.start()
        finally:
            for thread in threads:
                thread.join()
            client.close()
            client.connection_pool.disconnect()
        # the server's connections, the control's own left out: the set pipelines over one
        held = control.command("CLIENT LIST").count(b" addr=") - 1
    assert wrong == [0] * threads_count
    # the set's one; the pool's cap
    assert held == 1 if proxy_kind == "ManagedProxy" else held <= 3


@pytest.mark.parametrize("proxy_kind", REDIS_PROXIES)
@pytest.mark.parametrize("pipeline", [1, 16])
def test_redis_benchmark_completes_get_and_set_through_the_pool_with_no_error(
        redis, control, pipeline, proxy_kind):
    need_redis("redis-benchmark")
    # 200 of each: the claim is no error; speed is BENCH.md's
    with REDIS_PROXIES[proxy_kind](redis, 8) as proxy:
        run = subprocess.run(["redis-benchmark", "-p", str(proxy.addr[1]), "-t", "get,set",
                              "-n", "200", "-c", "8", "-P", str(pipeline), "-q", "-e"],
                             capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
        assert run.returncode == 0, run
        assert [line.split(b":")[0] for line in run.stdout.replace(b"\r", b"\n").split(b"\n")
                if b"requests per second" in line] == [b"SET", b"GET"]
        assert b"ERR" not in run.stdout + run.stderr
        assert upstream_errors(proxy) == 0
    assert control.command("STRLEN key:__rand_int__") == b":3\r\n"   # what its SETs wrote: 3 bytes
