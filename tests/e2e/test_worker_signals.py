"""The lock signals and events of real ``celery worker`` subprocesses: the release done by the
worker's main process for a killed child, and the ``redlock-skipped`` event, which a receiver
bound to the broker must see. (The signals sent where the task runs are proved in-process, in
``tests/integration/test_signals.py``.)
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis as redis_py
from celery import Celery

from celery_redlock.testing import RedisServer, wait_until
from support.apps import make_app
from support.workers import WorkerProcess

pytestmark = pytest.mark.slow

APP = "tests.e2e.tooling_app"
HOLD = f"{APP}.hold"


def test_released_by_the_parent_for_a_killed_child(
    redis_server: RedisServer, redis_url: str
) -> None:
    records = redis_py.Redis(port=redis_server.port, db=3)
    client = make_app(redis_server, name="tooling_app")
    with WorkerProcess(redis_server.port, "w1", app=APP) as worker:
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
    assert key.startswith("redlock:{tests.e2e.tooling_app.hold:")
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


def test_a_skip_sends_redlock_skipped_with_task_events_on(
    redis_server: RedisServer, redis_url: str
) -> None:
    records = redis_py.Redis(port=redis_server.port, db=3)
    client = make_app(redis_server, name="tooling_app")
    with (
        WorkerProcess(redis_server.port, "w1", app=APP, args=["-E"]),
        EventTap(client) as tap,
    ):
        first = client.send_task(HOLD, args=("e",))
        wait_until(lambda: records.get("started:e"), 10, "hold('e') to start")
        second = client.send_task(HOLD, args=("e",))
        assert second.get(timeout=10) is None
        event = tap.wait_for(lambda e: e["type"] == "redlock-skipped", 10)
        records.rpush("go:e", 1)
        assert first.get(timeout=10) == "e"
    client.close()
    assert event["uuid"] == second.id
    assert event["holder"] == first.id
    assert event["key"].startswith("redlock:{tests.e2e.tooling_app.hold:")
    assert event["hostname"].startswith("w1@")
