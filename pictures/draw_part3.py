"""pictures.draw_part3: Part three's pictures, drawn from part3_demo's own runs (recorded
by pictures/record.py), as pictures/draw.py draws the others (`python3 -m pictures`).

    part3-redis-line-pool.svg       borrows: TrustingPool framing by line, then FramedProxy by RESP
    part3-tagged-out-of-order.svg   a sequence: ids going up, replies back in another order, each to its caller
    part3-head-of-line.svg          sequences: a held key with ids (the fast replies pass it), the untagged twin
    part3-late-reply.svg            a sequence: a call gives up, its late reply dropped by id, the connection serving on

Redis answers one connection's commands in order, so the n-th reply on a pool's
connection is its n-th borrower's; a TaggedClient's reply names its call by id.
"""
from part3 import resp, tagged
from pictures.record import (Connected, Counted, Got, RedisRead, Returned, Scenario, TaggedSent, UpstreamRead,
                             UpstreamReady, UpstreamWrote, record_redis_pools, record_tagged)
from pictures.svg import GREEN, INK, MUTED, RED, RED_FILL, Svg, borrows, colours, cut, heading, sequence, visible
from scaffolding.kit import CLIENT_NAMES
import tcp_proxy


def scenario_events(recorder, name):
    """The events logged between Scenario(name) and the next Scenario."""
    found, current = [], None
    for event in recorder.events:
        if isinstance(event, Scenario):
            current = event.name
        elif current == name:
            found.append(event)
    return found


# --- a pool in front of Redis: whose reply each borrower's bytes are --------------------

def takes(reads):
    """What each of one connection's reads took, as [(owner, bytes)] cut where another
    reply begins, and the unread rest of the last reply a read touched.

    The pool read every reply it delivered and the rest of the last read; resp.reply_size()
    cuts that into Redis's replies, the n-th the n-th borrower's. How much more it read is
    the scheduler's, so nothing past the last reply touched is shown."""
    stream = b"".join(read.reply for read in reads) + reads[-1].rest
    delivered = len(stream) - len(reads[-1].rest)
    replies, end = [], 0
    while end < delivered:
        size = resp.reply_size(stream[end:])
        replies.append((reads[len(replies)].client, stream[end:end + size]))
        end += size
    taken, start = [], 0
    for read in reads:
        taken.append(cut(replies, start, start + len(read.reply)))
        start += len(read.reply)
    return taken, cut(replies, delivered, end)


def verdict(client, took):
    """(What a borrower's bytes are, their colour): its whole reply, part of it, or another's."""
    others = sorted({owner for owner, _ in took} - {client})
    data = b"".join(data for _, data in took)
    if others:
        return f"WRONG: bytes of {', '.join(others)}'s reply", RED
    if resp.reply_size(data) == len(data):
        return "its whole reply", GREEN
    return "cut: only the first line of its reply", RED


def redis_panel(svg, top, rule, note, reads, drawn):
    """One connection's reads as svg.borrows: what Redis wrote, cut where each read ended,
    then a row per borrower. The owners drawn join `drawn`, for the legend. Returns the bottom."""
    taken, unread = takes(reads)
    strip, rows = [], []
    for read, took in zip(reads, taken):
        strip += [(owner, data, owner != read.client, read.client) for owner, data in took]
        got = [(owner, data, owner != read.client) for owner, data in took]
        rows.append((read.client, read.request, got, *verdict(read.client, took), ""))
    strip += [(owner, data, False, None) for owner, data in unread]
    drawn.update(owner for owner, *_ in strip)
    caption = "what Redis wrote on upstream connection 1, reply after reply:"
    return borrows(svg, top, rule, note, (caption, strip), rows)


