"""serve: the Redis pools as a command, in front of a real redis-server. A reader of the lesson
need not read it: it builds a pool from its arguments and runs it until a signal.

    python3 -m part3 serve --upstream HOST:PORT [--listen HOST:PORT] [--kind framed|managed]
                           [--size N] [--allow NAME ...] [--stats HOST:PORT]
                           [--user NAME] [--upstream-user NAME]

AUTH belongs to the pool: with a client password, a client must AUTH (or HELLO ... AUTH)
with it before anything is forwarded; with upstream credentials, every connection the pool
opens says them itself. Passwords come from the environment (POOL_PASSWORD, UPSTREAM_PASSWORD),
not from arguments, which any user of the machine can read in the process list.

Before it listens, it asks the server what its upstream user may run (part3/acl.py): a script
runs as that user, so where it may run what the pool refuses, the pool makes an ACL user of its
own and runs as it, or refuses scripts; a log line on stderr says which. It prints one line once
it listens (where, and where its stats are), a log line on stderr for each upstream connection
that ends in an error, and ends cleanly, exit status 0, on
SIGINT or SIGTERM. The stats port answers each connection with one JSON document of the
pool's counters, then closes it, as twemproxy's stats port does.

    Stats          the stats port: a ground.server.Server whose handle() writes the JSON
    build_pool()   the pool the arguments ask for, listening where they say
    main(argv)     parse, build, print the address, wait for a signal, close
"""
import argparse
import contextlib
import json
import logging
import os
import resource
import signal
import sys

from part2.managed import ManagedProxy
from part3 import acl
from part3.framed import SessionProxy
from ground.server import Server

SERVE_LOG = logging.getLogger("part3.serve")
SIGNALS = {signal.SIGINT, signal.SIGTERM}
DEDICATED = 64        # connections of a client's own, by default: an rq worker holds two
RESERVED_FILES = 32   # descriptors kept for the pool itself: listeners, the loop's, logs


def address(text):
    """HOST:PORT as a (host, port) pair; the host may be an IPv6 address in brackets."""
    host, colon, port = text.rpartition(":")
    if not colon or not port.isdigit() or not host:
        raise argparse.ArgumentTypeError(f"an address is HOST:PORT, not {text!r}")
    return host.strip("[]"), int(port)


