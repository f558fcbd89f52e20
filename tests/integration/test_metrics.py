"""Event counters: counted where the task runs, summed in Redis, exported to Prometheus."""

from __future__ import annotations

import json
import logging
import multiprocessing
import re
import threading
import time
import warnings
from collections.abc import Callable
from importlib import metadata
from types import SimpleNamespace
from typing import Any

import pytest
import redis as redis_py
from celery import Celery
from click.testing import CliRunner
from prometheus_client import CollectorRegistry, generate_latest

from celery_redlock import (
    Lock,
    LockContended,
    LockedTask,
    LockUnavailable,
    current_lock,
    lock_key,
    metrics,
    signals,
)
from celery_redlock.cli import redlock
from celery_redlock.metrics import PrometheusCollector, read_stats
from celery_redlock.testing import RedisServer, record_lock_events, wait_until
from celery_redlock.web._core import Dashboard
from support.apps import make_app
from support.workers import running_worker


def counted_as(app: Celery, expected: dict[str, dict[str, int]]) -> Callable[[], bool]:
    """A predicate: the counters in Redis have reached ``expected`` (absent events = 0)."""

    def reached() -> bool:
        metrics.flush()  # the flush thread runs once a second; do not wait for it
        stats = read_stats(app)
        return all(
            stats.get(task, {}).get(event, 0) == n
            for task, counts in expected.items()
            for event, n in counts.items()
        )

    return reached


def _held(redis_url: str, key: str) -> Lock:
    holder = Lock(redis_url, key.removeprefix("redlock:{").removesuffix("}"), ttl=30)
    assert holder.acquire()
    return holder


def test_every_outcome_is_counted_per_task(app: Celery, redis_url: str) -> None:
    def locked(policy: str, name: str) -> Any:
        @app.task(
            base=LockedTask,
            name=name,
            lock_by=(),
            lock_name="m",
            lock_on_contention=policy,
            lock_wait_timeout=0.2,
            lock_retry_countdown=0,  # one lock retry at once; the next would end past
            lock_retry_for=0.001,  # lock_retry_for: LockContended
            max_retries=0,
        )
        def task() -> str:
            return name

        return task

    skipper, failer = locked("skip", "m.skipper"), locked("fail", "m.failer")
    waiter, retrier = locked("wait", "m.waiter"), locked("retry", "m.retrier")
    with running_worker(app):
        assert skipper.delay().get(timeout=10) == "m.skipper"
        holder = _held(redis_url, lock_key(skipper))
        try:
            assert skipper.delay().get(timeout=10) is None
            for task in (failer, waiter, retrier):
                with pytest.raises(LockContended):
                    task.delay().get(timeout=10)
        finally:
            holder.release()
        expected = {
            "m.skipper": {"acquired": 1, "released": 1, "skipped": 1},
            "m.failer": {"failed": 1, "acquired": 0},
            "m.waiter": {"waited": 1, "failed": 1, "acquired": 0},
            "m.retrier": {"retried": 1, "acquired": 0},
        }
        wait_until(counted_as(app, expected), 10, "the counters")
    stats = read_stats(app)
    assert set(expected) <= set(stats)
    assert {event for counts in stats.values() for event in counts} <= set(metrics.EVENTS)


def test_counts_made_while_redis_is_down_arrive_when_it_answers(redis_server: RedisServer) -> None:
    with RedisServer() as locks:
        app = make_app(redis_server, redlock_url=locks.url, redlock_on_unavailable="fail")

        @app.task(base=LockedTask, name="m.outage")
        def outage() -> None: ...

        locks.stop()
        with pytest.raises(LockUnavailable):
            outage.apply().get()
        metrics.flush()  # fails: the counts stay in memory
        locks.start()
        wait_until(counted_as(app, {"m.outage": {"unavailable": 1}}), 10, "the kept count")
        app.close()


