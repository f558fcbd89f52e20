"""Core benchmarks: locked vs plain task throughput, and lock acquire+release pairs per second.

Run from the repository root (see ``benchmarks/README.md``)::

    python -m benchmarks.bench_core                      # 2000 tasks, 20000 pairs, 3 rounds
    python -m benchmarks.bench_core --quick              # smoke run, about 10 seconds
    python -m benchmarks.bench_core --json results.json --profile

Everything runs against a private ``redis-server`` on a free port
(:class:`celery_redlock.testing.RedisServer`); nothing touches a Redis you already run.

1. *Task throughput*: one ``celery -A benchmarks.benchapp worker -P prefork -c 2`` serves a
   plain no-op task and the same task with ``base=LockedTask`` (one lock per argument). Each
   batch submits ``--tasks`` messages up front and is timed from the first submit until every
   result is ready. Variants alternate (ABBA across rounds) and the median rate is reported.
2. *Pairs*: acquire (non-blocking) + release on one ``redis.Redis`` client, against the floor of
   ``SET key val NX PX 30000`` + ``DEL key`` and redis-py's own ``redis.lock.Lock``. The
   server's share of each pair comes from ``INFO commandstats``; the share of celery_redlock's
   own Python comes from the same loops run against a stub client that answers at once.

Timings are printed, never asserted: ratios are against a baseline measured in the same run.
The private modules of celery_redlock are used for diagnostics only, each guarded, so that a
refactoring inside the package drops a diagnostic line instead of breaking the benchmark.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import json
import os
import pstats
import socket
import statistics
import sys
import time
import timeit
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis
import redis.lock

from benchmarks._common import environment
from celery_redlock import Lock, lock_key
from celery_redlock._redis import keys as _keys
from celery_redlock._redis import owner as _owner
from celery_redlock._redis import renewal as _renewal
from celery_redlock._redis import scripts as _scripts
from celery_redlock.testing import RedisServer
from support.workers import WorkerProcess

#: Result polling interval: the timing resolution of a batch's end.
RESULT_POLL_S = 0.005

Loop = Callable[[int], int]


# -- helpers --------------------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def interleaved(names: Sequence[str], rounds: int) -> list[list[str]]:
    """Run order per round: ABBA across rounds, so slow drift hits every variant alike."""
    return [list(names) if r % 2 == 0 else list(reversed(names)) for r in range(rounds)]


def progress(message: str) -> None:
    sys.stdout.flush()
    print(message, file=sys.stderr, flush=True)


def per_call_us(fn: Callable[[], object], quick: bool) -> float:
    """Microseconds per call of ``fn``: best of 3 autoranged runs (one run of 2000 if quick)."""
    if quick:
        return timeit.timeit(fn, number=2000) / 2000 * 1e6
    loops, _ = timeit.Timer(fn).autorange()
    return min(timeit.repeat(fn, number=loops, repeat=3)) / loops * 1e6


def guarded_costs(pieces: dict[str, Callable[[], object]], quick: bool) -> dict[str, Any]:
    """``per_call_us`` of each piece; a piece the package no longer supports becomes a note."""
    out: dict[str, Any] = {}
    for name, fn in pieces.items():
        try:
            fn()
        except Exception as exc:
            out[name] = f"n/a ({type(exc).__name__}: {exc})"
            continue
        out[name] = per_call_us(fn, quick)
    return out


class StubClient:
    """Answers our commands at once, without I/O: isolates celery_redlock's own Python cost."""

    _acquire_sha = _scripts.sha1(_scripts.ACQUIRE)

    class Script:
        def __init__(self, reply: object) -> None:
            self.reply = reply

        def __call__(
            self, keys: object = None, args: object = None, client: object = None
        ) -> object:
            return self.reply

    def execute_command(self, *args: object, **options: object) -> object:
        if args[0] == "SET":
            return None  # SET NX ... GET: the key was free
        # the acquire script: {1, fencing_token, slot}; every other script: 1 (success)
        return [1, 1, 1] if args[1] in (self._acquire_sha, _scripts.ACQUIRE) else 1

    def register_script(self, script: str) -> StubClient.Script:
        return self.Script([1, 1, 1] if script == _scripts.ACQUIRE else 1)


STUB = StubClient()


