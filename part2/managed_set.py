"""managed_set: ManagedSet, managed clients over equivalent services, and its retries.

    service_order(), choose()   the pick, as plain functions of the loads: which service
                                first, and which client of a service (or a new one)
    Attempts                    one call's attempts: pick, place, and what its errors
                                say next (retry now, after idempotent_wait, or give up)
    Batch                       the first attempts of a turn's proxy entries picked for
                                one client: one run; if it fails, each entry goes on alone
    ManagedSet                  the clients per service, pick(), call(), idempotent_call(),
                                place(), place_batch() (the proxy's way in), shut_down()

The pick runs on the loop, and the run it picks for is placed in the same step (a batch:
in the same turn's placing, which counts what it has picked): the loads it reads are the
loads, so there is nothing to reserve and nothing to lock.
"""
from part2.cache import global_rcache
from part2.calls import (Call, ClusterServiceUnavailable, CommunicationError, ManagedError,
                         MessageLost, MessageTimeout, Run, ServiceUnavailable, check_addr,
                         check_request)
from part2.client import ManagedClient
from part2.clock import check_seconds
from part2.loop import Counted, Loop
from part2.pipeline import OutOfStep, hand_out
from tcp_proxy import LINES


def check_services(services):
    """services is a non-empty list of (addr, max_connections >= 1), every address good."""
    if not services or any(count < 1 for _, count in services):
        raise ValueError("services is a non-empty list of (addr, max_connections >= 1)")
    for addr, _ in services:
        check_addr(addr)


def service_order(count, loads, tried):
    """The indices of count services in the order pick() tries them: by load (a list, for
    "balance_load"; ties by position), or by position (None, for "failover"); those in
    `tried` after all the others."""
    order = range(count)
    if loads is not None:
        order = sorted(order, key=loads.__getitem__)   # stable: ties keep list order
    return sorted(order, key=tried.__contains__) if tried else order


def choose(pending, room, norm, most):
    """Which of a service's clients (their pending calls) takes a call: the busiest below
    norm (Ocamlnet packs, so the others can idle out), else a new one (len(pending)) if
    the service has room, else the least busy below most (None: no limit); else None.
    Ties go to the first in the list."""
    below_norm = [calls for calls in pending if calls < norm]
    if below_norm:
        return pending.index(max(below_norm))
    if len(pending) < room:
        return len(pending)
    if pending and (most is None or min(pending) < most):
        return pending.index(min(pending))
    return None


class Attempts:
    """One call's attempts through a set. The sink of each attempt's run; itself a run to
    its own sink (a thread's Call, a proxy client's Entry), which hears every reply in
    order and, if the attempts give up, the last error."""
    __slots__ = ("owner", "requests", "sink", "retried", "number", "tried", "index", "answered",
                 "state")

    def __init__(self, owner, requests, sink, retried, number=0, index=None, answered=0):
        self.owner = owner     # the ManagedSet
        self.state = getattr(sink, "state", None)   # what their connection must carry first
        self.requests, self.sink, self.retried = requests, sink, retried
        self.number = number   # attempts made (a batch's entry: its batch made the first)
        self.tried = ()        # services the attempts that failed were sent to (then a set)
        self.index = index     # the service of the attempt under way (None: none was picked)
        self.answered = answered   # requests whose replies have come (a retry sends the rest)

    def replied(self, run, replies):
        self.answered += len(replies)
        self.sink.replied(self, replies)
        if self.answered == len(self.requests) and self.owner.on_event:
            self.owner._note("attempt", self.number, self.index, "ok")

    def passing(self, run, piece):
        if not hasattr(self.sink, "passing"):   # a thread's call takes its reply whole
            raise OutOfStep(f"upstream out of step: a reply longer than "
                            f"{self.owner.framing.max_reply} bytes")
        return self.sink.passing(self, piece)

    def failed(self, run, error):
        self.owner._attempt_failed(self, error)


