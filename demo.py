"""demo.py: the toy's argument, run on real sockets, as a transcript that is the
same bytes on every run.

    python3 demo.py                  every scenario, in order
    python3 demo.py --list           the scenarios' names
    python3 demo.py --only NAME      one scenario, under its number in the full run
    python3 demo.py --race [--trials N]
                                     the same questions unscripted: one run's numbers
    python3 demo.py --managed        the reliability layer's scenarios (managed.py)
    python3 demo.py --part3          framing for real: a real redis-server, and request
                                     ids (part3_demo.py; needs redis-server on PATH)

How it stays byte-identical: nothing it prints carries a port, a time or a
thread id, and no step sleeps. Every step waits on a hook (wait_<counter>(n))
for an event that really happened. The whole transcript is held back until
every scenario has finished, so a hook that times out prints no transcript at
all: the demo names the scenario on stderr and exits 1.
"""
import argparse
import contextlib
import io
import socket
import statistics
import sys

from scaffolding.faults import FaultyUpstream, TrustingPool
from scaffolding.kit import (KEY_WORDS, ROUNDS, Client, ask_in_turn, clients, keys_for,
                             parsed_line, request, run_concurrently, sent_line, show)
from tcp_proxy import answer, FramedProxy, NaiveProxy, PassthroughProxy, Upstream


# --- the scenarios, in the order the commentary reads them ---------------------

def interleave():
    """Two clients' bytes interleave on the one shared upstream connection."""
    with contextlib.ExitStack() as stack:
        upstream = stack.enter_context(Upstream())
        proxy = stack.enter_context(NaiveProxy(upstream.addr))
        a, b = clients(stack, proxy.addr, 2)
        proxy.wait_connections(2)
        a.send(b"GET alp")
        proxy.wait_forwarded(7)
        b.send(b"GET beta\n")
        proxy.wait_forwarded(16)
        upstream.wait_replies(1)
        first_error = len(answer(b"GET alpGET beta"))
        proxy.wait_routed(first_error)   # B's turn must be over before A speaks again
        a.send(b"ha\n")
        proxy.wait_forwarded(19)
        proxy.wait_routed(first_error + len(answer(b"ha")))
        proxy.close()
        print(sent_line(a))
        print(sent_line(b))
        print(parsed_line(upstream))
        print(f"  A received  {show(a.read_to_eof())}")
        print(f"  B received  {show(b.read_to_eof())}")
        sent = sum(len(chunk) for chunk in a.sent + b.sent)
        print(f"  bytes: {sent} sent, {proxy.forwarded} forwarded, "
              f"{upstream.bytes_in} received upstream")
        print(interleave_verdict([a.sent, b.sent], proxy.forwarded, upstream.bytes_in,
                                 upstream.parsed))


def interleave_verdict(sent_by_client, forwarded, received, parsed):
    """What scenario 1's rows show: whether the bytes add up, and how many of the
    requests the upstream parsed were requests some client sent."""
    sent = sum(len(chunk) for chunks in sent_by_client for chunk in chunks)
    meant = {line.decode() for chunks in sent_by_client for line in b"".join(chunks).splitlines()}
    nobody = sum(line not in meant for line in parsed)
    accounting = ("nothing lost, nothing doubled" if sent == forwarded == received
                  else f"{sent - received} bytes lost or doubled on the way")
    return f"  verdict: {accounting}, and the upstream parsed {nobody} requests that nobody sent"


def misdelivery(routing):
    """A then B send one whole request each; the replies are routed by `routing`."""
    with contextlib.ExitStack() as stack:
        upstream = stack.enter_context(Upstream(gate=2))   # no reply before both requests are in
        proxy = stack.enter_context(NaiveProxy(upstream.addr, routing=routing))
        a, b = clients(stack, proxy.addr, 2)
        proxy.wait_connections(2)
        a.send(b"GET alpha\n")
        proxy.wait_forwarded(10)
        b.send(b"GET beta\n")
        proxy.wait_forwarded(19)
        proxy.wait_routed(len(answer(b"GET alpha") + answer(b"GET beta")))
        proxy.close()
        print(sent_line(a))
        print(sent_line(b))
        print(parsed_line(upstream))
        received = {client.name: client.read_to_eof() for client in (a, b)}
        for name, data in received.items():
            print(f"  {name} received  {show(data)}")
        return received


