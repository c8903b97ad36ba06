"""pictures.draw_part3: Part three's pictures; a reader of the lesson need not read it. Each is
drawn from the events part3_demo's own scenarios made (pictures/record.py):

    part3-redis-line-pool.svg       scenarios 2 and 4, TrustingPool by line as borrows(),
                                    FramedProxy by RESP's tally
    part3-tagged-out-of-order.svg   scenario 5, ids out in order and replies back out of it,
                                    a sequence()
    part3-head-of-line.svg          scenario 6, a held key with ids, a sequence(), then the
                                    untagged twin's byte strip
    part3-late-reply.svg            scenario 7, a late reply dropped by its id, a sequence()
"""
from part3 import parser, tagged
from pictures.record import Got, RedisRead, Returned, TaggedSent, Waited, record_part3
from pictures.svg import GREEN, RED, borrows, sequence, split, titled
from scaffolding.kit import CLIENT_NAMES


def redis_rows(reads):
    """svg.borrows' rows for one connection's reads, each read's bytes in the colour of the borrower
    whose reply they are: what the pool read (each reply, then the last read's rest) is cut into
    Redis's replies, the n-th the n-th borrower's, as Redis answers in order."""
    stream = b"".join(read.reply for read in reads) + reads[-1].rest
    replies, end = [], 0
    # past the last reply a read touched: the scheduler's
    while end < len(stream) - len(reads[-1].rest):
        size = parser.reply_size(stream[end:])
        replies.append((reads[len(replies)].client, stream[end:end + size]))
        end += size
    rows = []
    for read, took in zip(reads, split(replies, [len(read.reply) for read in reads])):
        others = sorted({owner for owner, _ in took} - {read.client})
        if others:
            verdict = f"WRONG: bytes of {', '.join(others)}'s reply"
        elif parser.reply_size(read.reply) == len(read.reply):
            verdict = "its whole reply"
        else:
            verdict = "cut: only the first line of its reply"
        got = [(owner, data, owner != read.client) for owner, data in took]
        rows.append((read.client, read.request, got, verdict,
                     GREEN if verdict == "its whole reply" else RED))
    return rows


def draw_redis_line_pool(runs):
    svg, y = titled("Part three, scenarios 2 and 4: a pool in front of a real redis-server, "
                    "framed by line and by RESP")
    line_rows = redis_rows([e for e in runs["line_pool"] if isinstance(e, RedisRead)])
    bottom = borrows(svg, y + 14, "TrustingPool, framing=LINES: the reply ends at the first \\n",
                     "the bytes read past it stay on the connection for the next borrower",
                     line_rows)
    reads = [e for e in runs["resp_pool"] if isinstance(e, RedisRead)]
    # a read that took one whole reply and nothing past it:
    # Redis answering in order, the borrower's own
    whole = [parser.reply_size(read.reply) == len(read.reply) and not read.rest for read in reads]
    # the clients that came after A
    crowd = [ok for read, ok in zip(reads, whole) if read.via != reads[0].via]
    svg.text(16, bottom + 18,
             f"FramedProxy, framing=RESP: {reads[0].client}'s {len(reads) - len(crowd)} requests, "
             f"then {len(crowd)} GETs from {len({read.via for read in reads}) - 1} clients "
             f"at once: each its own whole reply, {sum(crowd)}/{len(crowd)}, "
             f"over {len({read.connection for read in reads})} upstream "
             "connection", 13, GREEN if all(whole) else RED, bold=True)
    return svg


def call_of(line):
    """(id, the rest, whose call) of a line sent, taken or returned: id 1 is A's, 2 B's
    (a thread per call)."""
    request_id, rest = tagged.parse_tagged(line.rstrip(b"\n"))
    return request_id, rest, CLIENT_NAMES[request_id - 1]


