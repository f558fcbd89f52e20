"""The asyncio lock: :class:`celery_redlock.Lock`'s semantics for coroutines.

Same keys (:func:`~celery_redlock._redis.keys.keys_for`), owner tokens
(:mod:`~celery_redlock._redis.owner`) and Lua scripts (:mod:`~celery_redlock._redis.scripts`) as
the thread lock, so an asyncio holder, a thread holder and a Celery task on one name exclude
each other, and their fencing tokens increase across them (on one deployment all are read from
the server clock, on a quorum from one counter). Renewal is an asyncio task of the
holder's loop, not a thread: when the loop stops, renewal stops and the lease expires.

This module never imports Celery.

Hazards, as timelines (the thread lock's, :mod:`~celery_redlock._redis.lock`, where they apply
to threads too):

1. Cancelled during the acquire script. (a) A sends the acquire; (b) A is cancelled before
   the reply; (c) Redis runs it, and the key is A's. The cancellation is raised at once; the
   command runs to its reply in a task of its own, and what the reply says it took is given
   back after it (:meth:`Lock._reply`); a reply that never comes is a lost one (7). A
   give-back sent at once on another connection could run first.
2. Cancelled just after winning. (a) A blocking acquire wins; (b) the task is cancelled before
   ``acquire`` returns ``True``. :meth:`Lock.acquire` gives back what it took before letting
   the cancellation through.
3. Cancelled while holding. (a) ``async with lock:`` runs the body; (b) the task is cancelled;
   (c) ``__aexit__`` releases. A release runs to its end even if the task is cancelled again
   meanwhile (the cancellation is re-raised after), so ``held`` and Redis agree.
4. Blocking acquire. (a) A holds; (b) B subscribes to the release channel, then tries again;
   (c) A releases and the release script publishes; (d) B wakes and tries again. Subscribing
   before the retry means a release in between is never missed; a holder that dies without
   releasing wakes B when its TTL runs out.
5. A dying loop. The renewal task dies with its loop; the lease then expires within ``ttl``.
   The renewal task holds only a weak reference to the lock, so an abandoned lock (dropped
   without release) stops being renewed too. Background give-backs (1, 7) and the leaves of
   cancelled waiters outlive the cancellation of every task by a loop's shutdown
   (``asyncio.run`` after Ctrl-C): each is tried once more at once, and the shutdown waits for
   it (:func:`~celery_redlock._redis.aionodes.in_background`); a loop closed without shutting
   down drops them, and their keys expire by their TTL.
6. A swallowed cancellation. A client call can catch the ``CancelledError`` meant for the
   caller and return normally; the caller would then go on as if it had not been cancelled.
   Every call is settled (:func:`settle`): a cancellation asked meanwhile is raised after it.
7. A lost reply. (a) A's attempt is sent; (b) the server stops answering past the socket
   timeout, and A raises :class:`LockUnavailable`; (c) the server resumes and runs the
   attempt: the key is held by nobody until its TTL. The token is given back in a background
   task until two releases in a row were answered
   (:class:`~celery_redlock._redis.core.GiveBack`). On a quorum, a release a frozen node did
   not answer is given back to that node the same way (``aionodes.Quorum.release``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import sys
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from .aionodes import (
    Nodes,
    SingleNode,
    as_planned,
    cleaning,
    give_back,
    guarded,
    holding,
    in_background,
    keep,
    loop_hubs,
    nodes_for,
    stopping,
)
from .core import (
    SUBSCRIBED,
    Closing,
    Extended,
    GiveBack,
    LockCore,
    Op,
    Run,
    classify,
    lost_reply,
    ms,
)
from .nodes import Target
from .scripts import AcquireResult, WaitReply

__all__ = ["Lock"]

logger = logging.getLogger("celery_redlock.lock")

T = TypeVar("T")


async def finish(make: Callable[[], Awaitable[T]]) -> T:
    """Await ``make()`` to its end even if the caller is cancelled meanwhile; then re-raise
    the cancellation. A loop shutting down that cancels ``make()`` itself runs it once more
    and waits for that (:func:`~celery_redlock._redis.aionodes.guarded`); the cancellation
    propagates. Within a clean-up (:func:`~celery_redlock._redis.aionodes.cleaning`), the
    clean-up is what the shutdown runs again; in one run again by the shutdown, a cancellation
    ends it: the shutdown gives up on Redis
    (:func:`~celery_redlock._redis.aionodes.in_background`)."""
    task = asyncio.ensure_future(make()) if cleaning() else guarded(make)
    cancelled = False
    while not task.done():
        try:
            await asyncio.wait((task,))
        except asyncio.CancelledError:
            if stopping():
                task.cancel()
            cancelled = True
    if cancelled:
        if not task.cancelled():
            task.exception()  # the caller gets its cancellation: this is no error left unseen
        raise asyncio.CancelledError
    return task.result()


async def settle(aw: Awaitable[T], late: Callable[[T], Awaitable[object]] | None = None) -> T:
    """Await ``aw``, and raise :class:`asyncio.CancelledError` if the caller was cancelled
    meanwhile, even if ``aw`` swallowed the cancellation (hazard 6); ``late(result)`` then
    undoes what ``aw`` did.

    With ``late`` (``aw`` takes something: a lock, a queue place, a subscription), ``aw`` runs
    in a task of its own that a cancellation never reaches: the caller's wait raises at once,
    and ``aw`` runs to its reply in the background, where ``late`` undoes it. Cancelling
    ``aw`` itself would not unsend its command: the command can leave the client's buffer
    after the caller's own give-back went out on another connection:

    1. the acquire is written to connection 1's buffer; the caller is cancelled;
    2. the caller gives back on connection 2, and Redis runs it first (nothing to delete);
    3. connection 1 flushes as it closes, and Redis runs the acquire: the key stays held until
       its TTL, by nobody.

    Waiting for the reply orders the undo after the command. Without ``late``, from Python 3.11
    the task counts the cancellations asked of it (``cancelling()``), so a dropped one is seen
    after ``aw`` returns; before, ``aw`` runs in a task of its own, the cancellation lands on
    the wait for it and is raised at once, and ``aw`` is cancelled.
    """
    if _COUNTS_CANCELS and late is None:
        asked = _cancels()
        result = await aw
        if _cancels() > asked:
            raise asyncio.CancelledError
        return result
    task = asyncio.ensure_future(aw)
    try:
        await asyncio.wait((task,))
    except asyncio.CancelledError:
        if late is None:
            task.cancel()
        else:
            keep(task)
            task.add_done_callback(functools.partial(_undo, late))
        raise
    return task.result()


def _undo(late: Callable[[T], Awaitable[object]], task: asyncio.Future[T]) -> None:
    """Done-callback of a call the caller gave up on: pass its result to ``late``."""
    if not task.cancelled() and task.exception() is None:
        in_background(functools.partial(late, task.result()))


#: Tasks count the cancellations asked of them (``Task.cancelling()``, Python >= 3.11).
_COUNTS_CANCELS = sys.version_info >= (3, 11)


def _asyncio_loop() -> None:
    """Refuse a caller outside an asyncio event loop, naming what to use instead. Timeline
    without: (1) ``trio.run`` (or anyio's trio backend) awaits ``acquire()``; (2) it failed
    with "no running event loop", which does not say that trio is not supported, and the
    object stayed "acquiring": its next ``acquire()`` was refused."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError(
            "celery_redlock.asyncio.Lock runs in an asyncio event loop, and none is running "
            "here (trio, or anyio's trio backend, is not supported): use celery_redlock.Lock "
            "in a worker thread (trio.to_thread.run_sync, anyio.to_thread.run_sync)"
        ) from None


