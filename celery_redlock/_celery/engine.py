"""The one execution path of a locked task, shared by ``LockedTask`` and ``@single_instance``.

:func:`execute` runs one attempt: it takes the lock (:func:`enter`, whose docstring lists its
steps in order), runs the body, and releases (:func:`leave`) as soon as the body returns or
raises. ``LockedTask.__call__`` and the ``@single_instance`` wrapper both call it, so both APIs
release at the same moment:

1. the body returns (or raises);
2. the lock is released here, with ``lock_cooldown`` applied;
3. only then does Celery's tracer store the result, send the callbacks and chords' parts,
   and run ``on_success``/``after_return``.

So a caller that holds the result can call again at once and the call runs; a skipped call
(``skip``) returns ``None`` without running the body. Endings that never return to step 2
(the pool child killed, a hard time limit) are covered by the backstops in
:mod:`celery_redlock._celery.wiring` and :mod:`celery_redlock._celery.parent`, which are
idempotent: each release happens at most once.

The state of one attempt (its :class:`~celery_redlock.Lock`, or the decision to skip) lives on
``task.request``, which Celery keeps per thread and per greenlet: with the threads or gevent
pool many executions share one task instance, so nothing per-execution is stored on the task.
The app's settings are resolved once per attempt, in :func:`enter`, and travel with it.

TTL rule, decided in :func:`_make_lock` for each execution:

* ``lock_ttl`` set: a fixed TTL of that many seconds, never renewed.
* otherwise a lease of ``redlock_lease`` seconds, renewed every lease/3 by a watchdog thread
  while the task runs. If the pool enforces a hard time limit T (prefork, gevent), renewal
  never extends the lock past acquisition + T + ``redlock_ttl_margin``. T is
  ``request.time_limit or task.time_limit or`` the worker's ``--time-limit`` (captured in the
  worker's main process before the pool forks, see :mod:`celery_redlock._celery.state`).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

from celery import current_task, states
from celery import signals as celery_signals
from celery._state import get_current_worker_task
from celery.exceptions import Ignore, Reject, Retry, SoftTimeLimitExceeded
from celery.utils.time import maybe_iso8601

from .. import signals
from .._redis import companions
from .._redis import keys as _keys
from .._redis.clients import redact
from .._redis.lock import Lock, release_attempt
from .._redis.nodes import Extended
from .._redis.owner import current_pid
from ..exceptions import LockContended, LockLost, LockUnavailable, RateLimited
from . import calls, supersede, tracing
from .events import emit
from .identity import Spec, check_not_mapped, lock_name_for, spec_of
from .options import (
    KEEPING_MODES,
    Settings,
    contention_policy,
    cross_check,
    settings_for,
    spelled,
    supersedes,
)
from .results import has_ended, stored_state
from .state import state

logger = logging.getLogger("celery_redlock.task")

T = TypeVar("T")

#: Attribute of ``task.request`` holding the :class:`Execution` of the running attempt.
REQUEST_ATTR = "redlock_execution"

#: Key of ``task.__dict__``: the :class:`Settings` the task was cross-checked against.
_CHECKED = "_redlock_checked"

#: ``id()`` of this process's executions that hold a lock (added when :func:`enter` takes it,
#: removed by :func:`leave`): the ``task_postrun`` backstop looks at the request only while
#: one does (about 8,000 instructions spared per execution of every task, locked or not).
held: set[int] = set()

#: ``ids``: the task ids of the executions running their body on this thread, outermost
#: first. A call one of them makes of a key it holds (``sync_account.apply((42,))`` in
#: ``sync_account(42)``) cannot wait that key out: its holder ends only after it.
_running = threading.local()


@dataclass(slots=True)
class Execution:
    """What :func:`enter` decided for one attempt."""

    lock: Lock | None
    skipped: bool = False
    #: ``lock_cooldown`` of the attempt: how long its release keeps the key.
    cooldown: float = 0.0
    settings: Settings | None = None
    #: ``self.replace()`` published the call's replacement (``LockedTask.on_replace``).
    replaced: bool = False


def execute(
    task: Any,
    args: Any,
    kwargs: Any,
    body: Callable[[], T],
    request: Any = None,
    spec: Spec | None = None,
) -> T | None:
    """Run ``body`` as one locked attempt of ``task`` called with ``args``/``kwargs``.

    Returns the body's result, or ``None`` when the call is skipped. Raises ``Retry``
    (through ``task.retry``), :class:`LockContended` or :class:`LockUnavailable` according to
    the policies. A direct call (``task(x)``, no worker, no ``apply()``) runs unlocked, but
    not one made by ``map()``, ``starmap()`` or ``chunks()`` (:func:`check_not_mapped`).
    ``request``: ``task.request``, and ``spec``: ``spec_of(task)``, when the caller has them.
    """
    if request is None:
        request = task.request
    if called_directly(request):
        check_not_mapped(task, get_current_worker_task())
        return body()
    if spec is None:
        spec = spec_of(task)
        if spec is None:
            return body()
    if spec.options.enqueue == "until_executed":
        return _until_executed(task, request, spec, args, kwargs, body)
    return _attempt(task, request, spec, args, kwargs, body)


def called_directly(request: Any) -> bool:
    """Whether a call on ``request`` is a direct call, which runs the body unlocked.

    That is ``task(x)`` outside a worker and ``apply()``, and also a body calling its own task
    directly (recursion): the running execution's request is on top then (``LockedTask``'s
    ``__call__`` runs before Celery pushes one; Celery 5.5 and later copy it for the inner
    call), with its execution begun (:data:`REQUEST_ATTR`). The inner call is part of that
    execution: it runs under the execution's lock (:func:`current_lock` there is that lock
    where Celery copied the request, ``None`` on 5.3 and 5.4, which push a fresh one). Taking
    a lock of its own instead would contend with the running execution on the same key
    (skipped, or waiting on itself), or, for ``LockedTask``, replace the execution's lock on
    the request, leaving it held after the task until its lease ended.
    """
    return bool(request.called_directly) or getattr(request, REQUEST_ATTR, None) is not None


def _attempt(
    task: Any, request: Any, spec: Spec, args: Any, kwargs: Any, body: Callable[[], T]
) -> T | None:
    """:func:`enter`, the body, :func:`leave`."""
    if not enter(task, request, spec, args, kwargs):
        return None
    running = _running.__dict__.setdefault("ids", [])
    running.append(str(request.id or ""))  # as the owner token spells it
    try:
        result = body()
    except Retry:
        leave(task, request, cooldown=False)  # not finished: the retry must not wait
        raise
    except BaseException as exc:
        leave(task, request, cooldown=not _autoretried(task, request, exc))
        raise
    finally:
        running.pop()
    leave(task, request)
    return result


def replaced(task: Any, sig: Any) -> None:
    """``self.replace(sig)`` is publishing the replacement of the running call: release its
    lock without the cooldown; keep its ``until_executed`` marker (:func:`_until_executed`)
    if ``sig`` is a call of the same task on the same key, whose end clears it."""
    request = task.request
    execution = getattr(request, REQUEST_ATTR, None)
    if execution is not None:
        execution.replaced = _same_key(task, request, sig)
    leave(task, request, cooldown=False)


def _same_key(task: Any, request: Any, sig: Any) -> bool:
    """Whether ``sig`` calls ``task`` with arguments of the same lock name as ``request``'s."""
    spec = spec_of(task)
    if spec is None or not isinstance(sig, Mapping) or sig.get("task") != task.name:
        return False  # another task, a chain, a group: nothing clears the marker at its end
    try:
        mine = lock_name_for(task, spec, request.args or (), request.kwargs or {})
        return lock_name_for(task, spec, sig.get("args") or (), sig.get("kwargs") or {}) == mine
    except Exception:  # a lock_by callable that raises, arguments that do not bind
        return False