def bench_worker(port: int, pool: str, concurrency: int, verbose: bool) -> WorkerProcess:
    """``celery -A benchmarks.benchapp worker`` on the server at ``port``, started and ready."""
    return WorkerProcess(
        port,
        "bench",
        concurrency,
        pool,
        env={"REDLOCK_TEST_VERBOSE": "1" if verbose else "0"},
        app="benchmarks.benchapp",
    ).start(timeout=60.0)


# -- 1. task throughput ---------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float | None:
    """User+system CPU seconds of process ``pid`` so far (Linux ``/proc``; ``None`` elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_groups(worker: WorkerProcess, server: RedisServer) -> dict[str, list[int]]:
    """The processes whose CPU time a batch is charged with, by role."""
    assert worker.process is not None and server.process is not None
    children = Path(f"/proc/{worker.process.pid}/task/{worker.process.pid}/children")
    pool = [int(p) for p in children.read_text().split()] if children.exists() else []
    return {
        "worker main": [worker.process.pid],
        "pool children": pool,
        "redis-server": [server.process.pid],
        "benchmark client": [os.getpid()],
    }


def cpu_snapshot(groups: dict[str, list[int]]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for role, pids in groups.items():
        times = [cpu_seconds(pid) for pid in pids]
        out[role] = None if not pids or None in times else sum(t for t in times if t is not None)
    return out


def run_batch(
    app: Any,
    task: Any,
    n: int,
    tag: str,
    timeout: float,
    groups: dict[str, list[int]] | None = None,
) -> dict[str, Any]:
    """Submit ``n`` calls of ``task`` up front; seconds until submitted and until all ready.

    With ``groups``, also the CPU microseconds per task each group of processes spent.
    """
    from celery.result import ResultSet

    keys = [f"{tag}:{i}" for i in range(n)]
    before = cpu_snapshot(groups) if groups else {}
    start = time.perf_counter()
    with app.producer_or_acquire() as producer:
        results = [task.apply_async((key,), producer=producer) for key in keys]
    submitted = time.perf_counter()
    # A small interval matters: with the default 0.5 s, ResultSet.get() on the Redis backend
    # returns up to one interval after the last result arrived (measured: +0.5 s per batch).
    ResultSet(results).get(timeout=timeout, propagate=True, interval=RESULT_POLL_S)
    done = time.perf_counter()
    run: dict[str, Any] = {
        "submit_s": submitted - start,
        "wall_s": done - start,
        "rate": n / (done - start),
        "keys": keys,  # popped by the caller
    }
    if groups:
        after = cpu_snapshot(groups)
        run["cpu_us_per_task"] = {
            role: None if b is None or after[role] is None else (after[role] - b) / n * 1e6
            for role, b in before.items()
        }
    return run


def engine_costs(app: Any, quick: bool) -> dict[str, Any]:
    """Microseconds per call of the Python pieces of a locked task's lock path (no I/O)."""
    from celery_redlock._celery import identity as _identity

    task = app.tasks["bench.locked"]

    class Renewable:
        def renew_step(self) -> float | None:
            return None

    item = Renewable()

    def watch_unwatch() -> None:
        _renewal.watch(item, 10.0)
        _renewal.unwatch(item)

    name = "bench.locked:0123456789abcdef0123456789abcdef"
    return guarded_costs(
        {
            "spec_of (cached)": lambda: _identity.spec_of(task),
            "lock_name_for (bind+json+hash)": lambda: _identity.lock_name_for(
                task, _identity.spec_of(task), ("r0:1",), {}
            ),
            "Lock(..., auto_renew=True)": lambda: Lock(
                STUB,
                name,
                30.0,
                owner="id",
                host="bench@h",
                auto_renew=True,  # type: ignore[arg-type]
            ),
            "_renewal.watch + unwatch": watch_unwatch,
        },
        quick,
    )


def eager_costs(app: Any, names: Sequence[str], n: int, rounds: int) -> dict[str, float]:
    """Wall microseconds per ``task.apply()`` in this process (real Redis, no broker, no pool).

    ``locked - plain`` is what the lock adds to one execution in a pool child: the two round
    trips of a ``Lock`` pair plus the Celery-side glue (key digest, Lock construction, hooks).
    """
    tasks = {name: app.tasks[f"bench.{name}"] for name in names}
    for name, task in tasks.items():
        for i in range(min(n, 200)):
            task.apply((f"eager-warm-{name}:{i}",))
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r, order in enumerate(interleaved(list(names), rounds)):
        for name in order:
            task = tasks[name]
            start = time.perf_counter()
            for i in range(n):
                task.apply((f"eager-{r}-{name}:{i}",))
            samples[name].append((time.perf_counter() - start) / n * 1e6)
    return {name: median(values) for name, values in samples.items()}


