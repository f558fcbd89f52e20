"""The lock signals fire with their documented arguments, on in-process workers (threads pool).

The signal sent by a worker's main process and the Celery event are proved with ``celery worker``
subprocesses, in ``tests/e2e/test_worker_signals.py``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis as redis_py
from celery import Celery
from celery.utils.dispatch import Signal

from celery_redlock import Lock, LockContended, LockedTask, current_lock, lock_key
from celery_redlock.signals import lock_acquired, lock_contended, lock_lost, lock_released
from celery_redlock.testing import RedisServer, wait_until
from support.apps import make_app
from support.workers import running_worker


@contextlib.contextmanager
def captured(signal: Signal) -> Iterator[list[dict[str, Any]]]:
    """Every ``send`` of ``signal`` while inside, as the receiver's keyword arguments."""
    calls: list[dict[str, Any]] = []

    def receiver(**kwargs: Any) -> None:
        calls.append(kwargs)

    signal.connect(receiver, weak=False)
    try:
        yield calls
    finally:
        signal.disconnect(receiver)


def only(calls: list[dict[str, Any]], task_id: str) -> dict[str, Any]:
    (call,) = [c for c in calls if c["task_id"] == task_id]
    return {k: v for k, v in call.items() if k != "signal"}


def name_of(key: str) -> str:
    return key.removeprefix("redlock:{").removesuffix("}")


def test_a_fencing_token_read_failing_after_the_acquire_runs_the_call(
    redis_server: RedisServer, r: redis_py.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """The token for ``lock_acquired`` is read after the lock is taken (one script). Here the
    ACL user loses the right to run scripts while the worker runs: the next acquire (a plain
    ``SET`` once the connection ran a script) succeeds, the read is refused. The call runs,
    and the receiver gets ``None``; it used to fail with ``LockUnavailable``, its lock held
    until the TTL, so the next call of the key was skipped."""
    if int(str(r.info("server")["redis_version"]).split(".")[0]) < 7:
        pytest.skip("Redis 6.2 acquires with a script, which this user may not run")
    grant = ["ACL", "SETUSER", "noscripts", "reset", "on", ">pw", "~*", "&*", "+@all"]
    r.execute_command(*grant)
    app = make_app(redis_server, redlock_on_unavailable="fail")
    app.conf.redlock_url = f"redis://noscripts:pw@127.0.0.1:{redis_server.port}/0"

    @app.task(base=LockedTask, lock_ttl=5)
    def work(x: int) -> int:
        return x

    try:
        with captured(lock_acquired) as acquired, running_worker(app):
            assert work.delay(1).get(timeout=10) == 1
            r.execute_command(*grant, "-evalsha", "-eval")
            result = work.delay(7)
            assert result.get(timeout=10) == 7
    finally:
        r.execute_command("ACL", "DELUSER", "noscripts")
    assert only(acquired, result.id)["fencing_token"] is None
    assert "lock_acquired gets no fencing token, reading it failed" in caplog.text


def test_acquired_then_released_by_the_task(app: Celery, r: redis_py.Redis) -> None:
    @app.task(base=LockedTask)
    def work(x: int) -> int:
        return x

    with (
        captured(lock_acquired) as acquired,
        captured(lock_released) as released,
        running_worker(app),
    ):
        result = work.delay(7)
        assert result.get(timeout=10) == 7
        wait_until(lambda: released, 10, "lock_released")  # sent after the result is stored
    key = lock_key(work, 7)
    event = only(acquired, result.id)
    # Read from the server's clock because a receiver listens; no counter key is kept.
    assert isinstance(event["fencing_token"], int) and event["fencing_token"] > 0
    assert not r.exists(key + ":fence")
    assert event == {
        "sender": work,
        "task_id": result.id,
        "key": key,
        "fencing_token": event["fencing_token"],
    }
    assert only(released, result.id) == {
        "sender": work,
        "task_id": result.id,
        "key": key,
        "by": "task",
    }


@pytest.mark.parametrize("policy", ["skip", "fail", "retry", "wait"])
def test_contended_names_the_holder_and_the_policy(
    policy: str, app: Celery, redis_url: str
) -> None:
    @app.task(
        base=LockedTask,
        lock_on_contention=policy,
        lock_wait_timeout=0.2,
        lock_retry_countdown=0,  # 'retry': one lock retry at once; the next would end past
        lock_retry_for=0.001,  # lock_retry_for: the call gives up
    )
    def work(x: int) -> int:
        return x

    key = lock_key(work, 1)
    holder = Lock(redis_url, name_of(key), ttl=30, owner="the-holder")
    assert holder.acquire()
    try:
        with captured(lock_contended) as contended, running_worker(app):
            result = work.delay(1)
            if policy == "skip":
                assert result.get(timeout=10) is None
            else:
                with pytest.raises(LockContended):
                    result.get(timeout=10)
    finally:
        holder.release()
    if policy == "retry":  # the retry is contended too, and gives up
        assert [c["policy"] for c in contended if c["task_id"] == result.id] == ["retry"] * 2
        contended = contended[:1]
    assert only(contended, result.id) == {
        "sender": work,
        "task_id": result.id,
        "key": key,
        "holder": "the-holder",
        "policy": policy,
    }


def test_lost_when_renewal_finds_the_key_gone(
    redis_server: RedisServer, redis_url: str, r: redis_py.Redis
) -> None:
    app = make_app(redis_server, redlock_lease=0.6)  # renewed every 0.2 s
    entered, lost_seen = threading.Event(), threading.Event()

    @app.task(base=LockedTask)
    def work(x: int) -> bool:
        entered.set()
        lost_seen.wait(10)
        lock = current_lock()
        return lock is not None and lock.lost

    def on_lost(**_: Any) -> None:
        lost_seen.set()

    lock_lost.connect(on_lost, weak=False)
    try:
        with captured(lock_lost) as lost, running_worker(app):
            result = work.delay(3)
            assert entered.wait(10)
            assert r.delete(lock_key(work, 3)) == 1
            assert result.get(timeout=10) is True
    finally:
        lock_lost.disconnect(on_lost)
        app.close()
    call = only(lost, result.id)
    assert call.pop("reason") == "renewal found it expired or owned by someone else"
    assert call == {"sender": work, "task_id": result.id, "key": lock_key(work, 3)}
