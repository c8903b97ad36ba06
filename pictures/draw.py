"""pictures.draw: the commentary's pictures of Parts one and two, drawn from the scenarios' own runs.

    python3 -m pictures            run the scenarios, rewrite pictures/*.svg (Part three's too)
    python3 -m pictures --check    run them, and exit 1 if a checked-in picture differs

Nothing here is drawn by hand. Each picture runs its scenario from demo.py or
managed_demo.py, unchanged, while a Recorder wraps the methods where bytes change
hands; the drawing reads only what the Recorder logged. A change to the code that
changes what a scenario does changes its picture, and test_pictures.py, which
renders every picture afresh and compares it byte for byte with pictures/, fails.

Map of the module, in reading order:

    Recorder        scaffolding: wraps methods for the length of one run and logs
                    events (who sent or received which bytes); undoes every wrap
    Svg             a few shapes and monospace text; grows to fit what is drawn
    a record_*() runs a scenario and returns its Recorder and what it printed;
    a draw_*() turns the events into an Svg:
        record_naive_relay   interleave.svg   scenario 1 as a byte strip
                             headline.svg     scenario 2 as a sequence diagram
        record_pool          release.svg      scenario 6: framed against timeout, borrow by borrow
                             dishonest.svg    scenario 9: TrustingPool against FramedProxy
        record_managed       dirty-return.svg      Part two's 1: the owed queue under three rules
                             failover-windows.svg  Part two's 4 on the virtual clock's axis
    PICTURES, record_all(), render_all(), main()

Same bytes on every run: no picture shows a time, a port or an id. Events are
ordered by the hooks the scenario waits on (which borrow, which reply), never by
the wall clock; where two threads log at once, the drawing reads each thread's
events apart (e.g. the upstream's replies apart from the proxy's deliveries).
Part two's times are the virtual clock's.
"""
import argparse
import contextlib
import io
import socket
import sys
import textwrap
import threading
from pathlib import Path
from xml.sax.saxutils import escape

import demo
from part2 import managed
from part2 import managed_demo
from scaffolding import faults, kit
from scaffolding.faults import DishonestUpstream
from tcp_proxy import FramedProxy, Hooks, NaiveProxy, Upstream, answer

HERE = Path(__file__).parent.parent   # the project's root
PICTURES_DIR = HERE / "pictures"


# --- scaffolding: the recorder ---------------------------------------------------

class Recorder:
    """Wraps methods for the length of a `with` block and logs what they saw.

    Scaffolding: nothing in the proxies reads it. Each wrap calls the original
    method unchanged; leaving the block restores every class as it was.
    """

    def __init__(self):
        self.events = []                 # (kind, ...) tuples in the order they were logged
        self.names = {}                  # a demo client's socket address -> its name ("A")
        self.thread = threading.local()  # per-thread notes, e.g. the client a handler serves
        self.turns = threading.Condition()   # guards turns_taken; see wait_for_turn()
        self.turns_taken = 0
        self._log_lock = threading.Lock()
        self._undo = contextlib.ExitStack()

    def log(self, *event):
        with self._log_lock:
            self.events.append(event)

    def of_kind(self, kind):
        """The events of one kind, in the order they were logged."""
        return [event[1:] for event in self.events if event[0] == kind]

    def wrap(self, owner, attribute, make_wrapper):
        """Replace owner.attribute by make_wrapper(original) until the block ends."""
        original = getattr(owner, attribute)
        if attribute in vars(owner):
            self._undo.callback(setattr, owner, attribute, vars(owner)[attribute])
        else:   # inherited: deleting the wrapper uncovers the inherited one again
            self._undo.callback(delattr, owner, attribute)
        setattr(owner, attribute, make_wrapper(original))

    def name_demo_clients(self):
        """Remember each kit.Client's address, so a proxy's socket names its peer."""
        def make(original):
            def __init__(client, name, addr, *args, **options):
                original(client, name, addr, *args, **options)
                self.names[client.sock.getsockname()] = name
            return __init__
        self.wrap(kit.Client, "__init__", make)

    def name_pool_requests(self):
        """Note, per FramedProxy handler thread, the client it serves (thread.client) and
        the request in hand (thread.request), for the wrappers that log exchanges."""
        def make_handle(original):
            def handle(proxy, conn):
                self.thread.conn = conn   # named in exchange(): the client may not be named yet
                original(proxy, conn)
            return handle

        def make_exchange(original):
            def exchange(proxy, request):
                self.thread.client = self.peer_name(self.thread.conn)   # it has sent: it is named
                self.thread.request = request
                return original(proxy, request)
            return exchange
        self.wrap(FramedProxy, "handle", make_handle)
        self.wrap(FramedProxy, "exchange", make_exchange)

    def peer_name(self, sock):
        """The name of the demo client at the other end of a proxy's socket. Ask only
        once the client has sent something: its name is noted when its connect returns."""
        return self.names.get(sock.getpeername(), "?")

    def wait_for_turn(self, turn, what):
        """Block until `turn` turns have been taken: scaffolding that lets threads which
        would race go one at a time, in an order the caller fixes (see record_release)."""
        with self.turns:
            if not self.turns.wait_for(lambda: self.turns_taken >= turn, Hooks.hook_timeout):
                raise TimeoutError(f"gave up waiting for {what}: {self.turns_taken} turns taken")

    def take_turn(self):
        with self.turns:
            self.turns_taken += 1
            self.turns.notify_all()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self._undo.close()


