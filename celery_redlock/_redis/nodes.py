"""Where a lock lives: one Redis node, or a quorum of independent nodes (Redlock).

:class:`Nodes` is the one interface a :class:`~celery_redlock.Lock` talks to; :class:`SingleNode`
and :class:`Quorum` implement it. Both run the scripts of :mod:`celery_redlock._redis.scripts` and
answer in decoded results; a node that does not answer becomes
:class:`~celery_redlock.LockUnavailable` naming it. The majority rule lives in
:func:`majority` only.

:class:`Quorum` implements the Redlock algorithm over N independent nodes (N odd, >= 3):

1. send the acquire script to every node before reading any reply (pipelined on one
   connection per node, so the whole round costs about one round trip, not N);
2. read the replies until a deadline (``node_timeout``); a node that is down or late counts
   as a failure;
3. the lock is held only if a majority (N // 2 + 1) acquired **and** the validity time, ttl
   minus the elapsed time minus a clock-drift allowance (1 % of ttl + 2 ms), is positive;
4. otherwise it is released on every node (owner-checked), so a failed attempt leaves nothing;
5. the fencing token is the largest one returned; nodes of the majority that returned a
   smaller one are raised to it before ``acquire`` returns. So every completed acquisition
   left at least a majority of counters at or above its token, and the majority of any later
   acquisition overlaps it: tokens strictly increase across acquisitions that completed.

Release, extend and the parent-side release go to every node. Extend succeeds with a majority.

Error replies by which a node refuses for now (``BUSY``, ``OOM``, ``READONLY``, ``MISCONF``,
``NOPERM``: :func:`~celery_redlock._redis.clients.refused`) count like no answer: on a single
node they raise :class:`~celery_redlock.LockUnavailable` naming the reply, so a task follows
``redlock_on_unavailable`` and renewal retries.

Hazard, as a timeline (the delayed-restart rule): (a) A holds on nodes 1, 2, 3 of 5 while 4
and 5 are down; (b) node 3 crashes and restarts empty (no persistence); (c) 4 and 5 return;
(d) B acquires on 3, 4, 5: two holders. A node without fsync'd persistence must therefore stay
down for longer than the longest lock TTL before it rejoins. While A holds on more than a bare
majority (the normal case: all live nodes), one node restarting empty cannot let B in.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

import redis as redis_py

from ..exceptions import LockUnavailable
from . import scripts as _scripts
from .clients import UNAVAILABLE_ERRORS, client_for, node_name, refused
from .keys import LockKeys
from .owner import current_pid
from .scripts import AcquireResult, WaitReply

Call = tuple[list[str], list[Any]]

logger = logging.getLogger("celery_redlock.lock")


def _notified(reply: Any, key: str, nodes: Sequence[str]) -> bool:
    """Decode a release reply (:data:`~celery_redlock._redis.scripts.RELEASE`); WARNING on 2."""
    if reply is not None and int(reply) == _scripts.RELEASED_NOT_NOTIFIED:
        logger.warning(
            "lock %s released on %s, but waiters were not notified (PUBLISH was refused, is "
            "it missing from the ACL user's permissions?); they try again when the old lease "
            "would have ended",
            key,
            ", ".join(nodes),
        )
    return bool(reply)


def majority(nodes: int) -> int:
    """How many of ``nodes`` independent nodes make a majority (1 for a single node)."""
    return nodes // 2 + 1


class Extended(NamedTuple):
    """What an extend found: whether the lock is still ours, and whether every node has it."""

    #: The owner token was found (on the node, or on a majority of a quorum's nodes).
    held: bool
    #: Every node holds the lock now. Always equal to ``held`` for a single node; False for a
    #: quorum with a node that is down or that had to get the lock back (repair).
    complete: bool


class Vote(NamedTuple):
    """What a quorum's acquisition replies decide (:func:`count_votes`)."""

    #: The fencing token when a majority granted the lock within its validity time, else None.
    fencing: int | None
    #: How many nodes granted it, and those whose counter is below ``fencing`` (write-back).
    won: int
    lagging: list[int]
    #: What a failed attempt reports: a holder seen by a node, or a bare refusal (no holder
    #: seen: enough votes, but the validity time ran out).
    refusal: AcquireResult


