"""pictures.draw: the commentary's pictures of Parts one and two, drawn from the scenarios' own runs.

    python3 -m pictures            run the scenarios, rewrite pictures/*.svg (Part three's too)
    python3 -m pictures --check    run them, and exit 1 if a checked-in picture differs

Nothing is drawn by hand: each picture draws the events pictures.record heard while
its scenario ran, unchanged, so a change to what a scenario does changes its
picture, and test_pictures.py (which draws them afresh) fails. No picture shows a
time, a port or an id; Part two's times are the virtual clock's. Two layouts are
shared (pictures.svg): sequence() draws lanes and arrows, borrows() a pool's
borrows as steps.

    interleave.svg        scenario 1 as a byte strip
    headline.svg          scenario 2 as a sequence diagram
    release.svg           scenario 6, framed above timeout, borrow by borrow (borrows)
    dishonest.svg         scenario 9, TrustingPool above FramedProxy, borrow by borrow (borrows)
    dirty-return.svg      Part two's 1: the owed queue under three rules, step by step
    failover-windows.svg  Part two's 4 on the virtual clock's axis (a timeline)
"""
import textwrap
from pathlib import Path

import demo
from part2 import managed_demo
from pictures.record import (Attempt, Borrowed, Checkin, Disabled, Enabled, Forwarded, Last, Made, Move,
                             Parsed, Partial, Read, Received, Replied, Routed, Sent, Service, SetCall,
                             SetMade, SetShutDown, Step, Trial, TrialEnd, Wrote, record_managed,
                             record_naive_relay, record_pool)
from pictures.svg import (GREEN, INK, MUTED, FAINT, RED, RED_FILL, Svg, coalesce, colours, cut,
                          borrows, heading, sequence, owners_of, text_width, visible)
from tcp_proxy import answer

HERE = Path(__file__).parent.parent   # the project's root
PICTURES_DIR = HERE / "pictures"


def forwarded(recorder):
    return coalesce([(e.client, e.data) for e in recorder.of(Forwarded)])


def request_owners(recorder):
    """Each parsed request line with the clients whose bytes made it (forwarded order)."""
    chunks = forwarded(recorder)
    requests, position = [], 0
    for line in (e.line for e in recorder.of(Parsed)):
        end = position + len(line) + 1   # the line and its b"\n"
        requests.append((line, owners_of(chunks, position, end)))
        position = end
    return requests


def deliveries(recorder):
    """Each upstream reply, in order, with the (client, bytes) route() wrote of it.

    route() writes each chunk it reads to its targets; a chunk may hold part of a
    reply or two replies (recv() cuts as it likes), so the chunks are laid end to
    end and cut where the upstream's replies end.
    """
    chunks = [(e.targets, e.data) for e in recorder.of(Routed)]   # targets in name order, not route()'s racy one
    result, start = [], 0
    for data in (e.data for e in recorder.of(Replied)):
        result.append((data, [(client, piece) for targets, piece in cut(chunks, start, start + len(data))
                              for client in targets]))
        start += len(data)
    return result


def lines_sent(recorder, client):
    """The request lines a client meant: everything it sent, end to end, cut at each b"\\n"."""
    stream = b"".join(e.data for e in recorder.of(Sent) if e.client == client)
    return stream.split(b"\n")[:-1]


# --- 1. interleave.svg --------------------------------------------------------------

CELL = 30   # a byte's width in the strip


