"""A cache-stampede guard for asyncio code: 50 concurrent requests, one rebuild.

The asyncio twin of :mod:`example_project.cache`, around a view-like coroutine. When the
cached page is missing, every request would rebuild it at once; here one rebuilds under
:class:`celery_redlock.asyncio.Lock` while the others wait:

1. read the page from the cache (a Redis key); a hit returns at once;
2. on a miss, enter the page's lock (``async with Lock(..., timeout=wait)``): one request gets
   it, the others wait for its release notification (no polling, the event loop stays free);
3. with the lock, read again: a request that waited finds the page its predecessor stored;
4. otherwise rebuild, store with a TTL, and leave the lock (released, waking the next).

The lock's TTL bounds a rebuilder that dies holding it. Run it::

    python -m example_project.stampede --redis-url redis://127.0.0.1:6379/3

Without ``--redis-url`` it starts its own ``redis-server`` on a free loopback port.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import redis.asyncio as aioredis

from celery_redlock.asyncio import Lock
from celery_redlock.testing import RedisServer

CACHE_KEY = "stampede:page:home"


@dataclass
class Stats:
    requests: int = 0
    rebuilds: int = 0
    #: Served from the cache, at the first read or after waiting for the lock.
    from_cache: int = 0
    #: Of those, served after waiting for the lock.
    after_waiting: int = 0


async def get_or_rebuild(
    cache: aioredis.Redis,
    locks_url: str,
    key: str,
    rebuild: Callable[[], Awaitable[bytes]],
    stats: Stats,
    ttl: float = 60.0,
    lock_ttl: float = 10.0,
    wait: float = 5.0,
) -> bytes:
    """The cached value of ``key``; ``rebuild()`` runs in one request at a time."""
    stats.requests += 1
    value = await _read(cache, key)
    if value is not None:
        stats.from_cache += 1
        return value
    async with Lock(locks_url, f"cache:{key}", ttl=lock_ttl, timeout=wait):
        value = await _read(cache, key)  # stored by the request we waited for?
        if value is not None:
            stats.from_cache += 1
            stats.after_waiting += 1
            return value
        value = await rebuild()
        stats.rebuilds += 1
        await cache.set(key, value, px=int(ttl * 1000))
        return value


async def _read(cache: aioredis.Redis, key: str) -> bytes | None:
    value = await cache.get(key)
    return value.encode() if isinstance(value, str) else value


async def render_home() -> bytes:
    """The expensive part of the view: a slow query, say."""
    await asyncio.sleep(0.2)
    return b"<h1>home</h1>"


async def home_view(cache: aioredis.Redis, url: str, stats: Stats) -> bytes:
    """A view-like coroutine: the home page, from the cache when possible."""
    return await get_or_rebuild(cache, url, CACHE_KEY, render_home, stats)


async def stampede(url: str, requests: int) -> tuple[Stats, float]:
    """``requests`` concurrent requests for the home page, its cache empty at the start."""
    stats = Stats()
    cache = aioredis.Redis.from_url(url)
    try:
        await cache.delete(CACHE_KEY)
        start = time.perf_counter()
        pages = await asyncio.gather(*(home_view(cache, url, stats) for _ in range(requests)))
        elapsed = time.perf_counter() - start
    finally:
        await cache.aclose()
    assert set(pages) == {b"<h1>home</h1>"}
    return stats, elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", help="Redis URL (default: start a private redis-server)")
    parser.add_argument("--requests", type=int, default=50, help="concurrent requests")
    args = parser.parse_args()
    if args.redis_url:
        stats, elapsed = asyncio.run(stampede(args.redis_url, args.requests))
    else:
        with RedisServer(args=["--maxmemory-policy", "noeviction"]) as server:
            stats, elapsed = asyncio.run(stampede(server.url, args.requests))
    print(f"requests: {stats.requests}")
    print(f"rebuilds: {stats.rebuilds}")
    print(f"served from cache: {stats.from_cache}")
    print(f"of which waited for the lock: {stats.after_waiting}")
    print(f"time: {elapsed:.3f} s")
    return 0 if stats.rebuilds == 1 else 1


if __name__ == "__main__":
    raise SystemExit(main())