class Batch:
    """The first attempts of a turn's proxy entries picked for one client, as one run: every
    entry's requests end to end, `owners` the entry each request is for. Its replies go to
    their clients in one loop (pipeline.hand_out()). If the run fails, each entry it leaves
    owed goes on alone, as Attempts whose first attempt failed: retried or failed as if it
    had been placed alone, in its client's order."""
    __slots__ = ("owner", "index", "retried", "entries", "owners", "requests", "answered",
                 "state")

    def __init__(self, owner, index, retried, state=None):
        self.owner, self.index, self.retried = owner, index, retried
        self.state = state   # every entry's: a client whose state differs starts a new batch
        self.entries = []    # in the order the turn read them
        self.owners = []     # per request, the entry it is for
        self.requests = []
        self.answered = 0    # requests whose replies have come

    def add(self, entry):
        self.entries.append(entry)
        self.owners += [entry] * len(entry.requests)
        self.requests += entry.requests

    def run(self, deadline):
        data = b"".join([entry.data for entry in self.entries])   # each entry's bytes as they came
        return Run(self.requests, self, deadline, data=data, state=self.state)

    def replied(self, run, replies):
        first = self.answered
        self.answered += len(replies)
        owners = self.owners[first:self.answered]
        hand_out(owners, replies)
        if self.owner.on_event:   # an entry answered whole: its attempt is over, and ok
            for entry in dict.fromkeys(owners):
                if not entry.left:
                    self.owner._note("attempt", 1, self.index, "ok")

    def passing(self, run, piece):
        return self.owners[self.answered].passing(run, piece)

    def failed(self, run, error):
        for entry in self.entries:
            if entry.left:   # owed a reply still: it goes on alone
                answered = len(entry.requests) - entry.left
                attempts = Attempts(self.owner, entry.requests, entry, self.retried, 1,
                                    self.index, answered)
                self.owner._attempt_failed(attempts, error)


