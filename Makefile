# make test   - a virtual environment with the test requirements, redis-server, the redis-py
#               venvs, then the whole suite
# make check  - lint and test, then each transcript's determinism under load (four), then originality
# make bench-redis - redis-benchmark through the project's Redis relays, socat, HAProxy, twemproxy
# make bench-attacks - hostile clients against `python3 -m part3 serve`, each beside an honest one
# make pictures - run the scenarios and redraw pictures/*.svg from what they recorded (Part three's need redis-server)
# make lint   - ruff (ruff.toml): unused and undefined names, syntax, the lesson's line length
# make wild   - redis-py's cancelled-reply leak with the real library, 4.5.1 against 4.5.5 and 8.1.0
# make redis-py-tests - redis-py's own command tests through each Redis pool (minutes)
# make applications - eight libraries' everyday work (rq, celery...) through serve (minutes)
PYTHON ?= python3
VENV := .venv
VENV_PYTHON := $(VENV)/bin/python

.PHONY: demo race managed part3 wild wild-venvs wild-table redis-py-tests applications redis-server test lint \
        check golden pictures bench bench-quick bench-part3 bench-redis bench-attacks bench-tools soak \
        clean

demo:
	$(PYTHON) demo.py

race:
	$(PYTHON) demo.py --race

managed:
	$(PYTHON) demo.py --managed

part3:
	$(PYTHON) demo.py --part3

# The bug in the wild (part3/wild/): real redis-py, each pinned version in its own
# virtual environment, made from part3/wild/requirements-<version>.txt. Where the package
# index cannot be reached, the venv is not made, a line says so, and `make wild` and
# part3/wild/test_incident.py say so too (the test fails under CI=true).
WILD_VERSIONS := 4.5.1 4.5.5 8.1.0
WILD_PYTHONS := $(WILD_VERSIONS:%=.venv-redis-%/bin/python)

.venv-redis-%/bin/python: part3/wild/requirements-%.txt
	@{ $(PYTHON) -m venv .venv-redis-$* && \
	   .venv-redis-$*/bin/python -m pip install --quiet --disable-pip-version-check -r $< && \
	   touch $@; } || { rm -rf .venv-redis-$*; \
	   echo "make: could not install redis-py $* into .venv-redis-$* (is the package index reachable?)"; }

wild-venvs: $(WILD_PYTHONS)

wild: wild-venvs redis-server
	$(PYTHON) -m part3.wild --all

# Not in the suite: one venv per redis-py release tried (in .venv-wild-table/), minutes.
wild-table: redis-server
	$(PYTHON) -m part3.wild.table

# Not in the suite: redis-py's own command tests (from its source distribution) through
# each Redis pool, in a venv of their own (bench/redis_py_tests.py), minutes.
.venv-redis-py-tests/bin/python: bench/requirements-redis-py-tests.txt
	@{ $(PYTHON) -m venv .venv-redis-py-tests && \
	   .venv-redis-py-tests/bin/python -m pip install --quiet --disable-pip-version-check -r $< && \
	   touch $@; } || { rm -rf .venv-redis-py-tests; \
	   echo "make: could not install $< into .venv-redis-py-tests (is the package index reachable?)"; }

redis-py-tests: .venv-redis-py-tests/bin/python redis-server
	$(PYTHON) -m bench.redis_py_tests

# Not in the suite: the everyday work of eight libraries built on Redis (rq, celery, huey,
# dramatiq, django-redis, limits, flask-limiter, arq) directly and through `python3 -m part3
# serve` of each kind, in a venv of their own (bench/applications.py), minutes.
.venv-applications/bin/python: bench/requirements-applications.txt
	@{ $(PYTHON) -m venv .venv-applications && \
	   .venv-applications/bin/python -m pip install --quiet --disable-pip-version-check -r $< && \
	   touch $@; } || { rm -rf .venv-applications; \
	   echo "make: could not install $< into .venv-applications (is the package index reachable?)"; }

applications: .venv-applications/bin/python redis-server
	$(PYTHON) -m bench.applications

