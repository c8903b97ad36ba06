"""redis_py_tests: redis-py's own command tests through each Redis pool. A reader of the lesson
need not read it: it is how BENCH.md's count of them is made.

    python3 -m bench.redis_py_tests [--protocol 3 2] [--kinds direct framed managed]
    (make redis-py-tests: the venv it needs, then this)

For each protocol and each kind it starts a private redis-server, the pool in front of it
(SessionProxy cap 8, or ManagedProxy over one connection; the policy's server-wide commands
allowed by name but SHUTDOWN, so the tests that use them can run), and redis-py's
tests/test_commands.py from the source distribution of the redis-py in its venv, with its
defaults (protocol 3) or ?protocol=2; then one row each: passed, failed, errors, and the
names of the tests that failed, for a reader to look at what each failure said.

    server_wide()   the policy's commands, SHUTDOWN left out
    source_tests()  redis-py's tests, from its source distribution (pip download)
    run()           one kind, one protocol: the counts pytest printed, and what failed
"""
import argparse
import contextlib
import pathlib
import re
import subprocess
import sys
import tarfile
import tempfile

from part2.managed import ManagedProxy
from part3 import commands
from part3.redis_server import RedisServer
from part3.resp import Resp
from part3.framed import SessionProxy

VENV_PYTHON = pathlib.Path(__file__).resolve().parent.parent / ".venv-redis-py-tests/bin/python"
KINDS = ("direct", "framed", "managed")
RUN_TIMEOUT = 900   # seconds one run of the tests may take
TEST_TIMEOUT = 60   # seconds one test may take (pytest-timeout)


def server_wide():
    """The names the policy refuses by default, but SHUTDOWN: the tests stop no server."""
    return sorted(name.decode() for name, row in commands.COMMANDS.items()
                  if commands.KINDS[row.kind].action == commands.POLICY and name != b"SHUTDOWN")


def version_of_venv():
    found = subprocess.run([str(VENV_PYTHON), "-c", "import redis; print(redis.__version__)"],
                           capture_output=True, text=True, check=True)
    return found.stdout.strip()


def source_tests(into):
    """redis-py's source distribution of the venv's version, unpacked into `into`; its root."""
    version = version_of_venv()
    subprocess.run([str(VENV_PYTHON), "-m", "pip", "download", "--quiet", "--no-deps",
                    "--no-binary", ":all:", f"redis=={version}", "-d", str(into)], check=True)
    (archive,) = pathlib.Path(into).glob("redis-*.tar.gz")
    with tarfile.open(archive) as unpacked:
        unpacked.extractall(into, filter="data")
    return pathlib.Path(into) / f"redis-{version}"


@contextlib.contextmanager
def pool(kind, upstream):
    """The kind's pool in front of upstream (direct: none); yields the port clients use."""
    framing = Resp(allow=server_wide())
    if kind == "direct":
        yield upstream[1]
        return
    made = (SessionProxy(upstream, framing=framing, pool_cap=8) if kind == "framed"
            else ManagedProxy([(upstream, 1)], framing=framing))
    with made:
        yield made.addr[1]


def counts(summary):
    """pytest's last line as {outcome: count}: "13 failed, 421 passed, 2 errors in 56.9s"."""
    return {word.rstrip("s") if word != "passed" else word: int(number)
            for number, word in re.findall(r"(\d+) (passed|failed|errors?|skipped)", summary)}


def run(kind, protocol, root):
    """(counts, names of the tests that failed or erred) of one run."""
    with RedisServer() as redis, pool(kind, redis.addr) as port:
        url = f"redis://127.0.0.1:{port}/0" + ("?protocol=2" if protocol == 2 else "")
        done = subprocess.run([str(VENV_PYTHON), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "tests/test_commands.py", "--redis-url", url, "-rfE",
                               f"--timeout={TEST_TIMEOUT}"], cwd=root, capture_output=True,
                              text=True, timeout=RUN_TIMEOUT)
    lines = done.stdout.strip().splitlines() or [""]
    failed = [line.split()[1] for line in lines if line.startswith(("FAILED ", "ERROR "))]
    return counts(lines[-1]), failed


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m bench.redis_py_tests",
                                     description="redis-py's command tests through each pool")
    parser.add_argument("--protocol", type=int, nargs="+", choices=(2, 3), default=[3, 2])
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    options = parser.parse_args(argv)
    if not VENV_PYTHON.exists():
        print("redis_py_tests: no .venv-redis-py-tests; make redis-py-tests makes it")
        return 2
    with tempfile.TemporaryDirectory(prefix="redis-py-tests-") as into:
        root = source_tests(into)
        print(f"redis-py {version_of_venv()}'s tests/test_commands.py; allowed by name: "
              f"{', '.join(server_wide())}")
        for protocol in options.protocol:
            for kind in options.kinds:
                found, failed = run(kind, protocol, root)
                print(f"protocol {protocol}  {kind:8}  passed {found.get('passed', 0):4}  "
                      f"failed {found.get('failed', 0):3}  errors {found.get('error', 0):2}",
                      flush=True)
                for name in failed:
                    print(f"    {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
