"""part3_demo: the scenarios of `python3 demo.py --part3`, framing for real.

The first four run against a real redis-server found on PATH, one started for
each scenario: the misdelivery of Part one again, this time with RESP, whose
bulk string reply spans two lines. The last three need no Redis: request ids
(tagged.py) let replies come back in any order over one connection.

Map of the module, in reading order:

    (part3.redis_server starts the private redis-server and its control connection)
    naive_redis ... resp_pool           the four scenarios against Redis
    out_of_order, slow_key, late_reply  the three scenarios of request ids

The transcript is the same bytes on every run: no port, time or thread id is
printed, and no step sleeps. Against Redis the order of events is fixed by the
proxies' hooks and by Redis itself (it answers one connection's commands in
order, and BLPOP waits for a push); against TaggedUpstream, by its pause(key) hook.
"""
import contextlib
import socket
import threading

import tcp_proxy
from part3 import resp
from part3.tagged import TaggedClient, TaggedError, TaggedUpstream
from scaffolding import kit
from scaffolding.faults import TrustingPool
from scaffolding.kit import ROUNDS, Client, clients, keys_for, run_concurrently, sent_line, show
from part3.redis_server import read_resp, redis_and_control
from ground.server import Hooks
from tcp_proxy import answer, FramedProxy, NaiveProxy
from part3.framed import SessionProxy


def stored(control, values):
    """SET each key to its value; the line printed says what Redis holds."""
    for key, value in values.items():
        control.command(f"SET {key} {value}")
    print("  redis holds  " + ", ".join(f"{key}={value}" for key, value in values.items()))


def inline(key):
    return b"GET %s\r\n" % key.encode()


def bulk(value):
    """What Redis answers a GET of a key holding value."""
    return b"$%d\r\n%s\r\n" % (len(value), value.encode())


# --- the Redis scenarios -----------------------------------------------------------------

def naive_redis():
    with contextlib.ExitStack() as stack:
        redis, control = redis_and_control(stack)
        stored(control, {"b": "world"})
        proxy = stack.enter_context(NaiveProxy(redis.addr))
        a, b = clients(stack, proxy.addr, 2)
        proxy.wait_connections(2)
        # A waits for a job; Redis answers a connection's commands in order, so B's GET,
        # on the same upstream connection, waits behind it: the gate of Part one, here
        # done by Redis itself
        a.send(b"BLPOP jobs-a 0\r\n")
        proxy.wait_forwarded(len(a.sent[0]))
        b.send(inline("b"))
        proxy.wait_forwarded(len(a.sent[0] + b.sent[0]))
        control.command("RPUSH jobs-a hello")
        blpop_reply = b"*2\r\n$6\r\njobs-a\r\n" + bulk("hello")
        proxy.wait_routed(len(blpop_reply + bulk("world")))
        proxy.close()
        print(sent_line(a) + "   (wait for a job on the list jobs-a)")
        print(sent_line(b))
        print("  then another Redis client pushed the job 'hello' onto jobs-a")
        received = {client.name: client.read_to_eof() for client in (a, b)}
        for name, data in received.items():
            print(f"  {name} received  {show(data)}")
        print(naive_redis_verdict(received, job=blpop_reply, value=bulk("world")))


def naive_redis_verdict(received, job, value):
    """received: client -> bytes; job: the reply to A's BLPOP; value: the reply to B's GET."""
    held = [what for what, reply in (("A's job", job), ("its own value", value))
            if reply in received["B"]]
    moral = ("A blind relay is as wrong in front of Redis as in front of the toy"
             if job in received["B"]
             else "A's job did not reach B")
    return (f"  verdict: B holds {' and '.join(held) or 'neither reply'} "
            f"({len(received['B'])} bytes); "
            f"A holds {len(received['A'])}. {moral}")


def one_at_a_time(proxy_addr, keys, stack):
    """Clients A, B, C ... each send GET <its key> and read one line, in turn."""
    crowd = clients(stack, proxy_addr, len(keys))
    replies = []
    for client, key in zip(crowd, keys):
        client.send(inline(key))
        replies.append(client.read_line())
    return crowd, replies


