"""Requeues caused by the lock do not use up ``max_retries``; ``lock_retry_for`` bounds them.

In-process worker (threads pool), real Redis, both APIs. The busy key is held by a plain
:class:`~celery_redlock.Lock` stored under the task's key, so the test decides when it frees.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery, Task

from celery_redlock import Lock, LockContended, LockedTask, lock_key, single_instance
from celery_redlock.signals import lock_contended
from celery_redlock.testing import wait_until
from support.workers import running_worker

APIS = ("task", "decorator")


def locked(
    app: Celery, api: str, fun: Callable[..., Any], task_options: dict[str, Any], **options: Any
) -> Any:
    """``fun`` as a bound locked task under ``api`` (``lock_*`` options / decorator keywords)."""
    if api == "task":
        lock_options = {f"lock_{name}": value for name, value in options.items()}
        return app.task(base=LockedTask, bind=True, shared=False, **task_options, **lock_options)(
            fun
        )
    return app.task(bind=True, shared=False, **task_options)(single_instance(**options)(fun))


def hold(redis_url: str, task: Any) -> Lock:
    """Hold ``task``'s key (``lock_by=()``) from outside, as another owner would."""
    name = lock_key(task).removeprefix("redlock:{").removesuffix("}")
    lock = Lock(redis_url, name, ttl=60, owner="the-holder")
    assert lock.acquire()
    return lock


@pytest.fixture
def contended() -> Iterator[list[dict[str, Any]]]:
    """Every ``lock_contended`` signal sent while the test runs."""
    seen: list[dict[str, Any]] = []
    guard = threading.Lock()

    def receiver(sender: Any = None, **fields: Any) -> None:
        with guard:
            seen.append(fields)

    lock_contended.connect(receiver, weak=False)
    yield seen
    lock_contended.disconnect(receiver)


def retried(seen: list[dict[str, Any]], task_id: str) -> int:
    return sum(1 for c in seen if c["task_id"] == task_id and c["policy"] == "retry")


@pytest.mark.parametrize("api", APIS)
def test_contention_retries_leave_request_retries_unchanged(
    app: Celery, redis_url: str, api: str, contended: list[dict[str, Any]]
) -> None:
    """With ``max_retries=1`` the call is retried more than once for the lock, then runs once
    the holder releases, and its body sees ``request.retries == 0``."""

    def work(self: Task) -> int:
        return int(self.request.retries)

    task = locked(
        app, api, work, {"max_retries": 1}, by=(), on_contention="retry", retry_countdown=0.1
    )
    holder = hold(redis_url, task)
    with running_worker(app):
        result = task.delay()
        try:
            wait_until(lambda: retried(contended, result.id) >= 3, 20, "three lock retries")
        finally:
            holder.release()
        assert result.get(timeout=20) == 0
    assert retried(contended, result.id) >= 3 > 1  # more than max_retries


@pytest.mark.parametrize("api", APIS)
def test_own_failures_still_get_exactly_max_retries_after_lock_retries(
    app: Celery, redis_url: str, api: str, contended: list[dict[str, Any]]
) -> None:
    """``autoretry_for`` counts only the task's own failures: after several lock retries the
    body still runs 1 + max_retries times, with ``request.retries`` 0, 1, 2."""
    seen: list[int] = []

    def work(self: Task) -> None:
        seen.append(int(self.request.retries))
        raise KeyError("own failure")

    options = {"max_retries": 2, "autoretry_for": (KeyError,), "retry_kwargs": {"countdown": 0}}
    task = locked(app, api, work, options, by=(), on_contention="retry", retry_countdown=0.05)
    holder = hold(redis_url, task)
    with running_worker(app):
        result = task.delay()
        try:
            wait_until(lambda: retried(contended, result.id) >= 2, 20, "two lock retries")
        finally:
            holder.release()
        with pytest.raises(KeyError):
            result.get(timeout=20)
    assert seen == [0, 1, 2]


