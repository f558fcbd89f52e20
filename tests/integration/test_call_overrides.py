"""Per-call overrides (``apply_async(..., lock_<option>=...)``) and ``lock_bypass``.

In-process worker (threads pool), real Redis, both APIs. A bad value raises in the caller
for both APIs: ``tests/integration/test_call_routing.py``.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from typing import Any

import pytest
import redis as redis_py
from celery import Celery, Task, chain
from celery.signals import task_retry

from celery_redlock import (
    Lock,
    LockConfigError,
    LockContended,
    LockedTask,
    current_lock,
    lock_key,
    metrics,
    single_instance,
)
from celery_redlock._celery import calls
from celery_redlock._celery.options import settings_for
from celery_redlock._redis.keys import call_key
from celery_redlock.cli import LockStore
from celery_redlock.metrics import read_stats
from celery_redlock.testing import wait_until
from support.workers import running_worker

APIS = ("task", "decorator")


def locked(
    app: Celery,
    api: str,
    fun: Callable[..., Any],
    task_options: dict[str, Any] | None = None,
    **options: Any,
) -> Any:
    """``fun`` as a bound locked task under ``api`` (``lock_*`` options / decorator keywords)."""
    task_options = {"bind": True, "shared": False, **(task_options or {})}
    if api == "task":
        lock_options = {f"lock_{name}": value for name, value in options.items()}
        return app.task(base=LockedTask, **task_options, **lock_options)(fun)
    return app.task(**task_options)(single_instance(**options)(fun))


def hold(redis_url: str, task: Any, *args: Any) -> Lock:
    """Hold the key of ``task(*args)`` from outside, as another owner would."""
    name = lock_key(task, *args).removeprefix("redlock:{").removesuffix("}")
    lock = Lock(redis_url, name, ttl=60, owner="the-holder")
    assert lock.acquire()
    return lock


def waiters(r: redis_py.Redis, key: str) -> int:
    """How many blocking waiters are queued for ``key`` (subscribed, then queued)."""
    return int(r.zcard(f"{key}:waiters"))


def lock_state(self: Task) -> dict[str, Any]:
    """What the body sees of its lock: TTL, renewal, the overrides record in Redis and what
    ``celery redlock inspect`` reads of it."""
    lock = current_lock()
    assert lock is not None
    record = lock.nodes.client.get(call_key(lock.key))  # type: ignore[attr-defined]
    held = LockStore(settings_for(self.app)).read(lock.key)
    assert held is not None
    return {
        "ttl": lock.ttl,
        "auto_renew": lock.auto_renew,
        "record": json.loads(record) if record else None,
        "inspected": held.overrides,
        "token": lock.token,
        "retries": self.request.retries,
    }


@pytest.mark.parametrize("api", APIS)
def test_wait_overrides_fail_for_one_call(
    app: Celery, redis_url: str, r: redis_py.Redis, api: str
) -> None:
    """A task that fails under contention waits for one call given
    ``lock_on_contention='wait', lock_wait_timeout=...``, and runs when the holder releases."""

    def work(self: Task) -> str:
        return "ran"

    task = locked(app, api, work, by=(), on_contention="fail")
    holder = hold(redis_url, task)
    with running_worker(app):
        try:
            with pytest.raises(LockContended):
                task.delay().get(timeout=10)
            waiting = task.apply_async(lock_on_contention="wait", lock_wait_timeout=20)
            wait_until(lambda: waiters(r, holder.key) > 0, 10, "the call to wait")
        finally:
            holder.release()
        assert waiting.get(timeout=10) == "ran"


@pytest.mark.parametrize("api", APIS)
def test_autoretry_for_retries_the_tasks_own_errors_not_the_locks(
    app: Celery, redis_url: str, api: str
) -> None:
    """``autoretry_for=(Exception,)`` retries the body's own error, but a busy key under
    ``fail`` fails the call at once, under both APIs. The decorator's wrapper is the ``run``
    that autoretry wraps: its ``LockContended`` used to be retried, using up the retries."""
    tries: list[int] = []

    def work(self: Task, fail_first: bool) -> int:
        tries.append(self.request.retries)
        if fail_first and self.request.retries == 0:
            raise ValueError("the task's own error")
        return self.request.retries

    retried: list[str] = []

    def on_retry(request: Any = None, **_: Any) -> None:
        retried.append(request.id)

    retrying = {"autoretry_for": (Exception,), "default_retry_delay": 0, "max_retries": 2}
    task = locked(app, api, work, task_options=retrying, by=(), on_contention="fail")
    task_retry.connect(on_retry)
    try:
        with running_worker(app):
            own = task.delay(True)
            assert own.get(timeout=10) == 1
            holder = hold(redis_url, task, False)
            try:
                with pytest.raises(LockContended):
                    task.delay(False).get(timeout=10)
            finally:
                holder.release()
    finally:
        task_retry.disconnect(on_retry)
    assert tries == [0, 1] and retried == [own.id]  # the own error once; the busy key never


@pytest.mark.parametrize("api", APIS)
def test_ttl_override_is_used_recorded_and_survives_a_retry(
    app: Celery, redis_url: str, api: str
) -> None:
    """``lock_ttl=50`` gives this call a fixed TTL, never renewed, on its retry too (the
    header travels with ``self.retry()``); the overrides record names the holder's token."""
    seen: list[dict[str, Any]] = []

    def work(self: Task, again: bool) -> None:
        seen.append(lock_state(self))
        if again and self.request.retries == 0:
            raise self.retry(countdown=0)

    task = locked(app, api, work, {"max_retries": 1}, by=())
    with running_worker(app):
        task.apply_async((True,), lock_ttl=50).get(timeout=10)
        task.delay(False).get(timeout=10)
    first, retry, plain = seen
    for state in (first, retry):
        assert (state["ttl"], state["auto_renew"]) == (50.0, False)
        assert state["record"]["token"] == state["token"]
        assert state["record"]["overrides"] == state["inspected"] == {"ttl": 50.0}
    assert retry["retries"] == 1
    # The next call has no override: the old record (it lives as long as the lock did) names
    # another holder, and inspect does not show it.
    assert (plain["auto_renew"], plain["inspected"]) == (True, None)
    assert plain["record"] is None or plain["record"]["token"] != plain["token"]


