"""part3/commands.py: the command table, held against redis-server's own COMMAND list, and
every request it refuses refused before any borrow, on both Redis pools (SessionProxy and
ManagedProxy over RESP): the commands it lacks, the ones that turn a connection into a
replica's link or a debugger, the ones that act on the whole server (a policy, opened by
name), the blocking forms hidden in arguments, and the inline commands redis-server would
read otherwise. What each refusal prevents is what the test shows: no reply shifted onto
another client, no connection held, nothing of the server changed.
"""
import os
import random
import re
import socket
import time
import types

import pytest
from hypothesis import given, settings, strategies as st

from part2.managed import ManagedProxy
from part3 import acl, commands, conftest
from part3.conftest import array
from part3.parser import Overlong
from part3.resp import RESP, Resp
from part3.words import words
from part3 import redis_server
from part3.framed import SessionProxy

TIMEOUT = 3.0   # seconds a client of these tests waits for a reply before the test fails
EXAMPLES = int(os.environ.get("SOAK", "40"))   # `make soak` raises it; the suite stays fast

NEVER = "makes the connection a replica's link; a pool never passes it"
SERVER_WIDE = ("acts on the whole server: all its keys, its settings, its life or its other "
               "clients; refused by the pool's policy (allow it by name)")
BLOCKS = "holds the connection for as long as it waits; a pool cannot lend it"
LACKS = "is not in the pool's command table, so the pool cannot tell what answers it"


def refused(reason):
    return b"-ERR tcp-proxy: %s\r\n" % reason.encode()


def reader_of(sock):
    return types.SimpleNamespace(sock=sock, unread=b"")   # what redis_server.read_resp() reads from


class Client(conftest.Client):
    """The shared raw client, waiting TIMEOUT for a reply, that can also hear silence."""

    def __init__(self, addr, timeout=TIMEOUT):
        super().__init__(addr, timeout)

    def read_or_silence(self):
        """A whole reply, or "silence" if none comes within the client's timeout."""
        try:
            return self.read()
        except TimeoutError:
            return "silence"


def set_up(control, *lines):
    """Run the test's own commands directly, then forget them: INFO commandstats from here on
    counts only what came through the pool (commands_run())."""
    for line in lines:
        control.command(line)
    control.command("CONFIG RESETSTAT")


PROXIES = {
    "SessionProxy": lambda redis, framing=RESP: SessionProxy(redis.addr, framing=framing,
                                                             pool_cap=1),
    "ManagedProxy": lambda redis, framing=RESP: ManagedProxy([(redis.addr, 1)], framing=framing),
}


@pytest.fixture
def clients():
    """clients(addr, n): n connected Clients, closed at the test's end."""
    made = []

    def connect(addr, count=1, timeout=TIMEOUT):
        made.extend(Client(addr, timeout) for _ in range(count))
        return made[-count:] if count > 1 else made[-1]

    yield connect
    for client in made:
        client.close()


def commands_run(control):
    """The commands redis-server ran since the test's CONFIG RESETSTAT, by name (`client|list`)."""
    stats = control.command("INFO commandstats").decode()
    return set(re.findall(r"cmdstat_([^:]+):calls=", stats)) - {"config|resetstat", "info"}


# --- a RESP2 reader for COMMAND's reply, for these tests only ------------------------------

def decode(data, position=0):
    """(value, end) of the RESP2 value at position: bytes, int, None or a list."""
    end = data.index(b"\r\n", position)
    kind, line = data[position:position + 1], data[position + 1:end]
    if kind in (b"+", b"-"):
        return line, end + 2
    if kind == b":":
        return int(line), end + 2
    if kind == b"$" and line == b"-1":
        return None, end + 2
    if kind == b"$":
        return data[end + 2:end + 2 + int(line)], end + 4 + int(line)
    items, position = [], end + 2
    for _ in range(max(int(line), 0)):
        item, position = decode(data, position)
        items.append(item)
    return items, position


