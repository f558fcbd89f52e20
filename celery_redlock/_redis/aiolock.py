"""The asyncio lock: :class:`celery_redlock.Lock`'s semantics for coroutines.

Same keys (:func:`~celery_redlock._redis.keys.keys_for`), owner tokens
(:mod:`~celery_redlock._redis.owner`) and Lua scripts (:mod:`~celery_redlock._redis.scripts`) as
the thread lock, so an asyncio holder, a thread holder and a Celery task on one name exclude
each other, and their fencing tokens increase across them (on one deployment all are read from
the server clock, on a quorum from one counter). Renewal is an asyncio task of the
holder's loop, not a thread: when the loop stops, renewal stops and the lease expires.

This module never imports Celery.

Hazards, as timelines:

1. Cancelled during the acquire script. (a) A task sends the acquire script; (b) Redis runs it,
   the key is now A's; (c) A is cancelled before reading the reply, and redis-py drops the
   connection. Nobody knows the key is held until its TTL runs out, so the cancelled attempt
   sends an owner-checked release of the token it tried (harmless if it did not win).
2. Cancelled just after winning. (a) A blocking acquire wins; (b) the task is cancelled while
   closing its pub/sub connection, before ``acquire`` returns ``True``. :meth:`Lock.acquire`
   releases whatever it took before letting the cancellation through.
3. Cancelled while holding. (a) ``async with lock:`` runs the body; (b) the task is cancelled;
   (c) ``__aexit__`` releases. Every release runs to completion even if the task is cancelled
   again meanwhile (the cancellation is re-raised after), so ``held`` and Redis agree.
4. Blocking acquire. (a) A holds; (b) B subscribes to the release channel, then tries again;
   (c) A releases and the release script publishes; (d) B wakes and tries again. Subscribing
   before the retry means a release in between is never missed; a holder that dies without
   releasing wakes B when its TTL runs out.
5. A dying loop. The renewal task dies with its loop; the lease then expires within ``ttl``.
   The renewal task holds only a weak reference to the lock, so an abandoned lock (dropped
   without release) stops being renewed too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Awaitable
from types import TracebackType
from typing import Any, TypeVar

import redis as redis_py

from ..exceptions import LockContended, LockLost, LockNotOwned, LockUnavailable
from . import keys as _keys
from . import owner as _owner
from .aionodes import nodes_for
from .clients import UNAVAILABLE_ERRORS
from .lock import DEGRADED_RENEWAL, Clock, check_arguments, check_limit
from .nodes import Extended, Target
from .scripts import AcquireResult

__all__ = ["Lock"]

logger = logging.getLogger("celery_redlock.lock")

T = TypeVar("T")


async def finish(aw: Awaitable[T]) -> T:
    """Await ``aw`` to its end even if the caller is cancelled meanwhile; then re-raise the
    cancellation. (A cancellation of ``aw`` itself, by a loop shutting down, propagates.)"""
    task = asyncio.ensure_future(aw)
    cancelled = False
    while not task.done():
        try:
            await asyncio.wait((task,))
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return task.result()


class Lock:
    """An expiring Redis lock for asyncio code that only its holder can release.

    The parameters are those of :class:`celery_redlock.Lock`: ``redis`` is a URL, a
    ``redis.asyncio`` client, or a list of 3, 5, ... of them for a Redlock quorum.

    ``async with`` raises :class:`LockContended` when it cannot acquire in time and releases
    on exit, also when the body is cancelled (a lock lost meanwhile is not an error on exit).
    """

    def __init__(
        self,
        redis: Target,
        name: str,
        ttl: float = 30.0,
        *,
        prefix: str = "redlock",
        owner: str = "",
        host: str | None = None,
        blocking: bool = True,
        timeout: float | None = None,
        auto_renew: bool = False,
        max_hold: float | None = None,
        limit: int = 1,
        clock: Clock = time.monotonic,
    ) -> None:
        check_arguments(ttl, max_hold, timeout, limit)
        self.nodes = nodes_for(redis)
        if limit > 1:  # the node names are read only here (building them costs a URL parse)
            check_limit(limit, self.nodes.names)
        self.name = name
        self.limit = limit
        self.keys = _keys.keys_for(prefix, name, limit)
        self.ttl = float(ttl)
        self.owner = owner
        self.host = host
        self.blocking = blocking
        self.timeout = timeout
        self.auto_renew = auto_renew
        self.max_hold = max_hold
        self.clock = clock
        self._token: str | None = None
        self._slot: str | None = None
        self._fencing_token: int | None = None
        self._acquired_at = 0.0
        self._expires_at = 0.0
        self._lost = False
        self._renewer: asyncio.Task[None] | None = None
        #: The holder seen by the last failed attempt (``None`` if it was not contended).
        self.last_holder: _owner.Owner | None = None
        #: Remaining TTL in seconds of that holder's lock, when the attempt failed.
        self.last_holder_ttl: float | None = None

    # -- public API: validate, then delegate to do_* ------------------------------------------

    @property
    def key(self) -> str:
        """The Redis key of this lock: the slot held, or the first slot when not held."""
        return self._slot or self.keys.lock

    @property
    def fencing_token(self) -> int | None:
        """Strictly increasing number of the current acquisition (``None`` if not held)."""
        return self._fencing_token

    @property
    def token(self) -> str | None:
        """The owner token stored in Redis while held."""
        return self._token

    @property
    def held(self) -> bool:
        """True between a successful acquire and release, unless the lock was lost."""
        return self._token is not None and not self._lost

    @property
    def lost(self) -> bool:
        """True once the lock was found expired or owned by someone else while held."""
        return self._lost

    async def acquire(self, blocking: bool | None = None, timeout: float | None = None) -> bool:
        """Take the lock; return whether it was taken.

        Non-blocking: one round trip. Blocking: wait for a release notification or the holder's
        expiry, at most ``timeout`` seconds (``None``: the instance default, which may be
        forever). Raises :class:`LockUnavailable` when Redis does not answer. Cancelling the
        waiting task gives up cleanly: nothing stays held (hazards 1 and 2).
        """
        if self._token is not None:
            raise RuntimeError(f"lock {self.key} is already acquired by this object")
        blocking = self.blocking if blocking is None else blocking
        timeout = self.timeout if timeout is None else timeout
        if timeout is not None and timeout < 0:
            raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout!r}")
        try:
            if not blocking or timeout == 0:
                return await self._attempt()
            return await self.do_wait(timeout)
        except BaseException:
            if self._token is not None:  # taken, but the caller will never know: give it back
                await self._abandon(self._token)
            raise

    async def release(self, keep: float = 0) -> None:
        """Release the lock. Raises :class:`LockNotOwned` if it is not held by this object.

        ``keep`` > 0 keeps the key held for that many more seconds instead of deleting it.
        A lock that expired or changed owner meanwhile is left alone (the owner check) and
        :class:`LockLost` is raised. The release runs to its end even if the calling task is
        cancelled meanwhile (the cancellation is re-raised after).
        """
        token = self._token
        if token is None:
            raise LockNotOwned(f"cannot release {self.key}: not acquired", key=self.key)
        if keep < 0:
            raise ValueError(f"keep must be >= 0 seconds, got {keep!r}")
        self._stop_renewal()
        try:
            released = await finish(self.do_release(token, keep))
        except BaseException:
            self._token = None
            raise
        if not released:
            self._mark_lost("it was no longer held by this owner at release")
            self._token = None
            raise LockLost(f"lock {self.key} expired or changed owner before release", key=self.key)
        self._token = None

    async def extend(self, ttl: float | None = None) -> None:
        """Reset the remaining TTL to ``ttl`` seconds (default: the lock's ttl), owner-checked.

        Raises :class:`LockNotOwned` if not acquired, :class:`LockLost` if Redis says another
        owner (or nobody) holds the key now.
        """
        token = self._token
        if token is None or self._lost:
            raise LockNotOwned(f"cannot extend {self.key}: not held", key=self.key)
        ttl = self.ttl if ttl is None else ttl
        if ttl <= 0:
            raise ValueError(f"extend ttl must be positive, got {ttl!r}")
        start = self.clock()
        if not (await self.do_extend(token, ttl)).held:
            self._mark_lost("extend found it expired or owned by someone else")
            raise LockLost(f"lock {self.key} was lost before extend", key=self.key)
        self._expires_at = start + ttl

    async def locked(self) -> bool:
        """Whether anyone holds the key right now (on a majority, for a quorum)."""
        return await self.nodes.pttl_ms(self.key) != -2

    async def remaining_ttl(self) -> float | None:
        """Seconds until the key expires, from Redis; ``None`` if it does not exist."""
        pttl = await self.nodes.pttl_ms(self.key)
        return None if pttl < 0 else pttl / 1000.0

    async def __aenter__(self) -> Lock:
        if not await self.acquire():
            holder = self.last_holder.task_id if self.last_holder else None
            raise LockContended(
                f"could not acquire {self.key} within {self.timeout}s",
                key=self.key,
                holder=holder,
                ttl=self.last_holder_ttl,
            )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._token is None:
            return
        with contextlib.suppress(LockLost):
            await self.release()

    def __repr__(self) -> str:
        state = "lost" if self._lost else "held" if self._token else "free"
        return f"<asyncio Lock {self.key} {state} fencing_token={self._fencing_token}>"

    # -- override points ------------------------------------------------------------------------

    async def do_acquire(self, token: str, ttl: float) -> AcquireResult:
        """One acquisition attempt on Redis."""
        return await self.nodes.acquire(self.keys, token, _ms(ttl))

    async def do_release(self, token: str, keep: float = 0) -> bool:
        """Owner-checked delete (or expiry in ``keep`` s); False when it was not ours any more."""
        return await self.nodes.release(self.keys, token, _ms(keep) if keep > 0 else 0)

    async def do_extend(self, token: str, ttl: float) -> Extended:
        """Owner-checked ``PEXPIRE``: whether the key is still ours, and on every node."""
        return await self.nodes.extend(self.keys, token, _ms(ttl))

    async def do_wait(self, timeout: float | None) -> bool:
        """Blocking acquire: retry on each release notification or holder expiry (hazard 4).

        If the node carrying the notifications stops answering, subscribe again (to another
        node of a quorum); a single node that is down raises :class:`LockUnavailable` from the
        next attempt.
        """
        deadline = None if timeout is None else self.clock() + timeout
        while True:
            if await self._attempt():
                return True
            if deadline is not None and deadline <= self.clock():
                return False
            pubsub = (await self.nodes.pubsub_client()).pubsub()
            try:
                await _subscribe(pubsub, self.keys.channel)
                while True:
                    if await self._attempt():
                        return True
                    wait = self.last_holder_ttl if self.last_holder_ttl is not None else 1.0
                    if deadline is not None:
                        left = deadline - self.clock()
                        if left <= 0:
                            return False
                        wait = min(wait, left)
                    await pubsub.get_message(
                        ignore_subscribe_messages=True, timeout=max(wait, 0.001)
                    )
            except UNAVAILABLE_ERRORS:
                continue
            finally:
                await finish(pubsub.aclose())

    def on_lost(self, reason: str) -> None:
        """Called once when the lock is found lost; logs an ERROR. Override to react."""
        logger.error(
            "lock %s lost (token %s…, fencing token %s): %s",
            self.key,
            (self._token or "")[:8],
            self._fencing_token,
            reason,
        )

    # -- renewal --------------------------------------------------------------------------------

    async def renew_step(self) -> float | None:
        """One renewal: extend by the lease, capped at ``max_hold``.

        Returns the delay until the next renewal, or ``None`` when renewal should stop (released,
        lost, or the ``max_hold`` cap reached). A connection error, an error reply or no reply
        is retried until the last confirmed expiry has passed; then the lock is lost. A reply
        is awaited only until then.
        """
        token = self._token
        if token is None or self._lost:
            return None
        now = self.clock()
        ttl = self.ttl
        if self.max_hold is not None:
            ttl = min(ttl, self._acquired_at + self.max_hold - now)
            if ttl <= 0.001:
                return None
        try:
            # No reply after the lease's end is no use: by then another owner may exist.
            left = max(self._expires_at - now, 0.001)
            extended = await asyncio.wait_for(self.do_extend(token, ttl), left)
        except (LockUnavailable, redis_py.exceptions.ResponseError, asyncio.TimeoutError) as exc:
            if self._token != token:
                return None
            if self.clock() >= self._expires_at:
                detail = str(exc) or "no reply"
                self._mark_lost(f"Redis unreachable until the lease ran out ({detail})")
                return None
            logger.warning("lock %s: renewal failed, retrying: %s", self.key, exc or "no reply")
            return min(self.ttl / 3, max(self._expires_at - now, 0.0) / 2, 1.0)
        if self._token != token:  # released while the extend was in flight
            return None
        if not extended.held:
            self._mark_lost("renewal found it expired or owned by someone else")
            return None
        self._expires_at = now + ttl
        if not extended.complete:
            return min(self.ttl / 3, max(DEGRADED_RENEWAL, self.ttl / 30))
        return self.ttl / 3

    def _start_renewal(self) -> None:
        self._renewer = asyncio.get_running_loop().create_task(
            _renew(weakref.ref(self), self.ttl / 3), name=f"celery-redlock renewal {self.key}"
        )

    def _stop_renewal(self) -> None:
        renewer, self._renewer = self._renewer, None
        if renewer is not None and renewer is not asyncio.current_task():
            renewer.cancel()

    # -- internals ------------------------------------------------------------------------------

    async def _attempt(self) -> bool:
        token = _owner.new_token(self.owner, self.host)
        ttl = self.ttl if self.max_hold is None else min(self.ttl, self.max_hold)
        start = self.clock()
        try:
            result = await self.do_acquire(token, ttl)
        except asyncio.CancelledError:  # the script may have run, its reply is lost (hazard 1)
            await self._abandon(token)
            raise
        if not result.acquired:
            self.last_holder = _owner.parse(result.holder)
            pttl = result.pttl_ms
            self.last_holder_ttl = None if pttl is None or pttl < 0 else pttl / 1000.0
            return False
        self._token = token
        self._slot = self.keys.slots[(result.slot or 1) - 1]
        self._fencing_token = result.fencing_token
        self._acquired_at = start
        self._expires_at = start + ttl
        self._lost = False
        self.last_holder = None
        self.last_holder_ttl = None
        if self.auto_renew:
            self._start_renewal()
        return True

    async def _abandon(self, token: str) -> None:
        """Give back whatever ``token`` may hold, to the end, errors aside."""
        self._stop_renewal()
        if self._token == token:
            self._token = None
        with contextlib.suppress(Exception):
            await finish(self.do_release(token))

    def _mark_lost(self, reason: str) -> None:
        if self._lost:
            return
        self._lost = True
        self._stop_renewal()
        self.on_lost(reason)


async def _subscribe(pubsub: Any, channel: str) -> None:
    """Subscribe and wait for the server's confirmation: only then is a release that follows
    our next attempt sure to reach us (the attempt runs on another connection, which the
    server may serve before a SUBSCRIBE still in flight)."""
    await pubsub.subscribe(channel)
    while True:
        message = await pubsub.get_message(timeout=SUBSCRIBE_TIMEOUT)
        if message is None:
            raise redis_py.exceptions.TimeoutError(f"no SUBSCRIBE confirmation for {channel}")
        if message["type"] == "subscribe":
            return


async def _renew(ref: weakref.ref[Lock], delay: float | None) -> None:
    """Renew the lock behind ``ref`` as long as it asks; stop when it is collected (hazard 5)."""
    while delay is not None:
        await asyncio.sleep(delay)
        lock = ref()
        if lock is None:
            return
        try:
            delay = await lock.renew_step()
        except Exception:
            logger.exception("lock %s: renewal failed unexpectedly; renewal stopped", lock.key)
            return
        del lock  # no strong reference while sleeping


#: Seconds to wait for the server to confirm a SUBSCRIBE before subscribing again.
SUBSCRIBE_TIMEOUT = 5.0


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))
