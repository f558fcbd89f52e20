"""Acquire+release latency with 1, 3 and 5 Redis nodes, beside pottery's Redlock.

Run from the repository root: ``python -m benchmarks.bench_quorum [--pairs 400] [--rtt-ms 2]``.

Two settings, each measured in this run:

* **loopback**: every node is a local ``redis-server``. All nodes and the client share this
  machine's cores, so the figure shows CPU cost (N servers each run the script), not network
  latency.
* **network**: each node sits behind a TCP proxy that delays every chunk by ``rtt/2`` (from
  ``support/servers.py``), as nodes on other hosts would. Here the N nodes are asked in parallel,
  so a quorum should cost about one round trip, like one node.

The figure is the ratio to one node. pottery's Redlock (if installed) runs the same pairs for
comparison.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis

from benchmarks._common import environment
from celery_redlock import Lock
from celery_redlock.testing import RedisServer
from support.servers import DelayProxy

NODES = (1, 3, 5)


def timed_pairs(pair: Callable[[], None], pairs: int) -> float:
    """Median microseconds of one acquire+release pair (after a short warm-up)."""
    for _ in range(min(20, pairs)):
        pair()
    samples = []
    for _ in range(pairs):
        start = time.perf_counter()
        pair()
        samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples)


def ours(urls: list[str], tag: str = "") -> Callable[[], None]:
    target: Any = urls[0] if len(urls) == 1 else urls

    def pair() -> None:
        lock = Lock(target, f"bench{tag}", ttl=10)
        if not lock.acquire(blocking=False):
            raise RuntimeError("benchmark lock contended")
        lock.release()

    return pair


def pottery(urls: list[str], tag: str = "") -> Callable[[], None] | None:
    try:
        from pottery import Redlock
    except ImportError:
        return None
    masters = {redis.Redis.from_url(url) for url in urls}

    def pair() -> None:
        lock = Redlock(key=f"bench-pottery{tag}", masters=masters, auto_release_time=10)
        if not lock.acquire(blocking=False):
            raise RuntimeError("pottery lock contended")
        lock.release()

    return pair


@contextlib.contextmanager
def proxies(servers: list[RedisServer], rtt: float) -> Iterator[list[str]]:
    fronts = [DelayProxy(server.port, rtt / 2) for server in servers]
    try:
        yield [front.url for front in fronts]
    finally:
        for front in fronts:
            front.close()


def measure(urls: list[str], pairs: int, tag: str = "") -> dict[str, dict[int, float | None]]:
    """Median us per pair for each node count; ``tag`` makes the lock names of a round its own
    (a pottery lock left behind by a failed release in another round cannot contend)."""
    out: dict[str, dict[int, float | None]] = {"ours": {}, "pottery": {}}
    for n in NODES:
        out["ours"][n] = timed_pairs(ours(urls[:n], f"{tag}-{n}"), pairs)
        other = pottery(urls[:n], f"{tag}-{n}")
        try:
            out["pottery"][n] = timed_pairs(other, pairs) if other else None
        except RuntimeError as exc:  # pottery gave up acquiring a free lock: report it
            print(f"   pottery, {n} node(s): {exc}")
            out["pottery"][n] = None
    return out


def measure_rounds(urls: list[str], pairs: int, rounds: int) -> dict[str, dict[int, float | None]]:
    """:func:`measure` ``rounds`` times; the median per contender and node count."""
    runs = [measure(urls, pairs, f"-r{r}") for r in range(rounds)]
    out: dict[str, dict[int, float | None]] = {}
    for who in runs[0]:
        out[who] = {}
        for n in NODES:
            values = [run[who][n] for run in runs if run[who][n] is not None]
            out[who][n] = statistics.median(values) if values else None  # type: ignore[type-var]
    return out


def show(title: str, results: dict[str, dict[int, float | None]]) -> None:
    print(f"\n{title}")
    ratio = "vs 1 node"
    print(f"   {'nodes':>5}  {'ours us':>9}  {ratio:>9}  {'pottery us':>10}  {ratio:>9}")
    for n in NODES:
        mine, theirs = results["ours"][n], results["pottery"][n]
        base_mine, base_theirs = results["ours"][1], results["pottery"][1]
        mine_ratio = f"{mine / base_mine:9.2f}" if mine and base_mine else f"{'n/a':>9}"
        theirs_col = f"{theirs:10.0f}" if theirs else f"{'n/a':>10}"
        theirs_ratio = f"{theirs / base_theirs:9.2f}" if theirs and base_theirs else f"{'n/a':>9}"
        print(f"   {n:>5}  {mine:9.0f}  {mine_ratio}  {theirs_col}  {theirs_ratio}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=400, help="pairs per variant (loopback)")
    parser.add_argument("--network-pairs", type=int, default=60, help="pairs per variant")
    parser.add_argument("--rtt-ms", type=float, default=2.0, help="round trip of the network")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    servers = [RedisServer().start() for _ in range(max(NODES))]
    try:
        env = environment(servers[0])
        print(
            f"celery-redlock quorum benchmark: redis-server {env['redis_server']}, "
            f"{env['cpus']} CPUs, load {env['loadavg_start'][0]:.2f}, "
            f"package at {env['package_commit']}"
        )
        loopback = measure([s.url for s in servers], args.pairs)
        show(
            f"loopback (all nodes share {env['cpus']} cores): median us per acquire+release pair",
            loopback,
        )
        with proxies(servers, args.rtt_ms / 1000) as urls:
            network = measure(urls, args.network_pairs)
        show(f"network (round trip {args.rtt_ms} ms per node): median us per pair", network)
    finally:
        for server in servers:
            server.stop()
    ratio = (network["ours"][5] or 0) / (network["ours"][1] or 1)
    print(f"\nours, 5 nodes vs 1 over the network: {ratio:.2f}x")
    if args.json:
        args.json.write_text(
            json.dumps({"environment": env, "loopback": loopback, "network": network}, indent=2)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
