"""What the pool answers itself from a Redis client's session, as redis-server would:
HELLO, SELECT, CLIENT SETNAME, GETNAME, ID and SETINFO; and AUTH, which belongs to the pool:
its password asked of its clients, its own credentials said upstream."""
import re

import pytest

from part2.managed import ManagedProxy
from part3.conftest import POOL_KINDS, Client, array, direct_and_pooled, make_pool
from part3.resp import RESP, Resp
from part3.framed import SessionProxy


# --- what the pool answers itself, as redis-server would -------------------------------------

HELLOS = ["HELLO", "HELLO 2", "HELLO 3", "HELLO 4", "HELLO 1", "HELLO x", "HELLO 3 SETNAME me",
          "HELLO 3 BOGUS", "HELLO 3 AUTH default anything", "HELLO 3 AUTH someone else",
          "HELLO 2 AUTH default", "HELLO 3 SETNAME", array("HELLO", "3", "SETNAME", "a b")]


@pytest.mark.parametrize("hello", HELLOS, ids=repr)
def test_the_pool_answers_hello_as_redis_server_does_its_version_included(redis, control, hello):
    """Each HELLO, then what it set: the protocol (a map or a flat array) and the name."""
    with SessionProxy(redis.addr, framing=RESP) as proxy:
        direct, pooled = direct_and_pooled(redis, control, proxy, [hello, "CLIENT GETNAME"])
    assert pooled == direct


def test_select_and_the_client_commands_are_answered_from_the_session_as_redis_server_does(
        redis, control):
    asked = ["SELECT 1", "SELECT 16", "SELECT -1", "SELECT x", "SELECT", "CLIENT SETNAME me",
             array("CLIENT", "SETNAME", "a b"), "CLIENT GETNAME", "CLIENT SETNAME", "AUTH x",
             "AUTH default x", "AUTH someone x", "AUTH a b c"]
    with SessionProxy(redis.addr, framing=RESP) as proxy:
        direct, pooled = direct_and_pooled(redis, control, proxy, asked)
    assert pooled == direct


def test_client_id_is_the_pools_number_for_the_client_and_hello_says_the_same(redis, clients):
    with SessionProxy(redis.addr, framing=RESP) as proxy:
        first, second = clients(proxy.addr, 2)
        hello = first.ask("HELLO 3")[0]
        assert first.ask("CLIENT ID") == [b":%s\r\n" % re.search(rb"id\r\n:(\d+)", hello)[1]]
        assert int(second.ask("CLIENT ID")[0][1:-2]) != int(first.ask("CLIENT ID")[0][1:-2])


def test_client_setinfo_which_redis_7_0_does_not_know_is_answered_ok_as_redis_py_sends_it(
        redis, control, clients):
    with SessionProxy(redis.addr, framing=RESP) as proxy:
        client = clients(proxy.addr)
        assert client.ask("CLIENT SETINFO LIB-NAME redis-py", "CLIENT SETINFO LIB-VER 8.1.0",
                          "CLIENT SETINFO COLOR red") == \
            [b"+OK\r\n", b"+OK\r\n", b"-ERR Unrecognized option 'COLOR'\r\n"]
    assert control.command("GET never") == b"$-1\r\n"


# --- AUTH belongs to the pool ----------------------------------------------------------------

def test_a_pool_with_a_password_answers_noauth_until_its_clients_auth_and_auth_is_its_own(
        redis, control, clients):
    control.command("CONFIG RESETSTAT")
    with SessionProxy(redis.addr, framing=Resp(password="s3cret")) as proxy:
        client = clients(proxy.addr)
        assert client.ask("GET k", "HELLO 3", "AUTH wrong", "AUTH s3cret", "GET k") == [
            b"-NOAUTH Authentication required.\r\n",
            b"-NOAUTH HELLO must be called with the client already authenticated, otherwise the "
            b"HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and "
            b"select the RESP protocol version at the same time\r\n",
            b"-WRONGPASS invalid username-password pair or user is disabled.\r\n",
            b"+OK\r\n", b"$-1\r\n"]
        other = clients(proxy.addr)
        assert other.ask("HELLO 3 AUTH default s3cret")[0].startswith(b"%7\r\n")
        assert other.ask("RESET", "GET k") == [b"+RESET\r\n",
                                               b"-NOAUTH Authentication required.\r\n"]
    assert b"cmdstat_auth" not in control.command("INFO commandstats")   # none reached it


