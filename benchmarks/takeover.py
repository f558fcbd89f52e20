"""Takeover latency: how soon the same key runs again after each way a lock holder can end.

Run from the repository root (see ``benchmarks/README.md``)::

    python -m benchmarks.takeover                    # every ending, 5 trials, about 3-4 minutes
    python -m benchmarks.takeover --quick            # 2 trials of 8 endings, under a minute
    python -m benchmarks.takeover --trials 9 --json takeover.json --endings return,child_kill

For each ending, a holder of a key is driven into that ending on a real prefork
``celery worker`` while a second execution of the same key (``tests.e2e.proj.waiter``,
``lock_on_contention="wait"``) is already blocked on the lock in another pool child or another
worker. Two times are measured from the event (the return, the kill, the limit, the revoke, the
signal, the retry's publish):

* *next start*: until the waiting execution of the key (or the retry attempt, or the requeued
  message) starts its body, stamped with ``time.time()`` by that pool child;
* *released*: until the lock key no longer holds the ending attempt's token (deleted by the
  child or the worker's main process, or expired), seen by this script polling the key every
  millisecond: resolution about 1-2 ms.

Everything runs against a private ``redis-server`` on a free port
(:class:`celery_redlock.testing.RedisServer`); every worker is a ``celery -A
benchmarks.takeover_app worker`` subprocess in its own process group, SIGKILLed at the end.
Every wait is bounded; a trial that times out is reported as failed and its worker restarted.
Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from celery.result import AsyncResult

from benchmarks._common import environment
from celery_redlock._redis.keys import LockKeys, glob_escape, waiter_channel
from celery_redlock.testing import RedisServer, wait_until
from support.procfs import pid_alive
from support.workers import WorkerProcess

APP = "benchmarks.takeover_app"
ENDING = "tests.e2e.proj.ending"
WAITER = "tests.e2e.proj.waiter"
HELD = "takeover.held"
PARENT_RELEASE = "released the lock of dead child"
ACKS_LATE = {"REDLOCK_TEST_ACKS_LATE": "1"}

#: How long a holder that is going to be killed would otherwise run (never reached).
HOLD_S = 30.0
#: Hard time limit of the time-limit endings.
LIMIT_S = 2.0
#: ``redlock_lease`` of the worker killed as a whole: the bound of that ending.
LEASE_S = 2.0
#: Celery's periodic maintain_pool: the latest a worker notices a SIGKILLed child.
MAINTAIN_POOL_S = 5.0
#: Poll interval of the lock key.
POLL_S = 0.001

#: Queues: the shared worker takes the default one; the others are private to their worker.
ACKS_QUEUE, COLD_QUEUE, KILLED_QUEUE = "takeover-acks", "takeover-cold", "takeover-killed"


def progress(message: str) -> None:
    sys.stdout.flush()
    print(message, file=sys.stderr, flush=True)


# -- one trial ------------------------------------------------------------------------------------


@dataclass
class Holding:
    """A holder of ``key`` that has started, and the waiter blocked on its lock (if any)."""

    key: str
    result: AsyncResult
    start: dict[str, Any]
    lock: str
    token: bytes
    waiter: AsyncResult | None = None


@dataclass
class Seen:
    released: float  # time.time() the key was first seen without the holder's token
    next_start: dict[str, Any]  # start record of the key's next execution


class Bench:
    def __init__(self, server: RedisServer, args: argparse.Namespace) -> None:
        self.port = server.port
        base = f"redis://127.0.0.1:{server.port}"
        self.client = Celery(
            "takeover-client", broker=f"{base}/1", backend=f"{base}/2", set_as_current=False
        )
        self.client.conf.broker_connection_retry_on_startup = True
        self.locks = redis.Redis(port=server.port, db=0, socket_timeout=5)
        self.records = redis.Redis(port=server.port, db=3, socket_timeout=5)
        self.args = args
        self.workers: dict[str, WorkerProcess] = {}
        self.failed_logs: list[str] = []
        self.serial = 0

    # workers

    def make(self, role: str) -> WorkerProcess:
        knobs: dict[str, str] = {}
        queue: list[str] = []
        concurrency = 2
        if role == "acks":
            knobs, queue = ACKS_LATE, ["-Q", ACKS_QUEUE]
        elif role == "cold":
            queue, concurrency = ["-Q", COLD_QUEUE], 1
        elif role == "killed":
            knobs, queue, concurrency = (
                {"REDLOCK_TEST_LEASE": str(LEASE_S)},
                ["-Q", KILLED_QUEUE],
                1,
            )
        self.serial += 1
        return WorkerProcess(
            self.port,
            f"{role}{self.serial}",
            concurrency=concurrency,
            args=queue,
            env=knobs,
            app=APP,
        )

    def launch(self, role: str) -> None:
        """Start a worker of ``role`` without waiting, so that several boot in parallel."""
        previous = self.workers.get(role)
        if previous is not None:
            previous.kill()
        self.workers[role] = self.make(role).launch()

    def worker(self, role: str) -> WorkerProcess:
        """The worker of ``role``, ready (launched now if there is none or it died), with all
        its pool children alive.

        A child killed by the previous trial (or SIGKILLed by billiard after a hard limit) may
        stay unnoticed by the pool for up to ``MAINTAIN_POOL_S``; starting a trial meanwhile
        would leave no child for the waiter.
        """
        worker = self.workers.get(role)
        if worker is None or not worker.alive:
            self.launch(role)
        worker = self.workers[role].ready(60.0)
        wanted = worker.concurrency
        wait_until(
            lambda: sum(map(pid_alive, worker.children())) >= wanted,
            MAINTAIN_POOL_S + 10.0,
            f"{wanted} live pool children in {worker.name}",
        )
        return worker

    def discard(self, role: str, keep_log: bool) -> None:
        worker = self.workers.pop(role, None)
        if worker is not None:
            worker.kill()
            if keep_log:
                self.failed_logs.append(str(worker.log))
            else:
                worker.log.unlink(missing_ok=True)

    def close(self) -> None:
        for role in list(self.workers):
            self.discard(role, keep_log=False)
        self.client.close()
        self.locks.close()
        self.records.close()

    # records

    def send(self, name: str, key: str, queue: str | None = None, **kwargs: Any) -> AsyncResult:
        options: dict[str, Any] = {"queue": queue} if queue else {}
        if "time_limit" in kwargs:
            options["time_limit"] = kwargs.pop("time_limit")
        return self.client.send_task(name, kwargs={"key": key, **kwargs}, **options)

    def starts(self, key: str) -> list[dict[str, Any]]:
        return [json.loads(e) for e in self.records.lrange(f"starts:{key}", 0, -1)]

    def stamp(self, name: str, timeout: float = 5.0) -> float:
        value = wait_until(lambda: self.records.get(name), timeout, name)
        return float(value)  # type: ignore[arg-type]

    def waiting(self, lock: str) -> bool:
        """Whether some execution is blocked waiting for ``lock``.

        A single-node waiter subscribes to a channel of its own (``<lock>:released:<id>``),
        then queues in ``<lock>:waiters``: blocked = queued, with some subscriber on one of
        the per-waiter channels. (A semaphore's or quorum's waiter would listen on the shared
        ``<lock>:released`` channel instead: counted too.)
        """
        keys = LockKeys(lock, (lock,))
        if self.locks.zcard(keys.waiters) and self.locks.pubsub_channels(
            glob_escape(waiter_channel(keys, "")) + "*"
        ):
            return True
        return bool(dict(self.locks.pubsub_numsub(keys.channel)).get(keys.channel.encode()))

    def hold(
        self, key: str, name: str, queue: str | None = None, waiter: bool = True, **kwargs: Any
    ) -> Holding:
        """Start a holder of ``key``; then (``waiter``) a waiter of the same key on the shared
        worker, and wait until it is blocked on the lock."""
        result = self.send(name, key, queue, **kwargs)
        wait_until(lambda: self.records.llen(f"starts:{key}") >= 1, 20.0, f"{key} to start")
        start = self.starts(key)[0]
        lock: bytes | None = self.records.get(f"lockkey:{result.id}")  # type: ignore[assignment]
        token: bytes | None = self.locks.get(lock) if lock else None  # type: ignore[assignment]
        if not lock or token is None or start["token"] is None:
            raise RuntimeError(f"{key}: the holder did not take the lock ({start})")
        holding = Holding(key, result, start, lock.decode(), token)
        if waiter:
            holding.waiter = self.send(WAITER, key)
            wait_until(lambda: self.waiting(holding.lock), 15.0, "the waiter to block")
        return holding

    def observe(self, holding: Holding, timeout: float) -> Seen:
        """Poll until the holder's token is gone from the lock key and the key's next execution
        has started; ``time.time()`` of the first, start record of the second."""
        deadline = time.monotonic() + timeout
        released: float | None = None
        starts = f"starts:{holding.key}"
        while True:
            if released is None and self.locks.get(holding.lock) != holding.token:
                released = time.time()
            if released is not None and self.records.llen(starts) >= 2:
                return Seen(released, self.starts(holding.key)[1])
            if time.monotonic() > deadline:
                missing = "the release" if released is None else "the next start"
                raise TimeoutError(f"{holding.key}: no {missing} within {timeout:.0f}s")
            time.sleep(POLL_S)

    def settle(
        self, holding: Holding, holder_result: bool = False, child_dies: bool = False
    ) -> None:
        """Let the trial's executions finish before the next trial (bounded); with
        ``child_dies``, also wait until the holder's pool child is dead (after a SIGTERM it may
        still be unwinding, and billiard SIGKILLs it 0.1 s later), so that the next trial's
        check for live children does not count it."""
        if child_dies:
            pid = holding.start["pid"]
            wait_until(lambda: not pid_alive(pid), 10.0, f"the holder's child {pid} to die")
        if holding.waiter is not None:
            holding.waiter.get(timeout=25, propagate=False)
        if holder_result:
            holding.result.get(timeout=15, propagate=False)

    def parent_released(self, worker: WorkerProcess, holding: Holding) -> bool:
        """Whether the worker's main process logged releasing this holder's lock."""
        line = f"[{holding.result.id}]: {PARENT_RELEASE} {holding.start['pid']}\n"
        return line in worker.text()


def timings(event: float, seen: Seen, **extra: float | bool | str | None) -> dict[str, Any]:
    return {
        "next_start_s": seen.next_start["t"] - event,
        "released_s": seen.released - event,
        **extra,
    }


def noticed(worker: WorkerProcess, pid: int, killed: float) -> float | None:
    """Seconds from the kill until the worker logged the child's exit (None if not logged)."""
    try:
        return worker.log_time(rf"pid:{pid} exited", timeout=MAINTAIN_POOL_S + 1.0) - killed
    except AssertionError:
        return None