def draw_interleave(recorder):
    chunks = forwarded(recorder)
    requests = request_owners(recorder)
    stream = b"".join(data for _, data in chunks)
    svg = Svg("Scenario 1: two clients' bytes interleave on one upstream socket")
    y = heading(svg, ["Scenario 1: two clients' bytes interleave on one upstream socket",
                      f"the {len(stream)} bytes NaiveProxy forwarded, in the order they reached the upstream"])
    left = 24
    # who sent each run of bytes, above the strip
    position, y_sender = 0, y + 16
    for owner, data in chunks:
        x1, x2 = left + position * CELL, left + (position + len(data)) * CELL
        fill, stroke = colours(owner)
        svg.text((x1 + x2) / 2, y_sender, f"{owner}: {len(data)} bytes", 13, stroke, "middle", bold=True)
        svg.line(x1 + 2, y_sender + 8, x2 - 2, y_sender + 8, stroke, 2)
        position += len(data)
    # the strip: one cell per byte, coloured by its sender; each b"\n" in a dark cell
    y_strip = y_sender + 18
    position = 0
    for owner, data in chunks:
        fill, stroke = colours(owner)
        for value in data:
            x = left + position * CELL
            newline = value == ord("\n")
            svg.rect(x, y_strip, CELL, 36, INK if newline else fill, stroke, 1)
            label = visible(bytes([value])) if value != ord(" ") else "\u2423"
            svg.text(x + CELL / 2, y_strip + 24, label, 14 if not newline else 13,
                     "#ffffff" if newline else INK, "middle", bold=newline)
            position += 1
    svg.text(left, y_strip + 54, "\u2423 is a space;  \\n ends a line: the upstream parses a request "
             "at each one", 12, MUTED)
    meant = "; ".join(f"{client} meant " + ", ".join(f"'{line.decode()}'" for line in lines_sent(recorder, client))
                      for client in dict.fromkeys(owner for owner, _ in chunks))
    svg.text(left, y_strip + 72, meant, 12, INK)
    # what the upstream parsed: a bracket under each request, up to and including its b"\n"
    y_parsed = y_strip + 102
    position = 0
    for index, (line, senders) in enumerate(requests):
        x1 = left + position * CELL
        x2 = x1 + (len(line) + 1) * CELL
        whole_request = len(senders) == 1 and line.encode() in lines_sent(recorder, senders[0])
        tone = INK if whole_request else RED
        svg.line(x1 + 2, y_parsed, x2 - 2, y_parsed, tone, 2.5)
        svg.line(x1 + 2, y_parsed - 8, x1 + 2, y_parsed, tone, 2.5)
        svg.line(x2 - 2, y_parsed - 8, x2 - 2, y_parsed, tone, 2.5)
        svg.text(x1 + 4, y_parsed + 20, f"request {index + 1}: '{line}'", 13, tone, bold=True)
        made_of = " + ".join(senders)
        svg.text(x1 + 4, y_parsed + 38, f"bytes of {made_of}" + ("" if whole_request else
                 ": a request nobody sent"), 12, tone)
        position += len(line) + 1
    # where each reply went: route()'s own writes
    y_reply = y_parsed + 76
    svg.text(left, y_reply, "the upstream answers each request; NaiveProxy hands each answer on:", 13, INK)
    for index, (reply, pieces) in enumerate(deliveries(recorder)):
        takers = [client for client, _ in pieces]
        y_row = y_reply + 26 + index * 30
        svg.text(left + 12, y_row, f"to request {index + 1}", 12, MUTED)
        x = left + 140
        svg.arrow(x, y_row - 4, x + 40, y_row - 4, RED, 1.5)
        width = svg.bytes_box(x + 48, y_row - 17, reply, "Upstream", 12, wrong=True)
        svg.text(x + 58 + width, y_row, f"written to {' and '.join(takers) or 'nobody'}", 12, RED, bold=True)
    y_legend = y_reply + 26 + len(recorder.of(Replied)) * 30 + 16
    svg.legend(left, y_legend, [("A's bytes", *colours("A")), ("B's bytes", *colours("B")),
                                ("\\n", INK, INK), ("red: not what anyone asked for", RED_FILL, RED)])
    return svg


# --- 2. headline.svg ----------------------------------------------------------------