ASKED = {"A": "alpha", "B": "beta"}   # scenarios 2 and 3: who asked for which key


def holdings(name, data):
    """Which of scenarios 2 and 3's answers one client's bytes hold, in words."""
    held = [("its own" if key == ASKED[name] else f"{key}'s answer")
            for key in ASKED.values() if answer(f"GET {key}".encode()) in data]
    return " and ".join(held) or "neither answer"


def holds_another(name, data):
    return any(answer(f"GET {key}".encode()) in data
               for key in ASKED.values() if key != ASKED[name])


def headline_verdict(received):
    return (f"  verdict: B holds {holdings('B', received['B'])} ({len(received['B'])} bytes); "
            f"A, who asked for alpha, holds {len(received['A'])}")


def broadcast_verdict(received):
    everything = all(answer(f"GET {key}".encode()) in data
                     for data in received.values() for key in ASKED.values())
    who = ("both clients hold both answers" if everything
           else "; ".join(f"{name} holds {holdings(name, data)}"
                          for name, data in received.items()))
    leaked = [name for name, data in received.items() if holds_another(name, data)]
    moral = ("the other routing rule leaks to everyone" if len(leaked) == len(received)
             else f"{len(leaked)} of {len(received)} clients hold another's answer")
    return f"  verdict: {who} ({len(received['A'])} and {len(received['B'])} bytes): {moral}"


def headline():
    print(headline_verdict(misdelivery("last")))


def broadcast():
    print(broadcast_verdict(misdelivery("broadcast")))


def many_clients(proxy_addr, count=8):
    """`count` clients at once, each asking for its own keys in turn; right answers in all."""
    with contextlib.ExitStack() as stack:
        crowd = clients(stack, proxy_addr, count)
        return sum(run_concurrently(ask_in_turn, *[(c, keys_for(i)) for i, c in enumerate(crowd)]))


def passthrough():
    with Upstream() as upstream, PassthroughProxy(upstream.addr) as proxy:
        right = many_clients(proxy.addr)
        proxy.wait_eofs(16)   # both directions of all 8 relays have ended
        print(f"  8 clients x {ROUNDS} requests, each client asking for its own keys "
              f"({', '.join(keys_for(0))} for A)")
        print(f"  right answers: {right}/24")
        print(f"  client connections: {proxy.connections}   upstream connections: "
              f"{upstream.connections}   ratio: {proxy.connections / upstream.connections:.1f}")
        print(passthrough_verdict(right, 24, proxy.connections, upstream.connections))


def right_or_wrong(right, asked):
    return "every answer right" if right == asked else f"{asked - right} of {asked} answers wrong"


def passthrough_verdict(right, asked, client_connections, upstream_connections):
    sharing = ("no multiplexing at all: one upstream connection per client"
               if client_connections == upstream_connections
               else f"{client_connections} client connections on {upstream_connections} upstream")
    return f"  verdict: {right_or_wrong(right, asked)}, and {sharing}"


def pool_caps():
    print(f"  8 clients x {ROUNDS} requests at once, each waiting for its answer: "
          "at most 8 in flight")
    print("  pool_cap  right  connections opened  requests per connection")
    rows = []
    for cap in (1, 2, 4, 8, 16):
        # scaffolding: holding replies until min(cap, 8) requests are in forces the
        # pool to open every connection it can, so the count does not depend on luck
        with Upstream(gate=min(cap, 8)) as upstream, \
                FramedProxy(upstream.addr, pool_cap=cap) as proxy:
            right = many_clients(proxy.addr)
            print(f"  {cap:>8}  {right:>2}/24  {proxy.opened:>18}  {24 / proxy.opened:>23.1f}")
            rows.append((cap, right, proxy.opened))
    print(pool_caps_verdict(rows, asked=24, in_flight=8))