# -- the endings ----------------------------------------------------------------------------------


def body_ending(how: str) -> Callable[[Bench, str], dict[str, Any]]:
    """The holder's body ends by itself (``takeover.held``): return, raise, Ignore, retry."""

    def run(bench: Bench, key: str) -> dict[str, Any]:
        bench.worker("shared")
        holding = bench.hold(key, HELD, waiter=how != "retry", how=how)
        bench.records.rpush(f"go:{key}", 1)
        seen = bench.observe(holding, 15.0)
        if how == "retry":  # from the publish of the retry message (after_task_publish)
            event = bench.stamp(f"published:{holding.result.id}")
            called = bench.stamp(f"event:{key}")
            extra: dict[str, Any] = {"retry_call_to_publish_s": event - called}
            if seen.next_start["retries"] != 1:
                raise RuntimeError(f"{key}: the next start is not the retry: {seen.next_start}")
        else:  # from the last statement of the body
            event, extra = bench.stamp(f"event:{key}"), {}
        bench.settle(holding, holder_result=how != "ignore")
        return timings(event, seen, **extra)

    return run


def hard_limit(how: str) -> Callable[[Bench, str], dict[str, Any]]:
    """``time_limit=2``; the child dies on SIGTERM (``sleep``) or blocks it (``sleep_noterm``)."""

    def run(bench: Bench, key: str) -> dict[str, Any]:
        worker = bench.worker("shared")
        holding = bench.hold(key, ENDING, how=how, duration=HOLD_S, time_limit=LIMIT_S)
        blocked = time.time()
        seen = bench.observe(holding, LIMIT_S + 15.0)
        event = worker.log_time(  # logged by the main process as the limit fires (1 ms resolution)
            rf"Hard time limit \([\d.]+s\) exceeded for {ENDING}\[{holding.result.id}\]"
        )
        bench.settle(holding, child_dies=True)
        return timings(
            event,
            seen,
            waiter_blocked_before_event=blocked <= event,
            parent_released=bench.parent_released(worker, holding),
        )

    return run