@pytest.fixture(scope="module")
def server_commands(redis):
    """What redis-server says of each of its commands and subcommands: name -> (flags, ACL
    categories), the name upper case, a subcommand as `CLIENT KILL`."""
    control = redis_server.RedisControl(redis.addr)
    try:
        listed, _ = decode(control.command("COMMAND"))
    finally:
        control.close()
    found = {}

    def note(entry):
        name = entry[0].upper().replace(b"|", b" ")
        found[name] = (set(entry[2]), set(entry[6]))
        for subcommand in entry[9]:
            note(subcommand)

    for entry in listed:
        note(entry)
    return found


def containers(server_commands):
    return {name.split(b" ")[0] for name in server_commands if b" " in name}


# --- the table, held against redis-server's own list ---------------------------------------

NEWER = {b"CLIENT SETINFO", b"CLIENT NO-TOUCH", b"WAITAOF"}   # Redis 7.2's, rows for what they do


def test_every_row_names_a_command_redis_server_lists_or_one_newer_than_it(server_commands):
    assert set(commands.COMMANDS) - set(server_commands) == NEWER


def test_every_row_has_resp2_reply_types_with_their_resp3_equivalents_and_a_kind_with_an_action():
    actions = {commands.FORWARD, commands.CONFINED, commands.REPLAY, commands.ANSWER, commands.PIN,
               commands.DEDICATE, commands.POLICY, commands.NEVER}
    assert {kind.action for kind in commands.KINDS.values()} == actions
    for row in commands.COMMANDS.values():
        resp2 = bytes(kind for kind in row.replies if kind in commands.REPLY_TYPES)
        assert resp2 and row.replies == commands.resp3(resp2), row
        assert row.kind in commands.KINDS, row
    assert commands.COMMANDS[b"HGETALL"].replies == b"*%~_!|"    # a map in RESP3
    assert commands.COMMANDS[b"ZSCORE"].replies == b"$=,(_!|"    # a double, or a null


def test_redis_servers_own_flags_agree_with_each_rows_kind(server_commands):
    """redis-server's ACL categories: a @transaction command is a transaction, a @blocking
    one blocks (or may, by its arguments), an @admin one is never forwarded by default.
    (WAIT, which waits for replicas, blocks too, though not in the category.)"""
    for name, row in commands.COMMANDS.items():
        if name in NEWER:
            continue
        _, categories = server_commands[name]
        action = commands.KINDS[row.kind].action
        assert (b"@transaction" in categories) == (row.kind == "transaction"), name
        may_block = row.kind == "blocks" or name in commands.BY_ARGUMENTS
        assert b"@blocking" not in categories or may_block, name
        assert b"@admin" not in categories or action != commands.FORWARD, name


def test_the_table_lacks_the_cluster_family_and_the_commands_no_single_pool_vouches_for(
        server_commands):
    lacking = set(server_commands) - set(commands.COMMANDS) - containers(server_commands)
    cluster = {name for name in lacking if name.startswith(b"CLUSTER ")}
    assert lacking - cluster == {b"ASKING", b"READONLY", b"READWRITE", b"RESTORE-ASKING",
                                  b"MIGRATE", b"PFDEBUG", b"PFSELFTEST"}


@pytest.mark.parametrize("proxy_kind", PROXIES)
def test_commands_redis_server_lists_and_the_table_lacks_are_each_refused_by_name_and_never_run(
        redis, control, clients, server_commands, proxy_kind):
    """Twenty of them, drawn with a fixed seed. Before: each reached redis-server (its own
    error came back, or it ran: PFSELFTEST)."""
    lacking = sorted(set(server_commands) - set(commands.COMMANDS) - containers(server_commands))
    assert len(lacking) >= 20
    chosen = random.Random(27).sample(lacking, 20)
    set_up(control)
    with PROXIES[proxy_kind](redis) as proxy:
        client = clients(proxy.addr)
        replies = client.ask(*(array(*name.split(b" ")) for name in chosen))
        assert replies == [refused(f"{name.decode()} {LACKS}") for name in chosen]
        assert client.ask(array("PING")) == [b"+PONG\r\n"]
    assert commands_run(control) == {"ping"}


