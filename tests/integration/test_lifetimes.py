"""Lock lifetimes by their sidekiq-unique-jobs names (docs/lifetimes.md), on a real worker.

``until_executed`` ("no second call while one is queued or running") is
``lock_enqueue='until_executed'``: the queued marker lives until the execution ends. The other
lifetimes are existing options, pinned in their own test files (``test_enqueue.py``,
``test_task.py``); here the contrast with ``'keep'`` is shown on the same scenario.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis as redis_py
from celery import Celery

from celery_redlock import LockedTask, lock_key
from celery_redlock.testing import RedisServer, wait_until
from support.apps import lock_keys
from support.workers import Holder, running_worker


@pytest.fixture
def broker(redis_server: RedisServer, redis_url: str) -> Iterator[redis_py.Redis]:
    client = redis_py.Redis(port=redis_server.port, db=1)
    yield client
    client.close()


def marker(task: Any, *args: Any) -> str:
    return lock_key(task, *args) + ":queued"


def test_until_executed_returns_the_running_call_instead_of_queueing_another(
    app: Celery, r: redis_py.Redis, broker: redis_py.Redis, h: Holder
) -> None:
    ran: list[int] = []

    @app.task(base=LockedTask, lock_enqueue="until_executed")
    def job(n: int) -> int:
        h.hold()
        ran.append(n)
        return n

    queued = job.delay(1)
    assert job.delay(1).id == queued.id  # while queued, as with 'keep'
    with running_worker(app):
        assert h.entered.wait(10)
        assert r.get(marker(job, 1)) == queued.id.encode()  # kept while it runs
        again = job.delay(1)
        assert again.id == queued.id
        assert broker.llen("celery") == 0  # nothing was published
        h.gate.set()
        assert queued.get(timeout=10) == 1
        assert not r.exists(marker(job, 1))  # cleared before the result was stored
        later = job.delay(1)  # the call ended: the next one is published and runs
        assert later.id != queued.id
        assert later.get(timeout=10) == 1
        wait_until(lambda: lock_keys(r) == [], 5, "the lock to be released")
    assert ran == [1, 1]


def test_keep_publishes_a_call_made_while_the_first_runs(
    app: Celery, r: redis_py.Redis, h: Holder
) -> None:
    @app.task(base=LockedTask, lock_enqueue=True)
    def job(n: int) -> int:
        h.hold()
        return n

    with running_worker(app):
        first = job.delay(1)
        assert h.entered.wait(10)
        assert not r.exists(marker(job, 1))  # cleared when the execution started
        second = job.delay(1)
        assert second.id != first.id
        assert second.get(timeout=10) is None  # skipped at run time by the run lock
        h.gate.set()
        assert first.get(timeout=10) == 1


def test_until_executed_clears_the_marker_of_a_failed_run_and_keeps_it_through_a_retry(
    app: Celery, r: redis_py.Redis, h: Holder
) -> None:
    attempts: list[int] = []

    @app.task(base=LockedTask, bind=True, lock_enqueue="until_executed")
    def flaky(self: Any, n: int) -> int:
        attempts.append(self.request.retries)
        if self.request.retries == 0:
            raise self.retry(countdown=0.1)
        h.hold()  # the second attempt runs only once the test looked at the marker
        return n

    @app.task(base=LockedTask, lock_enqueue="until_executed")
    def broken(n: int) -> int:
        raise ValueError(n)

    with running_worker(app):
        failing = broken.delay(2)
        with pytest.raises(ValueError):
            failing.get(timeout=10)
        assert not r.exists(marker(broken, 2))
        retried = flaky.delay(3)
        wait_until(lambda: attempts == [0], 10, "the first attempt")
        assert h.entered.wait(10)  # the retry runs: the call is not finished
        assert r.get(marker(flaky, 3)) == retried.id.encode()
        assert flaky.delay(3).id == retried.id
        h.gate.set()
        assert retried.get(timeout=10) == 3
        assert not r.exists(marker(flaky, 3))
    assert attempts == [0, 1]
