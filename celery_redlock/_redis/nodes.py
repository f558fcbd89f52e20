"""Where a lock lives: one Redis node, or a quorum of independent nodes (Redlock).

:class:`Nodes` is the one interface a :class:`~celery_redlock.Lock` talks to; :class:`SingleNode`
and :class:`Quorum` implement it. Both run the scripts of :mod:`celery_redlock._redis.scripts` and
answer in decoded results; a node that does not answer becomes
:class:`~celery_redlock.LockUnavailable` naming it. What replies mean (the majority rule, the
vote, the error classifier) is decided in :mod:`celery_redlock._redis.core`, for this module
and its asyncio twin :mod:`celery_redlock._redis.aionodes` alike. The subscriptions blocking
waiters listen on live in :mod:`celery_redlock._redis.subscriptions`.

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
A release that a node did not answer is sent to it again in the background until it answers
(:meth:`Quorum.release`).

Error replies by which a node refuses for now (``BUSY``, ``OOM``, ``READONLY``, ``MISCONF``,
``NOPERM``: :func:`~celery_redlock._redis.core.classify`) count like no answer: on a single
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
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import redis as redis_py

from ..exceptions import LockUnavailable
from . import givebacks as _givebacks
from . import scripts as _scripts
from .clients import (
    check_client,
    check_distinct,
    check_member,
    check_timeouts,
    client_for,
    gives_cert,
    is_cluster,
    missing_tls_files,
    node_name,
    uses_tls,
)
from .commands import connection_of, execute, run_script
from .core import (
    Extended,
    NotAsked,
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
from .forks import Guard
from .keys import LockKeys
from .scripts import AcquireResult, WaitReply
from .subscriptions import subscriber_of

__all__ = ["Extended", "Nodes", "Quorum", "SingleNode", "majority", "nodes_for"]

Call = tuple[list[str], list[Any]]

logger = logging.getLogger("celery_redlock.lock")


class Nodes(Protocol):
    """Where a lock lives: the operations :class:`~celery_redlock.Lock` needs, one call each."""

    #: Whether a release gives back again to each node whose reply was lost (a quorum).
    gives_back_per_node: bool
    #: Whether a failed attempt's reply says all that is known of the holder's TTL.
    ttl_in_reply: bool
    #: Whether a release frees the nodes one by one (a quorum), not in one script.
    releases_node_by_node: bool

    @property
    def names(self) -> tuple[str, ...]:
        """``host:port`` of each node, for messages (never with credentials)."""

    def acquire(self, keys: LockKeys, token: str, ttl_ms: int, sole: str = "") -> AcquireResult:
        """One attempt; ``sole``: a task id that may hold one slot of a semaphore only."""

    def queues(self, keys: LockKeys) -> bool: ...

    def fence(self, keys: LockKeys, slot: str, token: str) -> int | None:
        """The fencing token of a lock whose acquire returned none; ``None`` if not held."""

    def release(self, keys: LockKeys, token: str, keep_ms: int = 0) -> bool: ...

    def extend(self, keys: LockKeys, token: str, ttl_ms: int) -> Extended: ...

    def release_attempt(
        self, keys: LockKeys, task_id: str, host: str, pid: int, keep_ms: int = 0
    ) -> bool: ...

    def pttl_ms(self, key: str) -> int: ...

    def pubsub_client(self, key: str) -> Any: ...

    def run(self, source: str, call: Call, key: str) -> Any: ...

    def run_each(self, source: str, call: Call, key: str) -> list[Any]:
        """The replies of every node that answered ``source`` (one node: one reply)."""


class SingleNode(QueueRules):
    """A lock on one Redis server (or one Sentinel-managed primary, or a Cluster)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        #: Whether an acquire may be one ``SET ... NX PX ... GET``: ``None`` until an acquire
        #: script ran here, True then, False once the server refused that ``SET`` (Redis < 7.0).
        #: Without the first script, a user who may not run scripts (an ACL without
        #: ``+evalsha``) would take the lock and be refused only at its release, leaving the key
        #: to its TTL; the asyncio lock, which acquires by script, is refused at once.
        self.set_get: bool | None = None
        #: A release hands the lock to the first queued waiter (see ``scripts.RELEASE``): on a
        #: plain node, not a Cluster, whose PUBLISH counts the subscribers of one node only.
        self.cluster = is_cluster(client)
        self.handoff = not self.cluster
        #: The server a give-back goes to, for the give-backs' thread to hasten the others to
        #: it once one is answered; ``None`` for a Cluster, whose shards answer apart.
        self.node: Any = None if self.cluster else client

    @functools.cached_property
    def names(self) -> tuple[str, ...]:
        return (node_name(self.client),)

    def _run(self, source: str, call: Call, key: str) -> Any:
        """The script ``source`` on ``call`` (:meth:`_guarded`, without its extra call: this
        is every release's path)."""
        try:
            return run_script(self.client, source, *call)
        except Exception as exc:
            if classify(exc) not in (Outcome.UNAVAILABLE, Outcome.REFUSED):
                raise
            raise script_refused(self._unavailable(exc, key), source) from exc

    def _guarded(self, key: str, call: Callable[..., Any], *args: Any, **options: Any) -> Any:
        """``call(*args, **options)``; no answer, or a refusal (``OOM``, ``NOPERM``...), as
        LockUnavailable (:func:`~celery_redlock._redis.core.classify`)."""
        try:
            return call(*args, **options)
        except Exception as exc:
            if classify(exc) not in (Outcome.UNAVAILABLE, Outcome.REFUSED):
                raise
            raise self._unavailable(exc, key) from exc

    def _unavailable(self, exc: BaseException, key: str) -> LockUnavailable:
        return unavailable(
            exc,
            key,
            self.names,
            uses_tls(self.client),
            gives_cert(self.client),
            missing_tls_files(self.client, exc),
        )

    def acquire(self, keys: LockKeys, token: str, ttl_ms: int, sole: str = "") -> AcquireResult:
        """A lock: one ``SET key token NX PX ttl GET``, no script and no fencing counter (the
        token is read on first use, :meth:`fence`); the holder's TTL is left for the caller
        to ask. The first acquire here, a semaphore, or a server older than 7.0 (no ``NX`` with
        ``GET``) runs the acquire script (:attr:`set_get`). An attempt whose reply was lost is
        given back in the background."""
        if self.set_get and len(keys.slots) == 1:
            lock = keys.lock
            try:
                holder = self._guarded(
                    lock,
                    execute,
                    *(self.client, "SET", lock, token, "NX", "PX", ttl_ms, "GET"),
                    get=True,  # redis-py's reply callback: the old value, not a bool
                )
            except Exception as exc:
                if classify(exc) is not Outcome.REPLY or "syntax" not in str(exc).lower():
                    self._give_back_if_lost(exc, keys, token)
                    raise
                self.set_get = False
            else:
                if holder is None:
                    return AcquireResult(True)
                if isinstance(holder, bytes):
                    holder = holder.decode("utf-8", "replace")
                return AcquireResult(False, holder=holder or None)
        call = _scripts.acquire_call(keys, token, ttl_ms, single=True, sole=sole)
        try:
            reply = self._run(_scripts.ACQUIRE, call, keys.lock)
        except LockUnavailable as exc:
            self._give_back_if_lost(exc, keys, token)
            raise
        result = _scripts.decode_acquire(reply)
        if self.set_get is None:
            self.set_get = True
            if len(keys.slots) == 1:  # its token is read on first use, as after a SET
                result = result._replace(fencing_token=None)
        return result

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
            self._give_back_if_lost(exc, keys, token)
            if not self.queue_refused(exc):
                raise
            return None
        return _scripts.decode_wait(reply)

    def leave(self, keys: LockKeys, member: str, secret: str) -> str | None:
        """A queued waiter gives up: leave the queue, passing on a wake-up it may have missed.
        Returns the token it holds the lock with if a release handed it over meanwhile."""
        call = _scripts.leave_call(keys, member, secret, self.handoff)
        return _scripts.decode_wait(self._run(_scripts.LEAVE, call, keys.lock)).held

    def _give_back_if_lost(self, error: BaseException, keys: LockKeys, token: str) -> None:
        """An attempt that raised ``error`` may still run if its reply was lost: then give
        ``token`` back in the background (:class:`~celery_redlock._redis.core.GiveBack` has
        the timeline)."""
        if lost_reply(error):
            release = functools.partial(self.release, keys, token)
            _givebacks.give_back(keys.lock, release, node=self.node)

    def fence(self, keys: LockKeys, slot: str, token: str) -> int | None:
        reply = self._run(_scripts.FENCE, _scripts.fence_call(keys, slot, token), slot)
        return None if reply is None else int(reply)

    def release(self, keys: LockKeys, token: str, keep_ms: int = 0) -> bool:
        call = _scripts.release_call(keys, token, keep_ms, self.handoff, cluster=self.cluster)
        reply = self._run(_scripts.RELEASE, call, keys.lock)
        if reply != _scripts.RELEASED_NOT_NOTIFIED:  # the names are built only for the warning
            return bool(reply)
        return released(reply, keys.lock, self.names)

    def extend(self, keys: LockKeys, token: str, ttl_ms: int) -> Extended:
        call = _scripts.extend_call(keys, token, ttl_ms, cluster=self.cluster)
        held = bool(self._run(_scripts.EXTEND, call, keys.lock))
        return Extended(held, held)

    def release_attempt(
        self, keys: LockKeys, task_id: str, host: str, pid: int, keep_ms: int = 0
    ) -> bool:
        call = _scripts.release_attempt_call(
            keys, task_id, host, pid, self.handoff, keep_ms, cluster=self.cluster
        )
        reply = self._run(_scripts.RELEASE_ATTEMPT, call, keys.lock)
        return released(reply, keys.lock, self.names)

    def pttl_ms(self, key: str) -> int:
        """PTTL of ``key`` (negative when missing or without expiry)."""
        return int(self._guarded(key, self.client.pttl, key))

    def pubsub_client(self, key: str) -> Any:
        """The client blocking waiters of ``key`` subscribe with: :func:`subscriber_of` the
        lock's."""
        return subscriber_of(self.client)

    def run(self, source: str, call: Call, key: str) -> Any:
        """Run another script of :mod:`celery_redlock._scripts` (queued markers): a refusal is
        left as Redis said it, for the caller's own hint
        (:func:`~celery_redlock._redis.companions.acl_refusal`)."""
        return self._guarded(key, run_script, self.client, source, *call)

    def run_each(self, source: str, call: Call, key: str) -> list[Any]:
        """:meth:`run`, as a list of its one reply."""
        return [self.run(source, call, key)]


