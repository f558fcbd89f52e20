"""The Celery app of the dashboard's browser tests, in real ``celery worker`` processes.

Configured like :mod:`tests.e2e.tooling_app` (``REDLOCK_TEST_PORT``: db 0 locks, 1 broker,
2 results, 3 records), with the timeline ring on (``redlock_timeline``).

``hold(key)`` records ``started:<key>`` (its task id and pid) in db 3 and keeps its lock until
the test pushes to ``go:<key>`` (or 20 s pass): tests synchronize on these records.
"""

from __future__ import annotations

import json
import os
from typing import Any

import redis

from celery_redlock import LockedTask
from support.apps import layout_app

PORT = int(os.environ["REDLOCK_TEST_PORT"])
BASE = f"redis://127.0.0.1:{PORT}"

app = layout_app(
    "web_app",
    BASE,
    redlock_timeline=1000,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=True,
)

records = redis.Redis.from_url(f"{BASE}/3", socket_timeout=None)


@app.task(base=LockedTask, bind=True, lock_by=["key"])
def hold(self: Any, key: str) -> str:
    """Hold the lock of ``key`` until ``go:<key>`` is pushed (at most 20 s)."""
    records.set(f"started:{key}", json.dumps({"id": self.request.id, "pid": os.getpid()}))
    records.blpop([f"go:{key}"], timeout=20)
    return key
