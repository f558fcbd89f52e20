"""A holder paused longer than its TTL: the documented limit, and what fencing does about it.

Timeline, on one prefork worker with a 1 s lease (``tests/e2e/pause_app.py``):

1. ``stale`` takes the lock of ``acct`` (fencing token F1) and is frozen with SIGSTOP (its pool
   child, watchdog thread included);
2. its lease runs out (the time the freeze lasts is the point here: the test polls until the key
   is gone); ``new`` takes the lock (F2 > F1) and writes to the fenced store: accepted;
3. ``stale`` is resumed with SIGCONT: it still runs its body, **beside** ``new``, which is the
   documented limit; its overdue renewal finds the key owned by someone else and marks
   ``current_lock().lost`` (read now, its ``fencing_token`` is ``None``);
4. ``stale`` writes with F1, read at its start: the fenced store rejects it; its release at
   the end is owner-checked and leaves ``new``'s lock alone.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import redis as redis_py
from celery import Celery

from celery_redlock.testing import RedisServer, wait_until
from support.apps import lock_keys
from support.procfs import pid_alive
from support.workers import WorkerProcess

pytestmark = pytest.mark.slow

TASK = "tests.e2e.pause_app.fenced_write"
LEASE = 1.0


def test_frozen_holder_loses_its_lock_and_its_late_write_is_fenced_off(
    proj_client: Celery, redis_server: RedisServer, r: redis_py.Redis
) -> None:
    records = redis_py.Redis(port=redis_server.port, db=3, decode_responses=True)

    def holder(role: str) -> dict[str, str]:
        return records.hgetall(f"holder:{role}")  # type: ignore[return-value]

    with WorkerProcess(redis_server.port, "p1", app="tests.e2e.pause_app") as worker:
        stale_result = proj_client.send_task(TASK, args=("acct", "stale"))
        wait_until(lambda: holder("stale").get("pid"), 20, "stale to take the lock")
        stale = holder("stale")
        pid, key = int(stale["pid"]), stale["lock_key"]
        os.kill(pid, signal.SIGSTOP)
        try:
            frozen_at = time.monotonic()
            # 1. Right after the freeze the key is still stale's: nobody else can enter yet.
            assert r.get(key) == stale["lock_token"].encode()
            # 2. The freeze outlasts the lease: poll until the key is gone (expired).
            wait_until(
                lambda: r.get(key) != stale["lock_token"].encode(),
                5 * LEASE,
                "stale's lease to run out",
            )
            expired_after = time.monotonic() - frozen_at
            new_result = proj_client.send_task(TASK, args=("acct", "new"))
            wait_until(lambda: holder("new").get("written"), 20, "new to write")
            new = holder("new")
            assert new["written"] == "1"  # accepted
            assert int(new["fence"]) > int(stale["fence"])
            assert r.get(key) == new["lock_token"].encode()
            assert pid_alive(pid)  # stale still exists, frozen inside its critical section
        finally:
            records.set("resumed", 1)
            os.kill(pid, signal.SIGCONT)
        # 3. Resumed: stale learns from its renewal that it lost the lock ...
        wait_until(lambda: holder("stale").get("written"), 20, "stale to try its late write")
        stale = holder("stale")
        assert stale["lost"] == "1"
        assert stale["fence_now"] == "None"  # read after the loss, the lock gives no token
        # 4. ... and the fenced store rejects its late write.
        assert stale["written"] == "0"
        assert records.hgetall("store:acct") == {"value": "new", "token": new["fence"]}
        # Its release (after the body) was owner-checked: new still holds the key.
        wait_until(lambda: records.get("postrun:stale"), 20, "stale to finish and release")
        assert r.get(key) == new["lock_token"].encode()
        records.set("finish", 1)
        assert new_result.get(timeout=20) == 1
        assert stale_result.get(timeout=20) == 0
        # Wait for the release (postrun marks the end of the attempt).
        wait_until(lambda: records.get("postrun:new"), 20, "new to finish and release")
        log = worker.text()
    assert f"lock {key} lost (token {stale['lock_token'][:8]}" in log
    assert "the lease ran out before a renewal was confirmed" in log
    assert lock_keys(r) == []
    print(
        f"\npause: stale frozen, lease ran out {expired_after:.2f}s into the freeze; "
        f"fencing tokens stale={stale['fence']} new={new['fence']}; late write rejected"
    )
