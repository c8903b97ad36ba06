"""pictures.draw_part3: Part three's pictures; a reader of the lesson need not read it. Each is
drawn from the events part3_demo's own scenarios made (pictures/record.py):

    part3-redis-line-pool.svg       scenarios 2 and 4, borrows(): TrustingPool by line, then
                                    SessionProxy by RESP, a row per client of the crowd
    part3-tagged-out-of-order.svg   scenario 5, ids out in order and replies back out of it,
                                    a sequence() through TaggedClient, its reader's hand-offs
    part3-head-of-line.svg          scenario 6, a held key with ids, a sequence(), then the
                                    untagged twin's byte strip
    part3-late-reply.svg            scenario 7, a late reply dropped by its id, a sequence()
"""
from part3 import parser, tagged
from pictures.record import Got, RedisRead, Returned, TaggedSent, Waited, record_part3
from pictures.svg import GREEN, RED, borrows, sequence, split, text_width, titled, visible
from scaffolding.kit import CLIENT_NAMES


WHOLE = "its whole reply"   # a read's verdict: one reply, all of it, and its own


def redis_exchanges(reads):
    """(read, the pieces (owner, bytes, wrong) it got, verdict) per read of one connection: what
    the pool read (each reply, then the last read's rest) is cut into Redis's replies, the n-th
    the n-th read's, as Redis answers a connection in order; a piece of another read's is wrong."""
    stream = b"".join(read.reply for read in reads) + reads[-1].rest
    replies, end = [], 0   # (the index of the read whose reply it is, its bytes)
    # past the last reply a read touched: the scheduler's
    while end < len(stream) - len(reads[-1].rest):
        size = parser.reply_size(stream[end:])
        replies.append((len(replies), stream[end:end + size]))
        end += size
    exchanges = []
    for index, took in enumerate(split(replies, [len(read.reply) for read in reads])):
        read = reads[index]
        others = sorted({reads[owner].client for owner, _ in took if owner != index})
        if others:
            verdict = f"WRONG: bytes of {', '.join(others)}'s reply"
        elif parser.reply_size(read.reply) == len(read.reply):
            verdict = WHOLE
        else:
            verdict = "cut: only the first line of its reply"
        exchanges.append((read, [(reads[owner].client, data, owner != index)
                                 for owner, data in took], verdict))
    return exchanges


def redis_rows(exchanges, by_client=False):
    """svg.borrows' rows from redis_exchanges(): a row per read, or by_client a row per client
    connection, by the clients' names, its reads in its order. A row's verdict is the first of its
    reads' that is not WHOLE, else WHOLE ("each" first, for more than one read)."""
    grouped = {}
    for exchange in exchanges:
        grouped.setdefault(exchange[0].via if by_client else len(grouped), []).append(exchange)
    if by_client:   # the order they came in is the scheduler's
        grouped = dict(sorted(grouped.items(), key=lambda item: item[1][0][0].client))
    rows = []
    for group in grouped.values():
        faults = [verdict for *_, verdict in group if verdict != WHOLE]
        verdict = faults[0] if faults else ("each " if len(group) > 1 else "") + WHOLE
        rows.append((group[0][0].client, [(read.request, got) for read, got, _ in group],
                     verdict, RED if faults else GREEN))
    return rows


def plural(count, noun):
    return f"{count} {noun}{'' if count == 1 else 's'}"


def draw_redis_line_pool(runs):
    svg, y = titled("Part three, scenarios 2 and 4: a pool in front of a real redis-server, "
                    "framed by line and by RESP")
    line_reads = [e for e in runs["line_pool"] if isinstance(e, RedisRead)]
    bottom = borrows(svg, y + 14,
                     f"{line_reads[0].pool}, framing=LINES: the reply ends at the first \\n",
                     "the bytes read past it stay on the connection for the next borrower",
                     redis_rows(redis_exchanges(line_reads)))
    reads = [e for e in runs["resp_pool"] if isinstance(e, RedisRead)]
    exchanges = redis_exchanges(reads)
    # the first client's requests, one after another, then the other clients' at once
    first = reads[0].client
    alone = [e for e in exchanges if e[0].via == reads[0].via]
    crowd = [e for e in exchanges if e[0].via != reads[0].via]
    crowd_clients = plural(len({read.via for read, *_ in crowd}), "client")
    bottom = borrows(svg, bottom + 22,
                     f"{reads[0].pool}, framing=RESP: the reply ends where RESP's lengths say",
                     f"{first} alone, one request after another, then below {crowd_clients} "
                     "at once; "
                     f"{plural(len({read.connection for read in reads}), 'upstream connection')}"
                     " in all", redis_rows(alone))
    # the demo names the crowd A, B, ... afresh
    another = any(read.client == first for read, *_ in crowd)
    borrows(svg, bottom + 10, f"{plural(len(crowd), 'request')} from {crowd_clients} at once",
            "a row per client, its requests in its own order; the pool took them in turns, "
            "as they came" + (f"; this {first} is another client" if another else ""),
            redis_rows(crowd, by_client=True))
    return svg


