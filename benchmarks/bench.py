"""``python -m benchmarks``: every figure of the performance comparison, peers in the same run.

One command, one table. Each figure is measured against the peers on the same machine, the same
``redis-server`` build and in the same run, contenders interleaved (ABBA) and medians of at least
five rounds reported::

    python -m benchmarks                  # the full run (about 3-4 minutes on 2 cores)
    python -m benchmarks --quick          # 1-2 minutes: checks that it runs, figures are noise
    python -m benchmarks --only pairs,waiters --json out.json

Figures (see ``benchmarks/README.md`` for the method of each):

1. primitive: non-blocking acquire+release pairs per second, as a ratio of ``SET NX PX`` +
   ``DEL`` pairs, and the server's time per call (``INFO commandstats``);
2. blocking waiter: time from the release to a waiter holding the lock, one and several waiters,
   and to a waiting task (``lock_on_contention="wait"``) running its body;
3. task throughput, locked / unlocked no-op task on a prefork worker;
4. Redis round trips per locked and per skipped task (``INFO commandstats`` calls / tasks);
5. footprint: keys and bytes left after release, bytes per held lock;
6. ``celery redlock ls --json``, ``stats`` and a Prometheus scrape with many held locks;
7. quorum: 5 nodes vs 1 node, on loopback and over a delayed network, beside pottery;
8. asyncio: our asyncio lock vs redis-py's.

Every Redis is private (:class:`celery_redlock.testing.RedisServer` on free loopback ports);
nothing connects to a Redis you already run. Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib
import importlib.metadata
import json
import multiprocessing
import os
import platform
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import redis

from benchmarks import bench_asyncio, bench_core, bench_quorum, peers
from benchmarks._common import environment
from benchmarks.bench_core import (
    STUB,
    bench_worker,
    commandstats,
    interleaved,
    median,
    progress,
    run_batch,
)
from celery_redlock.testing import RedisServer, wait_until
from support import ROOT

QUICK_NOTE = "  [--quick: the figures are noise]"
SECTIONS = ("pairs", "waiters", "tasks", "footprint", "ops", "quorum", "asyncio")

#: Commands that are not the contenders' own: the benchmark's probes and the counters' flush.
NOT_LOCK_COMMANDS = ("info", "config|resetstat", "config", "hincrby")


# -- sizes ---------------------------------------------------------------------------------------


def sizes(quick: bool) -> dict[str, Any]:
    """How much of each figure to measure. Every figure keeps >= 5 rounds, even ``--quick``."""
    if quick:
        return {
            "rounds": 5,
            "pairs": 1000,
            "waiter_samples": 20,
            "several_waiters": 4,
            "settle_s": 0.03,
            "tasks": 100,
            "skipped_tasks": 50,
            "task_warmup": 10,
            "footprint_names": 1000,
            "ops_locks": 5_000,
            "ops_tasks": 100,
            "ops_rounds": 1,
            "quorum_pairs": 60,
            "quorum_network_pairs": 10,
            "async_pairs": 300,
            "async_warmup": 50,
            "engine_executions": 2000,
        }
    return {
        "rounds": 5,
        "pairs": 5_000,
        "waiter_samples": 20,
        "several_waiters": 4,
        "settle_s": 0.05,
        "tasks": 600,
        "skipped_tasks": 300,
        "task_warmup": 50,
        "footprint_names": 10_000,
        "ops_locks": 100_000,
        "ops_tasks": 1000,
        "ops_rounds": 3,
        "quorum_pairs": 300,
        "quorum_network_pairs": 40,
        "async_pairs": 2000,
        "async_warmup": 200,
        "engine_executions": 20_000,
    }


# -- machine -------------------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def peer_versions() -> dict[str, str]:
    out = {}
    for dist in ("redis", "python-redis-lock", "pottery", "celery-once", "celery-singleton"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def calls(stats: dict[str, dict[str, float]], exclude: Sequence[str] = NOT_LOCK_COMMANDS) -> float:
    """Total calls in a :func:`commandstats` snapshot, without the benchmark's own probes."""
    return sum(f["calls"] for name, f in stats.items() if name not in exclude)


# -- 1. primitive pairs --------------------------------------------------------------------------


def pair_loop(client: redis.Redis, make: Callable[..., Any], name: str) -> bench_core.Loop:
    def loop(n: int) -> int:
        failed = 0
        for _ in range(n):
            lock = make(client, name)
            if lock.acquire(blocking=False):
                lock.release()
            else:
                failed += 1
        return failed

    return loop


def reused_loop(client: redis.Redis, name: str) -> bench_core.Loop:
    lock = peers.ours(client, name)

    def loop(n: int) -> int:
        failed = 0
        for _ in range(n):
            if lock.acquire(blocking=False):
                lock.release()
            else:
                failed += 1
        return failed

    return loop


def floor_loop(client: redis.Redis) -> bench_core.Loop:
    def loop(n: int) -> int:
        set_, delete, value, failed = client.set, client.delete, "x" * 32, 0
        for _ in range(n):
            if not set_("bench:floor", value, nx=True, px=30000):
                failed += 1
            delete("bench:floor")
        return failed

    return loop


PAIR_ROWS = {
    "floor": "SET NX PX + DEL (the floor)",
    "ours": "ours (new Lock per pair)",
    "ours-reused": "ours (one Lock reused)",
    "redis-py": "redis-py Lock",
    "python-redis-lock": "python-redis-lock",
    "pottery": "pottery Redlock, 1 node",
    "bare": "bare SET NX PX + Lua CAD",
}


