"""The CPU one eager ``apply()`` adds, for each way of locking a task, in one run.

Run from the repository root::

    python -m benchmarks.bench_cpu                     # 7 rounds of 2000 calls per variant
    python -m benchmarks.bench_cpu --quick             # smoke run, a few seconds
    python -m benchmarks.bench_cpu --profile locked    # cProfile of one variant, top 30
    python -m benchmarks.bench_cpu --instructions      # instructions per call, under valgrind

One process, one private ``redis-server`` (:class:`celery_redlock.testing.RedisServer`, started
here on a free port), one Celery app whose tasks run eagerly (``task.apply()``: Celery's tracer,
no broker). Four no-op tasks, each called with a fresh argument per call so that every call
takes a fresh key:

* ``plain``: no lock (the baseline; what the tracer itself costs);
* ``locked``: ``base=LockedTask``;
* ``decorated``: ``@single_instance``;
* ``redispy``: a base task whose ``__call__`` wraps the body in redis-py's ``Lock``
  (non-blocking acquire, release in ``finally``): the bare lock, two round trips as ours.

Each figure is CPU time of this process (``time.process_time``: user + system, every thread)
per call, minus ``plain``'s, so it is what locking adds, the two round trips' client side
included; the Redis server's time is not counted (it is another process). Rounds interleave
the variants (ABBA order), and the median per variant is reported beside its ratio to
``redispy`` from the same round. Nothing is asserted: a busy machine moves every figure.

``--instructions`` counts instead of timing: each variant runs in a child process under
``valgrind --tool=callgrind`` (Debian's ``valgrind``), once with 200 calls and once with 1,200,
and the difference over 1,000 is the user-space instructions one call costs, every thread of the
process included (the Redis server is another process, and system calls count as the
instructions that make them). The count does not move with the machine's load, so it decides
what the timed rounds cannot on a noisy VM; it takes about five minutes.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import redis
import redis.lock
from celery import Celery, Task

from benchmarks._common import environment
from celery_redlock import LockedTask, metrics, single_instance
from celery_redlock.testing import RedisServer

VARIANTS = ("plain", "locked", "decorated", "redispy")


def build(url: str) -> dict[str, Any]:
    """The app and its four tasks, against the Redis at ``url``."""
    app = Celery("bench_cpu", broker="memory://", set_as_current=False)
    app.conf.update(redlock_url=url, task_store_eager_result=False)
    client = redis.Redis.from_url(url)

    class RedisPyLockTask(Task):  # type: ignore[misc]
        """redis-py's ``Lock`` around the body; a call whose key is held is skipped."""

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            lock = redis.lock.Lock(client, f"rpl:{self.name}:{args}", timeout=30)
            if not lock.acquire(blocking=False):
                return None
            try:
                return self.run(*args, **kwargs)
            finally:
                lock.release()

    @app.task(shared=False)
    def plain(key: int) -> None:
        return None

    @app.task(base=LockedTask, shared=False)
    def locked(key: int) -> None:
        return None

    @app.task(shared=False)
    @single_instance
    def decorated(key: int) -> None:
        return None

    @app.task(base=RedisPyLockTask, shared=False)
    def redispy(key: int) -> None:
        return None

    app.finalize()
    return {"plain": plain, "locked": locked, "decorated": decorated, "redispy": redispy}


def per_call(task: Any, calls: int, start: int) -> float:
    """CPU seconds per ``task.apply()`` over ``calls`` calls, arguments from ``start``."""
    apply = task.apply
    begin = time.process_time()
    for i in range(start, start + calls):
        apply((i,))
    return (time.process_time() - begin) / calls


def measure(tasks: dict[str, Any], rounds: int, calls: int) -> dict[str, list[float]]:
    """Per-call CPU of each variant in each round (ABBA order across rounds)."""
    seconds: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for task in tasks.values():  # warm up: first-call caches, connections
        per_call(task, 200, -1000)
    argument = 0
    for r in range(rounds):
        order = VARIANTS if r % 2 == 0 else tuple(reversed(VARIANTS))
        for variant in order:
            seconds[variant].append(per_call(tasks[variant], calls, argument))
            argument += calls
    return seconds