@pytest.mark.parametrize("api", APIS)
def test_retry_countdown_override(
    app: Celery, redis_url: str, api: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``lock_on_contention='retry', lock_retry_countdown=0.05`` on one call of a task whose
    own countdown is an hour: Celery's retry line shows the call's countdown."""

    def work(self: Task) -> str:
        return "ran"

    task = locked(app, api, work, by=(), on_contention="fail", retry_countdown=3600)
    holder = hold(redis_url, task)
    with running_worker(app), caplog.at_level(logging.INFO):
        try:
            result = task.apply_async(lock_on_contention="retry", lock_retry_countdown=0.05)

            def retry_lines() -> list[str]:
                return [
                    rec.getMessage()
                    for rec in caplog.records
                    if rec.name == "celery.app.trace" and result.id in rec.getMessage()
                ]

            wait_until(lambda: len(retry_lines()) >= 2, 10, "two retries")
            lines = retry_lines()
        finally:
            holder.release()
        assert result.get(timeout=10) == "ran"
    countdowns = [float(m) for line in lines for m in re.findall(r"Retry in ([0-9.]+)s", line)]
    assert countdowns and all(0.05 <= c <= 0.06 for c in countdowns)


def test_locked_task_rejects_bad_overrides_at_apply_async(app: Celery) -> None:
    def work(self: Task) -> None:
        pass

    task = locked(app, "task", work, by=())
    bad: list[tuple[dict[str, Any], str]] = [
        ({"lock_on_contention": "wiat"}, "did you mean 'wait'"),
        ({"lock_wait_timout": 5}, "did you mean 'lock_wait_timeout'"),
        ({"lock_wait_timeout": -1}, "lock_wait_timeout=-1"),
        ({"lock_ttl": "5"}, "lock_ttl='5'"),
        ({"lock_limit": 2}, "cannot be given per call"),
        ({"lock_bypass": "yes"}, "lock_bypass='yes'"),
    ]
    for options, message in bad:
        with pytest.raises(LockConfigError, match=re.escape(message)):
            task.apply_async(**options)


def test_locked_task_apply_takes_the_per_call_options(app: Celery, redis_url: str) -> None:
    """``apply()`` takes the per-call options of ``apply_async()``: validated, and given to the
    lock. Celery's own ``apply()`` dropped them, so a call meant to fail on a held key was
    skipped, and a misspelled option was accepted without a word."""

    def work(self: Task) -> str:
        return "ran"

    # Its own name: the bypass below is counted under it, not under the other tests' "work".
    task = locked(app, "task", work, {"name": "proj.applied"}, by=(), on_contention="skip")
    with pytest.raises(LockConfigError, match=re.escape("did you mean 'lock_ttl'")):
        task.apply(lock_tll=5)
    with pytest.raises(LockConfigError, match=re.escape("did you mean 'fail'")):
        task.apply(lock_on_contention="fial")
    holder = hold(redis_url, task)
    try:
        assert task.apply().result is None  # the task's own policy: skipped
        failed = task.apply(lock_on_contention="fail")
        assert failed.failed() and isinstance(failed.result, LockContended)
        assert task.apply(lock_bypass=True).get() == "ran"
    finally:
        holder.release()
    assert task.apply(lock_ttl=7).get() == "ran"


@pytest.mark.parametrize("api", APIS)
def test_bypass_runs_without_the_lock_warns_and_counts(
    app: Celery, redis_url: str, api: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``lock_bypass=True`` runs while another owner holds the key: no lock in the body, a
    WARNING with the task id, and ``bypassed`` in the counters."""

    def work(self: Task) -> bool:
        return current_lock() is None

    task = locked(app, api, work, by=(), on_contention="fail")
    holder = hold(redis_url, task)
    try:
        with running_worker(app), caplog.at_level(logging.INFO):
            result = task.apply_async(lock_bypass=True)
            assert result.get(timeout=10) is True
            with pytest.raises(LockContended):  # the next call is locked again
                task.delay().get(timeout=10)
    finally:
        holder.release()
    warned = [
        rec
        for rec in caplog.records
        if rec.levelno == logging.WARNING and "WITHOUT the lock" in rec.getMessage()
    ]
    assert [result.id in rec.getMessage() for rec in warned] == [True]

    def counted() -> bool:
        metrics.flush()
        return read_stats(app).get(task.name, {}).get("bypassed") == 1

    wait_until(counted, 10, "the bypassed counter")


def test_a_chains_options_reach_its_first_step_and_a_steps_own_set_reaches_it(
    app: Celery, redis_url: str
) -> None:
    """As the guide says (Celery's rule, pinned here): ``chain(a, b).apply_async(
    lock_bypass=True)`` bypasses ``a`` only, and ``b`` is locked (here it fails on the held
    key); ``b.s().set(lock_bypass=True)`` bypasses ``b``; run eagerly, both are bypassed."""

    def work(self: Task, *args: Any) -> bool:
        return current_lock() is None

    first = locked(app, "task", work, {"name": "chain.first"}, by=(), on_contention="fail")
    second = locked(app, "task", work, {"name": "chain.second"}, by=(), on_contention="fail")
    holders = [hold(redis_url, first), hold(redis_url, second)]
    try:
        with running_worker(app):
            whole = chain(first.s(), second.s()).apply_async(lock_bypass=True)
            with pytest.raises(LockContended):
                whole.get(timeout=10)
            assert whole.parent is not None and whole.parent.get(timeout=10) is True
            each = chain(first.s().set(lock_bypass=True), second.s().set(lock_bypass=True))
            assert each.apply_async().get(timeout=10) is True
        eager = chain(first.s(), second.s()).apply(lock_bypass=True)  # every step, eagerly
        assert eager.get() is True and eager.parent is not None and eager.parent.get() is True
    finally:
        for holder in holders:
            holder.release()


@pytest.mark.parametrize("api", APIS)
def test_a_requeued_duplicate_is_never_skipped_when_another_call_took_the_key(
    app: Celery, redis_url: str, api: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A duplicate's requeue stays a duplicate. The broker marks only the redelivered message,
    not the requeue the lock publishes for it. Timeline seen with a lost worker: (1) copies of
    calls A and C find the dead A holding the key; both are requeued; (2) C's comes back
    first and runs; (3) A's finds C's key, not its own task id, and was skipped under
    ``skip``: A never ran. Here the key is first held under the call's own task id (a
    duplicate's case), then by another call: the requeue comes back, is requeued again after
    ``lock_retry_countdown`` (not the holder's TTL: another call holds it), and runs once the
    other call is done."""

    def work(self: Task) -> str:
        return "ran"

    task = locked(app, api, work, by=(), retry_countdown=0.2)
    name = lock_key(task).removeprefix("redlock:{").removesuffix("}")
    task_id = "a-lost-workers-call"
    own = Lock(redis_url, name, ttl=2, owner=task_id)  # "its dead run"
    assert own.acquire()
    with running_worker(app), caplog.at_level(logging.INFO, logger="celery_redlock"):
        result = task.apply_async(task_id=task_id)
        wait_until(lambda: result.state == "RETRY", 10, "the duplicate's requeue")
        own.release()
        other = Lock(redis_url, name, ttl=60, owner="another-call")  # C runs meanwhile
        assert other.acquire()
        try:
            again = f"[{task_id}] requeued again (redelivered) while"
            wait_until(lambda: again in caplog.text, 10, "the duplicate's requeue to come back")
            assert not result.ready() and "skipped" not in caplog.text
        finally:
            other.release()
        assert result.get(timeout=10) == "ran"


@pytest.mark.parametrize("api", APIS)
def test_a_redelivered_call_whose_requeue_would_end_past_lock_retry_for_fails_not_skips(
    app: Celery, redis_url: str, api: str
) -> None:
    """A requeue of a redelivered call (its header says so) held off by another call, whose
    next try would end past ``lock_retry_for``, fails: it is never skipped (SUCCESS, ``None``)
    under the default ``skip``."""

    def work(self: Task) -> str:
        return "ran"

    task = locked(app, api, work, by=(), retry_countdown=5, retry_for=0.5)
    other = hold(redis_url, task)  # another call holds the key for 60 s
    try:
        with running_worker(app):
            result = task.apply_async(headers={"redlock": {"redelivered": True}})
            wait_until(result.ready, 10, "the redelivered call to end")
        assert result.state == "FAILURE", result.result
        assert "not requeued" in str(result.result)
    finally:
        other.release()


@pytest.mark.parametrize("api", APIS)
def test_a_requeued_copy_of_a_call_that_succeeded_is_not_run_again_under_deduplication(
    app: Celery, api: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Under Celery's ``worker_deduplicate_successful_tasks``, the lock's requeue of a
    redelivered copy (marked in its header, not by the broker, so Celery's own check misses
    it) of a call that succeeded is dropped (``Ignore``): the body does not run twice and the
    stored result stays. A copy of a call that failed (Celery requeues one after a hard time
    limit, to run again) or has not ended runs; without the setting, every copy runs."""
    ran: list[str] = []

    def work(self: Task) -> str:
        ran.append(self.request.id)
        return "second"

    task = locked(app, api, work, by=())
    copy = {"redlock": {"redelivered": True}}
    app.backend.store_result("succeeded", "first", "SUCCESS")
    app.backend.store_result("timed-out", None, "FAILURE")
    app.backend.store_result("undeduplicated", "first", "SUCCESS")
    with running_worker(app), caplog.at_level(logging.INFO, logger="celery_redlock.task"):
        app.conf.worker_deduplicate_successful_tasks = True
        task.apply_async(task_id="succeeded", headers=copy)
        dropped = "succeeded] is a redelivered copy of a call that already succeeded"
        wait_until(lambda: dropped in caplog.text, 10, "the copy to be dropped")
        for task_id in ("timed-out", "live-call"):
            task.apply_async(task_id=task_id, headers=copy)
            wait_until(lambda t=task_id: t in ran, 10, f"the copy {task_id} to run")
        app.conf.worker_deduplicate_successful_tasks = False
        task.apply_async(task_id="undeduplicated", headers=copy)
        wait_until(lambda: "undeduplicated" in ran, 10, "the undeduplicated copy to run")
    assert ran == ["timed-out", "live-call", "undeduplicated"]
    assert task.AsyncResult("succeeded").get(timeout=5) == "first"


#: Hand-written headers no ``apply_async`` writes, and what the refusal says of each.
BAD_HEADERS: list[tuple[Any, str]] = [
    ("garbage", "header is str, expected a mapping"),
    ({"bypass": "yes"}, "has bypass='yes', expected true or false"),
    ({"bypass": 1}, "has bypass=1, expected true or false"),
    ({"overrides": "x"}, "has overrides that are no mapping"),
    ("", "header is str, expected a mapping"),
    ({"invalid": "x"}, "has invalid that are no mapping"),
]


@pytest.mark.parametrize("api", APIS)
def test_a_hand_written_header_no_apply_async_writes_fails_the_call(
    app: Celery, redis_url: str, api: str
) -> None:
    """Probe, round 23: the guide says a bad hand-written header fails the call with a
    ``LockConfigError``; these ran locked, with nothing said (a bypass spelled ``"yes"`` too)."""
    ran: list[bool] = []

    def work(self: Task) -> None:
        ran.append(True)

    task = locked(app, api, work, by=())
    refused: list[str] = []
    with running_worker(app):
        for header, _ in BAD_HEADERS:
            result = task.apply_async(headers={"redlock": header})
            with pytest.raises(LockConfigError) as info:
                result.get(timeout=10)
            refused.append(str(info.value))
    for (_, said), message in zip(BAD_HEADERS, refused, strict=True):
        assert said in message and "not by hand" in message, message
    assert ran == []


@pytest.mark.parametrize("api", APIS)
def test_a_header_key_this_version_does_not_read_is_a_warning_not_a_refusal(
    app: Celery,
    redis_url: str,
    api: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A later version may add a key to the header: its callers' calls reach workers not
    upgraded yet during a rolling upgrade, and must run (review, round 23)."""
    monkeypatch.setattr(calls, "_told", set())  # said once per process: not by another test

    def work(self: Task) -> bool:
        return current_lock() is not None

    task = locked(app, api, work, by=())
    with running_worker(app), caplog.at_level(logging.WARNING):
        for _ in range(2):  # said once: each requeue would carry the key again
            assert task.apply_async(headers={"redlock": {"later": 1}}).get(timeout=10) is True
    said = "header carries 'later', which this version does not read; ignored"
    assert caplog.text.count(said) == 1