def _cancels() -> int:
    """How many cancellations the current task was asked (Python >= 3.11; 0 before).

    A cancellation dropped on the way is one more than when the call began: not any count
    above 0, which stays so for the rest of a task that was cancelled once. Timeline with
    "above 0": (1) a task is cancelled, catches ``CancelledError`` and cleans up; (2) its
    cleanup takes a free lock (``async with lock:``); (3) the acquire takes it, sees the old
    cancellation, gives it back and raises ``CancelledError``: the cleanup can never lock.
    """
    task = asyncio.current_task()
    return 0 if task is None else getattr(task, "cancelling", lambda: 0)()


class Lock(LockCore):
    """An expiring Redis lock for asyncio code that only its holder can release.

    The parameters are those of :class:`celery_redlock.Lock`: ``redis`` is a URL, a
    ``redis.asyncio`` client (or a ``valkey.asyncio`` one), or a list of 3, 5, ... of them for
    a Redlock quorum. The decisions are :class:`~celery_redlock._redis.core.LockCore`'s, as
    the thread lock's; this class awaits what they ask for.

    ``async with`` raises :class:`LockContended` when it cannot acquire in time and releases
    on exit, also when the body is cancelled (a lock lost meanwhile is not an error on exit).
    """

    nodes: Nodes
    _renewer: asyncio.Task[None] | None = None
    #: The end of a renewal of another thread's loop, stopped by a release (:meth:`release`).
    _renewal_ending: concurrent.futures.Future[None] | None = None
    #: The extend of the renewal step under way, if any (:func:`_ended`).
    _extending: asyncio.Future[Extended] | None = None
    _kind = "asyncio Lock"

    def _connect(self, redis: Target) -> Nodes:
        return nodes_for(redis)

    # -- public API: validate, then delegate to do_* ------------------------------------------

    @property
    def fencing_token(self) -> int | None:
        """Strictly increasing number of the current acquisition (``None`` if not held, or once
        :attr:`lost`).

        Read by the acquisition itself (a property cannot wait for Redis), where the thread
        lock reads it on first use. So it is the number the lock was taken with even if the
        key was deleted or taken over since: (1) A acquires, with number 7; (2) an operator
        deletes the key; (3) ``fencing_token`` is still 7 until a renewal, an extend or the
        release finds the key gone (then :attr:`lost`), or the lease ends by :attr:`clock`.
        A fenced store refuses a stale 7 once a later holder wrote 8, which is what fencing
        is for."""
        return None if self.lost or self._forked() else self._fencing_token

    @property
    def last_holder_ttl(self) -> float | None:
        """Remaining TTL in seconds of :attr:`last_holder`'s lock, when the attempt failed."""
        return self._holder_ttl

    async def acquire(self, blocking: bool | None = None, timeout: float | None = None) -> bool:
        """Take the lock; return whether it was taken.

        Non-blocking: one round trip. Blocking: wait for the lock to be handed over (or a
        release notification, or the holder's expiry), at most ``timeout`` seconds (``None``:
        the instance default, which may be forever). Raises :class:`LockUnavailable` when
        Redis does not answer. Cancelling the waiting task gives up at once and cleanly: the
        cancellation is raised without waiting for Redis, and what the acquire may have taken
        is given back in the background (hazards 1, 2 and 6). A blocking acquire over an asyncio
        Cluster client raises :class:`ValueError`: it has no pub/sub to wait with.
        """
        _asyncio_loop()
        timeout = self._acquire_mode(blocking, timeout)
        asked = _cancels()
        try:
            if timeout == -1.0:
                taken = await self._attempt()
            else:
                self.nodes.check_wait()
                taken = await self.do_wait(timeout)
            if _cancels() > asked:  # a cancellation dropped on the way (hazard 6)
                raise asyncio.CancelledError
            if taken:
                holding(self)
            return taken
        except BaseException as exc:
            token = self._token
            if token is not None:  # taken, but the caller will never know: give it back
                if isinstance(exc, asyncio.CancelledError):
                    self._give_back_later(token)
                else:
                    await self._give_back(token)
            raise
        finally:
            self._acquiring = False

    async def release(self, keep: float = 0) -> None:
        """Release the lock. Raises :class:`LockNotOwned` if it is not held by this object.

        ``keep`` > 0 keeps the key held for that many more seconds instead of deleting it;
        blocking waiters are woken all the same, and try when it ends.
        A lock that expired or changed owner meanwhile is left alone (the owner check) and
        :class:`LockLost` is raised. The release runs to its end even if the calling task is
        cancelled meanwhile (the cancellation is re-raised after).
        """
        token = self._release_token(keep)  # the renewal stopped
        ending, self._renewal_ending = self._renewal_ending, None
        self._released(await finish(functools.partial(self._release_after, ending, token, keep)))

    async def _release_after(
        self, ending: concurrent.futures.Future[None] | None, token: str, keep: float
    ) -> bool:
        """Release once a renewal of another thread's loop has ended (at most until the lease
        ends: a loop that does not run meanwhile sends nothing of it before then).

        Timeline otherwise, on a quorum (loops in two threads run at once): (1) loop A's
        renewal is due and starts its extend, which re-asserts the key where it is missing;
        (2) loop B's release asks A to cancel it and sends its deletes at once; (3) A's extend
        reaches a node after the delete there, and writes the key again: held by nobody for a
        lease. On one loop the renewal's commands leave before the release's, or not at all.
        """
        left = self._expires_at - self.clock()
        if ending is not None and left > 0:
            await asyncio.wait((asyncio.wrap_future(ending),), timeout=left)
        return await self.do_release(token, keep)

    async def extend(self, ttl: float | None = None) -> None:
        """Reset the remaining TTL to ``ttl`` seconds (default: the lock's ttl), owner-checked.

        Raises :class:`LockNotOwned` if not acquired (or released by another thread or task
        while the extend was on its way), :class:`LockLost` if Redis says another owner (or
        nobody) holds the key now, the lock was found so before (:attr:`lost`), or it reached
        ``max_hold``.
        """
        token, ttl = self._extend_args(ttl)
        start = self.clock()
        self._extended(token, await settle(self.do_extend(token, ttl)), start, ttl)

    async def locked(self) -> bool:
        """Whether anyone holds the lock right now: its key (on a majority, for a quorum), or
        any slot of a semaphore. :class:`LockUnavailable` when Redis (a majority of a quorum's
        nodes) does not answer: a silent node may hold it."""
        for key in self._observed:
            if await self.nodes.pttl_ms(key) != -2:
                return True
        return False

    async def remaining_ttl(self) -> float | None:
        """Seconds until the key expires, from Redis; ``None`` if it does not exist. For a
        semaphore: the slot this object holds, or else the held slot that expires first."""
        pttls = [await self.nodes.pttl_ms(key) for key in self._observed]
        held = [pttl for pttl in pttls if pttl >= 0]
        return min(held) / 1000.0 if held else None

    async def __aenter__(self) -> Lock:
        if not await self.acquire():
            raise self._contended(self.last_holder_ttl)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._token is None or self._forked():
            return  # a forked child leaves its parent's lock alone
        with self._leaving(raised=exc[0] is not None):
            await self.release()

    # -- override points ------------------------------------------------------------------------

    async def do_acquire(self, token: str, ttl: float) -> AcquireResult:
        """One acquisition attempt on Redis."""
        return await self.nodes.acquire(self.keys, token, ms(ttl), self._sole)

    async def do_release(self, token: str, keep: float = 0) -> bool:
        """Owner-checked delete (or expiry in ``keep`` s); False when it was not ours any more."""
        return await self.nodes.release(self.keys, token, ms(keep) if keep > 0 else 0)

    async def do_extend(self, token: str, ttl: float) -> Extended:
        """Owner-checked ``PEXPIRE``: whether the key is still ours, and on every node."""
        return await self.nodes.extend(self.keys, token, ms(ttl))

    async def do_wait(self, timeout: float | None) -> bool:
        """Blocking acquire (hazard 4): the requests of the core's wait
        (:meth:`~.core.LockCore._wait`), awaited, each call settled (hazard 6). The channel is
        subscribed through the loop's :class:`~celery_redlock._redis.subscriptions.Hub`;
        between tries the task awaits its inbox, a plain future (no polling, and a
        cancellation always lands)."""
        run = Run(self._wait(timeout))
        queue = cast(SingleNode, self.nodes)  # asked for queue operations only if it queues
        hub: Any = None
        channel = ""
        subscription: Any = None
        queued: tuple[str, str] | None = None  # (member, secret) of the last queued try
        for op, arg in run:
            try:
                if op is Op.ATTEMPT:
                    run.reply = await self._attempt()
                elif op is Op.QUEUED:
                    queued = arg[2], arg[3]
                    run.reply = await self._wait_attempt(queue, *arg)
                elif op is Op.HOLDER_TTL:
                    run.reply = self._holder_ttl
                elif op is Op.SUBSCRIBE:
                    channel, subscription = arg, None
                    client = await settle(self.nodes.pubsub_client(self.keys.lock))
                    hub = loop_hubs().of(client)
                elif op is Op.RECEIVE and subscription is None:
                    given_up: list[bool] = []  # its SUBSCRIBE, not yet sent, is then dropped
                    try:
                        subscription = await settle(
                            hub.subscribe(channel, lambda given_up=given_up: not given_up),
                            _unsubscribe_late,
                        )
                    except asyncio.CancelledError:
                        given_up.append(True)
                        raise
                    run.reply = SUBSCRIBED
                elif op is Op.RECEIVE:
                    run.reply = await subscription[1].get(arg)
                elif op is Op.EXTEND:
                    run.reply = await settle(self.do_extend(*arg))
                elif op is Op.FENCE:  # a property cannot await: read it now
                    self._fenced(arg, await settle(queue.fence(self.keys, self.key, arg)))
                elif op is Op.LEAVE:
                    run.reply = await settle(queue.leave(self.keys, *arg))
                elif op is Op.ABANDON:  # the wait was interrupted: not waiting for Redis
                    in_background(functools.partial(self._abandon, queue, *arg))
                elif op is Op.CLOSE:
                    if subscription is not None:
                        _unsubscribe(subscription)
                    if arg is Closing.STRANDED and queued is not None:  # its leave went unanswered
                        in_background(functools.partial(self._abandon, queue, *queued))
            except BaseException as exc:  # the core decides: thrown into the wait
                run.error = exc
        return run.result

    # -- renewal --------------------------------------------------------------------------------

    async def renew_step(self) -> float | None:
        """One renewal: extend by the lease, capped at ``max_hold``; the delay until the next
        one, or ``None`` to stop. Failures and the retry delay are the core's, as for the
        thread lock; the reply is awaited only until the lease ends."""
        plan = self._renewal()
        if plan is None:
            return None
        token, ttl, start, wait = plan
        call = self._extending = asyncio.ensure_future(self.do_extend(token, ttl))
        try:
            done, _ = await asyncio.wait((call,), timeout=wait)
        except GeneratorExit:  # a coroutine closed may not wait
            call.cancel()
            raise
        except BaseException:
            call.cancel()
            await asyncio.wait((call,))  # ended before the renewal is (_release_after)
            raise
        if not done:
            call.cancel()
            return self._renewal_failed(token, TimeoutError(f"no reply within {wait:.2f}s"))
        exc = call.exception()
        if exc is not None:
            if not isinstance(exc, Exception):
                raise exc
            return self._renewal_failed(token, exc)
        return self._renewed(token, start, ttl, call.result())

    def _start_renewal(self, delay: float) -> None:
        loop = asyncio.get_running_loop()
        self._renewer = loop.create_task(
            _renew(weakref.ref(self), loop.time() + delay),
            name=f"celery-redlock renewal {self.key}",
        )

    def _stop_renewal(self) -> None:
        """Cancel the renewal task, unless it is the caller, or its loop was closed (it never
        runs again; cancelling it there raises ``RuntimeError`` and would end a release in
        another loop after its token was dropped, the key left to its TTL). A renewal of a
        loop running in another thread is cancelled through that loop (``call_soon`` from
        another thread is not safe, and a loop in debug mode raises ``RuntimeError``: the
        release was never sent, and the renewal went on holding the key)."""
        renewer, self._renewer = self._renewer, None
        if renewer is None or renewer is asyncio.current_task():
            return
        loop = renewer.get_loop()
        with contextlib.suppress(RuntimeError):  # closed meanwhile: it never runs again
            if loop.is_closed():
                return
            if loop is _running_loop():
                renewer.cancel()
            elif loop.is_running():  # in another thread: its renewal may be under way
                ending = _ended(renewer, self._extending)
                self._renewal_ending = asyncio.run_coroutine_threadsafe(ending, loop)
            else:  # stopped: the cancellation comes first when it runs again
                loop.call_soon_threadsafe(renewer.cancel)

    # -- internals ------------------------------------------------------------------------------

    async def _attempt(self) -> bool:
        token = self._try_token()
        ttl = self._lease()
        start = self.clock()
        sent = asyncio.ensure_future(self.do_acquire(token, ttl))
        result = await self._reply(sent, token, lambda r: token if r.acquired else None)
        return self._result(token, start, ttl, result)

    async def _wait_attempt(
        self, queue: SingleNode, token: str, ttl_ms: int, member: str, secret: str
    ) -> WaitReply | None:
        """A queued waiter's try; cancelled, it gives back the lock the try took, and leaves
        the queue once its reply came. Timeline with the leave alone (the try re-sent after a
        ``NOSCRIPT``): (1) the try is on its way, and the waiter is cancelled; (2) its leaves
        are answered while the holder still holds the key; (3) the holder releases; (4) the
        try finds the key free and takes it; its leave does not know the try's token, and the
        key was held by nobody for its TTL, the next waiter waiting that long."""
        sent = asyncio.ensure_future(queue.wait_attempt(self.keys, token, ttl_ms, member, secret))
        return await self._reply(
            sent,
            token,
            lambda reply: None if reply is None else reply.held,
            lambda _: self._abandon(queue, member, secret),
        )

    async def _reply(
        self,
        sent: asyncio.Future[T],
        token: str,
        took: Callable[[T], str | None],
        after: Callable[[T], Awaitable[object]] | None = None,
    ) -> T:
        """The reply of the attempt ``sent`` of ``token`` (hazards 1, 6 and 7).

        Cancelled meanwhile, the caller raises at once, and the attempt runs to its reply in
        a task of its own, which a cancellation never reaches (it cannot unsend the command):
        the token its reply says it ``took`` is given back, as :class:`~.core.GiveBack`
        plans (:meth:`_give_back_later`), and then ``after(reply)`` runs; a reply lost, or
        cut by the loop's shutdown, gives ``token`` back the same way."""
        try:
            await asyncio.wait((sent,))
        except asyncio.CancelledError:
            keep(sent)
            self._give_back_later(token, sent, took)
            if after is not None:
                sent.add_done_callback(functools.partial(_undo, after))
            raise
        try:
            return sent.result()
        except Exception as exc:
            self._give_back_if_lost(exc, token)
            raise

    async def _abandon(self, queue: SingleNode, member: str, secret: str) -> None:
        """An interrupted or stranded wait: leave the queue, giving back a lock handed over
        meanwhile, until Redis answered twice in a row (:class:`~.core.GiveBack`'s plan: a
        queued try sent before the first answer may run after it, on another connection).
        The loop's subscription keeps the channel meanwhile: a release may hand the lock to
        this waiter, and the leave gives it back."""

        async def leave() -> None:
            held = await finish(functools.partial(queue.leave, self.keys, member, secret))
            if held is not None:
                await self._give_back(held)

        # At once, then at least every second: a lock handed over meanwhile waits for it.
        plan = GiveBack(self.key, time.monotonic(), "a queued wait")
        await as_planned(plan, leave, delay=0.0)

    async def _give_back(self, token: str) -> None:
        """Give back whatever ``token`` may hold, to the end, errors aside."""
        self._drop(token)
        with contextlib.suppress(Exception):
            await finish(functools.partial(self.do_release, token))

    def _give_back_later(
        self,
        token: str,
        sent: asyncio.Future[T] | None = None,
        took: Callable[[T], str | None] | None = None,
    ) -> None:
        """:meth:`_give_back` for a cancelled caller: forget ``token`` now, and release it in
        the background, so that the cancellation is raised without waiting for Redis; as
        :class:`~.core.GiveBack` plans, until two releases in a row were answered.
        Timeline with one release: (1) the acquisition is sent, the server freezes; (2) the
        caller is cancelled; its release waits, and fails; (3) the server resumes and runs the
        acquisition: the key is held by nobody until its TTL.

        ``sent``: the attempt still on its way. The plan waits for its reply, and releases the
        token the reply says it ``took``, and nothing if it took none; a reply lost, or cut
        by the loop's shutdown, releases ``token``. Timeline of releases sent at once beside
        the reply: (1) a hundred callers try a held lock, each under
        ``asyncio.timeout(0.005)``, and are cancelled; (2) each sent two releases at once and
        one more after its reply, which said it took nothing; (3) thousands of releases queued
        for the connection pool, and the holder's release waited two seconds behind them for
        a connection: its waiter starved."""
        self._drop(token)

        async def release() -> None:
            held = token
            if sent is not None and took is not None:
                await asyncio.wait((sent,))
                if not sent.cancelled() and sent.exception() is None:
                    taken = took(sent.result())
                    if taken is None:
                        return  # its reply says it took nothing
                    held = taken
            if self.nodes.gives_back_per_node:  # a quorum gives back to each node itself
                await self._give_back(held)
            else:
                self._drop(held)
                await finish(functools.partial(self.do_release, held))

        if self.nodes.gives_back_per_node:
            in_background(release)
            return
        plan = GiveBack(self.key, time.monotonic())
        in_background(functools.partial(as_planned, plan, release, 0.0))

    def _give_back_if_lost(self, error: Exception, token: str) -> None:
        """An attempt raised ``error``: if its reply was lost, or it is no Redis error (the
        script may have run: a client of a closed event loop fails after sending it), give
        ``token`` back in the background as :class:`~celery_redlock._redis.core.GiveBack`
        plans (hazard 7), as the thread lock gives it back."""
        if lost_reply(error) or classify(error) is None:
            give_back(self.key, functools.partial(self.do_release, token))

    def _drop(self, token: str) -> None:
        """Forget ``token`` if this lock holds it, and stop its renewal (not another's: a
        give-back may run after the same object took the lock again)."""
        if self._token == token:
            self._token = None
            self._stop_renewal()


