"""managed_set: ManagedSet, managed clients over equivalent services, and its retries.

    service_order(), choose()   the pick, as plain functions of the loads: which service
                                first, and which client of a service (or a new one)
    ManagedSet                  the clients per service; pick() (a thread's, reserving
                                the client for the call it makes next), call(),
                                idempotent_call(); gather() (the proxy's way in: what a
                                turn's reads made, placed once they are over, one batch per
                                connection); each request's attempts and what their
                                errors say next (retry now, after idempotent_wait, or give
                                up); shut_down()

A request carries its attempts (pipeline.Request: attempts, tried, service, placer): the
set picks, places it on a client, and hears of it again only if it fails. The pick runs
on the loop, and what it picks for is placed in the same step: the loads it reads are
the loads. A thread's pick() is made before its call, so it reserves the client: the
next pick counts that call as pending, and a burst of threads spreads as requests do.
"""
from part2.cache import global_rcache
from part2.calls import (BlockingCall, ClusterServiceUnavailable, CommunicationError,
                         ManagedError, MessageLost, MessageTimeout, ServiceUnavailable,
                         check_addr, check_request)
from part2.client import ManagedClient
from part2.clock import check_seconds
from part2.hooks import Counted
from part2.loop import Loop
from part2.pipeline import Request
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
        self.waiting = {}   # requests waiting to retry -> their Timer
        self.gathered = []  # what the turn's reads made, placed once they are over
        self.gathered_retried = self.RETRIED_BY_CALL   # what those are retried after
        self.panicked = False   # the last pick was made with every service disabled
        self._shut = False
        if self.own_loop:
            self.loop.start()

    def load(self):
        """Pending calls per service."""
        return [sum(client.pending_calls for client in clients) for clients in self.clients]

    # -- the pick --

    def pick(self, tried=()):
        """The client a thread's call should go to, and its service's index; services in
        `tried` come after all the others. The client is reserved for that call: it counts
        as a pending call there until the client's next call() begins, so threads that pick
        at once spread over the set (ManagedClient.release() gives one back unused)."""
        return self.loop.ask(self._reserve, tried)

    def _reserve(self, tried):
        client, index = self._pick(tried)
        client.reserved += 1
        client.reserved_despite_cache += self.panicked
        return client, index

    def _pick(self, tried):
        """The pick itself, on the loop: (client, service index), or ClusterServiceUnavailable."""
        self.panicked = False
        if self._shut:
            raise ManagedError("set shut down")
        if self.lone is None:
            enabled = list(map(self.rcache.is_enabled, self.addrs))   # every service, each time
        elif self.rcache.steady or self.rcache.is_enabled(self.addrs[0]):   # nothing to choose
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
                    self.panicked = True
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

    def _thread_call(self, data, retried):
        check_request(data, self.framing)   # before any pick: a bad request costs nothing
        if self._shut:
            raise ManagedError("set shut down")
        call = BlockingCall(data, self.loop)
        request = Request(call, data)
        return self.loop.complete(call, lambda: self.place(request, retried))

    def place(self, request, retried=RETRIED_BY_CALL):
        """On the loop: send a request through the set; its client hears its reply, or the
        error its attempts gave up with."""
        request.placer, request.retried = self, retried
        self._attempt(request)

    def gather(self, requests):
        """Requests a proxy client's read made: placed with the rest of the turn's once its
        reads are over, so a turn pays one pick and one write per connection, not per read."""
        if not self.gathered:
            self.loop.after_reads(self._place_gathered)
        self.gathered += requests

    def _place_gathered(self):
        requests, self.gathered = self.gathered, []
        self.attempts += len(requests)
        retried, lone = self.gathered_retried, self.lone
        for request in requests:
            request.placer, request.retried, request.attempts = self, retried, 1
        if lone is not None and lone.connection is not None and self.rcache.steady and \
                not self._shut:   # one connection, nothing to choose: one pick a turn
            self.picks += 1
            deadline = None if lone.timeout is None else self.clock.now() + lone.timeout
            for request in requests:
                request.service, request.deadline = 0, deadline
            lone.connection.send(requests)
            return
        batches = {}   # client -> its requests, in the order read
        for request in requests:
            stream = request.client
            if request.shared and stream.upstream is not None:   # behind its others in flight
                client, request.service = stream.upstream
            else:
                try:
                    client, request.service = self._pick(())
                except ManagedError as error:   # refused, or shut down: fails as its attempt
                    self.attempt_failed(request, error)
                    continue
                if request.shared:
                    stream.upstream = client, request.service
            batches.setdefault(client, []).append(request)
            client.picked += 1   # the next pick counts it
        for client, batch in batches.items():
            client.picked = 0
            deadline = client.deadline()
            for request in batch:
                request.deadline = deadline
            client.place(batch)

    def _attempt(self, request):
        request.attempts += 1
        request.service = None   # stays None if the pick finds no client
        self.attempts += 1
        upstream = request.client.upstream if request.shared else None
        if upstream is not None and upstream[1] not in request.tried:   # behind its others
            client, request.service = upstream
        else:
            try:
                client, request.service = self._pick(request.tried)
            except ManagedError as error:   # refused, or shut down
                self.attempt_failed(request, error)
                return
            if request.shared:   # a retry leads its client's next requests where it goes
                request.client.upstream = client, request.service
        request.deadline = client.deadline()
        client.place([request])

    def attempt_ok(self, request):
        """Its reply has come (told only to a set with on_event)."""
        self._note("attempt", request.attempts, request.service, "ok")

    def attempt_failed(self, request, error):
        """An attempt failed: retried now, after idempotent_wait, or its client is told."""
        if not isinstance(error, request.retried):
            request.client.failed(request, error)
            return
        self._note("attempt", request.attempts, request.service,
                   f"{type(error).__name__}: {error}")
        if request.service is not None:
            request.tried = {*request.tried, request.service}
        untried = request.service is not None and self._untried_enabled(request.tried)
        never_left = isinstance(error, self.RETRIED_BY_CALL)
        if request.attempts == self.idempotent_max or (never_left and not untried):
            request.client.failed(request, error)   # the last; or it never left, every one tried
            return
        wait = 0.0 if untried else self.idempotent_wait
        self.count("retries")
        self.waiting[request] = self.loop.at(self.clock.now() + wait,
                                             lambda: self._retry(request))

    def _retry(self, request):
        del self.waiting[request]
        request.reply, request.pieces = None, ()
        self._attempt(request)

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
        for request, timer in waiting.items():
            timer.cancel()
            request.client.failed(request, ManagedError("set shut down"))
        for clients in self.clients:
            for client in clients:
                client._shut_on_loop()