def run_quietly(scenario, *args):
    """Run a demo scenario; return its result and what it printed."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        result = scenario(*args)
    return result, printed.getvalue()


# --- drawing: a few shapes and monospace text --------------------------------------

FONT = "DejaVu Sans Mono, Menlo, Consolas, monospace"
ADVANCE = 0.61   # a DejaVu Sans Mono character is 0.602 em wide; a little to spare
INK, MUTED, FAINT = "#222222", "#666666", "#bbbbbb"
RED, GREEN = "#c62828", "#2e7d32"
RED_FILL = "#fbe0e0"
UPSTREAM_COLOURS = ("#eeeeee", "#555555")
CLIENT_COLOURS = {   # name -> (fill, stroke); the same client has the same colour in every picture
    "A": ("#dbe8f7", "#1f5fa8"),
    "B": ("#fde3cc", "#b85c00"),
    "C": ("#e4dcf3", "#5b3a9e"),
    "nobody": (RED_FILL, RED),   # bytes no request asked for
}


def colours(name):
    return CLIENT_COLOURS.get(name, UPSTREAM_COLOURS)


def number(value):
    """A coordinate as the file shows it: at most one decimal, so every run writes the same."""
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


def visible(data):
    """Bytes as a label: b"GET a\\n" -> GET a\\n (every line end shown)."""
    return repr(bytes(data))[2:-1]


def text_width(content, size):
    return len(content) * size * ADVANCE


class Svg:
    """An SVG picture that grows to hold what is drawn on it.

    Every shape widens the picture's extent, text by its estimated width, so
    nothing drawn can fall outside the picture; a shape left of or above the
    origin is a layout bug and render() raises.
    """

    def __init__(self, title):
        self.title = title
        self.parts = []
        self.left = self.top = 0.0
        self.right = self.bottom = 0.0

    def _cover(self, x1, y1, x2, y2):
        self.left, self.top = min(self.left, x1, x2), min(self.top, y1, y2)
        self.right, self.bottom = max(self.right, x1, x2), max(self.bottom, y1, y2)

    def rect(self, x, y, width, height, fill="none", stroke="none", stroke_width=1, dash=None, radius=0):
        self._cover(x, y, x + width, y + height)
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        extra += f' rx="{radius}"' if radius else ""
        self.parts.append(f'<rect x="{number(x)}" y="{number(y)}" width="{number(width)}" '
                          f'height="{number(height)}" fill="{fill}" stroke="{stroke}" '
                          f'stroke-width="{number(stroke_width)}"{extra}/>')

    def line(self, x1, y1, x2, y2, stroke=INK, width=1.0, dash=None):
        self._cover(x1, y1, x2, y2)
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        self.parts.append(f'<line x1="{number(x1)}" y1="{number(y1)}" x2="{number(x2)}" '
                          f'y2="{number(y2)}" stroke="{stroke}" stroke-width="{number(width)}"{extra}/>')

    def polygon(self, points, fill):
        for x, y in points:
            self._cover(x, y, x, y)
        listed = " ".join(f"{number(x)},{number(y)}" for x, y in points)
        self.parts.append(f'<polygon points="{listed}" fill="{fill}"/>')

    def arrow(self, x1, y1, x2, y2, stroke=INK, width=1.5, dash=None, head=8):
        """A straight line from (x1, y1) with a head at (x2, y2)."""
        length = max(((x2 - x1) ** 2 + (y2 - y1) ** 2) ** 0.5, 1)
        ux, uy = (x2 - x1) / length, (y2 - y1) / length
        base_x, base_y = x2 - ux * head, y2 - uy * head
        self.line(x1, y1, base_x, base_y, stroke, width, dash)
        self.polygon([(x2, y2), (base_x - uy * head / 2, base_y + ux * head / 2),
                      (base_x + uy * head / 2, base_y - ux * head / 2)], stroke)

    def text(self, x, y, content, size=13, fill=INK, anchor="start", bold=False):
        """One line of monospace text; (x, y) is the baseline's start, middle or end."""
        width = text_width(content, size)
        start = {"start": x, "middle": x - width / 2, "end": x - width}[anchor]
        self._cover(start, y - size, start + width, y + size * 0.3)
        weight = ' font-weight="bold"' if bold else ""
        anchor_attribute = f' text-anchor="{anchor}"' if anchor != "start" else ""
        self.parts.append(f'<text x="{number(x)}" y="{number(y)}" font-size="{size}" '
                          f'fill="{fill}"{anchor_attribute}{weight}>{escape(content)}</text>')

    def bytes_box(self, x, y, data, owner, size=13, wrong=False, height=24):
        """A box holding bytes as a label, filled with their owner's colour; returns its width."""
        fill, stroke = colours(owner)
        width = text_width(visible(data), size) + 10
        self.rect(x, y, width, height, fill, RED if wrong else stroke, 2.5 if wrong else 1, radius=3)
        self.text(x + 5, y + height / 2 + size * 0.35, visible(data), size, INK)
        return width

    def legend(self, x, y, entries, size=12):
        """A legend line: (label, fill, stroke) per entry, left to right."""
        for label, fill, stroke in entries:
            self.rect(x, y - size + 1, size, size, fill, stroke, 1.5)
            self.text(x + size + 6, y, label, size, INK)
            x += size + 6 + text_width(label, size) + 22

    @contextlib.contextmanager
    def behind(self, position):
        """Shapes drawn inside the block go under those drawn since parts[position]."""
        later = self.parts[position:]
        del self.parts[position:]
        yield
        self.parts.extend(later)

    def render(self, margin=16):
        if self.left < 0 or self.top < 0:
            raise ValueError(f"{self.title!r}: drawn outside the picture at ({self.left}, {self.top})")
        width, height = number(self.right + margin), number(self.bottom + margin)
        return "\n".join([
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="{FONT}" xml:space="preserve">',
            f"<title>{escape(self.title)}</title>",
            f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
            *self.parts,
            "</svg>",
            ""])


def heading(svg, lines, x=16, y=28):
    """The picture's visible title and a line or two under it; returns the y below them."""
    svg.text(x, y, lines[0], 16, INK, bold=True)
    for line in lines[1:]:
        y += 20
        svg.text(x, y, line, 12, MUTED)
    return y + 22


def owners_of(chunks, start, end):
    """Who sent the bytes start..end of a stream made of (owner, data) chunks, in order."""
    found, position = [], 0
    for owner, data in chunks:
        if position < end and start < position + len(data) and owner not in found:
            found.append(owner)
        position += len(data)
    return found


def coalesce(chunks):
    """Join adjacent (owner, data) chunks of the same owner: how a recv() cut them is noise."""
    joined = []
    for owner, data in chunks:
        if joined and joined[-1][0] == owner:
            joined[-1] = (owner, joined[-1][1] + data)
        else:
            joined.append((owner, data))
    return joined


# --- Part one: the blind relay ------------------------------------------------------