def draw_headline(recorder):
    title = "Scenario 2: whole requests, one after the other: B gets A's answer"
    svg = Svg(title)
    y = heading(svg, [title, "NaiveProxy shares one upstream socket and routes every reply to `last`, "
                             "the client that wrote most recently"])
    lanes = {"A": 90, "B": 300, "NaiveProxy": 570, "Upstream": 830}
    rows = []   # (kind, ...) per row, drawn below
    for event in recorder.events:
        if isinstance(event, Sent):
            rows.append(("arrow", event.client, "NaiveProxy", event.data, event.client, False, ""))
        elif isinstance(event, Forwarded):
            rows.append(("arrow", "NaiveProxy", "Upstream", event.data, event.client, False, ""))
        elif isinstance(event, Last):
            rows.append(("note", "NaiveProxy", f"last = {event.client}", event.client, False, ""))
    gates = {e.gate for e in recorder.of(Replied)}
    for gate in sorted(gates - {0}):
        rows.append(("note", "Upstream", f"gate: replies held until {gate} requests are in", None, False, ""))
    routing = {e.routing for e in recorder.of(Routed)}
    how = "routed to last = {}" if routing == {"last"} else "routed to {} (routing: " + "/".join(sorted(routing)) + ")"
    for (reply, pieces), requesters in zip(deliveries(recorder), (senders for _, senders in request_owners(recorder))):
        asked = " + ".join(requesters)
        rows.append(("arrow", "Upstream", "NaiveProxy", reply, asked, False, f"the answer to {asked}'s request"))
        for client, piece in pieces:
            wrong = client not in requesters or len(requesters) > 1
            rows.append(("arrow", "NaiveProxy", client, piece, asked, wrong,
                         how.format(client) + (f": {asked} asked for it" if wrong else "")))
    for name, data in ((e.client, e.data) for e in recorder.of(Received)):
        expected = b"".join(answer(line) for line in lines_sent(recorder, name))
        rows.append(("note", name, f"{name} received {len(data)} bytes", name, data != expected, ""))
    bottom = sequence(svg, y + 30, lanes, rows, lanes["Upstream"] + 70)
    svg.legend(16, bottom + 30, [("A's bytes", *colours("A")), ("B's bytes", *colours("B")),
                                  ("red: written to a client that did not ask for it", RED_FILL, RED)])
    return svg


# --- 3 and 6. release.svg and dishonest.svg: a pool's connection, borrow by borrow -------

SHOWN_EXCHANGES = 3   # borrows drawn per release trial; the trial's total is printed under them
NOBODY = "nobody"     # the owner of bytes no request asked for


def record_release():
    """Scenario 6, the demo's own four trials; release.svg draws the two with a paused reply."""
    return record_pool(demo.release_rules, "release_received", lambda release, split: (release, split),
                       score=demo.right_of)


POOL_EVENTS = (Borrowed, Wrote, Partial, Read, Checkin)


def trials(recorder):
    """{trial label: (its events sorted by exchange, stably, result)}."""
    found, current = {}, None
    for event in recorder.events:
        if isinstance(event, Trial):
            current = []
        elif isinstance(event, TrialEnd):
            found[event.label] = (sorted(current, key=lambda e: e.k), event.result)
        elif current is not None and isinstance(event, POOL_EVENTS):
            current.append(event)
    return found


def owned_writes(events):
    """Each write as (exchange, connection, [(owner, bytes)]): the reply it was asked for
    belongs to the borrower whose request it answers, anything else in it to nobody."""
    borrower = {e.k: e.client for e in events if isinstance(e, Borrowed)}
    return [(e.k, e.connection, [(owner, data) for owner, data in ((borrower.get(e.k, "?"), e.honest),
                                                                   (NOBODY, e.data[len(e.honest):])) if data])
            for e in events if isinstance(e, Wrote)]


def pieces_of(writes, connection, start, end):
    """The (owner, bytes, exchange) pieces of connection's stream bytes start..end."""
    chunks = [((owner, exchange), data) for exchange, on, parts in writes if on == connection for owner, data in parts]
    return [(owner, piece, exchange) for (owner, exchange), piece in cut(chunks, start, end)]


CHECKIN_LABELS = {"released": "then checkin", "dirty": "then closed as dirty", "discarded": "then closed"}


def pool_steps(events, shown):
    """A trial's first `shown` borrows for svg.borrows: (its connection's stream if it
    used only one, else None; a row per borrow; the exchanges whose answer a borrower
    read). A piece a borrower gets is wrong if it answers another request, or none."""
    requests = {e.k: e.request for e in events if isinstance(e, Borrowed)}
    partial = {e.k for e in events if isinstance(e, Partial)}
    checkins = {e.k: e for e in events if isinstance(e, Checkin)}
    writes = owned_writes(events)
    one_connection = len({e.connection for e in checkins.values()}) == 1
    strip, rows, read_at, answered = [], [], {}, set()
    for read in (e for e in events if isinstance(e, Read) and e.k <= shown):
        start = read_at.get(read.connection, 0)
        end = start + len(read.reply)
        read_at[read.connection] = end
        pieces = pieces_of(writes, read.connection, start, end)
        got = [(owner, piece, owner == NOBODY or exchange != read.k) for owner, piece, exchange in pieces]
        strip += [(owner, piece, wrong, read.client) for owner, piece, wrong in got]
        answered.update(exchange for owner, _, exchange in pieces if owner != NOBODY)
        right = read.reply == answer(requests[read.k].rstrip(b"\n"))
        after = CHECKIN_LABELS[checkins[read.k].outcome]
        if read.k in partial:
            after = "read on after its first part; " + after
        written = sum(len(piece) for _, piece, _ in pieces_of(writes, read.connection, 0, 1 << 30))
        if checkins[read.k].outcome != "released" and written > end:
            after += f", {written - end} bytes never read"
        if not one_connection:
            after += f" (connection {read.connection})"
        rows.append((read.client, requests[read.k], got, "right" if right else "wrong", GREEN if right else RED, after))
    return strip if one_connection else None, rows, answered


