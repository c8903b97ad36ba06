"""pictures.record: what the pictures are drawn from, heard through declared seams.

A reader of the lesson need not read this module. Each record_*() runs scenarios unchanged and
returns a Recorder holding the events they made, each a small named type (below), heard through
the event callbacks the lesson offers (on_event) and taps on public methods, each declared in one
call, calling the method unchanged and undone when the `with` block ends. Nothing here waits,
orders or holds anything: the order is the scenario's own, fixed by the hooks it waits on.
"""
import contextlib
import io
import itertools
import threading
from collections import namedtuple

import demo
from part2 import managed
from part3 import part3_demo, tagged
from scaffolding import kit
import tcp_proxy
from tcp_proxy import FramedProxy, NaiveProxy, Upstream


def event(name, fields, doc, defaults=()):
    kind = namedtuple(name, fields, defaults=defaults)
    kind.__doc__ = doc
    return kind


# Part one (record_part_one): the blind relay, and a pool's borrows in each trial
Sent = event("Sent", "client data", "a demo client's send()")
Forwarded = event("Forwarded", "client data", "a chunk NaiveProxy wrote upstream, and whose it was (now `last`)")
Routed = event("Routed", "data routing targets", "a chunk route() read, its rule, the clients it goes to")
Received = event("Received", "client data", "what a demo client read to EOF")
Replied = event("Replied", "connection data gate split_at",
                "the upstream writes a reply on a connection, after its gate, its first split_at bytes first")
Trial = event("Trial", "label", "a trial begins: its borrows are counted, its connections numbered, from 1")
Borrow = event("Borrow", "k client request reply connection outcome partial silence",
               "the k-th borrow returned the reply: its connection, its checkin's outcome, whether it read on "
               "after part of the reply, and the timeout rule's silence (else None)")
# Part two (record_managed): what on_event hears, one type per kind drawn, and taps for what it does not say
Step = event("Step", "client kind t connection owed ended data oldest",
             'on_event "sent", "timed out" (data: the request) or "reply" (oldest: the oldest call owed then, '
             "a managed.Call, whose request and abandoned no later step changes)", defaults=(None,))
Attempt = event("Attempt", "set kind number index result", 'on_event "attempt": one of a call\'s attempts ended')
Disabled = event("Disabled", "cache kind service start end reason", 'on_event "disabled": the cache opened a window')
ON_EVENT = {"sent": Step, "timed out": Step, "reply": Step, "attempt": Attempt, "disabled": Disabled}   # by kind
SetCall = event("SetCall", "t request", "ManagedSet.call() begins")
Skipped = event("Skipped", "service", "pick() found a service disabled")
# Part three (record_redis_pools, record_tagged)
Scenario = event("Scenario", "name", "a scenario begins")
RedisRead = event("RedisRead", "client request connection reply rest", "read_reply() returned")
Recv = event("Recv", "connection data", "more_of_reply() read data from the upstream")
Connected = event("Connected", "", "a TaggedClient opened its connection")
TaggedSent = event("TaggedSent", "caller data", "on_event: a request about to be written, id and all")
Timeout = event("Timeout", "caller", "the caller's call gave up")
Got = event("Got", "line", "on_event: the client's reader took a reply line")
Dropped = event("Dropped", "", "... and dropped it: its call gave up")
Returned = event("Returned", "caller outcome", "the call returned a reply (bytes) or raised (the class name)")
UpstreamRead = event("UpstreamRead", "tagged line", "a TaggedUpstream parsed a request line")
UpstreamReady = event("UpstreamReady", "tagged key", "... its reply's delay and pause are over")
UpstreamWrote = event("UpstreamWrote", "tagged line", "... it wrote a reply line whole")