def pool_caps_verdict(rows, asked, in_flight):
    """rows: (cap, right answers, connections opened) per cap."""
    wrong_rows = sum(right != asked for _, right, _ in rows)
    correctness = ("right on every row" if wrong_rows == 0
                   else f"wrong answers on {wrong_rows} of {len(rows)} rows")
    cap, _, opened = rows[-1]
    if all(opened == min(cap, in_flight) for cap, _, opened in rows):
        growth = (f"connections opened = min(pool_cap, requests in flight), "
                  f"so cap {cap} opens {opened}")
    else:
        growth = "connections opened do not follow min(pool_cap, requests in flight)"
    return f"  verdict: {correctness}; {growth}"


SPLIT_AT = 6   # scenario 6's split upstream writes a reply's first SPLIT_AT bytes, then pauses


def release_rules():
    print("  release  upstream writes each reply      right")
    right = {}
    for release in ("framed", "timeout"):
        for split in (False, True):
            received = release_received(release, split)
            right[release, split] = right_of(received)
            pattern = "in two parts, paused between" if split else "in one write"
            print(f"  {release:<7}  {pattern:<30}  {right[release, split]}/8")
    heads, ends = paused_deliveries(received)   # the last trial: timeout, paused
    print(f"  timeout, paused: {heads} client received the first {SPLIT_AT} bytes "
          "of its own answer, "
          f"{ends} the end of another client's answer first")
    print(release_verdict(right, asked=8, paused=(heads, ends)))


def paused_deliveries(received):
    """received: (key, bytes its client read) per client of a paused trial. How many
    read just the first SPLIT_AT bytes of their own answer, and how many began with
    the end of another client's answer (the part after SPLIT_AT, or all of it)."""
    whole = {word: answer(request(word)[:-1]) for word, _ in received}
    heads = sum(data == whole[word][:SPLIT_AT] for word, data in received)
    ends = sum(any(data.startswith(whole[other][cut:]) for other in whole if other != word
                   for cut in (0, SPLIT_AT)) for word, data in received)
    return heads, ends


def release_verdict(right, asked, paused=(0, 0)):
    """right: (release rule, reply split?) -> right answers of `asked`; paused: what
    paused_deliveries() found in the timeout rule's paused trial."""
    if right["framed", True] == right["framed", False] == asked:
        framed = "the delimiter never notices the pause"
    else:
        framed = f"the framed pool gets {right['framed', True]}/{asked} when the reply pauses"
    heads, ends = paused
    if right["timeout", True] == 0 and heads + ends == asked:
        timeout = (f"the timeout rule ends a reply at its pause, and {ends} of {asked} clients "
                   f"begin with the end of someone else's answer")
    elif right["timeout", True] == asked:
        timeout = "the timeout pool survives the pause too"
    else:
        timeout = f"the timeout pool gets {right['timeout', True]}/{asked} when the reply pauses"
    return f"  verdict: {framed}; {timeout}"


def release_trial(release, split):
    """8 clients, one request each, through a pool of one connection; right answers."""
    return right_of(release_received(release, split))


def right_of(received):
    """How many (key, bytes read) pairs hold exactly the answer to a GET of their key."""
    return sum(data == answer(request(word)[:-1]) for word, data in received)


