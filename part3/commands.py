"""commands: the Redis commands a pool knows how to frame, one row each, and what it does
with each. A command that is not in the table is refused before any borrow: a pool forwards
only what it knows how to frame (an allow list, not a deny list), as twemproxy does.

A row gives a command (or a container's subcommand, `CLIENT KILL`), the types of reply it
can get, in RESP2's type bytes (`+` simple string, `:` integer, `$` bulk string, `*` array;
an error, `-`, can answer anything; rows() adds each type's RESP3 equivalents), and its
kind: what it does to the connection. The kind says how many replies a request gets and
what the pool does with it (its action):

    FORWARD     send it on a shared connection; its one reply ends the loan
    CONFINED    forward it only where the server confines the pool's upstream user (a
                script calls other commands as that user: FLUSHALL too, unless its ACL
                refuses them); else refused, naming the remedy (part3/acl.py)
    REPLAY      state the pool could keep for the client and bring a connection to
    ANSWER      the pool's to answer for the client, never a shared connection's
    PIN         a transaction: the connection would be the client's until it ends
    DEDICATE    a stream or a wait: a connection of its own, for as long as it lasts
    POLICY      refused by default (it acts on the whole server); allowed by name
    NEVER       refused whatever the policy says

A kind marked policy=True (MONITOR's) is refused by default too, and once allowed by name
has its own action, not FORWARD's.

What a pool does for REPLAY, ANSWER, PIN and DEDICATE is its session's (RedisSession, in
part3/session.py): a pool that keeps state for its clients (SessionProxy, ManagedProxy)
replays SELECT, answers the session's commands itself, pins a transaction's connection and
dedicates one to a wait or a stream; a session given no lender refuses each, naming its rule,
and a refused MULTI refuses its transaction whole. The table reads them as redis-server does:
lookup() finds a subcommand only under its container, as redis-server's command lookup
does, and kind_of() reads the arguments that change a command's kind (XREAD's and
XREADGROUP's BLOCK, wherever redis-server's own parse of their options finds it).

The table is also the list of what a pool refuses, and why (COMMENTARY.md points here):

    not in the table   a command the pool cannot frame or lend safely (see the note above
                       TABLE): the CLUSTER family, MIGRATE, any command newer than the table
    server             acts on the whole server (FLUSHALL, CONFIG SET, CLIENT PAUSE, SWAPDB):
                       refused unless the user allows it by name (Resp(allow={"FLUSHDB"}),
                       `--allow`); MONITOR likewise, then a connection of its own
    replication        REPLCONF, PSYNC, SYNC: the connection would become a replica's link
    credentials        CONFIG SET requirepass: the pool could open no connection after it
    silences           CLIENT REPLY (its OFF and SKIP): no reply would end the loan
    debugger           SCRIPT DEBUG: the connection would become a debugger's session
    script (CONFINED)  EVAL, EVALSHA, FCALL: refused, naming the remedy, unless the server
                       confines the pool's upstream user (part3/acl.py)

The last four kinds are NEVER: no policy allows them. Besides the table, an inline command
with quotes or a NUL byte is always refused (part3/words.py): redis-server would read words
from it that the pool never saw.

Map of the module:

    KINDS           each kind: its replies, what it does to the connection, its action
    TABLE           the rows, by group, as text: name, reply types, kind
    COMMANDS        the rows by name (bytes, upper case); CONTAINERS, the containers
    lookup(items)   the row a request's words name, or None; name_of(items) its name
    kind_of(row, items)   the row's kind, or the kind its arguments make it
"""
import collections
import math
import re

FORWARD, CONFINED, REPLAY, ANSWER, PIN, DEDICATE, POLICY, NEVER = (
    "forward", "confined", "replay", "answer", "pin", "dedicate", "policy", "never")

Kind = collections.namedtuple("Kind", "replies effect action policy", defaults=(False,))
Row = collections.namedtuple("Row", "name replies kind")

