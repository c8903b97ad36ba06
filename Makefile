# make test   - a virtual environment with the test requirements, then the whole suite
# make check  - test, then both transcripts' determinism under load, then originality
PYTHON ?= python3
VENV := .venv
VENV_PYTHON := $(VENV)/bin/python

.PHONY: demo race managed test check golden bench bench-quick bench-tools soak clean

demo:
	$(PYTHON) demo.py

race:
	$(PYTHON) demo.py --race

managed:
	$(PYTHON) demo.py --managed

$(VENV_PYTHON): requirements-test.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV_PYTHON) -m pip install --quiet --disable-pip-version-check -r requirements-test.txt
	touch $(VENV_PYTHON)

test: $(VENV_PYTHON)
	$(VENV_PYTHON) -m pytest -q

# Each transcript must print the same bytes 20 times in a row while two busy
# loops compete with it for both cores. The loops end with the recipe, or after
# ten minutes if it is interrupted.
check: test
	@timeout 600 $(PYTHON) -c 'while True: pass' & one=$$!; \
	 timeout 600 $(PYTHON) -c 'while True: pass' & two=$$!; \
	 trap 'kill $$one $$two 2>/dev/null' EXIT; \
	 for run in $$(seq 20); do $(PYTHON) demo.py | sha256sum; done | sort -u > .demo-hashes; \
	 for run in $$(seq 20); do $(PYTHON) demo.py --managed | sha256sum; done | sort -u > .managed-hashes; \
	 echo "demo.py: $$(cat .demo-hashes)"; echo "demo.py --managed: $$(cat .managed-hashes)"; \
	 test $$(wc -l < .demo-hashes) -eq 1 && test $$(wc -l < .managed-hashes) -eq 1
	../shared/tools/originality

# Rewrite the checked-in transcripts after an intended change to a demo.
golden:
	$(PYTHON) demo.py > transcripts/demo.txt
	$(PYTHON) demo.py --managed > transcripts/managed.txt

bench:
	$(PYTHON) bench.py

bench-quick:
	$(PYTHON) bench.py --quick

# socat and HAProxy, for the bench's comparison rows (Debian's packages; run as root).
# bench.py runs without them and names this target in its notes.
bench-tools:
	apt-get update
	apt-get install -y socat haproxy

# The randomized proof at 10,000 examples instead of the suite's 200 (minutes, not seconds).
soak: $(VENV_PYTHON)
	SOAK=10000 $(VENV_PYTHON) -m pytest -q test_properties.py

clean:
	rm -rf $(VENV) .demo-hashes .managed-hashes .pytest_cache .hypothesis __pycache__
