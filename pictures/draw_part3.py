"""pictures.draw_part3: Part three's pictures, drawn from the scenarios' own runs
(`python3 -m pictures` draws them with the others).

The same method as pictures/draw.py, whose Recorder, Svg and drawing helpers this
module imports: each picture runs a scenario of part3_demo.py, unchanged, while
the Recorder wraps the methods where bytes change hands, and the drawing reads
only what the Recorder logged. test_pictures_part3.py draws every picture afresh
and compares it byte for byte with pictures/.

Map of the module, in reading order:

    record_redis_pools     runs line_pool and resp_pool against a real redis-server,
                           logging what each borrower asked and what read_reply() took
    redis_stream()         one upstream connection's bytes, cut into Redis's replies
                           (RESP-parsed) and owned by the request each one answers
    draw_redis_line_pool   part3-redis-line-pool.svg: TrustingPool (lines) against
                           FramedProxy (RESP) over the same kind of stream
    record_tagged          runs out_of_order, slow_key and late_reply, logging the
                           bytes each caller's request went out as and each reply
                           line the client's reader took, in the reader's order
    draw_tagged_out_of_order   part3-tagged-out-of-order.svg: ids going up, replies
                           coming back in another order, each to the caller of its id
    draw_head_of_line      part3-head-of-line.svg: a held key with ids (the fast replies
                           pass it) against the untagged twin (they wait behind it)
    draw_late_reply        part3-late-reply.svg: a call gives up; its reply, late, is
                           dropped by id while the connection serves the next calls
    PICTURES, render_all(), main()

Same bytes on every run: no port, time or id in a picture. A pool of one connection
lends it to one borrower at a time, so the order of the logged reads is the order
the borrowers held it; Redis answers one connection's commands in order, so the
n-th reply on a connection answers the n-th request sent on it.
"""

from scaffolding import kit, redis_server
from pictures import draw as pictures
from part3 import part3_demo
from part3 import resp
from part3 import tagged
import tcp_proxy
from pictures.draw import (GREEN, INK, MUTED, RED, RED_FILL, Recorder, Svg, colours,
                      heading, run_quietly, text_width, visible)
from tcp_proxy import FramedProxy

FAINT_LANE = "#cccccc"     # a lifeline
NEVER_READ = "never read"
UPSTREAM = "upstream"       # the owner of the untagged twin's bytes: one colour, no caller   # the owner label of stream bytes no borrower took


# --- recording: the pools in front of Redis ---------------------------------------------

def record_redis_pools():
    """Run line_pool and resp_pool; return the Recorder and what they printed.

    Logged, per scenario:
      scenario (name,)                          a scenario begins
      read (client, request, connection, leftover, reply, rest)
                                                FramedProxy.read_reply() returned: it began with
                                                `leftover` (bytes kept from an earlier read, only
                                                TrustingPool keeps any) and gave `reply` to the
                                                client, `rest` read past its end
      recv (connection, data)                   more_of_reply() read data from the upstream
    Connections are numbered from 1 in each scenario, in the order they are first used.
    """
    recorder = Recorder()
    numbers = {}   # the upstream socket's local address -> its number in this scenario

    def connection_number(sock):
        return numbers.setdefault(sock.getsockname(), len(numbers) + 1)

    def scenario(name, function):
        def run():
            numbers.clear()
            recorder.names.clear()
            recorder.log("scenario", name)
            return function()
        return run

    def wrap_read_reply(original):
        def read_reply(proxy, sock, buffer=b""):
            recorder.thread.sock = sock
            reply, rest = original(proxy, sock, buffer)
            recorder.log("read", recorder.thread.client, recorder.thread.request, connection_number(sock),
                         bytes(buffer), reply, rest)
            return reply, rest
        return read_reply

    def wrap_more_of_reply(original):
        def more_of_reply(sock):
            data = original(sock)
            recorder.log("recv", connection_number(sock), data)
            return data
        return more_of_reply

    with recorder:
        recorder.name_demo_clients()
        recorder.name_pool_requests()
        recorder.wrap(FramedProxy, "read_reply", wrap_read_reply)
        recorder.wrap(tcp_proxy, "more_of_reply", wrap_more_of_reply)
        _, printed = run_quietly(lambda: [scenario("line-pool", part3_demo.line_pool)(),
                                          scenario("resp-pool", part3_demo.resp_pool)()])
    return recorder, printed