def tally(events):
    """(right, another client's answer, dirty closes, connections, borrows) over a whole trial."""
    asked = {e.k: (e.client, e.request) for e in events if isinstance(e, Borrowed)}
    reads = [(asked[e.k], e.reply) for e in events if isinstance(e, Read)]
    right = sum(reply == answer(request.rstrip(b"\n")) for (_, request), reply in reads)
    others = sum(any(reply == answer(request.rstrip(b"\n")) for other, request in asked.values() if other != client)
                 for (client, _), reply in reads)
    dirty = sum(e.outcome == "dirty" for e in events if isinstance(e, Checkin))
    return right, others, dirty, len({e.connection for e in events if isinstance(e, Borrowed)}), len(asked)


def draw_pool_panel(svg, y, rule, note, events, shown):
    """A trial's first `shown` borrows as svg.borrows steps; returns (the bottom, the
    requests sent on whose answers no borrower read a byte)."""
    strip, rows, answered = pool_steps(events, shown)
    caption = "its one upstream connection's stream, as written: each borrower reads on where the last stopped"
    unread = [visible(e.request) for e in events if isinstance(e, Borrowed) and e.k <= shown and e.k not in answered]
    return borrows(svg, y, rule, note, strip and (caption, strip), rows), unread


def draw_release(recorder):
    title = "Scenario 6: a reply written in two parts with a pause between, pool cap 1"
    svg = Svg(title)
    y = heading(svg, [title, "two trials of its paused-reply row: the framed rule above, the timeout rule below",
                      "the clients send in name order, each once the one before has the connection"])
    found = trials(recorder)
    for release in ("framed", "timeout"):
        events, right = found[release, True]
        if release == "framed":
            rule = 'release="framed": the connection goes back after the reply\'s \\n'
        else:
            timeout = next(e.timeout for e in events if isinstance(e, Checkin))
            rule = f'release="timeout": it goes back after {timeout}s of silence'
        total = tally(events)[4]
        note = f"the first {SHOWN_EXCHANGES} of its {total} borrows; the upstream pauses after each reply's first part"
        y = draw_pool_panel(svg, y + 10, rule, note, events, SHOWN_EXCHANGES)[0] + 4
        svg.text(16, y, f"right: {right}/{total}", 13, GREEN if right == total else RED, bold=True)
        y += 40
    svg.legend(16, y, [("A's bytes", *colours("A")), ("B's bytes", *colours("B")), ("C's bytes", *colours("C")),
                       ("red outline: bytes of another client's answer", "#ffffff", RED)])
    return svg


def record_dishonest():
    return record_pool(demo.dishonest, "dishonest_trial", lambda pool_class: pool_class.__name__)


def draw_dishonest(recorder):
    title = "Scenario 9: an upstream that says one line nobody asked for"
    svg = Svg(title)
    found = trials(recorder)
    extra = {e.data[len(e.honest):] for e in recorder.of(Wrote)} - {b""}
    y = heading(svg, [title, f"the upstream follows every reply with {' '.join(map(visible, sorted(extra)))} "
                             "in the same write; A and B take turns through a pool of one connection"])
    for label, (events, _) in found.items():
        rule = {"TrustingPool": "TrustingPool: keeps the bytes past a reply for the next borrower",
                "FramedProxy": "FramedProxy: closes a connection with bytes past a reply"}.get(label, label)
        right, others, dirty, connections, borrows = tally(events)
        note = f"right {right}/{borrows}   another client's answer {others}   dirty connections closed {dirty}   " \
               f"upstream connections opened {connections}"
        y, unread = draw_pool_panel(svg, y + 10, rule, note, events, borrows)
        if unread:
            svg.text(16, y, f"queued behind them, never read: the answers to {', '.join(unread)}", 12, MUTED)
        y += 36
    svg.legend(16, y, [("A's bytes", *colours("A")), ("B's bytes", *colours("B")),
                       ("red fill: the line nobody asked for", *colours(NOBODY)),
                       ("red outline: not the answer to this request", "#ffffff", RED)])
    return svg


