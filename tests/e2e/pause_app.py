"""The Celery app of the pause scenario (``tests/e2e/test_pause.py``), run by ``celery worker``.

Configured from the environment like ``tests/e2e/proj.py``: ``REDLOCK_TEST_PORT`` is the test's
private redis-server (db 0 locks, 1 broker, 2 results, 3 records and the fenced store). The
lease is 1 s (``redlock_lease``) and there is no time limit, so a frozen holder loses its lock
after about a second.

``fenced_write(key, role)`` holds the lock of ``key`` and writes ``role`` to a *fenced store*:
a record that accepts a write only with a fencing token larger than the last one it accepted
(:data:`WRITE_IF_NEWER`, one Lua script). It records what it sees in ``holder:<role>`` (db 3)
and waits for the test at the points the scenario needs:

* ``stale``: after taking the lock, waits for ``resumed`` (the test freezes it before that and
  sets it just before resuming it), then for its lock to report itself lost, then writes;
* ``new``: writes at once, then keeps its lock until ``finish``, so that the test can check the
  stale holder's release left the new holder's lock alone.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import redis
from celery import signals

from celery_redlock import LockedTask, current_lock
from celery_redlock import signals as lock_signals
from celery_redlock.testing import wait_until
from support.apps import layout_app

PORT = int(os.environ["REDLOCK_TEST_PORT"])
BASE = f"redis://127.0.0.1:{PORT}"

app = layout_app(
    "pause_app",
    BASE,
    redlock_lease=1.0,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=True,
)

records = redis.Redis.from_url(f"{BASE}/3")

WRITE_IF_NEWER = """
-- KEYS[1] the stored record (hash: value, token)
-- ARGV[1] the writer's fencing token, ARGV[2] the value
-- returns 1 written, 0 rejected: a token at or below the last accepted one is a stale writer
local last = tonumber(redis.call('HGET', KEYS[1], 'token') or '-1')
if tonumber(ARGV[1]) > last then
  redis.call('HSET', KEYS[1], 'value', ARGV[2], 'token', ARGV[1])
  return 1
end
return 0
"""
write_if_newer = records.register_script(WRITE_IF_NEWER)


def store_key(key: str) -> str:
    return f"store:{key}"


def wait_for(predicate: Any, timeout: float) -> None:
    """Poll ``predicate`` every 10 ms for at most ``timeout`` seconds, then go on regardless:
    the test judges what happened from the records."""
    with contextlib.suppress(AssertionError):
        wait_until(predicate, timeout, "the test", poll=0.01)


@app.task(
    base=LockedTask, bind=True, lock_by=["key"], lock_on_contention="wait", lock_wait_timeout=20.0
)
def fenced_write(self: Any, key: str, role: str) -> int:
    lock = current_lock()
    assert lock is not None
    fence = lock.fencing_token  # read once, at the start, as a task writing through it does
    me = f"holder:{role}"
    records.hset(
        me,
        mapping={
            "pid": os.getpid(),
            "fence": str(fence),
            "lock_key": lock.key,
            "lock_token": lock.token or "",
        },
    )
    if role == "stale":
        wait_for(lambda: records.exists("resumed"), 30.0)  # frozen in here by the test
        # The overdue renewal runs first thing on resume and reports the loss; ``lock.lost``
        # alone says so by the clock at once, and the body would race the renewal to it.
        wait_for(lambda: records.exists(f"lost-reported:{self.request.id}"), 10.0)
        # Read again now, the token is None: the lock says it is lost.
        records.hset(me, mapping={"lost": int(lock.lost), "fence_now": str(lock.fencing_token)})
    written = int(write_if_newer(keys=[store_key(key)], args=[fence, role]))
    records.hset(me, "written", written)
    if role == "new":
        wait_for(lambda: records.exists("finish"), 30.0)
    return written


@lock_signals.lock_lost.connect(weak=False)
def _record_lost(sender: Any = None, task_id: str = "", **_: Any) -> None:
    """The lock of ``task_id`` reported itself lost (from the renewal thread, or a release)."""
    records.set(f"lost-reported:{task_id}", 1)


@signals.task_postrun.connect(weak=False)
def _record_postrun(sender: Any = None, args: Any = None, **_: Any) -> None:
    """After ``after_return``, so after the lock's release: ``postrun:<role>`` = 1."""
    if sender is not None and sender.name == fenced_write.name and args:
        records.set(f"postrun:{args[1]}", 1)