KINDS = {
    "plain": Kind("one", "leaves the connection as it was", FORWARD),
    "script": Kind("one", "runs a script, which calls commands as the pool's upstream user (it "
                          "cannot select, block or subscribe the caller's connection, but it "
                          "can call what the table refuses, FLUSHALL, unless that user's ACL "
                          "refuses it)", CONFINED),
    "state": Kind("one", "sets state on the connection that the next borrower would inherit",
                  REPLAY),
    "session": Kind("one (QUIT: then the end)",
                    "speaks for the client's session: who it is, how it speaks, when it ends",
                    ANSWER),
    "transaction": Kind("one each (+QUEUED), then EXEC's array",
                        "is part of a transaction, state the connection keeps until EXEC or "
                        "DISCARD", PIN),
    "stream": Kind("one per channel, then pushes no request asked for",
                   "turns the connection into a stream of pushes no request asked for", DEDICATE),
    "blocks": Kind("one, once the wait ends", "holds the connection for as long as it waits",
                   DEDICATE),
    "monitor": Kind("one, then every command the server runs",
                    "streams every client's commands to the connection", DEDICATE, policy=True),
    "server": Kind("one", "acts on the whole server: all its keys, its settings, its life or its "
                          "other clients", POLICY),
    "replication": Kind("none, or a stream", "makes the connection a replica's link", NEVER),
    "credentials": Kind("one", "changes the password every connection must give the server, "
                               "which is the pool's to say (AUTH belongs to the pool): the pool "
                               "could open no connection after it", NEVER),
    "silences": Kind("none", "switches the connection's replies off, so no reply ends a loan",
                     NEVER),
    "debugger": Kind("a debugger's stream", "makes the connection a script debugger's session",
                     NEVER),
}

