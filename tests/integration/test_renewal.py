"""The renewal watchdog holds its locks weakly: an abandoned lock stops being renewed."""

from __future__ import annotations

import gc
import logging
import subprocess
import sys
import threading
import time
import types
import weakref

import pytest
import redis as redis_py

from celery_redlock import Lock, LockLost
from celery_redlock._celery.engine import TaskLock
from celery_redlock._redis import renewal
from celery_redlock.testing import wait_until


def renewed(r: redis_py.Redis, key: str) -> bool:
    """Wait until ``key``'s TTL goes up instead of running down (a renewal happened)."""
    first, read = r.pttl(key), time.monotonic()

    def went_up() -> bool:
        return bool(r.pttl(key) > first - (time.monotonic() - read) * 1000 + 100)

    return wait_until(went_up, 5.0, f"a renewal of {key}")


def test_an_abandoned_auto_renewed_lock_is_no_longer_renewed_and_expires(
    redis_url: str, r: redis_py.Redis
) -> None:
    lock = Lock(redis_url, "abandoned", ttl=3, auto_renew=True)
    assert lock.acquire(blocking=False)
    key = lock.key
    renewed(r, key)  # referenced: renewed every ttl/3, it outlives its 3 s TTL
    collected = weakref.ref(lock)
    del lock
    gc.collect()
    wait_until(lambda: not r.exists(key), 8.0, f"{key} to expire after the lock was dropped")
    assert collected() is None  # nothing but the watchdog's weak reference was left


def test_a_referenced_lock_is_still_renewed_beside_an_abandoned_one(
    redis_url: str, r: redis_py.Redis
) -> None:
    kept = Lock(redis_url, "kept", ttl=3, auto_renew=True)
    dropped = Lock(redis_url, "dropped", ttl=3, auto_renew=True)
    assert kept.acquire(blocking=False) and dropped.acquire(blocking=False)
    dropped_key = dropped.key
    del dropped
    gc.collect()
    wait_until(lambda: not r.exists(dropped_key), 8.0, f"{dropped_key} to expire")
    renewed(r, kept.key)  # the watchdog goes on for the locks still referenced
    kept.release()
    assert not r.exists(kept.key)


#: Run in a process of its own, so that no other lock of the test process (a test before this
#: one may leave one to the garbage collector) has the watchdog renew it meanwhile.
_WAKE_UPS = """
import sys
from celery_redlock import Lock
from celery_redlock._redis import renewal
from celery_redlock.testing import wait_until

def status(field):
    native_id = renewal._current()._thread.native_id
    with open(f"/proc/self/task/{native_id}/status") as lines:
        return next(line.split()[1] for line in lines if line.startswith(field + ":"))

url = sys.argv[1]
first = Lock(url, "watchdog:first", ttl=30, auto_renew=True)
assert first.acquire(blocking=False)  # starts the watchdog (and wakes it once)
first.release()
wait_until(lambda: status("State") == "S", 5, "the watchdog asleep")
before = int(status("voluntary_ctxt_switches"))
for turn in range(200):
    lock = Lock(url, f"watchdog:{turn}", ttl=30, auto_renew=True)
    assert lock.acquire(blocking=False)
    lock.release()
print(int(status("voluntary_ctxt_switches")) - before)
"""


def test_locks_released_before_their_first_renewal_do_not_wake_the_watchdog(
    redis_url: str,
) -> None:
    """Most task locks are released long before their first renewal (a lease/3 later). The
    watchdog thread sleeps through them: one wake-up per lock would be a thread switch per
    task. With nothing left to renew it sleeps one delay, then looks again."""
    run = subprocess.run(
        [sys.executable, "-c", _WAKE_UPS, redis_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    # Before: each of the 200 woke the thread (330 and 554 switches in two runs); now none.
    assert int(run.stdout) < 10, run.stdout


def test_a_task_lock_still_held_at_its_hard_limit_cap_is_renewed_past_it(
    redis_url: str, r: redis_py.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """A task's cap (acquisition + T + margin) trusts the worker's main process to kill the
    child at T. A child still running near the cap (a main process blocked on a stalled broker
    link enforces no limit) keeps its lock, ``margin`` at a time, with an ERROR: its key used
    to expire at the cap, and another worker ran the same key beside it. A plain ``Lock``'s
    ``max_hold`` still ends the key at the cap."""
    task_lock = TaskLock(redis_url, "overrun", ttl=30, auto_renew=True, max_hold=1.0)
    task_lock.margin = 0.6
    plain = Lock(redis_url, "capped", ttl=30, auto_renew=True, max_hold=1.0)
    start = time.monotonic()
    assert task_lock.acquire(blocking=False) and plain.acquire(blocking=False)
    wait_until(lambda: not r.exists(plain.key), 5.0, "the plain lock's key to end at its cap")
    assert plain.lost and time.monotonic() - start >= 0.9
    wait_until(lambda: time.monotonic() - start > 2.5, 5.0, "well past the cap")
    assert r.exists(task_lock.key) and task_lock.held
    assert 0 < r.pttl(task_lock.key) <= 600  # renewed a margin at a time
    task_lock.extend()  # as renewal does, a margin at a time (it raised LockLost: review)
    assert 0 < r.pttl(task_lock.key) <= 600 and task_lock.held
    with pytest.raises(LockLost):  # the plain lock ended at its cap
        plain.extend()
    overran = [rec for rec in caplog.records if "should have been stopped" in rec.getMessage()]
    assert len(overran) == 1 and overran[0].levelname == "ERROR"
    task_lock.release()
    assert not r.exists(task_lock.key)


def test_a_renewal_thread_that_cannot_start_is_run_by_the_watchdog(
    redis_url: str,
    r: redis_py.Redis,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Review, round 3: each renewal runs in a thread of its own; when none can be started (a
    pids limit), the exception ended the watchdog thread, and no lock of the process was
    renewed again, none marked lost. The watchdog renews in its own thread then."""
    lock = Lock(redis_url, "no-threads", ttl=1.5, auto_renew=True)
    assert lock.acquire(blocking=False)  # the watchdog runs

    class Refused(threading.Thread):
        def start(self) -> None:
            raise RuntimeError("can't start new thread")

    with caplog.at_level(logging.WARNING, logger="celery_redlock.renewal"):
        monkeypatch.setattr(renewal, "threading", types.SimpleNamespace(Thread=Refused))
        renewed(r, lock.key)
        renewed(r, lock.key)  # and again: the watchdog lives on
        monkeypatch.undo()
    assert "could not start a renewal thread" in caplog.text
    assert lock.held and not lock.lost
    lock.release()