class Recorder(contextlib.ExitStack):
    """The events of one recording, in the order they happened, and the taps that hear
    them (undone when the `with` block ends)."""

    def __init__(self):
        super().__init__()
        self.events = []
        self.names = {}                  # a demo client's socket address -> its name ("A")
        self.thread = threading.local()  # per-thread notes, e.g. the client a handler serves
        self._lock = threading.Lock()

    def log(self, happened):
        with self._lock:
            self.events.append(happened)

    def of(self, kind):
        return [e for e in self.events if isinstance(e, kind)]

    def tap(self, owner, name, before=None, after=None, raised=None):
        """owner.name, unchanged, with before(*args) called first, and after(result, *args) once
        it returns or raised(error, *args) if it raises."""
        original = getattr(owner, name)

        def tapped(*args, **options):
            if before:
                before(*args, **options)
            try:
                result = original(*args, **options)
            except Exception as error:
                if raised:
                    raised(error, *args, **options)
                raise
            if after:
                after(result, *args, **options)
            return result
        if name in vars(owner):
            self.callback(setattr, owner, name, vars(owner)[name])
        else:   # inherited: deleting the tap uncovers the inherited one again
            self.callback(delattr, owner, name)
        setattr(owner, name, tapped)

    def listen(self, source, hear):
        """Hear source's on_event too, after whatever the scenario gave it (once per source)."""
        theirs = source.on_event
        if not getattr(theirs, "recorder", None) is self:
            def both(origin, what):
                if theirs:
                    theirs(origin, what)
                hear(origin, what)
            both.recorder = self
            source.on_event = both

    def peer(self, sock):
        """The demo client at the other end of a proxy's socket (named once its connect returned)."""
        return self.names.get(sock.getpeername(), "?")

    def name_demo_clients(self):
        self.tap(kit.Client, "__init__", after=lambda _, client, name, *a, **o: self.names.__setitem__(
            client.sock.getsockname(), name))

    def name_pool_requests(self):
        """Note, per FramedProxy handler thread, its client (thread.client) and request (thread.request)."""
        self.tap(FramedProxy, "handle", before=lambda proxy, conn: setattr(self.thread, "conn", conn))
        self.tap(FramedProxy, "exchange", before=lambda proxy, request: self.note(
            client=self.peer(self.thread.conn), request=request))

    def note(self, **values):
        for name, value in values.items():
            setattr(self.thread, name, value)