@pytest.mark.parametrize("request_, name", [
    (array("CLIENT", "NO-SUCH-THING"), "CLIENT NO-SUCH-THING"),   # a subcommand it lacks
    (array("client"), "CLIENT"),                                 # a container alone is no command
    (array("DPING"), "DPING"),                                   # what redis-py's tests probe with
    (b"NOSUCH a b\r\n", "NOSUCH"),
])
def test_a_command_or_subcommand_the_table_lacks_is_refused_naming_it(request_, name):
    assert RESP.refusal(request_) == f"{name} {LACKS}"


def test_a_command_name_with_a_nul_is_refused_whatever_comes_before_it():
    """redis-server's command lookup compares names with strcasecmp(), which stops at a NUL."""
    assert RESP.refusal(array(b"GET\x00", "a")) == "a command name with a NUL byte (GET\\x00)"
    assert RESP.refusal(array(b"CLIENT", b"list\x00x")) == \
        "a command name with a NUL byte (CLIENT LIST\\x00X)"


# --- the reply's types: an allow list ------------------------------------------------------

def test_a_reply_fits_a_command_only_if_the_table_declares_its_type_and_an_error_fits_any_row():
    assert RESP.fits(array("GET", "k"), b"$1\r\nv\r\n") and RESP.fits(array("GET", "k"), b"$-1\r\n")
    assert RESP.fits(array("GET", "k"), b"_\r\n") and RESP.fits(array("HGETALL", "h"), b"%0\r\n")
    assert RESP.fits(array("GET", "k"), b"!3\r\nERR\r\n")   # RESP3's blob error
    assert not RESP.fits(array("GET", "k"), b"%0\r\n")
    assert not RESP.fits(array("GET", "k"), b">0\r\n")   # a push answers no request
    assert not RESP.fits(array("GET", "k"), b"+OK\r\n")
    assert not RESP.fits(array("INCR", "n"), b"$1\r\n1\r\n")
    assert RESP.fits(array("INCR", "n"), b":1\r\n")
    assert RESP.fits(array("INCR", "n"), b"-ERR no\r\n")
    assert RESP.fits(array("client", "id"), b":7\r\n")
    assert not RESP.fits(array("CLIENT", "ID"), b"*0\r\n")
    assert RESP.fits(array("MGET", "a"), b"*1\r\n$-1\r\n")


def test_no_reply_fits_a_command_the_table_lacks_not_even_an_error():
    """Before: fits() took any reply for a command it had no entry for (REPLCONF, PSYNC)."""
    for reply in (b"+OK\r\n", b"*1\r\n$3\r\nSET\r\n", b"-ERR x\r\n"):
        assert not RESP.fits(array("REPLCONFX", "ACK", "0"), reply)
        assert not RESP.fits(b"\r\n", reply)


def test_a_reply_read_whole_and_dropped_fits_by_its_first_byte():
    head_of_a_long_array = b"*100000\r\n$4\r\nvvvv\r\n"
    dropped = Overlong(2_000_000, RESP.max_reply, head_of_a_long_array, request=False)
    assert RESP.fits(array("LRANGE", "l", 0, -1), dropped)
    assert not RESP.fits(array("GET", "k"), dropped)


