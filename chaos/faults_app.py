"""The Celery app that ``python -m chaos.faults`` runs in its workers, one per network namespace.

Configured from the environment (set by :mod:`chaos.faults`; every server is private to the
run, reached over the run's bridge):

========================  ====================================================================
``FAULTS_BROKER``         broker URL (results in another database of the same server)
``FAULTS_RECORDS``        where each call records its events (a list, ``events``)
``FAULTS_LOCKS``          lock server URL, or comma-separated URLs of the quorum's nodes
``FAULTS_LEASE``          ``redlock_lease`` in seconds
``FAULTS_STORE_RUN``      the fenced store's run id; ``FAULTS_STORE_DSN`` its connection string
========================  ====================================================================

The task ``faults.step(key, duration, call)`` is a :class:`~celery_redlock.LockedTask`
(``lock_on_contention="skip"``, ``redlock_on_unavailable="fail"``: every call ends at once in
a documented state, nothing waits unboundedly). While it holds the lock it writes through its
fencing token to the fenced store every 50 ms, and stops as soon as its lock reports itself
lost, *judged by this process's own clock* (:attr:`~celery_redlock.Lock.lost`: the lease counts
from before the acquire request was sent, so the holder gives up before any Redis node lets the
key expire). With ``heed_loss=False`` it is a careless body that makes all its writes regardless
(``duration / 50 ms`` of them, however long it was paused): then only the fence stops the
stale ones. It returns ``"done"`` or ``"lost"``; a skipped call returns
``None``.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from typing import Any

import redis
from celery import Celery, signals

from celery_redlock import LockedTask, current_lock
from chaos.fenced_store import FencedStore

app = Celery("faults", broker=os.environ.get("FAULTS_BROKER", "memory://"))
_locks = os.environ.get("FAULTS_LOCKS", "")
app.conf.update(
    result_backend=os.environ.get("FAULTS_BACKEND"),
    redlock_url=_locks.split(",") if "," in _locks else _locks or None,
    redlock_lease=float(os.environ.get("FAULTS_LEASE", "1.0")),
    redlock_on_unavailable="fail",
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    task_default_queue="faults",
)
_records = redis.Redis.from_url(
    os.environ.get("FAULTS_RECORDS", "redis://127.0.0.1:1/0"), socket_timeout=5
)
_store = FencedStore(
    os.environ.get("FAULTS_STORE_RUN", "none"), os.environ.get("FAULTS_STORE_DSN", "")
)
#: Seconds between two writes of a body.
STEP = 0.05


def record(call: str, kind: str, key: str, **fields: Any) -> None:
    """Append one event of ``call`` (see :mod:`chaos.history`), stamped with this clock."""
    event = {"at": time.time(), "call": call, "kind": kind, "key": key, "pid": os.getpid()}
    _records.rpush("events", json.dumps({**event, **fields}))


#: Per task id, when this process began to run it (``task_prerun``, before the lock's acquire
#: is sent): the ``since`` of its ``admitted`` event (:mod:`chaos.history`, token order).
_began: dict[str, float] = {}


@signals.task_prerun.connect
def _begin(task_id: str | None = None, **_: Any) -> None:
    if task_id is not None:
        _began[task_id] = time.time()


@signals.worker_ready.connect
def _ready(sender: Any = None, **_: Any) -> None:
    _records.set(f"ready:{os.environ.get('FAULTS_HOST', '?')}", os.getpid())


@app.task(
    base=LockedTask,
    name="faults.step",
    lock_by=["key"],
    lock_on_contention="skip",
    bind=True,
)
def step(self: Any, key: str, duration: float, call: str, heed_loss: bool = True) -> str:
    lock = current_lock()
    assert lock is not None
    token = lock.fencing_token
    run = secrets.token_hex(4)  # this execution: a redelivered call runs under another id
    since = _began.pop(self.request.id, None)
    record(call, "admitted", key, run=run, token=token, since=since)
    record(call, "body_start", key, run=run)
    outcome = "done"
    try:
        deadline = time.monotonic() + duration
        steps = max(1, round(duration / STEP))
        # A careful body ends by its deadline; a careless one makes all its writes, however
        # long it was paused in between.
        while time.monotonic() < deadline if heed_loss else steps > 0:
            steps -= 1
            if (heed_loss and lock.lost) or token is None:
                outcome = "lost"
                record(call, "lost", key, run=run)
                break
            accepted = _store.write(key, token, call)
            record(call, "write", key, run=run, token=token, accepted=accepted)
            time.sleep(STEP)
    finally:
        record(call, "body_end", key, run=run)
    return outcome
