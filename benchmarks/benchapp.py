"""The Celery app that ``bench_core.py`` runs in a real ``celery worker`` subprocess.

Configured from the environment, like ``tests/e2e/proj.py``: ``REDLOCK_TEST_PORT`` is the
benchmark's private redis-server (db 0 locks, 1 broker, 2 results). ``REDLOCK_TEST_VERBOSE=1``
keeps Celery's per-task INFO lines (``Received task``, ``Task ... succeeded``); by default they
are silenced so that log formatting does not dilute the difference being measured, while the
worker's ``ready.`` line (also INFO) stays.

``REDLOCK_TEST_LOCK_PORT`` (default: the same server) puts every lock, ours and the peers',
on another redis-server, so that its ``INFO commandstats`` counts lock commands only.

Each task is ``shared=False``: ``bench.py`` and ``bench_core.py`` reload this module for each
server, and a shared task of the module before would join the new app too (Celery 5.7 warned
"Task name 'bench.plain' is already registered to a different callable", once per task).

No-op tasks, identical except for the lock:

* ``bench.plain``: a plain task, the baseline;
* ``bench.locked``: ``base=LockedTask``, one lock per ``key`` argument, default settings (a
  renewed lease: the watchdog thread watches the lock while the body runs);
* ``bench.locked_ttl``: the same with a fixed ``lock_ttl`` (no watchdog), to separate the
  renewal bookkeeping from the acquire/release round trips;
* ``bench.once``: celery-once's ``QueueOnce`` (locks in ``apply_async``, unlocks in
  ``after_return``);
* ``bench.singleton``: celery-singleton's ``Singleton`` (locks in ``apply_async``, unlocks in
  ``on_success``);
* ``bench.redispy``: redis-py's ``Lock`` taken around the body by a small base task
  (:class:`RedisPyLockTask`), the do-it-yourself way.

And one task that is not a no-op: ``bench.wait_hold`` (``lock_on_contention="wait"``), both
sides of a handoff to a waiting task. It records in db 3 of the benchmark's server.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import redis
import redis.lock
from celery import Task, signals

from celery_redlock import LockedTask
from support.apps import layout_app

PORT = int(os.environ["REDLOCK_TEST_PORT"])
BASE = f"redis://127.0.0.1:{PORT}"
LOCKS = f"redis://127.0.0.1:{os.environ.get('REDLOCK_TEST_LOCK_PORT') or PORT}/0"

app = layout_app(
    "benchapp",
    BASE,
    redlock_url=LOCKS,
    ONCE={"backend": "celery_once.backends.Redis", "settings": {"url": LOCKS}},
    singleton_backend_url=LOCKS,
    worker_hijack_root_logger=True,
    # Defaults everywhere else (prefetch multiplier 4, early ack): the common deployment.
)

#: Loggers that write one INFO line per task; quiet unless REDLOCK_TEST_VERBOSE=1.
_PER_TASK_LOGGERS = ("celery.app.trace", "celery.worker.strategy")


@signals.after_setup_logger.connect(weak=False)
def _quiet_per_task_logs(**_: Any) -> None:
    # Runs in the worker's main process before the consumer builds its strategies and before
    # the pool forks, so both the "Received task" and the "succeeded" lines are off.
    if os.environ.get("REDLOCK_TEST_VERBOSE") != "1":
        for name in _PER_TASK_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)


@app.task(name="bench.plain", shared=False)
def plain(key: str) -> None:
    return None


@app.task(name="bench.locked", shared=False, base=LockedTask, lock_by=["key"])
def locked(key: str) -> None:
    return None


@app.task(name="bench.locked_ttl", shared=False, base=LockedTask, lock_by=["key"], lock_ttl=30)
def locked_ttl(key: str) -> None:
    return None


try:  # the peers come from the bench extra; without it, only our tasks exist
    from celery_once import QueueOnce
    from celery_singleton import Singleton
except ImportError:
    pass
else:

    @app.task(name="bench.once", shared=False, base=QueueOnce)
    def once(key: str) -> None:
        return None

    @app.task(name="bench.singleton", shared=False, base=Singleton)
    def singleton(key: str) -> None:
        return None


_lock_client: redis.Redis | None = None


class RedisPyLockTask(Task):  # type: ignore[misc]
    """redis-py's ``Lock`` around the body, non-blocking; a call whose key is held is skipped."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        global _lock_client
        if _lock_client is None:
            _lock_client = redis.Redis.from_url(LOCKS)
        lock = redis.lock.Lock(_lock_client, f"rpl:{self.name}:{args}", timeout=30)
        if not lock.acquire(blocking=False):
            return None
        try:
            return self.run(*args, **kwargs)
        finally:
            lock.release()


@app.task(name="bench.redispy", shared=False, base=RedisPyLockTask)
def redispy(key: str) -> None:
    return None


_marks: redis.Redis | None = None


@app.task(
    name="bench.wait_hold",
    shared=False,
    base=LockedTask,
    lock_by=["key"],
    lock_on_contention="wait",
    lock_wait_timeout=30,
)
def wait_hold(key: str, role: str) -> float:
    """One side of a handoff of ``key``'s lock; returns its ``time.perf_counter()`` stamp.

    ``role`` is not part of the lock: both roles of one ``key`` share it.

    * ``"hold"``: pushes ``<key>:started`` (db 3), blocks until the benchmark pushes
      ``<key>:cue``, and stamps as its last statement: the engine releases as the body returns;
    * ``"wait"``: sent while the holder runs, it waits on the lock; it stamps as its first
      statement.

    The stamps travel as the results, stored after the release: no round trip between a stamp
    and the release or the start it marks.
    """
    if role == "wait":
        return time.perf_counter()
    global _marks
    if _marks is None:
        _marks = redis.Redis.from_url(f"{BASE}/3")
    _marks.rpush(f"{key}:started", 1)
    if _marks.blpop([f"{key}:cue"], timeout=30) is None:
        raise TimeoutError(f"{key}: no cue in 30 s")
    return time.perf_counter()
