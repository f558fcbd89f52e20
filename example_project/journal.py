"""What the example's tasks record about their locks, for the demo's summary (db 3).

Not needed to use celery-redlock: it shows what the locks did. Records:

* ``inside:<label>``: executions of one key inside their body right now (``INCR``/``DECR``);
  the sorted set ``max_inside`` keeps the highest count each label reached (``ZADD GT``, one
  atomic command), the number the demo checks is 1;
* hashes ``runs`` and ``skips``: bodies run and calls skipped, per task;
* stream ``timeline``: every ``lock_acquired``, ``lock_contended`` and ``lock_released`` signal
  (task, task id, key, fencing token or holder), in the order Redis received them;
* hash ``labels``: lock key -> the readable label of the key (``report``, ``account:42``);
* hash ``cache``: ``requests`` and ``rebuilds`` of :mod:`example_project.cache`.

Task arguments never reach a lock key or a log line; the labels here are the example's own
choice, for display.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import redis
from celery import current_task

from celery_redlock import Lock
from celery_redlock.signals import lock_acquired, lock_contended, lock_released
from example_project.settings import DATA_URL

client = redis.Redis.from_url(DATA_URL)


@contextlib.contextmanager
def inside(label: str, lock: Lock | None) -> Iterator[None]:
    """Count a body in and out of its critical section."""
    if lock is not None:
        client.hset("labels", lock.key, label)
    count = client.incr(f"inside:{label}")
    client.zadd("max_inside", {label: count}, gt=True)
    try:
        yield
    finally:
        client.decr(f"inside:{label}")
        client.hincrby("runs", _short(current_task), 1)


def _short(task: Any) -> str:
    """``sync_account`` for ``example_project.tasks.sync_account``."""
    return str(getattr(task, "name", "?")).rpartition(".")[2]


def _event(event: str, sender: Any, task_id: str, key: str, **fields: Any) -> None:
    entry = {"t": time.time(), "event": event, "task": _short(sender), "id": task_id, "key": key}
    client.xadd("timeline", {**entry, **{k: str(v) for k, v in fields.items()}})


@lock_acquired.connect(weak=False)
def _on_acquired(
    sender: Any = None, task_id: str = "", key: str = "", fencing_token: int | None = None, **_: Any
) -> None:
    _event("acquired", sender, task_id, key, token=fencing_token)


@lock_contended.connect(weak=False)
def _on_contended(
    sender: Any = None,
    task_id: str = "",
    key: str = "",
    holder: str | None = None,
    policy: str = "",
    **_: Any,
) -> None:
    if policy == "skip":
        client.hincrby("skips", _short(sender), 1)
    _event(policy, sender, task_id, key, holder=holder or "")


@lock_released.connect(weak=False)
def _on_released(
    sender: Any = None, task_id: str = "", key: str = "", by: str = "", **_: Any
) -> None:
    _event("released", sender, task_id, key, by=by)
