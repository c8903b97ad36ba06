"""ground: what every part of the house stands on, and no part teaches: the threaded server
and its hooks (server.py), the one framing loop and the kinds of message it gives
(frames.py), the session interface between a pool's lender and a client's session
(session.py), and a server in several processes, for the bench (workers.py). It imports
nothing of the parts above it. A reader of Part one need not open it, except where
COMMENTARY.md sends them."""