def whose(reply, key, values):
    """What a reply read by line is, for the transcript: right, a head, or someone's value."""
    if reply == bulk(values[key]):
        return "right"
    for owner, value in values.items():
        if reply == value.encode() + b"\r\n":
            return "its own value" if owner == key else f"WRONG: the value of {owner}"
    return "the first line of a reply" if reply.startswith(b"$") else "WRONG"


# scenarios 2 and 3: A's, B's and C's keys
LINE_POOL_VALUES = {"a": "hello", "b": "world", "c": "again"}


def borrowed_in_turn(pool_class, stack):
    """A pool_class pool of one connection, framing by line, in front of a redis-server that
    holds LINE_POOL_VALUES, borrowed by A, B and C in turn: (the pool, the clients, what each
    read)."""
    redis, control = redis_and_control(stack)
    stored(control, LINE_POOL_VALUES)
    pool = stack.enter_context(pool_class(redis.addr, pool_cap=1, framing=tcp_proxy.LINES))
    crowd, replies = one_at_a_time(pool.addr, list(LINE_POOL_VALUES), stack)
    return pool, crowd, replies


def line_pool():
    values = LINE_POOL_VALUES
    with contextlib.ExitStack() as stack:
        pool, crowd, replies = borrowed_in_turn(TrustingPool, stack)
        for client, key, reply in zip(crowd, values, replies):
            print(f"  {client.name} asked GET {key:<2} got {show(reply):<21} "
                  f"{whose(reply, key, values)}")
        print(f"  connections opened: {pool.opened}")
        print(line_pool_verdict(replies, values))


def line_pool_verdict(replies, values):
    """replies: what A, B, C ... read, in turn; values: key -> value, in the same order."""
    keys = list(values)
    first = bulk(values[keys[0]])
    head, tail = first[:first.index(b"\r\n") + 2], first[first.index(b"\r\n") + 2:]
    if replies[0] != head:
        return f"  verdict: A read {replies[0]!r}, not the first line of its reply alone"
    if replies[1] == tail:
        return (f"  verdict: the line framing stops after {head!r}; the rest, {tail!r}, "
                "stays on the connection and B takes A's value for its own "
                "(redis-py's CVE-2023-28858 class)")
    return f"  verdict: the line framing stops after {head!r}; B read {replies[1]!r}, not A's value"


def checked_line_pool():
    values = LINE_POOL_VALUES
    with contextlib.ExitStack() as stack:
        proxy, crowd, replies = borrowed_in_turn(FramedProxy, stack)
        for client, key, reply in zip(crowd, values, replies):
            print(f"  {client.name} asked GET {key:<2} got {show(reply)}")
        # what a misdelivery looks like
        tails = {value.encode() + b"\r\n" for value in values.values()}
        misdelivered = sum(reply in tails for reply in replies)
        print(f"  connections opened: {proxy.opened}   closed as out of step: {proxy.dirty}   "
              f"values delivered to anyone: {misdelivered}")
        right = sum(reply == bulk(values[key]) for key, reply in zip(values, replies))
        print(checked_line_pool_verdict(right, proxy.dirty, misdelivered, len(replies)))


def checked_line_pool_verdict(right, dirty, misdelivered, asked):
    if right or dirty != asked or misdelivered:
        return (f"  verdict: {right} of {asked} right, {dirty} closed as out of step, "
                f"{misdelivered} values delivered to another client")
    return ("  verdict: still the wrong framing, so no right answer, "
            "but fits() sees that b'$5\\r\\n' "
            "cannot answer a GET of the line protocol: an ERR line and a closed connection, "
            "never another's value")


def resp_pool():
    keys = [key for index in range(8) for key in keys_for(index)]
    values = {key: key.upper() for key in keys}
    with contextlib.ExitStack() as stack:
        redis, control = redis_and_control(stack)
        for key, value in values.items():
            control.command(f"SET {key} {value}")
        control.command("RPUSH list one two")
        print(f"  redis holds  {len(values)} keys (alpha1=ALPHA1 ... hotel3=HOTEL3) "
              "and list=[one, two]")
        proxy = stack.enter_context(SessionProxy(redis.addr, pool_cap=1, framing=resp.RESP))
        single = Client("A", proxy.addr)
        stack.callback(single.close)
        for line in ("GET alpha1", "GET missing", "LRANGE list 0 -1", "PING"):
            single.send(line.encode() + b"\r\n")
            print(f"  A sent {line!r:<20} got {show(read_resp(single))}")
        crowd = clients(stack, proxy.addr, 8)

        def ask(client, client_keys):
            right = 0
            for key in client_keys:
                client.send(inline(key))
                right += read_resp(client) == bulk(values[key])
            return right

        right = sum(run_concurrently(ask, *[(client, keys_for(index))
                                                for index, client in enumerate(crowd)]))
        print(f"  8 clients x {ROUNDS} GETs at once through one connection: right {right}/24, "
              f"wrong {24 - right}, connections opened {proxy.opened}")
        print(resp_pool_verdict(right, 24))


