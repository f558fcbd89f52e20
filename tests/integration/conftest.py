"""The integration tier runs real servers and in-process workers, never a ``celery worker``
subprocess: those belong in ``tests/e2e``.

Every test here fails the moment it starts one (a ``subprocess.Popen`` of ``celery ... worker``
or ``celery ... beat``, which is how :class:`support.workers.WorkerProcess` starts them). Other
processes are fine: redis-server, fresh interpreters, pytester.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

#: Celery subcommands that start a worker process (or a beat, which feeds one).
WORKER_COMMANDS = {"worker", "beat", "multi"}


def is_celery_worker(args: Any) -> bool:
    """Whether ``args`` (a ``Popen`` command) runs ``celery ... worker`` (or beat, multi)."""
    words: Sequence[str] = args.split() if isinstance(args, str) else [str(a) for a in args]
    celery = [i for i, w in enumerate(words) if w == "celery" or w.endswith("/celery")]
    return any(WORKER_COMMANDS & set(words[i + 1 :]) for i in celery)


@pytest.fixture(autouse=True)
def _no_worker_subprocesses(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    popen = subprocess.Popen.__init__

    def checked(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
        if is_celery_worker(args):
            raise AssertionError(
                f"an integration test started a celery worker: {args!r}; move it to tests/e2e"
            )
        popen(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", checked)
    yield
