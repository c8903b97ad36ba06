"""pictures.draw_wild: part3-wild.svg, the real redis-py 4.5.1 beside 4.5.5 through
part3.wild's relay: `python3 -m pictures.draw_wild [--check]` (the venvs: make wild-venvs).
Each venv's python prints what `part3.wild --record` recorded, as JSON: each client's row and
each relay connection's requests with their replies' fates; the picture reads only that."""
import json
import subprocess
import sys

from part3.wild import incident
from pictures.draw import save
from pictures.svg import GREEN, RED, sequence, titled

NAME = "part3-wild.svg"
SHOWN = ("4.5.1", "4.5.5")   # the affected version beside the fixed one
TASKS = "redis-py tasks"     # one lane for the clients' tasks; each arrow in its task's colour


def record(version):
    run = subprocess.run([str(incident.venv_python(version)), "-m", "part3.wild", "--record"],
                         cwd=incident.ROOT, capture_output=True, text=True, timeout=120)
    if run.returncode:
        raise RuntimeError(
            f"part3.wild --record in redis-py {version}: {run.stderr.strip()[-300:]}")
    return json.loads(run.stdout)


def rows_of(scenario):
    """svg.sequence's rows, client by client: its GET to the relay connection that carried it, then
    the reply it read (red if another's) or what became of it (red), and where the relay closed a
    connection, that."""
    # "GET a" -> (its connection's lane, its reply's fate)
    carried = {request: (f"connection {number}", fate)
               for number, exchanges in enumerate(scenario["connections"], start=1)
               for request, fate in exchanges}
    rows = []
    for name, key, outcome in scenario["clients"]:
        lane, fate = carried[f"GET {key}"]
        got = outcome.removeprefix("got value-of-")
        rows.append(("arrow", TASKS, lane, f"{name}: GET {key}".encode(), name, False, ""))
        if got == outcome:   # no reply read: cancelled (while its reply was held), or an error
            rows.append(("note", lane, f"{name} {outcome}", name, True, ""))
        else:
            rows.append(("arrow", carried[f"GET {got}"][0], TASKS, f"{name} {outcome}".encode(),
                         name, got != key, ""))
        if fate == "dropped":   # the relay closed it, its client gone
            rows.append(("note", lane, f"closed: value-of-{key} dropped", None, False, ""))
    return rows


def draw(records):
    svg, top = titled("The bug in the wild: redis-py's cancelled read, "
                      "through a relay that holds each reply")
    for left, version in zip((16, 636), SHOWN):
        scenario = records[version]["cancelled"]
        rows = rows_of(scenario)
        connections = len(scenario["connections"])
        # a reply read by the wrong client
        wrong = any(row[0] == "arrow" and row[5] for row in rows)
        svg.text(left, top + 10, f"redis-py {version}: {scenario['verdict']}", 14,
                 RED if wrong else GREEN, bold=True)
        lanes = {TASKS: left + 90} | {f"connection {n}": left + 120 + 170 * n
                                      for n in range(1, connections + 1)}
        sequence(svg, top + 54, lanes, rows, None)
    return svg


def main(argv):
    missing = [v for v in SHOWN if not incident.venv_python(v).exists()]
    if missing:
        print(f"pictures.draw_wild: no venv for redis-py {', '.join(missing)}; "
              "`make wild-venvs` makes them")
        return 0
    svgs = {NAME: draw({version: record(version) for version in SHOWN}).render()}
    return 1 if save(svgs, argv == ["--check"], "python3 -m pictures.draw_wild") else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