# Not in the table, so refused: the CLUSTER family, ASKING, READONLY, READWRITE and
# RESTORE-ASKING (a pool in front of one server is no cluster node), MIGRATE (the server
# connects to another), PFDEBUG and PFSELFTEST (internals), and any command newer than
# this table. ACL WHOAMI is plain while the pool has no users of its own: every client of
# it is the pool's upstream user, so the server's answer is the client's. CLIENT SETINFO,
# CLIENT NO-TOUCH and WAITAOF came with Redis 7.2 (redis-py 8 sends CLIENT SETINFO as it
# connects): their rows say what they do. KEYS is plain: one reply, and the connection as it
# was; its cost is the server's, as a long SORT's is (twemproxy refuses it because its keys
# are spread over many servers, which one server's pool has no reason to do).
TABLE = """
# command               replies kind
# -- connection and session
PING                    +$      plain
ECHO                    $       plain
HELLO                   *       session
AUTH                    +       session
RESET                   +       session
QUIT                    +       session
SELECT                  +       state
CLIENT CACHING          +       state
CLIENT GETNAME          $       session
CLIENT GETREDIR         :       plain
CLIENT HELP             *       plain
CLIENT ID               :       session
CLIENT INFO             $       session
CLIENT KILL             +:      server
CLIENT LIST             $       server
CLIENT NO-EVICT         +       state
CLIENT NO-TOUCH         +       state
CLIENT PAUSE            +       server
CLIENT REPLY            +       silences
CLIENT SETINFO          +       session
CLIENT SETNAME          +       session
CLIENT TRACKING         +       stream
CLIENT TRACKINGINFO     *       plain
CLIENT UNBLOCK          :       server
CLIENT UNPAUSE          +       server
# -- transactions
MULTI                   +       transaction
EXEC                    *       transaction
DISCARD                 +       transaction
WATCH                   +       transaction
UNWATCH                 +       transaction
# -- publish and subscribe; MONITOR
PUBLISH                 :       plain
SPUBLISH                :       plain
PUBSUB CHANNELS         *       plain
PUBSUB HELP             *       plain
PUBSUB NUMPAT           :       plain
PUBSUB NUMSUB           *       plain
PUBSUB SHARDCHANNELS    *       plain
PUBSUB SHARDNUMSUB      *       plain
SUBSCRIBE               *       stream
PSUBSCRIBE              *       stream
SSUBSCRIBE              *       stream
UNSUBSCRIBE             *       stream
PUNSUBSCRIBE            *       stream
SUNSUBSCRIBE            *       stream
MONITOR                 +       monitor
# -- keys
COPY                    :       plain
DEL                     :       plain
DUMP                    $       plain
EXISTS                  :       plain
EXPIRE                  :       plain
EXPIREAT                :       plain
EXPIRETIME              :       plain
KEYS                    *       plain
MOVE                    :       plain
OBJECT ENCODING         $       plain
OBJECT FREQ             :$      plain
OBJECT HELP             *       plain
OBJECT IDLETIME         :$      plain
OBJECT REFCOUNT         :$      plain
PERSIST                 :       plain
PEXPIRE                 :       plain
PEXPIREAT               :       plain
PEXPIRETIME             :       plain
PTTL                    :       plain
RANDOMKEY               $       plain
RENAME                  +       plain
RENAMENX                :       plain
RESTORE                 +       plain
SCAN                    *       plain
SORT                    *:      plain
SORT_RO                 *       plain
TOUCH                   :       plain
TTL                     :       plain
TYPE                    +       plain
UNLINK                  :       plain
WAIT                    :       blocks
WAITAOF                 *       blocks
# -- strings and bitmaps
APPEND                  :       plain
DECR                    :       plain
DECRBY                  :       plain
GET                     $       plain
GETDEL                  $       plain
GETEX                   $       plain
GETRANGE                $       plain
GETSET                  $       plain
INCR                    :       plain
INCRBY                  :       plain
INCRBYFLOAT             $       plain
LCS                     $*:     plain
MGET                    *       plain
MSET                    +       plain
MSETNX                  :       plain
PSETEX                  +       plain
SET                     +$      plain
SETEX                   +       plain
SETNX                   :       plain
SETRANGE                :       plain
STRLEN                  :       plain
SUBSTR                  $       plain
BITCOUNT                :       plain
BITFIELD                *       plain
BITFIELD_RO             *       plain
BITOP                   :       plain
BITPOS                  :       plain
GETBIT                  :       plain
SETBIT                  :       plain
# -- hashes
HDEL                    :       plain
HEXISTS                 :       plain
HGET                    $       plain
HGETALL                 *       plain
HINCRBY                 :       plain
HINCRBYFLOAT            $       plain
HKEYS                   *       plain
HLEN                    :       plain
HMGET                   *       plain
HMSET                   +       plain
HRANDFIELD              $*      plain
HSCAN                   *       plain
HSET                    :       plain
HSETNX                  :       plain
HSTRLEN                 :       plain
HVALS                   *       plain
# -- lists
BLMOVE                  $*      blocks
BLMPOP                  *       blocks
BLPOP                   *       blocks
BRPOP                   *       blocks
BRPOPLPUSH              $*      blocks
LINDEX                  $       plain
LINSERT                 :       plain
LLEN                    :       plain
LMOVE                   $       plain
LMPOP                   *       plain
LPOP                    $*      plain
LPOS                    :$*     plain
LPUSH                   :       plain
LPUSHX                  :       plain
LRANGE                  *       plain
LREM                    :       plain
LSET                    +       plain
LTRIM                   +       plain
RPOP                    $*      plain
RPOPLPUSH               $       plain
RPUSH                   :       plain
RPUSHX                  :       plain
# -- sets
SADD                    :       plain
SCARD                   :       plain
SDIFF                   *       plain
SDIFFSTORE              :       plain
SINTER                  *       plain
SINTERCARD              :       plain
SINTERSTORE             :       plain
SISMEMBER               :       plain
SMEMBERS                *       plain
SMISMEMBER              *       plain
SMOVE                   :       plain
SPOP                    $*      plain
SRANDMEMBER             $*      plain
SREM                    :       plain
SSCAN                   *       plain
SUNION                  *       plain
SUNIONSTORE             :       plain
# -- sorted sets
BZMPOP                  *       blocks
BZPOPMAX                *       blocks
BZPOPMIN                *       blocks
ZADD                    :$      plain
ZCARD                   :       plain
ZCOUNT                  :       plain
ZDIFF                   *       plain
ZDIFFSTORE              :       plain
ZINCRBY                 $       plain
ZINTER                  *       plain
ZINTERCARD              :       plain
ZINTERSTORE             :       plain
ZLEXCOUNT               :       plain
ZMPOP                   *       plain
ZMSCORE                 *       plain
ZPOPMAX                 *       plain
ZPOPMIN                 *       plain
ZRANDMEMBER             $*      plain
ZRANGE                  *       plain
ZRANGEBYLEX             *       plain
ZRANGEBYSCORE           *       plain
ZRANGESTORE             :       plain
ZRANK                   :$*     plain
ZREM                    :       plain
ZREMRANGEBYLEX          :       plain
ZREMRANGEBYRANK         :       plain
ZREMRANGEBYSCORE        :       plain
ZREVRANGE               *       plain
ZREVRANGEBYLEX          *       plain
ZREVRANGEBYSCORE        *       plain
ZREVRANK                :$*     plain
ZSCAN                   *       plain
ZSCORE                  $       plain
ZUNION                  *       plain
ZUNIONSTORE             :       plain
# -- streams (XREAD and XREADGROUP block with BLOCK: kind_of() reads it)
XACK                    :       plain
XADD                    $       plain
XAUTOCLAIM              *       plain
XCLAIM                  *       plain
XDEL                    :       plain
XGROUP CREATE           +       plain
XGROUP CREATECONSUMER   :       plain
XGROUP DELCONSUMER      :       plain
XGROUP DESTROY          :       plain
XGROUP HELP             *       plain
XGROUP SETID            +       plain
XINFO CONSUMERS         *       plain
XINFO GROUPS            *       plain
XINFO HELP              *       plain
XINFO STREAM            *       plain
XLEN                    :       plain
XPENDING                *       plain
XRANGE                  *       plain
XREAD                   *       plain
XREADGROUP              *       plain
XREVRANGE               *       plain
XSETID                  +       plain
XTRIM                   :       plain
# -- hyperloglog and geo
PFADD                   :       plain
PFCOUNT                 :       plain
PFMERGE                 +       plain
GEOADD                  :       plain
GEODIST                 $       plain
GEOHASH                 *       plain
GEOPOS                  *       plain
GEORADIUS               *:      plain
GEORADIUSBYMEMBER       *:      plain
GEORADIUSBYMEMBER_RO    *       plain
GEORADIUS_RO            *       plain
GEOSEARCH               *       plain
GEOSEARCHSTORE          :       plain
# -- scripts and functions
EVAL                    +:$*    script
EVALSHA                 +:$*    script
EVAL_RO                 +:$*    script
EVALSHA_RO              +:$*    script
FCALL                   +:$*    script
FCALL_RO                +:$*    script
SCRIPT DEBUG            +       debugger
SCRIPT EXISTS           *       plain
SCRIPT FLUSH            +       server
SCRIPT HELP             *       plain
SCRIPT KILL             +       server
SCRIPT LOAD             $       plain
FUNCTION DELETE         +       plain
FUNCTION DUMP           $       plain
FUNCTION FLUSH          +       server
FUNCTION HELP           *       plain
FUNCTION KILL           +       server
FUNCTION LIST           *       plain
FUNCTION LOAD           $       plain
FUNCTION RESTORE        +       server
FUNCTION STATS          *       plain
# -- the server
COMMAND                 *       plain
COMMAND COUNT           :       plain
COMMAND DOCS            *       plain
COMMAND GETKEYS         *       plain
COMMAND GETKEYSANDFLAGS *       plain
COMMAND HELP            *       plain
COMMAND INFO            *       plain
COMMAND LIST            *       plain
DBSIZE                  :       plain
INFO                    $       plain
LOLWUT                  $       plain
TIME                    *       plain
MEMORY USAGE            :$      plain
MEMORY HELP             *       plain
MEMORY DOCTOR           $       server
MEMORY MALLOC-STATS     $       server
MEMORY PURGE            +       server
MEMORY STATS            *       server
ACL CAT                 *       plain
ACL GENPASS             $       plain
ACL HELP                *       plain
ACL WHOAMI              $       plain
ACL DELUSER             :       server
ACL DRYRUN              +$      server
ACL GETUSER             *$      server
ACL LIST                *       server
ACL LOAD                +       server
ACL LOG                 *+      server
ACL SAVE                +       server
ACL SETUSER             +       server
ACL USERS               *       server
CONFIG HELP             *       plain
CONFIG GET              *       server
CONFIG RESETSTAT        +       server
CONFIG REWRITE          +       server
CONFIG SET              +       server
MODULE HELP             *       plain
MODULE LIST             *       server
MODULE LOAD             +       server
MODULE LOADEX           +       server
MODULE UNLOAD           +       server
LATENCY HELP            *       plain
LATENCY DOCTOR          $       server
LATENCY GRAPH           $       server
LATENCY HISTOGRAM       *       server
LATENCY HISTORY         *       server
LATENCY LATEST          *       server
LATENCY RESET           :       server
SLOWLOG HELP            *       plain
SLOWLOG GET             *       server
SLOWLOG LEN             :       server
SLOWLOG RESET           +       server
BGREWRITEAOF            +       server
BGSAVE                  +       server
DEBUG                   +:$*    server
FAILOVER                +       server
FLUSHALL                +       server
FLUSHDB                 +       server
LASTSAVE                :       server
REPLICAOF               +       server
ROLE                    *       server
SAVE                    +       server
SHUTDOWN                +       server
SLAVEOF                 +       server
SWAPDB                  +       server
PSYNC                   +       replication
REPLCONF                +*      replication
SYNC                    $       replication
"""