def count_votes(
    replies: Sequence[tuple[Any, BaseException | None]], ttl_ms: int, elapsed_ms: float, quorum: int
) -> Vote:
    """The Redlock rule, in one place for the sync and asyncio quorums.

    The lock is held when at least ``quorum`` nodes granted it and the validity time, ``ttl``
    minus the elapsed time minus a clock-drift allowance (1 % of ttl + 2 ms), is positive; its
    fencing token is the largest one granted.
    """
    results = {
        i: _scripts.decode_acquire(rep) for i, (rep, err) in enumerate(replies) if err is None
    }
    won = [i for i, res in results.items() if res.acquired]
    held = [res for res in results.values() if not res.acquired]
    refusal = held[0] if held else AcquireResult(False)
    validity_ms = ttl_ms - elapsed_ms - (ttl_ms * 0.01 + 2)
    if len(won) < quorum or validity_ms <= 0:
        return Vote(None, len(won), [], refusal)
    fencing = max(results[i].fencing_token or 0 for i in won)
    lagging = [i for i in won if results[i].fencing_token != fencing]
    return Vote(fencing, len(won), lagging, refusal)


class Nodes(Protocol):
    """Where a lock lives: the operations :class:`~celery_redlock.Lock` needs, one call each."""

    @property
    def names(self) -> tuple[str, ...]:
        """``host:port`` of each node, for messages (never with credentials)."""

    def acquire(self, keys: LockKeys, token: str, ttl_ms: int) -> AcquireResult: ...

    def fence(self, keys: LockKeys, slot: str, token: str) -> int | None:
        """The fencing token of a lock whose acquire returned none; ``None`` if not held."""

    def release(self, keys: LockKeys, token: str, keep_ms: int = 0) -> bool: ...

    def extend(self, keys: LockKeys, token: str, ttl_ms: int) -> Extended: ...

    def release_attempt(self, keys: LockKeys, task_id: str, host: str, pid: int) -> bool: ...

    def pttl_ms(self, key: str) -> int: ...

    def pubsub_client(self) -> Any: ...

    def run(self, source: str, call: Call, key: str) -> Any: ...


#: What makes one node of a quorum fail an operation: no answer, or an error reply (OOM,
#: READONLY, NOPERM...). Either way that node holds nothing for us; the others still count.
NODE_ERRORS: tuple[type[BaseException], ...] = (
    *UNAVAILABLE_ERRORS,
    redis_py.exceptions.ResponseError,
)


def _connection(pool: Any) -> Any:
    """A connected connection from ``pool`` (redis-py < 5.3 wants a command name)."""
    try:
        return pool.get_connection()
    except TypeError:
        return pool.get_connection("EVALSHA")


_subscribers: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_subscribers_guard = threading.Lock()


def subscriber_of(client: Any) -> Any:
    """A client like ``client`` on a connection pool of its own, for subscriptions.

    Closing a subscription disconnects its connection and hands it back to its pool. In the
    lock's own pool the next command, the waiter's release once it has run, would then
    connect again (a TCP connect and the handshake: round trips on the path to the next
    waiter). Plain pools (TCP, TLS, Unix socket) are copied; any other (Sentinel) is used as
    it is.
    """
    pool = getattr(client, "connection_pool", None)
    if type(pool) is not redis_py.ConnectionPool:
        return client
    with _subscribers_guard:
        subscriber = _subscribers.get(client)
        if subscriber is None:
            own = redis_py.ConnectionPool(
                connection_class=pool.connection_class, **pool.connection_kwargs
            )
            subscriber = _subscribers[client] = redis_py.Redis(connection_pool=own)
        return subscriber


#: Idle subscriptions kept per subscriber client, at most (the rest are closed).
IDLE_SUBSCRIPTIONS = 8

#: Channels one kept subscription may carry; one that has this many is closed, not reused.
SUBSCRIPTION_CHANNELS = 16

_idle: weakref.WeakKeyDictionary[Any, list[tuple[int, Any]]] = weakref.WeakKeyDictionary()


def subscribe(client: Any, channel: str) -> Any:
    """A ``PubSub`` of ``client`` subscribing to ``channel`` (the request is sent; its
    confirmation is the ``subscribe`` message on ``channel``): one that an earlier wait of this
    process set aside (:func:`set_aside`), else a new one.

    A reused one stays subscribed to the dead channels of its earlier waits (no
    ``UNSUBSCRIBE``: an ACL user may lack it); nothing is published on them, but a waiter must
    still ignore the messages of other channels.
    """
    idle = _idle.get(client)
    while idle:
        try:
            pid, pubsub = idle.pop()
        except IndexError:  # another thread took the last one
            break
        if pid != current_pid():
            continue  # inherited through a fork: the parent's socket, never read or closed here
        if len(pubsub.channels) >= SUBSCRIPTION_CHANNELS:
            pubsub.close()
            continue
        pubsub.subscribe(channel)
        return pubsub
    pubsub = client.pubsub()
    pubsub.subscribe(channel)
    return pubsub