def bench_tasks(args: argparse.Namespace, server: RedisServer) -> dict[str, Any]:
    os.environ["REDLOCK_TEST_PORT"] = str(server.port)  # read when benchapp is imported
    benchapp = sys.modules.get("benchmarks.benchapp")
    benchapp = (
        importlib.reload(benchapp) if benchapp else importlib.import_module("benchmarks.benchapp")
    )
    app = benchapp.app
    variants = ["plain", "locked"] + (["locked_ttl"] if args.fixed_ttl else [])
    tasks = {name: getattr(benchapp, name) for name in variants}
    timeout = max(120.0, args.tasks / 10)
    worker = bench_worker(server.port, args.pool, args.concurrency, args.verbose)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    lock_keys: list[str] = []
    try:
        for name in variants:  # warm-up: imports, tracers, script loading, connections
            run_batch(app, tasks[name], args.warmup, f"warm-{name}", timeout)
        groups = process_groups(worker, server)  # after the warm-up: the pool has forked
        for r, order in enumerate(interleaved(variants, args.rounds)):
            for name in order:
                run = run_batch(app, tasks[name], args.tasks, f"r{r}-{name}", timeout, groups)
                if name != "plain":  # app.tasks: lock_key() fails on the @app.task proxy
                    task = app.tasks[tasks[name].name]
                    lock_keys.extend(lock_key(task, key) for key in run["keys"])
                del run["keys"]
                runs[name].append(run)
                progress(
                    f"  tasks round {r + 1}/{args.rounds} {name:<10} {run['rate']:8.1f} tasks/s"
                )
        log_problems = [ln for ln in worker.text().splitlines() if "ERROR" in ln or "WARN" in ln]
    finally:
        worker.stop()
    worker.log.unlink()  # kept when the run failed, for the post-mortem
    db0 = server.client()  # every lock must be released once its task's result is ready
    leftover = sum(db0.exists(*lock_keys[i : i + 1000]) for i in range(0, len(lock_keys), 1000))
    db0_keys = db0.dbsize()
    db0.close()
    rates = {name: median([r["rate"] for r in runs[name]]) for name in variants}
    cpu = {
        name: {
            role: median(
                [
                    r["cpu_us_per_task"][role]
                    for r in runs[name]
                    if r["cpu_us_per_task"].get(role) is not None
                ]
            )
            for role in groups
        }
        for name in variants
    }
    result = {
        "tasks_per_batch": args.tasks,
        "rounds": args.rounds,
        "pool": args.pool,
        "concurrency": args.concurrency,
        "runs": runs,
        "median_rate": rates,
        "median_cpu_us_per_task": cpu,
        "ratio_locked_plain": rates["locked"] / rates["plain"],
        "ratio_locked_ttl_plain": rates["locked_ttl"] / rates["plain"] if args.fixed_ttl else None,
        "paired_ratios": [
            a["rate"] / b["rate"] for a, b in zip(runs["locked"], runs["plain"], strict=True)
        ],
        "db0_keys_after": db0_keys,
        "lock_keys_left": leftover,
        "worker_log_problems": log_problems[:20],
        "eager_apply_us": eager_costs(app, variants, 200 if args.quick else 2000, args.rounds),
        "engine_component_us": engine_costs(app, args.quick),
    }
    app.close()
    return result


# -- 2. acquire+release pairs ---------------------------------------------------------------------


