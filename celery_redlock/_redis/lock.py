"""The lock primitive: an owner-checked, expiring, fenced Redis lock.

:class:`Lock` is what :class:`~celery_redlock.LockedTask` uses under the hood, and it is usable
on its own, for example to let one process rebuild a cache entry while the others wait::

    with Lock("redis://localhost:6379/0", "rebuild:homepage", ttl=10, timeout=5):
        rebuild_homepage()

Each operation is one Lua script (:mod:`celery_redlock._redis.scripts`), or on one Redis 7
server a plain ``SET NX PX GET`` for an acquire after the first (the fencing token is read on
first use); release and extend compare the owner token before touching the key.
The token is unguessable and fresh for every acquisition, so only the holder can release.

This module never imports Celery.

Hazards, as timelines:

1. Expiry under a live holder. (a) A acquires with ttl=10 s and no renewal; (b) A pauses (GC,
   swap, SIGSTOP) for 12 s; (c) the key expires and B acquires; (d) A resumes and still believes
   it holds the lock. The owner check stops A's release and extend from touching B's lock, and
   marks A's lock lost, but A's *other* side effects are not stopped by Redis: pass
   :attr:`Lock.fencing_token` to the storage you write to and let it reject stale tokens.
2. Renewal races expiry. With ``auto_renew`` the watchdog extends every ``ttl / 3``; if a
   renewal fails (no answer, or an error reply such as ``BUSY``, ``OOM``, ``READONLY``,
   ``MISCONF``, ``NOPERM``) it retries, and once the last confirmed expiry has passed the lock
   is marked lost, because from then on another owner may exist.
3. A server that does not answer at all. (a) A holds a 2 s lease; (b) the server is paused
   (``CLIENT PAUSE 5000``) or the network stalls, and the renewal's reply never comes; (c) at
   2 s the key may expire on the server, and B may acquire after the pause. A judges by its own
   clock: :attr:`Lock.lost` is true from the lease's end (the last confirmed expiry, measured
   from before the confirming call was sent), and renewal calls wait for their reply only
   until then, so the loss is reported (ERROR, :meth:`Lock.on_lost`) at the lease's end, not
   after the socket timeout.
4. Blocking acquire. (a) A holds; (b) B subscribes to the release channel, then tries again;
   (c) A releases and the release script publishes; (d) B wakes and tries again. Subscribing
   before the retry means a release between B's two attempts is never missed; a holder that
   dies without releasing wakes B when the key's TTL runs out.
5. An interrupted acquire. (a) A's script runs on Redis and takes the key; (b) before its reply
   is read, A's thread is interrupted (``KeyboardInterrupt``, ``SystemExit`` from a time limit
   or a revoke, any exception raised from a signal handler); (c) the key would stay held by
   nobody until its TTL. So an attempt or queued try that ends in anything but a Redis error
   gives its token back (owner-checked, errors aside) before the interruption goes on.
6. A lost reply. (a) A's attempt is sent; (b) the server stops answering past the socket
   timeout, and A raises :class:`LockUnavailable`; (c) the server resumes and runs the
   attempt: the key is held by nobody until its TTL. A give-back sent at once on another
   connection could run before the attempt, so the nodes (:mod:`~celery_redlock._redis.nodes`)
   give the attempt's token back in the background (:mod:`~celery_redlock._redis.givebacks`)
   until two releases in a row were answered (:class:`~celery_redlock._redis.core.GiveBack`).
7. An interrupted release. (a) A's ``with lock:`` body ends and ``release`` forgets the token
   (renewal stops); (b) Ctrl-C lands before the release is sent, or while its reply is read;
   (c) the key would stay held by nobody until its TTL. So a release that ends in anything but
   a Redis error is sent once more, at once (owner-checked: a second release of a key already
   released, or kept for a cooldown, changes nothing), before the interruption goes on.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable
from typing import Any, cast

from . import keys as _keys
from . import owner as _owner
from . import renewal as _renewal
from . import subscriptions as _subscriptions
from .core import SUBSCRIBED, Clock, Closing, Extended, LockCore, Op, Run, classify, ms
from .forks import Guard
from .givebacks import give_back
from .nodes import Nodes, SingleNode, Target, nodes_for
from .scripts import AcquireResult

__all__ = ["Clock", "Lock", "release_attempt"]

logger = logging.getLogger("celery_redlock.lock")


class Lock(LockCore):
    """An expiring Redis lock that only its holder can release.

    :param redis: a Redis URL or client; or a list of 3, 5, ... URLs or clients of independent
        nodes, for the Redlock quorum (:mod:`celery_redlock._redis.nodes`).
    :param name: the lock's name; the key is ``<prefix>:{<name>}``. Must not contain braces.
    :param ttl: seconds the lock lives unless extended (the lease, with ``auto_renew``).
    :param prefix: key prefix shared with the other locks of an application.
    :param owner: a label stored in the token (Celery tasks store their task id).
    :param host: the host name stored in the token (default: this machine's).
    :param blocking: default for :meth:`acquire` and the context manager.
    :param timeout: seconds a blocking acquire waits at most; ``None`` waits forever.
    :param auto_renew: keep the lock alive with a watchdog that extends it every ``ttl / 3``.
    :param max_hold: renewal never extends the lock past acquisition + ``max_hold`` seconds.
    :param limit: how many owners may hold the lock at once (a counting semaphore of
        ``limit`` owner-checked slots); needs a single Redis deployment, not a quorum.
    :param clock: monotonic clock used for validity and expiry decisions.

    The decisions are :class:`~celery_redlock._redis.core.LockCore`'s; this class sends what
    they ask for. The context manager raises :class:`LockContended` when it cannot acquire in
    time, and releases on exit (a lock lost meanwhile is not an error on exit: its loss was
    logged).
    """

    nodes: Nodes
    #: The holder's TTL is still to be asked (a reply without it; see :attr:`last_holder_ttl`).
    _holder_ttl_pending = False
    #: Held by a renewal while it runs (:meth:`renew_step`, which makes it).
    _renewing: Guard

    def _connect(self, redis: Target) -> Nodes:
        return nodes_for(redis)

    # -- public API: validate, then delegate to do_* ------------------------------------------

    @property
    def fencing_token(self) -> int | None:
        """Strictly increasing number of the current acquisition (``None`` if not held).

        A single-node lock reads it on first use: one owner-checked round trip
        (:data:`~celery_redlock._redis.scripts.FENCE`), then cached; an acquisition whose token
        nobody reads costs nothing for it and leaves no counter key. Read after the lock was
        lost, it is ``None`` and the lock is marked lost; once the lock is :attr:`lost` (a
        renewal or release found it gone, or its lease ended by :attr:`clock`), it is ``None``
        too, even if it was read before. The tokens of one name increase, also across a step
        back of the Redis server's clock (the high-water mark of the lock's slot,
        :func:`~celery_redlock._redis.keys.high_water_of`). Raises :class:`LockUnavailable`
        when Redis does not answer.
        """
        if self.lost or self._forked():  # a forked child: the parent's number, not its own
            return None
        token = self._token
        if self._fencing_token is None and token is not None:
            self._fenced(token, self.nodes.fence(self.keys, self.key, token))
        return None if self._lost else self._fencing_token

    @property
    def last_holder_ttl(self) -> float | None:
        """Remaining TTL in seconds of :attr:`last_holder`'s lock, seen by the last failed
        attempt (``None`` if it was not contended, or that key is gone or never expires).

        A single-node attempt does not return it: the first read asks Redis (``PTTL``, one
        round trip), so a caller that only needs the holder pays nothing for it.
        """
        if self._holder_ttl_pending and self.last_holder is not None:  # not held since
            self._holder_ttl_pending = False
            pttl = self.nodes.pttl_ms(self.key)
            self._holder_ttl = None if pttl < 0 else pttl / 1000.0
        return self._holder_ttl

    def acquire(self, blocking: bool | None = None, timeout: float | None = None) -> bool:
        """Take the lock; return whether it was taken.

        Non-blocking: one round trip. Blocking: wait for a release notification or the holder's
        expiry, at most ``timeout`` seconds (``None``: the instance default, which may be
        forever). Raises :class:`LockUnavailable` when Redis does not answer. An acquire that
        raises holds nothing: a lock taken before the exception (a signal handler's, a
        ``KeyboardInterrupt``, landing after the handoff) is given back, as the asyncio lock
        does. Without that, ``with Lock(...)`` never reached ``__exit__``, and the key stayed
        held by nobody until its TTL (or for good, renewed while the object lived).
        """
        timeout = self._acquire_mode(blocking, timeout)
        try:
            if timeout == -1.0:
                return self._attempt()
            return self.do_wait(timeout)
        except BaseException:
            self._give_back_taken()
            raise
        finally:
            self._acquiring = False

    def _give_back_taken(self) -> None:
        """Release what an acquire that is raising took, if anything (errors aside)."""
        with self._state:
            token, self._token = self._token, None
        if token is None:
            return
        self._stop_renewal()
        self._fencing_token = None
        with contextlib.suppress(Exception):
            self.do_release(token)

    def release(self, keep: float = 0) -> None:
        """Release the lock. Raises :class:`LockNotOwned` if it is not held by this object.

        ``keep`` > 0 keeps the key held for that many more seconds instead of deleting it
        (no other owner can take it in that window; nobody can release it early). Blocking
        waiters are woken all the same: each reads the new TTL and tries when it ends.
        A lock that expired or changed owner meanwhile is left alone (the owner check) and
        :class:`LockLost` is raised; it is marked :attr:`lost` (an ERROR) unless it expired
        while the release was on its way: sent within the lease, answered after its end (a
        WARNING, see :meth:`~celery_redlock._redis.core.LockCore._expired_on_the_way`).
        """
        token = self._release_token(keep)  # the renewal stopped
        try:
            if self.auto_renew:
                renewing = self.__dict__.get("_renewing")
                if renewing is not None:  # a renewal in flight ends first (renew_step says why)
                    with renewing:
                        pass
            done = self.do_release(token, keep)
        except BaseException as exc:
            if classify(exc) is None:  # interrupted (hazard 7): send it once more, errors aside
                with contextlib.suppress(Exception):
                    self.do_release(token, keep)
            raise
        self._released(done)

    def extend(self, ttl: float | None = None) -> None:
        """Reset the remaining TTL to ``ttl`` seconds (default: the lock's ttl), owner-checked.

        Raises :class:`LockNotOwned` if not acquired (or released by another thread or task
        while the extend was on its way), :class:`LockLost` if Redis says another owner (or
        nobody) holds the key now, the lock was found so before (:attr:`lost`), or it reached
        ``max_hold``.
        """
        token, ttl = self._extend_args(ttl)
        start = self.clock()
        self._extended(token, self.do_extend(token, ttl), start, ttl)

    def locked(self) -> bool:
        """Whether anyone holds the lock right now: its key (on a majority, for a quorum), or
        any slot of a semaphore. :class:`LockUnavailable` when Redis (a majority of a quorum's
        nodes) does not answer: a silent node may hold it."""
        return any(self.nodes.pttl_ms(key) != -2 for key in self._observed)

    def remaining_ttl(self) -> float | None:
        """Seconds until the key expires, from Redis; ``None`` if it does not exist. For a
        semaphore: the slot this object holds, or else the held slot that expires first."""
        pttls = [pttl for pttl in map(self.nodes.pttl_ms, self._observed) if pttl >= 0]
        return min(pttls) / 1000.0 if pttls else None

    def __enter__(self) -> Lock:
        if not self.acquire():
            raise self._contended(self.last_holder_ttl)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._token is None or self._forked():
            return  # a forked child leaves its parent's lock alone
        with self._leaving(raised=exc[0] is not None):
            self.release()

    # -- override points ------------------------------------------------------------------------

    def do_acquire(self, token: str, ttl: float) -> AcquireResult:
        """One acquisition attempt on Redis."""
        return self.nodes.acquire(self.keys, token, ms(ttl), self._sole)

    def do_release(self, token: str, keep: float = 0) -> bool:
        """Owner-checked delete (or expiry in ``keep`` s); False when it was not ours any more."""
        return self.nodes.release(self.keys, token, ms(keep) if keep > 0 else 0)

    def do_extend(self, token: str, ttl: float) -> Extended:
        """Owner-checked ``PEXPIRE``: whether the key is still ours (``held``), and whether every
        node has it (``complete``; a quorum re-asserts it where it was missing)."""
        return self.nodes.extend(self.keys, token, ms(ttl))

    def do_wait(self, timeout: float | None) -> bool:
        """Blocking acquire (hazard 4): the requests of the core's wait
        (:meth:`~.core.LockCore._wait`), sent from this thread. It listens on a ``PubSub`` of its
        own, blocked in a socket read; one whose wait ended normally serves the next wait of
        the process (:mod:`~celery_redlock._redis.subscriptions`)."""
        run = Run(self._wait(timeout))
        queue = cast(SingleNode, self.nodes)  # asked for queue operations only if it queues
        client: Any = None
        pubsub: Any = None
        channel = ""
        for op, arg in run:
            try:
                if op is Op.ATTEMPT:
                    run.reply = self._attempt()
                elif op is Op.QUEUED:
                    try:
                        run.reply = queue.wait_attempt(self.keys, *arg)
                    except BaseException as exc:
                        self._give_back_if_interrupted(exc, arg[0])
                        raise
                elif op is Op.HOLDER_TTL:
                    run.reply = self.last_holder_ttl
                elif op is Op.SUBSCRIBE:  # sent at the first receive, as the asyncio driver's
                    channel, client, pubsub = arg, self.nodes.pubsub_client(self.keys.lock), None
                elif op is Op.RECEIVE:
                    if pubsub is None:
                        pubsub = _subscriptions.subscribe(client, channel)
                    message = pubsub.get_message(timeout=arg)
                    # Messages of other channels are left over from this connection's last wait.
                    if message is not None and _subscriptions.on(message, channel):
                        confirmed = message["type"] == "subscribe"
                        run.reply = SUBSCRIBED if confirmed else message["data"]
                elif op is Op.EXTEND:
                    run.reply = self.do_extend(*arg)
                elif op is Op.LEAVE:
                    run.reply = queue.leave(self.keys, *arg)
                elif op is Op.ABANDON:
                    with contextlib.suppress(Exception):
                        held = queue.leave(self.keys, *arg)
                        if held is not None:
                            self.do_release(held)
                elif op is Op.CLOSE and pubsub is not None:
                    _subscriptions.set_aside(client, pubsub, reusable=arg is Closing.REUSE)
                # Op.FENCE: nothing now; fencing_token reads it on first use.
            except BaseException as exc:  # the core decides: thrown into the wait
                run.error = exc
        return run.result

    # -- renewal --------------------------------------------------------------------------------

    def renew_step(self) -> float | None:
        """One watchdog renewal: extend by the lease, capped at ``max_hold``.

        Returns the delay until the next renewal, or ``None`` when renewal should stop
        (:meth:`~celery_redlock._redis.core.LockCore._renewal`). A failed renewal is retried
        as the core decides; the watchdog waits for the call only until the lease ends (a
        call that hangs, on a paused server or a stalled connection, finishes in the
        background), and a renewal that finds the lease ended marks the lock lost.

        It runs under :attr:`_renewing`, which :meth:`release` waits for. Timeline without
        it, seen on a quorum with a node down: (1) the watchdog reads the token to renew;
        (2) the task ends, and its release deletes the key on the live nodes; (3) the
        renewal's extend arrives, finds the key missing and re-asserts it (the quorum's
        repair): the key is held by nobody for a whole lease, and its calls are skipped.
        The wait is bounded by the renewal's own (the lease's end).
        """
        renewing = self.__dict__.get("_renewing")
        if renewing is None:  # per renewed lock (most are never renewed); reentrant: a
            renewing = self._renewing = Guard(reentrant=True)  # lost-lock receiver may release
        with renewing:
            plan = self._renewal()
            if plan is None:
                return None
            token, ttl, start, wait = plan
            try:
                extended = _within(wait, functools.partial(self.do_extend, token, ttl))
            except Exception as exc:
                return self._renewal_failed(token, exc)
            return self._renewed(token, start, ttl, extended)

    def _start_renewal(self, delay: float) -> None:
        _renewal.watch(self, delay)

    def _stop_renewal(self) -> None:
        _renewal.unwatch(self)

    # -- internals ------------------------------------------------------------------------------

    def _attempt(self) -> bool:
        token = self._try_token()
        ttl = self._lease()
        start = self.clock()
        try:
            result = self.do_acquire(token, ttl)
        except BaseException as exc:
            self._give_back_if_interrupted(exc, token)
            raise
        return self._result(token, start, ttl, result)

    def _give_back_if_interrupted(self, exc: BaseException, token: str) -> None:
        """An attempt with ``token`` raised ``exc``: if it is anything but a Redis error, the
        attempt may have taken the lock (hazard 5), so release ``token``. At once (the process
        may be ending), and unless that release found the key and deleted it, again in the
        background as :class:`~celery_redlock._redis.core.GiveBack` plans: the attempt may
        still be in flight (timeline: the server freezes with it in its buffer, the release
        fails or runs first, the server resumes and runs the attempt); on a quorum, its
        release gives back to each node whose reply was lost. A lost reply is given back by
        the nodes (hazard 6). (No context manager: this is every acquire's path.)"""
        if classify(exc) is not None:
            return
        released = False
        with contextlib.suppress(Exception):
            released = self.do_release(token)
        if not released and not self.nodes.gives_back_per_node:  # one node: a SingleNode
            release = functools.partial(self.do_release, token)
            give_back(self.key, release, node=getattr(self.nodes, "node", None))

    def _saw(self, holder: str | None, pttl: int | None) -> None:
        """As the core's; without a PTTL in a single node's reply, :attr:`last_holder_ttl` asks
        Redis on first read (a quorum's vote gives all it knows: ``ttl_in_reply``)."""
        super()._saw(holder, pttl)
        pending = pttl is None and holder is not None
        self._holder_ttl_pending = pending and not self.nodes.ttl_in_reply


def release_attempt(
    redis: Target,
    name: str,
    prefix: str,
    owner: str,
    host: str | None,
    pid: int,
    *,
    limit: int = 1,
    timeout: float | None = None,
    keep: float = 0.0,
) -> bool:
    """Release lock ``name`` only if it was taken by ``owner`` on ``host`` in process ``pid``.

    **This bypasses the owner secret.** Task id, host and pid are stored in clear text in the
    token (anyone who can read the key sees them, and a pid is guessable), so whoever can call
    this can release a *live* lock. It is a supervisor tool, for the worker's main process
    releasing on behalf of a pool child that died (it never knew the secret part of the
    token), and it is private on purpose: the public way to release someone else's lock is
    ``celery redlock release``, which checks the holder's liveness and compares the exact
    stored token.

    ``limit`` is the lock's number of slots (all are searched). ``keep`` (seconds): a cooldown,
    as ``release(keep=...)`` applies it: the slot is kept that long, marked as a cooldown,
    instead of being deleted; a slot already marked (released before) is left as it is.
    Returns whether a slot was released; raises :class:`LockUnavailable`. ``timeout`` sets
    the socket timeouts of clients built from URLs.
    """
    keys = _keys.keys_for(prefix, name, limit)
    nodes = nodes_for(redis, timeout)
    keep_ms = ms(keep) if keep > 0 else 0
    return nodes.release_attempt(keys, owner, _owner.normalize_host(host), pid, keep_ms)


def _within(seconds: float, call: Callable[[], Extended]) -> Extended:
    """``call()`` in a helper thread, waited for at most ``seconds``.

    Raises :class:`TimeoutError` when it has not returned by then: the call then finishes in
    the background (at its socket timeout) and its outcome is dropped. So a server that does
    not answer has its lock marked lost when the lease ends, not when the socket timeout, and
    a reconnect's handshake as long again, let the call fail seconds later.
    """
    outcome: list[Extended] = []
    failure: list[BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # handed to the waiting thread
            failure.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name="celery-redlock-renew-call", daemon=True).start()
    if not done.wait(seconds):
        raise TimeoutError(f"no reply from Redis within the rest of the lease ({seconds:.3f}s)")
    if failure:
        raise failure[0]
    return outcome[0]