def _autoretried(task: Any, request: Any, exc: BaseException) -> bool:
    """Whether Celery's ``autoretry_for`` turns ``exc``, raised by the body, into a retry of
    the call, which must not keep the cooldown (as a ``Retry`` does not, in :func:`_attempt`).

    Under ``@single_instance`` the lock is taken inside ``run``, which Celery's autoretry
    wraps: the engine sees the body's own exception before autoretry publishes the retry.
    Timeline without this: (1) ``cooldown=5``, ``autoretry_for=(ValueError,)``; the body
    raises ``ValueError``; (2) the lock is released with the cooldown; (3) autoretry publishes
    the retry, which finds the key kept by its own earlier attempt and is requeued until the
    cooldown ends. ``LockedTask`` takes the lock outside that wrapper: such an exception
    reaches it only once the retries are spent, the call's last ending, which keeps the
    cooldown. Mirrors ``celery.app.autoretry`` and ``Task.retry`` (Celery 5.3 to 5.7): the
    task's ``autoretry_for`` less ``dont_autoretry_for``, then ``max_retries`` from
    ``retry_kwargs`` or the task, spent when ``request.retries + 1`` exceeds it.
    """
    retry_for = getattr(task, "autoretry_for", None)
    if not retry_for or "_orig_run" not in vars(task):  # no autoretry wrapping
        return False
    if isinstance(exc, (Ignore, Retry)) or not isinstance(exc, tuple(retry_for)):
        return False
    if isinstance(exc, tuple(getattr(task, "dont_autoretry_for", None) or ())):
        return False
    limit = (getattr(task, "retry_kwargs", None) or {}).get("max_retries")
    if hasattr(task, "override_max_retries"):
        limit = task.override_max_retries
    if limit is None:
        limit = task.max_retries
    return limit is None or request.retries + 1 <= limit


def _until_executed(
    task: Any, request: Any, spec: Spec, args: Any, kwargs: Any, body: Callable[[], T]
) -> T | None:
    """:func:`_attempt` under ``lock_enqueue='until_executed'``: the queued marker of a call
    is cleared when its execution ends (returns, raises, is skipped), not when it starts.

    So a ``delay()`` while the call is queued *or running* returns that call's
    ``AsyncResult``. A retry (``Retry``) keeps it: the call is not finished, and its retry has
    the same task id. So does a replacement by a call of the same task on the same key
    (``self.replace(X.si(...))``, :func:`replaced`), which finishes the call under its task id
    and clears the marker when it ends. Timeline if the ``Ignore`` of ``replace()`` cleared
    it: (1) X replaces itself with ``X.si(...)``, which runs under X's id; (2) while it runs,
    a ``delay()`` finds no marker and publishes Y, a second run of the call that was running.
    Any other replacement (another task, another key, a chain or group) clears it as the call
    is replaced: nothing would clear it at its end, and without a result backend that keeps
    states, every call of the key would be refused until ``lock_enqueue_ttl``.

    The marker is cleared before Celery stores the result, so a caller that holds the result
    can call again at once. An execution that never ends here (the pool
    child killed, a hard time limit) leaves it to the worker's main process
    (:func:`~celery_redlock._celery.parent.settle_marker`), or else to ``lock_enqueue_ttl``.
    """
    task_id = request.id
    try:
        return _attempt(task, request, spec, args, kwargs, body)
    except Retry:
        task_id = None
        raise
    except Ignore:
        execution = getattr(request, REQUEST_ATTR, None)
        if execution is not None and execution.replaced:
            task_id = None
        raise
    except BaseException as exc:
        if left_to_parent(task, exc):
            task_id = None
        raise
    finally:
        if task_id is not None:
            clear_queued(task, args, kwargs, task_id)


@tracing.traced_acquire
def enter(task: Any, request: Any, spec: Spec, args: Any, kwargs: Any) -> bool:
    """Take the lock of the attempt behind ``request``; return False when the body must be
    skipped. ``spec`` is the task's (:func:`spec_of`).

    The steps, in order; each may end the attempt (skip, requeue or raise):

    0. under ``worker_deduplicate_successful_tasks``, the requeue of a redelivered copy of a
       call that succeeded is not run again (:func:`_drop_if_ended`);
    1. the app's settings, resolved once for the whole attempt;
    2. the lock name: the task's lock name and the digest of the call's identity (no per-call
       option changes it);
    3. ``lock_enqueue='keep'``: the queued marker, cleared once steps 4 to 9 decided the
       attempt: it takes its lock and starts, or ends without running (skipped, failed). An
       attempt requeued by the lock or a rate limit (``Retry``, the same task id), or waiting
       for the lock, keeps it: the call is still the one queued. Cleared on arrival instead,
       (1) X arrives and is requeued by the lock; (2) a ``delay()`` finds no marker and
       publishes Y; (3) Y is requeued too; and so on: every call made while the key was held
       ran, one after another;
    4. the call's header, parsed once: its per-call overrides applied to ``spec``
       (:class:`~celery_redlock.LockConfigError` if one is invalid); the task's options
       cross-checked against the settings, once per task;
    5. ``lock_bypass``: the call runs without the lock;
    6. ``lock_enqueue='replace'`` or ``lock_debounce``: a call superseded by a newer one skips;
    7. the lock, non-blocking; under ``wait`` then blocking, and a call superseded while it
       waited gives it back and skips; if still held, the contention policy (skip, requeue
       or fail); with ``lock_limit=None`` there is no lock to take;
    8. ``lock_rate``: the start admitted, or the call requeued for its slot;
    9. the per-call overrides recorded beside the lock, the acquisition reported.
    """
    header = calls.header_of(request)
    _drop_if_ended(task, request, header)
    settings = settings_for(task.app)
    name = lock_name_for(task, spec, args, kwargs, settings)
    tracing.lock_name(settings.prefix, name)
    if spec.options.enqueue != "keep":
        return _take(task, request, spec, settings, name, header)
    try:
        taken = _take(task, request, spec, settings, name, header)
    except Retry:
        raise
    except BaseException as exc:
        if not left_to_parent(task, exc):
            _clear_queued(task, settings, name, request.id)
        raise
    _clear_queued(task, settings, name, request.id)
    return taken


def left_to_parent(task: Any, exc: BaseException) -> bool:
    """Whether a pool child unwinding with ``exc`` leaves the call's queued marker to the
    worker's main process (:func:`~celery_redlock._celery.parent.settle_marker`), which
    knows whether Celery queues the call again.

    The child is being stopped (``SystemExit``: billiard's SIGTERM at a hard time limit, a
    ``revoke(terminate=True)``, a shutdown) and the call may come back: under ``acks_late``
    its message is requeued or redelivered, under ``task_retry_on_worker_lost`` sent again.
    Timeline if the child cleared it: (1) X, ``until_executed``, hits its hard limit; (2) its
    child unwinds on SIGTERM and clears X's marker; (3) Celery requeues X; (4) a ``delay()``
    of the key finds no marker and publishes Y beside the queued X. An acknowledged call
    that is not sent again is gone: its child clears the marker itself. So does any other
    pool (threads, solo, gevent), where no main process settles it: a ``SystemExit`` there is
    the body's own (``sys.exit()``), and under ``task_retry_on_worker_lost`` nothing sends
    that call again.
    """
    if not state.pool_children or not isinstance(exc, (SystemExit, KeyboardInterrupt)):
        return False
    return bool(task.acks_late or getattr(task, "retry_on_worker_lost", False))


