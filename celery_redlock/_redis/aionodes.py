"""Where an asyncio lock lives: one Redis node, or a quorum of independent nodes (Redlock).

The asyncio twins of :class:`~celery_redlock._redis.nodes.SingleNode` and
:class:`~celery_redlock._redis.nodes.Quorum`. They run the same scripts, built by the same call
builders and decoded by the same functions of :mod:`celery_redlock._redis.scripts`, on the same
keys, so an asyncio lock and a thread or task lock on one name exclude each other. The quorum
follows the rules of :mod:`celery_redlock._redis.nodes` (majority, validity time, release
everywhere on failure, fencing write-back); here the nodes are asked concurrently, each within
``node_timeout``.

Scripts run with ``EVALSHA``, and with ``EVAL`` (which also caches the script) after a
``NOSCRIPT`` reply. No per-client script registry is kept: redis-py's ``AsyncScript`` holds its
client strongly, so a registry keyed by client would keep every client alive.

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
import weakref
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import redis as redis_py
import redis.asyncio as aioredis

from ..exceptions import LockUnavailable
from . import scripts as _scripts
from .clients import UNAVAILABLE_ERRORS, node_name, redact
from .keys import LockKeys
from .nodes import NODE_ERRORS, QUORUM_NODE_TIMEOUT, Call, Extended, count_votes, majority
from .scripts import AcquireResult

Replies = list[tuple[Any, BaseException | None]]

#: What makes one quorum node fail an operation: :data:`~celery_redlock._redis.nodes.NODE_ERRORS`,
#: or no reply within ``node_timeout`` (``asyncio.TimeoutError`` is no ``OSError`` before 3.11).
LATE_OR_FAILED: tuple[type[BaseException], ...] = (*NODE_ERRORS, asyncio.TimeoutError)

#: URL schemes an asyncio lock builds clients for; pass a ``redis.asyncio`` client otherwise.
SCHEMES = ("redis://", "rediss://", "unix://")

_per_loop: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, tuple[dict[tuple[str, float | None], Any], Any]
] = weakref.WeakKeyDictionary()


async def _close_at_shutdown(
    loop: asyncio.AbstractEventLoop, clients: dict[tuple[str, float | None], Any]
) -> AsyncGenerator[None, None]:
    """Parked at its ``yield`` until the loop finalizes it; then closes the loop's clients."""
    try:
        yield
    finally:
        _per_loop.pop(loop, None)
        for client in clients.values():
            with contextlib.suppress(Exception):
                await client.aclose()


def client_for(url: str, timeout: float | None = None) -> Any:
    """The running loop's shared ``redis.asyncio`` client for ``url`` (socket timeouts as in
    :func:`celery_redlock._redis.clients.client_for`: 5 s read, 2 s connect by default)."""
    check_url(url)
    loop = asyncio.get_running_loop()
    entry = _per_loop.get(loop)
    if entry is None:
        clients: dict[tuple[str, float | None], Any] = {}
        keeper = _close_at_shutdown(loop, clients)
        # Start the generator: the loop's first-iteration hook now tracks it, and
        # loop.shutdown_asyncgens() will run its finally clause.
        with contextlib.suppress(StopIteration):
            keeper.asend(None).send(None)
        entry = _per_loop[loop] = (clients, keeper)
    clients = entry[0]
    client = clients.get((url, timeout))
    if client is None:
        options: dict[str, Any] = {}
        if "socket_timeout=" not in url:
            options["socket_timeout"] = timeout or 5.0
        if "socket_connect_timeout=" not in url:
            options["socket_connect_timeout"] = timeout or 2.0
        client = clients[(url, timeout)] = aioredis.Redis.from_url(url, **options)
    return client


def check_url(url: str) -> None:
    """ValueError for a URL scheme :func:`client_for` does not build clients for."""
    if not url.startswith(SCHEMES):
        raise ValueError(
            f"an asyncio Lock builds clients for {', '.join(SCHEMES)} URLs only, got "
            f"{redact(url)}: pass a redis.asyncio client (Sentinel, Cluster) instead"
        )