def test_a_release_redis_does_not_answer_is_counted_unreleased(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Probe: a release Redis did not answer (or answered after the lease, the key expired)
    counted nothing, so ``acquired - released - lost`` showed a leaked lock. It counts
    ``unreleased``: the key is freed by its TTL at the latest (a stalled Redis may still run
    the release when it wakes, which the WARNING says: a probe saw the key freed so)."""
    with RedisServer() as locks:
        app = make_app(redis_server, redlock_url=locks.url)

        @app.task(base=LockedTask, name="m.stranded", lock_ttl=30)
        def stranded() -> str:
            locks.stop()  # the release that follows the body finds no Redis
            return "ran"

        with caplog.at_level(logging.WARNING, logger="celery_redlock"):
            assert stranded.apply().get() == "ran"
        assert "it expires within 30s unless Redis still runs the release" in caplog.text
        locks.start()
        done = {"m.stranded": {"unreleased": 1, "released": 0, "lost": 0}}
        wait_until(counted_as(app, done), 10, "the unreleased count")
        app.close()


def test_a_field_that_is_no_number_drops_its_own_counts_and_no_other_is_counted_twice(
    app: Celery, r: redis_py.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """One HINCRBY of a flush refused ("hash value is not an integer") while the others were
    added: the flush kept all of them, and sent the added ones again every second."""

    @app.task(base=LockedTask, name="m.poisoned")
    def poisoned() -> None: ...

    key = "redlock:stats:m.poisoned"
    r.hset(key, "acquired", "not a number")
    with caplog.at_level(logging.DEBUG, logger="celery_redlock.metrics"):
        for _ in range(3):
            poisoned.apply().get()
        for _ in range(3):
            metrics.flush()
    assert r.hgetall(key) == {b"acquired": b"not a number", b"released": b"3"}
    # The background flush (every second) may take some of the counts first: each flush that
    # drops some says so, at WARNING the first time, then at DEBUG; three dropped in all.
    drops = [rec for rec in caplog.records if "cannot be added to" in rec.getMessage()]
    assert [rec.levelno for rec in drops].count(logging.WARNING) == 1
    assert all("'acquired' of redlock:stats:m.poisoned" in rec.getMessage() for rec in drops)
    found = [re.search(r"(\d+) dropped", rec.getMessage()) for rec in drops]
    assert sum(int(match.group(1)) for match in found if match) == 3


def test_prometheus_collector_exports_the_sums(app: Celery, r: redis_py.Redis) -> None:
    r.hset("redlock:stats:proj.sync", mapping={"acquired": 5, "skipped": 2, "bogus": 7})
    r.hset("redlock:stats:proj.report", mapping={"released": 1})
    registry = CollectorRegistry()
    registry.register(PrometheusCollector(app))
    text = generate_latest(registry).decode()
    assert "# TYPE celery_redlock_events_total counter" in text
    assert 'celery_redlock_events_total{event="skipped",task="proj.sync"} 2.0' in text
    sample = registry.get_sample_value
    assert sample("celery_redlock_events_total", {"task": "proj.sync", "event": "acquired"}) == 5
    assert sample("celery_redlock_events_total", {"task": "proj.report", "event": "released"}) == 1
    r.hincrby("redlock:stats:proj.sync", "skipped", 1)  # read from Redis at every scrape
    assert sample("celery_redlock_events_total", {"task": "proj.sync", "event": "skipped"}) == 3
    # Every event of a task is a series, 0 until it happens (a rate() over a missing series
    # is no 0); a field written by hand is none.
    assert sample("celery_redlock_events_total", {"task": "proj.report", "event": "lost"}) == 0
    assert sample("celery_redlock_events_total", {"task": "proj.sync", "event": "bogus"}) is None


def test_a_stray_field_of_a_counter_hash_is_no_column(app: Celery, r: redis_py.Redis) -> None:
    """A field that is no event became a column for every task of ``stats``, ``stats --json``
    and the Counters tab (probe, round 4); they now show the events Prometheus exports."""
    r.hset("redlock:stats:proj.sync", mapping={"acquired": 5, "<b>evil</b>": 7})
    r.hset("redlock:stats:proj.report", mapping={"released": 1, "zzz": 3})
    cli = CliRunner()
    shown = cli.invoke(redlock, ["stats"], obj=SimpleNamespace(app=app))
    assert shown.exit_code == 0, shown.output
    assert shown.output.split("\n")[0].split() == ["TASK", *metrics.EVENTS]
    assert "evil" not in shown.output and "zzz" not in shown.output
    as_json = cli.invoke(redlock, ["stats", "--json"], obj=SimpleNamespace(app=app))
    assert as_json.exit_code == 0, as_json.output
    counts = json.loads(as_json.output)
    assert {task: sorted(c) for task, c in counts.items()} == {  # dumped with sorted keys
        "proj.report": sorted(metrics.EVENTS),
        "proj.sync": sorted(metrics.EVENTS),
    }
    assert counts["proj.sync"]["acquired"] == 5 and counts["proj.report"]["released"] == 1
    status, body = Dashboard(app).stats_page({})
    assert status == 200 and "evil" not in body and "zzz" not in body
    assert re.findall(r"<th>(\w+)</th>", body) == ["Task", *metrics.EVENTS]


def test_prometheus_is_an_optional_extra_and_part_of_the_test_extra() -> None:
    requires = metadata.requires("celery-redlock") or []
    assert 'prometheus-client>=0.17; extra == "prometheus"' in requires
    assert 'prometheus-client>=0.17; extra == "test"' in requires
    assert not any(r.startswith("prometheus") and "extra" not in r for r in requires)


@pytest.mark.parametrize("cached", [True, False])
def test_counts_made_by_many_threads_while_flushes_run_are_each_written_once(
    app: Celery, monkeypatch: pytest.MonkeyPatch, cached: bool
) -> None:
    """Counting takes no lock (a deque's append): a count made while a flush drains is
    written by that flush or the next, never lost and never twice; also once the cache of
    counted events is full (``cached=False``: every count builds its own entry)."""
    if not cached:
        monkeypatch.setattr(metrics, "_counted", {})
        monkeypatch.setattr(metrics, "COUNTED_MAX", 0)
    threads, each = 8, 2000
    start = threading.Barrier(threads + 1)
    done = threading.Event()

    def counting() -> None:
        start.wait()
        for _ in range(each):
            metrics.count(app, "m.threads", "skipped")

    def flushing() -> None:
        start.wait()
        while not done.is_set():
            metrics.flush()

    workers = [threading.Thread(target=counting) for _ in range(threads)]
    flusher = threading.Thread(target=flushing)
    for thread in [*workers, flusher]:
        thread.start()
    for thread in workers:
        thread.join(60)
    done.set()
    flusher.join(60)
    metrics.flush()
    assert read_stats(app)["m.threads"]["skipped"] == threads * each
    if not cached:
        assert metrics._counted == {}


def test_a_forked_multiprocessing_child_flushes_its_counts_as_it_exits(
    app: Celery, r: redis_py.Redis
) -> None:
    """Django probe, round 3: a child forked by ``multiprocessing`` (the workers of Django's
    ``test --parallel``) ends with ``os._exit``, which skips ``atexit``: every count it made
    since its last one-second flush was lost. Here it makes one call and exits at once."""

    @app.task(base=LockedTask, shared=False, name="m.forked")
    def job() -> str:
        return "ran"

    fork = multiprocessing.get_context("fork")
    with warnings.catch_warnings():  # Python 3.12+: forking a process that has threads
        warnings.simplefilter("ignore", DeprecationWarning)
        child = fork.Process(target=job.apply)
        child.start()
    child.join(30)
    assert child.exitcode == 0
    assert read_stats(app).get("m.forked") == {"acquired": 1, "released": 1}


def test_a_lock_reported_lost_is_counted_lost_once_though_its_release_then_freed_it(
    redis_server: RedisServer, r: redis_py.Redis
) -> None:
    """Django probe, round 3 (seen once in 11 outage runs): (1) the lease ends by the worker's
    clock, which reckons it from when each renewal was sent, less a drift allowance, and the
    renewal reports the lock lost (``lock_lost``); (2) Redis, which extended the key when the
    renewal arrived, still holds it for this call when the body's release comes; (3) the
    release deletes it, and the lock was counted, and signalled, both ``lost`` and
    ``released``. Here the lock's clock jumps past its lease while Redis keeps the key."""
    app = make_app(redis_server, redlock_lease=3)  # renewed each second
    reported = threading.Event()

    def on_lost(**_: Any) -> None:
        reported.set()

    @app.task(base=LockedTask, shared=False, name="m.late")
    def late() -> bool:
        lock = current_lock()
        assert lock is not None
        lock.clock = lambda: time.monotonic() + 3600
        assert reported.wait(10), "the renewal to report the lock lost"
        return bool(r.exists(lock.key))

    signals.lock_lost.connect(on_lost, weak=False)
    try:
        with record_lock_events() as events:
            assert late.apply().get() is True  # Redis held the key for this call
    finally:
        signals.lock_lost.disconnect(on_lost)
    assert r.exists(lock_key(late)) == 0  # the release freed it
    assert [e.kind for e in events.events] == ["acquired", "lost"]
    wait_until(counted_as(app, {"m.late": {"acquired": 1, "lost": 1}}), 10, "the counters")
    assert read_stats(app)["m.late"] == {"acquired": 1, "lost": 1}


def test_a_lock_past_its_lease_by_its_clock_alone_and_released_is_counted_released(
    app: Celery, r: redis_py.Redis
) -> None:
    """The same without the report: the lease ended by the lock's clock, no renewal said so
    yet, and the release found the key still this call's. Released it is, once."""

    @app.task(base=LockedTask, shared=False, name="m.unreported", lock_ttl=30)
    def unreported() -> bool:
        lock = current_lock()
        assert lock is not None
        lock.clock = lambda: time.monotonic() + 3600
        return lock.lost

    with record_lock_events() as events:
        assert unreported.apply().get() is True
    assert r.exists(lock_key(unreported)) == 0
    assert [e.kind for e in events.events] == ["acquired", "released"]