def test_a_reply_the_framing_framed_fits_by_its_type_alone_as_a_whole_one_does():
    assert RESP.fits(array("GET", "k"), b"$1\r\nv\r\n", framed=True)
    assert not RESP.fits(array("GET", "k"), b"+OK\r\n", framed=True)
    assert RESP.fits(array("INCR", "n"), b"-ERR no\r\n", framed=True)
    assert not RESP.fits(array("CLIENT", "ID"), b"*0\r\n", framed=True)
    assert not RESP.fits(array("REPLCONFX", "ACK", "0"), b"-ERR x\r\n", framed=True)
    dropped = Overlong(2_000_000, RESP.max_reply, b"*100000\r\n$4\r\nvvvv\r\n", request=False)
    assert RESP.fits(array("LRANGE", "l", 0, -1), dropped, framed=True)
    assert not RESP.fits(array("GET", "k"), dropped, framed=True)


REPLIES = [b"+OK\r\n", b"-ERR x\r\n", b":1\r\n", b"$1\r\nv\r\n", b"$-1\r\n", b"*1\r\n$1\r\nv\r\n",
           b"*-1\r\n", b"", b"$1\r\n", b"+OK\r\n+OK\r\n"]
NAMES = sorted({row.name.split(b" ")[0] for row in commands.COMMANDS.values()}) + [
    b"NOPE", b"GET\x00", b"G\r\nET", b"CLUSTER", b""]


def cased(name, seed):
    chooser = random.Random(seed)
    return bytes(chooser.choice((byte, ord(chr(byte).lower()))) if byte < 128 else byte
                 for byte in name)


@settings(max_examples=EXAMPLES * 5, deadline=None)
@given(name=st.sampled_from(NAMES), seed=st.integers(0, 99),
       arguments=st.lists(st.one_of(st.sampled_from([b"BLOCK", b"0", b"STREAMS", b"ID", b"LIST"]),
                                    st.binary(max_size=8)), max_size=4),
       policy=st.sampled_from([RESP, Resp(allow={"FLUSHDB"}, refuse={"GET"})]))
def test_what_a_requests_name_alone_says_is_what_its_words_say(name, seed, arguments, policy):
    """forwards_plainly() and fits() read the name and remember it; the words say the same."""
    request = array(cased(name, seed), *arguments)
    items = words(request)
    if policy.forwards_plainly(request):
        assert policy.verdict(items) == (commands.FORWARD, None)
        assert policy.session().admit(request) is None
    for reply in REPLIES:
        row = commands.lookup(items or [b""])
        whole = reply != b"" and RESP.reply_size(reply) == len(reply)
        expected = row is not None and whole and (reply[:1] == b"-" or reply[:1] in row.replies)
        assert policy.fits(request, reply) == expected
        if whole:
            assert policy.fits(request, reply, framed=True) == expected


def test_forwards_plainly_only_a_forwarded_command_whose_arguments_cannot_change_that():
    for request in (array("GET", "k"), array("get", "k"), array("SET", "k", "v"), array("PING")):
        assert RESP.forwards_plainly(request), request
    for request in (array("CLIENT", "ID"), array("XREAD", "STREAMS", "s", "0"), array("MULTI"),
                    array("FLUSHDB"), array("NOPE"), array(b"GET\x00", "a"), b"GET k\r\n",
                    array(b"GE\r\nT", "a"), b"*2\r\n$2\r\nGET\r\n$1\r\nk\r\n"):
        assert not RESP.forwards_plainly(request), request
    assert Resp(allow={"FLUSHDB"}).forwards_plainly(array("FLUSHDB"))
    assert not Resp(refuse={"GET"}).forwards_plainly(array("GET", "k"))


# --- replication and the debugger: never passed (the critical findings) ---------------------

@pytest.mark.parametrize("proxy_kind", PROXIES)
def test_replconf_which_redis_server_answers_with_nothing_is_refused_so_no_later_reply_shifts(
        redis, control, clients, proxy_kind):
    """Before, on ManagedProxy: a read b's value and b read c's (each reply settled the
    call before its own); on SessionProxy a waited reply_timeout for a reply never sent."""
    set_up(control, "SET secret:b b-own", "SET secret:c c-own")
    with PROXIES[proxy_kind](redis) as proxy:
        a, b, c = clients(proxy.addr, 3)
        a.send(array("REPLCONF", "ACK", "0"))
        b.send(array("GET", "secret:b"))
        c.send(array("GET", "secret:c"))
        assert [a.read_or_silence(), b.read_or_silence(), c.read_or_silence()] == \
            [refused(f"REPLCONF {NEVER}"), b"$5\r\nb-own\r\n", b"$5\r\nc-own\r\n"]
        assert a.ask(array("REPLCONF", "GETACK", "*")) == [refused(f"REPLCONF {NEVER}")]
    assert commands_run(control) == {"get"}


