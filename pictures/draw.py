"""pictures.draw: Parts one and two's pictures; a reader of the lesson need not read it. Each is
a short function of the events its scenario's own run made (pictures.record), drawn with a shared
layout (pictures.svg). `python3 -m pictures [--check]` draws them all, test_pictures.py afresh: a
change to what a scenario does changes its picture. No picture shows a port or an id; Part two's
times are the virtual clock's.

    interleave.svg        scenario 1, a byte strip
    headline.svg          scenario 2, a sequence()
    release.svg           scenario 6's paused-reply trials, framed above timeout, as borrows()
    dishonest.svg         scenario 9, TrustingPool above FramedProxy, as borrows()
    dirty-return.svg      Part two's scenario 1, a sequence() per late-reply rule
    failover-windows.svg  Part two's scenario 4, a timeline
"""
from pathlib import Path

import demo
from part2 import managed_demo
from pictures.record import (Attempt, Borrow, Disabled, Forwarded, Received, Replied, Routed, Sent,
                             Service, SetCall, Step, record_managed, record_part_one)
from pictures.svg import (GREEN, INK, MUTED, RED, RED_FILL, borrows, colours, sequence, split,
                          titled, visible)
from scaffolding.kit import CLIENT_NAMES
from tcp_proxy import answer

PICTURES_DIR = Path(__file__).parent
CELL = 30      # a byte's width in interleave.svg's strip
SECOND = 140   # pixels per second of virtual time in failover-windows.svg


def answer_to(request):
    """The reply the upstream owes a request line (b"\\n" and all)."""
    return answer(request.rstrip(b"\n"))


# --- Part one's blind relay: interleave.svg and headline.svg --------------------------------

def lines_sent(recorder, client):
    """The request lines a client meant: everything it sent, end to end, cut at each b"\\n"."""
    return b"".join(e.data for e in recorder.of(Sent) if e.client == client).split(b"\n")[:-1]


def request_owners(recorder):
    """Each request line the upstream parsed (what NaiveProxy forwarded, cut at each b"\\n") and
    whose bytes made it."""
    chunks = [(e.client, e.data) for e in recorder.of(Forwarded)]
    lines = b"".join(data for _, data in chunks).split(b"\n")[:-1]
    return [(line.decode(), list(dict.fromkeys(owner for owner, _ in pieces)))
            for line, pieces in zip(lines, split(chunks, [len(line) + 1 for line in lines]))]


def deliveries(recorder):
    """Each upstream reply, in order, with the (client, bytes) route() wrote of it: a chunk route()
    read may hold part of a reply or two (recv() cuts as it likes), so they are cut where the
    replies end."""
    # targets in name order, not route()'s racy one
    chunks = [(e.targets, e.data) for e in recorder.of(Routed)]
    replies = [e.data for e in recorder.of(Replied)]
    return [(reply, [(client, piece) for targets, piece in pieces for client in targets])
            for reply, pieces in zip(replies, split(chunks, map(len, replies)))]


def draw_interleave(recorder):
    forwarded = [(e.client, value) for e in recorder.of(Forwarded) for value in e.data]
    svg, y = titled("Scenario 1: two clients' bytes interleave on one upstream socket",
                    f"the {len(forwarded)} bytes NaiveProxy forwarded, in the order they reached "
                    "the upstream, each in its sender's colour")
    left = 24
    for position, (owner, value) in enumerate(forwarded):   # a cell per byte, each b"\n" dark
        fill, stroke = colours(owner)
        newline = value == ord("\n")
        label = "\u2423" if value == ord(" ") else visible(bytes([value]))
        svg.rect(left + position * CELL, y, CELL, 36, INK if newline else fill, stroke, 1)
        svg.text(left + (position + 0.5) * CELL, y + 24, label, 13 if newline else 14,
                 "#ffffff" if newline else INK, "middle", bold=newline)
    start = 0
    for index, (line, senders) in enumerate(request_owners(recorder)):   # a line under each request
        x1, x2 = left + start * CELL + 2, left + (start + len(line) + 1) * CELL - 2
        sent = len(senders) == 1 and line.encode() in lines_sent(recorder, senders[0])
        tone = INK if sent else RED
        svg.line(x1, y + 60, x2, y + 60, tone, 2.5)
        svg.text(x1 + 2, y + 80, f"request {index + 1}: '{line}'", 13, tone, bold=True)
        start += len(line) + 1
    svg.legend(left, y + 114, [("\\n", INK, INK), ("red: a request nobody sent", "#ffffff", RED)],
               owners="AB")
    return svg


