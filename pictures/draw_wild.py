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
    draw(records)     two sequence diagrams side by side, the affected version and the
                      fixed one: requests going to their relay connection, the held
                      reply, the cancel, and which reply each later client read
"""
import json
import subprocess
import sys

from part3 import wild
from pictures.draw import save
from pictures.svg import FAINT, GREEN, MUTED, RED, RED_FILL, Svg, heading, sequence

NAME = "part3-wild.svg"
SHOWN = ("4.5.1", "4.5.5")   # the affected version beside the fixed one
TASKS = "redis-py tasks"     # one lane for the clients' tasks; each arrow in its task's colour
PANEL = 620                  # from one panel's left edge to the next one's


def record(version):
    run = subprocess.run([str(wild.venv_python(version)), "-m", "part3.wild", "--record"],
                         cwd=wild.ROOT, capture_output=True, text=True, timeout=120)
    if run.returncode:
        raise RuntimeError(f"part3.wild --record in redis-py {version}: {run.stderr.strip()[-300:]}")
    return json.loads(run.stdout)


def rows_of(scenario):
    """The panel's rows for svg.sequence, in the scenario's order, from its rows and the relay's log."""
    lane_of, fate_of = {}, {}   # "GET a" -> its relay connection's lane, its reply's fate
    for number, exchanges in enumerate(scenario["connections"], start=1):
        for name, fate in exchanges:
            lane_of[name], fate_of[name] = f"connection {number}", fate
    rows = []
    for name, key, outcome in scenario["clients"]:
        request = f"GET {key}"
        rows.append(("arrow", TASKS, lane_of[request], f"{name}: {request}".encode(), name, False, ""))
        if outcome.startswith("cancelled"):
            rows.append(("note", lane_of[request], f"value-of-{key} held", None, True, ""))
            rows.append(("note", TASKS, f"{name} cancelled", name, True, ""))
            if fate_of[request] == "dropped":
                rows.append(("note", lane_of[request], f"closed: value-of-{key} dropped", None, False, ""))
        elif outcome.startswith("got value-of-"):
            got = outcome[len("got "):]
            source = f"GET {got[len('value-of-'):]}"
            rows.append(("arrow", lane_of[source], TASKS, f"{name} got {got}".encode(), name,
                         got != f"value-of-{key}", ""))
        else:
            rows.append(("note", TASKS, f"{name}: {outcome}", name, True, ""))
    for request, fate in fate_of.items():
        if fate == "held":
            rows.append(("note", lane_of[request], f"value-of-{request[4:]} still held", None, True, ""))
    return rows


def draw_panel(svg, left, top, version, scenario):
    rows = rows_of(scenario)
    connections = len(scenario["connections"])
    lanes = {TASKS: left + 90, **{f"connection {n}": left + 290 + 170 * (n - 1) for n in range(1, connections + 1)}}
    wrong = sum(row[0] == "arrow" and row[5] for row in rows)
    svg.text(left, top, f"redis-py {version}: {scenario['verdict']}", 14, RED if wrong else GREEN, bold=True)
    svg.text(left, top + 18, f"{connections} relay connection{'s' if connections > 1 else ''}, "
                             f"{wrong} of 3 replies to the wrong client", 12, MUTED)
    return sequence(svg, top + 62, lanes, rows, None)


def draw(records):
    title = "The bug in the wild: redis-py's cancelled read, through a relay that holds each reply"
    svg = Svg(title)
    top = heading(svg, [title, "asyncio, a pool of one connection; A is cancelled while the relay "
                               "holds its reply, then B, C, D each get one reply let through"])
    bottoms = [draw_panel(svg, 16 + PANEL * index, top + 10, version, records[version]["cancelled"])
               for index, version in enumerate(SHOWN)]
    for index in range(1, len(SHOWN)):
        svg.line(PANEL * index - 14, top, PANEL * index - 14, max(bottoms), FAINT, 1)
    svg.legend(16, max(bottoms) + 30, [("red: a reply read by a client that did not ask for it", RED_FILL, RED)])
    return svg


def main(argv):
    missing = [v for v in SHOWN if not wild.venv_python(v).exists()]
    if missing:
        print(f"pictures.draw_wild: no venv for redis-py {', '.join(missing)}; `make wild-venvs` makes them")
        return 0
    svgs = {NAME: draw({version: record(version) for version in SHOWN}).render()}
    return 1 if save(svgs, argv == ["--check"], "python3 -m pictures.draw_wild") else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
