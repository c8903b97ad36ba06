"""pictures.draw_part3: Part three's pictures, drawn from the scenarios' own runs, as
pictures/draw.py draws the others (`python3 -m pictures` draws them all).

    part3-redis-line-pool.svg       borrows: TrustingPool framing by line, then FramedProxy by RESP
    part3-tagged-out-of-order.svg   a sequence: ids going up, replies back in another order, each to its caller
    part3-head-of-line.svg          sequences: a held key with ids (the fast replies pass it), the untagged twin
    part3-late-reply.svg            a sequence: a call gives up, its late reply dropped by id, the connection serving on

A pool of one connection lends it to one borrower at a time, so the order of the
reads is the order the borrowers held it; Redis answers one connection's commands
in order, so the n-th reply on a connection answers the n-th request sent on it.
"""
from pictures.record import (Connected, Dropped, Got, RedisRead, Recv, Returned, Scenario, TaggedSent, Timeout,
                             UpstreamRead, UpstreamReady, UpstreamWrote, record_redis_pools, record_tagged)
from pictures.svg import GREEN, INK, MUTED, RED, RED_FILL, Svg, borrows, colours, cut, heading, sequence, visible
from part3 import resp, tagged
import tcp_proxy

UPSTREAM = "upstream"       # the owner of the untagged twin's bytes: one colour, no caller


def scenario_events(recorder, name):
    """The events logged between `scenario (name,)` and the next scenario."""
    found, current = [], None
    for event in recorder.events:
        if isinstance(event, Scenario):
            current = event.name
        elif current == name:
            found.append(event)
    return found


def redis_stream(events, connection):
    """Connection's stream as Redis's replies, each (owner, bytes), and what was delivered.

    The replies are cut by resp.reply_size() and owned in request order. Only the
    replies that hold a byte some borrower took are kept: how much past that the
    proxy happened to read depends on the scheduler, not on the scenario.
    Returns (replies, deliveries); a delivery is (client, request, start, end) in
    stream positions."""
    stream = b"".join(e.data for e in events if isinstance(e, Recv) and e.connection == connection)
    reads = [e for e in events if isinstance(e, RedisRead) and e.connection == connection]
    deliveries, position = [], 0
    for read in reads:
        deliveries.append((read.client, read.request, position, position + len(read.reply)))
        position += len(read.reply)
    owners = [read.client for read in reads]   # the n-th request sent answers the n-th reply
    replies, start = [], 0
    while start < position:
        size = resp.reply_size(stream[start:])
        if size is None:
            raise ValueError(f"connection {connection}: delivered bytes past Redis's last whole reply")
        replies.append((owners[len(replies)], stream[start:start + size]))
        start += size
    return replies, deliveries


def pieces(replies, deliveries):
    """The stream cut at every reply end and delivery end: (owner, taker, bytes, start).
    taker is the client who received the piece, or None if no borrower did."""
    read_to = deliveries[-1][3] if deliveries else 0
    found = []
    for taker, _, start, end in deliveries + [(None, None, read_to, sum(len(d) for _, d in replies))]:
        for owner, piece in cut(replies, start, end):
            found.append((owner, taker, piece, start))
            start += len(piece)
    return found


# --- drawing ---------------------------------------------------------------------------

def draw_redis_panel(svg, top, rule, note, events, connection, shown, drawn):
    """The first `shown` borrows of one connection as svg.borrows steps: its stream on
    top, cut where each borrower's read ended, then one row per borrower. Returns the
    panel's bottom."""
    replies, deliveries = redis_stream(events, connection)
    deliveries = deliveries[:shown]
    shown_end = deliveries[-1][3]
    kept, position = [], 0
    for owner, data in replies:   # the replies the shown borrows touched
        if position < shown_end:
            kept.append((owner, data))
            drawn.add(owner)   # for the legend: a colour only for an owner whose bytes are drawn
        position += len(data)
    parts = pieces(kept, deliveries)
    strip = [(owner, data, taker not in (owner, None), taker) for owner, taker, data, _ in parts]
    rows = []
    for client, request, start, end in deliveries:
        got = [(owner, data, owner != client) for owner, _, data, at in parts if start <= at < end]
        owners = {owner for owner, _, _ in got}
        if any(data == b"".join(d for _, d, _ in got) for o, data in kept if o == client):
            verdict, tone = "its whole reply", GREEN
        elif owners == {client}:
            verdict, tone = "cut: only the first line of its reply", RED
        else:
            verdict, tone = f"WRONG: bytes of {', '.join(sorted(owners - {client}))}'s reply", RED
        rows.append((client, request, got, verdict, tone, ""))
    caption = f"what Redis wrote on upstream connection {connection}, reply after reply:"
    return borrows(svg, top, rule, note, (caption, strip), rows)