REPLY_TYPES = frozenset(b"+:$*")
# What each RESP2 type of a row also is in RESP3: the types redis-server writes down to it
# for a RESP2 client (a map, a set or a null array as an array; a double, a big number, a
# verbatim string or a null as a bulk string; a boolean as an integer). A blob error is an
# error, and an attribute may annotate any reply: every row takes both.
RESP3_OF = {ord("*"): b"%~_", ord("$"): b"=,(_", ord(":"): b"#", ord("+"): b""}
EVERY_ROW = b"!|"


def resp3(replies):
    """A row's RESP2 reply types, each followed by its RESP3 equivalents, and EVERY_ROW's."""
    return b"".join(bytes([kind]) + RESP3_OF[kind] for kind in replies) + EVERY_ROW


def rows(table):
    """The rows of a table written as TABLE is: one a line, the name first (one or two
    words), then the reply types and the kind; a line starting with # is a comment. A
    row's replies are its RESP2 types and their RESP3 equivalents (resp3())."""
    for line in table.splitlines():
        if line.strip() and not line.startswith("#"):
            *name, replies, kind = line.split()
            yield Row(" ".join(name).encode("ascii"), resp3(replies.encode("ascii")), kind)


COMMANDS = {row.name: row for row in rows(TABLE)}
# The commands that are containers of subcommands: the table's, and CLUSTER, which it lacks
# (so that a refusal names the subcommand, `CLUSTER INFO`).
CONTAINERS = {row.name.split(b" ")[0] for row in COMMANDS.values() if b" " in row.name} | \
    {b"CLUSTER"}


