"""The asyncio lock: ``await``-able acquire, release and extend, and ``async with``.

:class:`Lock` takes the arguments of :class:`celery_redlock.Lock` (a URL, a ``redis.asyncio``
client, or a list of them for a quorum) and shares its keys, owner tokens, scripts and fencing
counter, so an asyncio holder and a Celery task (or a thread) on one name exclude each other::

    from celery_redlock.asyncio import Lock

    async def rebuild_once() -> None:
        async with Lock("redis://localhost:6379/0", "rebuild:homepage", ttl=10, timeout=5):
            await rebuild_homepage()

A blocking acquire waits for the release notification, not by polling; renewal
(``auto_renew=True``) is an asyncio task of the holder's loop; cancelling a waiting or holding
task gives the lock back. Importing this module does not import Celery.

:func:`wait_released` belongs in an ASGI app's lifespan shutdown: a server that cancels its
handlers at a graceful-shutdown timeout and then exits on SIGTERM (uvicorn) ends the process
before the cancelled handlers' releases reach Redis otherwise::

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        await wait_released()  # at most 5 s
"""

from __future__ import annotations

from ._redis.aiolock import Lock
from ._redis.aionodes import wait_released

__all__ = ["Lock", "wait_released"]
