"""acl: what a script may do through the pool. A reader of the lesson need not read it: it is
the operator's side of one row of the command table (scripts).

A script runs on the server and calls commands as the user of the connection that runs it,
so through a pool it has the pool's upstream user's rights, not a client's: on a stock
redis-server that user may run FLUSHALL, which the table refuses when a client sends it.
The pool cannot read a script's mind; redis-server can, since it checks every command a
script calls against that user's ACL. So the pool forwards a script only where its upstream
user's ACL refuses what the table refuses, and the rule it needs is the table's own:

    rules(framing, password)   the ACL rules of a user who may run what the pool forwards
                               (the table's rows, its policy applied) and what the pool
                               asks itself (CONFIG GET databases), nothing else
    probe(sock, framing)       asked of the server as the pool's upstream user: which
                               commands it knows, and which the table refuses that a script
                               of that user could run (redis.acl_check_cmd(), from a script:
                               any user that may run a script may ask it, where ACL DRYRUN
                               needs an admin)
    confine(addr, **options)   at the start of `python3 -m part3 serve`: a Resp whose scripts
                               are forwarded (the user is confined, or the pool has made one
                               of its own), or refused with the remedy; and a line to log
    main(argv)                 `python3 -m part3 acl`: the rule as one ACL SETUSER line for an
                               operator to install
"""
import argparse
import hashlib
import hmac
import os
import socket
import sys

from part3 import commands
from part3.redis_server import read_resp
from part3.resp import Resp
from part3.words import array, decode, words

USER = b"tcp-proxy"   # the name of the user the pool makes, or the operator installs
PROBE_TIMEOUT = 5.0   # seconds the start-up probe may take, connect and replies
TELLING = {b"FLUSHALL", b"FLUSHDB", b"SWAPDB"}   # named first when a user may run them
# Asked from inside a script, so as the pool's upstream user: of the commands named in ARGV
# (each its words, space-separated), those that user may run. A name the server does not know
# raises in acl_check_cmd(): pcall() keeps the loop going, and the name is not listed.
PROBE = b"""
local permitted = {}
for _, name in ipairs(ARGV) do
  local words = {}
  for word in string.gmatch(name, '%S+') do table.insert(words, word) end
  local ok, allowed = pcall(redis.acl_check_cmd, unpack(words))
  if ok and allowed then table.insert(permitted, name) end
end
return permitted
"""


def acl_name(name):
    """A table name as ACL rules and COMMAND LIST write it: CLIENT SETNAME -> client|setname."""
    return name.lower().replace(b" ", b"|")


def own_names(framing):
    """The commands the pool sends itself, for no client: what it asks of its server once."""
    return [commands.name_of(words(request)) for request in framing.facts_requests()]


def refused_names(framing):
    """The table's names this framing's policy refuses for a client (a POLICY or NEVER
    verdict), those the pool sends itself aside."""
    own = own_names(framing)
    return [name for name in commands.COMMANDS if name not in own and
            framing.verdict(name.split(b" "))[0] in (commands.POLICY, commands.NEVER)]


def allowed_names(framing):
    """What the pool may send a server: every table name its policy does not refuse, and the
    commands it sends itself."""
    refused = set(refused_names(framing))
    return [name for name in commands.COMMANDS if name not in refused]


def password_of(upstream_password):
    """The password of the user the pool makes: derived from the pool's upstream password, so
    two pools with the same credentials agree on it (each makes the user again as it connects)
    and nobody without that password can derive it."""
    return hmac.new(upstream_password or b"", USER, hashlib.sha256).hexdigest().encode()


def rules(framing, password, known=None):
    """The ACL rules of the pool's user, given its password: any key, any channel, and the
    commands allowed_names() lists that the server knows (`known`, COMMAND LIST's names; None:
    all of them). `reset` first, so the rules are the same whatever the user was before."""
    digest = hashlib.sha256(password).hexdigest().encode()
    names = [acl_name(name) for name in allowed_names(framing)]
    return [b"reset", b"on", b"#" + digest, b"~*", b"&*", b"-@all"] + \
        [b"+" + name for name in names if known is None or name in known]


