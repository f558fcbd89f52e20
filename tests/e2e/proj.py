"""The Celery app that the end-to-end tests run in real ``celery worker`` subprocesses.

Configured from the environment: ``REDLOCK_TEST_PORT`` is the test's private redis-server
(db 0 locks, 1 broker, 2 results, 3 records), ``REDLOCK_TEST_ACKS_LATE=1`` turns on acks_late
with ``task_reject_on_worker_lost``.

Every critical section records itself in db 3: ``active:<key>`` counts executions inside it
right now, ``overlaps`` counts entries that found another execution inside, and the stream
``events`` holds one entry per enter and exit with the fencing token.
"""

from __future__ import annotations

import os
import time

import redis
from celery import Celery

from celery_redlock import LockedTask, current_lock

PORT = int(os.environ["REDLOCK_TEST_PORT"])
BASE = f"redis://127.0.0.1:{PORT}"

app = Celery("proj", broker=f"{BASE}/1", backend=f"{BASE}/2")
app.conf.update(
    redlock_url=f"{BASE}/0",
    broker_connection_retry_on_startup=True,
    worker_prefetch_multiplier=1,
    task_acks_late=os.environ.get("REDLOCK_TEST_ACKS_LATE") == "1",
    task_reject_on_worker_lost=os.environ.get("REDLOCK_TEST_ACKS_LATE") == "1",
    worker_hijack_root_logger=True,
)

records = redis.Redis.from_url(f"{BASE}/3")


def section(task_id: str, key: str, duration: float) -> None:
    """The critical section: record entry, hold for ``duration`` seconds, record exit."""
    lock = current_lock()
    token = lock.fencing_token if lock is not None else -1
    inside = records.incr(f"active:{key}")
    if inside > 1:
        records.incr("overlaps")
    records.xadd("events", {"ev": "enter", "key": key, "id": task_id, "token": token})
    records.incr(f"runs:{key}")
    time.sleep(duration)
    records.xadd("events", {"ev": "exit", "key": key, "id": task_id, "token": token})
    records.decr(f"active:{key}")


@app.task(base=LockedTask, bind=True, lock_by=["key"])
def critical(self, key: str, duration: float = 0.0) -> str:
    section(self.request.id, key, duration)
    return key