def release_received(release, split):
    """release_trial's run: (key asked for, bytes its client read) per client."""
    proxy = None

    def until_borrower_decides(reply_number):
        # The rest of the reply waits for the borrower's verdict on the first part:
        # framed goes back for more, timeout checks the connection in. A real upstream
        # pauses for a while; this one pauses exactly until that event. Under the
        # timeout rule it also waits for the next borrower's request, so the rest and
        # the next reply's head are written back to back, well within the silence the
        # rule waits for: no scheduling delay can change the outcome.
        proxy.wait_until(lambda: proxy.partial_replies >= reply_number
                         or proxy.released >= reply_number,
                         f"the borrower's decision on reply {reply_number}")
        if release == "timeout" and reply_number < len(crowd):
            upstream.wait_requests(reply_number + 1)

    with contextlib.ExitStack() as stack:
        upstream = stack.enter_context(
            Upstream(split_at=SPLIT_AT, pause=until_borrower_decides) if split else Upstream())
        proxy = stack.enter_context(FramedProxy(upstream.addr, pool_cap=1, release=release))
        crowd = clients(stack, proxy.addr, 8)
        for number, (client, word) in enumerate(zip(crowd, KEY_WORDS), 1):
            client.send(request(word))
            client.sock.shutdown(socket.SHUT_WR)   # one request: the proxy closes after its reply
            # it has the connection: the next borrows after it, in name order
            upstream.wait_requests(number)
        return [(word, client.read_to_eof()) for client, word in zip(crowd, KEY_WORDS)]


def serialised():
    with contextlib.ExitStack() as stack:
        upstream = stack.enter_context(Upstream())
        proxy = stack.enter_context(NaiveProxy(upstream.addr))
        crowd = clients(stack, proxy.addr, 8)
        right = 0
        for round_number in range(ROUNDS):   # one request in flight at any moment
            for index, client in enumerate(crowd):
                right += ask_in_turn(client, keys_for(index)[round_number:round_number + 1])
        print(f"  8 clients take turns, {ROUNDS} rounds, one request in flight at a time")
        print(f"  right answers: {right}/24")
        print(f"  client connections: {proxy.connections}   upstream connections: "
              f"{upstream.connections}   ratio: {proxy.connections / upstream.connections:.1f}")
        print(serialised_verdict(right, 24))


def serialised_verdict(right, asked):
    if right == asked:
        return ("  verdict: the blind relay is right when only one answer can be in flight: "
                "that is serialisation, not multiplexing")
    return (f"  verdict: the blind relay gets {asked - right} of {asked} wrong "
            "even with one answer in flight")


def half_close_trial(half):
    """A client sends one request, then shutdown(SHUT_WR), while the upstream still
    holds the reply; returns what the client received before its EOF."""
    with Upstream() as upstream, PassthroughProxy(upstream.addr, half_close=half) as proxy:
        upstream.pause = lambda reply_number: proxy.wait_eofs(1)   # reply only after the EOF
        client = Client("A", proxy.addr)
        client.send(b"GET alpha\n")
        client.sock.shutdown(socket.SHUT_WR)
        received = client.read_to_eof()
        client.close()
        return received


def half_close():
    received = {}
    for half in (True, False):
        rule = "shutdown(SHUT_WR)" if half else "close both sides"
        received[half] = half_close_trial(half)
        print(f"  half_close={half!s:<5}  on the client's EOF: {rule:<17}  "
              f"A received {show(received[half])}")
    print(half_close_verdict(received, answer(b"GET alpha")))


def half_close_verdict(received, whole):
    """received: half_close -> the bytes A read before its EOF; whole: the full reply."""
    def delivered(data):
        return "the whole reply" if data == whole else f"{len(data)} of its {len(whole)} bytes"
    passing = f"passing the EOF on as a half-close delivers {delivered(received[True])}"
    if received[False] == b"":
        closing = "closing forgets that the other direction was still open"
    else:
        closing = f"closing both sides delivers {delivered(received[False])}"
    return f"  verdict: {passing}; {closing}"


def dishonest_trial(pool_class):
    """A and B take turns through a pool of one connection to an upstream that follows
    every reply with EXTRA; returns each client's requests and replies, and the proxy."""
    with FaultyUpstream(every="extra") as upstream, pool_class(upstream.addr) as proxy, \
            contextlib.ExitStack() as stack:
        crowd, received = clients(stack, proxy.addr, 2), {"A": [], "B": []}
        for round_number in range(ROUNDS):
            for index, client in enumerate(crowd):
                client.send(request(keys_for(index)[round_number]))
                received[client.name].append(client.read_line())
        return received, proxy