def _node_error(exc: BaseException) -> bool:
    """Whether ``exc`` makes one node of a quorum fail an operation: no answer, or an error
    reply (OOM, READONLY, NOPERM...). Either way that node holds nothing for us; the others
    still count."""
    return classify(exc) is not None


#: When each quorum node's client last failed a round (no answer, or an error reply): shared
#: by every lock of the process, as the clients are (one per URL).
_failed_at: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
#: Seconds for which a node that failed is asked last in a round, and not once it is late.
FAILED_LATELY = 30.0


class Quorum(QuorumRules):
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
        self,
        source: str,
        call: Call,
        only: Sequence[int] | None = None,
        command: Sequence[Any] = (),
    ) -> Replies:
        """Run ``source`` on every node (or those in ``only``): ``(reply, error)`` per node;
        ``command``: send that command instead of the script (a ``PUBLISH``).

        Each node's reply is awaited ``node_timeout`` from when its request was sent; the
        round's deadline is ``node_timeout`` from its start. A node that failed lately
        (:data:`_failed_at`) is sent to last, and not at all once the deadline has passed, if
        a majority was sent to or another such node failed again this round: sending to it
        may first connect, which waits for a node that hangs up to its socket timeout.
        Timeline without that (5 nodes, 2 frozen): (1) a round times out on the two, which
        drops their connections; (2) the next round connects to each in turn, 0.5 s apiece,
        before its deadline starts: every acquire, renewal and release took 1 s. Timeline
        without the exception for a majority not sent to (3 nodes): (1) node 0 failed lately
        and answers again; (2) node 1 hangs at its connect, and the deadline passes; (3) node
        0, healthy, was not asked: 1 of 3, refused with a majority up. (A third node that
        failed lately and fails again ends the exception: a majority frozen still costs one
        ``node_timeout`` a round.)
        """
        keys, args = call
        sha = _scripts.sha1(source)
        indexes = range(len(self.clients)) if only is None else only
        out: Replies = [(None, None)] * len(self.clients)
        sent: list[tuple[int, Any, Any, float]] = []
        deadline = time.monotonic() + self.node_timeout
        lately = {i for i in indexes if self._failed_lately(i)}
        again = False  # a node that failed lately failed this round too
        for i in sorted(indexes, key=lately.__contains__):
            if i in lately and time.monotonic() >= deadline and (len(sent) >= self.quorum or again):
                out[i] = (None, NotAsked("not asked: it failed lately, and no time is left"))
                continue
            pool = self.clients[i].connection_pool
            try:
                conn = connection_of(pool)
                try:
                    conn.send_command(*(command or ("EVALSHA", sha, len(keys), *keys, *args)))
                except BaseException:
                    conn.disconnect()
                    pool.release(conn)
                    raise
            except Exception as exc:  # also a refused handshake (AUTH, SELECT)
                if not _node_error(exc):
                    raise
                out[i] = (None, exc)
                again = again or i in lately
                continue
            # Its own deadline: a node sent to after another's connect hung the round's
            # whole 0.5 s would otherwise count as failed, healthy as it is (a fresh process's
            # first round, before the hanging node is known to have failed).
            sent.append((i, pool, conn, time.monotonic() + self.node_timeout))
        for i, pool, conn, until in sent:
            try:
                if not conn.can_read(timeout=max(until - time.monotonic(), 0.0)):
                    conn.disconnect()  # a late reply would desynchronise the connection
                    raise TimeoutError(f"no reply within {self.node_timeout}s")
                out[i] = (conn.read_response(), None)
            except Exception as exc:  # keep reading: every connection must be read, released
                if classify(exc) is Outcome.NOSCRIPT:
                    out[i] = self._eval(i, source, call)
                elif _node_error(exc):
                    out[i] = (None, exc)
                else:
                    raise
            finally:
                pool.release(conn)
        for i in indexes:
            if out[i][1] is not None:
                _failed_at[self.clients[i]] = time.monotonic()
            elif i in lately:  # another lock's round may have cleared it meanwhile
                _failed_at.pop(self.clients[i], None)
        return out

    def _failed_lately(self, i: int) -> bool:
        """Whether node ``i`` failed within the last :data:`FAILED_LATELY` seconds."""
        failed = _failed_at.get(self.clients[i])
        return failed is not None and time.monotonic() - failed < FAILED_LATELY

    def _eval(self, i: int, source: str, call: Call) -> tuple[Any, BaseException | None]:
        keys, args = call
        try:
            return run_script(self.clients[i], source, keys, args), None
        except Exception as exc:
            if not _node_error(exc):
                raise
            return None, exc

    # -- operations -----------------------------------------------------------------------------

    def acquire(self, keys: LockKeys, token: str, ttl_ms: int, sole: str = "") -> AcquireResult:
        """The Redlock acquisition (``sole`` is for semaphores, which a quorum refuses)."""
        start = self.clock()
        replies = self._call_all(_scripts.ACQUIRE, _scripts.acquire_call(keys, token, ttl_ms))
        vote = count_votes(replies, ttl_ms, (self.clock() - start) * 1000, self.quorum)
        if vote.fencing is not None and (
            not vote.lagging or self._raise_fence(keys, vote.fencing, vote.lagging, vote.won)
        ):
            return AcquireResult(
                True, fencing_token=vote.fencing, complete=vote.won == len(replies)
            )
        granted, lost = self.to_give_back(replies)
        call = _scripts.release_call(keys, token, 0, wake=not vote.taken)
        for i in lost:
            release = functools.partial(self._release_on, i, call)
            _givebacks.give_back(keys.lock, release, node=self.clients[i])
        if granted:
            self.release(keys, token, quiet=True, wake=not vote.taken, only=granted)
        self.check_answered(keys.lock, replies, "acquire failed")
        return vote.refusal

    def fence(self, keys: LockKeys, slot: str, token: str) -> int | None:
        """Not needed: a quorum's acquire returns the fencing token (from its counters)."""
        return None

    def _raise_fence(self, keys: LockKeys, token: int, lagging: list[int], won: int) -> bool:
        call = _scripts.raise_fence_call(keys, token)
        return self.fence_raised(
            self._call_all(_scripts.RAISE_FENCE, call, only=lagging), lagging, won
        )

    def release(
        self,
        keys: LockKeys,
        token: str,
        keep_ms: int = 0,
        quiet: bool = False,
        wake: bool = True,
        only: Sequence[int] | None = None,
    ) -> bool:
        """Release on every node (or those in ``only``); ``quiet``: the give-back of a failed
        acquisition, whose outcome is not asked for (no error when too few nodes answer).

        Every node frees the lock waking nobody, and says whether anyone listens on the
        release channel there (``PUBSUB NUMSUB``). If anyone does (or a node lacked the lock),
        once all have answered, the nodes are sent a ``PUBLISH`` (:meth:`_wake`,
        :meth:`~.core.QuorumRules.release_wakes`): a second round trip, for a lock someone
        waits for only. The waiters listen on one node, which the holder may lack. Timeline of
        waking from each node as it frees the lock (one round trip, before 2026-12-07): (1)
        node 0, where the waiters listen, frees the lock and wakes them; (2) the woken
        waiter's attempt reaches node 2 before the release does (this thread descheduled
        between two nodes, or a slower path): it wins nodes 0 and 1 only, 15 of 100 handoffs
        from one holder to one waiter on 3 healthy nodes in a probe (0 of 200 since); (3) one
        of those two crashes before the new holder's repair (0.1 s later): the lock is lost,
        and a second holder admitted, while a majority is up. A woken waiter that still
        finds the lock held on a majority (the releasing holder's reply lost, a node frozen)
        tries again soon (:func:`~.core._again_soon`), not at the released holder's TTL.

        A give-back wakes nobody (``wake`` False) while another owner holds the lock on a
        majority. Timeline that closes: the holder lacks node A, where the waiters listen;
        each failed attempt wins A, and its give-back woke every waiter, whose attempts failed
        and woke the others again: hundreds of attempts a second until the holder released, on
        every node, and the holder's renewal could not take A back.

        A node whose reply was lost is given the release again in the background
        (:mod:`~celery_redlock._redis.givebacks`). Timeline it closes: (a) node C is frozen
        while A acquires on A, B (and C's acquire waits in C's socket buffer); (b) A releases:
        the release to C gets no answer; (c) C resumes and runs the acquire: C holds the
        released lock for a whole TTL, and one more node down then stops every acquisition.
        """
        call = _scripts.release_call(keys, token, keep_ms, wake=False)
        try:
            replies = self._call_all(_scripts.RELEASE, call, only)
        except BaseException:  # a soft time limit, an interrupt: the nodes may be freed
            if wake:
                self._wake(keys, list(range(len(self.clients)) if only is None else only))
            raise
        for i, (_, error) in enumerate(replies):
            if error is not None and lost_reply(error):  # then wakes the waiters there, once
                release = functools.partial(self._release_on, i, call, [keys] if wake else [])
                _givebacks.give_back(keys.lock, release, "a release", self.clients[i])
        nodes = self.release_wakes(replies, quiet) if wake else []
        if nodes:
            self._wake(keys, nodes)
        return quiet or self.released(keys.lock, replies)

    def _wake(self, keys: LockKeys, nodes: list[int], done: str = "released") -> None:
        """Wake the waiters on ``nodes`` (a ``PUBLISH`` each, at once), once a release freed
        the lock on every node that answered it (:meth:`~.core.QuorumRules.to_wake`), or an
        extend shortened its TTL there (``done``: what the WARNING for a refused ``PUBLISH``
        says). A node that fails now is not the release's error: its waiters wake at the TTL
        they saw."""
        publish = ("PUBLISH", keys.channel, "1")
        replies = self._call_all("", ([], []), nodes, command=publish)
        self.woken(
            keys.lock, {i: err for i, (_, err) in enumerate(replies) if err is not None}, done
        )

    def _release_on(self, node: int, call: Call, wake: list[LockKeys] | None = None) -> None:
        """The release ``call`` on one node; raises that node's error. ``wake``: then wake
        the waiters there, once (taken from the list: a give-back runs until two releases
        were answered), a release's give-back, whose first try, lost, may have freed the node
        waking nobody."""
        error = self._call_all(_scripts.RELEASE, call, only=[node])[node][1]
        if error is not None:
            raise error
        if wake:
            self._wake(wake.pop(), [node])

    def extend(self, keys: LockKeys, token: str, ttl_ms: int) -> Extended:
        """Extend where we hold it; re-assert where the key is missing (repair).

        Only nodes that still held our token count toward the majority: a node where the
        lock was missing (down at acquisition, or restarted empty) gets it back, so that a
        later single-node outage does not leave us with a minority, but it does not prove we
        held the lock meanwhile. Timeline this repairs: (1) node 0 is down, A acquires on 1
        and 2; (2) node 0 rejoins empty; (3) node 2 goes down: without the repair A holds on
        node 1 only and is lost although only one node was ever down at a time.

        An extend that finds the lock lost gives back what its re-assert wrote. Timeline
        without that: (1) the key vanishes from two of three nodes (expired while they were
        frozen, restarted empty); (2) the holder's extend re-asserts it there, and raises
        :class:`LockLost`; (3) all three nodes hold it for the new TTL: everyone else is locked
        out by an owner told it no longer holds the lock.
        """
        start = self.clock()
        call = _scripts.extend_call(keys, token, ttl_ms, reassert=True, wake=False)
        replies = self._call_all(_scripts.EXTEND, call)
        extended = self.extended(keys.lock, replies, (self.clock() - start) * 1000, ttl_ms)
        if not extended.held:
            self.release(keys, token, quiet=True)
        elif nodes := self.to_wake_extended(replies):  # a second round trip, only then
            self._wake(keys, nodes, "shortened")
        return extended

    def release_attempt(
        self, keys: LockKeys, task_id: str, host: str, pid: int, keep_ms: int = 0
    ) -> bool:
        # Frees every node waking nobody, then wakes them all, as the holder's release does.
        call = _scripts.release_attempt_call(keys, task_id, host, pid, keep_ms=keep_ms, wake=False)
        replies = self._call_all(_scripts.RELEASE_ATTEMPT, call)
        nodes = self.to_wake(replies)
        if nodes:
            self._wake(keys, nodes)
        self.check_answered(keys.lock, replies, "release_attempt failed")
        return any(rep for rep, err in replies if err is None)

    def pttl_ms(self, key: str) -> int:
        """Time until fewer than a majority of nodes hold ``key`` (negative: not held)."""
        replies: Replies = []
        for client in self.clients:
            try:
                replies.append((client.pttl(key), None))
            except Exception as exc:
                if classify(exc) is None:
                    raise
                replies.append((None, exc))
        return self.pttl(key, replies)

    def run(self, source: str, call: Call, key: str) -> Any:
        """Run another script on the first node that answers (advisory data: queued markers)."""
        keys, args = call
        errors: Replies = []
        for client in self.clients:
            try:
                return run_script(client, source, keys, args)
            except Exception as exc:
                if classify(exc) is not Outcome.UNAVAILABLE:
                    raise
                errors.append((None, exc))
        raise self.no_quorum(key, list(self.names), "no node answers", errors)

    def run_each(self, source: str, call: Call, key: str) -> list[Any]:
        """Run another script on every node at once (the newest-call marker, which a stalled
        node must not fork): the replies of the nodes that answered, a majority. When fewer
        answer, a refusal among the errors (``NOPERM``...) is raised as Redis said it, for the
        caller's hint (as :meth:`run`); else :class:`LockUnavailable` naming the nodes."""
        replies = self._call_all(source, call)
        answered = [reply for reply, error in replies if error is None]
        if len(answered) >= self.quorum:
            return answered
        errors = [error for _, error in replies if error is not None]
        refusal = next((e for e in errors if classify(e) is Outcome.REFUSED), None)
        if refusal is not None:
            raise refusal
        failed = [self.names[i] for i, (_, error) in enumerate(replies) if error is not None]
        raise self.no_quorum(key, failed, "too few nodes answer", replies)

    def pubsub_client(self, key: str) -> Any:
        """The first node that answers a PING, as :func:`subscriber_of` gives it (the waiters'
        subscriptions on a pool of their own)."""
        errors: Replies = []
        for client in self.clients:
            try:
                client.ping()
            except Exception as exc:
                if classify(exc) is None:
                    raise
                errors.append((None, exc))
                continue
            return subscriber_of(client)
        raise self.no_listener(key, errors)