@pytest.mark.parametrize("proxy_kind", PROXIES)
def test_psync_and_sync_are_refused_so_no_pooled_connection_becomes_a_replica(
        redis, control, clients, proxy_kind):
    """Before: `PSYNC ? -1` was answered +FULLRESYNC and the replication stream followed; on
    ManagedProxy its arrays settled the calls behind it (a victim's MGET read another's SET)."""
    set_up(control, "SET password:user0 hunter0")
    with PROXIES[proxy_kind](redis) as proxy:
        attacker, victim = clients(proxy.addr, 2)
        attacker.send(array("PSYNC", "?", "-1"), array("SYNC"))
        victim.send(array("MGET", "password:user0"))
        assert [attacker.read(), attacker.read()] == \
            [refused(f"PSYNC {NEVER}"), refused(f"SYNC {NEVER}")]
        assert victim.read() == b"*1\r\n$7\r\nhunter0\r\n"
    assert b"connected_slaves:0\r\n" in control.command("INFO replication")
    assert commands_run(control) == {"mget"}


@pytest.mark.parametrize("proxy_kind", PROXIES)
def test_script_debug_is_refused_so_the_next_borrowers_eval_runs_and_writes(
        redis, control, clients, proxy_kind):
    """Before: the next borrower's EVAL got the debugger's opening lines, and its INCR never ran."""
    set_up(control, "SET counter 10")
    script = "return redis.call('INCR', KEYS[1])"
    framing, _ = acl.confine(redis.addr)   # scripts go: the pool's connections run confined
    with PROXIES[proxy_kind](redis, framing) as proxy:
        debugger, victim = clients(proxy.addr, 2)
        assert debugger.ask(array("SCRIPT", "DEBUG", "YES")) == \
            [refused("SCRIPT DEBUG makes the connection a script debugger's session; "
                     "a pool never passes it")]
        assert victim.ask(array("EVAL", script, 1, "counter")) == [b":11\r\n"]
    assert control.command("GET counter") == b"$2\r\n11\r\n"


@pytest.mark.parametrize("proxy_kind", PROXIES)
def test_replicaof_is_refused_by_default_and_passes_once_allowed_by_name(
        redis, control, clients, proxy_kind):
    """Before: `REPLICAOF <host> <port>` was answered +OK, and the server dropped every
    client's data for the attacker's and turned read-only. Here its harmless form."""
    set_up(control)
    with PROXIES[proxy_kind](redis) as proxy:
        assert clients(proxy.addr).ask(array("REPLICAOF", "NO", "ONE")) == \
            [refused(f"REPLICAOF {SERVER_WIDE}")]
    assert commands_run(control) == set()
    with PROXIES[proxy_kind](redis, Resp(allow={"REPLICAOF"})) as proxy:
        assert clients(proxy.addr).ask(array("REPLICAOF", "NO", "ONE")) == [b"+OK\r\n"]
    assert b"role:master\r\n" in control.command("INFO replication")


# --- server-wide and administrative commands: refused by a policy, opened by name ----------

HARMLESS_SERVER_WIDE = [   # the review's forms, or as harmless: none changes anything here
    ("DEBUG", "SLEEP", "0"), ("CLIENT", "PAUSE", "1"), ("CLIENT", "UNPAUSE"),
    ("CLIENT", "KILL", "ID", "999999999"), ("CLIENT", "LIST"), ("SHUTDOWN", "ABORT"),
    ("FAILOVER", "ABORT"), ("CONFIG", "SET", "maxmemory-clients", "0"), ("FLUSHALL",),
    ("SWAPDB", "1", "2"), ("SCRIPT", "KILL"),
    ("CONFIG", "GET", "requirepass"),
]