def test_a_pool_that_keeps_no_state_still_asks_its_password_before_it_forwards_anything(
        redis, control, clients):
    """ManagedProxy's sessions keep no state, but a password is no connection's: checked
    by the session, and nothing is forwarded before it."""
    with ManagedProxy([(redis.addr, 1)], framing=Resp(password="s3cret")) as proxy:
        client = clients(proxy.addr)
        assert client.ask("SET k v", "AUTH wrong", "AUTH s3cret", "SET k v") == [
            b"-NOAUTH Authentication required.\r\n",
            b"-WRONGPASS invalid username-password pair or user is disabled.\r\n",
            b"+OK\r\n", b"+OK\r\n"]
    assert control.command("DBSIZE") == b":1\r\n"


def test_the_pool_authenticates_upstream_with_credentials_of_its_own_never_a_clients(guarded):
    import redis as redis_py
    server, control = guarded
    framing = Resp(password="client-secret", upstream_password="upstream-secret")
    with SessionProxy(server.addr, framing=framing, pool_cap=2) as proxy:
        client = redis_py.Redis(port=proxy.addr[1], password="client-secret", socket_timeout=10)
        try:
            assert client.set("k", "v") is True and client.get("k") == b"v"
            with client.pipeline() as pipe:
                assert pipe.incr("n").incr("n").execute() == [1, 2]
        finally:
            client.close()
        intruder = Client(proxy.addr)
        try:   # the server's own password is no client's: the pool asks for its own
            assert intruder.ask("AUTH upstream-secret") == \
                [b"-WRONGPASS invalid username-password pair or user is disabled.\r\n"]
        finally:
            intruder.close()
        opened = proxy.opened
    stats = control.command("INFO commandstats").decode()
    assert int(re.search(r"cmdstat_auth:calls=(\d+)", stats)[1]) == opened + 1   # + the control's


def test_without_its_own_credentials_the_pool_passes_on_the_servers_noauth(guarded, clients):
    server, _ = guarded
    with SessionProxy(server.addr, framing=RESP) as proxy:
        assert clients(proxy.addr).ask("GET k")[0].startswith(b"-NOAUTH")


def test_a_sync_the_server_refuses_costs_the_request_an_error_and_the_connection_its_life(
        guarded, clients):
    """The server asks a password the pool does not have: a RESP3 client's request goes
    after a HELLO 3 it refuses, so the request is answered with an error, not the server's
    NOAUTH to a connection in the wrong protocol, and that connection is never lent again."""
    server, _ = guarded
    with SessionProxy(server.addr, framing=RESP) as proxy:
        client = clients(proxy.addr)
        assert client.ask("HELLO 3")[0].startswith(b"%7\r\n")
        assert client.ask("GET k") == [b"-ERR upstream: the connection could not take the "
                                       b"client's state: HELLO was answered -NOAUTH HELLO must be "
                                       b"called with the cl\r\n"]   # its first 40 bytes
        assert proxy.discarded == 1


@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_client_info_describes_the_client_its_address_name_and_database_not_a_pool_connection(
        redis, control, clients, pool_kind):
    """rq names a worker by CLIENT INFO's addr: forwarded, it was the pool's own connection's."""
    with make_pool(pool_kind, redis) as proxy:
        client = clients(proxy.addr)
        assert client.ask("CLIENT SETNAME worker", "SELECT 0") == [b"+OK\r\n"] * 2
        mine = "%s:%d" % client.sock.getsockname()
        info = client.ask("CLIENT INFO")[0].decode()
        assert f" addr={mine} laddr=127.0.0.1:{proxy.addr[1]} " in info
        assert " name=worker " in info and " db=0 " in info and info.endswith(" resp=2\n\r\n")
        fields = info.split("\r\n")[1].replace(" resp=2\n", " resp=3\n").encode()
        client.ask("HELLO 3")   # a verbatim string, as redis-server answers a RESP3 client
        assert client.ask("CLIENT INFO") == [b"=%d\r\ntxt:%s\r\n" % (len(fields) + 4, fields)]


@pytest.mark.parametrize("pool_kind", POOL_KINDS)
def test_every_refusal_is_counted_by_the_command_refused(redis, control, clients, pool_kind):
    with make_pool(pool_kind, redis) as proxy:
        client = clients(proxy.addr)
        client.ask("FLUSHALL", "FLUSHALL", "SWAPDB 0 1", "NOSUCH x", "GET k")
        assert dict(proxy.lending.refusals) == {"FLUSHALL": 2, "SWAPDB": 1,
                                                 "(not in the table)": 1}