# --- Part two: the managed layer ------------------------------------------------------

# --- 4. dirty-return.svg ---------------------------------------------------------------

NOTE_WIDTH = 30   # characters per line of a step's notes

def variants(recorder):
    """[((late_replies, fatal), its Steps and Moves)] per ManagedClient the scenario made, up
    to its shut_down(); its connections numbered from 1."""
    found = {}   # client -> (options, events, its connections' numbers)
    for e in recorder.events:
        if isinstance(e, Made):
            found[e.client] = ((e.late_replies, e.fatal), [], {})
        elif isinstance(e, Move) and e.reason == "shut down":
            found[e.client][2]["over"] = True
        elif isinstance(e, (Step, Move)) and "over" not in found[e.client][2]:
            numbers = found[e.client][2]
            if isinstance(e, Step):
                e = e._replace(connection=numbers.setdefault(e.connection, len(numbers) + 1))
            found[e.client][1].append(e)
    return [(options, events) for options, events, _ in found.values()]


def variant_title(late_replies, fatal):
    if fatal:
        return "msg_timeout_is_fatal=True: the timed-out call's connection is destroyed"
    if late_replies == "forget":
        return 'late_replies="forget" (the bug): the timed-out call leaves the queue'
    return "the default: the timed-out call stays owed, its late reply is discarded"


def short(call):
    """A call as the steps name it: GET apple -> apple."""
    return call.split(" ", 1)[-1]


def queued(call, abandoned):
    """A call in the owed queue as its box shows it."""
    return short(call) + (" (abandoned)" if abandoned else "")


def dirty_steps(events):
    """One client's events as steps: (header, what happened, tone, connection, queue, notes),
    the notes wrapped to lines of NOTE_WIDTH characters.

    A state change is logged before the step it belongs to (the timeout or reply
    that caused it is logged once handled, the connect before the send), so each
    change is noted under the next step."""
    steps, notes = [], []
    for e in events:
        if isinstance(e, Move):
            if e.after == "up":
                notes.append("a connection opens")   # one line, shorter than NOTE_WIDTH
            elif e.after != "connecting":   # connecting is on the way to up, or to a failure that says why
                notes += textwrap.wrap(f"{e.before} -> {e.after}: {e.reason}", NOTE_WIDTH)
            continue
        owed = None if e.ended else e.owed
        if e.kind == "sent":
            steps.append((f"t={e.t}s  {e.call} sent", "", INK, e.connection, e.owed, notes))
        elif e.kind == "timed out":
            what = "its connection is destroyed" if e.ended else (
                "it stays owed, abandoned" if any(label == e.call for label, _ in e.owed) else "it leaves the queue")
            steps.append((f"t={e.t}s  {e.call} times out", what, INK, e.connection, owed, notes))
        else:
            if e.settled is None:
                what, tone = "no call is owed it", INK
            elif e.abandoned:
                what, tone = f"discarded: {short(e.settled)} gave up", GREEN
            else:
                right = e.reply == answer(e.settled.encode())
                what, tone = f"handed to {short(e.settled)}" + ("" if right else ": WRONG"), GREEN if right else RED
            steps.append((f"reply {visible(e.reply)}", what, tone, e.connection, owed, notes))
        notes = []
    return steps