def dishonest():
    print("  the upstream follows every reply with b'EXTRA\\n' in the same write;")
    print(f"  A and B take turns, {ROUNDS} requests each, through a pool of one connection")
    asked = {name: [request(key) for key in keys_for(index)] for index, name in enumerate("AB")}
    expected = {name: [answer(line[:-1]) for line in lines] for name, lines in asked.items()}
    rows = {}
    for pool_class in (TrustingPool, FramedProxy):
        received, proxy = dishonest_trial(pool_class)
        right = sum(got == want for name in "AB"
                    for got, want in zip(received[name], expected[name]))
        others = sum(got in expected[other] for name, other in ("AB", "BA")
                     for got in received[name])
        print(f"  {pool_class.__name__}:")
        for name in "AB":
            print(f"    {name} asked for {', '.join(keys_for('AB'.index(name)))}  received "
                  + ", ".join(repr(line) for line in received[name]))
        print(f"    right {right}/6   another client's answer {others}   "
              f"dirty connections closed {proxy.dirty}   "
              f"upstream connections opened {proxy.opened}")
        rows[pool_class.__name__] = received, right, proxy.dirty
    print(dishonest_verdict(rows, expected))


def dishonest_verdict(rows, expected, lie=b"EXTRA\n"):
    """rows: pool name -> (what each client received, right answers, dirty closes);
    expected: each client's right answers, in the order it asked."""
    trusting, trusting_right, _ = rows["TrustingPool"]
    in_turn = [trusting[name][turn] for turn in range(ROUNDS) for name in "AB"]   # borrowers' order
    stream = [line for turn in range(ROUNDS) for name in "AB"
              for line in (expected[name][turn], lie)]
    asked = len(in_turn)
    if trusting_right == asked:
        trust = "the pool that trusts hands out every answer right"
    elif in_turn == stream[:asked]:   # borrower k read line k of the stream; its answer lies on
        shifts = [stream.index(expected[name][turn]) - (2 * turn + (name == "B"))
                  for turn in range(ROUNDS) for name in "AB"]
        trust = (f"in turn, the borrowers read {', '.join(map(str, shifts))} lines "
                 "behind their own answers: "
                 + ("each lie adds one" if shifts == list(range(asked)) else "the shift varies"))
    else:
        trust = f"the pool that trusts hands out {asked - trusting_right} of {asked} wrong"
    checked, checked_right, dirty = rows["FramedProxy"]
    errors = sum(line.startswith(b"ERR ") for name in "AB" for line in checked[name])
    closes = "closes the connection it was read on" if dirty else "closes no connection"
    wrong = asked - checked_right - errors   # an ERR line is no answer, but no one else's either
    handed = "nothing wrong" if not wrong else f"{wrong} of {asked} wrong"
    if errors:
        handed += f" ({errors} of {asked} answered with an error)"
    return f"  verdict: {trust}; the pool that checks {closes} and hands out {handed}"


SCENARIOS = [
    ("interleave", "Two clients' bytes interleave on one upstream socket", interleave),
    ("headline", "Whole requests, one after the other", headline),
    ("broadcast", "The other routing rule: broadcast", broadcast),
    ("passthrough", "One upstream connection per client", passthrough),
    ("pool", "A pool that parses, cap by cap", pool_caps),
    ("release", "Release rule x upstream write pattern, pool cap 1", release_rules),
    ("boundary", "The blind relay with one request in flight", serialised),
    ("half-close", "A client half-closes while the upstream still holds its reply",
     half_close),
    ("dishonest", "An upstream that says one line nobody asked for", dishonest),
]


# --- --race: the same questions, unscripted ------------------------------------------

RACE_READ_TIMEOUT = 0.2   # an unanswered request counts as wrong after this long


def naive_trial(routing, client_count):
    """One unscripted trial through NaiveProxy; returns the wrong answers."""
    with contextlib.ExitStack() as stack:
        upstream = stack.enter_context(Upstream())
        proxy = stack.enter_context(NaiveProxy(upstream.addr, routing=routing))
        crowd = clients(stack, proxy.addr, client_count, timeout=RACE_READ_TIMEOUT)
        proxy.wait_connections(client_count)

        def ask(client, keys):
            right = 0
            for key in keys:
                with contextlib.suppress(OSError):   # a read that timed out: that answer is wrong
                    right += ask_in_turn(client, [key])
            return right

        right = run_concurrently(ask, *[(c, keys_for(i)) for i, c in enumerate(crowd)])
        return client_count * ROUNDS - sum(right)


