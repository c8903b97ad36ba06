"""pictures.draw_part3: Part three's pictures; a reader of the lesson need not read it. Each is
drawn from the events part3_demo's own scenarios made (pictures/record.py):

    part3-redis-line-pool.svg       scenarios 2 and 4, TrustingPool by line above FramedProxy by RESP, as borrows()
    part3-tagged-out-of-order.svg   scenario 5, ids out in order and replies back out of it, a sequence()
    part3-head-of-line.svg          scenario 6, a held key with ids and the untagged twin, two sequence()s
    part3-late-reply.svg            scenario 7, a late reply dropped by its id, a sequence()
"""
from part3 import resp, tagged
from pictures.record import Counted, Got, RedisRead, Returned, TaggedSent, record_part3
from pictures.svg import GREEN, INK, RED, RED_FILL, borrows, sequence, split, titled, visible
from scaffolding.kit import CLIENT_NAMES


def redis_rows(reads):
    """svg.borrows' rows for one connection's reads, each read's bytes in the colour of the borrower whose reply
    they are: what the pool read (each reply, then the last read's rest) is cut into Redis's replies, the n-th
    the n-th borrower's, as Redis answers in order."""
    stream = b"".join(read.reply for read in reads) + reads[-1].rest
    replies, end = [], 0
    while end < len(stream) - len(reads[-1].rest):   # past the last reply a read touched: the scheduler's
        size = resp.reply_size(stream[end:])
        replies.append((reads[len(replies)].client, stream[end:end + size]))
        end += size
    rows = []
    for read, took in zip(reads, split(replies, [len(read.reply) for read in reads])):
        others = sorted({owner for owner, _ in took} - {read.client})
        if others:
            verdict = f"WRONG: bytes of {', '.join(others)}'s reply"
        elif resp.reply_size(read.reply) == len(read.reply):
            verdict = "its whole reply"
        else:
            verdict = "cut: only the first line of its reply"
        got = [(owner, data, owner != read.client) for owner, data in took]
        rows.append((read.client, read.request, got, verdict, GREEN if verdict == "its whole reply" else RED, ""))
    return rows


def draw_redis_line_pool(runs):
    svg, y = titled("Part three, scenarios 2 and 4: a pool in front of a real redis-server, framed by line and by RESP",
                    "Redis answers GET with a bulk string, b'$5\\r\\nhello\\r\\n': a header line, "
                    "then the value on a second line",
                    "each client borrows the pool's one upstream connection in turn")
    line_reads = [e for e in runs["line_pool"] if isinstance(e, RedisRead)]
    line_rows = redis_rows(line_reads)
    bottom = borrows(svg, y + 14, "TrustingPool, framing=LINES: the reply ends at the first \\n",
                     "the bytes read past it stay on the connection for the next borrower", None, line_rows)
    svg.text(16, bottom + 4, f"the line framing stopped after {visible(line_reads[0].reply)}; the rest, "
             f"{visible(line_reads[0].rest)}, went to the next borrower as its reply", 13, RED, bold=True)
    resp_reads = [e for e in runs["resp_pool"] if isinstance(e, RedisRead)]
    resp_rows = redis_rows([read for read in resp_reads if read.connection == resp_reads[0].connection])
    bottom = borrows(svg, bottom + 50, "FramedProxy, framing=RESP: the reply ends where its type byte and length say",
                     "client A's four requests one after another through the pool's one connection", None,
                     resp_rows[:4])
    crowd = [verdict for _, _, _, verdict, _, _ in resp_rows[4:]]
    right = crowd.count("its whole reply")
    connections = len({read.connection for read in resp_reads})
    svg.text(16, bottom + 4, f"then {len(crowd)} GETs from 8 clients at once: each got its own whole "
             f"reply {right}/{len(crowd)}, over {connections} upstream connection", 13,
             GREEN if right == len(crowd) else RED, bold=True)
    drawn = sorted({owner for _, _, got, *_ in line_rows + resp_rows[:4] for owner, _, _ in got})   # only colours drawn
    svg.legend(16, bottom + 36, [("red outline: bytes of another client's reply", RED_FILL, RED)], drawn, "reply")
    return svg


def call_of(line):
    """(id, the rest, whose call) of a line sent, taken or returned: id 1 is A's, 2 B's (a thread per call)."""
    request_id, rest = tagged.parse_tagged(line.rstrip(b"\n"))
    return request_id, rest, CLIENT_NAMES[request_id - 1]


