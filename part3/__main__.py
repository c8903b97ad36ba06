"""`python3 -m part3 serve ...`: the Redis pools as a command (part3/serve.py says how)."""
import sys

from part3 import serve

if sys.argv[1:2] != ["serve"]:
    sys.exit("usage: python3 -m part3 serve --upstream HOST:PORT [...] (--help for the rest)")
sys.exit(serve.main(sys.argv[2:]))
