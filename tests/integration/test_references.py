"""What the locks keep alive: nothing of yours past its use.

A helper probe (round 3) built a client per request, as a web app may: every client stayed
for good, with its pool and, unless closed, its socket and server connection (2,000 requests,
2,000 server connections); an ``asyncio.run()`` per call whose lock waited kept its closed
event loop (300 calls, 300 loops). The tables that remember what a client or a loop has
learned held weak keys whose values referred back to the key.
"""

from __future__ import annotations

import asyncio
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