def section_pairs(server: RedisServer, size: dict[str, Any]) -> dict[str, Any]:
    client = redis.Redis(host="127.0.0.1", port=server.port, db=0, socket_timeout=5)
    loops: dict[str, bench_core.Loop] = {"floor": floor_loop(client)}
    for name, make in peers.PAIR_CONTENDERS.items():
        loops[name] = pair_loop(client, make, f"bench:pair:{name}")
        if name == "ours":
            loops["ours-reused"] = reused_loop(client, "bench:pair:ours-reused")
    for loop in loops.values():
        loop(min(size["pairs"], 300))
    measured = bench_core.run_pair_loops(client, loops, size["pairs"], size["rounds"])
    client.close()
    rates = {name: median(runs) for name, runs in measured["runs"].items()}
    server_cmds: dict[str, dict[str, float]] = {}
    server_us: dict[str, float] = {}
    calls_per_pair: dict[str, float] = {}
    for name, rounds in measured["commandstats"].items():
        cmds = sorted({c for stats in rounds for c in stats if c not in NOT_LOCK_COMMANDS})
        server_cmds[name] = {
            c: median([s[c]["usec_per_call"] for s in rounds if c in s]) for c in cmds
        }
        server_us[name] = median(
            [
                sum(f["usec"] for c, f in s.items() if c not in NOT_LOCK_COMMANDS) / size["pairs"]
                for s in rounds
            ]
        )
        calls_per_pair[name] = median([calls(s) / size["pairs"] for s in rounds])
    return {
        "pairs_per_run": size["pairs"],
        "rounds": size["rounds"],
        "runs": measured["runs"],
        "failed": measured["failed"],
        "median_rate": rates,
        "ratio_to_floor": {name: rate / rates["floor"] for name, rate in rates.items()},
        "server_usec_per_call": server_cmds,
        "server_us_per_pair": server_us,
        "calls_per_pair": calls_per_pair,
    }


# -- 2. waiters ----------------------------------------------------------------------------------

#: Seconds during which the commands of blocked waiters are counted (redis-py polls every 0.1 s).
IDLE_WINDOW_S = 0.25


def _waiter_process(
    url: str, contender: str, name: str, index: int, out: Any, release: Any
) -> None:
    """One waiter, in its own process (as a Celery worker's): block, report, release on cue."""
    client = redis.Redis.from_url(url, socket_timeout=15)
    lock = peers.PAIR_CONTENDERS[contender](client, name)
    if peers.blocking_acquire(contender, lock, 10.0):
        out.put(("held", index, time.perf_counter()))
        if release.wait(30):
            start = time.perf_counter()
            lock.release()
            out.put(("released", index, start))
    client.close()


def waiter_round(
    server: RedisServer, contender: str, name: str, waiters: int, settle: float
) -> dict[str, Any]:
    """``waiters`` processes block on a held lock; release, and hand the lock on until all held.

    Each handoff: wait ``settle`` s plus a random 0-0.1 s (the waiters block), release, and
    time until one waiter holds (``time.perf_counter`` is one clock for every process on
    Linux); ``settle`` s later no second waiter may hold (exactly one winner). Then the winner
    releases in its turn. Before the first handoff, the commands the waiters send during
    :data:`IDLE_WINDOW_S` are counted (a polling waiter shows here).
    """
    client = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=15)
    holder = peers.PAIR_CONTENDERS[contender](client, name)
    if not holder.acquire(blocking=False):
        raise RuntimeError(f"{contender}: {name} is held before the round")
    context = multiprocessing.get_context("fork")
    out: Any = context.Queue()
    cues = [context.Event() for _ in range(waiters)]
    procs = [
        context.Process(
            target=_waiter_process,
            args=(server.url, contender, name, i, out, cues[i]),
            daemon=True,
        )
        for i in range(waiters)
    ]
    for proc in procs:
        proc.start()
    samples, idle_calls, double_wins = [], [], 0
    winner = -1
    for handoff in range(waiters):
        time.sleep(settle + random.uniform(0, 0.1))  # every remaining waiter blocks
        if not out.empty():
            double_wins += 1
            break
        released_at: float | None = None
        if handoff == 0:
            client.config_resetstat()  # what the waiters send while they wait
            time.sleep(IDLE_WINDOW_S)
            idle_calls.append(calls(commandstats(client)) / waiters / IDLE_WINDOW_S)
            released_at = time.perf_counter()
            holder.release()
        else:
            cues[winner].set()  # the previous winner releases, and stamps it
        held_at: float | None = None
        while held_at is None or released_at is None:  # the two stamps, in either order
            kind, index, stamp = out.get(timeout=15)
            if kind == "released":
                released_at = stamp
            else:
                held_at, winner = stamp, index
        samples.append(held_at - released_at)
        time.sleep(settle)
        double_wins += 0 if out.empty() else 1
    if winner >= 0:
        cues[winner].set()
        out.get(timeout=15)
    for proc in procs:
        proc.join(15)
    client.close()
    return {"samples": samples, "idle_calls_per_waiter_s": idle_calls, "double_wins": double_wins}