def _take(task: Any, request: Any, spec: Spec, settings: Settings, name: str, header: Any) -> bool:
    """Steps 4 to 9 of :func:`enter`: run unlocked, skip, take the lock or requeue."""
    if header:  # the usual call carries no header
        spec = calls.call_spec(spec, header)
    options = spec.options
    if task.__dict__.get(_CHECKED) is not settings:
        cross_check(spec.owner, options, settings, spec.keywords)
        task.__dict__[_CHECKED] = settings
    if header and calls.bypassed(header):
        return _bypass(task, settings, name, request)
    if supersedes(options) and supersede.superseded(task, spec, settings, name, request):
        setattr(request, REQUEST_ATTR, Execution(None, skipped=True))
        return False
    lock = _make_lock(task, spec, settings, name, request)
    if options.limit is None:  # lock_rate alone: nothing to exclude
        _check_rate(task, spec, settings, request, lock)
        setattr(request, REQUEST_ATTR, Execution(None, settings=settings))
        return True
    policy = contention_policy(spec.options, settings)
    execution = None
    try:
        try:
            acquired = _acquire(task, spec, request, lock, policy)
        except LockUnavailable as exc:
            return _on_unavailable(task, spec, settings, request, exc, lock)
        if not acquired:
            return _on_contended(task, spec, settings, request, lock, policy)
        waited = lock.attempts > 1
        if waited and _superseded_while_waiting(task, spec, settings, name, request, lock):
            return False
        if waited and _expired(request):
            _revoke_expired(task, request, lock)
        if options.rate is not None:
            _check_rate(task, spec, settings, request, lock)
        execution = Execution(lock, cooldown=options.cooldown, settings=settings)
        held.add(id(execution))  # what the backstop looks for: then what it releases
        setattr(request, REQUEST_ATTR, execution)
    except BaseException:
        # Until both are done, no backstop knows of the lock: give it back (quietly: it was
        # never reported as acquired; a step above that gave it back, or a lock never
        # taken, leaves nothing to do). Timeline without: (1) the lock is taken; (2) a soft
        # time limit's handler raises during the rate check's round trip; (3) the call fails,
        # and the key stays held by nobody until its lease ends (2 calls in 120 with a limit
        # of a few ms).
        if execution is not None:
            held.discard(id(execution))
            if getattr(request, REQUEST_ATTR, None) is execution:
                setattr(request, REQUEST_ATTR, None)
        _release(task, request, lock)
        raise
    if header:  # the usual call has no overrides to record
        _record_overrides(settings, lock, request, header)
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("%s[%s] acquired %s", task.name, request.id, lock.key)
    # A single-node lock reads its fencing token on first use (one round trip): only when
    # someone listens for it. The lock is held by then: a read that fails gives the receivers
    # None, and the call runs (failing it would leave its lock held until the TTL).
    fencing = None
    if signals.lock_acquired.receivers:
        try:
            fencing = lock.fencing_token
        except LockUnavailable as exc:
            logger.warning(
                "%s[%s] acquired %s; lock_acquired gets no fencing token, reading it failed: %s",
                task.name,
                request.id,
                lock.key,
                exc,
            )
    emit(
        task,
        request.id,
        "acquired",
        signals.lock_acquired,
        settings,
        {"key": lock.key, "fencing_token": fencing},
    )
    return True


def _superseded_while_waiting(
    task: Any, spec: Spec, settings: Settings, name: str, request: Any, lock: TaskLock
) -> bool:
    """After a wait for the lock, under ``lock_enqueue='replace'`` or ``lock_debounce``:
    whether a newer call of the key was published meanwhile; if so, the lock goes back
    (quietly: it was never reported as acquired) and the call ends as superseded. The check
    before the lock alone let older arguments run after newer ones:

    1. call 1 runs; calls 2 and 3 arrive, pass the check (each was the newest then) and
       wait (``on_contention="wait"``);
    2. call 1 ends; call 3 takes the lock (or, on a ``lock_limit`` semaphore, whose waiters
       are not served in order, a slot) and runs;
    3. call 2 takes the lock after it and runs: the older arguments land last.
    """
    if not supersedes(spec.options):
        return False
    try:
        if not supersede.superseded(task, spec, settings, name, request):
            return False
    except BaseException:
        _release(task, request, lock)
        raise
    _release(task, request, lock)
    setattr(request, REQUEST_ATTR, Execution(None, skipped=True))
    return True


def _expired(request: Any) -> bool:
    """Whether the call's ``expires`` has passed (never for an eager call, which Celery runs
    whatever its ``expires``). A naive one is UTC, as Celery's worker reads it: as local
    time, a host east of UTC dropped calls Celery holds valid for hours."""
    expires = getattr(request, "expires", None)
    if not expires or request.is_eager:
        return False
    when = maybe_iso8601(expires) if isinstance(expires, str) else expires
    if not isinstance(when, datetime.datetime):
        return False
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return datetime.datetime.now(datetime.timezone.utc) > when


def _revoke_expired(task: Any, request: Any, lock: Lock) -> NoReturn:
    """End a call whose ``expires`` passed while it waited for the lock (whether it got the
    lock or its wait timed out) as Celery ends one whose message expired in the queue: the
    lock goes back (quietly: it was never reported as acquired), the call is REVOKED
    (``task_revoked`` with ``expired=True``, which clears a ``lock_enqueue`` marker, and a
    ``task-revoked`` event), and the body does not run. Timeline without: (1) a beat send
    with ``expires=50`` waits for the lock (``wait``) behind a run of 2 minutes; (2) the
    run ends; (3) the stale send ran, though Celery drops one that expires in the queue; and
    under ``lock_enqueue`` its marker had ended at ``expires``, so the next send was queued
    too, and the key ran three times for two sends. (A ``revoke()`` without ``terminate``
    reaches only the worker's main process: a waiting call does not see it.)"""
    _release(task, request, lock)
    setattr(request, REQUEST_ATTR, Execution(None, skipped=True))
    logger.info(
        "%s[%s] expired while it waited for %s (expires %s): revoked, not run",
        task.name,
        request.id,
        lock.key,
        request.expires,
    )
    per_call = vars(request).get("ignore_result")  # Celery 5.7's per-call option
    ignored = task.ignore_result if per_call is None else per_call
    store = not ignored or task.store_errors_even_if_ignored  # as Celery's Request
    task.backend.mark_as_revoked(request.id, "expired", request=request, store_result=store)
    celery_signals.task_revoked.send(
        sender=task, request=request, terminated=False, signum=None, expired=True
    )
    task.send_event("task-revoked", terminated=False, signum=None, expired=True)  # with -E
    with contextlib.suppress(SoftTimeLimitExceeded):  # stored REVOKED: decided (see leave)
        emit(task, request.id, "expired", fields={"key": lock.key})
    raise Ignore()