def draw_redis_line_pool(recorder):
    title = "Part three, scenarios 2 and 4: a pool in front of a real redis-server, framed by line and by RESP"
    svg = Svg(title)
    y = heading(svg, [title, "Redis answers GET with a bulk string, b'$5\\r\\nhello\\r\\n': a header line, "
                             "then the value on a second line",
                      "each client borrows the pool's one upstream connection in turn"])
    drawn = set()
    line_reads = [e for e in scenario_events(recorder, "line_pool") if isinstance(e, RedisRead)]
    bottom = redis_panel(svg, y + 14, "TrustingPool, framing=LINES: the reply ends at the first \\n",
                         "the bytes read past it stay on the connection for the next borrower", line_reads, drawn)
    svg.text(16, bottom + 4, f"the line framing stopped after {visible(line_reads[0].reply)}; the rest, "
             f"{visible(line_reads[0].rest)}, went to the next borrower as its reply", 13, RED, bold=True)
    resp_reads = [e for e in scenario_events(recorder, "resp_pool") if isinstance(e, RedisRead)]
    first = [read for read in resp_reads if read.connection == resp_reads[0].connection]
    bottom = redis_panel(svg, bottom + 50, "FramedProxy, framing=RESP: the reply ends where its type byte and length say",
                         "client A's four requests one after another through the pool's one connection", first[:4], drawn)
    crowd = list(zip(first, takes(first)[0]))[4:]
    right = sum(verdict(read.client, took)[1] == GREEN for read, took in crowd)
    connections = len({read.connection for read in resp_reads})
    svg.text(16, bottom + 4, f"then {len(crowd)} GETs from 8 clients at once: each got its own whole "
             f"reply {right}/{len(crowd)}, over {connections} upstream connection", 13,
             GREEN if right == len(crowd) else RED, bold=True)
    svg.legend(16, bottom + 36, [(f"{owner}'s reply", *colours(owner)) for owner in sorted(drawn)]
               + [("red outline: bytes of another client's reply", RED_FILL, RED)])
    return svg


# --- request ids: each reply to the call its id names ----------------------------------

def split_id(line):
    """(id, the rest) of a request, reply or call's line, without its b"\\n"."""
    return tagged.parse_tagged(line.rstrip(b"\n"))


def caller(line):
    """Whose call a line is, by its id: 1 is A's, 2 B's ... (in these scenarios each call
    runs on a thread of its own, and a client's ids count from 1)."""
    return CLIENT_NAMES[split_id(line)[0] - 1]


def tagged_rows(events):
    """svg.sequence's rows for one TaggedClient's scenario, in the order logged: each request
    sent, each call that gave up, each reply line the client's reader took. A reply whose
    call has given up goes no further than the client, in red."""
    gave_up, rows = set(), []   # the ids whose calls have given up so far
    for event in (e for e in events if isinstance(e, (TaggedSent, Returned, Got))):
        request_id, name = split_id(event.line)[0], caller(event.line)
        if isinstance(event, TaggedSent):
            rows.append(("arrow", name, "TaggedUpstream", event.line, name, False, ""))
        elif isinstance(event, Returned) and isinstance(event.outcome, str):
            gave_up.add(request_id)
            rows.append(("note", name, f"{name} gives up: {event.outcome}", name, True,
                         "its id is abandoned, not reused"))
        elif isinstance(event, Got) and request_id in gave_up:
            rows.append(("arrow", "TaggedUpstream", "TaggedClient", event.line + b"\n", name, True,
                         f"id {request_id}: no call is owed it any more: dropped"))
        elif isinstance(event, Got):
            rows.append(("arrow", "TaggedUpstream", name, event.line + b"\n", name, False,
                         f"id {request_id} -> {name}"))
    return rows


def tagged_sequence(svg, top, events):
    """One TaggedClient's scenario as svg.sequence below `top`: a lane per call, then the
    client and the upstream. Returns the bottom."""
    names = sorted(caller(e.line) for e in events if isinstance(e, TaggedSent))
    lanes = {name: 100 + index * 130 for index, name in enumerate(names)}
    lanes.update(TaggedClient=lanes[names[-1]] + 150, TaggedUpstream=lanes[names[-1]] + 380)
    return sequence(svg, top + 26, lanes, tagged_rows(events), lanes["TaggedUpstream"] + 70)


def draw_results(svg, top, events):
    """A row per call (svg.borrows), in id order: what it asked, what it returned, whether that is its own reply."""
    rows = []
    for call in sorted((e for e in events if isinstance(e, Returned)), key=lambda call: split_id(call.line)):
        line, name = split_id(call.line)[1], caller(call.line)
        right = call.outcome == tcp_proxy.answer(line)
        if isinstance(call.outcome, str):
            rows.append((name, line, [], f"nothing: it raised {call.outcome}", MUTED, ""))
        else:
            rows.append((name, line, [(name, call.outcome, not right)], "its own reply" if right else "WRONG",
                         GREEN if right else RED, ""))
    return borrows(svg, top, "what each call returned", "call() returns the reply that carries its own id", None, rows)


def ids(events, kind):
    """The ids of the requests sent (kind TaggedSent), the replies taken (Got) or the calls
    returned (Returned), in the order logged."""
    return [split_id(e.line)[0] for e in events if isinstance(e, kind)]