def draw_dirty_return(recorder):
    title = "Part two, scenario 1: the dirty return, a timed-out call's late reply"
    svg = Svg(title)
    y = heading(svg, [title, "one client per rule, on the virtual clock; under each step, the calls "
                             "its connection owes, oldest first"])
    left = 16
    steps_per_variant = [(options, dirty_steps(events)) for options, events in variants(recorder)]
    widest = max(max(text_width(header, 12), text_width(what, 12),
                     *[text_width(line, 11) for line in notes],
                     sum(text_width(queued(label, abandoned), 12) + 14 for label, abandoned in owed or ()))
                 for _, steps in steps_per_variant for header, what, _, _, owed, notes in steps)
    column = widest + 16 + 30
    for (late_replies, fatal), steps in steps_per_variant:
        y += 16
        svg.text(left, y, variant_title(late_replies, fatal), 14, INK, bold=True)
        y += 14
        height = 112 + max(len(notes) for *_, notes in steps) * 14
        for index, (header, what, tone, connection, owed, notes) in enumerate(steps):
            x = left + index * column
            if index:
                svg.arrow(x - 22, y + 50, x - 8, y + 50, FAINT, 1.5, head=6)
            wrong = tone == RED
            svg.rect(x, y, column - 30, height, RED_FILL if wrong else "#fafafa", RED if wrong else FAINT,
                     2.5 if wrong else 1, radius=4)
            svg.text(x + 8, y + 18, header, 12, RED if wrong else INK, bold=True)
            svg.text(x + 8, y + 36, what, 12, tone, bold=tone != INK)
            svg.text(x + 8, y + 60, f"owed on connection {connection}:", 11, MUTED)
            if owed is None:
                svg.text(x + 8, y + 82, "(connection gone)", 12, MUTED)
            elif not owed:
                svg.text(x + 8, y + 82, "(nothing)", 12, MUTED)
            box_x = x + 8
            for label, abandoned in owed or ():
                shown = queued(label, abandoned)
                width = text_width(shown, 12) + 10
                svg.rect(box_x, y + 67, width, 22, "#eeeeee" if abandoned else "#fff8dc",
                         MUTED, 1, dash="3 3" if abandoned else None, radius=3)
                svg.text(box_x + 5, y + 82, shown, 12, MUTED if abandoned else INK)
                box_x += width + 4
            for number_of_line, line in enumerate(notes):
                svg.text(x + 8, y + 108 + number_of_line * 14, line, 11, MUTED)
        y += height + 20
    svg.legend(left, y + 8, [("a call owed", "#fff8dc", MUTED), ("abandoned: timed out, reply still owed",
                              "#eeeeee", MUTED), ("red: a reply handed to the wrong call", RED_FILL, RED)])
    return svg


# --- 5. failover-windows.svg -----------------------------------------------------------

SECOND = 140   # pixels per second of virtual time


