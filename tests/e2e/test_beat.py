"""Periodic locked tasks sent by real ``celery beat`` subprocesses to prefork workers.

The app is :mod:`tests.e2e.beat_limit_app`; every test waits on the records its tasks and beats
write (bounded by a deadline), never on a guessed sleep.
"""

from __future__ import annotations

import itertools
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest
import redis as redis_py

from celery_redlock.testing import RedisServer, wait_until
from support.apps import lock_keys
from support.workers import WorkerProcess

pytestmark = pytest.mark.slow

APP = "tests.e2e.beat_limit_app"


class BeatProcess(WorkerProcess):
    """``celery -A tests.e2e.beat_limit_app beat`` with its own schedule file, logging to a
    file."""

    READY = r"beat: Starting"

    def __init__(self, port: int, name: str, schedule_dir: Path, schedule: str) -> None:
        self.schedule_file = schedule_dir / f"schedule-{name}"
        super().__init__(
            port, name, app=APP, env={"REDLOCK_TEST_SCHEDULE": schedule, "REDLOCK_TEST_BEAT": name}
        )

    def command(self, pool: str, concurrency: int, args: Sequence[str]) -> list[str]:
        return [
            sys.executable,
            "-m",
            "celery",
            "-A",
            self.app,
            "beat",
            "-l",
            "INFO",
            "-s",
            str(self.schedule_file),
            "--logfile",
            str(self.log),
        ]

    def sends(self, entry: str) -> int:
        """How many times this beat sent ``entry`` (its log lines)."""
        return self.text().count(f"Sending due task {entry} (")


def events(records: redis_py.Redis) -> list[dict[str, str]]:
    return [
        {k.decode(): v.decode() for k, v in fields.items()}
        for _, fields in records.xrange("events")
    ]


def of(evs: list[dict[str, str]], task: str, ev: str) -> list[dict[str, str]]:
    return [e for e in evs if e["task"] == f"{APP}.{task}" and e["ev"] == ev]


def runs(evs: list[dict[str, str]], task: str) -> list[tuple[float, float]]:
    """(enter, exit) times of the finished runs of ``task``, by start."""
    exits = {e["id"]: float(e["t"]) for e in of(evs, task, "exit")}
    return sorted(
        (float(e["t"]), exits[e["id"]]) for e in of(evs, task, "enter") if e["id"] in exits
    )


@pytest.fixture
def records(redis_url: str, redis_server: RedisServer) -> redis_py.Redis:
    return redis_py.Redis(port=redis_server.port, db=3)


def test_a_running_job_is_never_overlapped_by_its_next_tick(
    redis_server: RedisServer, records: redis_py.Redis, r: redis_py.Redis, tmp_path: Path
) -> None:
    """Runs take 1.5 s every 1 s: the tick in between is skipped (or retried, by policy)."""

    def enough() -> bool:
        evs = events(records)
        # A run that had been requeued by the lock first (lock retries keep retries at 0).
        requeued = {e["id"] for e in of(evs, "slow_retry_job", "contended")}
        retried_runs = [e for e in of(evs, "slow_retry_job", "enter") if e["id"] in requeued]
        return (
            len(runs(evs, "slow_job")) >= 2
            and len(of(evs, "slow_job", "contended")) >= 1
            and len(runs(evs, "slow_retry_job")) >= 2
            and bool(retried_runs)
        )

    with WorkerProcess(redis_server.port, "w1", concurrency=3, app=APP) as worker:
        with BeatProcess(redis_server.port, "b1", tmp_path, "overlap"):
            wait_until(enough, 12, "two runs and a contended tick of each job")
        assert worker.stop() == 0  # warm shutdown: a run in progress finishes and releases
    assert lock_keys(r) == []
    evs = events(records)
    for task in ("slow_job", "slow_retry_job"):
        assert records.zscore("max_active", task) == 1, task
        done = runs(evs, task)
        for (_, end), (start, _) in itertools.pairwise(done):
            assert start >= end, f"{task}: a run started before the previous one ended"
        run_ids = {e["id"] for e in of(evs, task, "enter")}
        for contended in of(evs, task, "contended"):
            assert contended["holder"] in run_ids  # contended with a run of the same job
    assert {e["policy"] for e in of(evs, "slow_job", "contended")} == {"skip"}
    skipped = {e["id"] for e in of(evs, "slow_job", "contended")}
    assert not skipped & {e["id"] for e in of(evs, "slow_job", "enter")}  # skipped: never ran
    assert {e["policy"] for e in of(evs, "slow_retry_job", "contended")} == {"retry"}