def child_kill(bench: Bench, key: str) -> dict[str, Any]:
    """SIGKILL the pool child running the holder (no acks_late: the task is lost)."""
    worker = bench.worker("shared")
    holding = bench.hold(key, ENDING, how="sleep", duration=HOLD_S)
    pid = holding.start["pid"]
    event = time.time()
    os.kill(pid, signal.SIGKILL)
    seen = bench.observe(holding, MAINTAIN_POOL_S + 10.0)
    bench.settle(holding, child_dies=True)
    return timings(
        event,
        seen,
        worker_noticed_s=noticed(worker, pid, event),
        parent_released=bench.parent_released(worker, holding),
    )


def child_kill_acks_late(bench: Bench, key: str) -> dict[str, Any]:
    """SIGKILL the child; acks_late + task_reject_on_worker_lost requeue the message, and the
    requeued message (same task id) is the key's next execution."""
    worker = bench.worker("acks")
    holding = bench.hold(key, ENDING, ACKS_QUEUE, waiter=False, how="sleep", duration=HOLD_S)
    pid = holding.start["pid"]
    event = time.time()
    os.kill(pid, signal.SIGKILL)
    seen = bench.observe(holding, MAINTAIN_POOL_S + 10.0)
    if (seen.next_start["id"], seen.next_start["redelivered"]) != (holding.result.id, True):
        raise RuntimeError(f"{key}: the next start is not the redelivery: {seen.next_start}")
    bench.settle(holding, holder_result=True, child_dies=True)
    return timings(
        event,
        seen,
        worker_noticed_s=noticed(worker, pid, event),
        parent_released=bench.parent_released(worker, holding),
    )


