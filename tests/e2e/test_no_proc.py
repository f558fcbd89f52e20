"""A prefork worker on a system without ``/proc``: liveness it cannot read never frees a lock.

``REDLOCK_TEST_NO_PROC=1`` points the worker's process-state reads at a directory that does not
exist. Timeline the package must not allow (what a "cannot read" = "dead" rule did):

1. a pool child takes the key's lock and runs for 0.3 s;
2. the main process looks for dead children every 0.1 s, cannot read the child's state, and
   releases its lock;
3. the other child takes the same key and runs beside the first.

So 200 duplicate submissions of one key, tasks long enough for the 0.1 s look to happen
inside them, must show no overlap; and a child that is SIGKILLed must still see its lock
freed, within the lease.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import pytest
import redis as redis_py
from celery import Celery
from celery.result import AsyncResult

from celery_redlock.testing import RedisServer, wait_until
from support.apps import API_TASKS
from support.polling import watch_events
from support.workers import WorkerProcess

pytestmark = pytest.mark.slow

LEASE = 3.0
NO_PROC = {"REDLOCK_TEST_NO_PROC": "1", "REDLOCK_TEST_LEASE": str(LEASE)}
DUPLICATES = 200


def ending(client: Celery, api: str, **kwargs: Any) -> AsyncResult:
    name = f"tests.e2e.proj.{API_TASKS[api]['ending']}"
    return client.send_task(name, kwargs={"key": f"k-{api}", **kwargs})


def hold(client: Celery, records: redis_py.Redis, api: str) -> tuple[int, str]:
    """Start a 30 s holder of ``k-<api>``; return its child's pid and its lock key."""
    holder = ending(client, api, how="sleep", duration=30.0)
    key = wait_until(lambda: records.get(f"lockkey:{holder.id}"), 15.0, f"{api} holder")
    start = json.loads(records.lrange(f"starts:k-{api}", 0, 0)[0])
    return int(start["pid"]), key.decode()


def test_without_proc_duplicates_never_overlap_and_a_killed_child_is_still_freed(
    proj_client: Celery, redis_server: RedisServer, r: redis_py.Redis
) -> None:
    records = redis_py.Redis(port=redis_server.port, db=3)
    with WorkerProcess(
        redis_server.port, "w1", concurrency=2, env=NO_PROC, app="tests.e2e.proj"
    ) as worker:
        assert records.get("proc") == b"/nonexistent"  # the worker reads no /proc
        ran = {}
        for api in API_TASKS:  # one wave of duplicates per API, all of one key
            before = int(records.get("runs:dup") or 0)
            name = f"tests.e2e.proj.{API_TASKS[api]['critical']}"
            calls = [proj_client.send_task(name, args=("dup", 0.3)) for _ in range(DUPLICATES // 2)]
            values = [call.get(timeout=60) for call in calls]
            ran[api] = values.count("dup")
            assert values.count(None) == len(values) - ran[api]  # the others were skipped
            assert int(records.get("runs:dup") or 0) - before == ran[api] >= 1
        assert records.get("overlaps") is None, f"overlapping executions; runs: {ran}"

        # A child killed while holding a lock: its lock is still freed, within the lease.
        held = {api: hold(proj_client, records, api) for api in API_TASKS}
        killed = time.time()
        for pid, _ in held.values():
            os.kill(pid, signal.SIGKILL)
        seen = watch_events(
            {api: (lambda lock=lock: not r.exists(lock)) for api, (_, lock) in held.items()},
            LEASE + 5.0,
        )
        for api in API_TASKS:  # and the key runs again
            assert ending(proj_client, api).get(timeout=15) == f"k-{api}"
        text = worker.text()
    records.close()
    for api, released in seen.items():
        pid = held[api][0]
        by = "the main process" if f"dead child {pid}" in text else "its lease"
        latency = (released - killed) * 1000
        print(f"\n[no /proc] {api}: {ran[api]} runs; kill to release {latency:.0f} ms, by {by}")
        assert released - killed <= LEASE + 0.5