def _hard_limit(task: Any, request: Any) -> float | None:
    if not state.enforces_limits:
        return None
    # request.timelimit, (hard, soft) as sent with the call, exists in every Celery version;
    # request.time_limit only from 5.7 (reading it would drop a per-call limit before that).
    per_call = (getattr(request, "timelimit", None) or (None, None))[0]
    limit = per_call or task.time_limit or state.time_limit
    return float(limit) if limit else None


class TaskLock(Lock):
    """The lock of one task execution: reports a loss through signals and counters too."""

    task: Any = None
    #: A task id holds one slot of a ``lock_limit`` semaphore at most: a duplicate delivery
    #: finds its own run holding and is requeued, as with a lock of one slot.
    one_slot_per_owner = True
    #: Its arguments come from validated settings and Celery's request (``_make_lock``).
    checked_by_caller = True
    #: ``redlock_ttl_margin`` when ``max_hold`` is the hard time limit's cap (else ``None``).
    margin: float | None = None
    #: ``(url, slot)`` of the per-call overrides record written at acquisition, if any.
    call_record: tuple[str, str] | None = None

    def _past_cap(self) -> float | None:
        """Renew past the hard time limit's cap, ``margin`` at a time, while the run goes on.

        The cap (acquisition + T + margin) frees the key soon after a whole worker dies; it
        trusts the worker's main process to kill the child at T. Timeline without this (seen
        on a real worker): (1) a task with ``time_limit=4`` runs; (2) the worker's link to
        the broker stalls, and its main process, blocked, enforces no time limit; (3) at
        4 + 5 s the lock expires while the child runs on; (4) another worker runs the same
        key beside it. Renewed past the cap, the key frees within ``margin`` of the child's
        death instead."""
        return self.margin

    def on_lost(self, reason: str) -> None:
        """Report the loss; a fixed-TTL lock held past its TTL says that the run overran it.

        The run is timed from the lock's acquisition moment: (1) the lock reads its clock and
        sends the acquire; (2) Redis runs it, and the TTL starts; (3) the reply arrives. Timed
        from (3), a reply late by d made a run that outlived its key read as ``ttl - d``, and
        the loss as a plain "no longer held"; timed from (1), it reads at least the key's life.
        """
        ran = self.clock() - self._acquired_at
        if not self.auto_renew and ran >= self.ttl:
            reason = (
                f"the run took longer than lock_ttl={self.ttl:g}s (about {ran:.1f}s), so the "
                "key expired while it ran and another call may have started beside it; raise "
                "lock_ttl, or leave it None for a lease renewed while the task runs"
            )
        super().on_lost(reason)
        if self.task is not None:
            emit(
                self.task,
                self.owner,
                "lost",
                signals.lock_lost,
                fields={"key": self.key, "reason": reason},
            )

    def do_extend(self, token: str, ttl: float) -> Extended:
        """Extend the lock, and the overrides record with it (advisory: errors are ignored)."""
        try:
            extended = super().do_extend(token, ttl)
        except Exception as error:
            tracing.renewal_failed(self.owner, self.key, error)
            raise
        if extended.held and self.call_record is not None:
            companions.extend_call_record(*self.call_record, int(ttl * 1000))
        return extended


def _record_overrides(
    settings: Settings, lock: TaskLock, request: Any, header: Mapping[str, Any]
) -> None:
    """Store the call's overrides beside the slot it holds, for ``celery redlock inspect``.

    One ``SET PX`` with the lock's TTL (renewal extends it), on the first node that answers;
    it names the holder's token, so a record outliving its lock is never shown for another
    holder. Advisory: a failure is logged at DEBUG and the task runs on.
    """
    overrides = calls.overrides_of(header)
    if not overrides or lock.token is None:
        return
    urls = [settings.url] if isinstance(settings.url, str) else list(settings.url)
    ttl_ms = int(lock.ttl * 1000)
    url = companions.write_call_record(urls, lock.key, lock.token, request.id, overrides, ttl_ms)
    lock.call_record = None if url is None else (url, lock.key)


def _make_lock(task: Any, spec: Spec, settings: Settings, name: str, request: Any) -> TaskLock:
    options = spec.options
    if options.ttl is not None:
        ttl, renewed, max_hold = options.ttl, False, None
    else:
        limit = _hard_limit(task, request)
        ttl, renewed = settings.lease, True
        max_hold = None if limit is None else limit + settings.ttl_margin
    lock = TaskLock(
        settings.url,
        name,
        ttl,
        prefix=settings.prefix,
        owner=str(request.id or ""),  # an eager call may be given a UUID object
        host=request.hostname,
        auto_renew=renewed,
        max_hold=max_hold,
        limit=options.limit or 1,
    )
    lock.task = task
    if max_hold is not None:
        lock.margin = settings.ttl_margin
    return lock


def _acquire(task: Any, spec: Spec, request: Any, lock: TaskLock, policy: str) -> bool:
    """Take ``lock`` without blocking; under ``wait``, then wait up to ``lock_wait_timeout``.

    Returns whether it is held; a call that does not hold it goes to :func:`_on_contended`,
    also after a wait that timed out. A call whose own task id holds the key does not wait:
    it is a duplicate of that run (:func:`_on_contended` requeues it), and its wait could
    only end with the run's release or, for a run that died with its worker, its TTL. Nor
    does a call that an execution holding the key made on this thread (:data:`_running`),
    which :func:`_on_contended` fails at once. However it ends, the tries the lock made go to
    the span.
    """
    try:
        if lock.acquire(blocking=False):
            return True
        if policy != "wait" or spec.options.wait_timeout <= 0 or _holder(lock) == request.id:
            return False
        if _held_around(lock):
            return False
        _report_contended(task, request, lock, "waited", policy)
        return lock.acquire(blocking=True, timeout=spec.options.wait_timeout)
    finally:
        tracing.attempts(lock.attempts)


def _jittered(seconds: float) -> float:
    return seconds * random.uniform(1.0, 1.2)


def _bypass(task: Any, settings: Settings, name: str, request: Any) -> bool:
    """Run this call without the lock, as ``apply_async(..., lock_bypass=True)`` asked."""
    logger.warning(
        "%s[%s] runs WITHOUT the lock %s (lock_bypass=True): it does not exclude other calls",
        task.name,
        request.id,
        _keys.keys_for(settings.prefix, name).lock,
    )
    setattr(request, REQUEST_ATTR, Execution(None))
    emit(task, request.id, "bypassed", settings=settings)
    return True


def _drop_if_ended(task: Any, request: Any, header: Mapping[str, Any]) -> None:
    """Under Celery's ``worker_deduplicate_successful_tasks``, raise ``Ignore`` for the
    requeue of a redelivered copy of a call that the result backend says succeeded.

    Celery drops a redelivered copy of a successful call itself (``acks_late`` tasks), but
    not the requeue the lock publishes for one, a new message without the broker's flag.
    Timeline (a Redis broker ``visibility_timeout`` shorter than the task): (1) call X runs;
    (2) its message is redelivered, finds X holding the key and is requeued for the holder's
    TTL; (3) X ends, SUCCESS; (4) the requeue comes back to a free key and runs X's body
    again. Only SUCCESS, as Celery: a call that failed at its hard time limit is requeued by
    Celery (``acks_on_failure_or_timeout=False``) to run again. Off by default, as Celery's:
    a call that reuses a task id is dropped too.
    """
    if not calls.redelivered(header) and not (request.delivery_info or {}).get("redelivered"):
        return
    if not task.app.conf.get("worker_deduplicate_successful_tasks"):
        return
    if stored_state(task, request.id) == states.SUCCESS:
        logger.info(
            "%s[%s] is a redelivered copy of a call that already succeeded: not run again "
            "(worker_deduplicate_successful_tasks)",
            task.name,
            request.id,
        )
        raise Ignore()


