"""`python3 -m part3.wild`: in a venv, that redis-py's transcript; `--all` (make wild): every
pinned venv's; `--table-row` and `--record`: what part3.wild.table and pictures/draw_wild.py
read (part3/wild/incident.py tells each); `relay`: a relay that holds one reply, for your own
client (part3/wild/relay.py)."""
import sys

if sys.argv[1:2] == ["relay"]:
    from part3.wild.relay import main
    sys.exit(main(sys.argv[2:]))

from part3.wild.incident import main

sys.exit(main(sys.argv[1:]))
