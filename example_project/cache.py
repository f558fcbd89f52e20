"""A cache-stampede guard built on the ``Lock`` primitive, outside any Celery task.

When a popular cache entry expires, every request that misses it would rebuild it at once (a
stampede). Here one process rebuilds while the others wait for it:

1. read the entry; a hit returns at once;
2. on a miss, take the entry's lock (``Lock(..., timeout=wait)``): one caller gets it, the
   others block, woken by the release notification, not by polling;
3. with the lock, read again: a caller that waited finds the entry its predecessor stored, and
   does not rebuild it;
4. otherwise rebuild, store with a TTL (plus a copy without TTL, the stale fallback), release;
5. a caller that could not get the lock within ``wait`` seconds (a slow rebuild) serves the
   stale copy, or raises :class:`~celery_redlock.LockContended` if there is none.

The lock's TTL bounds a rebuilder that dies holding it: the next caller rebuilds after at most
``lock_ttl`` seconds.
"""

from __future__ import annotations

from collections.abc import Callable

import redis

from celery_redlock import Lock, LockContended
from example_project.settings import DATA_URL, LOCKS_URL

data = redis.Redis.from_url(DATA_URL)


def get_or_rebuild(
    key: str,
    rebuild: Callable[[], bytes],
    ttl: float = 60.0,
    lock_ttl: float = 10.0,
    wait: float = 5.0,
) -> bytes:
    """The cached value of ``key``; ``rebuild()`` runs in one caller at a time."""
    data.hincrby("cache", "requests", 1)
    value: bytes | None = data.get(key)
    if value is not None:
        return value
    try:
        with Lock(LOCKS_URL, f"cache:{key}", ttl=lock_ttl, timeout=wait):
            value = data.get(key)  # stored by the caller we waited for?
            if value is None:
                value = rebuild()
                data.hincrby("cache", "rebuilds", 1)
                data.set(key, value, px=int(ttl * 1000))
                data.set(f"{key}:stale", value)
            return value
    except LockContended:
        stale: bytes | None = data.get(f"{key}:stale")
        if stale is None:
            raise
        return stale
