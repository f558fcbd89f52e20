"""The unit tier starts no process: no redis-server, no worker, no interpreter.

Every test here fails the moment it tries to (a ``subprocess.Popen``, which every way of
starting a process in the suite goes through: :class:`celery_redlock.testing.RedisServer`,
:class:`support.workers.WorkerProcess`, ``subprocess.run``). A test that needs a process belongs
in ``tests/integration`` (servers, fresh interpreters) or ``tests/e2e`` (worker subprocesses).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def _no_processes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def refuse(self: subprocess.Popen[Any], args: Any, *_: Any, **__: Any) -> None:
        raise AssertionError(f"a unit test started a process: {args!r}; move it to a later tier")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    yield
