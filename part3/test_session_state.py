"""A checkout is a state sync: the state each client keeps (its protocol, database, flags,
name) brought to the connection its requests go on, in SessionProxy's checkout and in
ManagedProxy's shared pipeline; clients of different states never see each other's keys."""
import re

import pytest

from part2.managed import ManagedProxy
from part3.conftest import POOL_KINDS, make_pool, server_clients, wait_for
from part3.resp import RESP, Resp
from part3.framed import SessionProxy


# --- a checkout is a state sync -------------------------------------------------------------

@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_a_checkout_brings_the_one_connection_to_each_clients_protocol_and_database(
        redis, control, clients, pool_kind):
    """Three clients, three states, one connection: each request goes on it after the HELLO
    and SELECT that bring it to its client's state, in the same write (SessionProxy's
    checkout; ManagedProxy's pipeline, which keeps the state its queue leaves the connection
    in, on the one connection every client shares)."""
    control.command("CONFIG RESETSTAT")
    with make_pool(pool_kind, redis, pool_cap=1) as proxy:
        resp3, db2, plain = clients(proxy.addr, 3)
        assert resp3.ask("HELLO 3")[0].startswith(b"%7\r\n")
        assert db2.ask("SELECT 2") == [b"+OK\r\n"]
        for _ in range(2):
            assert resp3.ask("HSET h f three", "HGETALL h") == [b":0\r\n" if _ else b":1\r\n",
                                                              b"%1\r\n$1\r\nf\r\n$5\r\nthree\r\n"]
            assert db2.ask("HSET h f two", "HGETALL h")[1] == b"*2\r\n$1\r\nf\r\n$3\r\ntwo\r\n"
            assert plain.ask("HGETALL h") == [b"*2\r\n$1\r\nf\r\n$5\r\nthree\r\n"]
        assert len(server_clients(control)) == 1
        if pool_kind == "SessionProxy":   # its pool's counter
            assert proxy.opened == 1
    stats = control.command("INFO commandstats").decode()
    assert re.search(r"cmdstat_hello:calls=(\d+)", stats)[1] == "5"    # facts() once, 4 syncs
    assert re.search(r"cmdstat_select:calls=(\d+)", stats)[1] == "4"   # to 2 and back, twice


def test_client_no_evict_is_replayed_as_select_is_and_client_reply_on_changes_nothing(
        redis, control, clients):
    with SessionProxy(redis.addr, framing=RESP, pool_cap=1) as proxy:
        protected, other = clients(proxy.addr, 2)
        assert protected.ask("CLIENT NO-EVICT on", "CLIENT REPLY ON") == [b"+OK\r\n"] * 2
        for _ in range(2):   # the one connection, brought to each client's flags in turn
            assert protected.ask("PING") == [b"+PONG\r\n"]
            assert [re.search(" flags=N*e", line) is not None
                    for line in server_clients(control)] == [True]
            assert other.ask("PING") == [b"+PONG\r\n"]
            assert [re.search(" flags=N*e", line) is not None
                    for line in server_clients(control)] == [False]
        assert b" flags=e " in protected.ask("CLIENT INFO")[0]   # as the pool answers it
        assert protected.ask("CLIENT REPLY OFF")[0].startswith(
            b"-ERR tcp-proxy: CLIENT REPLY switches the connection's replies off")
        assert proxy.opened == 1


def test_two_clients_in_different_databases_overlapping_transactions_and_a_subscriber_see_their_own(
        redis, control, clients):
    with SessionProxy(redis.addr, framing=RESP, pool_cap=2) as proxy:
        one, two, listener = clients(proxy.addr, 3)
        assert one.ask("HELLO 3", "SELECT 1", "MULTI", "SET k one")[1:] == \
            [b"+OK\r\n", b"+OK\r\n", b"+QUEUED\r\n"]
        assert two.ask("SELECT 2", "MULTI", "SET k two") == [b"+OK\r\n", b"+OK\r\n", b"+QUEUED\r\n"]
        assert listener.ask("SUBSCRIBE news") == [b"*3\r\n$9\r\nsubscribe\r\n$4\r\nnews\r\n:1\r\n"]
        assert one.ask("GET k") == [b"+QUEUED\r\n"]
        assert control.command("PUBLISH news hello") == b":1\r\n"
        assert two.ask("GET k", "EXEC") == [b"+QUEUED\r\n", b"*2\r\n+OK\r\n$3\r\ntwo\r\n"]
        assert one.ask("EXEC") == [b"*2\r\n+OK\r\n$3\r\none\r\n"]
        assert listener.read() == b"*3\r\n$7\r\nmessage\r\n$4\r\nnews\r\n$5\r\nhello\r\n"
        assert one.ask("GET k", "SELECT 0", "GET k") == [b"$3\r\none\r\n", b"+OK\r\n", b"_\r\n"]
    assert control.command("GET k") == b"$-1\r\n"