@pytest.mark.parametrize("proxy_kind", PROXIES)
def test_server_wide_commands_are_refused_by_default_each_naming_the_policy_and_none_runs(
        redis, control, clients, proxy_kind):
    """Before: 17 of the review's 19 reached redis-server through each pool; SHUTDOWN NOSAVE
    stopped it, CLIENT PAUSE 2000 stalled every other client for 2 s."""
    set_up(control, "SET survivor here")
    names = [" ".join(form[:2]) if form[0] in ("CLIENT", "CONFIG", "SCRIPT") else form[0]
             for form in HARMLESS_SERVER_WIDE]
    with PROXIES[proxy_kind](redis) as proxy:
        client = clients(proxy.addr)
        replies = client.ask(*(array(*form) for form in HARMLESS_SERVER_WIDE))
        assert replies == [refused(f"{name} {SERVER_WIDE}") for name in names]
        assert client.ask(array("ACL", "WHOAMI")) == [b"$7\r\ndefault\r\n"]   # the pool's user
    assert commands_run(control) == {"acl|whoami"}
    assert control.command("GET survivor") == b"$4\r\nhere\r\n"


@pytest.mark.parametrize("proxy_kind", PROXIES)
def test_keys_is_forwarded_by_default_and_leaves_the_connection_for_the_next_request(
        redis, control, clients, proxy_kind):
    """django-redis's cache.keys() and arq's all_job_results() send it, and so do the Lua
    scripts of dramatiq and limits: one reply, nothing kept on the connection."""
    set_up(control, "SET job:1 a", "SET job:2 b", "SET other c")
    with PROXIES[proxy_kind](redis) as proxy:
        client = clients(proxy.addr)
        found, after = client.ask(array("KEYS", "job:*"), array("GET", "other"))
        assert sorted(found.split(b"\r\n")[2::2]) == [b"job:1", b"job:2"]
        assert after == b"$1\r\nc\r\n"


@pytest.mark.parametrize("proxy_kind", PROXIES)
def test_client_pause_write_is_refused_so_readers_never_queue_behind_paused_writers(
        redis, control, clients, proxy_kind):
    """Before: `CLIENT PAUSE 3000 WRITE` passed; a writer's SET held the pool's connection
    paused, and a reader's GET behind it waited 3 s."""
    set_up(control, "SET read-me fine")
    with PROXIES[proxy_kind](redis) as proxy:
        pauser, writer, reader = clients(proxy.addr, 3)
        assert pauser.ask(array("CLIENT", "PAUSE", 2000, "WRITE")) == \
            [refused(f"CLIENT PAUSE {SERVER_WIDE}")]
        started = time.monotonic()
        writer.send(array("SET", "written", "yes"))
        reader.send(array("GET", "read-me"))
        assert (writer.read(), reader.read()) == (b"+OK\r\n", b"$4\r\nfine\r\n")
        elapsed = time.monotonic() - started
    assert elapsed < 1.0, f"{elapsed:.2f} s"


def test_the_policy_opens_a_server_wide_command_by_name_and_refuses_a_forwarded_one_by_name():
    assert RESP.verdict([b"FLUSHDB"]) == (commands.POLICY, f"FLUSHDB {SERVER_WIDE}")
    opened = Resp(allow={"flushdb", b"CONFIG SET"}, refuse={"EVAL"})
    assert opened.verdict([b"FLUSHDB"]) == opened.verdict([b"config", b"set", b"x", b"y"]) == \
        (commands.FORWARD, None)
    assert opened.verdict([b"FLUSHALL"])[0] == commands.POLICY
    script = [b"EVAL", b"return 1", b"0"]
    assert opened.verdict(script) == (commands.POLICY, "EVAL is refused by the pool's policy")
    assert Resp(confined=True).verdict(script) == (commands.FORWARD, None)