def _holder(lock: Lock) -> str | None:
    """The holder's task id; ``None`` when not read, or for a ``Lock`` of your own (no id)."""
    return (lock.last_holder.task_id or None) if lock.last_holder else None


def _held_by(lock: Lock) -> str:
    """``held by task <id>``, or, for a key kept after its holder ended (``lock_cooldown``),
    ``in the cooldown of task <id>``: a log line said "held by" a task that had ended. A
    ``Lock`` of your own (``owner=""``) holds with no task id: "held by task " said nothing."""
    holder = lock.last_holder
    if holder is not None and holder.cooling:
        return f"in the cooldown of task {holder.task_id}"
    if holder is not None and not holder.task_id:
        return "held by a lock with no task id (a Lock of your own)"
    return f"held by task {_holder(lock)}"


def _contended_error(
    task: Any, request: Any, lock: Lock, waited: float | None = None
) -> LockContended:
    if waited is not None:  # the TTL read when the wait began is stale by now: not shown
        return LockContended(
            f"{task.name}[{request.id}]: {lock.key} still {_held_by(lock)} after "
            f"waiting {waited:.1f} s (lock_wait_timeout)",
            key=lock.key,
            holder=_holder(lock),
        )
    ttl = lock.last_holder_ttl  # None: unknown (a quorum's split vote), or no expiry
    return LockContended(
        f"{task.name}[{request.id}]: {lock.key} is {_held_by(lock)} "
        + ("(ttl unknown)" if ttl is None else f"(ttl {round(ttl, 3)}s)"),
        key=lock.key,
        holder=_holder(lock),
        ttl=ttl,
    )


def _duplicate(request: Any, lock: Lock) -> str | None:
    """Why the call behind ``request`` is a duplicate of a live run (``None``: it is not), as
    its requeue's log line says it: a redelivered message (acks_late after a lost worker or
    a visibility timeout), a requeue of one, or a call that finds its own task id holding the
    key (a copy of it still running, or an earlier try whose reply was lost, until its
    give-back lands)."""
    own = _holder(lock) == request.id
    if (request.delivery_info or {}).get("redelivered"):
        return "redelivered while"
    if calls.redelivered(calls.header_of(request)):
        return "requeued as a duplicate while" if own else "requeued again (redelivered) while"
    if own:
        return (
            "found its own task id holding the lock (a copy of this call still running, or "
            "an earlier try whose reply was lost):"
        )
    return None


def _on_contended(
    task: Any, spec: Spec, settings: Settings, request: Any, lock: Lock, policy: str
) -> bool:
    """Apply the contention policy to a call that does not hold ``lock``: skip (return
    False), requeue or fail. A duplicate delivery is requeued whatever the policy; under
    ``wait``, the call gets here after its wait timed out (reported as contended when it
    began), unless it is a duplicate, which does not wait (:func:`_acquire`)."""
    why = _duplicate(request, lock)
    if why is not None:
        # A duplicate of a live run, or maybe the only copy left: never skip it (a skip would
        # store SUCCESS/None and hide the holder's result; calls.py says why its requeues
        # stay marked). Held by a copy of itself, it comes back when the holder's TTL ends;
        # held by another call, after lock_retry_countdown. Timeline with the holder's TTL
        # for any holder: (1) a warm shutdown puts its prefetched calls back, marked
        # redelivered; (2) a call of a busy key finds it held by another, renewed call; (3)
        # it came back after that TTL, a whole lease (30 s), and again: five calls of one
        # key, each behind a 4 s run, settled over 127 s instead of 11.
        if _holder(lock) == request.id:
            countdown = max(lock.last_holder_ttl or 0.0, 1.0)
        else:  # at least 1 s: lock_retry_countdown=0 looped through the broker
            countdown = max(_jittered(spec.options.retry_countdown), 1.0)
        _requeue(task, request, spec, lock, countdown, "redelivered", why)
    if policy == "skip":
        setattr(request, REQUEST_ATTR, Execution(None, skipped=True))
        logger.info("%s[%s] skipped: %s is %s", task.name, request.id, lock.key, _held_by(lock))
        _report_contended(task, request, lock, "skipped", policy)
        return False
    if policy == "retry":
        countdown = _jittered(spec.options.retry_countdown)
        _requeue(task, request, spec, lock, countdown, policy, "contended:")
    timeout = spec.options.wait_timeout
    if policy == "wait" and _expired(request):  # expired while it waited, in vain
        _revoke_expired(task, request, lock)
    if policy == "wait" and timeout > 0 and _held_around(lock):
        _report_contended(task, request, lock, "failed", policy)
        raise LockContended(
            f"{task.name}[{request.id}]: {lock.key} is {_held_by(lock)}, which made this call "
            "on this thread and ends only after it: a wait would last lock_wait_timeout and "
            "fail; call the task directly (task(...), not apply()) to run it under that lock",
            key=lock.key,
            holder=_holder(lock),
        )
    if policy == "wait" and timeout > 0:
        emit(task, request.id, "failed", settings=settings)
        raise _contended_error(task, request, lock, waited=timeout)
    _report_contended(task, request, lock, "failed", policy)
    raise _contended_error(task, request, lock)


def _held_around(lock: Lock) -> bool:
    """Whether ``lock``'s holder is an execution running on this thread, around this call.
    Not for a semaphore (``lock_limit`` > 1): the holder read is that of the slot that frees
    first, and another slot may still free within the wait."""
    holder = _holder(lock)
    return lock.limit == 1 and holder is not None and holder in getattr(_running, "ids", ())


def _requeue(
    task: Any, request: Any, spec: Spec, lock: Lock, countdown: float, policy: str, why: str
) -> NoReturn:
    """Requeue a contended call through :func:`lock_retry`, logging ``<why> <key> is held``."""

    def report(event: str) -> None:
        if event == "retried":
            logger.info(
                "%s[%s] %s %s is %s; retrying in %.1fs",
                task.name,
                request.id,
                why,
                lock.key,
                _held_by(lock),
                countdown,
            )
        _report_contended(task, request, lock, event, policy)

    error = _contended_error(task, request, lock)
    lock_retry(task, request, spec, countdown, error, report, redelivered=policy == "redelivered")


def _report_contended(task: Any, request: Any, lock: Lock, event: str, policy: str) -> None:
    emit(
        task,
        request.id,
        event,
        signals.lock_contended,
        fields={"key": lock.key, "holder": _holder(lock), "policy": policy},
    )


