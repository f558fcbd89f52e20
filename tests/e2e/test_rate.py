"""``lock_rate`` end to end: starts per lock identity across prefork workers, never dropped.

The tasks are those of :mod:`tests.e2e.rate_app` (``rated``: ``LockedTask`` with
``lock_limit=2``; ``plain_rated``: ``@single_instance``; both ``max_retries=0`` under
``on_contention="wait"``). Each start records the server time at which the rate script admitted
it and the server time its body began. The guarantee is checked on the admitted times, where it
is exact: in no half-open interval of the rate's length are more starts than the rate allows.
The body times trail them by a round trip and some scheduling; their windows are reported.

The short test runs in the default suite; the 60 s soak (two workers x two processes, a flood
of calls in random bursts) is marked ``soak`` and runs with ``REDLOCK_TEST_SOAK=1``.
"""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Iterator

import pytest
import redis as redis_py
from celery import Celery

from celery_redlock import metrics
from celery_redlock.testing import RedisServer, wait_until
from support.apps import make_app
from support.polling import max_in_window
from support.workers import WorkerProcess

pytestmark = pytest.mark.slow

APP = "tests.e2e.rate_app"
TASKS = {"task": f"{APP}.rated", "decorator": f"{APP}.plain_rated"}


@pytest.fixture
def client(redis_url: str, redis_server: RedisServer) -> Iterator[Celery]:
    app = make_app(redis_server, name="rate_app")
    yield app
    app.close()


def starts(records: redis_py.Redis, task: str) -> list[dict[str, int | str | None]]:
    return [json.loads(raw) for raw in records.lrange(f"starts:{task}", 0, -1)]


def check(
    records: redis_py.Redis, task: str, sent: list[str], count: int, period_us: int
) -> dict[str, int]:
    """Assert the guarantee for ``task``'s starts; return the measures."""
    ran = starts(records, task)
    assert sorted(str(s["id"]) for s in ran) == sorted(sent)  # every call ran, exactly once
    assert {s["retries"] for s in ran} == {0}  # rate retries never count against max_retries
    admitted = [int(s["admitted"]) for s in ran]  # type: ignore[arg-type]
    body = [int(s["body"]) for s in ran]  # type: ignore[arg-type]
    assert all(b >= a for a, b in zip(admitted, body, strict=True))  # admitted, then started
    measures = {
        "starts": len(ran),
        "max_admitted_per_window": max_in_window(admitted, period_us),
        "max_body_per_window": max_in_window(body, period_us),
        "span_ms": (max(admitted) - min(admitted)) // 1000,
    }
    assert measures["max_admitted_per_window"] <= count, measures
    return measures


def rate_limited(app: Celery, task: str) -> int:
    return metrics.read_stats(app).get(task, {}).get("rate_limited", 0)


def test_five_per_second_for_both_apis_on_one_worker(
    client: Celery, redis_server: RedisServer
) -> None:
    """20 calls of each API at once: each key starts at most 5 times in any 1 s, and all run."""
    records = redis_py.Redis(port=redis_server.port, db=3)
    with WorkerProcess(redis_server.port, "w1", concurrency=2, app=APP) as worker:
        log = worker.text
        sent = {
            api: [client.send_task(task, args=(i, 0.02)) for i in range(20)]
            for api, task in TASKS.items()
        }
        for api, task in TASKS.items():
            assert [res.get(timeout=30) for res in sent[api]] == list(range(20))
            check(records, task, [res.id for res in sent[api]], 5, 1_000_000)
            # Every refusal is logged once at INFO and counted (flushed once a second).
            refusals = len(re.findall(rf"{re.escape(task)}\[.*over its rate.*retrying in", log()))
            wait_until(
                lambda: rate_limited(client, task) == refusals,  # noqa: B023
                10,
                f"the rate_limited counter of {task} to reach {refusals}",
            )


@pytest.mark.soak
def test_soak_ten_per_second_two_workers_for_a_minute(
    client: Celery, redis_server: RedisServer
) -> None:
    """Two prefork workers x two processes, 60 s: a flood of calls in random bursts (about
    1.5 x the rate for 40 s); no 1 s window holds more than 10 admitted starts, all run."""
    records = redis_py.Redis(port=redis_server.port, db=3)
    task = TASKS["task"]
    rng = random.Random(5732)
    knobs = {"REDLOCK_TEST_RATE": "10/s"}
    workers = [
        WorkerProcess(redis_server.port, name, concurrency=2, app=APP, env=knobs)
        for name in ("w1", "w2")
    ]
    for worker in workers:
        worker.launch()
    try:
        for worker in workers:
            worker.ready()
        results = []
        for _ in range(80):  # the producer: a burst every 0.5 s
            start = len(results)
            burst = range(start, start + rng.randint(0, 15))
            results += [client.send_task(task, args=(n, 0.1)) for n in burst]
            time.sleep(0.5)  # pacing the load, not waiting for an outcome
        values = [res.get(timeout=120) for res in results]
        logs = "".join(worker.text() for worker in workers)
    finally:
        for worker in workers:
            worker.kill()
    assert values == list(range(len(results)))
    measures = check(records, task, [res.id for res in results], 10, 1_000_000)
    measures["calls"] = len(results)
    measures["rate_retries"] = len(re.findall(r"over its rate.*retrying in", logs))
    assert measures["rate_retries"] > 0
    print(f"\nlock_rate='10/s' soak: {measures}")
