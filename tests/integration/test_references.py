"""What the locks keep alive: nothing of yours past its use.

A helper probe (round 3) built a client per request, as a web app may: every client stayed
for good, with its pool and, unless closed, its socket and server connection (2,000 requests,
2,000 server connections); an ``asyncio.run()`` per call whose lock waited kept its closed
event loop (300 calls, 300 loops). The tables that remember what a client or a loop has
learned held weak keys whose values referred back to the key.
"""

from __future__ import annotations

import asyncio
import copy
import gc
import weakref
from typing import Any

import redis as redis_py
import redis.asyncio as aioredis

from celery_redlock import Lock
from celery_redlock.asyncio import Lock as AsyncLock
from celery_redlock.testing import RedisServer


def test_a_client_of_yours_goes_once_you_drop_it_after_a_wait(redis_server: RedisServer) -> None:
    held = Lock(redis_server.url, "refs-sync", ttl=30)
    assert held.acquire()
    gone: list[weakref.ref[Any]] = []
    for _ in range(3):
        client = redis_py.Redis(port=redis_server.port)
        gone.append(weakref.ref(client))
        waiter = Lock(client, "refs-sync", ttl=30)
        assert not waiter.acquire(timeout=0.05)  # subscribed, waited, gave up
        free = Lock(client, "refs-sync-free", ttl=30)
        with free:
            pass
        client.close()
        del client, waiter, free
    held.release()
    gc.collect()
    assert [ref() for ref in gone] == [None, None, None]


def test_an_asyncio_client_of_yours_goes_once_you_drop_it_after_a_wait(
    redis_server: RedisServer,
) -> None:
    async def main() -> list[weakref.ref[Any]]:
        held = AsyncLock(redis_server.url, "refs-async", ttl=30)
        assert await held.acquire()
        gone: list[weakref.ref[Any]] = []
        for _ in range(3):
            client = aioredis.Redis(port=redis_server.port)
            gone.append(weakref.ref(client))
            waiter = AsyncLock(client, "refs-async", ttl=30)
            assert not await waiter.acquire(timeout=0.05)
            await client.aclose()
            del client, waiter
        await held.release()
        gc.collect()
        return gone  # checked while the loop still runs

    gone = asyncio.run(main())
    assert [ref() for ref in gone] == [None, None, None]


def test_an_event_loop_goes_with_its_asyncio_run(redis_server: RedisServer) -> None:
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def call(wait: bool) -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        lock = AsyncLock(redis_server.url, "refs-loop", ttl=30)
        if wait:  # the key is held: the lock subscribes and waits
            assert not await lock.acquire(timeout=0.05)
        else:
            async with lock:
                pass

    held = Lock(redis_server.url, "refs-loop", ttl=30)
    for wait in (False, True, True):
        if wait:
            assert held.acquire()
        asyncio.run(call(wait))
        if wait:
            held.release()
    gc.collect()
    assert [ref() for ref in loops] == [None, None, None]


def test_a_copy_of_a_client_locks_where_the_copy_points(redis_server: RedisServer) -> None:
    """What a lock learned of a client is kept on the client; a copy carried the original's,
    and locked on the original's server."""
    original = redis_py.Redis(port=redis_server.port)
    with Lock(original, "refs-copy", ttl=30):
        pass
    with RedisServer() as other:
        moved = copy.copy(original)
        moved.connection_pool = redis_py.ConnectionPool(port=other.port)
        with Lock(moved, "refs-copy", ttl=30) as lock:
            assert other.client().exists(lock.keys.lock)
            assert not original.exists(lock.keys.lock)
        moved.close()
    original.close()


class Unhashable(aioredis.Redis):
    """A client class of yours that compares by value (and so has no hash)."""

    def __eq__(self, other: object) -> bool:
        return self is other


def test_an_unhashable_asyncio_client_keeps_one_subscription_connection() -> None:
    """Each wait on such a client got a hub, and a subscription connection, of its own. (A
    server of its own: other tests' idle subscriptions would be counted.)"""
    with RedisServer() as server:
        # One; two while a connection idle for longer than IDLE_REUSE (a loaded machine) is
        # closing beside its successor. It was one per wait: five.
        assert asyncio.run(waits_on_an_unhashable_client(server)) <= 2


async def waits_on_an_unhashable_client(server: RedisServer) -> int:
    """Subscribed connections on ``server`` after five waits on one unhashable client."""
    admin = server.client()

    def subscribed() -> int:
        return sum(1 for c in admin.client_list() if int(c["sub"]) > 0)

    client = Unhashable(port=server.port)
    held = AsyncLock(client, "refs-unhashable", ttl=30)
    assert await held.acquire()
    for _ in range(5):
        assert not await AsyncLock(client, "refs-unhashable", ttl=30).acquire(timeout=0.05)
    await held.release()
    count = subscribed()
    await client.aclose()
    return count