def draw_headline(recorder):
    svg, y = titled("Scenario 2: whole requests, one after the other: B gets A's answer",
                    "NaiveProxy shares one upstream socket and routes every reply to `last`, "
                    "the client that wrote most recently")
    rows = []   # svg.sequence's, top to bottom: what went up, in the order it did, then the replies
    for e in recorder.events:
        if isinstance(e, Sent):
            rows.append(("arrow", e.client, "NaiveProxy", e.data, e.client, False, ""))
        # forward() names the chunk's sender `last` as it writes it up
        elif isinstance(e, Forwarded):
            rows.append(("arrow", "NaiveProxy", "Upstream", e.data, e.client, False, ""))
            rows.append(("note", "NaiveProxy", f"last = {e.client}", e.client, False, ""))
    for gate in sorted({e.gate for e in recorder.of(Replied)} - {0}):
        rows.append(("note", "Upstream", f"gate: replies held until {gate} requests are in", None,
                     False, ""))
    routing = "/".join(sorted({e.routing for e in recorder.of(Routed)}))
    how = "routed to last = {}" if routing == "last" else "routed to {} (routing: " + routing + ")"
    for (reply, pieces), (_, requesters) in zip(deliveries(recorder), request_owners(recorder)):
        asked = " + ".join(requesters)
        rows.append(("arrow", "Upstream", "NaiveProxy", reply, asked, False,
                     f"the answer to {asked}'s request"))
        for client, piece in pieces:
            wrong = client not in requesters or len(requesters) > 1
            rows.append(("arrow", "NaiveProxy", client, piece, asked, wrong,
                         how.format(client) + (f": {asked} asked for it" if wrong else "")))
    for e in recorder.of(Received):
        wrong = e.data != b"".join(answer(line) for line in lines_sent(recorder, e.client))
        rows.append(("note", e.client, f"{e.client} received {len(e.data)} bytes", e.client, wrong,
                     ""))
    lanes = {"A": 90, "B": 300, "NaiveProxy": 570, "Upstream": 830}
    bottom = sequence(svg, y + 30, lanes, rows, lanes["Upstream"] + 70)
    svg.legend(16, bottom + 30,
               [("red: written to a client that did not ask for it", RED_FILL, RED)], owners="AB")
    return svg


# --- Part one's pools, borrow by borrow: release.svg and dishonest.svg ------------------------

NOBODY = "nobody"   # the owner of bytes no request asked for


def trials(recorder):
    """{trial label: (its borrows in the order they were lent, the upstream's replies)}."""
    return {label: (sorted([b for b in recorder.of(Borrow) if b.trial == label], key=lambda b: b.k),
                    [e for e in recorder.of(Replied) if e.trial == label])
            for label in dict.fromkeys(b.trial for b in recorder.of(Borrow))}


def tally(lent):
    """(right, another client's answer, dirty closes, connections, borrows) over a whole trial."""
    right = sum(b.reply == answer_to(b.request) for b in lent)
    others = sum(any(b.reply == answer_to(o.request) for o in lent if o.client != b.client)
                 for b in lent)
    dirty = sum(b.outcome == "dirty" for b in lent)
    return right, others, dirty, len({b.connection for b in lent}), len(lent)


def pool_panel(svg, y, rule, note, lent, replies, shown):
    """A trial's first `shown` borrows through svg.borrows; returns the bottom. Each connection's
    stream as written is cut where each borrower's read ended, as each reads on where the last
    stopped: its n-th reply answers its n-th borrow, the bytes past that answer are nobody's, a
    reply split in two is two pieces, and a piece is wrong if it answers another request or none."""
    got = {}   # a borrow -> the (owner, bytes, wrong) pieces it read
    for connection in dict.fromkeys(b.connection for b in lent):
        on_it = [b for b in lent if b.connection == connection]
        # (the borrow whose answer they are, or None, bytes), as the upstream wrote them
        chunks = []
        for b, reply in zip(on_it, [e for e in replies if e.connection == connection]):
            end = len(answer_to(b.request))
            parts = [reply.data[:reply.split_at], reply.data[reply.split_at:end], reply.data[end:]]
            chunks += [(owner, data) for owner, data in zip([b, b, None], parts) if data]
        for b, pieces in zip(on_it, split(chunks, [len(b.reply) for b in on_it])):
            got[b] = [(owner.client if owner else NOBODY, piece, owner is not b)
                      for owner, piece in pieces]
    rows = []
    for b in lent[:shown]:
        verdict, tone = ("right", GREEN) if b.reply == answer_to(b.request) else ("wrong", RED)
        rows.append((b.client, [(b.request, got[b])], verdict, tone))
    return borrows(svg, y, rule, note, rows)