def test_two_beats_sending_the_same_tick_run_it_once(
    redis_server: RedisServer, records: redis_py.Redis, r: redis_py.Redis, tmp_path: Path
) -> None:
    """Two beats send each whole second; lock_cooldown keeps the key through the other send.

    Each task has a worker with one pool process, which runs the two sends of a tick one
    after the other: the worst case for a plain lock. The control task (locked, no cooldown)
    runs both sends of a tick; ``tick_job`` runs one and skips the other.
    """

    def sent() -> dict[str, tuple[str, str, int]]:
        """task id -> (beat, task, tick) of every message the beats published."""
        out = {}
        for task_id, value in records.hgetall("sent").items():
            beat, task, at = value.decode().split()
            out[task_id.decode()] = (beat, task.rpartition(".")[2], round(float(at)))
        return out

    def per_tick(task: str) -> dict[int, tuple[int, int]]:
        """tick -> (sends, runs) of ``task``, for the ticks whose sends all executed."""
        msgs = sent()
        evs = events(records)
        executed = {e["id"] for e in evs if e["ev"] in ("enter", "contended")}
        ran = {e["id"] for e in of(evs, task, "enter")}
        ticks: dict[int, list[str]] = {}
        for task_id, (_, name, tick) in msgs.items():
            if name == task:
                ticks.setdefault(tick, []).append(task_id)
        return {
            tick: (len(ids), len(ran & set(ids)))
            for tick, ids in ticks.items()
            if all(i in executed for i in ids)
        }

    def enough() -> bool:
        guarded = per_tick("tick_job").values()
        plain = per_tick("tick_plain").values()
        return sum(1 for n in guarded if n == (2, 1)) >= 3 and (2, 2) in plain

    with (
        WorkerProcess(redis_server.port, "w1", concurrency=1, app=APP) as worker,
        WorkerProcess(
            redis_server.port, "w2", concurrency=1, app=APP, args=["-Q", "plain"]
        ) as plain_worker,
    ):
        with (
            BeatProcess(redis_server.port, "b1", tmp_path, "ticks") as b1,
            BeatProcess(redis_server.port, "b2", tmp_path, "ticks") as b2,
        ):
            wait_until(enough, 15, "three ticks sent twice and run once")
            assert b1.sends("tick") >= 3 and b2.sends("tick") >= 3
        # Warm shutdowns: a running task finishes and releases.
        assert worker.stop() == 0 and plain_worker.stop() == 0
    msgs = sent()
    evs = events(records)
    assert {beat for beat, _, _ in msgs.values()} == {"b1", "b2"}
    runs_per_tick = Counter(msgs[e["id"]][2] for e in of(evs, "tick_job", "enter"))
    assert max(runs_per_tick.values()) == 1, runs_per_tick  # never two runs of one tick
    # The other send: skipped, by its tick's run, or by the tick before's when that run came
    # so late that its cooldown still held the key (seen under a load of 12 on 2 cores).
    for skipped in of(evs, "tick_job", "contended"):
        assert skipped["policy"] == "skip"
        assert msgs[skipped["id"]][2] - msgs[skipped["holder"]][2] in (0, 1)
    assert records.zscore("max_active", "tick_job") == 1
    wait_until(lambda: lock_keys(r) == [], 5, "the last cooldown to end")


def test_beat_goes_through_enqueue_deduplication(
    redis_server: RedisServer, records: redis_py.Redis, r: redis_py.Redis, tmp_path: Path
) -> None:
    """The task is registered in the beat process, so beat calls its apply_async: while a send
    waits in the queue (no worker yet), later ticks return it instead of queueing more."""
    broker = redis_py.Redis(port=redis_server.port, db=1)
    with BeatProcess(redis_server.port, "b1", tmp_path, "enqueue") as beat:
        wait_until(lambda: beat.sends("queued") >= 4, 10, "four ticks of the queued entry")
        published = records.hkeys("sent")
        assert len(published) == 1  # one message for four ticks
        assert broker.llen("celery") == 1
        (marker,) = r.keys("redlock:{*}:queued")
        assert r.get(marker) == published[0]
        with WorkerProcess(redis_server.port, "w1", concurrency=1, app=APP):
            first = published[0].decode()
            wait_until(
                lambda: [e for e in of(events(records), "queued_job", "exit") if e["id"] == first],
                10,
                "the queued send to run",
            )
            # It cleared the marker when it started: the next tick is queued again, and runs.
            wait_until(
                lambda: len(of(events(records), "queued_job", "exit")) >= 2,
                10,
                "a later tick to be queued and run",
            )
    assert len(records.hkeys("sent")) >= 2
    ran = [e["id"] for e in of(events(records), "queued_job", "enter")]
    assert len(ran) == len(set(ran))
