"""The demo's Celery app: one locked task that many duplicate calls contend for.

Configured from ``DEMO_REDIS_URL`` (db 0 locks, 1 broker, 2 results, 3 the demo's records).
"""

from __future__ import annotations

import os
import time

import redis
from celery import Celery

from celery_redlock import LockedTask, current_lock

BASE = os.environ.get("DEMO_REDIS_URL", "redis://127.0.0.1:6379").rstrip("/")

app = Celery("example_project", broker=f"{BASE}/1", backend=f"{BASE}/2")
app.conf.update(
    redlock_url=f"{BASE}/0",
    broker_connection_retry_on_startup=True,
    worker_prefetch_multiplier=1,
)

records = redis.Redis.from_url(f"{BASE}/3")


@app.task(base=LockedTask, lock_by=["account_id"])
def sync_account(account_id: int) -> int | None:
    """Pretend to sync an account; record who is inside the critical section."""
    lock = current_lock()
    inside = records.incr(f"inside:{account_id}")
    records.zadd("max_inside", {account_id: inside}, gt=True)  # atomic running maximum
    records.rpush("timeline", f"enter token={lock.fencing_token if lock else None}")
    time.sleep(0.05)
    records.rpush("timeline", "exit")
    records.decr(f"inside:{account_id}")
    return account_id
