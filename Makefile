# The two commands of the README. Each sets up .venv on first use (Python >= 3.10 with venv).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test test-lowest test-soak bench lint

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

demo: $(VENV)/.installed
	$(PY) example_project/demo.py

test: lint
	$(PY) -m pytest

# The oldest celery, kombu and redis-py that pyproject.toml accepts (noxfile.py).
test-lowest: $(VENV)/.installed
	$(PY) -m nox -s lowest

# The runs of a minute or more (marker `soak`), skipped by `make test`.
test-soak: $(VENV)/.installed
	REDLOCK_SOAK=1 $(PY) -m pytest -m soak tests/e2e

lint: $(VENV)/.installed
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

bench: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[test,bench]'
	$(PY) -m benchmarks

# Fault runs (docs/faults.md), as root: every fault on real network namespaces, tc, libfaketime
# and the local PostgreSQL. Short (203 s on the VM of docs/faults.md), and the full run of its table.
.PHONY: test-faults test-faults-full
test-faults: $(VENV)/.installed
	$(PY) -m chaos.faults --seconds 6
test-faults-full: $(VENV)/.installed
	$(PY) -m chaos.faults --seconds 20 --json faults.json
