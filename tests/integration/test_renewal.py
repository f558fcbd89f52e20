"""The renewal watchdog holds its locks weakly: an abandoned lock stops being renewed."""

from __future__ import annotations

import gc
import time
import weakref

import redis as redis_py

from celery_redlock import Lock
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


def _status(thread_id: int | None, field: str) -> str:
    """A field of ``/proc/self/task/<thread_id>/status`` (``thread_id``: a native id)."""
    with open(f"/proc/self/task/{thread_id}/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return line.split()[1]
    raise AssertionError(f"no {field} line")


def test_locks_released_before_their_first_renewal_do_not_wake_the_watchdog(
    redis_url: str,
) -> None:
    """Most task locks are released long before their first renewal (a lease/3 later). The
    watchdog thread sleeps through them: one wake-up per lock would be a thread switch per
    task. With nothing left to renew it sleeps one delay, then looks again."""
    first = Lock(redis_url, "watchdog:first", ttl=30, auto_renew=True)
    assert first.acquire(blocking=False)  # starts the watchdog (and wakes it once)
    first.release()
    thread = renewal._current()._thread
    wait_until(lambda: _status(thread.native_id, "State") == "S", 5, "the watchdog asleep")
    before = int(_status(thread.native_id, "voluntary_ctxt_switches"))
    for turn in range(200):
        lock = Lock(redis_url, f"watchdog:{turn}", ttl=30, auto_renew=True)
        assert lock.acquire(blocking=False)
        lock.release()
    # Before: each of the 200 woke the thread (about 200 switches); now it sleeps through.
    assert int(_status(thread.native_id, "voluntary_ctxt_switches")) - before < 10