def probe(sock, framing):
    """(the server's command names, the refused names a script of this user may run) asked on
    sock, authenticated as the pool's upstream user. ConnectionError if the server will not
    say (an error reply: a server older than Redis 7, or a user who may not ask)."""
    reader = Reader(sock)
    names = refused_names(framing)
    sock.sendall(array(b"COMMAND", b"LIST") + array(b"EVAL", PROBE, b"0", *names))
    listed, permitted = read_resp(reader), read_resp(reader)
    for reply in (listed, permitted):
        if reply.startswith(b"-"):
            raise ConnectionError(reply[1:].strip().decode("utf-8", "replace"))
    return set(decode(listed)), decode(permitted)


class Reader:
    """What redis_server.read_resp() reads from: a socket and what was read past a reply."""

    def __init__(self, sock):
        self.sock, self.unread = sock, b""


def confine(addr, **options):
    """A Resp made with `options` whose scripts are safe to forward, and a line for the log
    (None: nothing to say). Asked of the server once, as the pool's upstream user: if it may
    run nothing the table refuses, scripts are forwarded as they are; if it may also make ACL
    users, the pool makes one of its own (USER, rules()) and its connections run as it; else
    scripts are refused, and the line says why and what to do."""
    framing = Resp(**options)
    try:
        with socket.create_connection(addr, timeout=PROBE_TIMEOUT) as sock:
            for request, reply in authenticated(sock, framing):
                if reply != b"+OK\r\n":
                    raise ConnectionError(f"the upstream refused the pool's AUTH: {reply!r:.60}")
            known, permitted = probe(sock, framing)
    except (OSError, ValueError) as error:
        return framing, (f"scripts are refused: the pool could not ask the server what its "
                         f"upstream user may run ({error}); redis-server 7 answers it")
    unsafe = [name for name in permitted if name != b"ACL SETUSER"]
    if not unsafe:
        return Resp(**options, confined=True), None
    unsafe.sort(key=lambda name: name not in TELLING)   # stable: the rest in the table's order
    shown = ", ".join(name.decode() for name in unsafe[:3])
    if len(unsafe) > 3:
        shown += f" and {len(unsafe) - 3} more"
    if b"ACL SETUSER" not in permitted:
        return framing, (f"scripts are refused: the upstream user may run {shown}, which the "
                         f"pool refuses, and may not make a user to confine them; install the "
                         f"rule `python3 -m part3 acl` prints and use its user (--upstream-user)")
    password = password_of(framing.upstream_password)
    own_user = (USER, password, rules(framing, password, known))
    return Resp(**options, own_user=own_user), (
        f"the upstream user may run {shown}, which the pool refuses, and so could any script: "
        f"the pool's connections run as ACL user {USER.decode()}, whose rules are the command "
        f"table's (`python3 -m part3 acl` prints them)")


def authenticated(sock, framing):
    """The pool's own AUTH on sock, if it has one: (request, reply) pairs."""
    requests = framing.opening()
    sock.sendall(b"".join(requests))
    reader = Reader(sock)
    return [(request, read_resp(reader)) for request in requests]


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python3 -m part3 acl",
        description="print the ACL SETUSER line that confines the pool's upstream user to what "
                    "the pool forwards, for redis-cli; its password is UPSTREAM_PASSWORD's")
    parser.add_argument("--user", default=USER.decode(),
                        help="the user's name (default: %(default)s)")
    parser.add_argument("--allow", nargs="*", default=(), metavar="NAME",
                        help="commands the pool is started with --allow")
    parser.add_argument("--upstream", default=None, metavar="HOST:PORT",
                        help="list only the commands this server knows (COMMAND LIST)")
    options = parser.parse_args(sys.argv[1:] if argv is None else argv)
    password = os.environ.get("UPSTREAM_PASSWORD")
    if not password:
        parser.error("the user's password comes from UPSTREAM_PASSWORD, as serve reads it")
    framing = Resp(allow=options.allow)
    known = None
    if options.upstream:
        host, _, port = options.upstream.rpartition(":")
        with socket.create_connection((host.strip("[]"), int(port)), PROBE_TIMEOUT) as sock:
            known, _ = probe(sock, framing)
    line = [b"ACL", b"SETUSER", options.user.encode()]
    line += rules(framing, password.encode(), known)
    print(b" ".join(line).decode())
    return 0