def ours_variants(client: Any) -> dict[str, Loop]:
    """Loops of ``n`` acquire+release pairs with our code; each returns the failed acquires.

    ``client`` is a ``redis.Redis`` or :data:`STUB`. ``scripts_only`` (a diagnostic, left out
    if the package's internals changed shape) runs our two Lua scripts without the Lock.
    """

    def ours_fresh(n: int) -> int:  # how LockedTask uses it: a new Lock per execution
        failed = 0
        for _ in range(n):
            lock = Lock(client, "bench-ours", ttl=30)
            if lock.acquire(blocking=False):
                lock.release()
            else:
                failed += 1
        return failed

    reused = Lock(client, "bench-ours-reused", ttl=30)

    def ours_reused(n: int) -> int:
        failed = 0
        for _ in range(n):
            if reused.acquire(blocking=False):
                reused.release()
            else:
                failed += 1
        return failed

    loops = {"ours_fresh": ours_fresh, "ours_reused": ours_reused}
    try:
        loops["scripts_only"] = bare_scripts(client, Lock(client, "bench-scripts", ttl=30).keys)
    except Exception as exc:  # the package's internal script helpers changed
        progress(f"  diag 'scripts_only' skipped: {type(exc).__name__}: {exc}")
    return loops


def bare_scripts(client: Any, keys: Any) -> Loop:
    """Our acquire and release scripts called directly, with the package's own KEYS/ARGV."""
    acquire = client.register_script(_scripts.ACQUIRE)
    release = client.register_script(_scripts.RELEASE)
    token = _owner.new_token("", "bench")
    acquire_keys, acquire_args = _scripts.acquire_call(keys, token, 30000)
    release_keys, release_args = _scripts.release_call(keys, token)

    def scripts_only(n: int) -> int:
        failed = 0
        for _ in range(n):
            if int(acquire(keys=acquire_keys, args=acquire_args)[0]) == 1:
                release(keys=release_keys, args=release_args)
            else:
                failed += 1
        return failed

    scripts_only(1)  # fails here, not mid-measurement, if the helpers do not fit
    return scripts_only


def pair_variants(client: redis.Redis) -> dict[str, Loop]:
    """Every pair loop: the floor, ours, redis-py's Lock; each returns the failed acquires."""

    def floor(n: int) -> int:
        set_, delete, value, failed = client.set, client.delete, "x" * 32, 0
        for _ in range(n):
            if not set_("bench:floor", value, nx=True, px=30000):
                failed += 1
            delete("bench:floor")
        return failed

    def redispy_fresh(n: int) -> int:
        failed = 0
        for _ in range(n):
            lock = redis.lock.Lock(client, "bench:redispy", timeout=30)
            if lock.acquire(blocking=False):
                lock.release()
            else:
                failed += 1
        return failed

    reused = redis.lock.Lock(client, "bench:redispy-reused", timeout=30)

    def redispy_reused(n: int) -> int:
        failed = 0
        for _ in range(n):
            if reused.acquire(blocking=False):
                reused.release()
            else:
                failed += 1
        return failed

    ours = ours_variants(client)
    loops = {
        "floor": floor,
        "ours_fresh": ours["ours_fresh"],
        "ours_reused": ours["ours_reused"],
        "redispy_fresh": redispy_fresh,
        "redispy_reused": redispy_reused,
    }
    if "scripts_only" in ours:
        loops["scripts_only"] = ours["scripts_only"]
    return loops


PAIR_LABELS = {
    "floor": "floor: SET NX PX + DEL",
    "ours_fresh": "ours: new Lock per pair",
    "ours_reused": "ours: one Lock reused",
    "redispy_fresh": "redis-py Lock per pair",
    "redispy_reused": "redis-py Lock reused",
    "scripts_only": "diag: our 2 scripts, no Lock",
}

#: Commands each variant sends itself: their server time (INFO commandstats) is the variant's.
#: Commands run inside a script are counted within its EVALSHA, so they are not listed.
TOP_LEVEL_COMMANDS = {
    "floor": ("set", "del"),
    "ours_fresh": ("evalsha", "eval"),
    "ours_reused": ("evalsha", "eval"),
    "redispy_fresh": ("set", "evalsha", "eval"),
    "redispy_reused": ("set", "evalsha", "eval"),
    "scripts_only": ("evalsha", "eval"),
}


def commandstats(client: redis.Redis) -> dict[str, dict[str, float]]:
    """``INFO commandstats`` by command name (``set``, ``evalsha``...), since the last reset."""
    return {
        name.removeprefix("cmdstat_"): {k: float(v) for k, v in fields.items()}
        for name, fields in client.info("commandstats").items()
        if name not in ("cmdstat_info", "cmdstat_config")
    }


