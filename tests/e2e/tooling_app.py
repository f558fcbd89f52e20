"""The Celery app of the tooling tests (CLI, signals, events, startup checks) in real workers.

Configured from the environment like :mod:`tests.e2e.proj`: ``REDLOCK_TEST_PORT`` is the test's
private redis-server (db 0 locks, 1 broker, 2 results, 3 records); ``REDLOCK_TEST_URL``
replaces ``redlock_url`` (an unreachable server for the startup checks), ``REDLOCK_TEST_PREFIX``
``redlock_prefix``, ``REDLOCK_TEST_LEASE`` ``redlock_lease`` (give the CLI the same) and
``REDLOCK_TEST_EVENT_NAMES`` ``redlock_event_names``.

Records in db 3:

* ``started:<key>``: JSON ``{"id", "pid"}`` of the execution of ``hold`` holding ``key`` now
  (``started:counted:<key>``: the task id of ``counted(key, wait=True)``);
* ``released``: one JSON entry per ``lock_released`` signal received in any process of the
  worker, with ``by`` and the receiving ``pid`` (to tell the main process from a pool child).

``hold(key)`` keeps its lock until the test pushes to the list ``go:<key>`` (or 20 s pass;
``go:counted:<key>`` for ``counted``): tests synchronize on these records, never on a guessed
sleep.
"""

from __future__ import annotations

import json
import os
from typing import Any

import redis

from celery_redlock import LockedTask
from celery_redlock.signals import lock_released
from support.apps import layout_app

PORT = int(os.environ["REDLOCK_TEST_PORT"])
BASE = f"redis://127.0.0.1:{PORT}"

app = layout_app(
    "tooling_app",
    BASE,
    redlock_url=os.environ.get("REDLOCK_TEST_URL") or f"{BASE}/0",
    redlock_prefix=os.environ.get("REDLOCK_TEST_PREFIX") or "redlock",
    redlock_lease=float(os.environ.get("REDLOCK_TEST_LEASE") or 30),
    redlock_event_names=os.environ.get("REDLOCK_TEST_EVENT_NAMES") or "redlock",
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=True,
)

# No socket timeout: hold() blocks on this client for as long as a test keeps the lock held.
records = redis.Redis.from_url(f"{BASE}/3", socket_timeout=None)


@app.task(base=LockedTask, bind=True, lock_by=["key"])
def hold(self: Any, key: str, seconds: float = 120.0) -> str:
    """Hold the lock of ``key`` until ``go:<key>`` is pushed (at most ``seconds``: a bound for a
    test that fails before it pushes, far above what a test's commands take on a loaded
    machine)."""
    records.set(f"started:{key}", json.dumps({"id": self.request.id, "pid": os.getpid()}))
    records.blpop([f"go:{key}"], timeout=seconds)
    return key


@app.task(base=LockedTask, bind=True, lock_by=["key"], lock_name="counted")
def counted(self: Any, key: str, wait: bool = False) -> str:
    """A locked task for the counters (``stats``); with ``wait``, it holds like ``hold`` (120 s
    at most: 20 s ran out under a load of 12 on 2 cores, while a test's five command-line
    runs were still reading its lock)."""
    if wait:
        records.set(f"started:counted:{key}", self.request.id)
        records.blpop([f"go:counted:{key}"], timeout=120)
    return key


@lock_released.connect(weak=False)
def _record_release(
    sender: Any = None, task_id: str = "", key: str = "", by: str = "", **_: Any
) -> None:
    records.rpush(
        "released",
        json.dumps({"task": sender.name, "id": task_id, "key": key, "by": by, "pid": os.getpid()}),
    )