def name_of(items):
    """The name a request's words give, as redis-server looks a command up: a container's
    subcommand by the second word (`CLIENT KILL`), the first alone otherwise (`COMMAND`
    alone is a command of its own; `CLIENT` alone is no command)."""
    command = items[0].upper()
    if command in CONTAINERS and len(items) > 1:
        return command + b" " + items[1].upper()
    return command


def lookup(items):
    """The row for a request's words, or None if the table has none."""
    return COMMANDS.get(name_of(items))


def option(word):
    """An option word as redis-server compares it (strcasecmp, which stops at a NUL)."""
    return word.split(b"\x00", 1)[0].upper()


def xread_blocks(items):
    """True if XREAD or XREADGROUP waits: its options read as xreadCommand() reads them
    (redis src/t_stream.c), left to right until STREAMS: BLOCK and COUNT take one argument,
    GROUP two (its group and its consumer, whatever they are called), NOACK none; GROUP
    and NOACK only in XREADGROUP. So in `XREADGROUP GROUP g STREAMS BLOCK 0 STREAMS s >` the
    first STREAMS names a consumer and BLOCK is an option. A word that is none of these
    ends the parse (redis-server answers a syntax error); so does STREAMS, after which come
    keys and ids. A BLOCK with a timeout redis-server would refuse is taken as a wait."""
    return xread_block(items) is not None


