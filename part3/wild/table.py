"""part3.wild.table: part3.wild's cancelled scenario across redis-py releases, as a table.

`python3 -m part3.wild.table` (make wild-table) makes one virtual environment per
release in .venv-wild-table/ (from the package index; made once, then reused), runs
`python -m part3.wild --table-row` in each RUNS times, and prints a markdown table:
for a plain GET and for a GET in a pipeline (transaction=False), "mixed up" if B, C
or D got another key's value, "failed" if none did but one got no value, "clean"
if each got its own; and what B got. A cell whose runs disagree lists every verdict
seen. Nothing here is typed in: every cell is what the runs printed.

Not in the suite: it installs every release listed, which takes minutes.
"""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / ".venv-wild-table"
RELEASES = ("4.2.0", "4.3.0", "4.3.3", "4.3.5", "4.3.6", "4.4.0", "4.4.1", "4.4.2", "4.4.3",
            "4.4.4", "4.5.0", "4.5.1", "4.5.2", "4.5.3", "4.5.4", "4.5.5", "4.6.0", "5.0.8",
            "6.4.0", "7.4.1", "8.1.0")
RUNS = 3   # runs per release; every cell must come out the same in each


def python_for(release):
    """The venv's python with redis==release in it, made if missing; None if pip fails."""
    venv = HOME / f"redis-{release}"
    python = venv / "bin" / "python"
    if not (venv / "installed").exists():
        made = subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)],
                              capture_output=True)
        if made.returncode == 0:
            made = subprocess.run([str(python), "-m", "pip", "install", "--quiet",
                                   "--disable-pip-version-check", f"redis=={release}"],
                                  capture_output=True, text=True, timeout=600)
        if made.returncode:
            return None
        (venv / "installed").touch()
    return python


def rows(python):
    """RUNS runs of the scenario in one venv: their JSON rows."""
    found = []
    for _ in range(RUNS):
        run = subprocess.run([str(python), "-m", "part3.wild", "--table-row"], cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
        if run.returncode:
            raise RuntimeError(f"{python}: {run.stderr.strip().splitlines()[-1:]}")
        found.append(json.loads(run.stdout))
    return found


def cell(runs, mode, key):
    seen = sorted({run[mode][key] for run in runs})
    return " / ".join(seen) if len(seen) == 1 else "varies: " + " | ".join(seen)


def main():
    print(f"{RUNS} runs per release; a cell names every verdict its runs gave\n")
    print("| redis-py | plain GET | pipeline | B, plain GET | B, pipeline |")
    print("| --- | --- | --- | --- | --- |")
    for release in RELEASES:
        python = python_for(release)
        if python is None:
            print(f"| {release} | could not install | | | |")
            continue
        runs = rows(python)
        assert all(run["version"] == release for run in runs), runs
        print(f"| {release} | " + " | ".join(cell(runs, mode, key) for key in ("verdict", "B")
                                         for mode in ("plain", "pipeline")) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
