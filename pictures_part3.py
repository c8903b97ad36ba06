"""pictures_part3.py: Part three's pictures, drawn from the scenarios' own runs.

    python3 pictures_part3.py            run the scenarios, rewrite pictures/part3-*.svg
    python3 pictures_part3.py --check    run them, and exit 1 if a checked-in picture differs

The same method as pictures.py, whose Recorder, Svg and drawing helpers this
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
    PICTURES, render_all(), main()

Same bytes on every run: no port, time or id in a picture. A pool of one connection
lends it to one borrower at a time, so the order of the logged reads is the order
the borrowers held it; Redis answers one connection's commands in order, so the
n-th reply on a connection answers the n-th request sent on it.
"""
import argparse
import sys

import part3_demo
import resp
import tcp_proxy
from pictures import (GREEN, INK, MUTED, PICTURES_DIR, RED, RED_FILL, HERE, Recorder, Svg, colours,
                      heading, run_quietly, text_width, visible)
from tcp_proxy import FramedProxy

NEVER_READ = "never read"   # the owner label of stream bytes no borrower took


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

    def wrap_handle(original):
        def handle(proxy, conn):
            recorder.thread.conn = conn
            original(proxy, conn)
        return handle

    def wrap_exchange(original):
        def exchange(proxy, request):
            recorder.thread.client = recorder.peer_name(recorder.thread.conn)   # it has sent: it is named
            recorder.thread.request = request
            return original(proxy, request)
        return exchange

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
        recorder.wrap(FramedProxy, "handle", wrap_handle)
        recorder.wrap(FramedProxy, "exchange", wrap_exchange)
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


# --- the pictures, and the command line ------------------------------------------------

PICTURES = {   # file name -> (run the scenarios: (Recorder, what they printed), draw from the Recorder)
    "part3-redis-line-pool.svg": (record_redis_pools, draw_redis_line_pool),
}


def render_all():
    """Run each picture's scenarios and draw it; return {file name: SVG text}."""
    return {name: draw(record()[0]).render() for name, (record, draw) in PICTURES.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with pictures/, write nothing")
    options = parser.parse_args(argv)
    if not part3_demo.redis_available():
        print(part3_demo.INSTALL_HINT)
        return 1
    stale = []
    for name, svg in render_all().items():
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
