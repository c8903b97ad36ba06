"""pictures.draw_wild: part3-wild.svg, the real redis-py through part3.wild's relay,
drawn from the scenario's own runs.

    python3 -m pictures.draw_wild            run the scenario in the 4.5.1 and 4.5.5 venvs
                                             (make wild-venvs), rewrite pictures/part3-wild.svg
    python3 -m pictures.draw_wild --check    run it, and exit 1 if the checked-in picture differs

The scenario runs inside each venv's python (`python -m part3.wild --record`), which
prints what it recorded: each client's row (what it asked, what it got) and each relay
connection's requests with the fate of their replies (let through, dropped, still
held). The drawing reads only that, so the picture is the same on every run, as the
transcript is. Without the venvs it says how to make them and draws nothing.

    record(version)   one venv's run, as the JSON it printed
    draw(records)     two panels side by side, the affected version and the fixed one:
                      requests going to their relay connection, the held reply, the
                      cancel, and which reply each later client read
"""
import json
import subprocess
import sys

from part3 import wild
from pictures.draw import PICTURES_DIR
from pictures.svg import CLIENT_COLOURS, FAINT, GREEN, INK, MUTED, RED, RED_FILL, Svg, heading, text_width

NAME = "part3-wild.svg"
SHOWN = ("4.5.1", "4.5.5")   # the affected version beside the fixed one
TONES = {**CLIENT_COLOURS, "D": ("#d5eeec", "#00695c")}   # four clients here
ROW = 34                     # one event per row
TASKS_X, LANE_X, LANE_GAP = 70, 260, 150   # the tasks' column; relay connection 1's lane; the gap to 2's
PANEL = LANE_X + LANE_GAP + 120             # from one panel's left edge to the next one's


def record(version):
    run = subprocess.run([str(wild.venv_python(version)), "-m", "part3.wild", "--record"],
                         cwd=wild.ROOT, capture_output=True, text=True, timeout=120)
    if run.returncode:
        raise RuntimeError(f"part3.wild --record in redis-py {version}: {run.stderr.strip()[-300:]}")
    return json.loads(run.stdout)


def rows_of(scenario):
    """The panel's rows, in the scenario's order, from its rows and the relay's log."""
    connection_of, fate_of = {}, {}   # "GET a" -> its relay connection (from 1), its reply's fate
    for number, exchanges in enumerate(scenario["connections"], start=1):
        for name, fate in exchanges:
            connection_of[name], fate_of[name] = number, fate
    rows = []
    for name, key, outcome in scenario["clients"]:
        request = f"GET {key}"
        rows.append(("request", name, connection_of[request], request))
        if outcome.startswith("cancelled"):
            rows.append(("note", connection_of[request], f"value-of-{key} held", name, False))
            rows.append(("cancel", name))
            if fate_of[request] == "dropped":
                rows.append(("closed", connection_of[request], f"closed on {name}'s cancel: value-of-{key} dropped"))
        elif outcome.startswith("got value-of-"):
            got = outcome[len("got "):]
            source = f"GET {got[len('value-of-'):]}"
            rows.append(("reply", connection_of[source], name, got, got != f"value-of-{key}"))
        else:
            rows.append(("failed", name, outcome))
    for request, fate in fate_of.items():
        if fate == "held":
            rows.append(("note", connection_of[request], f"value-of-{request[4:]} still held", None, False))
    return rows