def tagged_picture(lines, events, tone, more=""):
    """`lines` (the title first), then one TaggedClient's scenario as a sequence, a lane per call: each request
    sent, call given up and reply taken, as logged; a reply goes to the call its id names, checked against what
    that call returned, or if it gave up, no further than the client. Then the ids in the order they went out
    and came back, and `more`. Returns (the picture, its last line's baseline)."""
    returned = {call_of(e.line)[0]: e.outcome for e in events if isinstance(e, Returned)}
    rows = []
    for event in (e for e in events if isinstance(e, (TaggedSent, Returned, Got))):
        request_id, rest, name = call_of(event.line)
        outcome = returned[request_id]
        if isinstance(event, TaggedSent):
            rows.append(("arrow", name, "TaggedUpstream", event.line, name, False, ""))
        elif isinstance(event, Returned) and isinstance(outcome, str):
            rows.append(("note", name, f"{name} gives up: {outcome}", name, True, "its id is abandoned, not reused"))
        elif isinstance(event, Got) and isinstance(outcome, str):
            rows.append(("arrow", "TaggedUpstream", "TaggedClient", event.line + b"\n", name, True,
                         f"id {request_id}: no call is owed it any more: dropped"))
        elif isinstance(event, Got):
            wrong = outcome != rest + b"\n"
            told = f"WRONG: its call() returned {visible(outcome)}" if wrong else "its call() returned it"
            rows.append(("arrow", "TaggedUpstream", name, event.line + b"\n", name, wrong,
                         f"id {request_id} -> {name}: {told}"))
    svg, top = titled(*lines)
    names = sorted(call_of(e.line)[2] for e in events if isinstance(e, TaggedSent))
    lanes = {name: 100 + index * 130 for index, name in enumerate(names)}
    lanes.update(TaggedClient=lanes[names[-1]] + 150, TaggedUpstream=lanes[names[-1]] + 380)
    bottom = sequence(svg, top + 42, lanes, rows, lanes["TaggedUpstream"] + 70) + 28
    svg.text(16, bottom, f"ids went out {ids(events)}; replies came back {ids(events, Got)}{more}", 13, tone, bold=True)
    return svg, bottom


def ids(events, kind=TaggedSent):
    """The ids of the requests sent (TaggedSent), the replies taken (Got) or the calls returned, as logged."""
    return ", ".join(str(call_of(e.line)[0]) for e in events if isinstance(e, kind))


def draw_tagged_out_of_order(runs):
    return tagged_picture(["Part three, scenario 5: request ids, three calls over one connection",
                           "each request goes out as <id> <line>; the upstream answers in its own order, "
                           "and the client's reader gives each reply to the call that owns its id"],
                          runs["out_of_order"], RED, ": not the order asked")[0]


def draw_head_of_line(runs):
    events = runs["slow_key"]
    # whether a quick reply comes back before the next request is sent is the scheduler's
    # choice: drawn in the log's order, the picture would change from run to run
    requests_first = [e for e in events if not isinstance(e, Got)] + [e for e in events if isinstance(e, Got)]
    svg, y = tagged_picture(
        ["Part three, scenario 6: a slow key and the fast keys behind it",
         "the upstream holds the reply to GET slow (a hook, not a sleep) until the fast calls are done; "
         "the same four requests, with ids and without",
         "with ids (TaggedClient, one connection, a thread per call): every request drawn first, then the "
         "replies in the order the client's reader took them"], requests_first, GREEN)
    twin = next(e.source for e in events if isinstance(e, Counted) and isinstance(e.source, tagged.TaggedUpstream)
                and not e.source.tagged)
    counted = [e for e in events if isinstance(e, Counted) and e.source is twin]
    held = counted[:counted.index(Counted(twin, "ready", "slow"))]   # what it counted while GET slow was held
    ready = sorted(e.key for e in held if e.counter == "ready")
    written = [e.counter for e in held].count("replies")
    svg.text(16, y + 46, "without ids: the untagged twin, the four requests pipelined in order on one socket", 14,
             INK, bold=True)
    rows = [("arrow", "one socket", "untagged upstream", line.encode() + b"\n", None, False, "")
            for line in twin.parsed]
    rows.append(("note", "untagged upstream", "GET slow held", None, True,
                 f"replies ready {len(ready)} ({', '.join(ready)}), written {written}: each waits its turn"))
    for index, line in enumerate(twin.written):
        rows.append(("arrow", "untagged upstream", "one socket", line.encode() + b"\n", None, index > 0,
                     "in order: it waited for GET slow" if index else "written once GET slow is let go"))
    sequence(svg, y + 92, {"one socket": 100, "untagged upstream": 520}, rows, 590)
    return svg


def draw_late_reply(runs):
    events = runs["late_reply"]
    counters = [(type(e.source), e.counter) for e in events if isinstance(e, Counted)]
    served = [e for e in events if isinstance(e, Returned) and isinstance(e.outcome, bytes)]
    return tagged_picture(["Part three, scenario 7: a timed-out call's late reply, dropped by id",
                           "the upstream holds the reply to GET slow until the call has given up and the "
                           "next request is on the wire; then it writes both"], events, GREEN,
                          f"; late replies dropped: {counters.count((tagged.TaggedClient, 'dropped'))}; ids "
                          f"{ids(served, Returned)} went to their callers; connections opened: "
                          f"{counters.count((tagged.TaggedUpstream, 'connections'))}")[0]


PICTURES = {   # file name -> (run the scenarios: ({scenario: its events}, what they printed), draw from those)
    "part3-redis-line-pool.svg": (record_part3, draw_redis_line_pool),
    "part3-tagged-out-of-order.svg": (record_part3, draw_tagged_out_of_order),
    "part3-head-of-line.svg": (record_part3, draw_head_of_line),
    "part3-late-reply.svg": (record_part3, draw_late_reply),
}