def set_aside(client: Any, pubsub: Any) -> None:
    """Keep ``pubsub`` for the next wait of this process (:func:`subscribe`): its wait ended,
    and its channel is dead (a queued waiter's own channel once it left the queue: nothing is
    published there any more).

    Closing it would cost the waiter that was just handed a lock a socket shutdown on its way
    back to the caller (on a virtual machine, a few hundred microseconds after an idle wait),
    and the next wait a TCP connect and handshake. Beyond :data:`IDLE_SUBSCRIPTIONS` it is
    closed, and so is one not on a plain pool of its own (:func:`subscriber_of`): a Sentinel
    pool's connection kept idle could outlive a failover, still subscribed on the old primary,
    where the new one's handoff would not count it.
    """
    if type(getattr(client, "connection_pool", None)) is not redis_py.ConnectionPool:
        pubsub.close()
        return
    idle = _idle.get(client)
    if idle is None:
        with _subscribers_guard:
            idle = _idle.setdefault(client, [])
    if len(idle) >= IDLE_SUBSCRIPTIONS:
        pubsub.close()
        return
    idle.append((current_pid(), pubsub))


class SingleNode:
    """A lock on one Redis server (or one Sentinel-managed primary, or a Cluster)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        #: ``SET ... NX PX ... GET`` works here (Redis >= 7.0); False once the server refused it.
        self.set_get = True
        #: Blocking waiters queue here; False once the user was refused the queue's commands.
        self.queue_allowed = True
        #: A release hands the lock to the first queued waiter (see ``scripts.RELEASE``): on a
        #: plain node, not a Cluster, whose PUBLISH counts the subscribers of one node only.
        self.handoff = not isinstance(client, redis_py.RedisCluster)

    @functools.cached_property
    def names(self) -> tuple[str, ...]:
        return (node_name(self.client),)

    def _run(self, source: str, call: Call, key: str) -> Any:
        return self._guarded(key, _scripts.run, self.client, source, *call)

    def _guarded(self, key: str, call: Callable[..., Any], *args: Any, **options: Any) -> Any:
        """``call(*args, **options)``; no answer, or a refusal (``OOM``, ``NOPERM``...), as
        LockUnavailable."""
        try:
            return call(*args, **options)
        except UNAVAILABLE_ERRORS as exc:
            raise LockUnavailable(
                f"Redis at {self.names[0]} did not answer for lock {key}: {exc}",
                key=key,
                nodes=self.names,
            ) from exc
        except redis_py.exceptions.ResponseError as exc:
            if not refused(exc):
                raise
            raise LockUnavailable(
                f"Redis at {self.names[0]} refused lock {key}: {exc}",
                key=key,
                nodes=self.names,
            ) from exc

    def acquire(self, keys: LockKeys, token: str, ttl_ms: int) -> AcquireResult:
        """A lock: one ``SET key token NX PX ttl GET``, no script and no fencing counter (the
        token is read on first use, :meth:`fence`); the holder's TTL is left for the caller
        to ask. A semaphore, or a server older than 7.0 (no ``NX`` with ``GET``), runs the
        acquire script."""
        if self.set_get and len(keys.slots) == 1:
            lock = keys.lock
            try:
                holder = self._guarded(
                    lock,
                    self.client.execute_command,
                    *("SET", lock, token, "NX", "PX", ttl_ms, "GET"),
                    get=True,  # redis-py's reply callback: the old value, not a bool
                )
            except redis_py.exceptions.ResponseError as exc:
                if "syntax" not in str(exc).lower():
                    raise
                self.set_get = False
            else:
                if holder is None:
                    return AcquireResult(True)
                if isinstance(holder, bytes):
                    holder = holder.decode("utf-8", "replace")
                return AcquireResult(False, holder=holder or None)
        call = _scripts.acquire_call(keys, token, ttl_ms, single=True)
        return _scripts.decode_acquire(self._run(_scripts.ACQUIRE, call, keys.lock))

    def queues(self, keys: LockKeys) -> bool:
        """Whether blocking waiters of this lock queue (:data:`~._scripts.WAIT`), so that a
        release wakes one of them: a lock (one slot) whose user may run the queue commands."""
        return self.queue_allowed and len(keys.slots) == 1

    def wait_attempt(
        self, keys: LockKeys, token: str, ttl_ms: int, member: str, secret: str
    ) -> WaitReply | None:
        """A queued waiter's attempt: held (taken now, or handed over), or queued.

        ``None`` when the user may not run the queue's commands (``NOPERM``: an ACL written
        before the queue existed); the waiter then waits on the broadcast channel, and this
        node stops queueing (:meth:`queues`).
        """
        call = _scripts.wait_call(keys, token, ttl_ms, member, secret)
        try:
            reply = self._run(_scripts.WAIT, call, keys.lock)
        except LockUnavailable as exc:
            text = str(exc.__cause__)
            if "NOPERM" not in text and "user executing the script" not in text:
                raise
            self.queue_allowed = False
            return None
        return _scripts.decode_wait(reply)

    def leave(self, keys: LockKeys, member: str, secret: str) -> str | None:
        """A queued waiter gives up: leave the queue, passing on a wake-up it may have missed.
        Returns the token it holds the lock with if a release handed it over meanwhile."""
        call = _scripts.leave_call(keys, member, secret, self.handoff)
        return _scripts.decode_wait(self._run(_scripts.LEAVE, call, keys.lock)).held

    def fence(self, keys: LockKeys, slot: str, token: str) -> int | None:
        reply = self._run(_scripts.FENCE, _scripts.fence_call(keys, slot, token), slot)
        return None if reply is None else int(reply)

    def release(self, keys: LockKeys, token: str, keep_ms: int = 0) -> bool:
        call = _scripts.release_call(keys, token, keep_ms, self.handoff)
        reply = self._run(_scripts.RELEASE, call, keys.lock)
        if reply != _scripts.RELEASED_NOT_NOTIFIED:  # the names are built only for the warning
            return bool(reply)
        return _notified(reply, keys.lock, self.names)

    def extend(self, keys: LockKeys, token: str, ttl_ms: int) -> Extended:
        call = _scripts.extend_call(keys, token, ttl_ms)
        held = bool(self._run(_scripts.EXTEND, call, keys.lock))
        return Extended(held, held)

    def release_attempt(self, keys: LockKeys, task_id: str, host: str, pid: int) -> bool:
        call = _scripts.release_attempt_call(keys, task_id, host, pid, self.handoff)
        reply = self._run(_scripts.RELEASE_ATTEMPT, call, keys.lock)
        return _notified(reply, keys.lock, self.names)

    def pttl_ms(self, key: str) -> int:
        """PTTL of ``key`` (negative when missing or without expiry)."""
        try:
            return int(self.client.pttl(key))
        except UNAVAILABLE_ERRORS as exc:
            raise LockUnavailable(
                f"Redis at {self.names[0]} did not answer for lock {key}: {exc}",
                key=key,
                nodes=self.names,
            ) from exc

    def pubsub_client(self) -> Any:
        """The client blocking waiters subscribe with: :func:`subscriber_of` the lock's."""
        return subscriber_of(self.client)

    def run(self, source: str, call: Call, key: str) -> Any:
        """Run another script of :mod:`celery_redlock._scripts` (queued markers)."""
        return self._run(source, call, key)


