"""pictures.record: what the pictures are drawn from, heard through declared seams.

A reader of the lesson need not read this module. Each record_*() runs scenarios unchanged and
returns a Recorder holding the events they made, each a small named type (below), heard through the
event callbacks the lesson offers (on_event) and taps on public methods, each declared in one call,
calling the method unchanged and undone when the `with` block ends. Nothing here waits, orders or
holds anything: the order is the scenario's own, fixed by the hooks it waits on."""
import contextlib
import io
import itertools
import threading
from collections import namedtuple
from unittest import mock

import demo
from part2 import managed
from part3.framed import SessionProxy
from part3 import lending, part3_demo, tagged
from scaffolding import faults, kit
from tcp_proxy import FramedProxy, NaiveProxy, Upstream


# Part one (record_part_one): the blind relay, and a pool's borrows in each trial
Sent = namedtuple("Sent", "client data")             # a demo client's send()
# a chunk NaiveProxy wrote upstream, and whose it was (now `last`)
Forwarded = namedtuple("Forwarded", "client data")
# a chunk route() read, its rule, the clients it goes to
Routed = namedtuple("Routed", "data routing targets")
Received = namedtuple("Received", "client data")        # what a demo client read to EOF
# in a trial (its label, else None) the upstream writes a reply on a connection (its address, never
# shown), after its gate, its first split_at bytes first; the k-th borrow returned the reply: its
# connection, its checkin's outcome, the timeout rule's silence (else None)
Replied = namedtuple("Replied", "trial connection data gate split_at")
Borrow = namedtuple("Borrow", "trial k client request reply connection outcome silence")
# Part two (record_managed): what on_event hears, one type per kind drawn, and taps for what it
# does not say.
# Step: on_event "sent", "timed out" (data: the request) or "reply" (oldest: the oldest call owed
# then, a managed.Call, whose request and abandoned no later step changes)
Step = namedtuple("Step", "client kind t connection owed ended data oldest", defaults=(None,))
# on_event "attempt": one of a call's attempts ended
Attempt = namedtuple("Attempt", "set kind number index result")
# on_event "disabled": a window opened
Disabled = namedtuple("Disabled", "cache kind service start end reason")
# by kind
ON_EVENT = {"sent": Step, "timed out": Step, "reply": Step, "attempt": Attempt,
            "disabled": Disabled}
SetCall = namedtuple("SetCall", "t request")   # ManagedSet.call() begins
# a FaultyUpstream stopped or restarted, at the set's clock's time
Service = namedtuple("Service", "kind t addr")
# Part three (record_part3), kept per scenario
# read_reply() returned, on an upstream address, for a client (by name, and by address: two may
# share a name), in a pool (its class's name)
RedisRead = namedtuple("RedisRead", "client via request connection reply rest pool")
# on_event: a request about to be written, id and all
TaggedSent = namedtuple("TaggedSent", "line")
Got = namedtuple("Got", "line")                 # on_event: the client's reader took a reply line
# call() returned bytes or raised (the class name); line: as sent
Returned = namedtuple("Returned", "line outcome")
# a wait on a TaggedUpstream returned (scenario's or hook's)
Waited = namedtuple("Waited", "upstream ready replies")


class Recorder(contextlib.ExitStack):
    """The events of one recording, in the order they happened, and the taps that hear them."""

    def __init__(self):
        super().__init__()
        self.events = []
        self.names = {}                  # a demo client's socket address -> its name ("A")
        self.thread = threading.local()  # per-thread notes, e.g. the client a handler serves
        self._lock = threading.Lock()

    def __enter__(self):
        # every recording names the demo clients, and notes per FramedProxy handler thread its
        # client (named by then: a client's __init__ is over before it sends) and request
        self.tap(kit.Client, "__init__",
                 after=lambda _, client, name, *a, **o: self.names.__setitem__(
                     client.sock.getsockname(), name))
        for pool in (FramedProxy, SessionProxy):   # Part three's overrides handle()
            self.tap(pool, "handle", before=lambda proxy, conn: self.note(conn=conn))
        self.tap(FramedProxy, "exchange", before=lambda proxy, request: self.note(
            client=self.peer(self.thread.conn), request=request))
        self.tap(lending.Lending, "exchange", before=lambda lender, session, request, *rest:
                 self.note(client=self.peer(self.thread.conn), request=request))   # a Redis pool's
        return super().__enter__()

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
        # put back, own or inherited, when the `with` ends
        self.enter_context(mock.patch.object(owner, name, tapped))

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
        """The demo client at the other end of a proxy's socket (named once its connect
        returned)."""
        return self.names.get(sock.getpeername(), "?")

    def note(self, **values):
        vars(self.thread).update(values)   # this thread's own notes


