# make test   - a virtual environment with the test requirements, redis-server, then the whole suite
# make check  - test, then both transcripts' determinism under load, then originality
# make bench-redis - redis-benchmark through the project's Redis relays, socat, HAProxy, twemproxy
# make pictures - run the scenarios and redraw pictures/*.svg from what they recorded (Part three's need redis-server)
# make lint   - pyflakes-level checks (ruff: unused and undefined names, syntax); no formatter
PYTHON ?= python3
VENV := .venv
VENV_PYTHON := $(VENV)/bin/python

.PHONY: demo race managed part3 redis-server redis-peers test lint check golden pictures bench bench-quick bench-part3 bench-redis bench-tools soak clean

demo:
	$(PYTHON) demo.py

race:
	$(PYTHON) demo.py --race

managed:
	$(PYTHON) demo.py --managed

part3:
	$(PYTHON) demo.py --part3

# Part three needs a real redis-server on PATH, and its tests drive it with real clients,
# redis-cli and redis-benchmark (Debian's redis-tools): `make test` installs both packages
# when one is missing (as root, with no stdin, as CI runs). Where that cannot be done,
# it says how, and those tests skip, except under CI=true, where they fail.
redis-server:
	@{ command -v redis-server && command -v redis-cli && command -v redis-benchmark; } >/dev/null || \
	   { export DEBIAN_FRONTEND=noninteractive; apt-get update && \
	     apt-get install -y --no-install-recommends redis-server redis-tools < /dev/null; } || \
	   echo "make: could not install redis-server; as root: apt-get install redis-server redis-tools"

# The bench's Redis tests start twemproxy (Debian's nutcracker, in /usr/sbin): installed
# as redis-server is, when missing (redis-benchmark comes with redis-server's redis-tools).
redis-peers:
	@{ command -v nutcracker || test -x /usr/sbin/nutcracker; } >/dev/null || \
	   { export DEBIAN_FRONTEND=noninteractive; apt-get update && \
	     apt-get install -y --no-install-recommends nutcracker < /dev/null; } || \
	   echo "make: could not install nutcracker; as root: apt-get install nutcracker"

$(VENV_PYTHON): requirements-test.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV_PYTHON) -m pip install --quiet --disable-pip-version-check -r requirements-test.txt
	touch $(VENV_PYTHON)

# Two workers (pytest-xdist): most tests wait on sockets and threads, so two
# processes keep both cores busy.
test: $(VENV_PYTHON) redis-server redis-peers
	$(VENV_PYTHON) -m pytest -q -n 2

# F: pyflakes' checks (unused imports and names, undefined names, redefinitions);
# E9: syntax errors. Style is the code's own: the aligned margin comments stay.
lint: $(VENV_PYTHON)
	$(VENV_PYTHON) -m ruff check --quiet --select F,E9 .

# Each transcript must print the same bytes 20 times in a row while two busy
# loops compete with it for both cores. The loops end with the recipe, or after
# ten minutes if it is interrupted.
check: lint test
	@timeout 600 $(PYTHON) -c 'while True: pass' & one=$$!; \
	 timeout 600 $(PYTHON) -c 'while True: pass' & two=$$!; \
	 trap 'kill $$one $$two 2>/dev/null' EXIT; \
	 for run in $$(seq 20); do $(PYTHON) demo.py | sha256sum; done | sort -u > .demo-hashes; \
	 for run in $$(seq 20); do $(PYTHON) demo.py --managed | sha256sum; done | sort -u > .managed-hashes; \
	 for run in $$(seq 20); do $(PYTHON) demo.py --part3 | sha256sum; done | sort -u > .part3-hashes; \
	 echo "demo.py: $$(cat .demo-hashes)"; echo "demo.py --managed: $$(cat .managed-hashes)"; \
	 echo "demo.py --part3: $$(cat .part3-hashes)"; \
	 test $$(wc -l < .demo-hashes) -eq 1 && test $$(wc -l < .managed-hashes) -eq 1 && \
	 test $$(wc -l < .part3-hashes) -eq 1
	@if [ -x ../shared/tools/originality ]; then ../shared/tools/originality; \
	 else echo "originality: skipped, ../shared/tools/originality is not beside this clone"; fi

# Rewrite the checked-in transcripts after an intended change to a demo.
golden:
	$(PYTHON) demo.py > transcripts/demo.txt
	$(PYTHON) demo.py --managed > transcripts/managed.txt
	command -v redis-server >/dev/null   # without it --part3 prints only how to install it
	$(PYTHON) demo.py --part3 > transcripts/part3.txt

# Redraw the pictures from the scenarios' runs; look at them before committing.
pictures:
	$(PYTHON) -m pictures

bench:
	$(PYTHON) -m bench

bench-quick:
	$(PYTHON) -m bench --quick

# Head-of-line blocking: in-order pipelining against request ids, same upstream.
bench-part3:
	$(PYTHON) -m bench.bench_part3

# redis-benchmark through the project's Redis relays and the real ones (about three minutes).
bench-redis:
	$(PYTHON) -m bench --only redis

# socat, HAProxy, twemproxy (nutcracker), redis-server and redis-benchmark (redis-tools),
# for the bench's comparison rows (Debian's packages; run as root). The bench runs
# without them and names this target in its notes.
bench-tools:
	apt-get update
	apt-get install -y socat haproxy nutcracker redis-server redis-tools

# The randomized proof at 10,000 examples instead of the suite's 200 (minutes, not seconds).
soak: $(VENV_PYTHON)
	SOAK=10000 $(VENV_PYTHON) -m pytest -q tests/test_properties.py part3/test_resp.py part3/test_real_clients.py part3/test_tagged.py

clean:
	rm -rf $(VENV) .demo-hashes .managed-hashes .part3-hashes .pytest_cache .hypothesis .ruff_cache
	find . -name __pycache__ -prune -exec rm -rf {} +