def draw_redis_line_pool(recorder):
    title = "Part three, scenarios 2 and 4: a pool in front of a real redis-server, framed by line and by RESP"
    svg = Svg(title)
    y = heading(svg, [title, "Redis answers GET with a bulk string, b'$5\\r\\nhello\\r\\n': a header line, "
                             "then the value on a second line",
                      "each client borrows the pool's one upstream connection in turn"])
    line_events = scenario_events(recorder, "line-pool")
    resp_events = scenario_events(recorder, "resp-pool")
    line_reads = [e for e in line_events if isinstance(e, RedisRead)]
    drawn = set()
    bottom = draw_redis_panel(
        svg, y + 14, "TrustingPool, framing=LINES: the reply ends at the first \\n",
        "the bytes read past it stay on the connection for the next borrower", line_events, 1,
        len(line_reads), drawn)
    first = line_reads[0]
    svg.text(16, bottom + 4, f"the line framing stopped after {visible(first.reply)}; the rest, "
             f"{visible(first.rest)}, went to the next borrower as its reply", 13, RED, bold=True)
    bottom = draw_redis_panel(
        svg, bottom + 50, "FramedProxy, framing=RESP: the reply ends where its type byte and length say",
        "client A's four requests one after another through the pool's one connection", resp_events, 1, 4, drawn)
    resp_reads = [e for e in resp_events if isinstance(e, RedisRead)]
    replies, deliveries = redis_stream(resp_events, 1)
    stream = b"".join(data for _, data in replies)
    crowd = deliveries[4:]
    right = sum(any(stream[start:end] == data for owner, data in replies if owner == client)
                for client, _, start, end in crowd)
    connections = len({e.connection for e in resp_reads})
    svg.text(16, bottom + 4, f"then {len(crowd)} GETs from 8 clients at once: each got its own whole "
             f"reply {right}/{len(crowd)}, over {connections} upstream connection", 13,
             GREEN if right == len(crowd) else RED, bold=True)
    svg.legend(16, bottom + 36, [(f"{owner}'s reply", *colours(owner)) for owner in sorted(drawn)]   # only colours drawn
               + [("red outline: bytes of another client's reply", RED_FILL, RED)])
    return svg


def callers_by_id(events):
    """{id: (caller, request line)} from the bytes each request went out as."""
    found = {}
    for sent in (e for e in events if isinstance(e, TaggedSent)):
        request_id, line = tagged.parse_tagged(sent.data.rstrip(b"\n"))
        found[request_id] = (sent.caller, line)
    return found


def tagged_rows(events, sends_first=False):
    """The rows of a sequence diagram (svg.sequence) for one TaggedClient's scenario:
    each request sent, call given up and reply taken by the client's reader, in the
    order they were logged; a reply whose id belongs to a call that gave up goes to the
    client, in red. Returns (the lanes, the rows, the reply ids in wire order, {id: (caller, line)}).

    sends_first: every request first, then every reply, each in its own thread's order;
    for a scenario whose hooks leave the scheduler to choose whether a quick reply comes
    before or after the next request is sent (the log's order would change run to run)."""
    if sends_first:
        events = ([e for e in events if isinstance(e, (TaggedSent, Timeout))]
                  + [e for e in events if isinstance(e, Got)])
    owners = callers_by_id(events)
    gave_up = {e.caller for e in events if isinstance(e, Timeout)}
    names = sorted({caller for caller, _ in owners.values()})
    lanes = {name: 100 + index * 130 for index, name in enumerate(names)}
    lanes.update(TaggedClient=lanes[names[-1]] + 150, TaggedUpstream=lanes[names[-1]] + 380)
    rows, wire_order = [], []
    for event in events:
        if isinstance(event, TaggedSent):
            rows.append(("arrow", event.caller, "TaggedUpstream", event.data, event.caller, False, ""))
        elif isinstance(event, Timeout):
            rows.append(("note", event.caller, f"{event.caller} gives up: CallTimeout", event.caller, True,
                         "its id is abandoned, not reused"))
        elif isinstance(event, Got):
            reply_id, _ = tagged.parse_tagged(event.line)
            caller = owners[reply_id][0]
            wire_order.append(reply_id)
            if caller in gave_up:
                rows.append(("arrow", "TaggedUpstream", "TaggedClient", event.line + b"\n", caller, True,
                             f"id {reply_id}: no call is owed it any more: dropped"))
            else:
                rows.append(("arrow", "TaggedUpstream", caller, event.line + b"\n", caller, False,
                             f"id {reply_id} -> {caller}"))
    return lanes, rows, wire_order, owners


def draw_tagged_sequence(svg, top, events, sends_first=False):
    """One TaggedClient's scenario as a sequence diagram from `top`; returns (its bottom,
    the reply ids in wire order, {id: (caller, line)})."""
    lanes, rows, wire_order, owners = tagged_rows(events, sends_first)
    return sequence(svg, top + 26, lanes, rows, lanes["TaggedUpstream"] + 70), wire_order, owners


