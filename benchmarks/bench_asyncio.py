"""Acquire+release pairs per second: ``celery_redlock.asyncio.Lock`` beside redis-py's asyncio lock.

Run from the repository root: ``python -m benchmarks.bench_asyncio [--pairs 2000] [--rounds 7]``.

Both locks run the same loop on one ``redis.asyncio`` client of a private ``redis-server``:
build a lock, acquire without blocking, release; one pair at a time, so the figure is the
latency of one uncontended pair, inverted. The variants alternate round by round (ABBA) and the
median of the rounds is reported. What ours does more per pair: the fencing counter (``GET`` +
``SET`` + ``TIME`` inside the acquire script), and a ``PUBLISH`` on release, both run as
scripts (``EVALSHA``), where redis-py acquires with a plain ``SET NX PX``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.lock import Lock as RedisPyLock

from benchmarks._common import environment
from celery_redlock.asyncio import Lock
from celery_redlock.testing import RedisServer

Pair = Callable[[], Awaitable[None]]


def ours(client: aioredis.Redis) -> Pair:
    async def pair() -> None:
        lock = Lock(client, "bench-ours", ttl=10)
        if not await lock.acquire(blocking=False):
            raise RuntimeError("benchmark lock contended")
        await lock.release()

    return pair


def redis_py(client: aioredis.Redis) -> Pair:
    async def pair() -> None:
        lock = RedisPyLock(client, "bench-redis-py", timeout=10)
        if not await lock.acquire(blocking=False):
            raise RuntimeError("benchmark lock contended")
        await lock.release()

    return pair


VARIANTS: dict[str, Callable[[aioredis.Redis], Pair]] = {"ours": ours, "redis-py": redis_py}


async def rate(pair: Pair, pairs: int) -> float:
    """Pairs per second over ``pairs`` sequential pairs."""
    start = time.perf_counter()
    for _ in range(pairs):
        await pair()
    return pairs / (time.perf_counter() - start)


async def measure(url: str, pairs: int, rounds: int, warmup: int) -> dict[str, list[float]]:
    client = aioredis.Redis.from_url(url)
    try:
        made = {name: make(client) for name, make in VARIANTS.items()}
        for pair in made.values():
            await rate(pair, warmup)
        runs: dict[str, list[float]] = {name: [] for name in made}
        order = list(made)
        for i in range(rounds):
            for name in order if i % 2 == 0 else reversed(order):  # ABBA
                runs[name].append(await rate(made[name], pairs))
                print(f"   round {i + 1}: {name} {runs[name][-1]:,.0f} pairs/s", file=sys.stderr)
        return runs
    finally:
        await client.aclose()


def show(runs: dict[str, list[float]]) -> float:
    print(f"\n   {'lock':<10} {'median pairs/s':>15} {'min':>10} {'max':>10} {'us/pair':>8}")
    for name, values in runs.items():
        median = statistics.median(values)
        print(
            f"   {name:<10} {median:15,.0f} {min(values):10,.0f} {max(values):10,.0f} "
            f"{1e6 / median:8.0f}"
        )
    ratio = statistics.median(runs["ours"]) / statistics.median(runs["redis-py"])
    print(f"\nours / redis-py (median pairs per second): {ratio:.2f}")
    return ratio


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2000, help="pairs per round per variant")
    parser.add_argument("--rounds", type=int, default=7, help="rounds (>= 5), medians reported")
    parser.add_argument("--warmup", type=int, default=200, help="warm-up pairs per variant")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    if args.rounds < 5:
        parser.error("--rounds must be >= 5")
    with RedisServer() as server:
        env = environment(server)
        print(
            f"celery-redlock asyncio benchmark: redis-server {env['redis_server']}, "
            f"redis-py {env['redis_py']}, {env['cpus']} CPUs, "
            f"load {env['loadavg_start'][0]:.2f}, package at {env['package_commit']}"
        )
        print(f"{args.rounds} rounds of {args.pairs} sequential acquire+release pairs per lock")
        runs = asyncio.run(measure(server.url, args.pairs, args.rounds, args.warmup))
    ratio = show(runs)
    if args.json:
        out: dict[str, Any] = {"environment": env, "runs": runs, "ratio": ratio}
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
