"""The Celery app of :mod:`tests.e2e.test_first_hour`: traps a new user meets, on a real worker.

Configured like :mod:`tests.e2e.proj`: ``REDLOCK_TEST_PORT`` is the test's private redis-server
(db 0 locks, 1 broker, 2 results, 3 records). Every task here keeps the default contention
policy (no ``lock_on_contention``) and ``max_retries=0``, so a lock requeue that counted against
``max_retries`` would fail the call:

* ``rated`` (``LockedTask``) and ``plain_rated`` (``@single_instance``): ``lock_rate="4/s"``
  on one lock identity (and a short ``lock_retry_countdown``); each start appends its argument
  to ``starts:<task name>`` in db 3;
* ``side_by_side`` (only with ``REDLOCK_TEST_SIDE_BY_SIDE=1``): ``lock_rate`` with
  ``lock_limit=None`` (no exclusion); it appends its
  argument to ``together`` and then waits (``BLPOP``, at most 10 s) for the test to push to
  ``go``, so two calls can be seen running at once;
* ``bounded``: ``lock_rate="1/m"`` with ``lock_retry_for=2``: a second call's slot is a
  minute away, past the bound;
* ``echo``: a locked call that returns its argument, for a worker's log to show one run.
"""

from __future__ import annotations

import os
from typing import Any

import redis

from celery_redlock import LockedTask, single_instance
from support.apps import env, layout_app

PORT = int(os.environ["REDLOCK_TEST_PORT"])
BASE = f"redis://127.0.0.1:{PORT}"

app = layout_app(
    "first_hour_app", BASE, worker_prefetch_multiplier=1, worker_hijack_root_logger=True
)

records = redis.Redis.from_url(f"{BASE}/3")


#: The contention retries' countdown (default 5 s): kept short so that 24 calls end soon.
COUNTDOWN = 0.5


@app.task(
    base=LockedTask,
    bind=True,
    max_retries=0,
    lock_by=(),
    lock_rate="4/s",
    lock_retry_countdown=COUNTDOWN,
)
def rated(self: Any, n: int) -> int:
    records.rpush(f"starts:{self.name}", n)
    return n


@app.task(bind=True, max_retries=0)
@single_instance(by=(), rate="4/s", retry_countdown=COUNTDOWN)
def plain_rated(self: Any, n: int) -> int:
    records.rpush(f"starts:{self.name}", n)
    return n


if env("SIDE_BY_SIDE"):  # a worker of its own: lock_limit=None is new

    @app.task(base=LockedTask, max_retries=0, lock_by=(), lock_rate="100/s", lock_limit=None)
    def side_by_side(n: int) -> int:
        records.rpush("together", n)
        records.blpop(["go"], timeout=10)
        return n


@app.task(base=LockedTask, max_retries=0, lock_by=(), lock_rate="1/m", lock_retry_for=2)
def bounded(n: int) -> int:
    return n


@app.task(base=LockedTask, lock_by=["n"])
def echo(n: int) -> int:
    return n
