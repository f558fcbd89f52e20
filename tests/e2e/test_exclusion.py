"""Mutual exclusion end to end: duplicate submissions across two prefork workers."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest
import redis as redis_py
from celery import Celery

from celery_redlock.testing import RedisServer, wait_until
from support.apps import lock_keys
from support.workers import WorkerProcess

pytestmark = pytest.mark.slow

KEYS = ["k0", "k1", "k2", "k3"]


def test_duplicates_across_two_prefork_workers_never_overlap(
    proj_client: Celery, redis_server: RedisServer, r: redis_py.Redis
) -> None:
    records = redis_py.Redis(port=redis_server.port, db=3)
    rng = random.Random(7)
    with (
        WorkerProcess(redis_server.port, "w1", app="tests.e2e.proj"),
        WorkerProcess(redis_server.port, "w2", app="tests.e2e.proj"),
    ):
        results = [
            proj_client.send_task(
                "tests.e2e.proj.critical", args=(rng.choice(KEYS), rng.uniform(0.0, 0.03))
            )
            for _ in range(400)
        ]
        values = [res.get(timeout=60) for res in results]
        # A result is stored before after_return releases: wait for the last releases.
        wait_until(lambda: not lock_keys(r), 10, "every lock to be released")
    ran = [v for v in values if v is not None]
    assert records.get("overlaps") is None
    assert len(ran) == sum(int(records.get(f"runs:{k}") or 0) for k in KEYS)
    assert 0 < len(ran) < len(values)  # both outcomes happened: runs and skips
    sequence: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for _, fields in records.xrange("events"):
        sequence[fields[b"key"].decode()].append((fields[b"ev"].decode(), int(fields[b"token"])))
    for key, events in sequence.items():
        kinds = [ev for ev, _ in events]
        assert kinds == ["enter", "exit"] * (len(kinds) // 2), key
        tokens = [tok for ev, tok in events if ev == "enter"]
        assert tokens == sorted(set(tokens)), f"fencing tokens not increasing for {key}"
    assert lock_keys(r) == []
