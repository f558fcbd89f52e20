"""The contenders of ``python -m benchmarks``: our Lock and its peers behind one small interface.

Every contender is used the way its documentation shows, with its defaults, on the client it is
given. Each entry builds a fresh lock object for a name; the benchmark then calls
``acquire(blocking=False)`` / ``release()`` (pairs, footprint) or a blocking acquire (waiters).

* ``ours``: :class:`celery_redlock.Lock`;
* ``redis-py``: ``redis.lock.Lock`` (``SET NX PX``, release by a compare-and-delete script;
  blocking acquire polls every ``sleep`` = 0.1 s);
* ``python-redis-lock``: ``redis_lock.Lock`` (``SET NX EX``, release by a script that also
  pushes on a signal list; blocking acquire waits in ``BLPOP`` on that list);
* ``pottery``: ``pottery.Redlock`` on one master (its single-node Redlock);
* ``bare``: ``SET NX PX`` plus a Lua compare-and-delete, no library: the floor of an
  owner-checked lock.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

import redis
import redis.lock


class PairLock(Protocol):
    def acquire(self, blocking: bool = ...) -> bool: ...

    def release(self) -> None: ...


COMPARE_AND_DELETE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class BareLock:
    """``SET NX PX`` + a compare-and-delete script: the cheapest owner-checked lock."""

    _scripts: ClassVar[dict[int, Any]] = {}

    def __init__(self, client: redis.Redis, name: str, ttl: float = 30.0) -> None:
        self.client = client
        self.name = name
        self.ttl_ms = int(ttl * 1000)
        self.token = ""
        script = self._scripts.get(id(client))
        if script is None:
            script = self._scripts[id(client)] = client.register_script(COMPARE_AND_DELETE)
        self.cad = script

    def acquire(self, blocking: bool = False) -> bool:
        self.token = os.urandom(16).hex()
        return bool(self.client.set(self.name, self.token, nx=True, px=self.ttl_ms))

    def release(self) -> None:
        self.cad(keys=[self.name], args=[self.token])


def ours(client: Any, name: str, ttl: float = 30.0) -> Any:
    from celery_redlock import Lock

    return Lock(client, name, ttl=ttl)


def redis_py(client: Any, name: str, ttl: float = 30.0) -> Any:
    # thread_local=False: the waiter benchmark releases a winner's lock from the main thread.
    return redis.lock.Lock(client, name, timeout=ttl, thread_local=False)


def python_redis_lock(client: Any, name: str, ttl: float = 30.0) -> Any:
    import redis_lock

    return redis_lock.Lock(client, name, expire=int(ttl))


class PotteryLock:
    """pottery's Redlock on one master, with the acquire signature of the others."""

    def __init__(self, client: Any, name: str, ttl: float = 30.0) -> None:
        from pottery import Redlock

        self.lock = Redlock(key=name, masters={client}, auto_release_time=ttl)

    def acquire(self, blocking: bool = False) -> bool:
        return bool(self.lock.acquire(blocking=blocking))

    def release(self) -> None:
        self.lock.release()


def bare(client: Any, name: str, ttl: float = 30.0) -> Any:
    return BareLock(client, name, ttl)


#: name -> factory(client, lock name, ttl seconds) for the pair benchmark.
PAIR_CONTENDERS: dict[str, Callable[..., Any]] = {
    "ours": ours,
    "redis-py": redis_py,
    "python-redis-lock": python_redis_lock,
    "pottery": PotteryLock,
    "bare": bare,
}


def blocking_acquire(contender: str, lock: Any, timeout: float) -> bool:
    """A blocking acquire of ``lock`` waiting at most ``timeout`` s, in each library's words."""
    if contender == "ours":
        return bool(lock.acquire(blocking=True, timeout=timeout))
    if contender == "redis-py":
        return bool(lock.acquire(blocking=True, blocking_timeout=timeout))
    if contender == "python-redis-lock":
        return bool(lock.acquire(blocking=True, timeout=int(timeout)))
    raise ValueError(contender)


#: The contenders of the waiter benchmark (those with a blocking acquire).
WAITER_CONTENDERS = ("ours", "python-redis-lock", "redis-py")
