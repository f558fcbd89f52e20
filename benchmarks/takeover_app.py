"""The Celery app of ``benchmarks/takeover.py``: ``tests.e2e.proj`` plus one task and one stamp.

The workers run ``celery -A benchmarks.takeover_app worker``; every task of
``tests.e2e.proj`` (``ending``, ``waiter``, …) is registered as well, configured from the same
environment (``REDLOCK_TEST_PORT``, ``REDLOCK_TEST_LEASE``, …; see that module).

Added here:

* ``held(key, how)``: takes the ``ending`` lock of ``key`` (same ``lock_name`` and ``lock_by``
  as ``tests.e2e.proj.ending``), records its start like ``ending`` does, then holds the lock
  until the benchmark pushes ``go:<key>`` (db 3), stamps ``event:<key>`` with the time and ends
  with ``how`` (``return``, ``raise``, ``ignore``, ``retry``). Only the key's first execution
  holds: a retry attempt or a waiter ends at once. This lets a ``waiter`` block on the lock
  *before* an ordinary ending happens, so the takeover after a return is measured like the
  takeover after a kill.
* an ``after_task_publish`` receiver stamping ``published:<task id>`` when a retry of a task
  is published: the event a retry's takeover is measured from.
"""

from __future__ import annotations

import time
from typing import Any

from celery import signals

from tests.e2e.proj import Recorded, _act, _start_record, app, records

__all__ = ["app", "held"]

#: Upper bound on how long ``held`` waits for ``go:<key>``: a benchmark that died early never
#: leaves a child blocked for longer.
HOLD_TIMEOUT = 60


@app.task(
    base=Recorded,
    bind=True,
    lock_by=["key"],
    lock_name="ending",
    name="takeover.held",
    max_retries=3,
)
def held(self: Any, key: str, how: str = "return") -> str:
    n = records.incr(f"n:{key}")
    _start_record(self, key, n)
    if n == 1:
        records.blpop([f"go:{key}"], timeout=HOLD_TIMEOUT)
        records.set(f"event:{key}", repr(time.time()))
    return _act(self, key, how, 0.0, first=False)


@signals.after_task_publish.connect(weak=False)
def _stamp_retry_publish(headers: Any = None, **_: Any) -> None:
    if headers and int(headers.get("retries") or 0):
        records.set(f"published:{headers['id']}", repr(time.time()))