# Part three needs a real redis-server on PATH, and its tests drive it with real clients,
# redis-cli and redis-benchmark (Debian's redis-tools): `make test` installs both packages
# when one is missing (as root, with no stdin, as CI runs). Where that cannot be done,
# it says how, and those tests skip, except under CI=true, where they fail.
redis-server:
	@{ command -v redis-server && command -v redis-cli && command -v redis-benchmark; } >/dev/null || \
	   { export DEBIAN_FRONTEND=noninteractive; apt-get update && \
	     apt-get install -y --no-install-recommends redis-server redis-tools < /dev/null; } || \
	   echo "make: could not install redis-server; as root: apt-get install redis-server redis-tools"

$(VENV_PYTHON): requirements-test.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV_PYTHON) -m pip install --quiet --disable-pip-version-check -r requirements-test.txt
	touch $(VENV_PYTHON)

# -n 3: three workers on two cores (many tests wait on a peer). PYTHONDONTWRITEBYTECODE
# emptied: compiled test modules are kept in __pycache__/. --dist loadgroup: a module marked
# xdist_group runs on one worker, so its module-wide fixture runs once.
test: $(VENV_PYTHON) redis-server wild-venvs
	PYTHONDONTWRITEBYTECODE= $(VENV_PYTHON) -m pytest -q -n 3 --dist loadgroup

# ruff.toml says what it checks: names and syntax everywhere, line length in the lesson.
lint: $(VENV_PYTHON)
	$(VENV_PYTHON) -m ruff check --quiet .

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
	 for run in $$(seq 20); do $(PYTHON) -m part3.wild --all | sha256sum; done | sort -u > .wild-hashes; \
	 echo "demo.py: $$(cat .demo-hashes)"; echo "demo.py --managed: $$(cat .managed-hashes)"; \
	 echo "demo.py --part3: $$(cat .part3-hashes)"; echo "part3.wild --all: $$(cat .wild-hashes)"; \
	 test $$(wc -l < .demo-hashes) -eq 1 && test $$(wc -l < .managed-hashes) -eq 1 && \
	 test $$(wc -l < .part3-hashes) -eq 1 && test $$(wc -l < .wild-hashes) -eq 1
	@if [ -x ../shared/tools/originality ]; then ../shared/tools/originality; \
	 else echo "originality: skipped, ../shared/tools/originality is not beside this clone"; fi

# Rewrite the checked-in transcripts after an intended change to a demo.
golden: wild-venvs
	$(PYTHON) demo.py > transcripts/demo.txt
	$(PYTHON) demo.py --managed > transcripts/managed.txt
	command -v redis-server >/dev/null   # without it --part3 prints only how to install it
	$(PYTHON) demo.py --part3 > transcripts/part3.txt
	test -x .venv-redis-4.5.1/bin/python   # without the venvs part3.wild prints only how to make them
	$(PYTHON) -m part3.wild --all > transcripts/wild.txt

# Redraw the pictures from the scenarios' runs; look at them before committing.
pictures:
	$(PYTHON) -m pictures
	$(PYTHON) -m pictures.draw_wild   # part3-wild.svg, from the redis-py venvs (make wild-venvs)

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

# Hostile clients against `python3 -m part3 serve`, both kinds, each beside an honest client
# (bench/attacks.py; minutes). The venv's Python: kill-9 and sigstop drive redis-py.
bench-attacks: $(VENV_PYTHON) redis-server
	$(VENV_PYTHON) -m bench.attacks

# socat, HAProxy, twemproxy (nutcracker), redis-server and redis-benchmark (redis-tools),
# for the bench's comparison rows (Debian's packages; run as root). The bench runs
# without them and names this target in its notes.
bench-tools:
	apt-get update
	apt-get install -y socat haproxy nutcracker redis-server redis-tools

# The randomized proof at 10,000 examples instead of the suite's 80 (minutes, not seconds).
soak: $(VENV_PYTHON)
	SOAK=10000 $(VENV_PYTHON) -m pytest -q tests/test_properties.py part3/test_resp.py part3/test_real_clients.py part3/test_tagged.py \
	  part3/test_differential.py

clean:
	rm -rf $(VENV) .venv-redis-* .venv-applications .venv-wild-table .demo-hashes .managed-hashes .part3-hashes .wild-hashes .pytest_cache .hypothesis .ruff_cache
	find . -name __pycache__ -prune -exec rm -rf {} +
