"""The Celery app of the ``lock_rate`` end-to-end tests (``celery worker`` subprocesses).

Configured from the environment, like :mod:`tests.e2e.proj`: ``REDLOCK_TEST_PORT`` is the test's
private redis-server (db 0 locks, 1 broker, 2 results, 3 records); ``REDLOCK_TEST_RATE`` is the
``lock_rate`` of every task here (``"5/s"`` by default).

Each task is one lock identity (``lock_by=()``) under ``lock_on_contention="wait"``, so a call
is never skipped, and ``max_retries=0``: a rate retry that counted against ``max_retries``
would fail the call. Every start appends one JSON record to the list ``starts:<task name>`` in
db 3: the task id, ``request.retries``, the server time at which the rate script admitted the
start (``admitted``, microseconds) and the server time the body read with ``TIME`` as its first
command (``body``, microseconds).
"""

from __future__ import annotations

import json
import os
import random
import time
from typing import Any

import redis

from celery_redlock import LockedTask, single_instance
from celery_redlock._celery.engine import RATE_ATTR
from support.apps import env, layout_app

PORT = int(os.environ["REDLOCK_TEST_PORT"])
BASE = f"redis://127.0.0.1:{PORT}"
RATE = env("RATE") or "5/s"

app = layout_app("rate_app", BASE, worker_prefetch_multiplier=1, worker_hijack_root_logger=True)

records = redis.Redis.from_url(f"{BASE}/3")


def record(task: Any, duration: float) -> None:
    """Record this start, then work for ``duration`` seconds (at most)."""
    seconds, micros = records.time()
    entry = {
        "id": task.request.id,
        "retries": task.request.retries or 0,
        "admitted": getattr(task.request, RATE_ATTR, None),
        "body": seconds * 1_000_000 + micros,
    }
    records.rpush(f"starts:{task.name}", json.dumps(entry))
    time.sleep(random.uniform(0, duration))


@app.task(
    base=LockedTask,
    bind=True,
    max_retries=0,
    lock_by=(),
    lock_rate=RATE,
    lock_limit=2,
    lock_on_contention="wait",
)
def rated(self: Any, n: int, duration: float = 0.0) -> int:
    """``LockedTask``: at most ``RATE`` starts, and at most two at once."""
    record(self, duration)
    return n


@app.task(bind=True, max_retries=0)
@single_instance(by=(), rate=RATE, on_contention="wait")
def plain_rated(self: Any, n: int, duration: float = 0.0) -> int:
    """``@single_instance``: at most ``RATE`` starts, one at a time."""
    record(self, duration)
    return n
