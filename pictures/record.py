"""pictures.record: what the pictures are drawn from, heard through declared seams.

A reader of the lesson need not read this module. Each record_*() runs scenarios of
demo.py, part2/managed_demo.py or part3/part3_demo.py, unchanged, and returns a
Recorder holding the events they made, each a small named type (below). It hears
them two ways, each declared in one line: the event callbacks the lesson offers
(on_event, in Part two and in tagged.TaggedClient), and taps on public methods
(Client.send, Upstream.reply, FramedProxy.exchange, read_reply, checkin, the
hooks' count() ...), which call the method unchanged and are undone when the
`with` block ends. Nothing here waits, orders or holds anything: the order is the
scenario's own, fixed by the hooks it waits on.
"""
import contextlib
import io
import threading
from collections import namedtuple

import demo
from part2 import managed
from part3 import part3_demo, tagged
from scaffolding import faults, kit
from tcp_proxy import FramedProxy, NaiveProxy, Upstream


def event(name, fields, doc):
    kind = namedtuple(name, fields)
    kind.__doc__ = doc
    return kind


# Part one: the blind relay (record_naive_relay)
Sent = event("Sent", "client data", "a demo client's send()")
Forwarded = event("Forwarded", "client data", "a chunk NaiveProxy wrote upstream, and whose it was")
Last = event("Last", "client", "NaiveProxy.last after that chunk")
Parsed = event("Parsed", "line", "a request line the upstream parsed")
Replied = event("Replied", "data gate", "a reply the upstream is about to write, and its gate")
Routed = event("Routed", "data routing targets", "a chunk route() read, its rule, the clients it goes to")
Received = event("Received", "client data", "what a demo client read to EOF")
# Part one: a pool's connection, borrow by borrow (record_pool); k counts the trial's borrows
Trial = event("Trial", "label", "a trial begins")
TrialEnd = event("TrialEnd", "label result", "what the trial function returned")
Borrowed = event("Borrowed", "k client request connection", "checkout() lent connection n for a request")
Wrote = event("Wrote", "k connection data honest",
              "the upstream writes data (all or part) of its k-th reply; honest: what it was asked to")
Partial = event("Partial", "k", "the framed reader holds part of reply k and reads on")
Read = event("Read", "k client reply connection", "read_reply() is done: what the client will be sent")
Checkin = event("Checkin", "k client outcome connection timeout", "the connection goes back, or is closed")
# Part two (record_managed), from on_event and a few taps
Made = event("Made", "client late_replies fatal", "a ManagedClient is made")
Step = event("Step", "client kind t connection call owed ended reply settled abandoned",
             "on_event: a request sent, a call timed out, or a reply (settled: the oldest call owed)")
Move = event("Move", "client before after reason", "on_event: the client's state changed")
SetMade = event("SetMade", "names policy cache_policy threshold", "a ManagedSet over services A, B ...")
SetCall = event("SetCall", "t request", "ManagedSet.call() begins")
Enabled = event("Enabled", "service yes", "pick() asked the cache about a service")
Attempt = event("Attempt", "t number service result", "on_event: an attempt ended")
Disabled = event("Disabled", "service start end reason", "on_event: the cache opened a window")
Service = event("Service", "kind t service", "an upstream stopped or restarted")
SetShutDown = event("SetShutDown", "", "the scenario's cleanup begins")
# Part three (record_part3), kept per scenario
RedisRead = event("RedisRead", "client request connection reply rest", "read_reply() returned; connection: an address")
TaggedSent = event("TaggedSent", "line", "on_event: a request about to be written, id and all")
Got = event("Got", "line", "on_event: the client's reader took a reply line")
Returned = event("Returned", "line outcome", "call() returned bytes or raised (the class name); line: as sent")
Counted = event("Counted", "source counter key", "a TaggedClient's or TaggedUpstream's count(); key: see key_of")


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


def record_naive_relay(scenario):
    """A NaiveProxy scenario of demo.py: (Recorder, what it printed)."""
    with Recorder() as r:
        r.name_demo_clients()
        r.tap(kit.Client, "send", before=lambda client, data: r.log(Sent(client.name, data)))
        r.tap(kit.Client, "read_to_eof", after=lambda data, client: r.log(Received(client.name, data)))
        r.tap(NaiveProxy, "forward", before=lambda proxy, client, data: r.log(Forwarded(r.peer(client), data)),
              after=lambda _, proxy, *a: r.log(Last(r.peer(proxy.last))))
        r.tap(NaiveProxy, "route", before=lambda proxy, data: r.log(Routed(data, proxy.routing, sorted(
            r.peer(c) for c in (proxy.clients if proxy.routing == "broadcast" else [proxy.last]) if c))))
        r.tap(Upstream, "count", before=lambda up, name, n=1: name == "requests" and r.log(Parsed(up.parsed[-1])))
        r.tap(Upstream, "reply", before=lambda up, conn, data: r.log(Replied(data, up.gate)))
        printed = run_quietly(scenario)
    return r, printed


