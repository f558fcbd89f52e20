"""``lock_limit=3`` end to end: a counting semaphore of owner-checked slots on prefork workers.

The task is :func:`tests.e2e.beat_limit_app.limited`; its body counts itself in and out of
``active:<key>`` with atomic ``INCR``/``DECR`` and keeps the highest count in ``max_active``
(``ZADD GT``).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
import redis as redis_py
from celery import Celery
from celery.exceptions import WorkerLostError

from celery_redlock.testing import RedisServer, wait_until
from support.apps import lock_keys, make_app
from support.procfs import pid_alive
from support.workers import WorkerProcess

pytestmark = pytest.mark.slow

APP = "tests.e2e.beat_limit_app"
TASK = f"{APP}.limited"


@pytest.fixture
def client(redis_url: str, redis_server: RedisServer) -> Iterator[Celery]:
    app = make_app(redis_server, name="beat_limit_app")
    yield app
    app.close()


def entries(records: redis_py.Redis, ev: str) -> list[dict[str, str]]:
    return [
        {k.decode(): v.decode() for k, v in fields.items()}
        for _, fields in records.xrange("events")
        if fields[b"ev"] == ev.encode()
    ]


def test_never_more_than_three_at_once_across_two_workers(
    client: Celery, redis_server: RedisServer, r: redis_py.Redis
) -> None:
    records = redis_py.Redis(port=redis_server.port, db=3)
    with (
        WorkerProcess(redis_server.port, "w1", concurrency=3, app=APP),
        WorkerProcess(redis_server.port, "w2", concurrency=3, app=APP),
    ):
        results = [client.send_task(TASK, args=("k", 0.15)) for _ in range(36)]
        values = [res.get(timeout=30) for res in results]
        # A result is stored before after_return releases: wait for the last releases.
        wait_until(lambda: lock_keys(r) == [], 5, "every slot to be released")
    ran = [v for v in values if v is not None]
    assert records.zscore("max_active", "k") == 3  # reached, never exceeded
    assert len(ran) == len(entries(records, "enter"))
    assert len(ran) + len(entries(records, "contended")) == len(values)
    slots = {e["slot"] for e in entries(records, "enter")}
    assert len(slots) == 3  # the lock key and its slots 2 and 3


def test_the_slot_of_a_killed_child_comes_back(
    client: Celery, redis_server: RedisServer, r: redis_py.Redis
) -> None:
    """SIGKILL the child holding slot 2: the worker's main process releases that slot, owner-
    checked, and the next execution takes it while the other two holders still run."""
    records = redis_py.Redis(port=redis_server.port, db=3)
    with WorkerProcess(redis_server.port, "w1", concurrency=4, app=APP) as worker:
        holders = [client.send_task(TASK, args=("kk",), kwargs={"hold": 20}) for _ in range(3)]
        wait_until(lambda: len(entries(records, "enter")) == 3, 10, "three holders")
        held = {e["slot"]: e for e in entries(records, "enter")}
        assert len(held) == 3
        for slot in held:
            assert 0 < r.pttl(slot) <= 30_000  # a slot expires like the lock (the lease)
        victim_slot = next(slot for slot in held if slot.endswith(":2"))
        victim = held[victim_slot]
        os.kill(int(victim["pid"]), signal.SIGKILL)
        wait_until(lambda: not pid_alive(int(victim["pid"])), 5, "the child to die")
        records.decr("active:kk")  # the dead child cannot count itself out
        wait_until(lambda: not r.exists(victim_slot), 12, "the main process to free slot 2")
        worker.wait_for_log("released the lock of dead child", 5)
        assert sorted(k.decode() for k in lock_keys(r)) == sorted(set(held) - {victim_slot})

        newcomer = client.send_task(TASK, args=("kk",), kwargs={"hold": 20})
        wait_until(
            lambda: any(e["id"] == newcomer.id for e in entries(records, "enter")),
            10,
            "a new execution to take the free slot",
        )
        taken = next(e for e in entries(records, "enter") if e["id"] == newcomer.id)
        assert taken["slot"] == victim_slot
        assert records.zscore("max_active", "kk") == 3  # never more than three, even now

        records.rpush("gate:kk", *["go"] * 3)
        assert newcomer.get(timeout=10) == "kk"
        survivors = [res for res in holders if res.id != victim["id"]]
        assert [res.get(timeout=10) for res in survivors] == ["kk", "kk"]
        killed = next(res for res in holders if res.id == victim["id"])
        with pytest.raises(WorkerLostError):
            killed.get(timeout=10)
        wait_until(lambda: lock_keys(r) == [], 5, "every slot to be released")
