"""The lock signals fire with their documented arguments, and a skip is a Celery event.

In-process workers (threads pool) for the signals sent where the task runs; ``celery worker``
subprocesses for the release done by the worker's main process and for the event, which a
receiver bound to the broker must see.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis as redis_py
from celery import Celery
from celery.utils.dispatch import Signal

from celery_redlock import Lock, LockContended, LockedTask, current_lock, lock_key
from celery_redlock.signals import lock_acquired, lock_contended, lock_lost, lock_released
from celery_redlock.testing import RedisServer
from tests.conftest import make_app, running_worker
from tests.e2e.harness import WorkerProcess, wait_until

HOLD = "tests.e2e.proj6.hold"


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
    assert only(acquired, result.id) == {
        "sender": work,
        "task_id": result.id,
        "key": key,
        "fencing_token": int(r.get(key + ":fence") or 0),
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
    @app.task(base=LockedTask, lock_on_contention=policy, lock_wait_timeout=0.2, max_retries=0)
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


@pytest.mark.slow
def test_released_by_the_parent_for_a_killed_child(
    redis_server: RedisServer, redis_url: str
) -> None:
    records = redis_py.Redis(port=redis_server.port, db=3)
    client = make_app(redis_server, name="proj6")
    with WorkerProcess(redis_server.port, "w1", app="tests.e2e.proj6") as worker:
        result = client.send_task(HOLD, args=("p",))
        wait_until(lambda: records.get("started:p"), 10, "hold('p') to start")
        client.control.revoke(result.id, terminate=True, signal="SIGKILL")
        raw = wait_until(lambda: records.lrange("released", 0, -1), 10, "lock_released")
        entries = [json.loads(e) for e in raw]  # type: ignore[attr-defined]
    client.close()
    key = entries[0]["key"]
    assert entries == [
        {"task": HOLD, "id": result.id, "key": key, "by": "parent", "pid": worker.pid}
    ]
    assert key.startswith("redlock:{tests.e2e.proj6.hold:")
    assert not redis_py.Redis(port=redis_server.port).exists(key)


class EventTap:
    """A Celery event receiver on the broker, running in a thread while inside.

    Entering returns once the receiver provably gets events (a probe it sent came back), so
    nothing sent afterwards can be missed.
    """

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.connection = app.connection_for_read()
        self.receiver = app.events.Receiver(self.connection, handlers={"*": self.events.put})
        self.thread = threading.Thread(
            target=self.receiver.capture, kwargs={"wakeup": False}, daemon=True
        )

    def __enter__(self) -> EventTap:
        self.thread.start()
        deadline = time.monotonic() + 10
        with self.app.events.default_dispatcher() as dispatcher:
            while True:
                dispatcher.send("test-probe")
                with contextlib.suppress(queue.Empty):
                    if self.events.get(timeout=0.05)["type"] == "test-probe":
                        return self
                assert time.monotonic() < deadline, "the event receiver never got a probe"

    def wait_for(self, match: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            event = self.events.get(timeout=max(deadline - time.monotonic(), 0.001))
            if match(event):
                return event

    def __exit__(self, *exc: object) -> None:
        self.receiver.should_stop = True
        self.thread.join(5)
        self.connection.release()


@pytest.mark.slow
def test_a_skip_sends_task_lock_skipped_with_task_events_on(
    redis_server: RedisServer, redis_url: str
) -> None:
    records = redis_py.Redis(port=redis_server.port, db=3)
    client = make_app(redis_server, name="proj6")
    with (
        WorkerProcess(redis_server.port, "w1", app="tests.e2e.proj6", args=["-E"]),
        EventTap(client) as tap,
    ):
        first = client.send_task(HOLD, args=("e",))
        wait_until(lambda: records.get("started:e"), 10, "hold('e') to start")
        second = client.send_task(HOLD, args=("e",))
        assert second.get(timeout=10) is None
        event = tap.wait_for(lambda e: e["type"] == "task-lock-skipped", 10)
        records.rpush("go:e", 1)
        assert first.get(timeout=10) == "e"
    client.close()
    assert event["uuid"] == second.id
    assert event["holder"] == first.id
    assert event["key"].startswith("redlock:{tests.e2e.proj6.hold:")
    assert event["hostname"].startswith("w1@")