def record_naive_relay(scenario):
    """Run a NaiveProxy scenario of demo.py; return the Recorder and what it printed.

    Logged, each kind in its own thread's order:
      sent (client, data)        a demo client's send()
      forwarded (client, data)   a chunk NaiveProxy wrote upstream, and whose it was
      last (client)              NaiveProxy.last after that chunk
      parsed (line,)             a request line the upstream parsed
      replied (data, gate)       a reply the upstream is about to write
      routed (data, routing)     a chunk NaiveProxy.route() read from the upstream, and its rule
      delivered (client, data)   bytes route() then wrote to a client socket
      received (client, data)    what a demo client read to EOF
    """
    recorder = Recorder()
    with recorder:
        recorder.name_demo_clients()
        routing = threading.local()   # set while a thread is inside route()

        def wrap_send(original):
            def send(client, data):
                recorder.log("sent", client.name, data)
                original(client, data)
            return send

        def wrap_read_to_eof(original):
            def read_to_eof(client):
                data = original(client)
                recorder.log("received", client.name, data)
                return data
            return read_to_eof

        def wrap_forward(original):
            def forward(proxy, client, data):
                recorder.log("forwarded", recorder.peer_name(client), data)
                original(proxy, client, data)
                recorder.log("last", recorder.peer_name(proxy.last))
            return forward

        def wrap_route(original):
            def route(proxy, data):
                recorder.log("routed", data, proxy.routing)
                routing.active = True
                try:
                    original(proxy, data)
                finally:
                    routing.active = False
            return route

        def wrap_sendall(original):
            def sendall(sock, data, *flags):
                if getattr(routing, "active", False):
                    recorder.log("delivered", recorder.peer_name(sock), bytes(data))
                return original(sock, data, *flags)
            return sendall

        def wrap_count(original):
            def count(server, name, amount=1):
                if name == "requests":   # bumped just after the line joins `parsed`
                    recorder.log("parsed", server.parsed[-1])
                original(server, name, amount)
            return count

        def wrap_reply(original):
            def reply(upstream, conn, data):
                recorder.log("replied", data, upstream.gate)
                original(upstream, conn, data)
            return reply

        recorder.wrap(kit.Client, "send", wrap_send)
        recorder.wrap(kit.Client, "read_to_eof", wrap_read_to_eof)
        recorder.wrap(NaiveProxy, "forward", wrap_forward)
        recorder.wrap(NaiveProxy, "route", wrap_route)
        recorder.wrap(socket.socket, "sendall", wrap_sendall)
        recorder.wrap(Upstream, "count", wrap_count)
        recorder.wrap(Upstream, "reply", wrap_reply)
        _, printed = run_quietly(scenario)
    return recorder, printed


def request_owners(recorder):
    """Each parsed request line with the clients whose bytes made it (forwarded order)."""
    forwarded = coalesce(recorder.of_kind("forwarded"))
    requests, position = [], 0
    for (line,) in recorder.of_kind("parsed"):
        end = position + len(line) + 1   # the line and its b"\n"
        requests.append((line, owners_of(forwarded, position, end)))
        position = end
    return requests


def deliveries(recorder):
    """Each upstream reply, in order, with the (client, bytes) route() wrote of it.

    route() writes each chunk it reads to its targets; a chunk may hold part of a
    reply or two replies (recv() cuts as it likes), so the chunks are laid end to
    end and cut where the upstream's replies end. Both kinds come from the one
    downstream thread, so their order is the order route() ran in.
    """
    chunks = []   # (chunk, [clients it was written to])
    for event in recorder.events:
        if event[0] == "routed":
            chunks.append((event[1], []))
        elif event[0] == "delivered":
            chunks[-1][1].append(event[1])
    result, start = [], 0
    for data, _ in recorder.of_kind("replied"):
        end, pieces, position = start + len(data), [], 0
        for chunk, clients in chunks:
            low, high = max(start, position), min(end, position + len(chunk))
            if low < high:
                # copies of one chunk in name order: route()'s list is in the racy order
                # the handler threads registered their clients in
                pieces.extend((client, chunk[low - position:high - position]) for client in sorted(clients))
            position += len(chunk)
        result.append((data, pieces))
        start = end
    return result


def lines_sent(recorder, client):
    """The request lines a client meant: everything it sent, end to end, cut at each b"\\n"."""
    stream = b"".join(data for name, data in recorder.of_kind("sent") if name == client)
    return stream.split(b"\n")[:-1]


# --- 1. interleave.svg --------------------------------------------------------------

CELL = 30   # a byte's width in the strip


def draw_interleave(recorder):
    forwarded = coalesce(recorder.of_kind("forwarded"))
    requests = request_owners(recorder)
    stream = b"".join(data for _, data in forwarded)
    svg = Svg("Scenario 1: two clients' bytes interleave on one upstream socket")
    y = heading(svg, ["Scenario 1: two clients' bytes interleave on one upstream socket",
                      f"the {len(stream)} bytes NaiveProxy forwarded, in the order they reached the upstream"])
    left = 24
    # who sent each run of bytes, above the strip
    position, y_sender = 0, y + 16
    for owner, data in forwarded:
        x1, x2 = left + position * CELL, left + (position + len(data)) * CELL
        fill, stroke = colours(owner)
        svg.text((x1 + x2) / 2, y_sender, f"{owner}: {len(data)} bytes", 13, stroke, "middle", bold=True)
        svg.line(x1 + 2, y_sender + 8, x2 - 2, y_sender + 8, stroke, 2)
        position += len(data)
    # the strip: one cell per byte, coloured by its sender; each b"\n" in a dark cell
    y_strip = y_sender + 18
    position = 0
    for owner, data in forwarded:
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
                      for client in dict.fromkeys(owner for owner, _ in forwarded))
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
    replies = recorder.of_kind("replied")
    y_legend = y_reply + 26 + len(replies) * 30 + 16
    svg.legend(left, y_legend, [("A's bytes", *colours("A")), ("B's bytes", *colours("B")),
                                ("\\n", INK, INK), ("red: not what anyone asked for", RED_FILL, RED)])
    return svg


# --- 2. headline.svg ----------------------------------------------------------------

def whose_answers(recorder):
    """For each reply in order: the clients whose bytes made the request it answers."""
    return [senders for _, senders in request_owners(recorder)]