def section_waiters(server: RedisServer, size: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"settle_s": size["settle_s"]}
    for waiters in (1, size["several_waiters"]):
        rounds = max(size["rounds"], -(-size["waiter_samples"] // waiters))
        got: dict[str, dict[str, list[float]]] = {
            c: {"samples": [], "idle": [], "double": []} for c in peers.WAITER_CONTENDERS
        }
        for r, order in enumerate(interleaved(peers.WAITER_CONTENDERS, rounds)):
            for contender in order:
                res = waiter_round(
                    server, contender, f"bench:wait:{contender}:{r}", waiters, size["settle_s"]
                )
                got[contender]["samples"] += res["samples"]
                got[contender]["idle"] += res["idle_calls_per_waiter_s"]
                got[contender]["double"].append(res["double_wins"])
        progress(f"  waiters x{waiters}: {rounds} rounds done")
        out[f"waiters_{waiters}"] = {
            c: {
                "median_ms": median(g["samples"]) * 1000,
                "p90_ms": sorted(g["samples"])[int(len(g["samples"]) * 0.9)] * 1000,
                "samples": len(g["samples"]),
                "idle_calls_per_waiter_s": median(g["idle"]),
                "double_wins": sum(g["double"]),
            }
            for c, g in got.items()
        }
    out["task_wait"] = task_waiter(server, size)
    return out


#: Handoffs to a waiting task run before the measured ones (each pool child in both roles).
TASK_WAIT_WARMUP = 4


def task_waiter(lock_server: RedisServer, size: dict[str, Any]) -> dict[str, Any]:
    """Time from a task's release to a task waiting on its lock (``lock_on_contention="wait"``)
    running its body, on one ``celery worker -P prefork -c 2``.

    Each handoff, on a key of its own (``bench.wait_hold``, see ``benchapp.py``):

    1. the holder is sent; the benchmark waits for its ``started`` mark (``BLPOP``);
    2. the waiter (same key) is sent; the benchmark waits until it is queued on the lock
       (``ZCARD <lock key>:waiters`` is 1 on the lock server), then a random 0-0.1 s;
    3. the holder is cued: it stamps ``time.perf_counter()`` as its last statement, returns,
       and the engine releases, handing the lock to the waiter;
    4. the waiter stamps as its first statement. Sample: waiter stamp - holder stamp (one
       clock for every process on Linux).
    """
    from celery_redlock import lock_key

    broker = RedisServer().start()
    try:
        app = load_benchapp(broker, lock_server).app
        task = app.tasks["bench.wait_hold"]
        marks = redis.Redis(host="127.0.0.1", port=broker.port, db=3, socket_timeout=40)
        lock_client = lock_server.client()
        worker = bench_worker(broker.port, "prefork", 2, False)
        samples: list[float] = []
        try:
            for r in range(TASK_WAIT_WARMUP + size["waiter_samples"]):
                key = f"task-wait:{r}"
                holder = task.apply_async((key, "hold"))
                if marks.blpop([f"{key}:started"], timeout=30) is None:
                    raise RuntimeError(f"{key}: the holder did not start in 30 s")
                waiter = task.apply_async((key, "wait"))
                queue = lock_key(task, key, "wait") + ":waiters"
                queued = functools.partial(lock_client.zcard, queue)  # 1: the only waiter
                wait_until(queued, 30, f"the waiter in {queue}", poll=0.001)
                time.sleep(random.uniform(0, 0.1))
                marks.rpush(f"{key}:cue", 1)
                released_at = holder.get(timeout=30, interval=0.005)
                runs_at = waiter.get(timeout=30, interval=0.005)
                if r >= TASK_WAIT_WARMUP:
                    samples.append(runs_at - released_at)
            problems = [ln for ln in worker.text().splitlines() if "ERROR" in ln]
        finally:
            worker.stop()
        worker.log.unlink()
        progress(f"  waiting task: {len(samples)} handoffs done")
        marks.close()
        lock_client.close()
        app.close()
    finally:
        broker.stop()
    return {
        "median_ms": median(samples) * 1000,
        "p90_ms": sorted(samples)[int(len(samples) * 0.9)] * 1000,
        "samples": len(samples),
        "runs_ms": [s * 1000 for s in samples],
        "warmup_handoffs": TASK_WAIT_WARMUP,
        "worker_errors": problems[:20],
    }


# -- 3 and 4. tasks ------------------------------------------------------------------------------


class RoundTrips:
    """Counts the commands clients send to a server (``MONITOR``), by command name.

    ``INFO commandstats`` also counts the commands a script runs, so its total is not the number
    of round trips when scripts are used; ``MONITOR`` tells the two apart (``lua`` sources are
    skipped). Used on small untimed batches only: ``MONITOR`` slows the server down. The
    benchmark's probes (``INFO``, ``CONFIG``) and the counters' once-a-second ``HINCRBY`` flush
    are left out.
    """

    STOP = "bench-monitor-stop"

    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self.counts: dict[str, int] = {}
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._probe = server.client()
        self._probe.ping()  # connected before MONITOR starts: its handshake is not counted

    def _run(self) -> None:
        client = self.server.client()
        with client.monitor() as monitor:
            self._ready.set()
            for event in monitor.listen():
                command = event["command"]
                if self.STOP in command:
                    break
                if event.get("client_type") == "lua":
                    continue
                name = command.split(" ", 1)[0].strip('"').lower()
                if name in ("info", "config", "hincrby"):
                    continue
                self.counts[name] = self.counts.get(name, 0) + 1
        client.close()

    def __enter__(self) -> RoundTrips:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._probe.echo(self.STOP)
        self._probe.close()
        self._thread.join(10)

    def per(self, n: int) -> dict[str, float]:
        return {name: count / n for name, count in sorted(self.counts.items())}


TASK_ROWS = {
    "plain": "plain (no lock)",
    "locked": "ours (LockedTask)",
    "once": "celery-once (QueueOnce)",
    "redispy": "redis-py Lock as base task",
    "singleton": "celery-singleton",
}


def _held_keys(app: Any) -> dict[str, tuple[str, Callable[[], Any]]]:
    """Per variant, a way to make the call ``("held",)`` find its key held: ``(key, send)``."""
    from celery_redlock import lock_key

    out: dict[str, tuple[str, Callable[[], Any]]] = {
        "locked": (lock_key(app.tasks["bench.locked"], "held"), lambda: None),
        "redispy": ("rpl:bench.redispy:('held',)", lambda: None),
    }
    if "bench.once" in app.tasks:
        out["once"] = (app.tasks["bench.once"].get_key(["held"], {}), lambda: None)
    if "bench.singleton" in app.tasks:
        task = app.tasks["bench.singleton"]
        out["singleton"] = (task.generate_lock(task.name, ["held"], {}), lambda: None)
    return out


def skipped_calls(
    app: Any, lock_server: RedisServer, lock_client: redis.Redis, n: int, timeout: float
) -> dict[str, Any]:
    """Round trips to the lock server per call whose key is held: ours and redis-py skip in
    the worker, celery-once and celery-singleton refuse in ``apply_async`` (no message)."""
    from celery.result import ResultSet

    out: dict[str, Any] = {}
    for variant, (key, _) in _held_keys(app).items():
        task = app.tasks[f"bench.{variant}"]
        lock_client.set(key, "someone-else", px=600_000)
        in_worker = variant in ("locked", "redispy")
        with RoundTrips(lock_server) as trips:
            results = []
            for _ in range(n):
                try:
                    results.append(task.apply_async(("held",)))
                except Exception as exc:  # celery-once: AlreadyQueued
                    if type(exc).__name__ != "AlreadyQueued":
                        raise
            if in_worker:
                ResultSet(results).get(timeout=timeout, propagate=True, interval=0.005)
            time.sleep(0.3)
        by = trips.per(n)
        out[variant] = {
            "round_trips": sum(by.values()),
            "by_command": by,
            "where": "worker" if in_worker else "apply_async (caller)",
        }
        lock_client.delete(key)
    return out


def engine_python_us(app: Any, n: int) -> dict[str, Any]:
    """Our Python per locked execution, on the worker's path: ``task(key)`` under a pushed
    request, i.e. ``LockedTask.__call__`` -> ``engine.execute`` of the no-op ``bench.locked``
    (what Celery's tracer calls), in a process set up as a prefork pool child (hard time limits
    enforced), with a Redis stub that answers at once (no redis-py, no I/O). The metrics
    thread flushes to the real lock server once a second, as in a worker.

    ``profile_pct_by_file`` and ``_by_function``: where that time goes, from cProfile (own
    time, as a share of the total; the profiler inflates code that makes many small calls).
    """
    import cProfile
    import pstats

    try:
        from celery_redlock._celery.options import settings_for
        from celery_redlock._celery.state import state
        from celery_redlock._redis import nodes as _nodes

        task = app.tasks["bench.locked"]
        url = settings_for(app).url
        slot = (url, None)
        saved = _nodes._single.get(slot)
        saved_limits = state.enforces_limits
        _nodes._single[slot] = _nodes.SingleNode(STUB)
        state.enforces_limits = True
        task.push_request(
            id="bench-id", hostname="bench@host", called_directly=False, delivery_info={}
        )
        try:

            def run(m: int) -> float:
                start = time.perf_counter()
                for i in range(m):
                    task(f"k{i}")
                return (time.perf_counter() - start) / m * 1e6

            run(200)
            samples = [run(n // 5) for _ in range(5)]
            profiler = cProfile.Profile()
            profiler.runcall(run, max(n // 10, 200))
        finally:
            task.pop_request()
            state.enforces_limits = saved_limits
            if saved is None:
                _nodes._single.pop(slot, None)
            else:
                _nodes._single[slot] = saved
    except Exception as exc:  # the package's internals changed shape
        return {"error": f"{type(exc).__name__}: {exc}"}
    by_function: dict[str, float] = {}
    by_file: dict[str, float] = {}
    for (file, line, name), row in pstats.Stats(profiler).stats.items():  # type: ignore[attr-defined]
        where = f"{Path(file).parent.name}/{Path(file).name}" if line else "(built-in)"
        by_function[f"{where}:{name}" if line else name] = row[2]
        by_file[where] = by_file.get(where, 0.0) + row[2]
    total = sum(by_file.values()) or 1.0

    def shares(own: dict[str, float], top: int) -> dict[str, float]:
        ranked = sorted(own.items(), key=lambda kv: -kv[1])[:top]
        return {name: round(seconds / total * 100, 1) for name, seconds in ranked}

    return {
        "us_per_execution": median(samples),
        "runs": samples,
        "profile_pct_by_file": shares(by_file, 12),
        "profile_pct_by_function": shares(by_function, 15),
    }


def load_benchapp(broker: RedisServer, lock_server: RedisServer) -> Any:
    """``benchmarks.benchapp``, (re)imported on ``broker`` (broker, results) and
    ``lock_server`` (locks): it reads their ports from the environment when imported."""
    os.environ["REDLOCK_TEST_PORT"] = str(broker.port)
    os.environ["REDLOCK_TEST_LOCK_PORT"] = str(lock_server.port)
    benchapp = sys.modules.get("benchmarks.benchapp")
    if benchapp is None:
        return importlib.import_module("benchmarks.benchapp")
    return importlib.reload(benchapp)


def section_tasks(lock_server: RedisServer, size: dict[str, Any]) -> dict[str, Any]:
    broker = RedisServer().start()
    try:
        app = load_benchapp(broker, lock_server).app
        variants = [v for v in TASK_ROWS if f"bench.{v}" in app.tasks]
        tasks = {v: app.tasks[f"bench.{v}"] for v in variants}
        lock_client = lock_server.client()
        timeout = max(120.0, size["tasks"] / 10)
        worker = bench_worker(broker.port, "prefork", 2, False)
        runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
        try:
            for v in variants:
                run_batch(app, tasks[v], size["task_warmup"], f"warm-{v}", timeout)
            for r, order in enumerate(interleaved(variants, size["rounds"])):
                for v in order:
                    lock_client.config_resetstat()
                    run = run_batch(app, tasks[v], size["tasks"], f"r{r}-{v}", timeout)
                    del run["keys"]
                    time.sleep(0.3)  # peers unlock after the result is stored
                    stats = commandstats(lock_client)
                    run["calls_per_task"] = calls(stats) / size["tasks"]
                    run["flush_calls"] = stats.get("hincrby", {}).get("calls", 0)
                    run["by_command"] = {
                        c: f["calls"] / size["tasks"]
                        for c, f in stats.items()
                        if c not in NOT_LOCK_COMMANDS
                    }
                    runs[v].append(run)
                progress(f"  tasks round {r + 1}/{size['rounds']} done")
            trips: dict[str, dict[str, float]] = {}
            for v in variants:
                with RoundTrips(lock_server) as counter:
                    run_batch(app, tasks[v], size["skipped_tasks"], f"trips-{v}", timeout)
                    time.sleep(0.3)  # peers unlock after the result is stored
                trips[v] = counter.per(size["skipped_tasks"])
            skipped = skipped_calls(app, lock_server, lock_client, size["skipped_tasks"], timeout)
            problems = [ln for ln in worker.text().splitlines() if "ERROR" in ln]
        finally:
            worker.stop()
        worker.log.unlink()
        engine_us = engine_python_us(app, size["engine_executions"])
        lock_client.close()
        app.close()
    finally:
        broker.stop()
    rates = {v: median([r["rate"] for r in runs[v]]) for v in variants}
    return {
        "tasks_per_batch": size["tasks"],
        "rounds": size["rounds"],
        "median_rate": rates,
        "ratio_to_plain": {v: rates[v] / rates["plain"] for v in variants},
        "commands_per_task": {v: median([r["calls_per_task"] for r in runs[v]]) for v in variants},
        "commandstats_by_command": {v: runs[v][-1]["by_command"] for v in variants},
        "round_trips_per_task": {v: sum(trips[v].values()) for v in variants},
        "round_trips_by_command": trips,
        "flush_calls": {v: [r["flush_calls"] for r in runs[v]] for v in variants},
        "runs": runs,
        "skipped": skipped,
        "engine_python": engine_us,
        "worker_errors": problems[:20],
    }


# -- 5. footprint --------------------------------------------------------------------------------


def memory_of_keys(client: redis.Redis) -> tuple[int, int]:
    """``(keys, bytes)`` of the current database: ``DBSIZE`` and the sum of ``MEMORY USAGE``."""
    keys = list(client.scan_iter(count=1000))
    total = 0
    for i in range(0, len(keys), 1000):
        pipe = client.pipeline(transaction=False)
        for key in keys[i : i + 1000]:
            pipe.memory_usage(key)
        total += sum(v or 0 for v in pipe.execute())
    return len(keys), total


def section_footprint(server: RedisServer, size: dict[str, Any]) -> dict[str, Any]:
    client = redis.Redis(host="127.0.0.1", port=server.port, db=5, socket_timeout=15)
    n = size["footprint_names"]
    out: dict[str, Any] = {"names": n}
    for contender in ("ours", "redis-py", "python-redis-lock", "pottery", "bare"):
        make = peers.PAIR_CONTENDERS[contender]
        client.flushdb()
        used = int(client.info("memory")["used_memory"])
        locks = [make(client, f"user:{i}") for i in range(n)]
        for lock in locks:
            if not lock.acquire(blocking=False):
                raise RuntimeError(f"{contender}: footprint lock contended")
        held_keys, held_bytes = memory_of_keys(client)
        used_held = int(client.info("memory")["used_memory"]) - used
        for lock in locks:
            lock.release()
        left_keys, left_bytes = memory_of_keys(client)
        ttls = [client.pttl(k) for k in list(client.scan_iter(count=1000))[:20]]
        out[contender] = {
            "held_keys_per_lock": held_keys / n,
            "held_bytes_per_lock": held_bytes / n,
            "used_memory_per_held_lock": used_held / n,
            "left_keys": left_keys,
            "left_keys_per_name": left_keys / n,
            "left_bytes_per_name": left_bytes / n,
            "left_ttl_s": max((t for t in ttls if t >= 0), default=0) / 1000,
            "left_without_expiry": any(t < 0 for t in ttls),
        }
        progress(f"  footprint {contender} done")
    client.flushdb()
    client.close()
    return out


# -- 6. operations at scale ----------------------------------------------------------------------

PROMETHEUS_SCRAPE = """
import sys, time
from prometheus_client import CollectorRegistry, generate_latest
from benchmarks.benchapp import app
from celery_redlock.metrics import PrometheusCollector
registry = CollectorRegistry()
registry.register(PrometheusCollector(app))
start = time.perf_counter()
body = generate_latest(registry)
print(f"{time.perf_counter() - start:.6f} {len(body)}", file=sys.stderr)
"""


#: Runs ``argv[1:]`` and reports its peak RSS (kB) on stderr's last line. The benchmark
#: process is large by then (it held 100,000 Lock objects); a child forked from it straight
#: away would report the parent's resident pages (``ru_maxrss`` keeps the high-water mark of
#: the memory it had before ``exec``). Forked from this small launcher, it reports its own.
LAUNCHER = """
import os, subprocess, sys
child = subprocess.Popen(sys.argv[1:])
_, status, usage = os.wait4(child.pid, 0)
sys.stderr.write(f"\\nBENCH-PEAK-RSS-KB {usage.ru_maxrss}\\n")
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_child(cmd: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run ``cmd``; its wall time (launcher included) and its own peak RSS."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-c", LAUNCHER, *cmd], cwd=ROOT, env=env, stdout=out, stderr=err
        )
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read().decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[-3:])} failed ({proc.returncode}): {stderr[-2000:]}")
    stderr, _, peak = stderr.rstrip().rpartition("BENCH-PEAK-RSS-KB ")
    return {
        "wall_s": wall,
        "peak_rss_mb": int(peak) / 1024,
        "stdout_bytes": len(stdout),
        "stdout": stdout,
        "stderr": stderr,
    }


def populate(client: redis.Redis, url: str, locks: int, task_names: int) -> float:
    """``locks`` locks held through our own Lock (whatever keys it writes), spread over
    ``task_names`` task names, and a counters hash per task name. Seconds it took."""
    from celery_redlock import Lock
    from celery_redlock._redis import keys as _keys

    start = time.perf_counter()
    for i in range(locks):
        name = f"bench.t{i % task_names:04d}:{_keys.digest(str(i).encode())}"
        lock = Lock(url, name, ttl=3600, owner=f"task-{i:08d}", host=f"bench{i % 7}@host")
        if not lock.acquire(blocking=False):
            raise RuntimeError(f"{name} is already held")
        if i % 20000 == 0 and i:
            progress(f"  {i} locks held")
    pipe = client.pipeline(transaction=False)
    for j in range(task_names):
        events = {"acquired": 1000 + j, "released": 1000 + j, "skipped": j, "lost": 0}
        pipe.hset(_keys.stats_key("redlock", f"bench.t{j:04d}"), mapping=events)
    pipe.execute()
    return time.perf_counter() - start


def lock_url(server: RedisServer) -> str:
    """The URL the sections give the package's locks: the server's own, which names db 0
    already (``RedisServer.url`` ends in ``/0``; appending another ``/0`` made it invalid)."""
    return server.url


def check_urls(urls: Sequence[str]) -> None:
    """Fail at once, not minutes into the run, on a URL the package would refuse."""
    from celery_redlock._redis.clients import validate_url

    for url in urls:
        try:
            validate_url(url)
        except ValueError as exc:
            message = f"benchmark setup error: {url!r} is not a valid Redis URL: {exc}"
            raise SystemExit(message) from None


def section_ops(lock_server: RedisServer, size: dict[str, Any]) -> dict[str, Any]:
    env = {
        **os.environ,
        "REDLOCK_TEST_PORT": str(lock_server.port),
        "REDLOCK_TEST_LOCK_PORT": str(lock_server.port),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    celery = [sys.executable, "-m", "celery", "-A", "benchmarks.benchapp", "redlock"]
    commands = {
        "ls --json": [*celery, "ls", "--json"],
        "stats --json": [*celery, "stats", "--json"],
        "prometheus scrape": [sys.executable, "-c", PROMETHEUS_SCRAPE],
    }
    client = lock_server.client()
    client.flushall()
    empty = {name: run_child(cmd, env) for name, cmd in commands.items()}
    progress(f"  populating {size['ops_locks']} held locks over {size['ops_tasks']} task names")
    populate_s = populate(client, lock_url(lock_server), size["ops_locks"], size["ops_tasks"])
    dbsize = client.dbsize()
    used = int(client.info("memory")["used_memory"])
    out: dict[str, Any] = {
        "locks": size["ops_locks"],
        "task_names": size["ops_tasks"],
        "keys_in_db": dbsize,
        "used_memory_per_lock": used / size["ops_locks"],
        "populate_s": populate_s,
        "commands": {},
    }
    for name, cmd in commands.items():
        runs = []
        for _ in range(size["ops_rounds"]):
            runs.append(run_child(cmd, env))
            if runs[-1]["wall_s"] > 20:  # slow enough that repeats only cost time
                break
        checked = ""
        if name == "ls --json":
            checked = f"{len(json.loads(runs[-1]['stdout']))} locks listed"
        elif name == "stats --json":
            checked = f"{len(json.loads(runs[-1]['stdout']))} tasks"
        else:
            scrape_s, body = runs[-1]["stderr"].split()[-2:]
            checked = f"scrape alone {float(scrape_s):.2f} s, {int(body)} bytes"
        out["commands"][name] = {
            "wall_s": median([r["wall_s"] for r in runs]),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
            "runs": len(runs),
            "empty_wall_s": empty[name]["wall_s"],
            "empty_peak_rss_mb": empty[name]["peak_rss_mb"],
            "checked": checked,
        }
        progress(f"  {name}: {out['commands'][name]['wall_s']:.1f} s")
    client.flushall()
    client.close()
    return out


# -- 7. quorum, 8. asyncio -----------------------------------------------------------------------


def section_quorum(size: dict[str, Any]) -> dict[str, Any]:
    servers = [RedisServer().start() for _ in range(max(bench_quorum.NODES))]
    try:
        urls = [s.url for s in servers]
        loopback = bench_quorum.measure_rounds(urls, size["quorum_pairs"], size["rounds"])
        progress("  quorum loopback done")
        with bench_quorum.proxies(servers, 0.002 / 2 * 2) as proxied:
            network = bench_quorum.measure_rounds(
                proxied, size["quorum_network_pairs"], size["rounds"]
            )
    finally:
        for server in servers:
            server.stop()
    return {"rtt_ms": 2.0, "loopback_us": loopback, "network_us": network}


def section_asyncio(server: RedisServer, size: dict[str, Any]) -> dict[str, Any]:
    runs = asyncio.run(
        bench_asyncio.measure(
            lock_url(server), size["async_pairs"], size["rounds"], size["async_warmup"]
        )
    )
    rates = {name: median(values) for name, values in runs.items()}
    return {"runs": runs, "median_rate": rates, "ratio": rates["ours"] / rates["redis-py"]}


# -- the table -----------------------------------------------------------------------------------


class Table:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str]] = []

    def add(self, figure: str, contender: str, value: str, note: str = "") -> None:
        self.rows.append((figure, contender, value, note))

    def render(self) -> str:
        widths = [max(len(r[i]) for r in self.rows) for i in range(3)]
        lines = []
        last = None
        for figure, contender, value, note in self.rows:
            shown = figure if figure != last else ""
            if figure != last and last is not None:
                lines.append("")
            last = figure
            lines.append(
                f"{shown:<{widths[0]}}  {contender:<{widths[1]}}  {value:>{widths[2]}}  {note}"
            )
        return "\n".join(line.rstrip() for line in lines)


def fmt_rate(rate: float) -> str:
    return f"{rate:,.0f}/s"


def table_pairs(t: Table, res: dict[str, Any]) -> None:
    fig = "1. pairs/s, ratio to SET+DEL"
    for name, rate in res["median_rate"].items():
        cmds = res["server_usec_per_call"][name]
        per_call = " ".join(f"{c} {us:.1f}" for c, us in sorted(cmds.items()))
        t.add(
            fig,
            PAIR_ROWS[name],
            f"{res['ratio_to_floor'][name]:.2f}",
            f"{fmt_rate(rate)}; server {res['server_us_per_pair'][name]:.1f} us/pair, "
            f"{res['calls_per_pair'][name]:.0f} commands (us/call: {per_call})",
        )


def table_waiters(t: Table, res: dict[str, Any], several: int) -> None:
    for waiters in (1, several):
        fig = f"2. release -> waiter holds, {waiters} waiter{'s' if waiters > 1 else ''}"
        for c, r in res[f"waiters_{waiters}"].items():
            t.add(
                fig,
                c,
                f"{r['median_ms']:.2f} ms",
                f"median of {r['samples']}, p90 {r['p90_ms']:.2f} ms; while waiting "
                f"{r['idle_calls_per_waiter_s']:.1f} cmds/s per waiter; "
                f"{r['double_wins']} double wins",
            )
    r = res["task_wait"]
    t.add(
        "2. release -> waiting task runs",
        "ours (lock_on_contention='wait')",
        f"{r['median_ms']:.2f} ms",
        f"median of {r['samples']}, p90 {r['p90_ms']:.2f} ms; holder's last statement to the "
        "waiter's first, prefork -c 2",
    )


def table_tasks(t: Table, res: dict[str, Any]) -> None:
    fig = "3. tasks/s, locked / unlocked"
    for v, rate in res["median_rate"].items():
        t.add(fig, TASK_ROWS[v], f"{res['ratio_to_plain'][v]:.2f}", fmt_rate(rate))
    engine = res["engine_python"]
    t.add(
        fig,
        "ours: our Python per execution",
        f"{engine['us_per_execution']:.1f} us" if "error" not in engine else "n/a",
        engine.get("error", "engine.execute, no-op body, Redis stub (no I/O)"),
    )
    fig = "4. round trips per task"
    for v, per_task in res["round_trips_per_task"].items():
        if v == "plain":
            continue
        by = " ".join(f"{c} {n:.2f}" for c, n in res["round_trips_by_command"][v].items())
        stats = res["commands_per_task"][v]
        t.add(
            fig,
            f"{TASK_ROWS[v]}: locked",
            f"+{per_task:.2f}",
            f"{by}; commandstats {stats:.2f} commands/task (script-inner included)",
        )
    for v, skip in res["skipped"].items():
        by = " ".join(f"{c} {n:.2f}" for c, n in skip["by_command"].items())
        where = f"{skip['where']}: {by}"
        t.add(fig, f"{TASK_ROWS[v]}: skipped", f"+{skip['round_trips']:.2f}", where)


def table_footprint(t: Table, res: dict[str, Any]) -> None:
    fig = f"5. footprint ({res['names']:,} names)"
    for c in ("ours", "redis-py", "python-redis-lock", "pottery", "bare"):
        r = res[c]
        left = f"{r['left_keys_per_name']:.2f} keys, {r['left_bytes_per_name']:.0f} B"
        if r.get("left_keys"):
            # The longest TTL of the keys left (of 20 read), and whether one has none: ours
            # leaves one fencing high-water mark per Cluster slot used, which never expires
            # (PTTL -1, once shown as "TTL -0 s").
            kept = [f"TTL up to {r['left_ttl_s']:.0f} s"] if r["left_ttl_s"] else []
            if r["left_without_expiry"]:
                kept += ["some with no expiry" if kept else "no expiry"]
            left += f" ({r['left_keys']:,} in all{''.join(', ' + k for k in kept)})"
        t.add(
            fig,
            c,
            left,
            f"left per name after release; held: {r['held_keys_per_lock']:.0f} keys, "
            f"{r['held_bytes_per_lock']:.0f} B "
            f"(used_memory {r['used_memory_per_held_lock']:.0f} B)",
        )


def table_ops(t: Table, res: dict[str, Any]) -> None:
    fig = f"6. {res['locks']:,} held locks, {res['task_names']:,} tasks"
    for name, r in res["commands"].items():
        t.add(
            fig,
            name,
            f"{r['wall_s']:.2f} s",
            f"peak RSS {r['peak_rss_mb']:.0f} MB (empty store: {r['empty_wall_s']:.2f} s, "
            f"{r['empty_peak_rss_mb']:.0f} MB); {r['checked']}; {r['runs']} run(s)",
        )
    t.add(
        fig,
        "bytes per held lock (used_memory)",
        f"{res['used_memory_per_lock']:.0f} B",
        f"{res['keys_in_db']:,} keys in the db",
    )


def table_quorum(t: Table, res: dict[str, Any]) -> None:
    for setting, label in (("loopback_us", "loopback"), ("network_us", "2 ms RTT")):
        fig = f"7. quorum 5 nodes / 1 node, {label}"
        for who in ("ours", "pottery"):
            r = res[setting][who]
            if r.get(1) and r.get(5):
                t.add(
                    fig, who, f"{r[5] / r[1]:.2f}x", f"1 node {r[1]:.0f} us, 5 nodes {r[5]:.0f} us"
                )
            else:
                t.add(fig, who, "n/a", "")


def table_asyncio(t: Table, res: dict[str, Any]) -> None:
    fig = "8. asyncio pairs/s"
    for name, rate in res["median_rate"].items():
        t.add(
            fig,
            name,
            fmt_rate(rate),
            f"ours / redis-py {res['ratio']:.2f}" if name == "ours" else "",
        )


# -- main ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def quiet_peers() -> Iterator[None]:
    """python-redis-lock logs a WARNING per failed non-blocking acquire: keep stderr readable."""
    import logging

    logger = logging.getLogger("redis_lock")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1-2 minutes; the figures are noise")
    p.add_argument("--only", help=f"comma-separated sections: {','.join(SECTIONS)} (default: all)")
    p.add_argument("--json", type=Path, help="also write every figure and run to this path")
    args = p.parse_args(argv)
    args.sections = SECTIONS if not args.only else tuple(args.only.split(","))
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        p.error(f"unknown sections: {', '.join(sorted(unknown))}")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    size = sizes(args.quick)
    results: dict[str, Any] = {"quick": args.quick, "sizes": size}
    started = time.perf_counter()
    with RedisServer() as server, quiet_peers():
        env = results["environment"] = environment(server)
        env["cpu_model"] = cpu_model()
        env["peers"] = peer_versions()
        check_urls([lock_url(server)])
        runners: dict[str, Callable[[], dict[str, Any]]] = {
            "pairs": lambda: section_pairs(server, size),
            "waiters": lambda: section_waiters(server, size),
            "tasks": lambda: section_tasks(server, size),
            "footprint": lambda: section_footprint(server, size),
            "ops": lambda: section_ops(server, size),
            "quorum": lambda: section_quorum(size),
            "asyncio": lambda: section_asyncio(server, size),
        }
        for section in args.sections:
            progress(f"{section}...")
            server.client().flushall()
            results[section] = runners[section]()
    env["loadavg_end"] = os.getloadavg()
    env["wall_s"] = time.perf_counter() - started
    table = Table()
    for section, show in (
        ("pairs", table_pairs),
        ("waiters", lambda t, r: table_waiters(t, r, size["several_waiters"])),
        ("tasks", table_tasks),
        ("footprint", table_footprint),
        ("ops", table_ops),
        ("quorum", table_quorum),
        ("asyncio", table_asyncio),
    ):
        if section in results:
            show(table, results[section])
    peers_line = ", ".join(f"{k} {v}" for k, v in env["peers"].items())
    print(
        f"celery-redlock vs peers, one run{QUICK_NOTE if args.quick else ''}\n"
        f"machine: {env['cpus']} cores, {env['cpu_model']}; load {env['loadavg_start'][0]:.2f} "
        f"at start, {env['loadavg_end'][0]:.2f} at end; {env['wall_s']:.0f} s\n"
        f"python {env['python']}, redis-server {env['redis_server']}, celery {env['celery']}, "
        f"package at {env['package_commit']}\npeers: {peers_line}\n"
        f"medians of {size['rounds']} rounds, contenders interleaved (ABBA)\n"
    )
    print(table.render())
    if args.json:
        for section in ("ops",):
            for r in results.get(section, {}).get("commands", {}).values():
                r.pop("stdout", None)
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
        print(f"\nresults written to {args.json}")
    return results
