"""Where an asyncio lock lives: one Redis node, or a quorum of independent nodes (Redlock).

The asyncio twins of :class:`~celery_redlock._redis.nodes.SingleNode` and
:class:`~celery_redlock._redis.nodes.Quorum`. They run the same scripts, built by the same call
builders and decoded by the same functions of :mod:`celery_redlock._redis.scripts`, on the same
keys, so an asyncio lock and a thread or task lock on one name exclude each other. What the
replies mean (the error classifier, the vote, the majority, the release warning) is decided
by :mod:`celery_redlock._redis.core` for both twins; here the nodes of a quorum are asked
concurrently, each within ``node_timeout``.

Scripts run with ``EVALSHA``; after a ``NOSCRIPT`` reply they are loaded with ``SCRIPT LOAD``
and run with ``EVALSHA`` again (never ``EVAL``: the documented ACL user lacks it). No
per-client script registry is kept: redis-py's ``AsyncScript`` holds its client strongly, so a
registry keyed by client would keep every client alive.

Clients built from URLs use a blocking connection pool of :data:`MAX_CONNECTIONS`: a burst of
waiting tasks waits for a free connection (at most the socket timeout) instead of failing with
"Too many connections"; a pool of a given client that runs out is reported as exhausted.

Clients built from URLs belong to the event loop that built them (an asyncio connection cannot
move between loops): one shared client per URL per running loop, closed when the loop shuts
down its async generators (``asyncio.run`` does). Hazard, as a timeline: (1) a Lock is built
at import time from a URL; (2) ``asyncio.run(a())`` uses it, then ends; (3)
``asyncio.run(b())`` uses it again. Step 3 gets a fresh client of its own loop, because the
client is looked up at each call, never stored on the Lock.

This module never imports Celery.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import time
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import redis as redis_py
import redis.asyncio as aioredis

from ..exceptions import LockUnavailable
from . import scripts as _scripts
from .clients import (
    check_client,
    check_distinct,
    check_member,
    check_timeouts,
    gives_cert,
    gives_client_cert,
    is_cluster,
    missing_tls_files,
    node_name,
    redact_url,
    redis_py_spelling,
    uses_tls,
    validate_url,
)
from .commands import load_target
from .core import (
    Extended,
    GiveBack,
    Outcome,
    QueueRules,
    QuorumRules,
    Replies,
    classify,
    count_votes,
    lost_reply,
    majority,
    released,
    script_refused,
    unavailable,
)
from .keys import LockKeys
from .nodes import QUORUM_NODE_TIMEOUT, Call
from .scripts import AcquireResult, WaitReply
from .subscriptions import Hubs

T = TypeVar("T")

logger = logging.getLogger("celery_redlock.lock")

#: Connections of the pool of a client built from a URL (per loop); more callers wait.
MAX_CONNECTIONS = 100

#: URL schemes an asyncio lock builds clients for; pass a ``redis.asyncio`` client otherwise.
SCHEMES = ("redis://", "rediss://", "unix://")


def keep(task: asyncio.Future[Any]) -> None:
    """Reference ``task`` until it ends: a command whose caller no longer waits for it."""
    state = _loop_state(task.get_loop())
    state.cleanups.add(task)
    task.add_done_callback(state.cleanups.discard)


def in_background(undo: Callable[[], Awaitable[object]]) -> None:
    """Run the clean-up ``undo()`` in a task of its own, referenced until it ends.

    A loop that shuts down cancels every task it has, started or not (``asyncio.run`` when its
    main coroutine ends, at once after a Ctrl-C). Timeline of a clean-up cancelled there: (1)
    Ctrl-C lands while ``async with lock:`` waits for its acquire's reply; (2) the acquire is
    cancelled and gives its token back in the background; (3) ``asyncio.run`` cancels every
    task left, that give-back among them, before it sends its release; (4) Redis runs the
    acquire: the key stays held by nobody for its TTL. So a clean-up that is cancelled runs
    once more, at once, without waiting between tries (:func:`as_planned`), and the loop's
    shutdown (``shutdown_asyncgens``, which ``asyncio.run`` calls) waits for it, at most
    :data:`SHUTDOWN_WAIT` seconds for all; a second cancellation ends it. A loop closed without
    that shutdown (``loop.close()`` alone) drops it, and its keys expire by their TTL.
    """
    guarded(undo)


def guarded(undo: Callable[[], Awaitable[T]]) -> asyncio.Future[T]:
    """The task of ``undo()``'s first run, as :func:`in_background` runs it: run once more if
    the loop's shutdown cancels it, and waited for by that shutdown. For a clean-up whose
    caller awaits it (a release): timeline without: (1) a holder inside ``async with lock:``
    is cancelled; (2) its release starts, in a task of its own; (3) the main task returns,
    and ``asyncio.run`` cancels every task left, that release among them, before it went
    out; (4) the key stays held until its TTL, and nothing says so. A server that exits
    without that shutdown (uvicorn raises SIGTERM again) needs :func:`wait_released`."""
    return _start(undo, _loop_state(asyncio.get_running_loop()), last=False)


def _start(undo: Callable[[], Awaitable[T]], state: _LoopState, *, last: bool) -> asyncio.Future[T]:
    token = _cleaning.set(True)  # copied into the new task's context
    try:
        task = asyncio.ensure_future(undo())
    finally:
        _cleaning.reset(token)
    state.cleanups.add(task)
    task.add_done_callback(state.cleanups.discard)
    if last:
        state.last.add(task)
        task.add_done_callback(state.last.discard)
    else:
        task.add_done_callback(functools.partial(_again, undo, state))
    return task


def _again(undo: Callable[[], Awaitable[object]], state: _LoopState, task: Any) -> None:
    """Done-callback of a clean-up's first run: if it was cancelled, run it once more."""
    if task.cancelled():
        token = _stopping.set(True)  # copied into the new task's context
        try:
            _start(undo, state, last=True)
        finally:
            _stopping.reset(token)