def draw_headline(recorder):
    title = "Scenario 2: whole requests, one after the other: B gets A's answer"
    svg = Svg(title)
    y = heading(svg, [title, "NaiveProxy shares one upstream socket and routes every reply to `last`, "
                             "the client that wrote most recently"])
    lanes = {"A": 90, "B": 300, "NaiveProxy": 570, "Upstream": 830}
    notes_x = lanes["Upstream"] + 70
    row = 34
    rows = []   # (kind, ...) per row, drawn below
    for event in recorder.events:
        kind = event[0]
        if kind == "sent":
            rows.append(("arrow", event[1], "NaiveProxy", event[2], event[1], False, ""))
        elif kind == "forwarded":
            rows.append(("arrow", "NaiveProxy", "Upstream", event[2], event[1], False, ""))
        elif kind == "last":
            rows.append(("note", "NaiveProxy", f"last = {event[1]}", event[1], False))
    gates = {gate for _, gate in recorder.of_kind("replied")}
    for gate in sorted(gates - {0}):
        rows.append(("note", "Upstream", f"gate: replies held until {gate} requests are in", None, False))
    routing = {rule for _, rule in recorder.of_kind("routed")}
    how = "routed to last = {}" if routing == {"last"} else "routed to {} (routing: " + "/".join(sorted(routing)) + ")"
    for (reply, pieces), requesters in zip(deliveries(recorder), whose_answers(recorder)):
        asked = " + ".join(requesters)
        rows.append(("arrow", "Upstream", "NaiveProxy", reply, asked, False, f"the answer to {asked}'s request"))
        for client, piece in pieces:
            wrong = client not in requesters or len(requesters) > 1
            rows.append(("arrow", "NaiveProxy", client, piece, asked, wrong,
                         how.format(client) + (f": {asked} asked for it" if wrong else "")))
    for name, data in recorder.of_kind("received"):
        expected = b"".join(answer(line) for line in lines_sent(recorder, name))
        rows.append(("note", name, f"{name} received {len(data)} bytes", name, data != expected))
    top = y + 30
    bottom = top + row * (len(rows) + 1)
    for lane, x in lanes.items():
        fill, stroke = colours(lane)
        svg.rect(x - 55, top - 26, 110, 26, fill, stroke, 1.5, radius=4)
        svg.text(x, top - 8, lane, 13, INK, "middle", bold=True)
        svg.line(x, top, x, bottom, FAINT, 1.5, dash="4 4")
    for index, drawn in enumerate(rows):
        y_row = top + row * (index + 1)
        if drawn[0] == "arrow":
            _, source, target, data, owner, wrong, remark = drawn
            x1, x2 = lanes[source], lanes[target]
            tone = RED if wrong else colours(owner)[1]
            svg.arrow(x1, y_row, x2, y_row, tone, 2.5 if wrong else 1.5)
            label = visible(data)
            label_x = min(x1, x2) + 12
            svg.rect(label_x - 3, y_row - 20, text_width(label, 13) + 6, 17, "#ffffff")
            svg.text(label_x, y_row - 6, label, 13, RED if wrong else INK, bold=wrong)
            if remark:
                svg.text(notes_x, y_row + 4, remark, 12, RED if wrong else MUTED, bold=wrong)
        else:
            _, lane, label, owner, wrong = drawn
            x = lanes[lane]
            width = text_width(label, 12) + 14
            fill, stroke = colours(owner) if owner else UPSTREAM_COLOURS
            svg.rect(x - width / 2, y_row - 15, width, 22, RED_FILL if wrong else fill,
                     RED if wrong else stroke, 2 if wrong else 1, radius=3)
            svg.text(x, y_row + 1, label, 12, RED if wrong else INK, "middle", bold=True)
    svg.legend(16, bottom + 30, [("A's bytes", *colours("A")), ("B's bytes", *colours("B")),
                                  ("red: written to a client that did not ask for it", RED_FILL, RED)])
    return svg


# --- 3 and 6. release.svg and dishonest.svg: a pool's connection, borrow by borrow -------

SHOWN_EXCHANGES = 3   # borrows drawn per release trial; the trial's total is printed under them
NOBODY = "nobody"     # the owner of bytes no request asked for


def record_pool(scenario, trial_function, label_of, in_name_order=False):
    """Run a FramedProxy scenario of demo.py; return the Recorder and what it printed.

    `trial_function` names the demo function that runs one trial; label_of(its
    arguments) names the trial. Logged, each event but the first and last tagged
    with its exchange number k (the k-th checkout, answered by the upstream's k-th reply):
      trial (label,)                      a trial begins
      borrowed (k, client, request, n)    checkout() lent connection n (counted from 1) for this request
      wrote (k, n, data, honest, part)    the upstream is about to write `data` on connection n, of which
                                          `honest` is the reply it was asked for; part is "first" or
                                          "rest" (the reply's remainder, or all of it)
      partial (k,)                        the framed reader holds bytes but no end of reply, and reads on
      read (k, client, reply, n)          read_reply() is done: what the client will be sent
      checkin (k, client, outcome, n, timeout)
                                          the connection goes back ("released") or is closed ("dirty",
                                          "discarded"); timeout: the release_timeout, if the rule is timeout
      trial end (label, result)           what the trial function returned

    Scaffolding that fixes what a demo leaves to the scheduler, changing no count:
    with in_name_order, borrowers take the connection in name order (A, B, C ...);
    and under the timeout rule the upstream writes reply k's rest once request k+1
    is in, so that rest and reply k+1's first part reach the next borrower together.
    """
    recorder = Recorder()
    trial = {}   # this trial's counts and the connections' numbers

    def wrap_trial(original):
        def run_trial(*args):
            trial.update(borrows=0, replies=0, partial=set(), numbers={}, release="framed")
            recorder.names.clear()
            recorder.turns_taken = 0
            recorder.log("trial", label_of(*args))
            result = original(*args)
            recorder.log("trial end", label_of(*args), result if isinstance(result, int) else None)
            return result
        return run_trial

    def connection_number(address):
        return trial["numbers"].setdefault(address, len(trial["numbers"]) + 1)

    def wrap_checkout(original):
        def checkout(proxy):
            client = recorder.thread.client
            if in_name_order:
                recorder.wait_for_turn(kit.CLIENT_NAMES.index(client), f"{client}'s turn to borrow")
            sock = original(proxy)
            trial["release"] = proxy.release
            recorder.thread.exchange = trial["borrows"] = trial["borrows"] + 1
            recorder.log("borrowed", trial["borrows"], client, recorder.thread.request,
                         connection_number(sock.getsockname()))
            recorder.take_turn()
            return sock
        return checkout

    def wrap_read_reply(original):
        def read_reply(proxy, sock, *args, **options):
            reply, rest = original(proxy, sock, *args, **options)
            recorder.log("read", recorder.thread.exchange, recorder.thread.client, reply,
                         connection_number(sock.getsockname()))
            return reply, rest
        return read_reply

    def wrap_count(original):
        def count(proxy, name, amount=1):
            exchange = getattr(recorder.thread, "exchange", None)
            if name == "partial_replies" and exchange not in trial["partial"]:
                trial["partial"].add(exchange)
                recorder.log("partial", exchange)
            original(proxy, name, amount)
        return count

    def wrap_checkin(original):
        def checkin(proxy, sock, outcome, *args, **options):
            timeout = proxy.release_timeout if proxy.release == "timeout" else None
            recorder.log("checkin", recorder.thread.exchange, recorder.thread.client, outcome,
                         connection_number(sock.getsockname()), timeout)
            original(proxy, sock, outcome, *args, **options)
        return checkin

    def wrap_dishonest_reply(original):
        def reply(upstream, conn, data, *args, **options):
            recorder.thread.honest = data   # what it was asked to write; Upstream.reply sees the rest
            original(upstream, conn, data, *args, **options)
        return reply

    def wrap_reply(original):
        def reply(upstream, conn, data):
            trial["replies"] += 1
            honest = getattr(recorder.thread, "honest", None) or data   # set just now, or not at all
            recorder.thread.honest = None
            recorder.thread.reply = (connection_number(conn.getpeername()), data, honest)
            cut = upstream.split_at or 0
            if cut:
                recorder.log("wrote", trial["replies"], recorder.thread.reply[0], data[:cut], honest[:cut], "first")
            original(upstream, conn, data)
        return reply

    def wrap_upstream_init(original):
        def __init__(upstream, *args, **options):
            original(upstream, *args, **options)
            pause = upstream.pause

            def pause_then_log_the_rest(number):
                pause(number)
                if trial["release"] == "timeout":   # scaffolding: see the docstring
                    wanted = min(number + 1, len(recorder.names))
                    upstream.wait_until(lambda: upstream.requests >= wanted or upstream.closed,
                                        f"request {wanted} before reply {number}'s rest")
                connection, data, honest = recorder.thread.reply
                cut = upstream.split_at or 0
                recorder.log("wrote", number, connection, data[cut:], honest[cut:], "rest")
            upstream.pause = pause_then_log_the_rest
        return __init__

    with recorder:
        recorder.name_demo_clients()
        recorder.wrap(demo, trial_function, wrap_trial)
        recorder.name_pool_requests()
        recorder.wrap(FramedProxy, "checkout", wrap_checkout)
        recorder.wrap(FramedProxy, "read_reply", wrap_read_reply)
        recorder.wrap(FramedProxy, "count", wrap_count)
        recorder.wrap(FramedProxy, "checkin", wrap_checkin)
        recorder.wrap(Upstream, "reply", wrap_reply)
        recorder.wrap(Upstream, "__init__", wrap_upstream_init)
        if hasattr(demo, "DishonestUpstream"):
            recorder.wrap(DishonestUpstream, "reply", wrap_dishonest_reply)
        _, printed = run_quietly(scenario)
    return recorder, printed