def revoke(sig: str) -> Callable[[Bench, str], dict[str, Any]]:
    def run(bench: Bench, key: str) -> dict[str, Any]:
        worker = bench.worker("shared")
        holding = bench.hold(key, ENDING, how="sleep", duration=HOLD_S)
        event = time.time()
        bench.client.control.revoke(holding.result.id, terminate=True, signal=sig)
        seen = bench.observe(holding, MAINTAIN_POOL_S + 10.0)
        bench.settle(holding, child_dies=True)
        return timings(event, seen, parent_released=bench.parent_released(worker, holding))

    return run


def cold_shutdown(bench: Bench, key: str) -> dict[str, Any]:
    """SIGQUIT to a worker whose only child holds the key; the waiter runs on the shared worker."""
    bench.worker("shared")
    doomed = bench.worker("cold")
    holding = bench.hold(key, ENDING, COLD_QUEUE, how="sleep", duration=HOLD_S)
    event = time.time()
    doomed.send(signal.SIGQUIT)
    seen = bench.observe(holding, 15.0)
    assert doomed.process is not None
    doomed.process.wait(20)
    bench.discard("cold", keep_log=False)
    bench.settle(holding)
    return timings(event, seen)


def worker_kill(bench: Bench, key: str) -> dict[str, Any]:
    """SIGKILL a whole worker (main process and child) holding the key with a 2 s lease: nobody
    releases, the key expires; the waiter runs on the shared worker."""
    bench.worker("shared")
    doomed = bench.worker("killed")
    holding = bench.hold(key, ENDING, KILLED_QUEUE, how="sleep", duration=HOLD_S)
    event = time.time()
    doomed.kill()
    seen = bench.observe(holding, LEASE_S + 15.0)
    bench.discard("killed", keep_log=False)
    bench.settle(holding)
    return timings(event, seen, acquired_to_released_s=seen.released - holding.start["t"])