def test_a_managed_transaction_goes_on_a_connection_of_its_own_given_back_clean_at_exec(
        redis, control, clients):
    with ManagedProxy([(redis.addr, 1)], framing=RESP) as proxy:
        inside, outside = clients(proxy.addr, 2)
        assert inside.ask("MULTI", "INCR n", "INCR n") == \
            [b"+OK\r\n", b"+QUEUED\r\n", b"+QUEUED\r\n"]
        assert outside.ask("INCR n") == [b":1\r\n"]   # not queued: it runs now, on the shared one
        assert inside.ask("EXEC") == [b"*2\r\n:2\r\n:3\r\n"]
        assert outside.ask("MULTI", "INCR n", "EXEC") == [b"+OK\r\n", b"+QUEUED\r\n",
                                                          b"*1\r\n:4\r\n"]
        assert proxy.lending.dedicated == 1   # the first transaction's, lent to the second
        assert len(server_clients(control)) == 2


def test_a_managed_client_that_leaves_mid_transaction_has_its_own_connection_closed(
        redis, control, clients):
    with ManagedProxy([(redis.addr, 1)], framing=RESP) as proxy:
        leaver, other = clients(proxy.addr, 2)
        assert other.ask("PING") == [b"+PONG\r\n"]
        assert leaver.ask("MULTI", "SET k leaver") == [b"+OK\r\n", b"+QUEUED\r\n"]
        leaver.close()
        wait_for(lambda: len(server_clients(control)) == 1, "the transaction's connection closed")
        assert other.ask("GET k") == [b"$-1\r\n"]   # nothing of it ran


def test_a_managed_sync_the_server_refuses_fails_what_is_owed_and_ends_the_connection(
        guarded, clients):
    server, control = guarded
    with ManagedProxy([(server.addr, 1)], framing=RESP) as proxy:
        client = clients(proxy.addr)
        assert client.ask("HELLO 3")[0].startswith(b"%7\r\n")
        assert client.ask("GET k")[0].startswith(
            b"-ERR MessageLost: the connection could not take a client's state: HELLO was "
            b"answered -NOAUTH")
        wait_for(lambda: len(server_clients(control)) == 0, "the refused connection closed")


@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_a_clients_name_is_replayed_so_client_list_names_it_on_the_connection_it_borrows(
        redis, control, clients, pool_kind):
    with make_pool(pool_kind, redis, framing=Resp(allow=["CLIENT LIST"]), pool_cap=1) as proxy:
        named, other = clients(proxy.addr, 2)
        assert named.ask("CLIENT SETNAME worker-1") == [b"+OK\r\n"]
        assert b" name=worker-1 " in named.ask("CLIENT LIST")[0]
        assert b" name=worker-1 " not in other.ask("CLIENT LIST")[0]


@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_config_set_requirepass_is_never_passed_even_where_config_set_is_allowed(
        redis, control, clients, pool_kind):
    """AUTH belongs to the pool: a client that changed the server's password would leave the
    pool unable to open a connection for anyone."""
    with make_pool(pool_kind, redis, framing=Resp(allow=["CONFIG SET"])) as proxy:
        client = clients(proxy.addr)
        assert client.ask("CONFIG SET requirepass mine")[0].startswith(
            b"-ERR tcp-proxy: CONFIG SET requirepass changes the password every connection must "
            b"give the server, which is the pool's to say")
        assert client.ask("CONFIG SET maxmemory-samples 5") == [b"+OK\r\n"]
    assert control.command("CONFIG GET requirepass") == b"*2\r\n$11\r\nrequirepass\r\n$0\r\n\r\n"