def scenario_events(recorder, name):
    """The events logged between `scenario (name,)` and the next scenario."""
    found, current = [], None
    for event in recorder.events:
        if event[0] == "scenario":
            current = event[1]
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
    stream = b"".join(e[2] for e in events if e[0] == "recv" and e[1] == connection)
    reads = [e[1:] for e in events if e[0] == "read" and e[3] == connection]
    deliveries, position = [], 0
    for client, request, _, _, reply, _ in reads:
        deliveries.append((client, request, position, position + len(reply)))
        position += len(reply)
    owners = [client for client, *_ in reads]   # the n-th request sent answers the n-th reply
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
    taker is the client who received the piece, or NEVER_READ."""
    cuts = {0}
    position = 0
    for _, data in replies:
        position += len(data)
        cuts.add(position)
    cuts.update(end for *_, end in deliveries)
    stream_end = position
    owner_at = []
    for owner, data in replies:
        owner_at += [owner] * len(data)
    taker_at = [NEVER_READ] * stream_end
    for client, _, start, end in deliveries:
        taker_at[start:end] = [client] * (end - start)
    stream = b"".join(data for _, data in replies)
    bounds = sorted(cut for cut in cuts if cut <= stream_end)
    return [(owner_at[low], taker_at[low], stream[low:high], low) for low, high in zip(bounds, bounds[1:])]


# --- drawing ---------------------------------------------------------------------------

def draw_redis_panel(svg, left, top, rule, note, events, connection, shown):
    """The first `shown` borrows of one connection: its stream on top, cut where each
    borrower's read ended, then one row per borrower. Returns the panel's bottom."""
    replies, deliveries = redis_stream(events, connection)
    deliveries = deliveries[:shown]
    shown_end = deliveries[-1][3]
    kept, position = [], 0
    for owner, data in replies:   # the replies the shown borrows touched
        if position < shown_end:
            kept.append((owner, data))
        position += len(data)
    svg.text(left, top, rule, 14, INK, bold=True)
    svg.text(left, top + 18, note, 12, MUTED)
    y = top + 46
    svg.text(left, y, f"what Redis wrote on upstream connection {connection}, reply after reply:", 12, MUTED)
    y += 10
    x = left
    for owner, taker, data, _ in pieces(kept, deliveries):
        stolen = taker not in (owner, NEVER_READ)
        width = svg.bytes_box(x, y, data, owner, 13, wrong=stolen)
        tone = RED if stolen else (MUTED if taker == NEVER_READ else colours(taker)[1])
        label = "unread" if taker == NEVER_READ else f"to {taker}"
        svg.text(x + width / 2, y + 42, label, 12, tone, anchor="middle", bold=stolen)
        svg.line(x + width / 2, y + 26, x + width / 2, y + 30, tone, 1.5)
        x += width + 4
    y += 76
    cut = pieces(kept, deliveries)
    request_width = max(len(visible(request)) for _, request, _, _ in deliveries)
    for client, request, start, end in deliveries:
        got = [(owner, data) for owner, _, data, at in cut if start <= at < end]
        owners = {owner for owner, _ in got}
        whole = any(data == b"".join(d for _, d in got) for o, data in kept if o == client)
        label = f"{client} sent {visible(request):<{request_width}}"
        svg.text(left, y, label, 13, INK)
        x = left + text_width(label, 13) + 8
        svg.text(x, y, "got", 13, MUTED)
        x += text_width("got", 13) + 8
        for owner, data in got:
            x += svg.bytes_box(x, y - 17, data, owner, 13, wrong=owner != client) + 2
        width = 0
        if whole:
            verdict, tone = "its whole reply", GREEN
        elif owners == {client}:
            verdict, tone = "cut: only the first line of its reply", RED
        else:
            verdict, tone = f"WRONG: bytes of {', '.join(sorted(owners - {client}))}'s reply", RED
        svg.text(x + width + 10, y, verdict, 13, tone, bold=True)
        y += 32
    return y


def draw_redis_line_pool(recorder):
    title = "Part three, scenarios 2 and 4: a pool in front of a real redis-server, framed by line and by RESP"
    svg = Svg(title)
    y = heading(svg, [title, "Redis answers GET with a bulk string, b'$5\\r\\nhello\\r\\n': a header line, "
                             "then the value on a second line",
                      "each client borrows the pool's one upstream connection in turn"])
    line_events = scenario_events(recorder, "line-pool")
    resp_events = scenario_events(recorder, "resp-pool")
    line_reads = [e for e in line_events if e[0] == "read"]
    bottom = draw_redis_panel(
        svg, 16, y + 14, "TrustingPool, framing=LINES: the reply ends at the first \\n",
        "the bytes read past it stay on the connection for the next borrower", line_events, 1,
        len(line_reads))
    first = line_reads[0]
    svg.text(16, bottom + 4, f"the line framing stopped after {visible(first[5])}; the rest, "
             f"{visible(first[6])}, went to the next borrower as its reply", 13, RED, bold=True)
    bottom = draw_redis_panel(
        svg, 16, bottom + 50, "FramedProxy, framing=RESP: the reply ends where its type byte and length say",
        "client A's four requests one after another through the pool's one connection", resp_events, 1, 4)
    resp_reads = [e for e in resp_events if e[0] == "read"]
    replies, deliveries = redis_stream(resp_events, 1)
    stream = b"".join(data for _, data in replies)
    crowd = deliveries[4:]
    right = sum(any(stream[start:end] == data for owner, data in replies if owner == client)
                for client, _, start, end in crowd)
    connections = len({e[3] for e in resp_reads})
    svg.text(16, bottom + 4, f"then {len(crowd)} GETs from 8 clients at once: each got its own whole "
             f"reply {right}/{len(crowd)}, over {connections} upstream connection", 13,
             GREEN if right == len(crowd) else RED, bold=True)
    svg.legend(16, bottom + 36, [("A's reply", *colours("A")), ("B's reply", *colours("B")),
                                 ("C's reply", *colours("C")),
                                 ("red outline: bytes of another client's reply", RED_FILL, RED)])
    return svg


# --- recording: request ids (tagged.py) ---------------------------------------------------

def record_tagged():
    """Run out_of_order, slow_key and late_reply; return the Recorder and what they printed.

    Logged, per scenario (callers are named A, B, C ... in the order they first call):
      scenario (name,)           a scenario begins
      connected ()               a TaggedClient opened its one connection
      sent (caller, data)        a TaggedClient is about to write a request: `<id> <line>`,
                                 logged before _send() writes it, so before the upstream can answer it
      timeout (caller,)          the caller's call gave up (CallTimeout)
      got (line,)                the client's reader took a reply line off the connection
      dropped ()                 ... and dropped the line it just took: its id belongs to a
                                 call that gave up
      returned (caller, outcome) the call returned the reply (bytes) or raised (its class name)
      upstream read (tagged, line)    a TaggedUpstream parsed a request line (tagged: ids or not)
      upstream ready (tagged, key)    ... the reply to `GET key` is ready: delay and pause over
      upstream wrote (tagged, line)   ... wrote a reply whole (its `written` log)
    A caller's events and the reader's are each in their thread's order; between the two,
    the drawing relies only on what causes what (a reply is got after its request is sent).
    """
    recorder = Recorder()
    callers = {"named": 0, "scenario": 0}   # callers named so far in this scenario; which scenario
    client_sockets = []   # the TaggedClients' sockets: only their lines are replies to a TaggedClient

    def scenario(name, function):
        def run():
            callers["named"] = 0
            callers["scenario"] += 1
            recorder.log("scenario", name)
            return function()
        return run

    def caller_name():
        """The calling thread's name, given at its first call in this scenario. Kept in
        thread-local storage, not by thread ident: a finished thread's ident is reused."""
        scenario_number, name = getattr(recorder.thread, "caller", (None, None))
        if scenario_number != callers["scenario"]:
            name = kit.CLIENT_NAMES[callers["named"]]
            callers["named"] += 1
            recorder.thread.caller = (callers["scenario"], name)
        return name

    def wrap_client_init(original):
        def __init__(client, *args, **options):
            original(client, *args, **options)
            client_sockets.append(client.sock)
            recorder.log("connected")
        return __init__

    def wrap_call(original):
        def call(client, line, *args, **options):
            caller = caller_name()
            try:
                reply = original(client, line, *args, **options)
            except tagged.TaggedError as error:
                recorder.log("returned", caller, type(error).__name__)
                raise
            recorder.log("returned", caller, reply)
            return reply
        return call

    def wrap_send(original):
        def _send(client, request, *args):
            recorder.log("sent", caller_name(), bytes(request))
            return original(client, request, *args)
        return _send

    def wrap_client_count(original):
        def count(client, name, amount=1):
            if name == "timeouts":
                recorder.log("timeout", caller_name())
            if name == "dropped":   # on the reader's thread, just after the line it took
                recorder.log("dropped")
            original(client, name, amount)
        return count

    def wrap_read_lines(original):
        def read_lines(sock, *args, **options):
            for line in original(sock, *args, **options):
                # asked per line: the reader starts before __init__ has noted its socket,
                # but no reply can come before a request has gone out
                if any(sock is known for known in client_sockets):
                    recorder.log("got", line)
                yield line
        return read_lines

    def wrap_key_of(original):   # called on the request's own thread, before its pause
        def key_of(line):
            recorder.thread.key = original(line)
            return recorder.thread.key
        return key_of

    def wrap_upstream_count(original):
        def count(upstream, name, amount=1):
            if name == "requests":   # on the connection's reader thread, after `parsed` has it
                recorder.log("upstream read", upstream.tagged, upstream.parsed[-1])
            elif name == "ready":    # on the request's thread, its delay and pause over
                recorder.log("upstream ready", upstream.tagged, recorder.thread.key)
            elif name == "replies":  # after sendall(), once `written` has it
                recorder.log("upstream wrote", upstream.tagged, upstream.written[-1])
            original(upstream, name, amount)
        return count

    with recorder:
        recorder.wrap(tagged.TaggedClient, "__init__", wrap_client_init)
        recorder.wrap(tagged.TaggedClient, "call", wrap_call)
        recorder.wrap(tagged.TaggedClient, "count", wrap_client_count)
        recorder.wrap(tagged.TaggedClient, "_send", wrap_send)
        recorder.wrap(tagged, "read_lines", wrap_read_lines)
        recorder.wrap(tagged.TaggedUpstream, "count", wrap_upstream_count)
        recorder.wrap(tagged, "key_of", wrap_key_of)
        _, printed = run_quietly(lambda: [scenario("out-of-order", part3_demo.out_of_order)(),
                                          scenario("slow-key", part3_demo.slow_key)(),
                                          scenario("late-reply", part3_demo.late_reply)()])
    return recorder, printed