def draw_failover(recorder):
    title = "Part two, scenario 4: failover with a reliability cache, on the virtual clock"
    svg = Svg(title)
    events = recorder.events[:[type(e) for e in recorder.events].index(SetShutDown)]   # not the cleanup
    made = next(e for e in events if isinstance(e, SetMade))
    y = heading(svg, [title, f"policy {made.policy} over {' and '.join(made.names)}; reliability cache: "
                             f"policy {made.cache_policy}, threshold {made.threshold}"])
    disables = [e for e in events if isinstance(e, Disabled)]
    calls = []   # (t, [(service, result or None if skipped)])
    for e in events:
        if isinstance(e, SetCall):
            calls.append((e.t, []))
        elif isinstance(e, Enabled) and calls and not e.yes:
            calls[-1][1].append((e.service, None))
        elif isinstance(e, Attempt) and calls:
            calls[-1][1].append((e.service, e.result))
    end = max([e.end for e in disables] + [t for t, _ in calls])
    left, top = 170, y + 20

    def x_of(seconds):
        return left + seconds * SECOND

    # the time axis
    svg.line(left, top, x_of(end), top, INK, 1.5)
    for second in range(int(end) + 1):
        svg.line(x_of(second), top - 4, x_of(second), top + 4, INK, 1.5)
        svg.text(x_of(second), top - 10, f"{second}s", 12, INK, "middle")
    # A's life: stopped, then running again
    y_life = top + 36
    svg.text(16, y_life + 4, "A, the upstream", 12, INK, bold=True)
    stops = [(e.t, e.service) for e in events if isinstance(e, Service) and e.kind == "stopped"]
    starts = [(e.t, e.service) for e in events if isinstance(e, Service) and e.kind == "restarted"]
    for (stopped_at, name), (started_at, _) in zip(stops, starts + [(end, None)]):
        svg.rect(x_of(stopped_at), y_life - 10, (started_at - stopped_at) * SECOND, 18, "#eeeeee", MUTED, 1,
                 dash="4 3")
        svg.text(x_of(stopped_at) + 6, y_life + 4, "stopped: refuses connections", 11, MUTED)
        if name and started_at < end:   # the call made at that time went first: say so, beside its row
            restart = next(i for i, e in enumerate(events) if isinstance(e, Service) and e.t == started_at)
            after = any(isinstance(e, SetCall) and e.t == started_at for e in events[:restart])
            svg.text(x_of(started_at) + 6, y_life + 4, f"restarted at t={started_at}s" +
                     (", after that call" if after else ""), 11, GREEN, bold=True)
    # A's disable windows
    y_windows = y_life + 40
    svg.text(16, y_windows + 4, "A disabled", 12, RED, bold=True)
    for _, start, stop, reason in disables:
        svg.rect(x_of(start) + 1, y_windows - 12, (stop - start) * SECOND - 2, 22, RED_FILL, RED, 1.5, radius=3)
        svg.text(x_of(start) + 6, y_windows + 3, f"{start}-{stop}s: {stop - start}s", 11, RED, bold=True)
        svg.text(x_of(start) + 6, y_windows + 26, reason.split(",")[0], 11, RED)
    # each call, its attempts in order, at the time it was made
    y_row = y_windows + 58
    svg.text(16, y_row - 4, "each GET k", 12, INK, bold=True)
    results = []
    for t, tried in calls:
        y_row += 28
        svg.line(x_of(t), top, x_of(t), y_row - 14, FAINT, 1, dash="2 3")
        svg.text(x_of(t) - 8, y_row, f"t={t}s", 11, MUTED, "end")
        x = x_of(t)
        for name, result in tried:
            if result is None:
                label, fill, stroke = f"{name} skipped: disabled", "#eeeeee", MUTED
            elif result == "ok":
                label, fill, stroke = f"{name} ok", "#e3f1e4", GREEN
            else:
                kind = result.split(":")[0]
                label, fill, stroke = f"{name} {kind}", RED_FILL, RED
                if result not in results:
                    results.append(result)
            width = text_width(label, 11) + 10
            svg.rect(x, y_row - 13, width, 18, fill, stroke, 1.2, radius=3)
            svg.text(x + 5, y_row, label, 11, stroke)
            x += width + 6
    y_legend = y_row + 34
    for result in results:
        svg.text(16, y_legend, result, 11, RED)
        y_legend += 18
    svg.legend(16, y_legend + 8, [("A disabled by the cache", RED_FILL, RED), ("an attempt that failed",
                                   RED_FILL, RED), ("an attempt answered", "#e3f1e4", GREEN),
                                   ("skipped by pick(): disabled", "#eeeeee", MUTED)])
    return svg


# --- the pictures, and the command line ------------------------------------------------

PICTURES = {   # file name -> (run the scenario: (Recorder, what it printed), draw from the Recorder)
    "interleave.svg": (lambda: record_naive_relay(demo.interleave), draw_interleave),
    "headline.svg": (lambda: record_naive_relay(demo.headline), draw_headline),
    "release.svg": (record_release, draw_release),
    "dirty-return.svg": (lambda: record_managed(managed_demo.dirty_return), draw_dirty_return),
    "failover-windows.svg": (lambda: record_managed(managed_demo.failover), draw_failover),
    "dishonest.svg": (record_dishonest, draw_dishonest),
}


def record_all(pictures=None):
    """Run each picture's scenarios once, however many pictures share them: {file name: (Recorder, printed)}."""
    runs = {}
    for record, _ in (pictures or PICTURES).values():
        runs[record] = runs.get(record) or record()
    return {name: runs[record] for name, (record, _) in (pictures or PICTURES).items()}


def render_all(runs=None, pictures=None):
    """Draw every picture from `runs` (record_all() if not given): {file name: SVG text}."""
    runs = runs or record_all(pictures)
    return {name: draw(runs[name][0]).render() for name, (_, draw) in (pictures or PICTURES).items()}


def save(svgs, check, remedy="make pictures"):
    """Write each {file name: SVG text} to pictures/, or with `check` write nothing and
    say which differ from it; returns how many differ."""
    stale = [name for name in svgs if check and (not (PICTURES_DIR / name).exists() or
                                                  (PICTURES_DIR / name).read_text(encoding="utf-8") != svgs[name])]
    for name, svg in svgs.items():
        if not check:
            (PICTURES_DIR / name).write_text(svg, encoding="utf-8")
            print(f"wrote pictures/{name}")
    for name in stale:
        print(f"pictures/{name} differs from what the scenario draws now: run `{remedy}` and look at it")
    return len(stale)