@dataclass
class Ending:
    name: str
    label: str
    event: str
    released_by: str
    run: Callable[[Bench, str], dict[str, Any]]
    quick: bool = False
    roles: tuple[str, ...] = ("shared",)
    trials: list[dict[str, Any]] = field(default_factory=list)


ENDINGS = [
    Ending(
        "return",
        "return",
        "body returns",
        "child: as the body returns (engine)",
        body_ending("return"),
        quick=True,
    ),
    Ending(
        "exception",
        "exception",
        "body raises",
        "child: as the body raises (engine)",
        body_ending("raise"),
        quick=True,
    ),
    Ending(
        "retry",
        "self.retry()",
        "retry published",
        "child: before_task_publish",
        body_ending("retry"),
        quick=True,
    ),
    Ending(
        "ignore",
        "Ignore",
        "body raises Ignore",
        "child: as Ignore leaves the body (engine)",
        body_ending("ignore"),
    ),
    Ending(
        "hard_limit",
        "hard time limit",
        "limit fires (log)",
        "child: unwinding from SIGTERM (engine)",
        hard_limit("sleep"),
        quick=True,
    ),
    Ending(
        "hard_limit_noterm",
        "hard limit, SIGTERM blocked",
        "limit fires (log)",
        "main: after the SIGKILL",
        hard_limit("sleep_noterm"),
    ),
    Ending("child_kill", "child SIGKILL", "kill", "main: dead-child watch", child_kill, quick=True),
    Ending(
        "child_kill_acks_late",
        "child SIGKILL, acks_late",
        "kill",
        "main: dead-child watch; requeue when Celery notices",
        child_kill_acks_late,
        quick=True,
        roles=("acks",),
    ),
    Ending(
        "revoke_term",
        "revoke(terminate) SIGTERM",
        "revoke sent",
        "child: unwinding from SIGTERM (engine)",
        revoke("SIGTERM"),
    ),
    Ending(
        "revoke_kill",
        "revoke(terminate) SIGKILL",
        "revoke sent",
        "main: terminate()",
        revoke("SIGKILL"),
        quick=True,
    ),
    Ending(
        "cold_shutdown",
        "cold shutdown (SIGQUIT)",
        "SIGQUIT",
        "child: unwinding from SIGQUIT (engine)",
        cold_shutdown,
        roles=("shared", "cold"),
    ),
    Ending(
        "worker_kill",
        f"worker SIGKILL, lease {LEASE_S:g} s",
        "kill",
        "nobody: TTL",
        worker_kill,
        quick=True,
        roles=("shared", "killed"),
    ),
]