#: Set in a clean-up run again as its loop shuts down (:func:`in_background`).
_stopping: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "celery_redlock_stopping", default=False
)


#: Set in every clean-up's task (:func:`in_background`, :func:`guarded`).
_cleaning: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "celery_redlock_cleaning", default=False
)


def cleaning() -> bool:
    """Whether this runs in a clean-up's task, which a loop's shutdown already runs again
    and waits for: what it awaits needs no guard of its own (it would be counted, and run
    again, twice)."""
    return _cleaning.get()


def stopping() -> bool:
    """Whether this is a clean-up run again as its loop shuts down (:func:`in_background`):
    a cancellation there is the shutdown's last word, past :data:`SHUTDOWN_WAIT`."""
    return _stopping.get()


def give_back(
    key: str, release: Callable[[], Awaitable[object]], what: str = "an acquisition"
) -> None:
    """Send ``release()`` (the owner-checked release of a token whose reply was lost, for lock
    ``key``: of ``what``) in the background, as :class:`~celery_redlock._redis.core.GiveBack`
    plans: the asyncio twin of :func:`celery_redlock._redis.givebacks.give_back`. It runs in
    the running loop; when the loop shuts down, it is tried once more at once
    (:func:`in_background`)."""
    plan = GiveBack(key, time.monotonic(), what)
    in_background(functools.partial(as_planned, plan, release))


async def as_planned(
    plan: GiveBack, attempt: Callable[[], Awaitable[object]], delay: float | None = None
) -> None:
    """Run ``attempt()`` after ``delay`` seconds (default: the plan's first delay), then as
    often as ``plan`` judges its outcomes call for. Run again as its loop shuts down
    (:func:`in_background`), it tries at once and ends at the first try without an answer."""
    wait: float | None = plan.delay if delay is None else delay
    while wait is not None:
        last_run = _stopping.get()
        if not last_run:
            await asyncio.sleep(wait)
        error: Exception | None = None
        try:
            await attempt()
        except Exception as exc:  # judged by the plan: retried, or the end
            error = exc
        wait = plan.after(error, time.monotonic())
        if last_run and wait is not None and wait > 0:  # unanswered (an answer tries again at 0)
            logger.warning(
                "lock %s: the event loop shut down before Redis answered the give-back of %s; "
                "the key may stay until its TTL",
                plan.key,
                plan.what,
            )
            return


#: Seconds a loop's shutdown waits for the clean-ups it cancelled to run again
#: (:func:`in_background`): a client without a socket timeout (``redis.asyncio.Redis()``'s
#: default) would wait for a frozen server forever, and ``asyncio.run`` with it.
SHUTDOWN_WAIT = 5.0