def lock_retry(
    task: Any,
    request: Any,
    spec: Spec,
    countdown: float,
    exc: LockContended,
    report: Callable[[str], None] | None = None,
    *,
    redelivered: bool = False,
) -> NoReturn:
    """Requeue the call behind ``request`` because of the lock; raise ``Retry``.

    Every requeue caused by the lock goes through here (the ``retry`` policy, a redelivered
    duplicate, the rate limit). It publishes the retry as ``self.retry()`` does, with the same
    ``Retry`` (state RETRY, the worker's ``Retry in Ns`` line, ``on_retry``), but leaves
    ``request.retries`` unchanged: ``max_retries`` and ``autoretry_for`` count only the task's
    own failures. Its own bound is ``lock_retry_for``, measured from the call's first requeue
    by the lock (its time travels in the message, see :mod:`celery_redlock._celery.calls`): a
    requeue whose countdown would end past the bound is not made, and the call fails at once
    with ``exc``, an expected outcome that Celery logs at INFO. So with ``lock_retry_for=2``
    and a rate slot 60 s away, the call fails now instead of running a minute later.
    ``report(event)`` reports the outcome: ``"retried"`` just before the retry is published,
    ``"failed"`` when the call gives up (without it, the event is only counted).
    ``redelivered`` marks the requeue of a redelivered copy, which is never skipped.

    A lock held by this attempt is released first, without cooldown. An eager call
    (``apply()``, ``task_always_eager``) is never requeued: it fails at once with ``exc``.
    Celery runs an eager retry at once and inline, ignoring its countdown: the retry would find
    the key still held and retry again, up to ``max_retries`` times, or until the recursion
    overflows with ``max_retries=None``; ``lock_retry_for`` could not bound it.
    """
    leave(task, request, cooldown=False)
    report = report or (lambda event: emit(task, request.id, event))
    if request.is_eager:
        reason = "an eager call is not requeued by the lock"
        logger.info(
            "%s[%s] gives up: %s (Celery would run the retry at once, ignoring its countdown "
            "of %.1fs)",
            task.name,
            request.id,
            reason,
            countdown,
        )
        report("failed")
        raise _gave_up(exc, reason)
    now = time.time()
    header = calls.header_of(request)
    first = calls.first_attempt(header, now, request.retries or 0)
    budget = spec.options.retry_for
    if now - first + countdown > budget:
        reason = (
            f"requeued by the lock for {now - first:.1f}s, and the next try in {countdown:.1f}s "
            f"would end past lock_retry_for={budget}s"
        )
        logger.info("%s[%s] gives up: %s", task.name, request.id, reason)
        report("failed")
        raise _gave_up(exc, reason)
    report("retried")
    headers = dict(request.headers or {})
    headers[calls.HEADER] = {
        **header,
        "first": first,
        "retries": request.retries or 0,
        **({"redelivered": True} if redelivered else {}),
    }
    signature = task.signature_from_request(
        request, countdown=countdown, retries=request.retries or 0, headers=headers
    )
    setattr(request, supersede.REQUEUE_ATTR, True)  # the body did not start: keep its number
    try:
        signature.apply_async()
    except Exception as error:
        raise Reject(error, requeue=False) from error
    raise Retry(exc=exc, when=countdown, sig=signature)


def _gave_up(exc: LockContended, reason: str) -> LockContended:
    """``exc`` with why the call was not requeued after its message, for the caller's result."""
    exc.args = (f"{exc}; not requeued: {reason}", *exc.args[1:])
    return exc


def _on_unavailable(
    task: Any,
    spec: Spec,
    settings: Settings,
    request: Any,
    exc: LockUnavailable,
    lock: Lock | None = None,
) -> bool:
    """Apply ``redlock_on_unavailable``: run unlocked, retry (counted against
    ``max_retries``, with backoff) or fail. A call that fails for it, or whose retries are
    used up, fails with the :class:`LockUnavailable` itself, an expected outcome that Celery
    logs at INFO without a traceback, after one WARNING naming ``redlock_url``. An eager call
    under ``retry`` fails at once: Celery would run each retry at once and inline, against the
    same silent Redis, until ``max_retries`` (or, with ``max_retries=None``, the recursion
    limit).

    Under ``run``, a call whose ``lock`` saw its key held in this attempt is requeued as a
    contended call is, not run unlocked: Redis answered that a holder runs. Without that:

    1. A holds the key; B, under ``lock_on_contention="wait"``, finds it held and waits;
    2. B's wait fails (its ``SUBSCRIBE`` refused by the ACL, or the server stops answering);
    3. under ``run``, B ran its body beside A's.
    """
    policy = settings.on_unavailable
    emit(task, request.id, "unavailable", settings=settings)
    url = settings.url
    # Unset, the broker's URL serves: name the setting the user wrote, not one they did not.
    source = spelled(task.app, "redlock_url" if task.app.conf.get("redlock_url") else "broker_url")
    where = (
        f"the lock Redis quorum at {redact(', '.join(url))} ({source})"
        if isinstance(url, tuple)
        else f"the lock Redis at {redact(url)} ({source})"
    )
    if policy == "run" and lock is not None and lock.last_holder is not None:
        countdown = max(lock.last_holder_ttl or 0.0, 1.0)
        why = f"saw its key held, then could not wait ({exc}); not run unlocked:"
        # A duplicate's requeue stays marked, as a contended duplicate's does.
        label = (
            "redelivered"
            if _duplicate(request, lock)
            else contention_policy(spec.options, settings)
        )
        _requeue(task, request, spec, lock, countdown, label, why)
    if policy == "run":
        logger.warning(
            "%s[%s] runs WITHOUT a lock because %s is unavailable "
            "(redlock_on_unavailable='run'): %s",
            task.name,
            request.id,
            where,
            exc,
        )
        setattr(request, REQUEST_ATTR, Execution(None))
        return True
    retries = request.retries or 0
    requeued = policy == "retry" and not request.is_eager  # an eager retry runs at once, inline
    if requeued and (task.max_retries is None or retries < task.max_retries):
        base = spec.options.retry_countdown or 1.0
        countdown = _jittered(min(base * 2**retries, 300.0))
        logger.warning(
            "%s[%s] could not lock: %s is unavailable; retrying in %.1fs: %s",
            task.name,
            request.id,
            where,
            countdown,
            exc,
        )
        setattr(request, supersede.REQUEUE_ATTR, True)  # the body did not start: keep its number
        raise task.retry(countdown=countdown, exc=exc)
    if policy == "fail":
        ending = "failing (redlock_on_unavailable='fail')"
    elif requeued:
        ending = f"giving up (max_retries={task.max_retries} used up)"
    else:
        ending = "giving up (an eager call is not retried: Celery would run it at once)"
    logger.warning(
        "%s[%s] could not lock: %s is unavailable; %s: %s",
        task.name,
        request.id,
        where,
        ending,
        exc,
    )
    raise exc.with_traceback(None) from None


