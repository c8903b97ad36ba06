"""`python3 -m part3 serve ...`: the Redis pools as a command (part3/serve.py says how);
`python3 -m part3 acl ...`: the ACL rule that confines their upstream user (part3/acl.py)."""
import sys

from part3 import acl, serve

SUBCOMMANDS = {"serve": serve.main, "acl": acl.main}

if sys.argv[1:2] not in ([name] for name in SUBCOMMANDS):
    sys.exit("usage: python3 -m part3 serve --upstream HOST:PORT [...] | python3 -m part3 acl "
             "[...] (--help for the rest)")
sys.exit(SUBCOMMANDS[sys.argv[1]](sys.argv[2:]))