def callers_by_id(events):
    """{id: (caller, request line)} from the bytes each request went out as."""
    found = {}
    for _, caller, data in (e for e in events if e[0] == "sent"):
        request_id, line = tagged.parse_tagged(data.rstrip(b"\n"))
        found[request_id] = (caller, line)
    return found


def draw_tagged_sequence(svg, top, events, upstream_label="TaggedUpstream", sends_first=False):
    """Callers' lifelines on the left, the upstream's on the right, one row per request
    sent, call given up, and reply taken by the client's reader, down the page in the
    order they were logged. A reply whose id belongs to a call that gave up is drawn in
    red, stopping at the client. Returns (bottom, the reply ids in wire order, {id: (caller, line)}).

    sends_first: every request first, then every reply, each in its own thread's order;
    for a scenario whose hooks leave the scheduler to choose whether a quick reply comes
    before or after the next request is sent (the log's order would change run to run)."""
    if sends_first:
        events = ([e for e in events if e[0] in ("sent", "timeout")]
                  + [e for e in events if e[0] == "got"])
    owners = callers_by_id(events)
    gave_up = {e[1] for e in events if e[0] == "timeout"}
    names = sorted({caller for caller, _ in owners.values()})
    lane = {name: 40 + index * 90 for index, name in enumerate(names)}
    client_x = lane[names[-1]] + 50      # where the client's reader stands
    upstream_x = lane[names[-1]] + 660
    label_x = client_x + 20
    for name in names:
        svg.text(lane[name], top, f"caller {name}", 13, colours(name)[1], anchor="middle", bold=True)
    svg.text(upstream_x, top, upstream_label, 13, INK, anchor="middle", bold=True)
    svg.text((client_x + upstream_x) / 2, top, "one TaggedClient connection", 12, MUTED, anchor="middle")
    y = top + 30
    rows_top = y - 12
    wire_order = []
    for event in events:
        if event[0] == "sent":
            caller, data = event[1:]
            y += 38
            svg.arrow(lane[caller] + 6, y, upstream_x - 6, y, colours(caller)[1], 1.5)
            svg.bytes_box(label_x, y - 30, data, caller, 13)
        elif event[0] == "timeout":
            caller = event[1]
            y += 30
            label = f"{caller} gives up: CallTimeout; its id is abandoned, not reused"
            svg.rect(lane[caller] + 6, y - 15, text_width(label, 13) + 8, 20, "#ffffff")   # over the lifelines
            svg.text(lane[caller] + 10, y, label, 13, RED, bold=True)
        elif event[0] == "got":
            line = event[1]
            reply_id, _ = tagged.parse_tagged(line)
            caller = owners[reply_id][0]
            wire_order.append(reply_id)
            y += 38
            if caller in gave_up:
                svg.arrow(upstream_x - 6, y, client_x + 6, y, RED, 2.5)
                svg.bytes_box(label_x, y - 30, line + b"\n", caller, 13, wrong=True)
                svg.text(client_x + 6, y + 20, f"id {reply_id}: no call is owed it any more: dropped", 12, RED,
                         bold=True)
                y += 24
            else:
                svg.arrow(upstream_x - 6, y, lane[caller] + 6, y, colours(caller)[1], 2)
                svg.bytes_box(label_x, y - 30, line + b"\n", caller, 13)
                svg.text(upstream_x - 12, y - 12, f"id {reply_id} -> {caller}", 12, colours(caller)[1],
                         anchor="end", bold=True)
    bottom = y + 20
    with svg.behind(0):
        for name in names:
            svg.line(lane[name], rows_top, lane[name], bottom, FAINT_LANE, 2, dash="4 4")
        svg.line(client_x, rows_top, client_x, bottom, FAINT_LANE, 1, dash="2 6")
        svg.line(upstream_x, rows_top, upstream_x, bottom, FAINT_LANE, 2, dash="4 4")
    return bottom, wire_order, owners