def draw_release(recorder):
    svg, y = titled("Scenario 6: a reply written in two parts with a pause between, pool cap 1")
    shown = 3   # borrows drawn per trial; the note says how many it made
    for release in ("framed", "timeout"):
        lent, replies = trials(recorder)[release, True]
        rule = (f'release="timeout": it goes back after {lent[0].silence}s of silence'
                if lent[0].silence
                else 'release="framed": the connection goes back after the reply\'s \\n')
        right, *_, total = tally(lent)
        note = (f"right {right}/{total}, the first {shown} drawn; "
                "the upstream pauses after each reply's first part")
        y = pool_panel(svg, y + 10, rule, note, lent, replies, shown) + 30
    svg.legend(16, y, [("red outline: bytes of another client's answer", "#ffffff", RED)],
               owners="ABC")
    return svg


def draw_dishonest(recorder):
    svg, y = titled("Scenario 9: an upstream that says one line nobody asked for",
                    "the upstream follows every reply with a line in the same write; "
                    "A and B take turns, pool cap 1")
    rules = {"TrustingPool": "TrustingPool: keeps the bytes past a reply for the next borrower",
             "FramedProxy": "FramedProxy: closes a connection with bytes past a reply"}
    for label, (lent, replies) in trials(recorder).items():
        right, others, dirty, connections, total = tally(lent)
        note = (f"right {right}/{total}   another client's answer {others}   "
                f"dirty connections closed {dirty}   "
                f"upstream connections opened {connections}")
        y = pool_panel(svg, y + 10, rules.get(label, label), note, lent, replies, total) + 24
    svg.legend(16, y, [("red outline: not this request's answer", "#ffffff", RED),
                       ("red fill: the line nobody asked for", *colours(NOBODY))], owners="AB")
    return svg


# --- Part two: dirty-return.svg and failover-windows.svg --------------------------------------

def short(request):
    """A call as the pictures name it: b"GET apple\\n" -> apple."""
    return request.decode().split()[-1]


def dirty_rows(steps):
    """One client's steps as svg.sequence rows: each request and reply on the lane of the
    connection that carried it, remarked with what that connection owes after it."""
    rows, numbers = [], {}
    for e in steps:
        lane = f"connection {numbers.setdefault(e.connection, len(numbers) + 1)}"
        owed = ", ".join(short(request) + (" (abandoned)" if abandoned else "")
                         for request, abandoned in e.owed)
        owed = f"{lane} closed" if e.ended else f"owes: {owed or 'nothing'}"
        if e.kind == "sent":
            rows.append(("arrow", "ManagedClient", lane, e.data, None, False, f"t={e.t}s  {owed}"))
        elif e.kind == "timed out":
            label = f"t={e.t}s {short(e.data)} times out"
            rows.append(("note", "ManagedClient", label, None, False, owed))
        elif e.oldest is None:
            rows.append(("arrow", lane, "ManagedClient", e.data, None, False,
                         f"no call was owed it; {owed}"))
        else:
            wrong = not e.oldest.abandoned and e.data != answer_to(e.oldest.request)
            what = f"discarded: {short(e.oldest.request)} gave up" if e.oldest.abandoned else (
                f"to {short(e.oldest.request)}" + (": WRONG" if wrong else ""))
            rows.append(("arrow", lane, "ManagedClient", e.data, None, wrong, f"{what}; {owed}"))
    return rows


def rule_of(client):
    """What a client does with a timed-out call, in words, then its settings."""
    if client.late_replies == "forget":
        return 'forget the call: the bug (late_replies="forget")'
    if client.msg_timeout_is_fatal:
        return "close its connection (msg_timeout_is_fatal=True)"
    return "keep its reply owed, discard it on arrival (the default)"


def draw_dirty_return(recorder):
    svg, y = titled("Part two, scenario 1: the dirty return",
                    "GET apple times out at t=1.0s; GET banana follows; apple's reply then comes")
    for client in dict.fromkeys(e.client for e in recorder.of(Step)):   # as each first spoke
        steps = [e for e in recorder.of(Step) if e.client == client]   # what its on_event told of
        rows = dirty_rows(steps)
        lanes = {"ManagedClient": 130}
        for row in rows:   # a lifeline per connection, in the order they were made
            for lane in row[1:3] if row[0] == "arrow" else ():
                lanes.setdefault(lane, 390 + 200 * (len(lanes) - 1))
        svg.text(16, y + 16, rule_of(client), 14, INK, bold=True)
        y = sequence(svg, y + 62, lanes, rows, 680) + 10   # one column of remarks for every rule
    return svg