def draw_panel(svg, left, top, version, scenario):
    rows = rows_of(scenario)
    lanes = {number: left + LANE_X + LANE_GAP * (number - 1)
             for number in range(1, len(scenario["connections"]) + 1)}
    wrong = [row for row in rows if row[0] == "reply" and row[4]]
    verdict = scenario["verdict"]
    svg.text(left, top, f"redis-py {version}: {verdict}", 14, RED if wrong else GREEN, bold=True)
    svg.text(left, top + 18, f"{len(lanes)} relay connection{'s' if len(lanes) > 1 else ''}, "
                             f"{len(wrong)} of 3 replies to the wrong client", 12, MUTED)
    head = top + 56
    svg.text(left + TASKS_X, head - 8, "redis-py tasks", 13, INK, "middle", bold=True)
    first_row, last_row = {}, {}
    for index, row in enumerate(rows):
        lane = row[2] if row[0] == "request" else row[1] if row[0] in ("note", "closed", "reply") else None
        if lane:
            first_row.setdefault(lane, index)
            last_row[lane] = index
    for number, x in lanes.items():
        svg.rect(x - 62, head - 26, 124, 26, "#eeeeee", "#555555", 1.5, radius=4)
        svg.text(x, head - 8, f"connection {number}", 13, INK, "middle", bold=True)
        closed = any(row[0] == "closed" and row[1] == number for row in rows)
        end = head + ROW * (last_row[number] + 1) + (0 if closed else ROW / 2)
        svg.line(x, head, x, end, FAINT, 1.5, dash="4 4")
    for index, row in enumerate(rows):
        y = head + ROW * (index + 1)
        kind = row[0]
        if kind == "request":
            _, name, number, request = row
            stroke = TONES[name][1]
            task_box(svg, left + TASKS_X, y, name)
            svg.arrow(left + TASKS_X + 16, y, lanes[number], y, stroke, 1.5)
            svg.text(left + TASKS_X + 26, y - 6, request, 13, INK)
        elif kind == "reply":
            _, number, name, got, astray = row
            tone = RED if astray else TONES[name][1]
            task_box(svg, left + TASKS_X, y, name)
            svg.arrow(lanes[number], y, left + TASKS_X + 16, y, tone, 2.5 if astray else 1.5)
            svg.text(left + TASKS_X + 26, y - 6, got, 13, RED if astray else INK, bold=astray)
        elif kind == "note":
            _, number, label, _, _ = row
            width = text_width(label, 12) + 14
            svg.rect(lanes[number] - width / 2, y - 15, width, 22, RED_FILL, RED, 1, radius=3)
            svg.text(lanes[number], y + 1, label, 12, RED, "middle", bold=True)
        elif kind == "cancel":
            task_box(svg, left + TASKS_X, y, row[1])
            svg.text(left + TASKS_X + 26, y + 4, "cancelled", 13, RED, bold=True)
        elif kind == "closed":
            _, number, label = row
            x = lanes[number]
            svg.line(x - 8, y - 8, x + 8, y + 8, INK, 2)
            svg.line(x - 8, y + 8, x + 8, y - 8, INK, 2)
            svg.text(x + 14, y + 4, label, 12, MUTED)
        else:
            _, name, outcome = row
            task_box(svg, left + TASKS_X, y, name)
            svg.text(left + TASKS_X + 26, y + 4, outcome, 12, RED)
    return head + ROW * (len(rows) + 1)


def task_box(svg, x, y, name):
    fill, stroke = TONES[name]
    svg.rect(x - 14, y - 12, 28, 22, fill, stroke, 1.5, radius=4)
    svg.text(x, y + 4, name, 13, INK, "middle", bold=True)


def draw(records):
    title = "The bug in the wild: redis-py's cancelled read, through a relay that holds each reply"
    svg = Svg(title)
    top = heading(svg, [title, "asyncio, a pool of one connection; A is cancelled while the relay "
                               "holds its reply, then B, C, D each get one reply let through"])
    bottoms = [draw_panel(svg, 16 + PANEL * index, top + 10, version, records[version]["cancelled"])
               for index, version in enumerate(SHOWN)]
    for index in range(1, len(SHOWN)):
        svg.line(PANEL * index - 14, top, PANEL * index - 14, max(bottoms), FAINT, 1)
    svg.legend(16, max(bottoms) + 14, [("red: a reply read by a client that did not ask for it", RED_FILL, RED)])
    return svg


def main(argv):
    missing = [v for v in SHOWN if not wild.venv_python(v).exists()]
    if missing:
        print(f"pictures.draw_wild: no venv for redis-py {', '.join(missing)}; `make wild-venvs` makes them")
        return 0
    drawn = draw({version: record(version) for version in SHOWN}).render()
    path = PICTURES_DIR / NAME
    if argv == ["--check"]:
        if path.read_text(encoding="utf-8") != drawn:
            print(f"pictures/{NAME} is stale: run `python3 -m pictures.draw_wild` and look at it")
            return 1
        return 0
    path.write_text(drawn, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