def draw_results(svg, y, events, owners):
    """A row per call (svg.borrows): what it asked, what it returned, whether that is its own reply."""
    results = {e.caller: e.outcome for e in events if isinstance(e, Returned)}
    rows = []
    for request_id in sorted(owners):
        caller, line = owners[request_id]
        outcome = results.get(caller)
        if isinstance(outcome, str):
            rows.append((caller, line, [], f"nothing: it raised {outcome}", MUTED, ""))
        else:
            right = outcome == tcp_proxy.answer(line)
            rows.append((caller, line, [(caller, outcome, not right)], "its own reply" if right else "WRONG",
                         GREEN if right else RED, ""))
    return borrows(svg, y, "what each call returned", "call() returns the reply that carries its own id",
                   None, rows)


def draw_tagged_out_of_order(recorder):
    title = "Part three, scenario 5: request ids, three calls over one connection"
    svg = Svg(title)
    y = heading(svg, [title, "each request goes out as <id> <line>; the upstream answers in its own order, "
                             "and the client's reader gives each reply to the call that owns its id"])
    events = scenario_events(recorder, "out-of-order")
    bottom, wire_order, owners = draw_tagged_sequence(svg, y + 16, events)
    svg.text(16, bottom + 28, f"ids went out {', '.join(map(str, sorted(owners)))}; replies came back "
             f"{', '.join(map(str, wire_order))}: not the order asked", 13, RED, bold=True)
    draw_results(svg, bottom + 66, events, owners)
    return svg


def draw_head_of_line(recorder):
    title = "Part three, scenario 6: a slow key and the fast keys behind it"
    svg = Svg(title)
    y = heading(svg, [title, "the upstream holds the reply to GET slow (a hook, not a sleep) until the "
                             "fast calls are done; the same four requests, with ids and without"])
    events = scenario_events(recorder, "slow-key")
    svg.text(16, y + 14, "with ids: TaggedClient, one connection, each call on its own thread", 14, INK, bold=True)
    bottom, wire_order, owners = draw_tagged_sequence(svg, y + 46, events, sends_first=True)
    svg.text(16, bottom + 22, "requests drawn first, then the replies in the order the client's reader took "
             "them (a quick reply may come back before the next request is sent)", 11, MUTED)
    bottom += 22
    slow_id = next(request_id for request_id, (_, line) in owners.items() if line == b"GET slow")
    passed = [request_id for request_id in wire_order[:wire_order.index(slow_id)]]
    svg.text(16, bottom + 28, f"id {slow_id} (GET slow) went out first and came back last: "
             f"ids {', '.join(map(str, passed))} passed it", 13, GREEN, bold=True)
    y = draw_results(svg, bottom + 66, events, owners) + 30
    untagged = [e for e in events if isinstance(e, (UpstreamRead, UpstreamReady, UpstreamWrote)) and not e.tagged]
    readies = [e.key for e in untagged if isinstance(e, UpstreamReady)]
    ready_first = sorted(readies[:readies.index("slow")])
    svg.text(16, y, "without ids: the untagged twin, the four requests pipelined in order on one socket", 14,
             INK, bold=True)
    lanes = {"one socket": 100, "untagged upstream": 520}
    rows = [("arrow", "one socket", "untagged upstream", e.line.encode() + b"\n", UPSTREAM, False, "")
            for e in untagged if isinstance(e, UpstreamRead)]
    rows.append(("note", "untagged upstream", "GET slow held", None, True,
                 f"replies ready {len(ready_first)} ({', '.join(ready_first)}), written 0: each waits its turn"))
    for index, e in enumerate(e for e in untagged if isinstance(e, UpstreamWrote)):
        rows.append(("arrow", "untagged upstream", "one socket", e.line.encode() + b"\n", UPSTREAM, index > 0,
                     "in order: it waited for GET slow" if index else "written once GET slow is let go"))
    sequence(svg, y + 46, lanes, rows, lanes["untagged upstream"] + 70)
    return svg


def draw_late_reply(recorder):
    title = "Part three, scenario 7: a timed-out call's late reply, dropped by id"
    svg = Svg(title)
    y = heading(svg, [title, "the upstream holds the reply to GET slow until the call has given up and the "
                             "next request is on the wire; then it writes both"])
    events = scenario_events(recorder, "late-reply")
    bottom, wire_order, owners = draw_tagged_sequence(svg, y + 16, events)
    dropped = sum(isinstance(e, Dropped) for e in events)
    connections = sum(isinstance(e, Connected) for e in events)
    later = [request_id for request_id in wire_order if owners[request_id][0] not in
             {e.caller for e in events if isinstance(e, Timeout)}]
    svg.text(16, bottom + 28, f"late replies dropped by id: {dropped}; the connection served on: ids "
             f"{', '.join(map(str, later))} went to their callers; connections opened: {connections}", 13,
             GREEN, bold=True)
    draw_results(svg, bottom + 66, events, owners)
    return svg


# --- the pictures, and the command line ------------------------------------------------

PICTURES = {   # file name -> (run the scenarios: (Recorder, what they printed), draw from the Recorder)
    "part3-redis-line-pool.svg": (record_redis_pools, draw_redis_line_pool),
    "part3-tagged-out-of-order.svg": (record_tagged, draw_tagged_out_of_order),
    "part3-head-of-line.svg": (record_tagged, draw_head_of_line),
    "part3-late-reply.svg": (record_tagged, draw_late_reply),
}
