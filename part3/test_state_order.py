"""Each request runs in the state in force when its client sent it: a state change the pool
answers itself (SELECT, HELLO, CLIENT SETNAME) applies from its own place in the client's
stream, never to requests read before it, however the bytes were cut; in both kinds."""
import pytest

from part3.conftest import POOL_KINDS, make_pool, redis_py_client


def learn_the_servers_facts(client):
    """A SELECT past 0 needs the number of databases: the pool asks it once, and from then on
    answers every SELECT at once (the case where a later SELECT could reach back)."""
    assert client.ask("SELECT 1", "SELECT 0") == [b"+OK\r\n"] * 2


@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_a_get_written_with_a_select_after_it_reads_the_database_before_the_select(
        redis, control, clients, pool_kind):
    control.command("SET probe zero")
    control.command("SELECT 3")
    control.command("SET probe three")
    control.command("SELECT 0")
    with make_pool(pool_kind, redis) as proxy:
        client = clients(proxy.addr)
        learn_the_servers_facts(client)
        assert client.ask("GET probe", "SELECT 3", "GET probe") == \
            [b"$4\r\nzero\r\n", b"+OK\r\n", b"$5\r\nthree\r\n"]


@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_a_resp2_request_written_with_hello_3_after_it_gets_its_reply_in_resp2(
        redis, control, clients, pool_kind):
    control.command("HSET h f v")
    with make_pool(pool_kind, redis) as proxy:
        client = clients(proxy.addr)
        learn_the_servers_facts(client)
        replies = client.ask("HGETALL h", "HELLO 3", "HGETALL h")
        assert replies[0] == b"*2\r\n$1\r\nf\r\n$1\r\nv\r\n"
        assert replies[2] == b"%1\r\n$1\r\nf\r\n$1\r\nv\r\n"


@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_client_info_written_with_a_setname_after_it_reports_the_name_before(
        redis, control, clients, pool_kind):
    with make_pool(pool_kind, redis) as proxy:
        client = clients(proxy.addr)
        learn_the_servers_facts(client)
        assert client.ask("CLIENT SETNAME earlier") == [b"+OK\r\n"]
        info, named, after = client.ask("CLIENT INFO", "CLIENT SETNAME later", "CLIENT INFO")
        assert b" name=earlier " in info and named == b"+OK\r\n" and b" name=later " in after


@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_a_redis_py_pipeline_that_selects_between_its_writes_puts_every_key_where_it_was_sent(
        redis, control, pool_kind):
    with make_pool(pool_kind, redis) as proxy:
        client = redis_py_client(proxy)
        try:
            for database in (1, 2, 3):
                pipe = client.pipeline(transaction=False)
                pipe.set(f"k0-{database}", "in 0")
                pipe.execute_command("SELECT", database)
                pipe.set(f"k{database}", f"in {database}")
                pipe.get(f"k{database}")
                pipe.execute_command("SELECT", 0)
                assert pipe.execute() == [True, True, True, f"in {database}".encode(), True]
        finally:
            client.close()
    for database in (0, 1, 2, 3):
        control.command(f"SELECT {database}")
        keys = sorted(control.command("KEYS *").split(b"\r\n")[2::2])
        expected = [b"k0-1", b"k0-2", b"k0-3"] if database == 0 else [b"k%d" % database]
        assert keys == expected
    control.command("SELECT 0")