class _LoopState:
    """What this module keeps for one running loop: its clients built from URLs, and the
    clean-ups under way, which its shutdown waits for before it closes the clients."""

    __slots__ = ("cleanups", "clients", "holders", "hubs", "keeper", "last")

    def __init__(self) -> None:
        self.clients: dict[tuple[str, float | None], Any] = {}
        #: The waiters' subscriptions, per client (:func:`loop_hubs`).
        self.hubs = Hubs()
        self.cleanups: set[asyncio.Future[Any]] = set()
        #: The clean-ups run again (:func:`_again`): never cancelled by the shutdown.
        self.last: set[asyncio.Future[Any]] = set()
        self.keeper: Any = None
        #: The locks acquired in this loop (:func:`wait_released`), until collected.
        self.holders: weakref.WeakSet[Any] = weakref.WeakSet()


_per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = (
    weakref.WeakKeyDictionary()
)


def _loop_state(loop: asyncio.AbstractEventLoop) -> _LoopState:
    state = _per_loop.get(loop)
    if state is None:
        state = _per_loop[loop] = _LoopState()
        state.keeper = _at_shutdown(loop, state)
        # Start the generator: the loop's first-iteration hook now tracks it, and
        # loop.shutdown_asyncgens() will run its finally clause.
        with contextlib.suppress(StopIteration):
            state.keeper.asend(None).send(None)
    return state


async def _at_shutdown(
    loop: asyncio.AbstractEventLoop, state: _LoopState
) -> AsyncGenerator[None, None]:
    """Parked at its ``yield`` until the loop finalizes it; then ends the loop's clean-ups
    (each first run still under way is cancelled, so it runs once more at once, and that run
    is waited for) and closes the loop's clients."""
    try:
        yield
    finally:
        deadline = loop.time() + SHUTDOWN_WAIT
        while state.cleanups and loop.time() < deadline:
            pending = list(state.cleanups)
            for task in pending:
                if task not in state.last:
                    task.cancel()
            await asyncio.wait(pending, timeout=deadline - loop.time())
        if state.cleanups:  # Redis does not answer (a client of yours may have no timeout)
            logger.warning(
                "the event loop shut down with %d lock give-back(s) unanswered after %g s; "
                "their keys expire by their TTL",
                len(state.cleanups),
                SHUTDOWN_WAIT,
            )
            ended = list(state.cleanups)
            for task in ended:
                task.cancel()
            await asyncio.wait(ended, timeout=1.0)  # each drops its connection as it ends
        _per_loop.pop(loop, None)
        for client in state.clients.values():
            with contextlib.suppress(Exception):
                await client.aclose()
                await client.connection_pool.disconnect()


def holding(lock: Any) -> None:
    """Count ``lock``, just acquired, among the running loop's holders (:func:`wait_released`)."""
    _loop_state(asyncio.get_running_loop()).holders.add(lock)


async def wait_released(timeout: float = SHUTDOWN_WAIT) -> bool:
    """Wait until no lock acquired in the running loop is held and every release and give-back
    under way has ended, at most ``timeout`` seconds; whether they all did (else a WARNING).

    For an ASGI app's lifespan shutdown, which a server runs after it cancels the handlers and
    before it exits. Timeline it closes, under uvicorn with ``--timeout-graceful-shutdown`` and
    SIGTERM (Kubernetes, systemd and docker stop with it): (1) a handler holds a lock; (2) the
    graceful timeout cancels it, and its release starts on the way out of ``async with``; (3)
    the lifespan shutdown ends, the server returns and raises SIGTERM again, with Python's
    default handler: the process ends at once, before ``asyncio.run``'s shutdown would wait
    for the release (:func:`in_background`); (4) the key stays held by nobody until its TTL.
    A lock held by a task that is not ending (the caller's own, a background task still
    running) keeps it waiting until ``timeout``.
    """
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
        raise ValueError(f"wait_released timeout must be seconds >= 0, got {timeout!r}")
    loop = asyncio.get_running_loop()
    state = _loop_state(loop)
    deadline = loop.time() + timeout
    while True:
        held = [lock.key for lock in list(state.holders) if lock.held]
        if not held and not state.cleanups:
            return True
        left = deadline - loop.time()
        if left <= 0:
            logger.warning(
                "%d lock(s) still held and %d release(s) or give-back(s) under way after %g s "
                "(%s); their keys expire by their TTL",
                len(held),
                len(state.cleanups),
                timeout,
                ", ".join(sorted(held)[:5]) or "none held",
            )
            return False
        await asyncio.sleep(min(_RELEASE_POLL, left))