def draw_results(svg, y, events, owners):
    """One line per call: what it asked, what it returned, whether that is its own reply."""
    results = {e[1]: e[2] for e in events if e[0] == "returned"}
    rows = []
    for request_id in sorted(owners):
        caller, line = owners[request_id]
        outcome = results.get(caller)
        shown = outcome if isinstance(outcome, str) else visible(outcome or b"")
        rows.append((caller, visible(line), shown, outcome == tcp_proxy.answer(line), isinstance(outcome, str)))
    line_width = max(len(row[1]) for row in rows)
    outcome_width = max(len(row[2]) for row in rows)
    for caller, line, outcome, right, raised in rows:
        label = f"{caller} called {line:<{line_width}}  {'raised' if raised else 'returned'} {outcome:<{outcome_width}}"
        svg.text(16, y, label, 13, INK)
        verdict = "gave up" if raised else ("its own reply" if right else "WRONG")
        svg.text(16 + text_width(label, 13) + 12, y, verdict, 13, MUTED if raised else GREEN if right else RED,
                 bold=True)
        y += 22
    return y


def draw_tagged_out_of_order(recorder):
    title = "Part three, scenario 5: request ids, three calls over one connection"
    svg = Svg(title)
    y = heading(svg, [title, "each request goes out as <id> <line>; the upstream answers in its own order, "
                             "and the client's reader gives each reply to the call that owns its id"])
    events = scenario_events(recorder, "out-of-order")
    bottom, wire_order, owners = draw_tagged_sequence(svg, y + 16, events)
    svg.text(16, bottom + 28, f"ids went out {', '.join(map(str, sorted(owners)))}; replies came back "
             f"{', '.join(map(str, wire_order))}: not the order asked", 13, RED, bold=True)
    draw_results(svg, bottom + 56, events, owners)
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
    y = draw_results(svg, bottom + 56, events, owners) + 30
    untagged = [e[1:] for e in events if e[0].startswith("upstream") and e[1] is False]
    kinds = [e[0] for e in events if e[0].startswith("upstream") and e[1] is False]
    reads = [line for kind, (_, line) in zip(kinds, untagged) if kind == "upstream read"]
    readies = [key for kind, (_, key) in zip(kinds, untagged) if kind == "upstream ready"]
    writes = [line for kind, (_, line) in zip(kinds, untagged) if kind == "upstream wrote"]
    held = next(key for key in readies if key == "slow")
    ready_first = sorted(readies[:readies.index(held)])
    svg.text(16, y, "without ids: the untagged twin, the four requests pipelined in order on one socket", 14,
             INK, bold=True)
    y += 34
    svg.text(16, y, "read", 13, MUTED)
    x = 16 + text_width("written ", 13)
    for line in reads:
        x += svg.bytes_box(x, y - 17, line.encode() + b"\n", UPSTREAM, 13) + 4
    y += 40
    svg.text(16, y, f"while GET {held} is held: replies ready {len(ready_first)} "
             f"({', '.join(ready_first)}), written 0: each waits its turn behind GET {held}", 13, RED, bold=True)
    y += 36
    svg.text(16, y, "written", 13, MUTED)
    x = 16 + text_width("written ", 13)
    for index, line in enumerate(writes):
        late = index > 0
        x += svg.bytes_box(x, y - 17, line.encode() + b"\n", UPSTREAM, 13, wrong=late) + 4
    y += 30
    svg.text(16, y, f"in order, only after GET {held}: the fast replies (red outline) waited for it", 13, RED)
    return svg