def call_of(line):
    """(id, the rest, whose call) of a line sent, taken or returned: id 1 is A's, 2 B's
    (a thread per call)."""
    request_id, rest = tagged.parse_tagged(line.rstrip(b"\n"))
    return request_id, rest, CLIENT_NAMES[request_id - 1]


def tagged_picture(events, *lines, hand_offs=False):
    """`lines` (the title first), then one TaggedClient's scenario as a sequence, a lane per call:
    each request sent, call given up and reply taken, as logged; a reply goes to the call its id
    names, red unless that call returned it, or if it gave up, no further than the client. With
    hand_offs, a request goes from its caller to the client, which sends it with its id, and a
    reply to the client, whose reader hands the call what it returned. Then the replies' ids in
    order, and connections."""
    returned = {call_of(e.line)[0]: e.outcome for e in events if isinstance(e, Returned)}
    rows = []
    for event in (e for e in events if isinstance(e, (TaggedSent, Returned, Got))):
        request_id, rest, name = call_of(event.line)
        gave_up = isinstance(returned[request_id], str)
        if isinstance(event, TaggedSent) and hand_offs:   # the caller's line is the rest of it
            rows += [("arrow", name, "TaggedClient", rest + b"\n", name, False, ""),
                     ("arrow", "TaggedClient", "TaggedUpstream", event.line, name, False, "")]
        elif isinstance(event, TaggedSent):
            rows.append(("arrow", name, "TaggedUpstream", event.line, name, False, ""))
        elif isinstance(event, Returned) and gave_up:
            rows.append(("note", name, f"{name} gives up: {event.outcome}", name, True, ""))
        elif isinstance(event, Got) and gave_up:
            rows.append(("arrow", "TaggedUpstream", "TaggedClient", event.line + b"\n", name, True,
                         f"id {request_id}: no call is owed it any more: dropped"))
        elif isinstance(event, Got) and hand_offs:
            # drawn as the reader took it: the call returns it after, when its thread wakes
            wrong = returned[request_id] != rest + b"\n"
            rows += [("arrow", "TaggedUpstream", "TaggedClient", event.line + b"\n", name, False,
                      ""),
                     ("arrow", "TaggedClient", name, returned[request_id], name, wrong,
                      f"the reader: id {request_id} is {name}'s call")]
        elif isinstance(event, Got):
            wrong = returned[request_id] != rest + b"\n"
            rows.append(("arrow", "TaggedUpstream", name, event.line + b"\n", name, wrong, ""))
    svg, top = titled(*lines)
    names = sorted(call_of(e.line)[2] for e in events if isinstance(e, TaggedSent))
    lanes = {name: 100 + index * 130 for index, name in enumerate(names)}
    lanes.update(TaggedClient=lanes[names[-1]] + 150, TaggedUpstream=lanes[names[-1]] + 380)
    if hand_offs:   # each label clear of the lane past it: a label starts 12 right of its arrow's
        def gap(lane):
            return 40 + max(text_width(visible(row[3]), 13) for row in rows
                            if row[0] == "arrow" and lane in row[1:3])
        lanes["TaggedClient"] = lanes[names[-1]] + gap(names[-1])
        lanes["TaggedUpstream"] = lanes["TaggedClient"] + gap("TaggedUpstream")
    bottom = sequence(svg, top + 42, lanes, rows, lanes["TaggedUpstream"] + 70) + 28
    got = ", ".join(str(call_of(e.line)[0]) for e in events if isinstance(e, Got))
    upstream = next(e.upstream for e in events if isinstance(e, Waited) and e.upstream.tagged)
    svg.text(16, bottom,
             f"the replies' ids came back {got}; connections opened: {upstream.connections}", 13,
             GREEN if upstream.connections == 1 else RED, bold=True)
    return svg


def draw_tagged_out_of_order(runs):
    return tagged_picture(runs["out_of_order"],
                          "Part three, scenario 5: request ids, three calls over one connection",
                          "each caller's request goes out with an id; the client's reader hands "
                          "each reply to the call its id names", hand_offs=True)


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