#: Seconds between two looks of :func:`wait_released`.
_RELEASE_POLL = 0.01


def loop_hubs() -> Hubs:
    """The running loop's subscription hubs by client: dropped with the loop's state when it
    shuts down, and each with its client."""
    return _loop_state(asyncio.get_running_loop()).hubs


def client_for(url: str, timeout: float | None = None) -> Any:
    """The running loop's shared ``redis.asyncio`` client for ``url`` (socket timeouts as in
    :func:`celery_redlock._redis.clients.client_for`: 5 s read, 2 s connect by default)."""
    check_url(url)
    clients = _loop_state(asyncio.get_running_loop()).clients
    client = clients.get((url, timeout))
    if client is None:
        options: dict[str, Any] = {}
        if "socket_timeout=" not in url:
            options["socket_timeout"] = timeout or 5.0
        if "socket_connect_timeout=" not in url:
            options["socket_connect_timeout"] = timeout or 2.0
        pool = _pool_for(redis_py_spelling(url), options)
        client = clients[(url, timeout)] = aioredis.Redis(connection_pool=pool)
    return client


def _pool_for(url: str, options: dict[str, Any]) -> Any:
    """A blocking pool of :data:`MAX_CONNECTIONS` where redis-py connects outside the pool's
    lock (it has ``get_available_connection``, redis-py >= 5.1); before that a blocking pool
    connects under its lock, and a cancelled connect stalls every other caller for the
    pool timeout, so the plain pool is kept, whose default size there is unbounded."""
    if not hasattr(aioredis.ConnectionPool, "get_available_connection"):
        return aioredis.ConnectionPool.from_url(url, **options)
    pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=MAX_CONNECTIONS, **options)
    pool.timeout = pool.connection_kwargs.get("socket_timeout") or 5.0  # the URL's, if given
    return pool


def check_url(url: str) -> None:
    """ValueError for a URL no client could be built from
    (:func:`~celery_redlock._redis.clients.validate_url`), as the thread lock says it, or of a
    scheme :func:`client_for` does not build clients for (Sentinel, Cluster)."""
    try:
        validate_url(url)
    except ValueError as exc:
        raise ValueError(f"{redact_url(url)!r} is not a valid Redis URL: {exc}") from None
    if not url.startswith(SCHEMES):
        raise ValueError(
            f"an asyncio Lock builds clients for {', '.join(SCHEMES)} URLs only, got "
            f"{redact_url(url)!r}: pass a redis.asyncio Sentinel or Cluster client instead"
        )


async def run_script(client: Any, source: str, call: Call) -> Any:
    """Run ``source`` on ``client`` with ``EVALSHA``; after a ``NOSCRIPT`` reply, ``SCRIPT
    LOAD`` it and run it again (as :func:`~celery_redlock._redis.commands.run_script`)."""
    keys, args = call
    sha = _scripts.sha1(source)
    try:
        return await client.evalsha(sha, len(keys), *keys, *args)
    except Exception as exc:
        if classify(exc) is not Outcome.NOSCRIPT:
            raise
    await client.execute_command("SCRIPT LOAD", source, **load_target(client, keys))
    return await client.evalsha(sha, len(keys), *keys, *args)


class Node:
    """One Redis server (or a Sentinel primary, or a Cluster, given as a client)."""

    def __init__(self, target: Any, timeout: float | None = None) -> None:
        self.target = target
        self.timeout = timeout
        if isinstance(target, str):
            check_url(target)
            self.name = _url_name(target)
            self.tls: bool | None = target.startswith("rediss")
            self.cert: bool | None = gives_client_cert(target)
        else:
            self.name = node_name(check_client(target, asyncio=True))
            self.tls = uses_tls(target)
            self.cert = gives_cert(target)

    def client(self) -> Any:
        """The client: the given one, or the running loop's client for the URL."""
        if isinstance(self.target, str):
            return client_for(self.target, self.timeout)
        return self.target