def run_pair_loops(
    client: redis.Redis, loops: dict[str, Loop], pairs: int, rounds: int
) -> dict[str, Any]:
    """Run every loop of ``pairs`` pairs once per round, interleaved (ABBA).

    Returns ``runs`` (pairs/s per round), ``failed`` (acquires that failed) and
    ``commandstats`` (per round, the server's :func:`commandstats` of that run alone).
    """
    runs: dict[str, list[float]] = {name: [] for name in loops}
    stats: dict[str, list[dict[str, dict[str, float]]]] = {name: [] for name in loops}
    failed = dict.fromkeys(loops, 0)
    for r, order in enumerate(interleaved(list(loops), rounds)):
        for name in order:
            client.config_resetstat()
            start = time.perf_counter()
            failed[name] += loops[name](pairs)
            runs[name].append(pairs / (time.perf_counter() - start))
            stats[name].append(commandstats(client))
        progress(f"  pairs round {r + 1}/{rounds} done")
    return {"runs": runs, "failed": failed, "commandstats": stats}


def lock_layer_us(pairs: int) -> dict[str, Any]:
    """Microseconds per pair spent in celery_redlock itself (stub client: no redis-py, no I/O)."""
    try:
        loops = ours_variants(STUB)
        for loop in loops.values():
            loop(10)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {
        name: min(timeit.repeat(lambda loop=loop: loop(pairs), number=1, repeat=3)) / pairs * 1e6
        for name, loop in loops.items()
    }


def layer_profile(pairs: int, top: int) -> list[tuple[float, float, str]]:
    """cProfile of 'new Lock per pair' on the stub: (own us/pair, calls/pair, function)."""
    loop = ours_variants(STUB)["ours_fresh"]
    profiler = cProfile.Profile()
    profiler.runcall(loop, pairs)
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = []
    for (path, line, func), (_, calls, own, _cum, _callers) in stats.items():
        if path == __file__:
            continue  # the benchmark loop itself
        where = f"{Path(path).name}:{line}({func})" if path != "~" else func
        rows.append((own / pairs * 1e6, calls / pairs, where))
    return sorted(rows, reverse=True)[:top]


def socket_share(client: redis.Redis, pairs: int) -> float:
    """Fraction of 'new Lock per pair' time (real client, under cProfile) in socket calls."""
    loop = ours_variants(client)["ours_fresh"]
    profiler = cProfile.Profile()
    profiler.runcall(loop, pairs)
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    total = sum(row[2] for row in stats.values())
    in_socket = sum(
        row[2]
        for (_, _, func), row in stats.items()
        if "'_socket.socket'" in func and ("recv" in func or "sendall" in func)
    )
    return in_socket / total if total else float("nan")


def component_costs(client: redis.Redis, quick: bool) -> dict[str, Any]:
    """Microseconds per call of the Python-side pieces of an acquire+release (no I/O)."""
    import secrets

    held = Lock(STUB, "bench-held", ttl=30)  # type: ignore[arg-type]

    def acquire_release() -> None:
        held.acquire(blocking=False)
        held.release()

    return guarded_costs(
        {
            "Lock(client, name) construction": lambda: Lock(client, "bench-ours", ttl=30),
            "  _keys.keys_for": lambda: _keys.keys_for("redlock", "bench-ours"),
            "acquire+release of a Lock, stub client": acquire_release,
            "  _owner.new_token(host=None)": lambda: _owner.new_token("", None),
            "  _owner.new_token(host='h')": lambda: _owner.new_token("", "h"),
            "    socket.gethostname": socket.gethostname,
            "    secrets.token_hex(16)": lambda: secrets.token_hex(16),
            "  AcquireResult(True, fencing_token=1)": lambda: _scripts.AcquireResult(
                True, fencing_token=1
            ),
            "  _renewal.unwatch (every release)": lambda: _renewal.unwatch(held),
        },
        quick,
    )