def resp_pool_verdict(right, asked):
    if right == asked:
        return ("  verdict: the parse is RESP's (type byte, length, element count), "
                "so the pool lends the connection only at a reply's real end")
    return (f"  verdict: {asked - right} of {asked} wrong: "
            "the pool lent the connection before a reply's end")


# --- request ids (no Redis) ---------------------------------------------------------------

def in_background(function, *args):
    """The call on a thread of its own; .result() joins it (a TaggedError is an outcome)."""
    return kit.Background(function, *args, expected=TaggedError)


def start_calls(client, lines):
    """Start a call per line, each once the one before it is on the wire, so ids go 1, 2, 3..."""
    calls = []
    for number, line in enumerate(lines, 1):
        calls.append(in_background(client.call, line.encode() + b"\n"))
        client.wait_sent(number)
    return calls


def answered_in_order(upstream, keys):
    """A pause hook: the reply to keys[i] is written only after i replies have been
    (counting every reply the upstream wrote); a key not in keys is not held."""
    position = {key: index for index, key in enumerate(keys)}

    def pause(key):
        if key in position:
            upstream.wait_until(lambda: upstream.replies >= position[key] or upstream.closed,
                                f"reply {position[key] + 1} of {keys}")
    return pause


def out_of_order():
    lines = ["GET alpha", "GET bravo", "GET charlie"]
    with TaggedUpstream() as upstream, TaggedClient(upstream.addr) as client:
        upstream.pause = answered_in_order(upstream, ["charlie", "alpha", "bravo"])
        calls = start_calls(client, lines)
        results = [call.result() for call in calls]
        upstream.wait_replies(len(lines))   # counted just after each write: callers may be first
        print("  upstream read    " + ", ".join(repr(line) for line in upstream.parsed))
        print("  upstream wrote   " + ", ".join(repr(line) for line in upstream.written))
        right = 0
        for name, line, result in zip("ABC", lines, results):
            verdict = "right" if result == answer(line.encode()).decode().rstrip("\n") else "WRONG"
            right += verdict == "right"
            print(f"  {name} called {line!r:<13} got {result!r:<24} {verdict}")
        print(f"  connections: {upstream.connections}")
        print(out_of_order_verdict(upstream.written, right, len(lines)))


def out_of_order_verdict(written, right, asked):
    """written: the upstream's reply lines, '<id> <key>=<value>', in the order it wrote them."""
    order = ", ".join(line.split(" ", 1)[1].split("=")[0] for line in written)
    found = ("each id found its caller" if right == asked
             else f"{asked - right} of {asked} callers got another's reply")
    return f"  verdict: the replies left in the order {order}; {found}"