def record_release():
    """Scenario 6's two paused-reply trials, framed then timeout, borrowers in name order."""
    def both_paused_trials():
        for release in ("framed", "timeout"):
            demo.release_trial(release, True)
    return record_pool(both_paused_trials, "release_trial", lambda release, split: release, in_name_order=True)


KIND_ORDER = {"borrowed": 0, "wrote": 1, "partial": 2, "read": 3, "checkin": 4}


def trials(recorder, by_kind=False):
    """{trial label: (its events sorted by exchange, stably, result)}.

    by_kind: within an exchange, draw borrow, write, read, checkin in that order,
    which is always a causal order; use it when the upstream's write and the
    proxy's read can race (a read served from leftover bytes waits for no write)."""
    found, current = {}, None
    for event in recorder.events:
        if event[0] == "trial":
            current = []
        elif event[0] == "trial end":
            key = (lambda e: (e[1], KIND_ORDER[e[0]])) if by_kind else (lambda e: e[1])
            found[event[1]] = (sorted(current, key=key), event[2])
        elif current is not None and event[0] in KIND_ORDER:
            current.append(event)
    return found


def owned_writes(events):
    """Each write as (exchange, connection, [(owner, bytes)]): the reply it was asked for
    belongs to the borrower whose request it answers, anything else in it to nobody."""
    borrower = {e[1]: e[2] for e in events if e[0] == "borrowed"}
    return [(e[1], e[2], [(owner, data) for owner, data in ((borrower.get(e[1], "?"), e[4]),
                                                            (NOBODY, e[3][len(e[4]):])) if data])
            for e in events if e[0] == "wrote"]


def pieces_of(writes, connection, start, end):
    """The (owner, bytes, (write index, part), exchange) pieces of connection's stream bytes start..end."""
    pieces, position = [], 0
    for index, (exchange, on, parts) in enumerate(writes):
        if on != connection:
            continue
        for part, (owner, data) in enumerate(parts):
            low, high = max(start, position), min(end, position + len(data))
            if low < high:
                pieces.append((owner, data[low - position:high - position], (index, part), exchange))
            position += len(data)
    return pieces


def stream_length(writes, connection):
    return sum(len(data) for _, on, parts in writes if on == connection for _, data in parts)


CHECKIN_LABELS = {"released": "checkin", "dirty": "closed as dirty", "discarded": "closed"}