def bench_pairs(args: argparse.Namespace, server: RedisServer) -> dict[str, Any]:
    client = redis.Redis(host="127.0.0.1", port=server.port, db=0, socket_timeout=5)
    variants = pair_variants(client)
    for loop in variants.values():  # warm-up: connection, SCRIPT LOAD, code paths
        loop(min(args.pairs, 500))
    measured = run_pair_loops(client, variants, args.pairs, args.rounds)
    runs, failures = measured["runs"], measured["failed"]
    server_us = {
        name: [
            sum(stats.get(cmd, {}).get("usec", 0) for cmd in TOP_LEVEL_COMMANDS[name]) / args.pairs
            for stats in measured["commandstats"][name]
        ]
        for name in variants
    }
    rates = {name: median(values) for name, values in runs.items()}
    result: dict[str, Any] = {
        "pairs_per_run": args.pairs,
        "rounds": args.rounds,
        "runs": runs,
        "median_rate": rates,
        "us_per_pair": {name: 1e6 / rate for name, rate in rates.items()},
        "server_us_per_pair": {name: median(values) for name, values in server_us.items()},
        "failed_acquires": failures,
        "ratio_ours_floor": rates["ours_fresh"] / rates["floor"],
        "ratio_ours_reused_floor": rates["ours_reused"] / rates["floor"],
        "ratio_ours_redispy": rates["ours_fresh"] / rates["redispy_fresh"],
        "ratio_ours_reused_redispy_reused": rates["ours_reused"] / rates["redispy_reused"],
        "lock_layer_us_per_pair": lock_layer_us(2000 if args.quick else 20000),
        "component_us": component_costs(client, args.quick),
    }
    if args.profile:
        try:
            result["layer_profile"] = layer_profile(args.profile_pairs, args.profile_top)
        except Exception as exc:
            result["layer_profile"] = f"n/a ({type(exc).__name__}: {exc})"
        result["socket_share_under_profile"] = socket_share(client, args.profile_pairs)
    client.close()
    return result


# -- report ---------------------------------------------------------------------------------------


def print_costs(title: str, costs: dict[str, Any]) -> None:
    print(f"   {title}")
    for name, us in costs.items():
        print(f"     {name:<40}{us:>7.2f}" if isinstance(us, float) else f"     {name:<40} {us}")


def print_tasks(res: dict[str, Any]) -> None:
    print(
        f"\n1. Task throughput: celery worker -P {res['pool']} -c {res['concurrency']}, "
        f"{res['tasks_per_batch']} no-op tasks per batch, {res['rounds']} rounds (ABBA)"
    )
    print(f"   {'variant':<12}{'median/s':>10}{'vs plain':>10}   runs (tasks/s)")
    plain = res["median_rate"]["plain"]
    for name, rate in res["median_rate"].items():
        runs = " ".join(f"{r['rate']:.0f}" for r in res["runs"][name])
        print(f"   {name:<12}{rate:>10.1f}{rate / plain:>10.3f}   {runs}")
    ratio = res["ratio_locked_plain"]
    paired = " ".join(f"{x:.3f}" for x in res["paired_ratios"])
    print(f"   locked/plain = {ratio:.3f}; per round: {paired}")
    cpu = res["median_cpu_us_per_task"]
    roles = list(cpu["plain"])
    resolution = 1e6 / os.sysconf("SC_CLK_TCK") / res["tasks_per_batch"]
    print(f"   CPU us per task by process (median of runs, /proc, +-{resolution:.0f} us):")
    print(f"     {'variant':<12}" + "".join(f"{role:>18}" for role in roles) + f"{'total':>10}")
    for name, per_role in cpu.items():
        cells = "".join(f"{per_role[role]:>18.0f}" for role in roles)
        print(f"     {name:<12}{cells}{sum(per_role.values()):>10.0f}")
    if res["lock_keys_left"]:
        print(f"   WARNING: {res['lock_keys_left']} lock keys left in Redis after the batches")
    for line in res["worker_log_problems"]:
        print(f"   worker log: {line}")
    eager = res["eager_apply_us"]
    print(
        "   in-process task.apply() (real Redis, no broker): "
        + ", ".join(f"{name} {us:.0f} us" for name, us in eager.items())
        + f"; the lock adds {eager['locked'] - eager['plain']:.0f} us per execution"
    )
    print_costs(
        "worker-side lock path, Python pieces (us/call, no I/O):", res["engine_component_us"]
    )