def report(seconds: dict[str, list[float]]) -> None:
    """Median per-call CPU and added CPU, the median of the per-round ratios to ``redispy``,
    and the ratio of the smallest figures (interference only ever adds CPU, so the minimum
    of many rounds is the least disturbed one)."""
    added = {
        v: [s - p for s, p in zip(seconds[v], seconds["plain"], strict=True)] for v in VARIANTS
    }
    least = {v: min(seconds[v]) - min(seconds["plain"]) for v in VARIANTS}
    print(f"{'variant':<10} {'µs/call':>9} {'added µs':>9} {'vs redispy':>11} {'min ratio':>10}")
    for v in VARIANTS:
        total = statistics.median(seconds[v]) * 1e6
        extra = statistics.median(added[v]) * 1e6
        ratios = [a / b for a, b in zip(added[v], added["redispy"], strict=True) if b > 0]
        ratio = f"{statistics.median(ratios):.2f}" if v != "plain" and ratios else "-"
        low = f"{least[v] / least['redispy']:.2f}" if v != "plain" else "-"
        print(f"{v:<10} {total:9.1f} {extra:9.1f} {ratio:>11} {low:>10}")


def profile(task: Any, calls: int) -> None:
    per_call(task, 200, -5000)
    profiler = cProfile.Profile()
    profiler.runcall(per_call, task, calls, 10_000_000)
    pstats.Stats(profiler).sort_stats("tottime").print_stats(30)


#: The two call counts of ``--instructions``: their difference over 1,000 is one call.
INSTRUCTION_CALLS = (200, 1200)


def child(variant: str, calls: int) -> None:
    """The process ``--instructions`` counts: ``calls`` calls of ``variant`` after a warm-up.

    The lock counters' flush (a thread, once a second: one ``HINCRBY`` round per task name,
    whatever the number of executions) is held off: under valgrind a run lasts about fifty
    times as long, so the flushes it counted depended on how long the run took, and moved the
    per-call figure by up to 3,000 instructions between runs of the same tree.
    """
    metrics.FLUSH_INTERVAL = 3600.0
    with RedisServer() as server:
        task = build(server.url)[variant]
        per_call(task, 50, -1000)
        per_call(task, calls, 0)


def instructions(variant: str, calls: int) -> int:
    """User-space instructions of a :func:`child` process, counted by callgrind."""
    command = [
        *("valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"),
        *(sys.executable, "-m", "benchmarks.bench_cpu", "--child", variant, str(calls)),
    ]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    run = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    found = re.search(r"Collected : (\d+)", run.stderr)
    if found is None:
        raise RuntimeError(f"no count from callgrind: {run.stderr[-500:]}")
    return int(found.group(1))


def count_instructions() -> None:
    """Instructions per call of each variant, what locking adds, and the ratio to redispy."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    low, high = INSTRUCTION_CALLS
    per = {}
    for variant in VARIANTS:
        per[variant] = (instructions(variant, high) - instructions(variant, low)) / (high - low)
    print(f"{'variant':<10} {'instr/call':>11} {'added':>9} {'vs redispy':>11}")
    base = per["redispy"] - per["plain"]
    for variant in VARIANTS:
        added = per[variant] - per["plain"]
        ratio = f"{added / base:.2f}" if variant != "plain" else "-"
        print(f"{variant:<10} {per[variant]:11,.0f} {added:9,.0f} {ratio:>11}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="3 rounds of 300 calls")
    parser.add_argument("--profile", choices=VARIANTS, help="profile one variant instead")
    parser.add_argument(
        "--instructions", action="store_true", help="count instructions under valgrind instead"
    )
    parser.add_argument("--child", nargs=2, metavar=("VARIANT", "CALLS"), help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.child:
        child(options.child[0], int(options.child[1]))
        return
    if options.instructions:
        with RedisServer() as server:
            print(" ".join(f"{k}={v}" for k, v in environment(server).items()))
        count_instructions()
        return
    rounds, calls = (3, 300) if options.quick else (options.rounds, options.calls)
    with RedisServer() as server:
        env = environment(server)
        print(" ".join(f"{k}={v}" for k, v in env.items()))
        tasks = build(server.url)
        run: Callable[[], None]
        if options.profile:
            run = lambda: profile(tasks[options.profile], calls)  # noqa: E731
        else:
            run = lambda: report(measure(tasks, rounds, calls))  # noqa: E731
        run()


if __name__ == "__main__":
    main()