def slow_key():
    fast = ["GET a", "GET b", "GET c"]
    held = threading.Event()
    with TaggedUpstream() as upstream, TaggedClient(upstream.addr) as client:
        fast_in_order = answered_in_order(upstream, [line.split()[1] for line in fast])
        upstream.pause = lambda key: (held.wait(Hooks.hook_timeout) if key == "slow"
                                      else fast_in_order(key))
        calls = start_calls(client, ["GET slow"] + fast)
        # with head-of-line blocking: a hook timeout
        fast_results = [call.result() for call in calls[1:]]
        upstream.wait_replies(len(fast))
        slow_written_first = any(line.endswith(answer(b"GET slow").decode().rstrip("\n"))
                                 for line in upstream.written)
        fast_right = fast_results == [answer(line.encode()).decode().rstrip("\n") for line in fast]
        print(f"  with ids: GET slow sent first and held; the fast calls returned "
              f"{', '.join(map(repr, fast_results))}")
        print(f"  upstream wrote   {', '.join(map(repr, upstream.written))}   (slow still held)")
        held.set()
        print(f"  then GET slow -> {calls[0].result()!r}")
    release = threading.Event()
    with TaggedUpstream(tagged=False) as upstream:
        upstream.pause = lambda key: release.wait(Hooks.hook_timeout) if key == "slow" else None
        with socket.create_connection(upstream.addr, timeout=Hooks.hook_timeout) as sock:
            sock.sendall(b"GET slow\nGET a\nGET b\nGET c\n")
            upstream.wait_ready(3)
            held_back = upstream.ready - upstream.replies
            print(f"  without ids, pipelined in order: while GET slow is held, replies ready "
                  f"{upstream.ready}, written {upstream.replies}")
            release.set()
            upstream.wait_replies(4)
            print(f"  upstream wrote   {', '.join(map(repr, upstream.written))}   "
                  "(in order, after slow)")
    print(slow_key_verdict(fast_right and not slow_written_first, held_back, len(fast)))


def slow_key_verdict(fast_passed_slow, held_back, behind):
    """fast_passed_slow: with ids, the fast calls were answered right before slow's reply;
    held_back: in order, replies ready but not written while slow was held, of `behind`."""
    with_ids = ("with ids a slow request delays only itself" if fast_passed_slow
                else "with ids the fast calls still waited for the slow one")
    in_order = ("in order, it delays every reply behind it" if held_back == behind
                else f"in order, it held back {held_back} of the {behind} replies behind it")
    return f"  verdict: {with_ids}; {in_order}"


def late_reply():
    with TaggedUpstream() as upstream, TaggedClient(upstream.addr) as client:
        # the slow reply leaves only after its call has given up and the next call is
        # on the wire, and the next reply only after it, so the late reply arrives
        # while another call is owed
        in_turn = answered_in_order(upstream, ["slow", "next"])

        def pause(key):
            if key == "slow":
                client.wait_sent(2)
            in_turn(key)

        upstream.pause = pause
        slow = in_background(client.call, b"GET slow\n", 0.05)
        client.wait_timeouts(1)
        print(f"  GET slow (msg_timeout 0.05 s) -> {slow.result()}")
        abandoned = sorted(client.abandoned)   # emptied once the late reply is dropped
        print(f"  owed: {len(client.owed)}, abandoned ids: {abandoned}")
        following = in_background(client.call, b"GET next\n")
        client.wait_dropped(1)
        upstream.wait_replies(2)
        print(f"  GET next -> {following.result()!r}")
        print(f"  upstream wrote   {', '.join(map(repr, upstream.written))}")
        print(f"  late replies dropped by id: {client.dropped}; "
              f"connections: {upstream.connections}; "
              f"owed now: {len(client.owed)}")
        after = client.call(b"GET after\n").decode().rstrip("\n")
        print(f"  GET after -> {after!r}")
        served_on = (upstream.connections == 1
                     and after == answer(b"GET after").decode().rstrip("\n"))
        print(late_reply_verdict(abandoned, client.dropped, served_on))


def late_reply_verdict(abandoned, dropped, served_on):
    if dropped != 1 or len(abandoned) != 1:
        return f"  verdict: {dropped} late replies dropped, abandoned ids {abandoned}"
    after = "and the connection served on" if served_on else "but the connection did not serve on"
    return (f"  verdict: the late reply carried id {abandoned[0]}, which no call is owed "
            f"any more: dropped, {after}")


PART3_SCENARIOS = [
    ("naive-redis", "NaiveProxy in front of Redis: B gets A's job", naive_redis),
    ("line-pool", "A pool that frames Redis replies by line: the tail goes to the next borrower",
     line_pool),
    ("line-checked", "The same framing with the out-of-step checks: caught, not misdelivered",
     checked_line_pool),
    ("resp-pool", "The pool framed by RESP: 0 wrong", resp_pool),
    ("out-of-order", "Request ids: replies out of order, each to its caller", out_of_order),
    ("slow-key", "A slow key and the fast keys behind it", slow_key),
    ("late-reply", "A timed-out call's late reply, dropped by id", late_reply),
]