def run_quietly(scenario, *args):
    """Run a demo scenario; return what it printed."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        scenario(*args)
    return printed.getvalue()


def record_part_one(scenario, trial_function=None, label_of=None):
    """A scenario of demo.py, each trial of it (trial_function, named by label_of(its
    arguments)) apart: (Recorder, what it printed)."""
    trial = {"borrows": itertools.count(1), "numbers": {}}   # this trial's: an upstream connection's address -> 1, 2

    def begin(*args):
        trial.update(borrows=itertools.count(1), numbers={})
        r.log(Trial(label_of(*args)))

    def number(address):
        return trial["numbers"].setdefault(address, len(trial["numbers"]) + 1)

    with Recorder() as r:
        r.name_demo_clients()
        r.name_pool_requests()
        if trial_function:
            r.tap(demo, trial_function, before=begin)
        r.tap(kit.Client, "send", before=lambda client, data: r.log(Sent(client.name, data)))
        r.tap(kit.Client, "read_to_eof", after=lambda data, client: r.log(Received(client.name, data)))
        r.tap(NaiveProxy, "forward", before=lambda proxy, client, data: r.log(Forwarded(r.peer(client), data)))
        r.tap(NaiveProxy, "route", before=lambda proxy, data: r.log(Routed(data, proxy.routing, sorted(
            r.peer(c) for c in (proxy.clients if proxy.routing == "broadcast" else [proxy.last]) if c))))
        r.tap(Upstream, "reply", before=lambda up, conn, data: r.log(Replied(
            number(conn.getpeername()), data, up.gate, up.split_at or 0)))
        r.tap(FramedProxy, "checkout", after=lambda sock, proxy: r.note(k=next(trial["borrows"]), partial=False))
        r.tap(FramedProxy, "count", before=lambda proxy, name, amount=1: name == "partial_replies" and r.note(
            partial=True))
        r.tap(FramedProxy, "checkin", before=lambda proxy, sock, outcome: r.note(
            outcome=outcome, connection=number(sock.getsockname())))
        r.tap(FramedProxy, "exchange", after=lambda reply, proxy, request: r.log(Borrow(
            r.thread.k, r.thread.client, request, reply, r.thread.connection, r.thread.outcome, r.thread.partial,
            proxy.release_timeout if proxy.release == "timeout" else None)))
        printed = run_quietly(scenario)
    return r, printed


def record_managed(scenario):
    """A managed_demo.py scenario: (Recorder, what it printed)."""
    def heard(source, what):
        if what[0] in ON_EVENT:   # not "transition": no picture draws a state change
            r.log(ON_EVENT[what[0]](source, *what))

    def set_made(_, managed_set, *args, **options):
        r.listen(managed_set, heard)
        r.listen(managed_set.rcache, heard)

    with Recorder() as r:
        r.tap(managed.ManagedClient, "__init__", after=lambda _, client, *a, **o: r.listen(client, heard))
        r.tap(managed.ManagedSet, "__init__", after=set_made)
        r.tap(managed.ManagedSet, "call", before=lambda s, request: r.log(SetCall(s.clock.now(), request)))
        r.tap(managed.ManagedSet, "pick", before=lambda s, *a: r.note(picking=True),
              after=lambda *a: r.note(picking=False))
        r.tap(managed.ReliabilityCache, "is_enabled", after=lambda yes, cache, addr: getattr(
            r.thread, "picking", False) and not yes and r.log(Skipped(addr)))
        printed = run_quietly(scenario)
    return r, printed


def scenarios(recorder, begin, *named):
    """A function running each (name, scenario) in turn, each after begin() and a Scenario event."""
    def run():
        for name, scenario in named:
            begin()
            recorder.log(Scenario(name))
            scenario()
    return run


def record_redis_pools():
    """part3_demo's line_pool and resp_pool: (Recorder, what they printed). Connections are
    numbered from 1 in each scenario, in the order they are first used."""
    numbers = {}   # the upstream socket's local address -> its number in this scenario

    def number(sock):
        return numbers.setdefault(sock.getsockname(), len(numbers) + 1)

    with Recorder() as r:
        r.name_demo_clients()
        r.name_pool_requests()
        r.tap(FramedProxy, "read_reply", after=lambda result, proxy, sock, *a: r.log(RedisRead(
            r.thread.client, r.thread.request, number(sock), *result)))
        r.tap(tcp_proxy, "more_of_reply", after=lambda data, sock: r.log(Recv(number(sock), data)))
        printed = run_quietly(scenarios(r, lambda: numbers.clear() or r.names.clear(),
                                        ("line-pool", part3_demo.line_pool), ("resp-pool", part3_demo.resp_pool)))
    return r, printed


def record_tagged():
    """part3_demo's out_of_order, slow_key and late_reply: (Recorder, what they printed).
    Callers are named A, B, C ... in the order they first call in a scenario."""
    callers = {"named": 0, "scenario": 0}   # callers named so far in this scenario; which scenario

    def caller():
        """The calling thread's name, given at its first call in this scenario (kept per thread,
        not by thread ident: a finished thread's ident is reused)."""
        scenario, name = getattr(r.thread, "caller", (None, None))
        if scenario != callers["scenario"]:
            name = kit.CLIENT_NAMES[callers["named"]]
            callers["named"] += 1
            r.note(caller=(callers["scenario"], name))
        return name

    def heard(client, what):
        kind, data = what
        r.log(TaggedSent(caller(), data) if kind == "sent" else Got(data))

    def client_made(_, client, *args, **options):
        r.listen(client, heard)
        r.log(Connected())

    def client_counted(client, name, amount=1):
        if name == "timeouts":
            r.log(Timeout(caller()))
        elif name == "dropped":   # on the reader's thread, just after the line it took
            r.log(Dropped())

    def upstream_counted(upstream, name, amount=1):
        if name == "requests":   # on the connection's reader thread, after `parsed` has it
            r.log(UpstreamRead(upstream.tagged, upstream.parsed[-1]))
        elif name == "ready":    # on the request's thread, its delay and pause over
            r.log(UpstreamReady(upstream.tagged, r.thread.key))
        elif name == "replies":  # after sendall(), once `written` has it
            r.log(UpstreamWrote(upstream.tagged, upstream.written[-1]))

    def begin():
        callers.update(named=0, scenario=callers["scenario"] + 1)

    with Recorder() as r:
        r.tap(tagged.TaggedClient, "__init__", after=client_made)
        r.tap(tagged.TaggedClient, "call", before=lambda client, *a: caller(),
              after=lambda reply, client, *a: r.log(Returned(caller(), reply)),
              raised=lambda error, client, *a: r.log(Returned(caller(), type(error).__name__)))
        r.tap(tagged.TaggedClient, "count", before=client_counted)
        r.tap(tagged.TaggedUpstream, "count", before=upstream_counted)
        r.tap(tagged, "key_of", after=lambda key, line: r.note(key=key))   # on the request's thread
        printed = run_quietly(scenarios(r, begin, ("out-of-order", part3_demo.out_of_order),
                                        ("slow-key", part3_demo.slow_key), ("late-reply", part3_demo.late_reply)))
    return r, printed
