# make test   - a virtual environment with the test requirements, then the whole suite
# make check  - test, then the demo's determinism under load, then originality
PYTHON ?= python3
VENV := .venv
VENV_PYTHON := $(VENV)/bin/python

.PHONY: demo race test check golden clean

demo:
	$(PYTHON) demo.py

race:
	$(PYTHON) demo.py --race

$(VENV_PYTHON): requirements-test.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV_PYTHON) -m pip install --quiet --disable-pip-version-check -r requirements-test.txt
	touch $(VENV_PYTHON)

test: $(VENV_PYTHON)
	$(VENV_PYTHON) -m pytest -q

# The demo must print the same bytes 20 times in a row while two busy loops
# compete with it for both cores.
check: test
	@$(PYTHON) -c 'while True: pass' & one=$$!; \
	 $(PYTHON) -c 'while True: pass' & two=$$!; \
	 for run in $$(seq 20); do $(PYTHON) demo.py | sha256sum; done | sort -u > .demo-hashes; \
	 kill $$one $$two; \
	 cat .demo-hashes; test $$(wc -l < .demo-hashes) -eq 1
	../shared/tools/originality

# Rewrite the checked-in transcript after an intended change to the demo.
golden:
	$(PYTHON) demo.py > transcripts/demo.txt

clean:
	rm -rf $(VENV) .demo-hashes .pytest_cache __pycache__