def test_a_script_is_refused_with_its_remedy_until_the_pool_knows_its_upstream_user_is_confined():
    action, reason = RESP.verdict([b"FCALL", b"flush", b"0"])
    assert action == commands.CONFINED
    assert reason.startswith("FCALL runs a script, which calls commands as the pool's upstream "
                             "user")
    assert reason.endswith("start it with `python3 -m part3 serve`, which confines it where it "
                           "can, or install the rule `python3 -m part3 acl` prints")


@pytest.mark.parametrize("name, why", [
    ("REPLCONF", "REPLCONF cannot be allowed by name: it makes the connection a replica's link "
                 "(its action is never)"),
    ("SCRIPT DEBUG", "SCRIPT DEBUG cannot be allowed by name: it makes the connection a script "
                     "debugger's session (its action is never)"),
    ("MULTI", "MULTI cannot be allowed by name: it is part of a transaction, state the connection "
              "keeps until EXEC or DISCARD (its action is pin)"),
    ("CLUSTER INFO", "CLUSTER INFO is not in the command table: no pool frames it"),
])
def test_a_command_the_policy_cannot_open_is_a_value_error_naming_why(name, why):
    with pytest.raises(ValueError) as raised:
        Resp(allow={name})
    assert str(raised.value) == why


# --- arguments that change a command's kind, read as redis-server reads them ------------------

@pytest.mark.parametrize("items, blocks", [
    ("XREAD BLOCK 0 STREAMS s $", True),
    ("XREAD COUNT 1 BLOCK 0 STREAMS s $", True),
    ("XREAD COUNT 1 STREAMS block 0", False),                        # a key named block
    ("XREAD STREAMS s BLOCK 0 0", False),                            # after STREAMS: keys and ids
    ("XREADGROUP GROUP g STREAMS BLOCK 0 STREAMS s >", True),        # a consumer named STREAMS
    ("XREADGROUP GROUP g c NOACK BLOCK 10 STREAMS s >", True),
    ("XREADGROUP GROUP g block STREAMS s >", False),                 # a consumer named block
    ("XREAD GROUP g c BLOCK 0 STREAMS s $", False),                  # GROUP is XREADGROUP's
    ("XREAD BLOCK", False),                                          # no argument: a syntax error
])
def test_xread_blocks_where_redis_servers_own_parse_of_its_options_finds_block(items, blocks):
    assert commands.xread_blocks([word.encode() for word in items.split()]) is blocks


def test_an_option_is_compared_up_to_its_first_nul_as_redis_server_compares_it(redis):
    """redis-server's strcasecmp() stops at the NUL: `BLOCK\\x00x` is BLOCK (it waits)."""
    request = array("XREAD", b"BLOCK\x00x", 300, "STREAMS", "no-such-stream", "$")
    assert RESP.refusal(request) == f"XREAD BLOCK {BLOCKS}"
    with socket.create_connection(redis.addr, timeout=5) as direct:   # it does wait, directly
        started = time.monotonic()
        direct.sendall(request)
        assert redis_server.read_resp(reader_of(direct)) == b"*-1\r\n"
        assert time.monotonic() - started >= 0.3