def leave(task: Any, request: Any = None, *, cooldown: bool = True) -> None:
    """Release the lock of the attempt behind ``request`` (default: the current one).

    Idempotent and never raises: a Redis error is a WARNING (the lock then expires by TTL), and
    the task's result is unchanged. A release not seen to free the key, counted ``unreleased``
    (no signal): Redis did not answer it (a stalled Redis may still run it once it wakes), or
    answered after the lease had ended, when the key had expired; its TTL frees it at the
    latest. Timeline without the count: (1) the release is sent; (2) Redis stalls
    past the lease; (3) the key expires, and the release finds nothing; (4) ``acquired``
    counted the lock, and nothing counted its end: an alert on ``acquired - released - lost``
    saw a lock leaked. With ``lock_cooldown`` the key is kept that many seconds,
    unless ``cooldown`` is False (a retry: the execution is not finished).
    """
    request = task.request if request is None else request
    execution = getattr(request, REQUEST_ATTR, None)
    if execution is None or execution.lock is None:
        return
    lock = execution.lock
    execution.lock = None
    held.discard(id(execution))
    taken = lock.token is not None
    if _release(task, request, lock, execution.cooldown if cooldown else 0):
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("%s[%s] released %s", task.name, request.id, lock.key)
        # The body has ended: a soft time limit landing in the report changes nothing now (as
        # one landing in the release itself, see _release_again). (No context manager: this
        # is every execution's path, and entering contextlib.suppress took 0.4 µs, timed alone.)
        try:  # noqa: SIM105
            emit(
                task,
                request.id,
                "released",
                signals.lock_released,
                execution.settings,
                {"key": lock.key, "by": "task"},
            )
        except SoftTimeLimitExceeded:
            pass
    elif taken and not lock.lost:  # freed by its TTL: unanswered, or answered past the lease
        with contextlib.suppress(SoftTimeLimitExceeded):
            emit(
                task,
                request.id,
                "unreleased",
                settings=execution.settings,
                fields={"key": lock.key},
            )


@tracing.traced_release
def _release(task: Any, request: Any, lock: Lock, keep: float = 0) -> bool:
    """Release ``lock``; whether it was released. Never raises (see :func:`leave`).

    A lock the body released itself (``current_lock().release()``, to let the next call start
    during work that needs no lock) counts as released, and is reported so when the body
    ends; a lock never taken (``lock_limit=None``: a rate alone) made no attempt."""
    if lock.token is None:
        return lock.attempts > 0 and not lock.lost
    try:
        lock.release(keep=keep)
    except LockLost:
        return False  # logged: an ERROR by Lock.on_lost, or a WARNING if it expired on the way
    except LockUnavailable as exc:
        logger.warning(
            "%s[%s]: could not release %s, %s: %s",
            task.name,
            request.id,
            lock.key,
            # Its lease ended (logged as an ERROR): its key has expired meanwhile.
            "its lease had already ended"
            if lock.lost
            else f"it expires within {lock.ttl:.0f}s unless Redis still runs the release",
            exc,
        )
        return False
    except Exception as exc:  # not Redis's: an exception raised inside the release
        if lock.lost:  # the release found it lost; the exception interrupted that report
            return False
        return _release_again(task, request, lock, keep, exc)
    if lock.lost:
        # Reported lost already (lock_lost, counted): each lock ends one way. Timeline: (1)
        # the lease ends by this worker's clock, reckoned from when each renewal was sent,
        # less a drift allowance, with no renewal confirmed; (2) Redis extended the key when
        # a renewal arrived, and still holds it for this call; (3) the release deletes it.
        logger.info(
            "%s[%s]: released %s, which Redis still held for this call though it had been "
            "reported lost (its lease had ended by this worker's clock)",
            task.name,
            request.id,
            lock.key,
        )
        return False
    return True


def _release_again(task: Any, request: Any, lock: Lock, keep: float, exc: Exception) -> bool:
    """Finish a release that an exception interrupted; whether the lock is free now.

    Timeline it closes: (1) the body returns just before its ``soft_time_limit``; (2) the
    release opens a connection; (3) the soft limit raises ``SoftTimeLimitExceeded`` there,
    before the script is sent; (4) the lock has dropped its token, and nothing sent the
    release: the key stayed held by a task that had ended until its lease ran out, and every
    call of the key meanwhile was skipped (seen under load, about once in 100 soft limits
    that fired during a release). So the release of this attempt (task id, host and this
    process's pid: the script the worker's main process runs for a dead child) is sent again;
    when it finds no slot of the attempt, the interrupted release had freed it.
    """
    settings = settings_for(task.app)
    try:
        again = release_attempt(
            settings.url,
            lock.name,
            settings.prefix,
            lock.owner,
            lock.host,
            current_pid(),
            limit=lock.limit,
            keep=keep,
        )
    except LockUnavailable as failed:
        logger.warning(
            "%s[%s]: the release of %s was interrupted (%r), and releasing it again failed; it "
            "will expire within %.0fs: %s",
            task.name,
            request.id,
            lock.key,
            exc,
            lock.ttl,
            failed,
        )
        return False
    logger.log(
        logging.WARNING if again else logging.INFO,
        "%s[%s]: the release of %s was interrupted (%r); %s",
        task.name,
        request.id,
        lock.key,
        exc,
        "released it again" if again else "it had released it",
    )
    return True


# -- distributed rate limit (lock_rate) ----------------------------------------------------------

#: Attribute of ``task.request``: the Redis server time, in microseconds, at which ``lock_rate``
#: admitted this attempt's start (absent for a task without ``lock_rate``).
RATE_ATTR = "redlock_rate_start"


def _check_rate(task: Any, spec: Spec, settings: Settings, request: Any, lock: Lock) -> None:
    """Admit this attempt's start under ``lock_rate``, or requeue it for its slot.

    Runs right after the lock (or a ``lock_limit`` slot) is taken and before the body, so the
    start recorded by the rate script is the start of a body that runs: a call that finds the
    key held never uses up a slot. Checked before the lock instead, a recorded start could
    precede the real one by a whole wait (``lock_rate="1/m"``):

    1. A passes the rate at 0 s, finds the key held and waits (``on_contention="wait"``);
    2. A gets the lock and its body starts at 50 s;
    3. B passes the rate at 61 s (A's record, at 0 s, left the window) and starts:
       two starts within 11 s.

    A refused call releases what it took (quietly: it was never reported as acquired) and is
    requeued through :func:`lock_retry` with a countdown equal to the time until the slot the
    script promised it; ``request.retries`` is left unchanged. An eager call (``apply()``,
    ``task_always_eager``) fails with :class:`RateLimited` instead, promised nothing: Celery
    runs an eager retry at once, ignoring its countdown, so retrying would only recurse.
    """
    rate = spec.options.rate
    if rate is None:
        return
    try:
        decision = companions.admit_rate(
            settings.url, lock.keys, rate.count, rate.period, promise=not request.is_eager
        )
    except LockUnavailable as exc:
        if settings.on_unavailable == "run":
            logger.warning(
                "%s[%s] runs WITHOUT its rate limit because Redis is unavailable "
                "(redlock_on_unavailable='run'): %s",
                task.name,
                request.id,
                exc,
            )
            emit(task, request.id, "unavailable")
            return
        _release(task, request, lock)  # quietly: never reported as acquired
        _on_unavailable(task, spec, settings, request, exc)
        raise  # not reached: the policy is 'retry' or 'fail', which raise
    if decision.admitted:
        setattr(request, RATE_ATTR, decision.start_us)
        return
    _release(task, request, lock)  # quietly: never reported as acquired
    countdown = decision.wait

    def report(event: str) -> None:
        if event == "retried":
            logger.info(
                "%s[%s] over its rate (%s) on %s: retrying in %.3fs",
                task.name,
                request.id,
                rate,
                lock.keys.lock,
                countdown,
            )
            event = "rate_limited"
        emit(task, request.id, event)

    limited = RateLimited(
        f"{task.name}[{request.id}]: {lock.keys.lock} is over its rate ({rate}); "
        f"next slot in {countdown:.3f}s",
        key=lock.keys.lock,
        retry_after=countdown,
    )
    if request.is_eager:  # an eager retry runs at once, ignoring its countdown: fail instead
        emit(task, request.id, "rate_limited")
        raise limited
    lock_retry(task, request, spec, countdown, limited, report)