def record_pool(scenario, trial_function, label_of, score=None):
    """A FramedProxy scenario of demo.py, each trial of it (`trial_function`, named by
    label_of(its arguments), its right answers score(its result)) borrow by borrow:
    (Recorder, what it printed)."""
    trial = {}   # this trial's borrows, replies, partial reads and connection numbers

    def begin(*args):
        trial.update(k=0, replies=0, partial=set(), numbers={})
        r.names.clear()
        r.log(Trial(label_of(*args)))

    def number(address):
        return trial["numbers"].setdefault(address, len(trial["numbers"]) + 1)

    def borrowed(sock, proxy):
        trial["k"] += 1
        r.note(exchange=trial["k"])
        r.log(Borrowed(trial["k"], r.thread.client, r.thread.request, number(sock.getsockname())))

    def partial(proxy, name, amount=1):
        if name == "partial_replies" and r.thread.exchange not in trial["partial"]:
            trial["partial"].add(r.thread.exchange)
            r.log(Partial(r.thread.exchange))

    def replying(upstream, conn, data):   # on the upstream's writer thread, before Upstream.reply
        trial["replies"] += 1
        honest = getattr(r.thread, "honest", None) or data   # a FaultyUpstream's honest reply, or the reply itself
        r.note(honest=None, reply=(trial["replies"], number(conn.getpeername()), data, honest, upstream.split_at or 0))
        if upstream.split_at:
            r.log(Wrote(*r.thread.reply[:2], data[:upstream.split_at], honest[:upstream.split_at]))

    def rest_follows(upstream_pause):   # the pause(k) knob: the reply's rest is written once it returns
        def pause(reply_number):
            upstream_pause(reply_number)
            k, connection, data, honest, cut = r.thread.reply
            r.log(Wrote(k, connection, data[cut:], honest[cut:]))
        return pause

    with Recorder() as r:
        r.name_demo_clients()
        r.name_pool_requests()
        r.tap(demo, trial_function, before=begin,
              after=lambda result, *args: r.log(TrialEnd(label_of(*args), score(result) if score else None)))
        r.tap(FramedProxy, "checkout", after=borrowed)
        r.tap(FramedProxy, "read_reply", after=lambda result, proxy, sock, *a: r.log(Read(
            r.thread.exchange, r.thread.client, result[0], number(sock.getsockname()))))
        r.tap(FramedProxy, "count", before=partial)
        r.tap(FramedProxy, "checkin", before=lambda proxy, sock, outcome: r.log(Checkin(
            r.thread.exchange, r.thread.client, outcome, number(sock.getsockname()),
            proxy.release_timeout if proxy.release == "timeout" else None)))
        r.tap(faults.FaultyUpstream, "reply", before=lambda up, conn, data: r.note(honest=data))
        r.tap(Upstream, "reply", before=replying)
        r.tap(Upstream, "__init__", after=lambda _, upstream, *a, **o: setattr(
            upstream, "pause", rest_follows(upstream.pause)))
        printed = run_quietly(scenario)
    return r, printed