def run_quietly(scenario):
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        scenario()
    return printed.getvalue()


def record_part_one(scenario, trial_function=None, label_of=None):
    """A scenario of demo.py, each trial of it (trial_function, named by label_of(its
    arguments)) apart: (Recorder, what it printed)."""
    # numbers each borrow as it is lent: a trial's then sort into that order
    borrows = itertools.count(1)
    # the trial running now: a scenario runs its trials one after the other
    trial = {"label": None}

    with Recorder() as r:
        if trial_function:
            r.tap(demo, trial_function, before=lambda *args: trial.update(label=label_of(*args)))
        r.tap(kit.Client, "send", before=lambda client, data: r.log(Sent(client.name, data)))
        r.tap(kit.Client, "read_to_eof",
              after=lambda data, client: r.log(Received(client.name, data)))
        r.tap(NaiveProxy, "forward",
              before=lambda proxy, client, data: r.log(Forwarded(r.peer(client), data)))
        r.tap(NaiveProxy, "route", before=lambda proxy, data: r.log(Routed(
            data, proxy.routing,
            sorted(r.peer(c)
                   for c in (proxy.clients if proxy.routing == "broadcast" else [proxy.last])
                   if c))))
        r.tap(Upstream, "reply", before=lambda up, conn, data: r.log(Replied(
            trial["label"], conn.getpeername(), data, up.gate, up.split_at or 0)))
        r.tap(FramedProxy, "checkout", after=lambda sock, proxy: r.note(k=next(borrows)))
        r.tap(FramedProxy, "checkin", before=lambda proxy, sock, outcome: r.note(
            outcome=outcome, connection=sock.getsockname()))
        r.tap(FramedProxy, "exchange", after=lambda reply, proxy, request: r.log(Borrow(
            trial["label"], r.thread.k, r.thread.client, request, reply, r.thread.connection,
            r.thread.outcome,
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
        sets.append(managed_set)

    def changed(kind, upstream):
        if sets and upstream.closed == (kind == "restarted"):   # a change, not a second close()
            r.log(Service(kind, sets[0].clock.now(), upstream.addr))

    # the ManagedSets made so far: the first one's clock times an upstream's stop and restart
    sets = []

    with Recorder() as r:
        r.tap(managed.ManagedClient, "__init__",
              after=lambda _, client, *a, **o: r.listen(client, heard))
        r.tap(managed.ManagedSet, "__init__", after=set_made)
        r.tap(managed.ManagedSet, "call",
              before=lambda s, request: r.log(SetCall(s.clock.now(), request)))
        r.tap(faults.FaultyUpstream, "close", before=lambda upstream: changed("stopped", upstream))
        r.tap(faults.FaultyUpstream, "restart",
              before=lambda upstream: changed("restarted", upstream))
        printed = run_quietly(scenario)
    return r, printed


def record_part3():
    """part3_demo's scenarios that Part three's pictures draw: ({each one's name: the events it
    made}, printed)."""
    def heard(client, what):
        kind, line = what
        if kind == "sent":   # on the calling thread: its call's Returned names the request by it
            r.note(sent=line)
        r.log(TaggedSent(line) if kind == "sent" else Got(line))

    events, printed = {}, ""
    with Recorder() as r:
        for pool in (FramedProxy, SessionProxy):   # the line pool's, and the RESP pool's own
            r.tap(pool, "read_reply", after=lambda result, proxy, sock, *a: r.log(RedisRead(
                r.thread.client, r.thread.conn.getpeername(), r.thread.request,
                sock.getsockname(), *result, type(proxy).__name__)))
        r.tap(tagged.TaggedClient, "__init__",
              after=lambda _, client, *a, **o: r.listen(client, heard))
        r.tap(tagged.TaggedClient, "call",
              after=lambda reply, *a: r.log(Returned(r.thread.sent, reply)),
              raised=lambda error, *a: r.log(Returned(r.thread.sent, type(error).__name__)))
        r.tap(tagged.TaggedUpstream, "wait_until",
              after=lambda _, up, *a: r.log(Waited(up, up.ready, up.replies)))
        for scenario in (part3_demo.line_pool, part3_demo.resp_pool, part3_demo.out_of_order,
                         part3_demo.slow_key, part3_demo.late_reply):
            start = len(r.events)   # the scenario's threads are joined when it returns
            printed += run_quietly(scenario)
            events[scenario.__name__] = r.events[start:]
    return events, printed
