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
	$(PY) -m example_project.demo

test: lint
	$(PY) -m pytest

# The oldest celery, kombu and redis-py that pyproject.toml accepts (noxfile.py).
test-lowest: $(VENV)/.installed
	$(PY) -m nox -s lowest

# The runs of a minute or more (marker `soak`), skipped by `make test`.
test-soak: $(VENV)/.installed
	REDLOCK_TEST_SOAK=1 $(PY) -m pytest -m soak tests/e2e

lint: $(VENV)/.installed
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

bench: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[test,bench]'
	$(PY) -m benchmarks