def record_managed(scenario):
    """A managed_demo.py scenario: (Recorder, what it printed). Services are named A, B ... in
    the set's order; a queue is the calls owed on a connection, oldest first, as (call, abandoned)."""
    names = {}   # a service's address -> its name
    clock = []   # the set's clock, once there is a set

    def name(addr):
        return names.get(addr, str(addr))

    def line(request):
        return request.decode().rstrip("\n")

    def queue(owed):
        return tuple((line(request), abandoned) for request, abandoned in owed)

    def heard(source, what):
        kind, *rest = what
        if kind == "transition":
            r.log(Move(source, *rest))
        elif kind in ("sent", "timed out"):
            t, connection, owed, ended, request = rest
            r.log(Step(source, kind, t, connection, line(request), queue(owed), ended, None, None, False))
        elif kind == "reply":
            t, connection, owed, ended, reply, oldest = rest
            r.log(Step(source, kind, t, connection, None, queue(owed), ended, reply,
                       oldest and line(oldest.request), bool(oldest and oldest.abandoned)))
        elif kind == "attempt":
            _, number, index, result = what
            r.log(Attempt(source.clock.now(), number, kit.CLIENT_NAMES[index] if index is not None else "-", result))
        elif kind == "disabled":
            key, start, end, reason = rest
            r.log(Disabled(name(key), start, end, reason))

    def client_made(_, client, addr, **options):
        r.listen(client, heard)
        r.log(Made(client, client.late_replies, client.msg_timeout_is_fatal))

    def set_made(_, managed_set, services, **options):
        r.listen(managed_set, heard)
        r.listen(managed_set.rcache, heard)
        clock[:] = [managed_set.clock]
        names.update({addr: kit.CLIENT_NAMES[index] for index, (addr, _) in enumerate(services)})
        cache = managed_set.rcache
        r.log(SetMade(tuple(names.values()), managed_set.policy, cache.setting("policy"), cache.setting("threshold")))

    def changed(kind):
        def log(upstream):
            if upstream.addr in names and upstream.closed == (kind == "restarted"):   # a change, not a second close()
                r.log(Service(kind, clock[0].now(), names[upstream.addr]))
        return log

    with Recorder() as r:
        r.tap(managed.ManagedClient, "__init__", after=client_made)
        r.tap(managed.ManagedSet, "__init__", after=set_made)
        r.tap(managed.ManagedSet, "shut_down", before=lambda managed_set: r.log(SetShutDown()))
        r.tap(managed.ManagedSet, "call", before=lambda s, request: r.log(SetCall(s.clock.now(), request)))
        r.tap(managed.ManagedSet, "pick", before=lambda s, *a: r.note(picking=True),
              after=lambda *a: r.note(picking=False))
        r.tap(managed.ReliabilityCache, "is_enabled", after=lambda yes, cache, addr: getattr(
            r.thread, "picking", False) and r.log(Enabled(name(addr), yes)))
        r.tap(faults.FaultyUpstream, "close", before=changed("stopped"))
        r.tap(faults.FaultyUpstream, "restart", before=changed("restarted"))
        printed = run_quietly(scenario)
    return r, printed


def record_part3():
    """part3_demo's scenarios that Part three's pictures draw: ({each one's name: the events it
    made}, what they printed). A pool's handler thread notes each request and its client (named
    by then: a client's __init__ is over before it sends)."""
    def heard(client, what):
        kind, line = what
        if kind == "sent":   # on the calling thread: its call's Returned names the request by it
            r.note(sent=line)
        r.log(TaggedSent(line) if kind == "sent" else Got(line))

    def counted(source, name, amount=1):
        r.log(Counted(source, name, getattr(r.thread, "key", None)))

    events, printed = {}, ""
    with Recorder() as r:
        r.tap(kit.Client, "__init__", after=lambda _, client, name, *a, **o: r.names.__setitem__(
            client.sock.getsockname(), name))
        r.tap(FramedProxy, "handle", before=lambda proxy, conn: r.note(conn=conn))
        r.tap(FramedProxy, "exchange", before=lambda proxy, request: r.note(
            client=r.peer(r.thread.conn), request=request))
        r.tap(FramedProxy, "read_reply", after=lambda result, proxy, sock, *a: r.log(RedisRead(
            r.thread.client, r.thread.request, sock.getsockname(), *result)))
        r.tap(tagged.TaggedClient, "__init__", after=lambda _, client, *a, **o: r.listen(client, heard))
        r.tap(tagged.TaggedClient, "call", after=lambda reply, *a: r.log(Returned(r.thread.sent, reply)),
              raised=lambda error, *a: r.log(Returned(r.thread.sent, type(error).__name__)))
        r.tap(tagged.TaggedClient, "count", before=counted)
        r.tap(tagged.TaggedUpstream, "count", before=counted)
        r.tap(tagged, "key_of", after=lambda key, line: r.note(key=key))   # on an upstream's request thread
        for scenario in (part3_demo.line_pool, part3_demo.resp_pool, part3_demo.out_of_order, part3_demo.slow_key,
                         part3_demo.late_reply):
            start = len(r.events)   # the scenario's threads are joined when it returns
            printed += run_quietly(scenario)
            events[scenario.__name__] = r.events[start:]
    return events, printed