# -- enqueue-time de-duplication -----------------------------------------------------------------


#: How long a queued marker may say that its call is being published (:func:`mark_queued`):
#: longer than a publish takes, the broker's retries included.
PUBLISHING_S = 30.0
#: How long a call waits for the publish of the call queued before it, at most; then it is
#: published too, unmarked (a caller that died while publishing, or a lost confirmation).
WAIT_FOR_PUBLISH_S = 10.0


@tracing.traced_enqueue
def mark_queued(
    task: Any, args: Any, kwargs: Any, task_id: str, expires: float | None = None
) -> str | None:
    """Mark the call as queued, while it is being published (:func:`confirm_queued` once it
    is); return the task id already queued for its key instead, if any. ``expires``: seconds
    until the call's ``expires``, which bounds the marker's ``lock_enqueue_ttl``.

    A call of the key still being published is waited for (a few milliseconds, at most
    :data:`WAIT_FOR_PUBLISH_S`): once published, its task id is returned; if its publish failed
    (its marker cleared, or expired), this call marks itself. Past the wait it takes the
    marker over and is published marked, so the next calls wait for it, not each for ten
    seconds on a caller that died while publishing (a publish that was only slow is then
    published twice; the lock excludes the two). Timeline without the wait:
    (1) A marks and publishes, the broker being down; (2) B finds A's marker and returns A's
    id; (3) A's publish fails, the error reaches A's caller, A's marker is cleared; B's
    caller holds the id of a call that was never queued, and B never runs.

    A marker whose call the result backend says has ended is replaced (see
    :meth:`~celery_redlock.LockedTask.apply_async`); one that names this call's own task id
    is no exception. Timeline if the own id were returned as "marked": (1) ``task_id="r-42"``
    is queued; (2) a second ``apply_async(task_id="r-42")`` finds its own id and is published
    too; (3) the first execution clears the marker, the second message runs the body again.
    Raises :class:`LockUnavailable` when
    Redis does not answer, or when another call was being published again once this one took
    the marker over (the caller then publishes: never a dropped call).
    """
    spec = spec_of(task)
    assert spec is not None
    settings = settings_for(task.app)
    name = lock_name_for(task, spec, args, kwargs)
    tracing.lock_name(settings.prefix, name)
    keys = _keys.keys_for(settings.prefix, name)
    ttl_ms = _marker_ms(spec, expires)
    publishing_ms = min(ttl_ms, round(PUBLISHING_S * 1000))
    replaced, waiting_on, given_up = False, "", ""
    deadline, pause = 0.0, 0.002
    while True:
        queued = companions.mark_queued(settings.url, keys, task_id, publishing_ms, given_up)
        if queued is None:
            return None
        if not queued.publishing:
            if replaced or not has_ended(task, queued.task_id):
                return queued.task_id
            companions.clear_queued(settings.url, keys, queued.task_id)  # if still that call's
            replaced = True
            continue
        if queued.task_id != waiting_on:  # another call is being published: its own wait
            waiting_on, deadline, pause = (
                queued.task_id,
                time.monotonic() + WAIT_FOR_PUBLISH_S,
                0.002,
            )
        if time.monotonic() < deadline:
            time.sleep(pause)
            pause = min(2 * pause, 0.05)
        elif given_up != queued.task_id:  # its caller died while publishing, or its broker
            given_up = queued.task_id  # hangs: take its marker over
        else:
            raise LockUnavailable(
                f"the call {queued.task_id} queued for {keys.lock} was still being published "
                f"after {WAIT_FOR_PUBLISH_S:.0f} s",
                key=keys.lock,
            )


def confirm_queued(
    task: Any, args: Any, kwargs: Any, task_id: str, expires: float | None = None
) -> None:
    """After the publish of a call that :func:`mark_queued` marked: its marker now says it
    is queued, for ``lock_enqueue_ttl`` (bounded by ``expires``), unless its execution already
    started and cleared it. If Redis does not answer, the next call of the key waits
    :data:`WAIT_FOR_PUBLISH_S` for it, then takes its place (:func:`mark_queued`)."""
    spec = spec_of(task)
    assert spec is not None
    settings = settings_for(task.app)
    keys = _keys.keys_for(settings.prefix, lock_name_for(task, spec, args, kwargs))
    try:
        companions.confirm_queued(settings.url, keys, task_id, _marker_ms(spec, expires))
    except LockUnavailable as exc:
        logger.warning(
            "%s[%s]: could not confirm the queued marker (the next call of the key waits up "
            "to %.0f s for it, then takes its place): %s",
            task.name,
            task_id,
            WAIT_FOR_PUBLISH_S,
            exc,
        )


def _marker_ms(spec: Spec, expires: float | None) -> int:
    """A queued marker's TTL: ``lock_enqueue_ttl``, no longer than until the call expires (a
    later call is then queued: the worker would discard the expired one unrun)."""
    ttl = spec.options.enqueue_ttl if expires is None else min(spec.options.enqueue_ttl, expires)
    return max(1, round(ttl * 1000))


def clear_queued(
    task: Any, args: Any, kwargs: Any, task_id: str, timeout: float | None = None
) -> None:
    """Clear the queued marker of a call that will never start (revoked or expired, or never
    published), or whose execution ended (``until_executed``, or its pool child died); only
    if the marker is still ``task_id``'s. ``timeout``: the socket timeouts (the worker's main
    process uses 1 s: it must not block its event loop)."""
    spec = spec_of(task)
    if spec is not None and spec.options.enqueue in KEEPING_MODES:
        settings = settings_for(task.app)
        name = lock_name_for(task, spec, args, kwargs)
        _clear_queued(task, settings, name, task_id, timeout)


def _clear_queued(
    task: Any, settings: Settings, name: str, task_id: str, timeout: float | None = None
) -> None:
    keys = _keys.keys_for(settings.prefix, name)
    try:
        companions.clear_queued(settings.url, keys, task_id, timeout)
    except LockUnavailable as exc:
        logger.warning("%s[%s]: could not clear the queued marker: %s", task.name, task_id, exc)


def current_lock() -> Lock | None:
    """The lock held by the locked task running in this thread, or ``None``.

    ``None`` outside a task, in a task that is not locked, and in a task that runs unlocked
    under ``redlock_on_unavailable='run'``.
    """
    task = current_task._get_current_object()
    if task is None:
        return None
    execution = getattr(task.request, REQUEST_ATTR, None)
    return None if execution is None else execution.lock


def current_fencing_token() -> int | None:
    """The fencing token of :func:`current_lock`, or ``None`` when no lock is held.

    ``None`` on a direct call (``sync_account(42)`` runs no lock code), outside a locked task,
    under ``redlock_on_unavailable='run'`` when Redis did not answer, and once the lock was
    lost (see :attr:`Lock.fencing_token`). A fenced store should then refuse the write, or the
    caller decide that an unlocked run needs no fence. Raises
    :class:`~celery_redlock.LockUnavailable` when a single-node lock reads its token for the
    first time (one round trip) and Redis does not answer.
    """
    lock = current_lock()
    return None if lock is None else lock.fencing_token
