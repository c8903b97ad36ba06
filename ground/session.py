"""ground.session: what a pool keeps of one client between its requests, as a lender and a
session speak to each other. A reader of Part one need not open it: Part one's FramedProxy
keeps nothing of a client. Parts two and three do: a Redis client has a database, a protocol,
a transaction, a subscription.

    POOLED, HELD, OWN   how a request is lent a connection (Session.lease)
    NotYet              what a session raises while its answer needs what the lender is still
                        learning (Redis: the server's version)
    Session             the interface, each name once, with the toy protocol's answers: it
                        keeps nothing, and refuses what the framing's refusal() names

The two sides. A pool's lender (part3/lending.py's Lending for FramedProxy, Part two's for
ManagedProxy) makes one session per client (framing.session(lender)) and drives it one
request at a time: admit() first, then, for a request it sends on, the rest of the names
below. A session asks its lender three things: next_id() (the client's number), facts()
(what the lender learnt of its server, once; NotYet while it learns), and refused(name), to
count a request it refused by its command (the pool's stats show them).
"""

POOLED, HELD, OWN = "pooled", "held", "own"


class NotYet(Exception):
    """A session's answer needs what its lender is still learning: then(resume) is called
    once it has been learnt (or has failed)."""

    def __init__(self, waiters):
        super().__init__("not learned yet")
        self.waiters = waiters

    def then(self, resume):
        if resume not in self.waiters:
            self.waiters.append(resume)


class Session:
    """One client's session: the interface a lender drives (see the module's map).

    What admit() leaves for the lender to read, about the request it admitted:
      lease      POOLED: any connection, for this request; HELD: the one the client holds
                 (its transaction), kept while `holds`; OWN: one opened for it, closed after
      wait       how long its reply may take to begin (a command that waits), or None
      quitting   the client asked to end: nothing after this request is answered
      streams    its connection is now a stream of messages no request asked for
      settles    what the session says of the next request waits for this one's reply: it
                 may begin or end a transaction, or end a stream (then the lender sends
                 barrier())
    What a connection must carry, and the session's judgment of what it says:
      state                   what a connection must carry for this client's requests
      sync(state)             the requests that bring a connection carrying `state` (None: just
                              opened) to this client's; synced(request, reply) why a reply to
                              one of them is wrong, or None
      fits(request, reply)    whether a reply can answer the request, as this session judges
      replied(request, reply) a reply came on the connection the client holds: a transaction
                              begun or ended (holds)
      barrier(), pushed(message)   on a stream: a request whose reply the lender can tell
                              apart, and whether a message is the client's (False: the
                              barrier's reply; then a stream whose subscriptions are gone ends)
      lost(why)               the connection the client's mode lived on is gone (why: for
                              the refusals of what the client still sends of its transaction)
      addresses               (the client's address, the pool's), as its lender sets them
    """
    lease, wait, state, addresses = POOLED, None, None, None
    holds = quitting = streams = settles = False

    def __init__(self, framing, lender=None):
        self.framing, self.lender = framing, lender

    def admit(self, request):
        """None to send the request on, or the bytes the pool answers with itself (b"":
        nothing). The toy protocol's session refuses what the framing's refusal() names."""
        refusal = self.framing.refusal(request)
        return self.framing.error(f"tcp-proxy: {refusal}") if refusal else None

    def sync(self, state):
        return []

    def synced(self, request, reply):
        return None

    def fits(self, request, reply):
        return self.framing.fits(request, reply, framed=True)

    def replied(self, request, reply):
        """Nothing to note: the toy protocol's client never holds a connection."""

    def barrier(self):
        raise NotImplementedError("the toy protocol has no stream")

    def pushed(self, message):
        raise NotImplementedError("the toy protocol has no stream")

    def lost(self, why=None):
        """Nothing was held: nothing to let go."""