def pool_trial(cap):
    """One ungated trial through FramedProxy; returns (wrong answers, connections opened)."""
    with Upstream() as upstream, FramedProxy(upstream.addr, pool_cap=cap) as proxy:
        return 24 - many_clients(proxy.addr), proxy.opened


def spread(values):
    return (f"min {min(values)}, median {statistics.median(values):g}, max {max(values)}"
            f"   (per trial: {' '.join(map(str, values))})")


def race(trials):
    print(f"demo.py --race: {trials} trials per row, no gate, no scripting.")
    print("These numbers are one run's; yours will differ. The demo proper stays scripted.")
    print()
    print(f"Naive relay, 8 clients x {ROUNDS} requests, wrong answers per trial (of 24):")
    for routing in ("last", "broadcast"):
        print(f"  {routing:<9}  {spread([naive_trial(routing, 8) for _ in range(trials)])}")
    print()
    print(f"The cliff: routing 'last', {ROUNDS} requests per client, wrong answers per trial:")
    for count in (1, 2):
        wrong = [naive_trial("last", count) for _ in range(trials)]
        print(f"  {count} client{'s' if count > 1 else ' '} (of {count * ROUNDS})  {spread(wrong)}")
    print()
    print(f"FramedProxy ungated, 8 clients x {ROUNDS} requests:")
    print("  pool_cap  wrong answers in all  connections opened")
    for cap in (1, 2, 4, 8, 16):
        results = [pool_trial(cap) for _ in range(trials)]
        opened = [conns for _, conns in results]
        print(f"  {cap:>8}  {sum(w for w, _ in results):>6} of {24 * trials:<11}  "
              f"{min(opened)} to {max(opened)}")


# --- the runner -------------------------------------------------------------------

def run(scenarios, only=None):
    """Run the scenarios (or the one named `only`, under the number it has in the full
    run); print the transcript only if every one of them finished."""
    transcript = io.StringIO()
    for number, (name, title, scenario) in enumerate(scenarios, 1):
        if only not in (None, name):
            continue
        with contextlib.redirect_stdout(transcript):
            print(f"== {number}. {title} ==")
            try:
                scenario()
            except (TimeoutError, OSError) as error:
                sys.stderr.write(f"demo.py: scenario {name!r} failed: {error}\n")
                return 1
            print()
    sys.stdout.write(transcript.getvalue())
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--list", action="store_true", help="name the scenarios and stop")
    parser.add_argument("--only", metavar="NAME", help="run one scenario")
    parser.add_argument("--race", action="store_true",
                        help="the unscripted twin: one run's numbers")
    parser.add_argument("--trials", type=int, default=20, help="trials per --race row (20)")
    parser.add_argument("--managed", action="store_true", help="the reliability layer's scenarios")
    parser.add_argument("--part3", action="store_true", help="Part three: real Redis, request ids")
    options = parser.parse_args(argv)
    if options.race:
        race(options.trials)
        return 0
    scenarios = SCENARIOS
    if options.managed:
        from part2 import managed_demo   # only this flag needs the second part
        scenarios = managed_demo.MANAGED_SCENARIOS
    if options.part3:
        from part3 import part3_demo   # only this flag needs Part three (and redis-server)
        from part3 import redis_server
        if not redis_server.redis_available():
            print(redis_server.INSTALL_HINT)
            return 0
        scenarios = part3_demo.PART3_SCENARIOS
    if options.list:
        for name, title, _ in scenarios:
            print(f"{name:<12} {title}")
        return 0
    if options.only and options.only not in [name for name, _, _ in scenarios]:
        parser.error(f"no scenario named {options.only!r}; --list names them")
    return run(scenarios, options.only)


if __name__ == "__main__":
    sys.exit(main())