NOTES = [
    "next start: until a waiting execution of the same key starts its body (for retry: the "
    "retry attempt; for acks_late: the requeued message), stamped by that pool child.",
    "released: until the lock key no longer holds the ending attempt's token; this script "
    f"polls it every {POLL_S * 1000:g} ms, so the figure is late by up to ~2 ms.",
    "retry: measured from the retry's publish (after_task_publish). The lock is released in "
    "before_task_publish, just before the publish, so 'released' is negative by design. "
    "When the holder ran in a child forked after an earlier kill, its first publish also opens "
    "the child's broker connection (~20 ms more between release and publish).",
    f"child SIGKILL (with or without acks_late): Celery notices a dead child at once or only "
    f"at its periodic maintain_pool tick, up to ~{MAINTAIN_POOL_S:g} s later (see "
    "worker_noticed_s in the JSON); the main process does not wait for that: it looks for "
    "dead children of locked executions every 0.1 s and releases then. Celery's delay still "
    "shows in the requeued message's next start (acks_late).",
    "revoke SIGKILL: the main process releases right after sending the kill, without waiting "
    "for Celery to notice the dead child.",
    f"hard limit: from the main process's 'Hard time limit' log line (1 ms resolution); the "
    f"holder ran with time_limit={LIMIT_S:g}. With SIGTERM blocked the child only dies by "
    "billiard's SIGKILL ~0.1 s later, and the main process releases after that.",
    f"worker SIGKILL: nobody can release; the key expires within one lease ({LEASE_S:g} s, "
    "renewed every lease/3) of the kill. Bounded by the lease, not a takeover latency.",
]


# -- run and report -------------------------------------------------------------------------------