async def _ended(renewer: asyncio.Task[None], extending: asyncio.Future[Any] | None) -> None:
    """In the renewal's own loop: let its ``extending`` under way get its replies (each node
    then ran it before the release is sent; the step waits no longer than the lease), then
    cancel ``renewer`` and return once it has ended (:meth:`Lock.renew_step`)."""
    if extending is not None and not extending.done():
        await asyncio.wait((extending,))
    renewer.cancel()
    await asyncio.wait((renewer,))


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _unsubscribe(subscription: tuple[Any, Any]) -> None:
    """Drop the inbox of a wait's subscription."""
    subscription[0].remove(subscription[1])


async def _unsubscribe_late(subscription: tuple[Any, Any]) -> None:
    """Drop the inbox of a subscription made after its waiter was cancelled (:func:`settle`)."""
    _unsubscribe(subscription)


async def _renew(ref: weakref.ref[Lock], due: float) -> None:
    """Renew the lock behind ``ref`` as long as it asks, first at ``due`` (the loop's clock);
    stop when it is collected (hazard 5).

    The first renewal is due a delay after the acquisition, not after this task first runs:

    1. a body acquires with a 3 s lease, and blocks the loop for 2.2 s at once (a synchronous
       call); this task, created at the acquisition, has not run yet;
    2. counted from its first run, the renewal would come 1 s later, at 3.2 s: after the
       lease ended, so the lock was lost under a live holder;
    3. counted from the acquisition, it was due at 1 s and runs as soon as the loop is free,
       at 2.2 s, with 0.8 s of the lease left.
    """
    loop = asyncio.get_running_loop()
    delay: float | None = max(due - loop.time(), 0.0)
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