def draw_tagged_out_of_order(recorder):
    title = "Part three, scenario 5: request ids, three calls over one connection"
    svg = Svg(title)
    y = heading(svg, [title, "each request goes out as <id> <line>; the upstream answers in its own order, "
                             "and the client's reader gives each reply to the call that owns its id"])
    events = scenario_events(recorder, "out_of_order")
    bottom = tagged_sequence(svg, y + 16, events)
    svg.text(16, bottom + 28, f"ids went out {', '.join(map(str, ids(events, TaggedSent)))}; replies came back "
             f"{', '.join(map(str, ids(events, Got)))}: not the order asked", 13, RED, bold=True)
    draw_results(svg, bottom + 66, events)
    return svg


def draw_head_of_line(recorder):
    title = "Part three, scenario 6: a slow key and the fast keys behind it"
    svg = Svg(title)
    y = heading(svg, [title, "the upstream holds the reply to GET slow (a hook, not a sleep) until the "
                             "fast calls are done; the same four requests, with ids and without"])
    events = scenario_events(recorder, "slow_key")
    svg.text(16, y + 14, "with ids: TaggedClient, one connection, each call on its own thread", 14, INK, bold=True)
    # whether a quick reply comes back before the next request is sent is the scheduler's
    # choice, so the log's order would change run to run: every reply is drawn after every request
    requests_first = [e for e in events if not isinstance(e, Got)] + [e for e in events if isinstance(e, Got)]
    bottom = tagged_sequence(svg, y + 46, requests_first) + 22
    svg.text(16, bottom, "requests drawn first, then the replies in the order the client's reader took "
             "them (a quick reply may come back before the next request is sent)", 11, MUTED)
    slow_id = next(split_id(e.line)[0] for e in events if isinstance(e, TaggedSent) and e.line.endswith(b" GET slow\n"))
    wire_order = ids(events, Got)
    svg.text(16, bottom + 28, f"id {slow_id} (GET slow) went out first and came back last: "
             f"ids {', '.join(map(str, wire_order[:wire_order.index(slow_id)]))} passed it", 13, GREEN, bold=True)
    y = draw_results(svg, bottom + 66, events) + 30
    untagged = [e for e in events if isinstance(e, (UpstreamRead, UpstreamReady, UpstreamWrote)) and not e.tagged]
    held = untagged[:untagged.index(UpstreamReady(False, "slow"))]   # what had happened while GET slow was held
    ready = sorted(e.key for e in held if isinstance(e, UpstreamReady))
    written = sum(isinstance(e, UpstreamWrote) for e in held)
    svg.text(16, y, "without ids: the untagged twin, the four requests pipelined in order on one socket", 14,
             INK, bold=True)
    lanes = {"one socket": 100, "untagged upstream": 520}
    rows = [("arrow", "one socket", "untagged upstream", e.line.encode() + b"\n", None, False, "")
            for e in untagged if isinstance(e, UpstreamRead)]
    rows.append(("note", "untagged upstream", "GET slow held", None, True,
                 f"replies ready {len(ready)} ({', '.join(ready)}), written {written}: each waits its turn"))
    for index, e in enumerate(e for e in untagged if isinstance(e, UpstreamWrote)):
        rows.append(("arrow", "untagged upstream", "one socket", e.line.encode() + b"\n", None, index > 0,
                     "in order: it waited for GET slow" if index else "written once GET slow is let go"))
    sequence(svg, y + 46, lanes, rows, lanes["untagged upstream"] + 70)
    return svg


def draw_late_reply(recorder):
    title = "Part three, scenario 7: a timed-out call's late reply, dropped by id"
    svg = Svg(title)
    y = heading(svg, [title, "the upstream holds the reply to GET slow until the call has given up and the "
                             "next request is on the wire; then it writes both"])
    events = scenario_events(recorder, "late_reply")
    bottom = tagged_sequence(svg, y + 16, events)
    dropped = [e.counter for e in events if isinstance(e, Counted)].count("dropped")
    connections = sum(isinstance(e, Connected) for e in events)
    served = {split_id(e.line)[0] for e in events if isinstance(e, Returned) and not isinstance(e.outcome, str)}
    later = [request_id for request_id in ids(events, Got) if request_id in served]
    svg.text(16, bottom + 28, f"late replies dropped by id: {dropped}; the connection served on: ids "
             f"{', '.join(map(str, later))} went to their callers; connections opened: {connections}", 13,
             GREEN, bold=True)
    draw_results(svg, bottom + 66, events)
    return svg


PICTURES = {   # file name -> (run the scenarios: (Recorder, what they printed), draw from the Recorder)
    "part3-redis-line-pool.svg": (record_redis_pools, draw_redis_line_pool),
    "part3-tagged-out-of-order.svg": (record_tagged, draw_tagged_out_of_order),
    "part3-head-of-line.svg": (record_tagged, draw_head_of_line),
    "part3-late-reply.svg": (record_tagged, draw_late_reply),
}