class ManagedSet(Counted):
    """Managed clients over equivalent services; services = [(addr, max_connections), ...].

    pick(), for each service in policy order ("balance_load": fewest pending calls first;
    "failover": list order), services this call has tried last, skipping those the cache
    has disabled, takes the client choose() names (an idle one, a new one, the least busy
    below pending_calls_max); else ClusterServiceUnavailable. Given no rcache, the set
    derives its own from the global one with policy "independent", so it fails over; and
    that cache never refuses everything (Envoy's "panic"): with every service disabled,
    pick() takes the one whose window ends first. A retry goes at once to an enabled
    service this call has not tried, and waits idempotent_wait only before trying one
    again; a request that never left, with every enabled service tried, fails at once.
    Made on its own, the set turns a loop of its own on a thread, shared by its clients.
    """
    counters = {"picks": 0, "attempts": 0, "retries": 0, "refusals": 0, "panics": 0,
                "callback_errors": 0}
    # picks     clients handed out by pick(); attempts  attempts begun
    # retries   bumped once a retry has its deadline (now, if no wait); refusals  raised by pick()
    # panics    picks made with every service disabled by the set's own cache
    # callback_errors  its on_event raised; bumped by call_back(), for tests to wait on

    RETRIED_BY_CALL = (CommunicationError, ServiceUnavailable)   # the request never left
    RETRIED_BY_IDEMPOTENT_CALL = RETRIED_BY_CALL + (MessageLost, MessageTimeout,
                                                    ClusterServiceUnavailable)

    def __init__(self, services, *, policy="balance_load", pending_calls_max=None,
                 pending_calls_norm=1, idempotent_max=3, idempotent_wait=1.0, clock=None,
                 on_event=None, rcache=None, framing=LINES, loop=None, **client_options):
        if policy not in ("balance_load", "failover"):
            raise ValueError(f"policy is 'balance_load' or 'failover', not {policy!r}")
        if idempotent_max < 1:
            raise ValueError(f"idempotent_max counts attempts and must be at least 1, "
                             f"not {idempotent_max}")
        check_seconds("idempotent_wait", idempotent_wait)
        if idempotent_wait < 0:
            raise ValueError(f"idempotent_wait is at least 0 seconds, not {idempotent_wait}")
        check_services(services)   # before anything is made: a bad address leaves nothing behind
        self.own_loop = loop is None
        super().__init__(loop or Loop(clock))
        self.services, self.policy = list(services), policy
        self.addrs = [addr for addr, _ in self.services]
        self.pending_calls_max, self.pending_calls_norm = pending_calls_max, pending_calls_norm
        self.idempotent_max, self.idempotent_wait = idempotent_max, idempotent_wait
        self.clock, self.on_event = self.loop.clock, on_event
        self.own_cache = rcache is None   # its own cache never refuses every service (see pick())
        if rcache is None:   # beyond Ocamlnet (its default cache never disables): it fails over
            rcache = global_rcache().derive(policy="independent", clock=clock)
            rcache.on_event = on_event   # its disable windows reach the set's on_event
        self.rcache = rcache
        self.framing = framing   # every client's: where a reply ends, which replies fit a request
        self.client_options = {**client_options, "rcache": self.rcache, "framing": framing}
        self.clients = [[] for _ in self.services]   # per service, in creation order
        self.lone = None    # the one client of a set of one service of one connection, once made
        self.waiting = {}   # Attempts waiting to retry -> their Timer
        self._shut = False
        if self.own_loop:
            self.loop.start()

    def load(self):
        """Pending calls per service."""
        return [sum(client.pending_calls for client in clients) for clients in self.clients]

    # -- the pick --

    def pick(self, tried=()):
        """The client a call made now would go to, and its service's index; services in
        `tried` come after all the others. Nothing is reserved: a call placed at once
        (as the loop does) is counted by the next pick."""
        return self.loop.ask(self._pick, tried)

    def _pick(self, tried):
        if self._shut:
            raise ManagedError("set shut down")
        if self.lone is None:
            enabled = list(map(self.rcache.is_enabled, self.addrs))   # every service, each time
        elif self.rcache.is_enabled(self.addrs[0]):   # one service of one connection: no choice
            self.picks += 1
            return self.lone, 0
        else:
            enabled = [False]
        panic = self._panic_pick(tried) if self.own_cache and not any(enabled) else None
        order = (0,)   # one service: nothing to order
        if len(self.services) > 1:
            loads = self.load() if self.policy == "balance_load" else None
            order = service_order(len(self.services), loads, tried)
        for index in order:
            if (enabled[index] or index == panic) and (client := self._client_in(index)):
                self.picks += 1
                if index == panic:
                    self.count("panics")
                return client, index
        self.count("refusals")
        raise ClusterServiceUnavailable("every connection of every service is busy or disabled")

    def _panic_pick(self, tried):
        """With every service disabled: the index of the one to try anyway, or None. Only the
        set's own cache is overruled: one its parents or availability callback refuse stays out."""
        allowed = [index for index, (addr, _) in enumerate(self.services)
                   if self.rcache.enabled_but_for_windows(addr)]
        ends = {index: self.rcache.window_end(self.services[index][0]) for index in allowed}
        return min(allowed, key=lambda index: (index in tried, ends[index], index), default=None)

    def _client_in(self, index):
        clients = self.clients[index]
        chosen = choose([client.pending_calls for client in clients], self.services[index][1],
                        self.pending_calls_norm, self.pending_calls_max)
        if chosen == len(clients):
            clients.append(ManagedClient(self.services[index][0], on_event=self.on_event,
                                         loop=self.loop, **self.client_options))
            if len(self.services) == self.services[0][1] == 1 and self.pending_calls_max is None:
                self.lone = clients[0]   # choose() would name it every time from now on
        return None if chosen is None else clients[chosen]

    # -- calls and their attempts --

    def call(self, request):
        """Pick and call; retried only if the request never left this process."""
        return self._thread_call(request, self.RETRIED_BY_CALL)

    def idempotent_call(self, request):
        """Pick and call, retrying lost and timed-out requests too: for idempotent requests only."""
        return self._thread_call(request, self.RETRIED_BY_IDEMPOTENT_CALL)

    def _thread_call(self, request, retried):
        check_request(request, self.framing)   # before any pick: a bad request costs nothing
        if self._shut:
            raise ManagedError("set shut down")
        call = Call(request, self.loop)
        return self.loop.complete(call, lambda: self.place([request], call, retried))

    def place(self, requests, sink, retried=RETRIED_BY_CALL):
        """On the loop: send requests (whole ones, in order) through the set; sink hears
        their replies in order, or the error the attempts gave up with."""
        self._attempt(Attempts(self, requests, sink, retried))

    def place_batch(self, entries, retried=RETRIED_BY_CALL):
        """On the loop, once a turn's reads are over: the first attempts of the entries they
        made (proxy clients' requests), one run per client picked (a Batch), so a turn pays
        one pick, run and placing per connection, not per entry. With a choice of clients,
        each entry is picked for, what this turn picked counting as pending. Entries that need
        another state of their connection (a proxy client's database) make a run of their own,
        after the entries before them: the connection's pipeline syncs it first."""
        self.attempts += len(entries)
        batches = {}   # client -> its last Batch
        placing = []   # (client, batch), in the order made: the order they are placed
        batch = None
        for entry in entries:
            if batch is None or self.lone is None:   # one connection, no choice: one pick a turn
                try:
                    client, index = self._pick(())
                except ManagedError as error:   # refused, or shut down: it goes on alone
                    self._attempt_failed(Attempts(self, entry.requests, entry, retried, 1), error)
                    continue
                batch = batches.get(client)
            if batch is None or batch.state != entry.state:   # its connection synced before it
                batch = batches[client] = Batch(self, index, retried, entry.state)
                placing.append((client, batch))
            batch.add(entry)
            client.picked += entry.left
        for client, batch in placing:
            client.picked = 0
            client.place(batch.run(client.deadline()))

    def _attempt(self, attempts):
        attempts.number += 1
        attempts.index = None   # stays None if the pick finds no client
        self.attempts += 1
        try:
            client, attempts.index = self._pick(attempts.tried)
        except ManagedError as error:   # refused, or shut down
            self._attempt_failed(attempts, error)
            return
        requests = attempts.requests[attempts.answered:] if attempts.answered else attempts.requests
        client.place(Run(requests, attempts, client.deadline(), state=attempts.state))

    def _attempt_failed(self, attempts, error):
        if not isinstance(error, attempts.retried):
            attempts.sink.failed(attempts, error)
            return
        self._note("attempt", attempts.number, attempts.index, f"{type(error).__name__}: {error}")
        if attempts.index is not None:
            attempts.tried = {*attempts.tried, attempts.index}
        untried = attempts.index is not None and self._untried_enabled(attempts.tried)
        never_left = isinstance(error, self.RETRIED_BY_CALL)
        if attempts.number == self.idempotent_max or (never_left and not untried):
            attempts.sink.failed(attempts, error)   # the last; or it never left, every one tried
            return
        wait = 0.0 if untried else self.idempotent_wait
        self.count("retries")
        retry = self.loop.at(self.clock.now() + wait, lambda: self._retry(attempts))
        self.waiting[attempts] = retry

    def _retry(self, attempts):
        del self.waiting[attempts]
        self._attempt(attempts)

    def _untried_enabled(self, tried):
        return any(index not in tried and self.rcache.is_enabled(addr)
                   for index, (addr, _) in enumerate(self.services))

    def _note(self, *event):
        if self.on_event:
            self.loop.queue_callback(self, self.on_event, self, event)

    # -- the end --

    def shut_down(self):
        """Final: fail what waits to retry, shut every client down; a loop of its own is
        ended and joined (from a callback on it, it ends once the turn is over)."""
        if not self.loop.stopped:
            try:
                self.loop.ask(self._shut_on_loop)
            except ManagedError:   # the loop stopped meanwhile: what it owned is closed
                pass
        if self.own_loop:
            self.loop.shut_down()

    def _shut_on_loop(self):
        if self._shut:
            return
        self._shut = True
        waiting, self.waiting = self.waiting, {}
        for attempts, timer in waiting.items():
            timer.cancel()
            attempts.sink.failed(attempts, ManagedError("set shut down"))
        for clients in self.clients:
            for client in clients:
                client._shut_on_loop()