def print_pairs(res: dict[str, Any]) -> None:
    print(
        f"\n2. Acquire+release pairs on one connection: {res['pairs_per_run']} pairs per run, "
        f"{res['rounds']} rounds"
    )
    heads = f"{'pairs/s':>9}{'us/pair':>9}{'server':>8}{'client':>8}{'vs floor':>10}"
    print(f"   {'variant':<30}{heads}")
    floor = res["median_rate"]["floor"]
    for name, rate in res["median_rate"].items():
        total, server = 1e6 / rate, res["server_us_per_pair"][name]
        print(
            f"   {PAIR_LABELS[name]:<30}{rate:>9.0f}{total:>9.1f}{server:>8.1f}"
            f"{total - server:>8.1f}{rate / floor:>10.3f}"
        )
    print("   (server: INFO commandstats time of the variant's commands; client: the rest,")
    print("    i.e. redis-py, the kernel and loopback, and our own Python)")
    ratio = res["ratio_ours_floor"]
    print(f"   ours/floor    = {ratio:.3f}  (reused Lock: {res['ratio_ours_reused_floor']:.3f})")
    print(
        f"   ours/redis-py = {res['ratio_ours_redispy']:.3f}  "
        f"(both reused: {res['ratio_ours_reused_redispy_reused']:.3f})"
    )
    layer = res["lock_layer_us_per_pair"]
    if "error" in layer:
        print(f"   celery_redlock's own Python per pair: n/a ({layer['error']})")
    else:
        bare = layer.get("scripts_only")
        print(
            f"   celery_redlock's own Python per pair (stub client, no I/O): "
            f"{layer['ours_fresh']:.1f} us new Lock, {layer['ours_reused']:.1f} us reused"
            + (f", {bare:.1f} us bare scripts" if bare is not None else "")
        )
    if any(res["failed_acquires"].values()):
        print(f"   WARNING: failed acquisitions: {res['failed_acquires']}")
    print_costs("component costs (us/call, no I/O):", res["component_us"])
    if "layer_profile" in res:
        print(
            f"\n   real client under cProfile: {res['socket_share_under_profile']:.0%} of the "
            "time is in socket recv/sendall"
        )
        print("   cProfile, 'new Lock per pair' on the stub client (inflated by the profiler):")
        if isinstance(res["layer_profile"], str):
            print(f"     {res['layer_profile']}")
        else:
            print(f"     {'own us/pair':>11}{'calls/pair':>11}  function")
            for own, calls, where in res["layer_profile"]:
                print(f"     {own:>11.2f}{calls:>11.1f}  {where}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=2000, help="tasks per batch (default 2000)")
    p.add_argument("--pairs", type=int, default=20000, help="pairs per run (default 20000)")
    p.add_argument("--rounds", type=int, default=3, help="runs per variant, interleaved")
    p.add_argument("--warmup", type=int, default=50, help="warm-up tasks per variant")
    p.add_argument("--pool", default="prefork")
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument(
        "--fixed-ttl",
        action="store_true",
        help="also run a locked task with lock_ttl (no renewal watchdog)",
    )
    p.add_argument("--only", choices=["tasks", "pairs"], help="run one benchmark only")
    p.add_argument(
        "--profile",
        action="store_true",
        help="cProfile our Lock's pair loop (where the Python time goes)",
    )
    p.add_argument("--profile-pairs", type=int, default=20000)
    p.add_argument("--profile-top", type=int, default=20)
    p.add_argument("--verbose", action="store_true", help="keep the worker's per-task INFO logs")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 100 tasks, 500 pairs, 2 rounds, 10 warm-up tasks",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.tasks, args.pairs, args.rounds, args.warmup = 100, 500, 2, 10
        args.profile_pairs = 1000
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    results: dict[str, Any] = {"quick": args.quick, "argv": sys.argv[1:] if argv is None else argv}
    with RedisServer() as server:
        env = results["environment"] = environment(server)
        print(
            f"celery-redlock core benchmark: python {env['python']}, redis-py {env['redis_py']}, "
            f"celery {env['celery']}, redis-server {env['redis_server']}, {env['cpus']} CPUs, "
            f"load {env['loadavg_start'][0]:.2f}, package at {env['package_commit']}"
            + ("  [--quick: the figures are noise]" if args.quick else "")
        )
        if args.only in (None, "tasks"):
            progress("task throughput benchmark (starting a worker)...")
            results["tasks"] = bench_tasks(args, server)
            print_tasks(results["tasks"])
        if args.only in (None, "pairs"):
            progress("pairs benchmark...")
            results["pairs"] = bench_pairs(args, server)
            print_pairs(results["pairs"])
    results["environment"]["loadavg_end"] = os.getloadavg()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str) + "\n")
        print(f"\nresults written to {args.json}")
    return results


if __name__ == "__main__":
    main()