def draw_pool_panel(svg, left, top, rule, events, shown_exchanges):
    """One trial as a timeline running down the page, from `top`; returns its bottom.

    Columns: what the upstream writes, who holds the connection, what the borrower
    gets. Bytes are coloured by the client whose request they answer; bytes a borrower
    gets that answer another request (or none) are outlined in red, with an arrow
    from the write that carried them."""
    requests = {e[1]: e[3] for e in events if e[0] == "borrowed"}
    writes = owned_writes(events)
    # A write no borrower read a byte of is left out: the trial ended before it mattered,
    # and whether it was written before the upstream closed is up to the scheduler.
    read_writes, consumed = set(), {}
    for _, _, _, reply, connection in (e for e in events if e[0] == "read"):
        start = consumed.get(connection, 0)
        consumed[connection] = start + len(reply)
        read_writes.update(index for _, _, (index, _), _ in pieces_of(writes, connection, start, start + len(reply)))
    several = len({e[4] for e in events if e[0] == "borrowed"}) > 1
    columns = {"upstream": left, "connection": left + 250, "gets": left + 470}
    svg.text(left, top, rule, 14, INK, bold=True)
    for name, label in (("upstream", "the upstream writes"), ("connection", "the connection"),
                        ("gets", "the borrower gets")):
        svg.text(columns[name], top + 26, label, 12, MUTED)
    y = top + 34
    first_part = len(svg.parts)   # the red arrows go under everything in the panel
    write_index, read_at, write_ends, lease_top = 0, {}, {}, {}
    silence_from, arrows = None, []
    write_numbers = iter(range(len(writes)))
    for event in (e for e in events if e[1] <= shown_exchanges):
        kind, k = event[0], event[1]
        if kind == "wrote" and next(write_numbers) not in read_writes:
            write_index += 1
            continue
        y += 30
        if kind == "borrowed":
            client, request, connection = event[2:]
            lease_top[k] = y - 18
            label = f"lent to {client}: {visible(request)}"
            svg.rect(columns["connection"] + 10, y - 14, text_width(label, 12) + 4, 18, "#ffffff")
            svg.text(columns["connection"] + 12, y, label, 12, INK)
            if several:
                svg.text(columns["connection"] + 12, y + 14, f"connection {connection}", 11, MUTED)
                y += 10
        elif kind == "wrote":
            if event[5] == "rest" and silence_from is not None:
                svg.line(columns["upstream"] + 10, silence_from, columns["upstream"] + 10, y - 20,
                         MUTED, 1.5, dash="3 4")
                svg.text(columns["upstream"] + 18, (silence_from + y - 20) / 2 + 4, "silence: the pause",
                         12, MUTED)
                silence_from = None
            x = columns["upstream"]
            for part, (owner, data) in enumerate(writes[write_index][2]):
                x += svg.bytes_box(x, y - 17, data, owner, 12, wrong=owner == NOBODY) + 2
                write_ends[write_index, part] = (x, y - 5)
            silence_from = y + 9 if event[5] == "first" else None
            write_index += 1
        elif kind == "partial":
            svg.text(columns["connection"] + 12, y, "no end of reply yet: reads on", 12, MUTED)
        elif kind == "read":
            client, reply, connection = event[2:]
            start = read_at.get(connection, 0)
            read_at[connection] = start + len(reply)
            x = columns["gets"]
            svg.text(x, y, f"{client}:", 12, INK, bold=True)
            x += 30
            for owner, piece, index, exchange in pieces_of(writes, connection, start, start + len(reply)):
                stale = owner == NOBODY or exchange != k   # bytes of another request's answer, or of none
                if stale:
                    arrows.append((write_ends[index], (x, y - 5)))
                x += svg.bytes_box(x, y - 17, piece, owner, 12, wrong=stale) + 2
            right = reply == answer(requests[k].rstrip(b"\n"))
            svg.text(x + 8, y, "right" if right else "wrong", 12, GREEN if right else RED, bold=True)
        elif kind == "checkin":
            client, outcome, connection = event[2:5]
            stroke = colours(client)[1]
            svg.rect(columns["connection"], lease_top[k], 6, y - 14 - lease_top[k], stroke, stroke)
            svg.line(columns["connection"], y - 6, columns["connection"] + 200, y - 6, stroke, 2)
            svg.text(columns["connection"] + 12, y + 8, CHECKIN_LABELS.get(outcome, outcome), 12, stroke,
                     bold=True)
            unread = stream_length(writes, connection) - read_at.get(connection, 0)
            if outcome != "released" and unread:
                svg.text(columns["connection"] + 12, y + 22, f"with {unread} bytes never read", 11, MUTED)
                y += 14
            y += 8
    with svg.behind(first_part):
        for (x1, y1), (x2, y2) in arrows:
            svg.arrow(x1 + 2, y1, x2 - 4, y2, RED, 2)
    answered = {writes[index][0] for index in read_writes}
    unread = [visible(requests[k]) for k in sorted(requests) if k <= shown_exchanges and k not in answered]
    if unread:
        y += 30
        svg.text(left, y, f"no borrower read the answers to {', '.join(unread)}: not drawn", 12, MUTED)
    return y


def tally(events):
    """(right, another client's answer, dirty closes, connections, borrows) over a whole trial."""
    asked = {e[1]: (e[2], e[3]) for e in events if e[0] == "borrowed"}
    reads = [(asked[e[1]], e[3]) for e in events if e[0] == "read"]
    right = sum(reply == answer(request.rstrip(b"\n")) for (_, request), reply in reads)
    others = sum(any(reply == answer(request.rstrip(b"\n")) for other, request in asked.values() if other != client)
                 for (client, _), reply in reads)
    dirty = sum(e[3] == "dirty" for e in events if e[0] == "checkin")
    return right, others, dirty, len({e[4] for e in events if e[0] == "borrowed"}), len(asked)


def draw_release(recorder):
    title = "Scenario 6: a reply written in two parts with a pause between, pool cap 1"
    svg = Svg(title)
    y = heading(svg, [title, "two trials of its paused-reply row: the framed rule against the timeout rule"])
    found = trials(recorder)
    bottoms = []
    for index, release in enumerate(("framed", "timeout")):
        events, right = found[release]
        if release == "framed":
            rule = 'release="framed": the connection goes back after the reply\'s \\n'
        else:
            timeout = next(e[5] for e in events if e[0] == "checkin")
            rule = f'release="timeout": it goes back after {timeout}s of silence'
        bottom = draw_pool_panel(svg, 16 + index * 760, y + 10, rule, events, SHOWN_EXCHANGES) + 36
        total = tally(events)[4]
        svg.text(16 + index * 760, bottom, f"right: {right}/{total}   (the first {SHOWN_EXCHANGES} of {total} "
                 "borrowers drawn)", 13, GREEN if right == total else RED, bold=True)
        bottoms.append(bottom)
    svg.legend(16, max(bottoms) + 30, [("A's bytes", *colours("A")), ("B's bytes", *colours("B")),
                                        ("C's bytes", *colours("C")),
                                        ("red: bytes of another client's answer", RED_FILL, RED)])
    svg.text(16, max(bottoms) + 52, "borrowers take the connection in name order "
             "(scaffolding, so every run draws the same picture)", 12, MUTED)
    return svg


def record_dishonest():
    return record_pool(demo.dishonest, "dishonest_trial", lambda pool_class: pool_class.__name__)


def draw_dishonest(recorder):
    title = "Scenario 9: an upstream that says one line nobody asked for"
    svg = Svg(title)
    found = trials(recorder, by_kind=True)
    extra = {data[len(honest):] for _, _, data, honest, _ in recorder.of_kind("wrote")} - {b""}
    y = heading(svg, [title, f"the upstream follows every reply with {' '.join(map(visible, sorted(extra)))} "
                             "in the same write; A and B take turns through a pool of one connection"])
    bottoms = []
    for index, (label, (events, _)) in enumerate(found.items()):
        rule = {"TrustingPool": "TrustingPool: keeps the bytes past a reply for the next borrower",
                "FramedProxy": "FramedProxy: closes a connection with bytes past a reply"}.get(label, label)
        bottom = draw_pool_panel(svg, 16 + index * 760, y + 10, rule, events, len(events)) + 36
        right, others, dirty, connections, borrows = tally(events)
        tone = GREEN if right == borrows else RED
        svg.text(16 + index * 760, bottom, f"right {right}/{borrows}   another client's answer {others}", 13,
                 tone, bold=True)
        svg.text(16 + index * 760, bottom + 20, f"dirty connections closed {dirty}   "
                 f"upstream connections opened {connections}", 13, INK)
        bottoms.append(bottom + 20)
    svg.legend(16, max(bottoms) + 30, [("A's bytes", *colours("A")), ("B's bytes", *colours("B")),
                                        ("red fill: the line nobody asked for", *colours(NOBODY)),
                                        ("red outline: not the answer to this request", "#ffffff", RED)])
    return svg


