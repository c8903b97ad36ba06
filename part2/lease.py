"""lease: what ManagedProxy lends a client whose session keeps state (Redis: a transaction,
a wait, a stream), on the set's loop, beside the shared pipeline. A reader of the batch
path need not read it: a client that never asks for any of this never reaches it.

    ManagedLending  one proxy's lender, as its sessions see it (ground/session.py names what
                    it drives): next_id(), facts() learned once through the set (NotYet
                    until then), how many connections of their own its clients have
                    (within the framing's dedicated_cap), and lends them (link_for();
                    past the cap, wait() within checkout_timeout), given back clean for
                    the next (give_back())
    FactsSink       the client of the pool's own facts_requests()
The links themselves, a connection of a client's own and a stream's, are part2/links.py's.

The order a lent request takes: ClientStream.admit() (session.lease is not POOLED) ->
it waits until every request before it is answered -> ProxyClient.lend() -> an OwnLink
(or the StreamLink) -> its reply to the client -> the requests after it admitted. Inside
a transaction the connection is the client's already: each request goes on it as it is
admitted (ProxyClient.lend_now()), and admission waits only after one whose reply may
change what the session says next (session.settles: MULTI, EXEC, WATCH).
"""
import collections
import itertools

from part2.calls import ManagedError
from ground.session import NotYet
from part2.links import OwnLink
from part2.pipeline import Request

FACTS_RETRY = 1.0   # seconds the pool answers with its failure to learn, before it asks again


class ManagedLending:
    """What one ManagedProxy does for its clients' sessions beside the shared pipeline."""

    def __init__(self, proxy):
        self.proxy = proxy
        self.framing = proxy.framing
        self.ids = itertools.count(1)
        self.learned = None    # what the pool read of its server, once (facts())
        self.learning = False
        self.failure = None    # (when, why) the last learning failed
        self.waiters = []      # what to call once the facts are in (or failed)
        self.own = 0           # connections of a client's own open now (lent, or idle)
        self.own_idle = []     # OwnLinks left clean by their last client, to lend again
        self.queue = collections.deque()   # (client, request, timer): waiting for one
        self.waiting = 0       # how many wait (the stats show it)
        self.dedicated = 0     # such connections ever opened (the tests read it)
        self.refusals = collections.Counter()   # command -> requests its sessions refused

    def next_id(self):
        return next(self.ids)

    def refused(self, command):
        self.refusals[command] += 1

    def facts(self):
        """The server's facts (framing.facts()); the first time, NotYet: they are asked
        through the set, as any request, and every session waiting is told once they come."""
        if self.learned is not None:
            return self.learned
        now = self.proxy.loop.clock.now()
        if self.failure and now < self.failure[0] + FACTS_RETRY:
            raise ConnectionError(self.failure[1])
        if not self.learning:
            self.learning = True
            asked = self.framing.facts_requests()
            sink = FactsSink(self, len(asked))
            for order, data in enumerate(asked):
                request = Request(sink, data)
                request.order = order   # its place among the replies the facts are read from
                self.proxy.managed_set.place(request)
        raise NotYet(self.waiters)

    def learned_now(self, facts=None, failure=None):
        self.learning = False
        self.learned = facts
        if failure is not None:
            self.failure = (self.proxy.loop.clock.now(), failure)
        waiters, self.waiters = self.waiters, []
        for resume in waiters:
            resume()

    def opened(self):
        """One more connection of a client's own, or ManagedError past dedicated_cap."""
        cap = self.framing.dedicated_cap
        if self.own >= cap:
            raise ManagedError(f"no connection of its own for this request: the pool's {cap} "
                               f"dedicated connections are all in use")
        self.own += 1
        self.dedicated += 1

    def closed(self):
        self.own -= 1
        self.serve_waiting()

    def link_for(self, stream):
        """An OwnLink for the client: one left clean by another, or a new one within
        dedicated_cap; None at the cap (then the client waits: wait())."""
        while self.own_idle:
            link = self.own_idle.pop()
            if link.usable():
                link.bind(stream)
                return link
            link.close()
        if self.own >= self.framing.dedicated_cap:
            return None
        return OwnLink(self.proxy, stream)

    def wait(self, stream, request):
        """The client waits for a connection of its own, checkout_timeout at most, and is
        then refused, naming the cap; its request goes once one is free (serve_waiting())."""
        loop, patience = self.proxy.loop, self.proxy.checkout_timeout
        entry = [stream, request, None]
        entry[2] = loop.at(loop.clock.now() + patience, lambda: self.waited_too_long(entry))
        self.queue.append(entry)
        self.waiting = len(self.queue)

    def waited_too_long(self, entry):
        if entry in self.queue:
            self.queue.remove(entry)
            self.waiting = len(self.queue)
            cap, patience = self.framing.dedicated_cap, self.proxy.checkout_timeout
            entry[0].refused(ManagedError(
                f"no connection of its own free within {patience:g} s: the pool's {cap} "
                f"dedicated connections are all in use"))

    def room_for_a_stream(self):
        """Room under the cap for a stream's connection (never lent again): an idle one is
        closed to make it, if need be."""
        if self.own >= self.framing.dedicated_cap and self.own_idle:
            self.own_idle.pop().close()
        return self.own < self.framing.dedicated_cap

    def give_back(self, link):
        """A link its client is done with, clean: lent to the next that waits, or kept."""
        if link.usable():
            self.own_idle.append(link)
            self.serve_waiting()
        else:
            link.close()

    def close_all(self):
        """The proxy is closing: what is kept is closed, and nobody waits any more."""
        queue, self.queue = self.queue, collections.deque()
        for _, _, timer in queue:
            timer.cancel()
        while self.own_idle:
            self.own_idle.pop().close()

    def serve_waiting(self):
        """Whoever waits for a connection of its own, in turn, while there is one to lend."""
        while self.queue and (self.own_idle or self.own < self.framing.dedicated_cap):
            stream, request, timer = self.queue.popleft()
            self.waiting = len(self.queue)
            timer.cancel()
            if not stream.gone:
                stream.lend(request)


class FactsSink:
    """The client of the pool's own facts_requests(): their replies, in their order."""

    def __init__(self, lending, count):
        self.lending = lending
        self.replies = {}   # request -> its reply
        self.count = count
        self.over = False

    def replied(self, request, reply):
        self.replies[request] = reply
        if len(self.replies) == self.count and not self.over:
            self.over = True
            in_order = [self.replies[key] for key in sorted(self.replies, key=order_of)]
            try:
                facts = self.lending.framing.facts(in_order)
            except ValueError as error:
                self.lending.learned_now(failure=f"the server's facts: {error}")
                return
            self.lending.learned_now(facts)

    def failed(self, request, error):
        if not self.over:
            self.over = True
            self.lending.learned_now(failure=str(error))


def order_of(request):
    return request.order