@pytest.mark.parametrize("api", APIS)
def test_lock_retry_for_ends_the_call_with_lock_contended(
    app: Celery,
    redis_url: str,
    api: str,
    contended: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A key held for longer than ``lock_retry_for`` fails the call with ``LockContended``,
    logged at INFO as an expected outcome (no traceback), after more than one lock retry,
    however large ``max_retries`` is."""
    runs: list[int] = []

    def work(self: Task) -> None:
        runs.append(1)

    task = locked(
        app,
        api,
        work,
        {"max_retries": 100},
        by=(),
        on_contention="retry",
        retry_countdown=0.1,
        retry_for=1,
    )
    holder = hold(redis_url, task)
    try:
        with running_worker(app), caplog.at_level(logging.INFO):
            result = task.delay()
            # The caller's result says why the call was not requeued, not only the worker log.
            with pytest.raises(LockContended, match=r"not requeued: .* past lock_retry_for=1"):
                result.get(timeout=20)
    finally:
        holder.release()
    assert runs == []
    assert retried(contended, result.id) > 1
    failed = [c for c in contended if c["task_id"] == result.id][-1]
    assert failed["holder"] == "the-holder"
    gave_up = [
        rec
        for rec in caplog.records
        if rec.name == "celery_redlock.task" and "lock_retry_for" in rec.getMessage()
    ]
    assert [rec.levelno for rec in gave_up] == [logging.INFO]
    traced = [
        rec
        for rec in caplog.records
        if rec.name == "celery.app.trace" and result.id in rec.getMessage()
    ]
    ended = [rec for rec in traced if "LockContended" in rec.getMessage()]
    assert ended and all(rec.levelno == logging.INFO and not rec.exc_info for rec in ended)
    assert any(rec.getMessage().count("Retry in 0.1") for rec in traced)  # Celery's own line


@pytest.mark.parametrize("api", APIS)
def test_a_task_s_own_retry_starts_the_lock_retry_budget_anew(
    app: Celery, redis_url: str, api: str, contended: list[dict[str, Any]]
) -> None:
    """The header that measures ``lock_retry_for`` (its ``first`` requeue by the lock) is
    carried into the task's own retries: a call requeued by the lock, then run, then retried
    by its body with a countdown, failed at the retry's first requeue ("requeued by the lock
    for 6.6s" of which 5 were its own countdown). Only the lock's requeues since the task's
    last own retry count. Here the body retries with ``countdown=2.5`` past a budget of 2 s,
    and its retry finds the key held again."""
    ran: list[int] = []
    retrying = threading.Event()

    def work(self: Task) -> int:
        ran.append(self.request.retries)
        if self.request.retries == 0:
            retrying.set()
            raise self.retry(countdown=2.5)
        return self.request.retries

    task = locked(
        app,
        api,
        work,
        {"max_retries": 3},
        by=(),
        on_contention="retry",
        retry_countdown=0.1,
        retry_for=2,
    )
    first = hold(redis_url, task)
    with running_worker(app):
        result = task.delay()
        wait_until(lambda: retried(contended, result.id) >= 1, 10, "a requeue by the lock")
        first.release()  # the call runs, then retries itself
        assert retrying.wait(10)
        again = hold(redis_url, task)  # once the body released it: the retry finds it held
        wait_until(lambda: retried(contended, result.id) >= 2, 10, "its retry's requeue")
        again.release()
        assert result.get(timeout=10) == 1
    assert ran == [0, 1]


@pytest.mark.parametrize("api", APIS)
def test_a_lock_of_your_own_holding_the_key_is_named_as_such_not_as_an_empty_task(
    app: Celery, redis_url: str, api: str, contended: list[dict[str, Any]]
) -> None:
    """Probe, round 23: a ``Lock`` of your own (no ``owner``) on a task's key made the log and
    the error say "held by task " and the signal carry ``holder=""``; the CLI said
    ``task (none)``."""

    def work(self: Task) -> None: ...

    task = locked(app, api, work, {}, by=(), on_contention="fail")
    name = lock_key(task).removeprefix("redlock:{").removesuffix("}")
    mine = Lock(redis_url, name, ttl=60)
    assert mine.acquire()
    try:
        with running_worker(app):
            result = task.delay()
            with pytest.raises(LockContended) as info:
                result.get(timeout=20)
    finally:
        mine.release()
    assert "held by a lock with no task id (a Lock of your own)" in str(info.value)
    assert info.value.holder is None
    assert [c["holder"] for c in contended if c["task_id"] == result.id] == [None]