@pytest.mark.parametrize("proxy_kind", PROXIES)
def test_a_blocking_xreadgroup_hidden_behind_a_consumer_named_streams_holds_no_shared_connection(
        redis, control, clients, proxy_kind):
    """Before: the refusal looked for BLOCK before the first STREAMS only; the one connection
    blocked, and no victim was answered (an XADD through the pool queued behind it). Now
    each pool gives the wait a connection of its own (the victim's XADD ends it)."""
    set_up(control, "DEL s", "XGROUP CREATE s g $ MKSTREAM")
    hidden = array("XREADGROUP", "GROUP", "g", "STREAMS", "BLOCK", 0, "STREAMS", "s", ">")
    with PROXIES[proxy_kind](redis) as proxy:
        attacker, victim = clients(proxy.addr, 2)
        attacker.send(hidden)
        assert victim.ask(array("XADD", "s", "1-1", "f", "v"), array("PING")) == \
            [b"$3\r\n1-1\r\n", b"+PONG\r\n"]
        assert attacker.read() == (b"*1\r\n*2\r\n$1\r\ns\r\n*1\r\n*2\r\n$3\r\n1-1\r\n"
                                   b"*2\r\n$1\r\nf\r\n$1\r\nv\r\n")
        assert proxy.lending.dedicated == 1   # the wait's own, now closed


# --- inline commands redis-server would read otherwise ----------------------------------------

@pytest.mark.parametrize("proxy_kind", PROXIES)
def test_an_inline_command_with_a_nul_is_refused_so_redis_server_never_waits_on_it(
        redis, control, clients, proxy_kind):
    """Before: redis-server answered nothing to `GET a\\x00b` or to anything after it on
    that connection: ManagedProxy's one connection answered no one again."""
    set_up(control, "SET after-nul fine")
    with PROXIES[proxy_kind](redis) as proxy:
        attacker, victim = clients(proxy.addr, 2)
        assert attacker.ask(b"GET a\x00b\r\n", b"GET after-nul\r\n") == [
            refused("an inline command with a NUL byte (redis-server's inline parser stops at it)"),
            b"$4\r\nfine\r\n"]
        assert victim.ask(array("GET", "after-nul")) == [b"$4\r\nfine\r\n"]


def test_an_inline_commands_words_are_split_as_redis_server_splits_them(redis):
    """A \\v or \\f inside a word is part of it; before one, a blank (sdssplitargs())."""
    assert words(b"SET k\x0bx\x0c v\r\n") == [b"SET", b"k\x0bx\x0c", b"v"]
    assert words(b" \x0bGET\t\x0ck \r\n") == [b"GET", b"k"]
    with socket.create_connection(redis.addr, timeout=5) as direct:
        reader = reader_of(direct)
        direct.sendall(b"SET k\x0bx\x0c v\r\n" + array("GET", b"k\x0bx\x0c"))
        direct.sendall(b" \x0bGET\t\x0ck\x0bx\x0c \r\n")
        replies = [redis_server.read_resp(reader) for _ in range(3)]
        assert replies == [b"+OK\r\n", b"$1\r\nv\r\n", b"$1\r\nv\r\n"]


# --- requests that would get no reply hold no connection ----------------------------------------

@pytest.mark.parametrize("proxy_kind", PROXIES)
def test_requests_redis_server_would_never_answer_are_refused_before_any_borrow_and_hold_nothing(
        redis, control, clients, proxy_kind):
    """Before, through SessionProxy: each held the pool's one connection for reply_timeout
    (5 s), and two of them made a victim's PING wait about 5 s; ManagedProxy's stopped.
    The wait goes on a connection of its own, which redis-server answers at once (the
    group g does not exist)."""
    never_answered = [array("REPLCONF", "ACK", 0), b"GET a\x00b\r\n",
                      array("XREADGROUP", "GROUP", "g", "STREAMS", "BLOCK", 0, "STREAMS", "s", ">")]
    set_up(control, "DEL s")   # no stream, no group g
    with PROXIES[proxy_kind](redis) as proxy:
        attacker, victim = clients(proxy.addr, 2)
        attacker.send(*never_answered)
        started = time.monotonic()
        assert victim.ask(array("PING")) == [b"+PONG\r\n"]
        elapsed = time.monotonic() - started
        replies = [attacker.read()[:15] for _ in never_answered]
    assert replies == [b"-ERR tcp-proxy:"] * 2 + [b"-NOGROUP No suc"]
    assert elapsed < 1.0, f"{elapsed:.2f} s"