def shown(addr):
    host, port = addr[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Stats(Server):
    """Each connection gets the pool's counters as one JSON document, then its end."""

    def __init__(self, pool, listen):
        self.pool = pool
        self.listen_addr = listen
        super().__init__()

    def handle(self, conn):
        conn.sendall(json.dumps(counters_of(self.pool), sort_keys=True).encode() + b"\n")


def counters_of(pool):
    """What a pool counts, by name: its own counters, and for ManagedProxy its set's and the
    sum of its clients'; the clients turned away (no room); the connections of a client's
    own (open, idle, and requests waiting for one); then the requests its sessions refused,
    by command (refused.KEYS)."""
    found = {name: getattr(pool, name) for name in pool.counters}
    if isinstance(pool, ManagedProxy):
        managed_set = pool.managed_set
        found.update({f"set.{name}": getattr(managed_set, name) for name in managed_set.counters})
        for clients in managed_set.clients:
            for client in clients:
                for name in client.counters:
                    key = f"upstream.{name}"
                    found[key] = found.get(key, 0) + getattr(client, name)
    else:
        found.update(idle=len(pool.idle), open=pool.open)
    lending = pool.lending
    found.update({"clients.turned_away": pool.turned_away, "dedicated.open": lending.own,
                  "dedicated.idle": len(getattr(lending, "own_idle", ())),
                  "dedicated.waiting": lending.waiting})
    for command, count in sorted(lending.refusals.items()):
        found[f"refused.{command}"] = count
    return found


class LoggedSessionProxy(SessionProxy):
    """SessionProxy that logs each upstream connection it closes after an error, once, by
    its own port, and why."""

    def upstream_lost(self, sock, error):
        with contextlib.suppress(OSError):   # a socket already shut has no name to give
            port = sock.getsockname()[1]
            SERVE_LOG.warning("upstream connection from port %s closed: %s", port, error)


QUIET_ENDS = ("shut down", "idle:", "idle for")   # a down the pool chose: not worth a line


def log_transitions(source, event):
    """ManagedProxy's on_event: a line for each upstream connection that goes down but by the
    pool's own choice, once, naming its upstream and why."""
    if event[0] == "transition" and event[2] == "down" and not event[3].startswith(QUIET_ENDS):
        SERVE_LOG.warning("upstream connection to %s down: %s", shown(source.addr), event[3])


def open_files():
    """This process's limit on open files, raised first to the most it may have (its hard
    limit), as redis-server raises its own."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):   # a limit the system will not give
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def max_clients(options, files):
    """--max-clients, or by default what the file limit leaves after the pool's upstream
    connections, its clients' connections of their own, and its own (RESERVED_FILES)."""
    if options.max_clients is not None:
        return options.max_clients
    return max(files - options.size - options.dedicated - RESERVED_FILES, 1)


def build_pool(options, environ=os.environ, files=None):
    """The pool, and whatever the start-up check of its upstream user said (acl.confine())."""
    framing, said = acl.confine(options.upstream, allow=options.allow, user=options.user,
                                password=environ.get("POOL_PASSWORD") or None,
                                upstream_user=options.upstream_user,
                                upstream_password=environ.get("UPSTREAM_PASSWORD") or None,
                                dedicated_cap=options.dedicated)
    if said:
        SERVE_LOG.warning("%s", said)
    where = {"listen_addr": options.listen,
             "max_clients": max_clients(options, files or open_files())}
    if options.kind == "framed":
        kind = type("Served", (LoggedSessionProxy,), where)
        return kind(options.upstream, pool_cap=options.size, framing=framing)
    kind = type("Served", (ManagedProxy,), where)
    return kind([(options.upstream, options.size)], framing=framing, on_event=log_transitions)


def parse(argv, environ=os.environ):
    parser = argparse.ArgumentParser(prog="python3 -m part3 serve",
                                     description="a Redis pool in front of a redis-server")
    parser.add_argument("--upstream", type=address, required=True,
                        help="the redis-server, HOST:PORT")
    parser.add_argument("--listen", type=address, default=("127.0.0.1", 6380),
                        help="where clients connect (default 127.0.0.1:6380; port 0: any free one)")
    parser.add_argument("--kind", choices=("framed", "managed"), default="framed",
                        help="framed: a connection per request in flight (SessionProxy); managed: "
                             "requests pipelined on the loop (ManagedProxy)")
    parser.add_argument("--size", type=int, default=8,
                        help="upstream connections: the pool's cap, or the set's per service")
    parser.add_argument("--dedicated", type=int, default=DEDICATED,
                        help="connections of a client's own at once (a transaction's, a wait's, "
                             "a stream's, a long request's), past which a request waits for one "
                             "(5 s at most), then is refused (default %(default)s)")
    parser.add_argument("--max-clients", type=int, default=None,
                        help="clients served at once; the next is told 'max number of clients "
                             "reached' and closed (default: what the limit on open files "
                             "leaves after the pool's own connections)")
    parser.add_argument("--allow", nargs="*", default=(), metavar="NAME",
                        help="commands the pool's policy refuses that it should pass (FLUSHDB)")
    parser.add_argument("--stats", type=address, default=None,
                        help="a port that answers with the pool's counters as JSON")
    parser.add_argument("--user", default=None,
                        help="the user name clients AUTH as, with the password in POOL_PASSWORD "
                             "(default: default)")
    parser.add_argument("--upstream-user", default=None,
                        help="the user the pool authenticates as upstream, with the password in "
                             "UPSTREAM_PASSWORD")
    options = parser.parse_args(argv)
    for flag, user, variable in (("--user", options.user, "POOL_PASSWORD"),
                                 ("--upstream-user", options.upstream_user, "UPSTREAM_PASSWORD")):
        if user and not environ.get(variable):
            parser.error(f"{flag} needs a password in {variable}")
    return options


def main(argv=None):
    options = parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(format="%(asctime)s %(name)s: %(message)s", level=logging.INFO)
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)   # before any thread: they inherit it
    try:
        pool = build_pool(options)
    except (OSError, ValueError) as error:
        print(f"serve: {error}", file=sys.stderr)
        return 2
    stats = Stats(pool, options.stats) if options.stats else None
    where = f"listening on {shown(pool.addr)}"
    if stats:
        where += f"; stats on {shown(stats.addr)}"
    print(where, flush=True)
    try:
        signal.sigwait(SIGNALS)
    finally:
        if stats:
            stats.close()
        pool.close()
    return 0