Target = Any  # a URL, a client, or a sequence of them

#: Seconds a quorum node has to answer (socket timeouts of clients built from URLs too).
QUORUM_NODE_TIMEOUT = 0.5

_single: dict[tuple[str, float | None], SingleNode] = {}
_single_guard = Guard()
#: The attribute of a client of yours that holds its :class:`SingleNode`.
NODE_ATTR = "_celery_redlock_node"


def _node_of(client: Any) -> SingleNode:
    """The one :class:`SingleNode` of ``client`` (what it learned, such as a refused ``SET
    ... GET``, holds for every lock on that client); a new one if ``client`` keeps no
    attributes.

    The node is kept on the client, so it goes when the client does. Kept in a
    ``WeakKeyDictionary`` keyed by the client, it held its key alive (the node holds the
    client): a program that builds a client per request kept every one, its pool and, unless
    closed, its socket and server connection (2,000 requests, 2,000 connections).
    """
    try:
        attrs = vars(client)
    except TypeError:
        return SingleNode(client)
    node = attrs.get(NODE_ATTR)
    if node is None or node.client is not client:  # a copy of a client carries its node
        with _single_guard:
            node = attrs.get(NODE_ATTR)
            if node is None or node.client is not client:
                node = attrs[NODE_ATTR] = SingleNode(client)
    return node  # type: ignore[no-any-return]


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
    if isinstance(redis, (bytes, bytearray)) or not isinstance(redis, Sequence):
        return _node_of(check_client(redis, asyncio=False))
    if len(redis) == 1:
        return nodes_for(redis[0], timeout)
    for item in redis:
        check_member(item)
    check_distinct(redis)
    # One slow node must not stall the quorum for the default 5 s: a node that does not answer
    # within QUORUM_NODE_TIMEOUT counts as failed (its connect is bounded the same way).
    node_timeout = min(timeout or QUORUM_NODE_TIMEOUT, QUORUM_NODE_TIMEOUT)
    clients = [
        client_for(item, node_timeout)
        if isinstance(item, str)
        else check_client(item, asyncio=False)
        for item in redis
    ]
    check_timeouts(clients, node_timeout)
    return Quorum(clients, node_timeout=node_timeout)