def xread_block(items):
    """Where XREAD's or XREADGROUP's BLOCK argument (its timeout) stands, as xread_blocks()
    reads the options; None if it has none."""
    grouped = items[0].upper() == b"XREADGROUP"
    position = 1
    while position < len(items):
        word, more = option(items[position]), len(items) - position - 1
        if word == b"BLOCK" and more:
            return position + 1
        if word == b"COUNT" and more:
            position += 2
        elif word == b"GROUP" and more >= 2 and grouped:
            position += 3
        elif word == b"NOACK" and grouped:
            position += 1
        else:
            return None
    return None


# The commands whose arguments can change their kind: (the test, the kind, the option's name).
def sets_requirepass(items):
    """True if CONFIG SET names requirepass among its parameters (each a name, then a value)."""
    return any(name.lower() == b"requirepass" for name in items[2::2])


BY_ARGUMENTS = {
    b"XREAD": (xread_blocks, "blocks", b"BLOCK"),
    b"XREADGROUP": (xread_blocks, "blocks", b"BLOCK"),
    b"CONFIG SET": (sets_requirepass, "credentials", b"requirepass"),
}


def kind_of(row, items):
    """The kind of the request: its row's, unless its arguments change it (BY_ARGUMENTS)."""
    if row.name in BY_ARGUMENTS:
        changes, kind, _ = BY_ARGUMENTS[row.name]
        if changes(items):
            return kind
    return row.kind


# Where each command that waits takes its timeout (an index into its words) and in what
# unit (seconds per unit), as redis-server reads them; a timeout of 0 waits for ever.
WAITS = {
    b"BLPOP": (-1, 1), b"BRPOP": (-1, 1), b"BRPOPLPUSH": (-1, 1), b"BLMOVE": (-1, 1),
    b"BZPOPMIN": (-1, 1), b"BZPOPMAX": (-1, 1), b"BLMPOP": (1, 1), b"BZMPOP": (1, 1),
    b"WAIT": (-1, 0.001), b"WAITAOF": (-1, 0.001),
}
TIMEOUT = re.compile(rb"[0-9]+(\.[0-9]*)?|\.[0-9]+")   # what a timeout a wait takes looks like


def wait_of(items):
    """How long a request that waits may wait upstream, in seconds (math.inf: for ever), as
    its own timeout says; None if it has none redis-server would take (it answers at once,
    with an error)."""
    command = items[0].upper()
    if command in (b"XREAD", b"XREADGROUP"):
        where, unit = xread_block(items), 0.001
    elif command in WAITS and len(items) > 1:
        where, unit = WAITS[command]
    else:
        return None
    if where is None or not -len(items) < where < len(items):
        return None
    timeout = items[where]
    if not TIMEOUT.fullmatch(timeout):
        return None
    return float(timeout) * unit or math.inf