def tagged_picture(events, *lines):
    """`lines` (the title first), then one TaggedClient's scenario as a sequence, a lane per call:
    each request sent, call given up and reply taken, as logged; a reply goes to the call its id
    names, red unless that call returned it, or if it gave up, no further than the client. Then the
    replies' ids in order, and connections."""
    returned = {call_of(e.line)[0]: e.outcome for e in events if isinstance(e, Returned)}
    rows = []
    for event in (e for e in events if isinstance(e, (TaggedSent, Returned, Got))):
        request_id, rest, name = call_of(event.line)
        gave_up = isinstance(returned[request_id], str)
        if isinstance(event, TaggedSent):
            rows.append(("arrow", name, "TaggedUpstream", event.line, name, False, ""))
        elif isinstance(event, Returned) and gave_up:
            rows.append(("note", name, f"{name} gives up: {event.outcome}", name, True, ""))
        elif isinstance(event, Got) and gave_up:
            rows.append(("arrow", "TaggedUpstream", "TaggedClient", event.line + b"\n", name, True,
                         f"id {request_id}: no call is owed it any more: dropped"))
        elif isinstance(event, Got):
            wrong = returned[request_id] != rest + b"\n"
            rows.append(("arrow", "TaggedUpstream", name, event.line + b"\n", name, wrong, ""))
    svg, top = titled(*lines)
    names = sorted(call_of(e.line)[2] for e in events if isinstance(e, TaggedSent))
    lanes = {name: 100 + index * 130 for index, name in enumerate(names)}
    lanes.update(TaggedClient=lanes[names[-1]] + 150, TaggedUpstream=lanes[names[-1]] + 380)
    bottom = sequence(svg, top + 42, lanes, rows, lanes["TaggedUpstream"] + 70) + 28
    got = ", ".join(str(call_of(e.line)[0]) for e in events if isinstance(e, Got))
    upstream = next(e.upstream for e in events if isinstance(e, Waited) and e.upstream.tagged)
    svg.text(16, bottom,
             f"the replies' ids came back {got}; connections opened: {upstream.connections}", 13,
             GREEN if upstream.connections == 1 else RED, bold=True)
    return svg


def draw_tagged_out_of_order(runs):
    return tagged_picture(runs["out_of_order"],
                          "Part three, scenario 5: request ids, three calls over one connection")


def draw_head_of_line(runs):
    events = runs["slow_key"]
    # in the log's order the picture would vary:
    # whether a quick reply beats the next request is the scheduler's
    requests_first = ([e for e in events if not isinstance(e, Got)]
                      + [e for e in events if isinstance(e, Got)])
    svg = tagged_picture(requests_first,
                         "Part three, scenario 6: a slow key and the fast keys behind it",
                         "with ids: every request drawn first, "
                         "then the replies as the client's reader took them")
    # the twin's first wait (its pause hook waits on none):
    # the demo's, for 3 replies ready while GET slow is held
    held = next(e for e in events if isinstance(e, Waited) and not e.upstream.tagged)
    y = svg.bottom + 44
    svg.text(16, y,
             "without ids, pipelined on one socket: while GET slow was held, "
             f"replies ready {held.ready}, written {held.replies}; then, in order, behind it:",
             13, RED, bold=True)
    x = 16
    for index, line in enumerate(held.upstream.written):
        x += svg.bytes_box(x, y + 14, line.encode() + b"\n", None, wrong=index > 0) + 4
    return svg


def draw_late_reply(runs):
    return tagged_picture(runs["late_reply"],
                          "Part three, scenario 7: a timed-out call's late reply, dropped by id")


# file name -> (run the scenarios: ({scenario: its events}, what they printed), draw from those)
PICTURES = {
    "part3-redis-line-pool.svg": (record_part3, draw_redis_line_pool),
    "part3-tagged-out-of-order.svg": (record_part3, draw_tagged_out_of_order),
    "part3-head-of-line.svg": (record_part3, draw_head_of_line),
    "part3-late-reply.svg": (record_part3, draw_late_reply),
}
