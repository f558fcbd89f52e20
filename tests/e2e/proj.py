"""The Celery app that the end-to-end tests run in real ``celery worker`` subprocesses.

Configured from the environment: ``REDLOCK_TEST_PORT`` is the test's private redis-server
(db 0 locks, 1 broker, 2 results, 3 records), ``REDLOCK_TEST_ACKS_LATE=1`` turns on acks_late
with ``task_reject_on_worker_lost`` (``=timeout``: acks_late with
``task_acks_on_failure_or_timeout`` off, which Celery 5.7 requeues a timed-out call under;
``=retry``: no acks_late, Celery 5.7's ``task_retry_on_worker_lost``),
``REDLOCK_TEST_LEASE`` / ``REDLOCK_TEST_TTL_MARGIN`` set
``redlock_lease`` / ``redlock_ttl_margin``, and ``REDLOCK_TEST_VISIBILITY`` sets the Redis
transport's ``visibility_timeout`` (with a 0.2 s restore sweep, so that a message held longer is
redelivered to another worker quickly), and ``REDLOCK_TEST_NO_PROC=1`` makes every read of a pool
child's state under ``/proc`` fail in the worker, as on a system without ``/proc`` (macOS).

Each locked task has a twin under the other API, sharing its lock
(:data:`tests.e2e.conftest.API_TASKS`), so the end-to-end tests prove every behaviour for
``LockedTask`` and for ``@single_instance``.

Every critical section records itself in db 3: ``active:<key>`` counts executions inside it
right now, ``overlaps`` counts entries that found another execution inside, and the stream
``events`` holds one entry per enter and exit with the fencing token.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import redis
from celery import Task, signals
from celery.exceptions import Ignore, Reject

from celery_redlock import LockedTask, current_lock, single_instance
from celery_redlock._celery import parent
from support.apps import layout_app
from support.procfs import pid_alive

PORT = int(os.environ["REDLOCK_TEST_PORT"])
BASE = f"redis://127.0.0.1:{PORT}"

app = layout_app(
    "proj",
    BASE,
    worker_prefetch_multiplier=1,
    task_acks_late=os.environ.get("REDLOCK_TEST_ACKS_LATE") in ("1", "timeout"),
    task_reject_on_worker_lost=os.environ.get("REDLOCK_TEST_ACKS_LATE") == "1",
    task_acks_on_failure_or_timeout=os.environ.get("REDLOCK_TEST_ACKS_LATE") != "timeout",
    task_retry_on_worker_lost=os.environ.get("REDLOCK_TEST_ACKS_LATE") == "retry",
    worker_hijack_root_logger=True,
)
if os.environ.get("REDLOCK_TEST_LEASE"):
    app.conf.redlock_lease = float(os.environ["REDLOCK_TEST_LEASE"])
if os.environ.get("REDLOCK_TEST_TTL_MARGIN"):
    app.conf.redlock_ttl_margin = float(os.environ["REDLOCK_TEST_TTL_MARGIN"])
if os.environ.get("REDLOCK_TEST_VISIBILITY"):
    app.conf.broker_transport_options = {
        "visibility_timeout": float(os.environ["REDLOCK_TEST_VISIBILITY"]),
        "unacked_restore_interval": 0.2,
        "unacked_restore_throttle": 1,
    }

records = redis.Redis.from_url(f"{BASE}/3")
if os.environ.get("REDLOCK_TEST_NO_PROC") == "1":
    parent.PROC = "/nonexistent"
    records.set("proc", parent.PROC)  # the test checks that the switch took effect
locks = redis.Redis.from_url(f"{BASE}/0")


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


@app.task(bind=True)
@single_instance(by=["key"], name="tests.e2e.proj.critical")
def plain_critical(self: Any, key: str, duration: float = 0.0) -> str:
    """``critical`` through ``@single_instance``, on the same lock (its lock name)."""
    section(self.request.id, key, duration)
    return key


# -- endings: one body that can end in every way a task can ---------------------------------------
#
# Records in db 3, for the task ``ending`` and the tasks sharing its lock (lock_name="ending"):
#   n:<key>            executions of the key so far (the long endings act on the first only)
#   starts:<key>       one JSON entry per execution: id, pid, time, retries, redelivered, and
#                      whether the pid of the previous execution of the key was still alive
#   exits:<key>        one JSON entry per body exit (``finally``): whether the lock was still
#                      held by this execution at that moment
#   lockkey:<id>       the lock key an execution holds
#   hooks:<id>         "<hook>:<state>:<pid>" for after_return, on_failure, on_retry, postrun
#   retry_seen:<id>    "1" when on_retry of the first attempt saw the retry attempt start
#   lock_at_publish:<id>  "1"/"0": whether the lock key existed when the retry, or the
#                      replacement (``how="replace"``), was published


def _start_record(task: Any, key: str, n: int) -> None:
    request = task.request
    lock = current_lock()
    previous = records.lrange(f"starts:{key}", -1, -1)
    prev_alive = None
    if previous:
        prev_pid = json.loads(previous[0])["pid"]
        prev_alive = pid_alive(prev_pid) if prev_pid != os.getpid() else None
    entry = {
        "id": request.id,
        "task": task.name,
        "pid": os.getpid(),
        "n": n,
        "t": time.time(),
        "retries": request.retries,
        "redelivered": bool((request.delivery_info or {}).get("redelivered")),
        "prev_pid_alive": prev_alive,
        "token": lock.token if lock is not None else None,
        "queued": _text(locks.get(f"{lock.key}:queued")) if lock is not None else None,
    }
    if lock is not None:
        records.set(f"lockkey:{request.id}", lock.key)
    records.rpush(f"starts:{key}", json.dumps(entry))


def _text(value: bytes | None) -> str | None:
    return value.decode() if value is not None else None


def _act(task: Any, key: str, how: str, duration: float, first: bool) -> str:
    retries = task.request.retries
    if how == "raise":
        raise ValueError("boom")
    if how == "ignore":
        raise Ignore()
    if how == "reject":
        raise Reject("rejected", requeue=False)
    if how == "retry" and retries == 0:
        raise task.retry(countdown=0)
    if how == "autoretry" and retries == 0:
        raise KeyError("autoretry")
    if how == "replace":
        raise task.replace(task.si(key))  # the same task id, on the same key: it returns
    if first and how in ("sleep", "soft"):
        time.sleep(duration)
    if first and how == "sleep_noterm":
        # SIGTERM blocked: this child can only end by SIGKILL, so it never releases by itself.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            time.sleep(duration)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    return key


def run_ending(task: Any, key: str, how: str, duration: float) -> str:
    """The body of every ending task; ``how`` picks the ending (see :func:`_act`)."""
    n = records.incr(f"n:{key}")
    _start_record(task, key, n)
    lock = current_lock()
    inside = records.incr(f"active:{key}")
    if inside > 1:
        records.incr("overlaps")
    # retry() and replace() release before they publish the next attempt, which another child
    # may start before this one's finally: the section ends before them (CI, lowest, once).
    publishes = how == "replace" or (how == "retry" and task.request.retries == 0)
    try:
        if publishes:
            records.decr(f"active:{key}")
        return _act(task, key, how, duration, first=n == 1)
    finally:
        token = lock.token if lock is not None else None
        held = token is not None and locks.get(lock.key) == token.encode()  # type: ignore[union-attr]
        records.rpush(
            f"exits:{key}",
            json.dumps({"id": task.request.id, "pid": os.getpid(), "t": time.time(), "held": held}),
        )
        if not publishes:
            records.decr(f"active:{key}")


def _hook(task_id: str | None, what: str) -> None:
    if task_id:
        records.rpush(f"hooks:{task_id}", f"{what}:{os.getpid()}")


class _RecordHooks:
    """Records which of a task's hooks ran, with what state, in which process."""

    def after_return(
        self, status: str, retval: Any, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        _hook(task_id, f"after_return:{status}")
        super().after_return(status, retval, task_id, args, kwargs, einfo)

    def on_failure(self, exc: Any, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        _hook(task_id, f"on_failure:{type(exc).__name__}")

    def on_retry(self, exc: Any, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        _hook(task_id, f"on_retry:{type(exc).__name__}")
        if kwargs.get("how") in ("retry", "autoretry"):
            # Still inside the first attempt: wait for the retry attempt to start elsewhere.
            key = kwargs["key"]
            deadline = time.monotonic() + 10.0
            while records.llen(f"starts:{key}") < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            records.set(f"retry_seen:{task_id}", int(records.llen(f"starts:{key}") >= 2))


class Recorded(_RecordHooks, LockedTask):
    """LockedTask recording its hooks."""


class RecordedPlain(_RecordHooks, Task):
    """A plain Task recording its hooks (locked by ``@single_instance``)."""


@app.task(
    base=Recorded,
    bind=True,
    lock_by=["key"],
    lock_name="ending",
    autoretry_for=(KeyError,),
    retry_kwargs={"countdown": 0},
    max_retries=3,
)
def ending(self: Any, key: str, how: str = "return", duration: float = 0.0) -> str:
    return run_ending(self, key, how, duration)


@app.task(
    base=Recorded,
    bind=True,
    lock_by=["key"],
    lock_name="ending",
    lock_on_contention="wait",
    lock_wait_timeout=20.0,
)
def waiter(self: Any, key: str, how: str = "return", duration: float = 0.0) -> str:
    """Same lock as ``ending``, but waits for it: starts the moment the holder releases."""
    return run_ending(self, key, how, duration)


@app.task(
    base=Recorded,
    bind=True,
    lock_by=["key"],
    lock_name="ending",
    lock_enqueue=True,
    lock_on_contention="wait",
    lock_wait_timeout=20.0,
)
def queued_waiter(self: Any, key: str, how: str = "return", duration: float = 0.0) -> str:
    """``waiter`` with ``lock_enqueue=True``: its queued marker is kept while it waits."""
    return run_ending(self, key, how, duration)


@app.task(
    base=Recorded,
    bind=True,
    lock_by=["key"],
    lock_enqueue="until_executed",
    lock_on_contention="wait",
    lock_wait_timeout=20.0,
)
def executed_waiter(self: Any, key: str, how: str = "return", duration: float = 0.0) -> str:
    """``waiter`` with ``lock_enqueue="until_executed"``: its marker stays until its run ends.
    Its lock is its own: two tasks sharing a lock name may not both keep the queued marker
    (``queued_waiter`` does)."""
    return run_ending(self, key, how, duration)


#: The cooldown of :func:`cooled`, in seconds.
COOLDOWN = 6.0


@app.task(base=LockedTask, bind=True, lock_by=["key"], lock_cooldown=COOLDOWN)
def cooled(self: Any, key: str, how: str = "return", duration: float = 0.0) -> str:
    """An ending task whose key stays held ``COOLDOWN`` seconds after each run."""
    return run_ending(self, key, how, duration)


@app.task(
    base=RecordedPlain,
    bind=True,
    autoretry_for=(KeyError,),
    retry_kwargs={"countdown": 0},
    max_retries=3,
)
@single_instance(by=["key"], name="ending")
def plain_ending(self: Any, key: str, how: str = "return", duration: float = 0.0) -> str:
    """``ending`` through ``@single_instance`` on a plain Task, on the same lock."""
    return run_ending(self, key, how, duration)


@app.task(base=RecordedPlain, bind=True)
@single_instance(by=["key"], name="ending", on_contention="wait", wait_timeout=20.0)
def plain_waiter(self: Any, key: str, how: str = "return", duration: float = 0.0) -> str:
    """``waiter`` through ``@single_instance``."""
    return run_ending(self, key, how, duration)


@app.task
def collect(results: list[Any]) -> list[Any]:
    """Chord body."""
    records.set("collected", json.dumps(results))
    return results


@signals.task_postrun.connect(weak=False)
def _record_postrun(task_id: str | None = None, state: str | None = None, **_: Any) -> None:
    _hook(task_id, f"postrun:{state}")


@signals.before_task_publish.connect(weak=False)
def _record_retry_publish(headers: Any = None, properties: Any = None, **_: Any) -> None:
    """Runs after the package's receiver: is the lock free when a retry or a replacement is
    published? (A replacement's ``replaced_task_nesting`` is in the headers from Celery 5.3.5,
    in the properties before.)"""
    if not headers:
        return
    nesting = headers.get("replaced_task_nesting", (properties or {}).get("replaced_task_nesting"))
    if not int(headers.get("retries") or 0) and not int(nesting or 0):
        return
    key = records.get(f"lockkey:{headers['id']}")
    if key is not None:
        records.set(f"lock_at_publish:{headers['id']}", int(locks.exists(key)))


@signals.worker_shutting_down.connect(weak=False)
def _record_shutdown(sig: Any = None, how: Any = None, **_: Any) -> None:
    """In the worker's main process, on each shutdown signal: ``shutdowns`` gets "<how>:<sig>"."""
    records.rpush("shutdowns", f"{how}:{sig}")