async def run_script(client: Any, source: str, call: Call) -> Any:
    """Run ``source`` on ``client`` with ``EVALSHA``; after a ``NOSCRIPT`` reply, ``SCRIPT
    LOAD`` it and run it again (as :func:`~celery_redlock._redis.scripts.run`: an ACL user may
    lack ``EVAL``)."""
    keys, args = call
    sha = _scripts.sha1(source)
    try:
        return await client.evalsha(sha, len(keys), *keys, *args)
    except redis_py.exceptions.NoScriptError:
        await client.script_load(source)
        return await client.evalsha(sha, len(keys), *keys, *args)


class Node:
    """One Redis server (or a Sentinel primary, or a Cluster, given as a client)."""

    def __init__(self, target: Any, timeout: float | None = None) -> None:
        self.target = target
        self.timeout = timeout
        if isinstance(target, str):
            check_url(target)
            self.name = _url_name(target)
        else:
            self.name = node_name(target)

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


class SingleNode:
    """An asyncio lock on one Redis deployment."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.names = (node.name,)

    async def _run(self, source: str, call: Call, key: str) -> Any:
        try:
            return await run_script(self.node.client(), source, call)
        except UNAVAILABLE_ERRORS as exc:
            raise self._unavailable(key, exc) from exc

    def _unavailable(self, key: str, exc: BaseException) -> LockUnavailable:
        return LockUnavailable(
            f"Redis at {self.names[0]} did not answer for lock {key}: {exc}",
            key=key,
            nodes=self.names,
        )

    async def acquire(self, keys: LockKeys, token: str, ttl_ms: int) -> AcquireResult:
        call = _scripts.acquire_call(keys, token, ttl_ms, single=True)
        return _scripts.decode_acquire(await self._run(_scripts.ACQUIRE, call, keys.lock))

    async def release(self, keys: LockKeys, token: str, keep_ms: int = 0) -> bool:
        """Owner-checked release; the lock passes to a queued (sync) waiter as in
        :data:`~celery_redlock._redis.scripts.RELEASE`, except on a Cluster."""
        client = self.node.client()
        handoff = not isinstance(client, aioredis.RedisCluster)
        call = _scripts.release_call(keys, token, keep_ms, handoff)
        return bool(await self._run(_scripts.RELEASE, call, keys.lock))

    async def extend(self, keys: LockKeys, token: str, ttl_ms: int) -> Extended:
        call = _scripts.extend_call(keys, token, ttl_ms)
        held = bool(await self._run(_scripts.EXTEND, call, keys.lock))
        return Extended(held, held)

    async def pttl_ms(self, key: str) -> int:
        try:
            return int(await self.node.client().pttl(key))
        except UNAVAILABLE_ERRORS as exc:
            raise self._unavailable(key, exc) from exc

    async def pubsub_client(self) -> Any:
        return self.node.client()


class Quorum:
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

    async def _one(self, i: int, source: str, call: Call) -> tuple[Any, BaseException | None]:
        try:
            coro = run_script(self.nodes[i].client(), source, call)
            return await asyncio.wait_for(coro, self.node_timeout), None
        except LATE_OR_FAILED as exc:
            return None, exc

    async def _call_all(
        self, source: str, call: Call, only: Sequence[int] | None = None
    ) -> Replies:
        """Run ``source`` on every node (or those in ``only``) at once: ``(reply, error)`` each."""
        indexes = list(range(len(self.nodes)) if only is None else only)
        out: Replies = [(None, None)] * len(self.nodes)
        done = await asyncio.gather(*(self._one(i, source, call) for i in indexes))
        for i, reply in zip(indexes, done, strict=True):
            out[i] = reply
        return out

    def _check_answered(self, key: str, replies: Replies, what: str) -> list[str]:
        """The failed nodes; :class:`LockUnavailable` when too few answered for a majority."""
        failed = [self.names[i] for i, (_, err) in enumerate(replies) if err is not None]
        if len(self.nodes) - len(failed) < self.quorum:
            errors = [err for _, err in replies if err is not None]
            raise LockUnavailable(
                f"no quorum for lock {key}: {what}; {len(failed)} of {len(self.names)} nodes "
                f"failed ({', '.join(failed)}), {self.quorum} needed"
                + (f"; first error: {errors[0]}" if errors else ""),
                key=key,
                nodes=tuple(failed),
            )
        return failed

    async def acquire(self, keys: LockKeys, token: str, ttl_ms: int) -> AcquireResult:
        loop = asyncio.get_running_loop()
        start = loop.time()
        replies = await self._call_all(_scripts.ACQUIRE, _scripts.acquire_call(keys, token, ttl_ms))
        vote = count_votes(replies, ttl_ms, (loop.time() - start) * 1000, self.quorum)
        if vote.fencing is not None and (
            not vote.lagging or await self._raise_fence(keys, vote.fencing, vote.lagging, vote.won)
        ):
            return AcquireResult(True, fencing_token=vote.fencing)
        await self._call_all(_scripts.RELEASE, _scripts.release_call(keys, token))
        self._check_answered(keys.lock, replies, "acquire failed")
        return vote.refusal

    async def _raise_fence(self, keys: LockKeys, token: int, lagging: list[int], won: int) -> bool:
        call = _scripts.raise_fence_call(keys, token)
        replies = await self._call_all(_scripts.RAISE_FENCE, call, only=lagging)
        raised_failed = sum(1 for i in lagging if replies[i][1] is not None)
        return won - raised_failed >= self.quorum

    async def release(self, keys: LockKeys, token: str, keep_ms: int = 0) -> bool:
        call = _scripts.release_call(keys, token, keep_ms)
        replies = await self._call_all(_scripts.RELEASE, call)
        failed = self._check_answered(keys.lock, replies, "release failed")
        ok = sum(1 for rep, err in replies if err is None and rep)
        return ok + len(failed) >= self.quorum  # a silent node is no evidence of loss

    async def extend(self, keys: LockKeys, token: str, ttl_ms: int) -> Extended:
        """Extend where held, re-assert where missing (see the sync ``Quorum.extend``)."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        call = _scripts.extend_call(keys, token, ttl_ms, reassert=True)
        replies = await self._call_all(_scripts.EXTEND, call)
        if (loop.time() - start) * 1000 >= ttl_ms:
            return Extended(False, False)
        self._check_answered(keys.lock, replies, "extend failed")
        held = sum(1 for rep, err in replies if err is None and int(rep) == 1)
        return Extended(held >= self.quorum, held == len(self.nodes))

    async def pttl_ms(self, key: str) -> int:
        """Time until fewer than a majority of nodes hold ``key`` (negative: not held)."""
        values = []
        for node in self.nodes:
            try:
                values.append(int(await node.client().pttl(key)))
            except UNAVAILABLE_ERRORS:
                values.append(-2)
        values.sort(reverse=True)
        return values[self.quorum - 1]

    async def pubsub_client(self) -> Any:
        """The first node that answers a PING (release notifications come from every node)."""
        for node in self.nodes:
            client = node.client()
            try:
                await client.ping()
            except UNAVAILABLE_ERRORS:
                continue
            return client
        raise LockUnavailable(f"no node answers ({', '.join(self.names)})", nodes=self.names)


Nodes = SingleNode | Quorum


def nodes_for(redis: Any) -> Nodes:
    """One node for a URL or a client; a :class:`Quorum` for a list of three or more."""
    if isinstance(redis, str) or not isinstance(redis, Sequence):
        return SingleNode(Node(redis))
    if len(redis) == 1:
        return nodes_for(redis[0])
    # Socket timeouts of URL clients are bounded like the sync quorum's (QUORUM_NODE_TIMEOUT).
    return Quorum([Node(item, QUORUM_NODE_TIMEOUT) for item in redis])