# --- Part two: the managed layer ------------------------------------------------------

def record_managed(scenario):
    """Run a managed_demo.py scenario; return the Recorder and what it printed.

    Logged, in the order the scenario's hooks and virtual clock impose (each client's
    events under its own lock):
      client (late_replies, fatal)          a ManagedClient is made; its connections count from 1
      sent (t, connection, call, queue)     a request is queued and about to be written
      timeout (t, connection, call, queue, ended)
                                            a call's deadline passed; the queue after it
      reply (t, connection, reply, settled, abandoned, queue, ended)
                                            a reply line arrived; the call it settled, if any
      move (t, before, after, reason)       the client's state changed
      set (names, policy, cache policy, threshold)
                                            a ManagedSet is made: its services named A, B ...
      shut down ()                          a client or a set shuts down: the scenario's cleanup
      call (t, request) / answered (reply,) a ManagedSet call begins / returns
      enabled (service, yes)                pick() asked the cache about a service
      attempt (t, number, service, result)  an attempt ended (the set's on_event)
      disabled (service, start, end, reason) the cache opened a window
      stopped / restarted (t, service)      an upstream stopped or came back
    A queue is the calls owed on the connection, oldest first, as (call, abandoned).
    """
    recorder = Recorder()
    state = {"connections": {}, "labels": {}, "clock": None, "names": {}}

    def connection_number(connection):
        return state["connections"].setdefault(connection, len(state["connections"]) + 1)

    def queue(connection):
        return tuple((state["labels"].get(call, "?"), call.abandoned) for call in connection.owed)

    def wrap_client_init(original):
        def __init__(client, addr, **options):
            original(client, addr, **options)
            state["connections"] = {}
            recorder.log("client", client.late_replies, client.msg_timeout_is_fatal)
        return __init__

    def wrap_send(original):
        def _send(client, connection, call, request, *args, **options):
            state["labels"][call] = request.decode().rstrip("\n")
            recorder.thread.connection = connection
            return original(client, connection, call, request, *args, **options)
        return _send

    def wrap_client_count(original):
        def count(client, name, amount=1):
            if name == "sent":   # under the client's lock, just after the call was queued
                connection = recorder.thread.connection
                recorder.log("sent", client.clock.now(), connection_number(connection),
                             state["labels"][connection.owed[-1]], queue(connection))
            original(client, name, amount)
        return count

    def wrap_time_out(original):
        def _time_out(client, connection, call, *args, **options):
            try:
                return original(client, connection, call, *args, **options)
            finally:
                recorder.log("timeout", client.clock.now(), connection_number(connection),
                             state["labels"][call], queue(connection), connection.ended)
        return _time_out

    def wrap_deliver(original):
        def _deliver(client, connection, reply, *args, **options):
            oldest = connection.owed[0] if connection.owed and not connection.ended else None
            settled = state["labels"].get(oldest) if oldest else None
            abandoned = oldest.abandoned if oldest else False
            result = original(client, connection, reply, *args, **options)
            recorder.log("reply", client.clock.now(), connection_number(connection), reply, settled,
                         abandoned, queue(connection), connection.ended)
            return result
        return _deliver

    def wrap_move(original):
        def _move(client, new_state, reason, *args, **options):
            recorder.log("move", client.clock.now(), client.state, new_state, reason)
            return original(client, new_state, reason, *args, **options)
        return _move

    def wrap_set_init(original):
        def __init__(managed_set, services, **options):
            original(managed_set, services, **options)
            state["clock"] = managed_set.clock
            state["names"] = {addr: kit.CLIENT_NAMES[index] for index, (addr, _) in enumerate(services)}
            cache = managed_set.rcache
            recorder.log("set", tuple(state["names"].values()), managed_set.policy, cache.setting("policy"),
                         cache.setting("threshold"))
        return __init__

    def wrap_shut_down(original):
        def shut_down(client_or_set, *args, **options):
            recorder.log("shut down")
            return original(client_or_set, *args, **options)
        return shut_down

    def wrap_call(original):
        def call(managed_set, request, *args, **options):
            recorder.log("call", managed_set.clock.now(), request)
            reply = original(managed_set, request, *args, **options)
            recorder.log("answered", reply)
            return reply
        return call

    def wrap_pick(original):
        def pick(managed_set, *args, **options):
            recorder.thread.picking = True
            try:
                return original(managed_set, *args, **options)
            finally:
                recorder.thread.picking = False
        return pick

    def wrap_is_enabled(original):
        def is_enabled(cache, addr, *args, **options):
            enabled = original(cache, addr, *args, **options)
            if getattr(recorder.thread, "picking", False):
                recorder.log("enabled", state["names"].get(addr, "?"), enabled)
            return enabled
        return is_enabled

    def wrap_note(original):
        def _note(managed_set, *event):
            if event[0] == "attempt":
                _, number, index, result = event
                name = kit.CLIENT_NAMES[index] if index is not None else "-"
                recorder.log("attempt", managed_set.clock.now(), number, name, result)
            original(managed_set, *event)
        return _note

    def wrap_cache_count(original):
        def count(cache, name, amount=1):
            if name == "disables":   # bumped just after the window joins `windows`
                key, start, end, reason = cache.windows[-1]
                recorder.log("disabled", state["names"].get(key, str(key)), start, end, reason)
            original(cache, name, amount)
        return count

    def wrap_upstream_event(kind):
        def make(original):
            def change(upstream):
                name = state["names"].get(upstream.addr)
                running = not upstream.closed
                if name and running == (kind == "stopped"):   # a change, not a repeated close()
                    recorder.log(kind, state["clock"].now(), name)
                original(upstream)
            return change
        return make

    with recorder:
        recorder.wrap(managed.ManagedClient, "__init__", wrap_client_init)
        recorder.wrap(managed.ManagedClient, "_send", wrap_send)
        recorder.wrap(managed.ManagedClient, "count", wrap_client_count)
        recorder.wrap(managed.ManagedClient, "_time_out", wrap_time_out)
        recorder.wrap(managed.ManagedClient, "_deliver", wrap_deliver)
        recorder.wrap(managed.ManagedClient, "_move", wrap_move)
        recorder.wrap(managed.ManagedSet, "__init__", wrap_set_init)
        recorder.wrap(managed.ManagedSet, "shut_down", wrap_shut_down)
        recorder.wrap(managed.ManagedClient, "shut_down", wrap_shut_down)
        recorder.wrap(managed.ManagedSet, "call", wrap_call)
        recorder.wrap(managed.ManagedSet, "pick", wrap_pick)
        recorder.wrap(managed.ManagedSet, "_note", wrap_note)
        recorder.wrap(managed.ReliabilityCache, "is_enabled", wrap_is_enabled)
        recorder.wrap(managed.ReliabilityCache, "count", wrap_cache_count)
        recorder.wrap(faults.FaultyUpstream, "close", wrap_upstream_event("stopped"))
        recorder.wrap(faults.FaultyUpstream, "restart", wrap_upstream_event("restarted"))
        _, printed = run_quietly(scenario)
    return recorder, printed