def _url_name(url: str) -> str:
    kwargs = redis_py.connection.parse_url(url)
    if "path" in kwargs:
        return str(kwargs["path"])
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


class SingleNode(QueueRules):
    """An asyncio lock on one Redis deployment."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.names = (node.name,)

    async def _guarded(self, key: str, aw: Awaitable[T]) -> T:
        """``await aw``; no answer, or a refusal (``OOM``, ``NOPERM``...), as LockUnavailable
        (:func:`~celery_redlock._redis.core.classify`, as the thread lock's nodes)."""
        try:
            return await aw
        except Exception as exc:
            if classify(exc) not in (Outcome.UNAVAILABLE, Outcome.REFUSED):
                raise
            missing = missing_tls_files(self.node.target, exc)
            raise unavailable(exc, key, self.names, self.node.tls, self.node.cert, missing) from exc

    async def _run(self, source: str, call: Call, key: str) -> Any:
        try:
            return await self._guarded(key, run_script(self.node.client(), source, call))
        except LockUnavailable as exc:
            raise script_refused(exc, source) from exc.__cause__

    @property
    def cluster(self) -> bool:
        """Whether the client is a Redis Cluster's."""
        return is_cluster(self.node.client())

    @property
    def handoff(self) -> bool:
        """A release hands the lock to the first queued waiter, except on a Cluster."""
        return not self.cluster

    async def acquire(
        self, keys: LockKeys, token: str, ttl_ms: int, sole: str = ""
    ) -> AcquireResult:
        call = _scripts.acquire_call(keys, token, ttl_ms, single=True, sole=sole)
        return _scripts.decode_acquire(await self._run(_scripts.ACQUIRE, call, keys.lock))

    async def wait_attempt(
        self, keys: LockKeys, token: str, ttl_ms: int, member: str, secret: str
    ) -> WaitReply | None:
        """A queued waiter's attempt (:data:`~celery_redlock._redis.scripts.WAIT`); ``None``
        when the user may not run the queue's commands (then this node stops queueing)."""
        call = _scripts.wait_call(keys, token, ttl_ms, member, secret)
        try:
            reply = await self._run(_scripts.WAIT, call, keys.lock)
        except Exception as exc:
            if not self.queue_refused(exc):
                raise
            return None
        return _scripts.decode_wait(reply)

    async def leave(self, keys: LockKeys, member: str, secret: str) -> str | None:
        """A queued waiter gives up; the token it holds the lock with if handed it meanwhile."""
        call = _scripts.leave_call(keys, member, secret, self.handoff)
        return _scripts.decode_wait(await self._run(_scripts.LEAVE, call, keys.lock)).held

    async def fence(self, keys: LockKeys, slot: str, token: str) -> int | None:
        """The fencing token of a lock taken without one (queued, or handed over); ``None`` if
        not held (:data:`~celery_redlock._redis.scripts.FENCE`)."""
        reply = await self._run(_scripts.FENCE, _scripts.fence_call(keys, slot, token), slot)
        return None if reply is None else int(reply)

    async def release(self, keys: LockKeys, token: str, keep_ms: int = 0) -> bool:
        """Owner-checked release; the lock passes to the first queued waiter as in
        :data:`~celery_redlock._redis.scripts.RELEASE`, except on a Cluster."""
        call = _scripts.release_call(keys, token, keep_ms, self.handoff, cluster=self.cluster)
        reply = await self._run(_scripts.RELEASE, call, keys.lock)
        return released(reply, keys.lock, self.names)

    async def extend(self, keys: LockKeys, token: str, ttl_ms: int) -> Extended:
        call = _scripts.extend_call(keys, token, ttl_ms, cluster=self.cluster)
        held = bool(await self._run(_scripts.EXTEND, call, keys.lock))
        return Extended(held, held)

    async def pttl_ms(self, key: str) -> int:
        return int(await self._guarded(key, self.node.client().pttl(key)))

    async def pubsub_client(self, key: str) -> Any:
        return self.node.client()

    def check_wait(self) -> None:
        """Raise :class:`ValueError` if a blocking acquire cannot wait here (:func:`_waits`)."""
        _waits(self.node)


def _waits(node: Node) -> None:
    """A blocking acquire listens for releases on pub/sub, which an asyncio Cluster client has
    not (redis-py's nor valkey's). Refused at every blocking acquire, held key or not: the
    first contended call in production must not be where it shows."""
    if is_cluster(node.client()):
        raise ValueError(
            f"lock on {node.name}: a blocking acquire waits on pub/sub, and an asyncio Cluster "
            "client has no pub/sub; use acquire(blocking=False), or the thread Lock over a "
            "sync Cluster client"
        )


class Quorum(QuorumRules):
    """An asyncio lock on N independent Redis nodes, held while a majority holds it."""

    def __init__(self, nodes: Sequence[Node], node_timeout: float = QUORUM_NODE_TIMEOUT) -> None:
        if len(nodes) < 3 or len(nodes) % 2 == 0:
            raise ValueError(
                f"a Redlock quorum needs an odd number of nodes >= 3, got {len(nodes)}"
            )
        self.nodes = list(nodes)
        self.names = tuple(n.name for n in nodes)
        self.quorum = majority(len(nodes))
        self.node_timeout = node_timeout

    async def _one(
        self, i: int, source: str, call: Call, command: Sequence[Any] = ()
    ) -> tuple[Any, BaseException | None]:
        client = self.nodes[i].client()
        sent = client.execute_command(*command) if command else run_script(client, source, call)
        task = asyncio.ensure_future(sent)
        try:
            done, _ = await asyncio.wait((task,), timeout=self.node_timeout)
        except BaseException:
            _abandon(task)
            raise
        if not done:
            _abandon(task)
            return None, TimeoutError(f"no reply within {self.node_timeout}s")
        exc = task.exception()
        if exc is None:
            return task.result(), None
        if classify(exc) is None:
            raise exc
        return None, exc

    async def _call_all(
        self,
        source: str,
        call: Call,
        only: Sequence[int] | None = None,
        command: Sequence[Any] = (),
    ) -> Replies:
        """Run ``source`` on every node (or those in ``only``) at once: ``(reply, error)`` each;
        ``command``: send that command instead of the script (a ``PUBLISH``)."""
        indexes = list(range(len(self.nodes)) if only is None else only)
        out: Replies = [(None, None)] * len(self.nodes)
        done = await asyncio.gather(*(self._one(i, source, call, command) for i in indexes))
        for i, reply in zip(indexes, done, strict=True):
            out[i] = reply
        return out

    async def acquire(
        self, keys: LockKeys, token: str, ttl_ms: int, sole: str = ""
    ) -> AcquireResult:
        """The Redlock acquisition (``sole`` is for semaphores, which a quorum refuses)."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        replies = await self._call_all(_scripts.ACQUIRE, _scripts.acquire_call(keys, token, ttl_ms))
        vote = count_votes(replies, ttl_ms, (loop.time() - start) * 1000, self.quorum)
        if vote.fencing is not None and (
            not vote.lagging or await self._raise_fence(keys, vote.fencing, vote.lagging, vote.won)
        ):
            return AcquireResult(
                True, fencing_token=vote.fencing, complete=vote.won == len(replies)
            )
        granted, lost = self.to_give_back(replies)
        call = _scripts.release_call(keys, token, 0, wake=not vote.taken)
        for i in lost:
            give_back(keys.lock, functools.partial(self._release_on, i, call))
        if granted:
            await self.release(keys, token, quiet=True, wake=not vote.taken, only=granted)
        self.check_answered(keys.lock, replies, "acquire failed")
        return vote.refusal

    async def _raise_fence(self, keys: LockKeys, token: int, lagging: list[int], won: int) -> bool:
        call = _scripts.raise_fence_call(keys, token)
        replies = await self._call_all(_scripts.RAISE_FENCE, call, only=lagging)
        return self.fence_raised(replies, lagging, won)

    async def release(
        self,
        keys: LockKeys,
        token: str,
        keep_ms: int = 0,
        quiet: bool = False,
        wake: bool = True,
        only: Sequence[int] | None = None,
    ) -> bool:
        """Release on every node, or those in ``only`` (see the sync ``Quorum.release``, and
        its ``wake``): ``quiet``
        is the give-back of a failed acquisition, and a node whose reply was lost (frozen past
        ``node_timeout``) is given the release again in the background (:func:`give_back`)."""
        call = _scripts.release_call(keys, token, keep_ms, wake=False)
        replies = await self._call_all(_scripts.RELEASE, call, only)
        for i, (_, error) in enumerate(replies):
            if error is not None and lost_reply(error):  # then wakes the waiters there, once
                release = functools.partial(self._release_on, i, call, [keys] if wake else [])
                give_back(keys.lock, release, "a release")
        if wake and stopping():
            # Run again by a loop shutting down: the run it cut short may have freed every
            # node before its wake, and this one then finds nothing to free.
            nodes = [i for i, (rep, _) in enumerate(replies) if rep is not None]
        else:
            nodes = self.release_wakes(replies, quiet) if wake else []
        if nodes:  # once every node answered (see the sync release)
            await self._wake(keys, nodes)
        return quiet or self.released(keys.lock, replies)

    async def _wake(self, keys: LockKeys, nodes: list[int], done: str = "released") -> None:
        """Wake the waiters on ``nodes`` (see the sync ``Quorum._wake``)."""
        publish = ("PUBLISH", keys.channel, "1")
        replies = await self._call_all("", ([], []), nodes, command=publish)
        self.woken(
            keys.lock, {i: err for i, (_, err) in enumerate(replies) if err is not None}, done
        )

    async def _release_on(self, node: int, call: Call, wake: list[LockKeys] | None = None) -> None:
        """The release ``call`` on one node; raises that node's error. ``wake``: then wake
        the waiters there, once (see the sync ``Quorum._release_on``)."""
        error = (await self._call_all(_scripts.RELEASE, call, only=[node]))[node][1]
        if error is not None:
            raise error
        if wake:
            await self._wake(wake.pop(), [node])

    async def extend(self, keys: LockKeys, token: str, ttl_ms: int) -> Extended:
        """Extend where held, re-assert where missing; found lost, give back what the re-assert
        wrote (see the sync ``Quorum.extend``)."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        call = _scripts.extend_call(keys, token, ttl_ms, reassert=True, wake=False)
        replies = await self._call_all(_scripts.EXTEND, call)
        extended = self.extended(keys.lock, replies, (loop.time() - start) * 1000, ttl_ms)
        if not extended.held:
            await self.release(keys, token, quiet=True)
        elif nodes := self.to_wake_extended(replies):  # a second round trip, only then
            await self._wake(keys, nodes, "shortened")
        return extended

    async def pttl_ms(self, key: str) -> int:
        """Time until fewer than a majority of nodes hold ``key`` (negative: not held)."""
        replies: Replies = []
        for node in self.nodes:
            try:
                replies.append((await node.client().pttl(key), None))
            except Exception as exc:
                if classify(exc) is None:
                    raise
                replies.append((None, exc))
        return self.pttl(key, replies)

    def check_wait(self) -> None:
        """Raise :class:`ValueError` if a blocking acquire cannot wait on some node."""
        for node in self.nodes:
            _waits(node)

    async def pubsub_client(self, key: str) -> Any:
        """The first node that answers a PING (release notifications come from every node)."""
        errors: Replies = []
        for node in self.nodes:
            client = node.client()
            try:
                await client.ping()
            except Exception as exc:
                if classify(exc) is None:
                    raise
                errors.append((None, exc))
                continue
            return client
        raise self.no_listener(key, errors)


def _abandon(task: asyncio.Future[Any]) -> None:
    """Cancel a node's call nobody waits for any more. Its outcome is read when it ends: on
    Python 3.10 redis-py may end a cancelled read with its own ``TimeoutError``, which asyncio
    would log as "Task exception was never retrieved", with a traceback, if nobody read it."""
    task.cancel()
    task.add_done_callback(lambda done: done.cancelled() or done.exception())


Nodes = SingleNode | Quorum


def nodes_for(redis: Any) -> Nodes:
    """One node for a URL or a client; a :class:`Quorum` for a list of three or more."""
    if isinstance(redis, (str, bytes, bytearray)) or not isinstance(redis, Sequence):
        return SingleNode(Node(redis))
    if len(redis) == 1:
        return nodes_for(redis[0])
    for item in redis:
        check_member(item)
    check_distinct(redis)
    # Socket timeouts of URL clients are bounded like the sync quorum's (QUORUM_NODE_TIMEOUT).
    nodes = [Node(item, QUORUM_NODE_TIMEOUT) for item in redis]
    check_timeouts(redis, QUORUM_NODE_TIMEOUT)
    return Quorum(nodes)
