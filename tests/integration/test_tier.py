"""The integration tier refuses ``celery worker`` subprocesses and allows every other process
(``tests/integration/conftest.py``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from support.workers import WorkerProcess


def test_a_worker_subprocess_fails_the_test() -> None:
    with pytest.raises(AssertionError, match="an integration test started a celery worker"):
        WorkerProcess(None, app="tests.e2e.proj").launch()


@pytest.mark.parametrize(
    "command",
    [
        "celery -A proj worker -l INFO",
        [sys.executable, "-m", "celery", "-A", "proj", "beat"],
        ["/venv/bin/celery", "multi", "start", "w1"],
    ],
)
def test_every_way_of_naming_a_worker_is_refused(command: object) -> None:
    with pytest.raises(AssertionError, match="started a celery worker"):
        subprocess.Popen(command)  # type: ignore[call-overload]


def test_other_processes_run() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "celery", "--version"],
        capture_output=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0