# --- 4. dirty-return.svg ---------------------------------------------------------------

NOTE_WIDTH = 30   # characters per line of a step's notes

def variants(recorder):
    """The events of each ManagedClient the scenario made, in order, after its `client` event."""
    found, collecting = [], False
    for event in recorder.events:
        if event[0] == "client":
            found.append((event[1:], []))
            collecting = True
        elif event[0] == "shut down":
            collecting = False
        elif collecting and event[0] in ("sent", "timeout", "reply", "move"):
            found[-1][1].append(event)
    return found


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
    """One client's events as steps: (header, what happened, tone, connection, queue, notes).

    A state change is logged before the step it belongs to (the timeout or reply
    that caused it is logged once handled, the connect before the send), so each
    change is noted under the next step."""
    steps, notes = [], []
    for event in events:
        kind, now = event[0], event[1]
        if kind == "move":
            before, after, reason = event[2:]
            if after == "up":
                notes.append("a connection opens")
            elif after != "connecting":   # connecting is on the way to up, or to a failure that says why
                notes.append(f"{before} -> {after}: {reason}")
            continue
        if kind == "sent":
            _, _, connection, call, owed = event
            steps.append((f"t={now}s  {call} sent", "", INK, connection, owed, notes))
        elif kind == "timeout":
            _, _, connection, call, owed, ended = event
            what = "its connection is destroyed" if ended else (
                "it stays owed, abandoned" if any(label == call for label, _ in owed) else "it leaves the queue")
            steps.append((f"t={now}s  {call} times out", what, INK, connection, None if ended else owed, notes))
        elif kind == "reply":
            _, _, connection, reply, settled, abandoned, owed, ended = event
            if settled is None:
                what, tone = "no call is owed it", INK
            elif abandoned:
                what, tone = f"discarded: {short(settled)} gave up", GREEN
            else:
                right = reply == answer(settled.encode())
                what, tone = f"handed to {short(settled)}" + ("" if right else ": WRONG"), GREEN if right else RED
            steps.append((f"reply {visible(reply)}", what, tone, connection, None if ended else owed, notes))
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
                     *[text_width(line, 11) for note in notes for line in textwrap.wrap(note, NOTE_WIDTH)],
                     sum(text_width(queued(label, abandoned), 12) + 14 for label, abandoned in owed or ()))
                 for _, steps in steps_per_variant for header, what, _, _, owed, notes in steps)
    column = widest + 16 + 30
    for (late_replies, fatal), steps in steps_per_variant:
        y += 16
        svg.text(left, y, variant_title(late_replies, fatal), 14, INK, bold=True)
        y += 14
        lines_of_notes = max(len(lines) for lines in [[line for note in step[5]
                             for line in textwrap.wrap(note, NOTE_WIDTH)] for step in steps])
        height = 112 + lines_of_notes * 14
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
            lines = [line for note in notes for line in textwrap.wrap(note, NOTE_WIDTH)]
            for number_of_line, line in enumerate(lines):
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
    events = recorder.events[:[e[0] for e in recorder.events].index("shut down")]   # not the cleanup
    _, names, policy, cache_policy, threshold = next(e for e in events if e[0] == "set")
    y = heading(svg, [title, f"policy {policy} over {' and '.join(names)}; reliability cache: policy "
                             f"{cache_policy}, threshold {threshold}"])
    disables = [e[1:] for e in events if e[0] == "disabled"]
    calls = []   # (t, [(service, result or None if skipped)])
    for event in events:
        if event[0] == "call":
            calls.append((event[1], []))
        elif event[0] == "enabled" and calls and not event[2]:
            calls[-1][1].append((event[1], None))
        elif event[0] == "attempt" and calls:
            calls[-1][1].append((event[3], event[4]))
    end = max([e[2] for e in disables] + [t for t, _ in calls])
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
    stops = [(e[1], e[2]) for e in events if e[0] == "stopped"]
    starts = [(e[1], e[2]) for e in events if e[0] == "restarted"]
    for (stopped_at, name), (started_at, _) in zip(stops, starts + [(end, None)]):
        svg.rect(x_of(stopped_at), y_life - 10, (started_at - stopped_at) * SECOND, 18, "#eeeeee", MUTED, 1,
                 dash="4 3")
        svg.text(x_of(stopped_at) + 6, y_life + 4, "stopped: refuses connections", 11, MUTED)
        if name and started_at < end:
            svg.text(x_of(started_at) + 6, y_life + 4, f"restarted at t={started_at}s", 11, GREEN, bold=True)
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


def record_all():
    """Run every picture's scenario once; return {file name: (Recorder, what it printed)}."""
    return {name: record() for name, (record, _) in PICTURES.items()}


def render_all(runs=None):
    """Draw every picture from `runs` (record_all() if not given); return {file name: SVG text}."""
    runs = runs or record_all()
    return {name: draw(runs[name][0]).render() for name, (_, draw) in PICTURES.items()}


def main(argv=None, render=None):
    """Write the pictures `render()` draws (this module's: render_all) into pictures/,
    or with --check compare them and exit 1 if any differs."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with pictures/, write nothing")
    options = parser.parse_args(argv)
    stale = []
    for name, svg in (render or render_all)().items():
        path = PICTURES_DIR / name
        if options.check:
            if not path.exists() or path.read_text(encoding="utf-8") != svg:
                stale.append(name)
        else:
            PICTURES_DIR.mkdir(exist_ok=True)
            path.write_text(svg, encoding="utf-8")
            print(f"wrote {path.relative_to(HERE)}")
    for name in stale:
        print(f"pictures/{name} differs from what the scenario draws now: run `make pictures`")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