def draw_failover(recorder):
    events = recorder.events
    managed_set = recorder.of(Attempt)[0].set   # its settings: no call changes them
    name = {addr: CLIENT_NAMES[index] for index, (addr, _) in enumerate(managed_set.services)}
    svg, y = titled("Part two, scenario 4: failover with a reliability cache, on the virtual clock",
                    f"policy {managed_set.policy}; "
                    f"the cache's threshold {managed_set.rcache.setting('threshold')}")
    windows = [e for e in events if isinstance(e, Disabled)]
    end = max([e.end for e in windows] + [e.t for e in events if isinstance(e, SetCall)])
    left, top = 170, y + 20   # where the axis's 0s is

    def x_of(seconds):
        return left + seconds * SECOND

    svg.line(left, top, x_of(end), top, INK, 1.5)   # the time axis
    for second in range(int(end) + 1):
        svg.line(x_of(second), top - 4, x_of(second), top + 4, INK, 1.5)
        svg.text(x_of(second), top - 10, f"{second}s", 12, INK, "middle")
    # A's life: stopped, then running again (then both close as the scenario ends)
    stop, restart = [e for e in events if isinstance(e, Service)][:2]
    svg.text(16, top + 40, f"{name[stop.addr]}, the upstream", 12, INK, bold=True)
    svg.rect(x_of(stop.t), top + 26, (restart.t - stop.t) * SECOND, 18, *colours(None))
    svg.text(x_of(stop.t) + 6, top + 40, "stopped: refuses connections", 11, MUTED)
    calls_before = [e.t for e in events[:events.index(restart)] if isinstance(e, SetCall)]
    after = ", after that call" if calls_before and calls_before[-1] == restart.t else ""
    svg.text(x_of(restart.t) + 6, top + 40, f"restarted at t={restart.t}s{after}", 11, GREEN,
             bold=True)
    top += 36
    svg.text(16, top + 44, ", ".join(dict.fromkeys(name[e.service] for e in windows)) + " disabled",
             12, RED, bold=True)
    for window in windows:   # each window the cache opened, as long as it lasted
        seconds = window.end - window.start
        svg.rect(x_of(window.start) + 1, top + 28, seconds * SECOND - 2, 22, RED_FILL, RED, 1.5,
                 radius=3)
        svg.text(x_of(window.start) + 6, top + 43, f"{window.start}-{window.end}s: {seconds}s", 11,
                 RED, bold=True)
    y = top + 40
    # a row per call, from the time it was made: its attempts (pick() skips a disabled A)
    for e in events:
        if isinstance(e, SetCall):
            x, y = x_of(e.t), y + 30
            svg.text(x - 8, y + 16, f"t={e.t}s", 11, MUTED, "end")
        elif isinstance(e, Attempt):
            # pick() found none
            service = CLIENT_NAMES[e.index] if e.index is not None else "no service"
            x += svg.bytes_box(x, y, f"{service} {e.result.split(':')[0]}".encode(), service, 11,
                               wrong=e.result != "ok") + 4
    return svg


# --- the pictures, and the command line --------------------------------------------------------

# file name -> (run the scenario: (Recorder, what it printed), draw from the Recorder)
PICTURES = {
    "interleave.svg": (lambda: record_part_one(demo.interleave), draw_interleave),
    "headline.svg": (lambda: record_part_one(demo.headline), draw_headline),
    "release.svg": (lambda: record_part_one(demo.release_rules, "release_received",
                                            lambda *args: args),
                    draw_release),
    "dirty-return.svg": (lambda: record_managed(managed_demo.dirty_return), draw_dirty_return),
    "failover-windows.svg": (lambda: record_managed(managed_demo.failover), draw_failover),
    "dishonest.svg": (lambda: record_part_one(demo.dishonest, "dishonest_trial",
                                              lambda pool: pool.__name__),
                      draw_dishonest),
}


def record_all(pictures=PICTURES):
    """Run each picture's scenarios once, however many pictures share them: {file name: (Recorder,
    printed)}."""
    runs = {record: record() for record in dict.fromkeys(record for record, _ in pictures.values())}
    return {name: runs[record] for name, (record, _) in pictures.items()}


def render_all(runs=None, pictures=PICTURES):
    """Draw every picture from `runs` (record_all() if not given): {file name: SVG text}."""
    runs = runs or record_all(pictures)
    return {name: draw(runs[name][0]).render() for name, (_, draw) in pictures.items()}


def save(svgs, check, remedy="make pictures"):
    """Write each {file name: SVG text} to pictures/, or with `check` say which differ; returns how
    many do."""
    stale = [name for name in svgs
             if check and (not (PICTURES_DIR / name).exists() or
                           (PICTURES_DIR / name).read_text(encoding="utf-8") != svgs[name])]
    for name, svg in svgs.items():
        if not check:
            (PICTURES_DIR / name).write_text(svg, encoding="utf-8")
            print(f"wrote pictures/{name}")
    for name in stale:
        print(f"pictures/{name} differs from what the scenario draws now: "
              f"run `{remedy}` and look at it")
    return len(stale)