def summarize(trials: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [t for t in trials if "error" not in t]
    out: dict[str, Any] = {"trials": len(trials), "ok": len(ok)}
    for name in ("next_start_s", "released_s"):
        values = [t[name] for t in ok]
        out[name] = {
            "median": statistics.median(values) if values else None,
            "max": max(values) if values else None,
            "min": min(values) if values else None,
        }
    return out


def run_all(bench: Bench, endings: list[Ending], trials: int) -> None:
    roles = {role for ending in endings for role in ending.roles}
    for role in sorted(roles):  # boot them in parallel
        bench.launch(role)
    for trial in range(trials):
        for role in sorted(roles - set(bench.workers)):  # this round's doomed workers boot
            bench.launch(role)  # in the background while the other endings run
        # Round robin: each round runs every ending once, so slow drift hits them alike.
        for ending in endings:
            key = f"{ending.name}-{trial}"
            began = time.monotonic()
            try:
                result = ending.run(bench, key)
            except Exception as exc:
                result = {"error": f"{type(exc).__name__}: {exc}"}
                for role in ending.roles:  # a stuck child would spoil the next trials
                    bench.discard(role, keep_log=True)
            result["wall_s"] = time.monotonic() - began
            ending.trials.append(result)
            if "error" in result:
                progress(f"  [{trial + 1}/{trials}] {ending.label}: FAILED {result['error']}")
            else:
                progress(
                    f"  [{trial + 1}/{trials}] {ending.label:<28} next start "
                    f"{result['next_start_s'] * 1000:8.1f} ms, released "
                    f"{result['released_s'] * 1000:8.1f} ms"
                )


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def by_main(trials: list[dict[str, Any]]) -> str:
    """`` [main k/n]``: in how many trials the worker's main process logged the release."""
    flags = [t["parent_released"] for t in trials if "parent_released" in t]
    return f" [main {sum(flags)}/{len(flags)}]" if flags else ""


def print_table(endings: list[Ending]) -> None:
    print()
    print(f"{'':<29}{'':<20}{'':>6}{'next start (ms)':>18}{'released (ms)':>18}")
    print(
        f"{'ending':<29}{'event (t = 0)':<20}{'ok':>6}{'median':>9}{'max':>9}"
        f"{'median':>9}{'max':>9}  released by"
    )
    for ending in endings:
        s = summarize(ending.trials)
        n, r = s["next_start_s"], s["released_s"]
        print(
            f"{ending.label:<29}{ending.event:<20}{s['ok']:>3}/{s['trials']:<2}"
            f"{ms(n['median']):>9}{ms(n['max']):>9}{ms(r['median']):>9}{ms(r['max']):>9}"
            f"  {ending.released_by}{by_main(ending.trials)}"
        )
        if ending.name == "worker_kill" and s["ok"]:
            print(f"{'':<29}  ^ bounded by the lease ({LEASE_S:g} s), not a takeover latency")
    print("\nNotes:")
    for note in NOTES:
        print(f" * {note}")
    for ending in endings:
        extras = [t for t in ending.trials if "error" not in t]
        notices = [t["worker_noticed_s"] for t in extras if t.get("worker_noticed_s") is not None]
        if notices:
            print(
                f" * {ending.label}: the worker noticed the dead child after "
                + ", ".join(f"{v * 1000:.0f}" for v in notices)
                + " ms"
            )
        calls = [t["retry_call_to_publish_s"] for t in extras if "retry_call_to_publish_s" in t]
        if calls:
            print(
                f" * {ending.label}: self.retry() was called "
                f"{statistics.median(calls) * 1000:.1f} ms (median) before the publish ended"
            )
        ages = [
            t["acquired_to_released_s"] - t["released_s"]
            for t in extras
            if "acquired_to_released_s" in t
        ]
        if ages:
            print(
                f" * {ending.label}: killed {statistics.median(ages) * 1000:.0f} ms (median) "
                "after the lock was taken, before its first renewal: the key lived one full "
                "lease"
            )
        late = [t for t in extras if t.get("waiter_blocked_before_event") is False]
        if late:
            print(
                f" * {ending.label}: in {len(late)} trial(s) the waiter blocked only after "
                "the limit fired"
            )
        for t in ending.trials:
            if "error" in t:
                print(f" * {ending.label}: a trial failed: {t['error']}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--trials", type=int, default=None, help="trials per ending (default 5; 2 with --quick)"
    )
    p.add_argument(
        "--endings",
        default=None,
        help="comma-separated subset of: " + ", ".join(e.name for e in ENDINGS),
    )
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    p.add_argument(
        "--quick", action="store_true", help="smoke run: 2 trials of 8 endings, under a minute"
    )
    args = p.parse_args(argv)
    if args.trials is None:
        args.trials = 2 if args.quick else 5
    if args.trials < 1:
        p.error("--trials must be at least 1")
    names = [e.name for e in ENDINGS]
    if args.endings:
        args.selected = [n.strip() for n in args.endings.split(",") if n.strip()]
        unknown = sorted(set(args.selected) - set(names))
        if unknown:
            p.error(f"unknown endings {unknown}; choose from {names}")
    else:
        args.selected = [e.name for e in ENDINGS if e.quick or not args.quick]
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    endings = [e for e in ENDINGS if e.name in args.selected]
    results: dict[str, Any] = {"quick": args.quick, "argv": sys.argv[1:] if argv is None else argv}
    began = time.monotonic()
    with RedisServer() as server:
        env = results["environment"] = environment(server)
        print(
            f"celery-redlock takeover benchmark: python {env['python']}, celery {env['celery']}, "
            f"redis-server {env['redis_server']}, {env['cpus']} CPUs, load "
            f"{env['loadavg_start'][0]:.2f}, package at {env['package_commit']}; "
            f"{args.trials} trial(s) per ending, prefork workers"
            + ("  [--quick: the figures are noise]" if args.quick else "")
        )
        bench = Bench(server, args)
        try:
            run_all(bench, endings, args.trials)
        finally:
            bench.close()
    env["loadavg_end"] = os.getloadavg()
    env["wall_s"] = time.monotonic() - began
    results["settings"] = {
        "trials": args.trials,
        "hard_limit_s": LIMIT_S,
        "lease_s": LEASE_S,
        "poll_s": POLL_S,
        "holder_duration_s": HOLD_S,
    }
    results["endings"] = {
        e.name: {
            "label": e.label,
            "event": e.event,
            "released_by": e.released_by,
            "summary": summarize(e.trials),
            "trials": e.trials,
        }
        for e in endings
    }
    results["notes"] = NOTES
    results["failed_worker_logs"] = bench.failed_logs
    print_table(endings)
    if bench.failed_logs:
        print(" * worker logs of failed trials kept: " + ", ".join(bench.failed_logs))
    print(f"\nwall time {env['wall_s']:.0f} s, load {env['loadavg_end'][0]:.2f} at the end")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str) + "\n")
        print(f"results written to {args.json}")
    return results


if __name__ == "__main__":
    main()
