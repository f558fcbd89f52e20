"""``LockedTask`` and ``@single_instance`` behave alike, on an in-process worker (threads pool).

Each test runs once per API: ``api`` is ``"task"`` (``base=LockedTask`` with ``lock_*``
options) or ``"decorator"`` (``@single_instance`` with the same keywords on a plain task).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest
import redis as redis_py
from celery import Celery, Task

from celery_redlock import (
    Lock,
    LockConfigError,
    LockContended,
    LockedTask,
    lock_key,
    signals,
    single_instance,
)
from celery_redlock.testing import wait_until
from support.apps import lock_keys
from support.workers import Holder, running_worker

APIS = ("task", "decorator")


def locked(
    app: Celery,
    api: str,
    fun: Callable[..., Any],
    mixin: type | None = None,
    task_options: dict[str, Any] | None = None,
    **options: Any,
) -> Any:
    """Register ``fun`` on ``app`` as a locked task under ``api``.

    ``options`` are the decorator's keywords (``lock_<name>`` on ``LockedTask``); ``mixin``
    adds hooks to the task class; ``task_options`` are plain ``@app.task`` options.
    """
    task_options = {"shared": False, **(task_options or {})}
    if api == "task":
        base = type("Base", (mixin, LockedTask) if mixin else (LockedTask,), {})
        lock_options = {f"lock_{name}": value for name, value in options.items()}
        return app.task(base=base, **task_options, **lock_options)(fun)
    base = type("Base", (mixin, Task) if mixin else (Task,), {})
    return app.task(base=base, **task_options)(single_instance(**options)(fun))


# -- the release moment ------------------------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
def test_the_lock_is_released_before_the_result_is_stored(
    app: Celery, r: redis_py.Redis, api: str
) -> None:
    """A caller holding the result can call again at once, and the call runs.

    Celery's tracer stores the result, then runs ``on_success``, ``task_success`` and
    ``after_return``. Here the first call's ``on_success`` waits until the second call is over:
    had the lock been released after the result (in ``after_return``), the second call would
    find the key held and be skipped (``None``).
    """
    proceed = threading.Event()

    class Gated:
        def on_success(self, retval: Any, task_id: str, args: Any, kwargs: Any) -> None:
            if kwargs.get("gated"):
                proceed.wait(10)

    def work(key: str, gated: bool = False) -> str:
        return key

    task = locked(app, api, work, mixin=Gated, by=["key"])
    with running_worker(app):
        try:
            assert task.delay("k", gated=True).get(timeout=10) == "k"
            assert task.delay("k").get(timeout=10) == "k", "the second call was skipped"
        finally:
            proceed.set()
        for _ in range(5):  # and back to back, without any hook
            assert task.delay("k").get(timeout=10) == "k"
    assert lock_keys(r) == []


# -- contention is an expected outcome under both APIs ------------------------------------------


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("policy", ["fail", "wait", "retry"])
def test_contention_is_logged_as_expected_at_info_without_a_traceback(
    h: Holder, app: Celery, api: str, policy: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``fail``, a ``wait`` that times out and a ``retry`` out of retries all end the call with
    ``LockContended``: Celery logs it as ``raised expected`` at INFO, not as an ERROR with a
    traceback."""
    options: dict[str, Any] = {"by": (), "on_contention": policy}
    task_options: dict[str, Any] = {}
    if policy == "wait":
        options["wait_timeout"] = 0.2
    if policy == "retry":
        options["retry_countdown"] = 0
        options["retry_for"] = 0.2  # lock retries do not count against max_retries
        task_options["max_retries"] = 0

    def work(role: str) -> str:
        if role == "holder":
            h.hold()
        return role

    task = locked(app, api, work, task_options=task_options, **options)
    with running_worker(app), caplog.at_level(logging.INFO):
        holder = task.delay("holder")
        assert h.entered.wait(10)
        contended = task.delay("contender")
        with pytest.raises(LockContended):
            contended.get(timeout=10)

        def traced() -> list[logging.LogRecord]:
            return [
                record
                for record in caplog.records
                if record.name == "celery.app.trace"
                and contended.id in record.getMessage()
                and "Retry in" not in record.getMessage()  # 'retry': the lock retry's line
            ]

        (record,) = wait_until(traced, 5.0, "the tracer's log line of the contended call")
        h.gate.set()
        assert holder.get(timeout=10) == "holder"
    assert record.levelno == logging.INFO, record.getMessage()
    assert "raised expected: LockContended(" in record.getMessage()
    assert record.exc_info is None and record.exc_text is None  # no traceback


@pytest.mark.parametrize("api", APIS)
def test_a_body_that_applies_its_own_key_fails_at_once_instead_of_waiting(
    app: Celery, api: str
) -> None:
    """Probe: a locked body that called ``apply()`` of its own key under ``wait`` waited out
    the whole ``lock_wait_timeout`` (its own execution holds the key and ends only after the
    call), then failed with "still held after waiting". It fails at once, naming the way."""

    def work(account_id: int, nested: bool = False) -> str:
        if nested:
            return "the inner call ran"
        try:
            return str(task.apply((account_id,), {"nested": True}).get())
        except LockContended as exc:
            return str(exc)

    task = locked(app, api, work, by=["account_id"], on_contention="wait", wait_timeout=600)
    with running_worker(app):
        said = task.delay(7).get(timeout=60)
    assert "which made this call on this thread and ends only after it" in said, said
    assert "call the task directly (task(...), not apply())" in said


@pytest.mark.parametrize("api", APIS)
def test_a_body_that_applies_its_own_semaphore_still_waits_for_another_slot(
    app: Celery, redis_url: str, api: str
) -> None:
    """Review: the check above failed a semaphore's call at once when the slot read as its
    holder was the running execution's, though another slot could free within the wait (a
    holder of the other slot here, released as the inner call begins to wait)."""
    other: list[Lock] = []

    def freed(sender: Any = None, policy: str = "", **_: Any) -> None:
        if policy == "wait" and other:
            other.pop().release()  # the other slot frees during the wait

    def work(account_id: int, nested: bool = False) -> str:
        if nested:
            return "the inner call ran"
        # The other slot, held longer than this execution's: this one reads as the holder.
        holder = Lock(
            redis_url, lock_key(task, account_id).removeprefix("redlock:{")[:-1], ttl=100, limit=2
        )
        assert holder.acquire(blocking=False)
        other.append(holder)
        return str(task.apply((account_id,), {"nested": True}).get())

    task = locked(
        app, api, work, by=["account_id"], limit=2, on_contention="wait", wait_timeout=60, ttl=30
    )
    signals.lock_contended.connect(freed, weak=False)
    try:
        with running_worker(app):
            assert task.delay(8).get(timeout=60) == "the inner call ran"
    finally:
        signals.lock_contended.disconnect(freed)


def test_two_stacked_single_instance_fail_the_call_that_reaches_the_inner_one(
    app: Celery,
) -> None:
    """Probe: of two stacked ``@single_instance``, the inner lock was never taken, and calls
    of its key ran at once. Where no worker start refused it (an eager call in an app not
    finalized), the call fails when it reaches the inner wrapper, before the body."""
    ran: list[int] = []

    @app.task(shared=False)
    @single_instance(by=["account_id"], name="per-account")
    @single_instance(by=["region"], name="per-region")
    def sync(account_id: int, region: str) -> None:
        ran.append(account_id)

    result = sync.apply((1, "eu"))
    assert isinstance(result.result, LockConfigError), result.result
    assert "@single_instance is applied twice" in str(result.result)
    assert ran == []