def draw_late_reply(recorder):
    title = "Part three, scenario 7: a timed-out call's late reply, dropped by id"
    svg = Svg(title)
    y = heading(svg, [title, "the upstream holds the reply to GET slow until the call has given up and the "
                             "next request is on the wire; then it writes both"])
    events = scenario_events(recorder, "late-reply")
    bottom, wire_order, owners = draw_tagged_sequence(svg, y + 16, events)
    dropped = sum(e[0] == "dropped" for e in events)
    connections = sum(e[0] == "connected" for e in events)
    later = [request_id for request_id in wire_order if owners[request_id][0] not in
             {e[1] for e in events if e[0] == "timeout"}]
    svg.text(16, bottom + 28, f"late replies dropped by id: {dropped}; the connection served on: ids "
             f"{', '.join(map(str, later))} went to their callers; connections opened: {connections}", 13,
             GREEN, bold=True)
    draw_results(svg, bottom + 56, events, owners)
    return svg


# --- the pictures, and the command line ------------------------------------------------

PICTURES = {   # file name -> (run the scenarios: (Recorder, what they printed), draw from the Recorder)
    "part3-redis-line-pool.svg": (record_redis_pools, draw_redis_line_pool),
    "part3-tagged-out-of-order.svg": (record_tagged, draw_tagged_out_of_order),
    "part3-head-of-line.svg": (record_tagged, draw_head_of_line),
    "part3-late-reply.svg": (record_tagged, draw_late_reply),
}


def render_all():
    """Run each picture's scenarios (once, however many pictures share them) and draw
    it; return {file name: SVG text}."""
    runs = {}
    for record, _ in PICTURES.values():
        if record not in runs:
            runs[record] = record()[0]
    return {name: draw(runs[record]).render() for name, (record, draw) in PICTURES.items()}


def main(argv=None):
    if not redis_server.redis_available():
        print(redis_server.INSTALL_HINT)
        return 1
    return pictures.main(argv, render=render_all)
