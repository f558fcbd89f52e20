"""The Celery app of the beat and ``lock_limit`` end-to-end tests (``celery worker`` and
``celery beat`` subprocesses).

Configured from the environment, like :mod:`tests.e2e.proj`: ``REDLOCK_TEST_PORT`` is the test's
private redis-server (db 0 locks, 1 broker, 2 results, 3 records); ``REDLOCK_TEST_SCHEDULE``
picks the beat schedule (a key of :data:`SCHEDULES`, none by default); ``REDLOCK_TEST_BEAT`` names
the beat process, whose publishes are then recorded.

Records in db 3:

* stream ``events``: one entry per body entry and exit (``ev`` = ``enter``/``exit``) and per
  contended call (``ev`` = ``contended``), with the task name, task id, pid, ``time.time()``,
  retries, the slot key held and the policy applied;
* ``active:<name>``: executions of ``<name>`` inside their body right now; the sorted set
  ``max_active`` keeps the highest value each name reached (``ZADD GT``, atomic);
* hash ``sent``: task id -> ``"<beat name> <task name> <time.time()>"`` for every message a beat
  published;
* list ``gate:<name>``: a body started with ``hold`` blocks until the test pushes a token here.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import redis
from celery import signals
from celery.schedules import schedule

from celery_redlock import LockedTask, current_lock
from celery_redlock.signals import lock_contended
from support.apps import layout_app

PORT = int(os.environ["REDLOCK_TEST_PORT"])
BASE = f"redis://127.0.0.1:{PORT}"

app = layout_app(
    "beat_limit_app",
    BASE,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=True,
    beat_max_loop_interval=1,
)

records = redis.Redis.from_url(f"{BASE}/3")

#: A 1 s schedule rounded to whole seconds of the wall clock: two beats started at different
#: moments send each tick at the same instant, like two beats sharing a crontab entry.
EVERY_SECOND = schedule(timedelta(seconds=1), relative=True, app=app)


def body(task: Any, name: str, duration: float = 0.0, hold: float = 0.0) -> None:
    """A recorded critical section: sleep ``duration``, or block on ``gate:<name>`` up to
    ``hold`` seconds."""
    lock = current_lock()
    entry = {
        "task": task.name,
        "id": task.request.id,
        "pid": os.getpid(),
        "name": name,
        "retries": task.request.retries or 0,
        "slot": lock.key if lock is not None else "",
    }
    inside = records.incr(f"active:{name}")
    records.zadd("max_active", {name: inside}, gt=True)
    records.xadd("events", {"ev": "enter", "t": time.time(), **entry})
    try:
        if hold:
            # One-second BLPOPs: redis-py 8's default socket timeout (5 s) ends longer ones.
            deadline = time.monotonic() + hold
            while time.monotonic() < deadline and not records.blpop([f"gate:{name}"], 1):
                pass
        else:
            time.sleep(duration)
    finally:
        records.decr(f"active:{name}")
        records.xadd("events", {"ev": "exit", "t": time.time(), **entry})


# -- beat: overlapping runs -----------------------------------------------------------------------


@app.task(base=LockedTask, bind=True, lock_by=())
def slow_job(self: Any, duration: float) -> None:
    """A periodic job whose run outlasts its interval; a send finding it running is skipped."""
    body(self, "slow_job", duration)


@app.task(
    base=LockedTask,
    bind=True,
    lock_by=(),
    lock_on_contention="retry",
    lock_retry_countdown=0.2,
    max_retries=50,
)
def slow_retry_job(self: Any, duration: float) -> None:
    """The same job under the ``retry`` policy: a send finding it running comes back later."""
    body(self, "slow_retry_job", duration)


# -- beat: the same tick sent by two beats --------------------------------------------------------


@app.task(base=LockedTask, bind=True, lock_by=(), lock_cooldown=0.8)
def tick_job(self: Any) -> None:
    """Kept locked 0.8 s after each run: the other beat's send of the same tick is skipped."""
    body(self, "tick_job", 0.05)


@app.task(base=LockedTask, bind=True, lock_by=())
def tick_plain(self: Any) -> None:
    """The control: locked, no cooldown. A duplicate send arriving after the run runs again."""
    body(self, "tick_plain", 0.05)


# -- beat: enqueue-time de-duplication ------------------------------------------------------------


@app.task(base=LockedTask, bind=True, lock_by=(), lock_enqueue=True)
def queued_job(self: Any) -> None:
    """A beat job de-duplicated at enqueue time: a backlog never holds two of it."""
    body(self, "queued_job", 0.0)


# -- lock_limit -----------------------------------------------------------------------------------


@app.task(base=LockedTask, bind=True, lock_by=["key"], lock_limit=3)
def limited(self: Any, key: str, duration: float = 0.0, hold: float = 0.0) -> str:
    """At most three executions per key at once."""
    body(self, key, duration, hold)
    return key


SCHEDULES: dict[str, dict[str, dict[str, Any]]] = {
    # Run 1.5 s every 1 s; expires = interval, time_limit bounds a run (the recommended setup).
    "overlap": {
        "slow": {
            "task": "tests.e2e.beat_limit_app.slow_job",
            "schedule": 1.0,
            "args": (1.5,),
            "options": {"expires": 1.0, "time_limit": 10},
        },
        "slow-retry": {
            "task": "tests.e2e.beat_limit_app.slow_retry_job",
            "schedule": 1.0,
            "args": (1.5,),
            "options": {"expires": 3.0, "time_limit": 10},
        },
    },
    # Both beats send both entries on the same whole seconds; expires <= lock_cooldown. The
    # control goes to its own queue (and worker), so it never delays tick_job.
    "ticks": {
        "tick": {
            "task": "tests.e2e.beat_limit_app.tick_job",
            "schedule": EVERY_SECOND,
            "options": {"expires": 0.7, "time_limit": 10},
        },
        "tick-plain": {
            "task": "tests.e2e.beat_limit_app.tick_plain",
            "schedule": EVERY_SECOND,
            "options": {"expires": 0.7, "time_limit": 10, "queue": "plain"},
        },
    },
    "enqueue": {
        "queued": {"task": "tests.e2e.beat_limit_app.queued_job", "schedule": 0.5},
    },
}

app.conf.beat_schedule = SCHEDULES.get(os.environ.get("REDLOCK_TEST_SCHEDULE", ""), {})

BEAT_NAME = os.environ.get("REDLOCK_TEST_BEAT", "")


@signals.before_task_publish.connect(weak=False)
def _record_beat_publish(headers: Any = None, **_: Any) -> None:
    """In a beat process: which beat published which task id, when."""
    if BEAT_NAME and headers:
        records.hset("sent", headers["id"], f"{BEAT_NAME} {headers['task']} {time.time()}")


@lock_contended.connect(weak=False)
def _record_contended(
    sender: Any = None,
    task_id: str = "",
    key: str = "",
    holder: str | None = None,
    policy: str = "",
    **_: Any,
) -> None:
    request = sender.request
    records.xadd(
        "events",
        {
            "ev": "contended",
            "t": time.time(),
            "task": sender.name,
            "id": task_id,
            "pid": os.getpid(),
            "retries": request.retries or 0,
            "holder": holder or "",
            "policy": policy,
            "key": key,
        },
    )
