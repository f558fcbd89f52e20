"""A real ``celery worker`` refuses to start when a locked task cannot work with its settings.

The app is :mod:`tests.e2e.crosscheck_app`; its one locked task is declared through the API
under test. The worker must exit on its own, before it consumes anything, with the
:class:`~celery_redlock.LockConfigError` naming the task and the option (or the setting), never
fail one execution at a time.
"""

from __future__ import annotations

import json

import pytest

from celery_redlock.testing import RedisServer
from support.servers import dead_port
from support.workers import WorkerProcess

pytestmark = pytest.mark.slow

APP = "tests.e2e.crosscheck_app"
TASK = "tests.e2e.crosscheck_app.limited"


def refusal(port: int, api: str, url: str, limit: int) -> str:
    """Start the worker; assert it exits non-zero without becoming ready; return its output."""
    knobs = {"REDLOCK_TEST_API": api, "REDLOCK_TEST_URL": url, "REDLOCK_TEST_LIMIT": str(limit)}
    status, output = WorkerProcess(port, "w1", app=APP, env=knobs).run_to_exit()
    assert status != 0, output[-3000:]
    assert "ready." not in output
    return output


@pytest.mark.parametrize("api", ["task", "decorator"])
def test_lock_limit_over_a_quorum_stops_the_worker_at_start(
    redis_server: RedisServer, redis_url: str, api: str
) -> None:
    quorum = json.dumps([f"redis://127.0.0.1:{dead_port()}/0" for _ in range(3)])
    output = refusal(redis_server.port, api, quorum, limit=2)
    option = "option lock_limit" if api == "task" else "@single_instance keyword limit"
    assert f"LockConfigError: task {TASK}: {option}=2 is invalid with a Redlock quorum" in output


@pytest.mark.parametrize("api", ["task", "decorator"])
def test_an_invalid_redlock_url_stops_the_worker_at_start(
    redis_server: RedisServer, redis_url: str, api: str
) -> None:
    output = refusal(redis_server.port, api, "redis://:badport", limit=1)
    assert "LockConfigError: app 'crosscheck_app': setting redlock_url='redis://:badport'" in output
    assert "is invalid" in output