class Quorum:
    """A lock on N independent Redis nodes, held while a majority holds it."""

    def __init__(
        self,
        clients: Sequence[redis_py.Redis],
        node_timeout: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if len(clients) < 3 or len(clients) % 2 == 0:
            raise ValueError(
                f"a Redlock quorum needs an odd number of nodes >= 3, got {len(clients)}"
            )
        self.clients = list(clients)
        self.names = tuple(node_name(c) for c in clients)
        self.quorum = majority(len(clients))
        self.node_timeout = node_timeout
        self.clock = clock

    # -- fan-out --------------------------------------------------------------------------------

    def _call_all(
        self, source: str, call: Call, only: Sequence[int] | None = None
    ) -> list[tuple[Any, BaseException | None]]:
        """Run ``source`` on every node (or those in ``only``): ``(reply, error)`` per node."""
        keys, args = call
        sha = _scripts.sha1(source)
        indexes = range(len(self.clients)) if only is None else only
        out: list[tuple[Any, BaseException | None]] = [(None, None)] * len(self.clients)
        sent = []
        for i in indexes:
            pool = self.clients[i].connection_pool
            try:
                conn = _connection(pool)
            except NODE_ERRORS as exc:  # also a refused handshake (AUTH, SELECT)
                out[i] = (None, exc)
                continue
            try:
                conn.send_command("EVALSHA", sha, len(keys), *keys, *args)
            except UNAVAILABLE_ERRORS as exc:
                conn.disconnect()
                pool.release(conn)
                out[i] = (None, exc)
                continue
            sent.append((i, pool, conn))
        deadline = time.monotonic() + self.node_timeout
        for i, pool, conn in sent:
            try:
                if not conn.can_read(timeout=max(deadline - time.monotonic(), 0.0)):
                    conn.disconnect()  # a late reply would desynchronise the connection
                    raise redis_py.exceptions.TimeoutError(f"no reply within {self.node_timeout}s")
                out[i] = (conn.read_response(), None)
            except redis_py.exceptions.NoScriptError:
                out[i] = self._eval(i, source, call)
            except NODE_ERRORS as exc:  # keep reading: every connection must be read, released
                out[i] = (None, exc)
            finally:
                pool.release(conn)
        return out

    def _eval(self, i: int, source: str, call: Call) -> tuple[Any, BaseException | None]:
        keys, args = call
        try:
            return _scripts.run(self.clients[i], source, keys, args), None
        except NODE_ERRORS as exc:
            return None, exc

    def _failed(self, replies: list[tuple[Any, BaseException | None]]) -> list[str]:
        return [self.names[i] for i, (_, err) in enumerate(replies) if err is not None]

    def _unavailable(
        self,
        key: str,
        failed: list[str],
        what: str,
        replies: Sequence[tuple[Any, BaseException | None]] = (),
    ) -> LockUnavailable:
        errors = [err for _, err in replies if err is not None]
        return LockUnavailable(
            f"no quorum for lock {key}: {what}; {len(failed)} of {len(self.names)} nodes "
            f"failed ({', '.join(failed)}), {self.quorum} needed"
            + (f"; first error: {errors[0]}" if errors else ""),
            key=key,
            nodes=tuple(failed),
        )

    # -- operations -----------------------------------------------------------------------------

    def acquire(self, keys: LockKeys, token: str, ttl_ms: int) -> AcquireResult:
        start = self.clock()
        replies = self._call_all(_scripts.ACQUIRE, _scripts.acquire_call(keys, token, ttl_ms))
        vote = count_votes(replies, ttl_ms, (self.clock() - start) * 1000, self.quorum)
        if vote.fencing is not None and (
            not vote.lagging or self._raise_fence(keys, vote.fencing, vote.lagging, vote.won)
        ):
            return AcquireResult(True, fencing_token=vote.fencing)
        self._call_all(_scripts.RELEASE, _scripts.release_call(keys, token))
        self._check_answered(keys.lock, replies, "acquire failed")
        return vote.refusal

    def fence(self, keys: LockKeys, slot: str, token: str) -> int | None:
        """Not needed: a quorum's acquire returns the fencing token (from its counters)."""
        return None

    def _raise_fence(self, keys: LockKeys, token: int, lagging: list[int], won: int) -> bool:
        replies = self._call_all(
            _scripts.RAISE_FENCE, _scripts.raise_fence_call(keys, token), only=lagging
        )
        raised_failed = sum(1 for i in lagging if replies[i][1] is not None)
        return won - raised_failed >= self.quorum

    def release(self, keys: LockKeys, token: str, keep_ms: int = 0) -> bool:
        replies = self._call_all(_scripts.RELEASE, _scripts.release_call(keys, token, keep_ms))
        refused_publish = [
            self.names[i]
            for i, (rep, err) in enumerate(replies)
            if err is None and rep is not None and int(rep) == _scripts.RELEASED_NOT_NOTIFIED
        ]
        if refused_publish:
            _notified(_scripts.RELEASED_NOT_NOTIFIED, keys.lock, refused_publish)
        return self._majority(keys.lock, replies, "release")

    def extend(self, keys: LockKeys, token: str, ttl_ms: int) -> Extended:
        """Extend where we hold it; re-assert where the key is missing (repair).

        Only nodes that still held our token count toward the majority: a node where the
        lock was missing (down at acquisition, or restarted empty) gets it back, so that a
        later single-node outage does not leave us with a minority, but it does not prove we
        held the lock meanwhile. Timeline this repairs: (1) node 0 is down, A acquires on 1
        and 2; (2) node 0 rejoins empty; (3) node 2 goes down: without the repair A holds on
        node 1 only and is lost although only one node was ever down at a time.
        """
        start = self.clock()
        call = _scripts.extend_call(keys, token, ttl_ms, reassert=True)
        replies = self._call_all(_scripts.EXTEND, call)
        if (self.clock() - start) * 1000 >= ttl_ms:
            return Extended(False, False)
        self._check_answered(keys.lock, replies, "extend failed")
        held = sum(1 for rep, err in replies if err is None and int(rep) == 1)
        return Extended(held >= self.quorum, held == len(self.clients))

    def release_attempt(self, keys: LockKeys, task_id: str, host: str, pid: int) -> bool:
        call = _scripts.release_attempt_call(keys, task_id, host, pid)
        replies = self._call_all(_scripts.RELEASE_ATTEMPT, call)
        self._check_answered(keys.lock, replies, "release_attempt failed")
        return any(rep for rep, err in replies if err is None)

    def _majority(
        self, key: str, replies: list[tuple[Any, BaseException | None]], what: str
    ) -> bool:
        """Whether no majority contradicts the operation; LockUnavailable if too few answered.

        Nodes that did not answer count as "no evidence of loss" (the key there expires by
        itself).
        """
        failed = self._check_answered(key, replies, f"{what} failed")
        ok = sum(1 for rep, err in replies if err is None and rep)
        return ok + len(failed) >= self.quorum

    def _check_answered(
        self, key: str, replies: list[tuple[Any, BaseException | None]], what: str
    ) -> list[str]:
        """The failed nodes; :class:`LockUnavailable` when too few answered for a majority."""
        failed = self._failed(replies)
        if len(self.clients) - len(failed) < self.quorum:
            raise self._unavailable(key, failed, what, replies)
        return failed

    def pttl_ms(self, key: str) -> int:
        """Time until fewer than a majority of nodes hold ``key`` (negative: not held)."""
        values = []
        for client in self.clients:
            try:
                values.append(int(client.pttl(key)))
            except UNAVAILABLE_ERRORS:
                values.append(-2)
        values.sort(reverse=True)
        return values[self.quorum - 1]

    def run(self, source: str, call: Call, key: str) -> Any:
        """Run another script on the first node that answers (advisory data: queued markers)."""
        keys, args = call
        errors = []
        for name, client in zip(self.names, self.clients, strict=True):
            try:
                return _scripts.run(client, source, keys, args)
            except UNAVAILABLE_ERRORS:
                errors.append(name)
        raise self._unavailable(key, errors, "no node answers")

    def pubsub_client(self) -> Any:
        for client in self.clients:
            try:
                client.ping()
            except UNAVAILABLE_ERRORS:
                continue
            return client
        raise self._unavailable("", list(self.names), "no node answers")


Target = Any  # a URL, a client, or a sequence of them

#: Seconds a quorum node has to answer (socket timeouts of clients built from URLs too).
QUORUM_NODE_TIMEOUT = 0.5

_single: dict[tuple[str, float | None], SingleNode] = {}
_single_guard = threading.Lock()
_of_client: weakref.WeakKeyDictionary[Any, SingleNode] = weakref.WeakKeyDictionary()


def _node_of(client: Any) -> SingleNode:
    """The one :class:`SingleNode` of ``client`` (what it learned, such as a refused ``SET
    ... GET``, holds for every lock on that client); a new one if ``client`` cannot be a weak
    key."""
    try:
        node = _of_client.get(client)
        if node is None:
            with _single_guard:
                node = _of_client.setdefault(client, SingleNode(client))
    except TypeError:
        return SingleNode(client)
    return node


def nodes_for(redis: Target, timeout: float | None = None) -> Nodes:
    """One node for a URL or a client; a :class:`Quorum` for a list of three or more.

    ``timeout`` sets the socket timeouts of clients built from URLs.
    """
    if isinstance(redis, str):
        node = _single.get((redis, timeout))
        if node is None:
            with _single_guard:
                node = _single.setdefault((redis, timeout), SingleNode(client_for(redis, timeout)))
        return node
    if not isinstance(redis, (list, tuple)) and not isinstance(redis, Sequence):
        return _node_of(redis)
    if len(redis) == 1:
        return nodes_for(redis[0], timeout)
    # One slow node must not stall the quorum for the default 5 s: a node that does not answer
    # within QUORUM_NODE_TIMEOUT counts as failed (its connect is bounded the same way).
    node_timeout = min(timeout or QUORUM_NODE_TIMEOUT, QUORUM_NODE_TIMEOUT)
    clients = [client_for(item, node_timeout) if isinstance(item, str) else item for item in redis]
    return Quorum(clients, node_timeout=node_timeout)
