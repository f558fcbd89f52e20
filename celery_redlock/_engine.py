"""The engine shared by :class:`~celery_redlock.LockedTask` and ``@single_instance``.

One execution of a locked task goes through :func:`enter` before its body and :func:`leave`
on every way it ends. The state of that execution (its :class:`~celery_redlock.Lock`, or the
decision to skip) lives on ``task.request``, which Celery keeps per thread and per greenlet:
with the threads or gevent pool many executions share one task instance, so nothing
per-execution may be stored on the task itself.

TTL rule, decided in :func:`_make_lock` for each execution:

* ``lock_ttl`` set: a fixed TTL of that many seconds, never renewed.
* otherwise a lease of ``redlock_lease`` seconds, renewed every lease/3 by a watchdog thread
  while the task runs. If the pool enforces a hard time limit T (prefork, gevent), renewal
  never extends the lock past acquisition + T + ``redlock_ttl_margin``. T is
  ``request.time_limit or task.time_limit or`` the worker's ``--time-limit`` (captured in the
  worker's main process before the pool forks, see :mod:`celery_redlock._worker`).
"""

from __future__ import annotations

import inspect
import logging
import random
from dataclasses import dataclass
from typing import Any

from celery import current_task
from celery.local import Proxy

from . import _canonical, _keys, _scripts, _worker, metrics, signals
from ._nodes import nodes_for
from .config import Settings, TaskLockOptions, parameters_of, settings_for
from .exceptions import LockContended, LockLost, LockUnavailable
from .lock import Lock

logger = logging.getLogger("celery_redlock.task")

#: Attribute of ``task.request`` holding the :class:`Execution` of the running attempt.
REQUEST_ATTR = "redlock_execution"
#: Attribute set by ``@single_instance`` on the function it wraps, and by ``LockedTask`` on
#: each subclass: the validated :class:`~celery_redlock.config.TaskLockOptions`.
OPTIONS_ATTR = "_redlock_options"


@dataclass
class Execution:
    """What :func:`enter` decided for one attempt."""

    lock: Lock | None
    skipped: bool = False


@dataclass(frozen=True)
class Spec:
    """A task's validated lock options plus the parameters its calls bind to."""

    options: TaskLockOptions
    params: list[inspect.Parameter]
    bound: bool


def run_function(task: Any) -> tuple[Any, bool]:
    """The function behind ``task.run`` and whether it takes ``self`` (``bind=True``)."""
    run = inspect.getattr_static(type(task), "run")
    if isinstance(run, staticmethod):
        return run.__func__, False
    return run, True


def spec_of(task: Any) -> Spec | None:
    """The lock spec of ``task``, or ``None`` if the task is not locked. Cached per task.

    ``task`` may be the lazy proxy ``@app.task`` returns before the app is finalized.
    """
    if isinstance(task, Proxy):
        task = task._get_current_object()
    cached = task.__dict__.get("_redlock_spec", False)
    if cached is not False:
        return cached  # type: ignore[no-any-return]
    fun, bound = run_function(task)
    options = getattr(fun, OPTIONS_ATTR, None) or getattr(type(task), OPTIONS_ATTR, None)
    spec = None
    if options is not None:
        spec = Spec(options, parameters_of(fun, bound), bound)
    task.__dict__["_redlock_spec"] = spec
    return spec


def lock_name_for(task: Any, spec: Spec, args: Any, kwargs: Any) -> str:
    """The lock name (``<lock_name>:<digest>``) of one call of ``task``."""
    canonical = _canonical.encode_call(
        task.name, spec.params, args or (), kwargs or {}, spec.options.by
    )
    return _keys.task_lock_name(spec.options.name or task.name, canonical)


def lock_key(task: Any, *args: Any, **kwargs: Any) -> str:
    """The Redis key that calling ``task(*args, **kwargs)`` would lock.

    Raises :class:`TypeError` when an argument has no canonical encoding, and
    :class:`ValueError` when ``task`` is not a locked task.
    """
    spec = spec_of(task)
    if spec is None:
        raise ValueError(
            f"{task.name} is not a locked task (use base=LockedTask or @single_instance)"
        )
    settings = settings_for(task.app)
    return _keys.keys_for(settings.prefix, lock_name_for(task, spec, args, kwargs)).lock


def _hard_limit(task: Any, request: Any) -> float | None:
    if not _worker.state.enforces_limits:
        return None
    limit = request.time_limit or task.time_limit or _worker.state.time_limit
    return float(limit) if limit else None


class TaskLock(Lock):
    """The lock of one task execution: reports a loss through signals and counters too."""

    task: Any = None

    def on_lost(self, reason: str) -> None:
        super().on_lost(reason)
        if self.task is not None:
            _emit(self.task, self.owner, "lost", signals.lock_lost, key=self.key, reason=reason)


def _make_lock(task: Any, spec: Spec, settings: Settings, name: str, request: Any) -> TaskLock:
    common: dict[str, Any] = {
        "prefix": settings.prefix,
        "owner": request.id or "",
        "host": request.hostname,
        "limit": spec.options.limit,
    }
    if spec.options.ttl is not None:
        lock = TaskLock(settings.url, name, spec.options.ttl, **common)
    else:
        limit = _hard_limit(task, request)
        max_hold = None if limit is None else limit + settings.ttl_margin
        lock = TaskLock(
            settings.url, name, settings.lease, auto_renew=True, max_hold=max_hold, **common
        )
    lock.task = task
    return lock


def _jittered(seconds: float) -> float:
    return seconds * random.uniform(1.0, 1.2)


def _emit(task: Any, task_id: str, event: str, signal: Any = None, **fields: Any) -> None:
    """Count ``event``, send ``signal`` and, with task events on, a ``task-lock-*`` event."""
    try:
        metrics.count(task.app, task.name, event)
        if signal is not None:
            signal.send(sender=task, task_id=task_id, **fields)
        if _worker.state.task_events and signal is signals.lock_contended:
            task.send_event(f"task-lock-{event}", key=fields["key"], holder=fields["holder"])
    except Exception:
        logger.exception("%s[%s]: reporting lock event %r failed", task.name, task_id, event)


def enter(task: Any, args: Any, kwargs: Any) -> bool:
    """Take the lock of this execution; return False when the body must be skipped.

    Raises ``Retry`` (through ``task.retry``) or :class:`LockContended` /
    :class:`LockUnavailable` according to the policies. A direct call (``task(x)``, no
    worker, no ``apply()``) runs unlocked, like any plain function call.
    """
    request = task.request
    spec = spec_of(task)
    if spec is None or request.called_directly:
        return True
    settings = settings_for(task.app)
    name = lock_name_for(task, spec, args, kwargs)
    if spec.options.enqueue:
        _clear_queued(task, settings, name, request.id)
    policy = spec.options.on_contention or settings.on_contention
    try:
        lock = _make_lock(task, spec, settings, name, request)
        acquired = lock.acquire(blocking=False)
        if not acquired and policy == "wait" and spec.options.wait_timeout > 0:
            holder = lock.last_holder.task_id if lock.last_holder else None
            _report_contended(task, request, lock, holder, "waited", policy)
            acquired = lock.acquire(blocking=True, timeout=spec.options.wait_timeout)
            if not acquired:  # the wait timed out: fail, already reported as contended
                _emit(task, request.id, "failed")
                raise _contended_error(task, request, lock)
    except LockUnavailable as exc:
        return _on_unavailable(task, spec, settings, request, exc)
    if acquired:
        setattr(request, REQUEST_ATTR, Execution(lock))
        logger.debug(
            "%s[%s] acquired %s (fencing token %s)",
            task.name, request.id, lock.key, lock.fencing_token,
        )
        _emit(task, request.id, "acquired", signals.lock_acquired,
              key=lock.key, fencing_token=lock.fencing_token)
        return True
    return _on_contended(task, spec, request, lock, policy)


def _contended_error(task: Any, request: Any, lock: Lock) -> LockContended:
    holder = lock.last_holder.task_id if lock.last_holder else None
    ttl = lock.last_holder_ttl
    return LockContended(
        f"{task.name}[{request.id}]: {lock.key} is held by task {holder} "
        f"(ttl {ttl if ttl is None else round(ttl, 3)}s)",
        key=lock.key,
        holder=holder,
        ttl=ttl,
    )


def _on_contended(task: Any, spec: Spec, request: Any, lock: Lock, policy: str) -> bool:
    holder = lock.last_holder.task_id if lock.last_holder else None
    ttl = lock.last_holder_ttl
    contended = _contended_error(task, request, lock)
    redelivered = bool((request.delivery_info or {}).get("redelivered"))
    if redelivered or (holder is not None and holder == request.id):
        # A redelivered message (acks_late after a lost worker or a visibility timeout), or a
        # retry of one, that finds its own task id holding the key is a duplicate of a live
        # run and may be the only copy left: never skip it (a skip would store SUCCESS/None
        # and hide the holder's result); come back when the holder's TTL ends.
        countdown = max(ttl or 0.0, 1.0)
        logger.info(
            "%s[%s] redelivered while %s is held by task %s: retrying in %.1fs",
            task.name, request.id, lock.key, holder, countdown,
        )
        _report_contended(task, request, lock, holder, "retried", "redelivered")
        raise task.retry(countdown=countdown, exc=contended)
    if policy == "skip":
        setattr(request, REQUEST_ATTR, Execution(None, skipped=True))
        logger.info(
            "%s[%s] skipped: %s is held by task %s", task.name, request.id, lock.key, holder
        )
        _report_contended(task, request, lock, holder, "skipped", policy)
        return False
    if policy == "retry":
        countdown = _jittered(spec.options.retry_countdown)
        logger.info(
            "%s[%s] contended: %s is held by task %s; retrying in %.1fs",
            task.name, request.id, lock.key, holder, countdown,
        )
        _report_contended(task, request, lock, holder, "retried", policy)
        raise task.retry(countdown=countdown, exc=contended)
    _report_contended(task, request, lock, holder, "failed", policy)
    raise contended


def _report_contended(
    task: Any, request: Any, lock: Lock, holder: str | None, event: str, policy: str
) -> None:
    _emit(task, request.id, event, signals.lock_contended,
          key=lock.key, holder=holder, policy=policy)


def _on_unavailable(
    task: Any, spec: Spec, settings: Settings, request: Any, exc: LockUnavailable
) -> bool:
    policy = settings.on_unavailable
    _emit(task, request.id, "unavailable")
    if policy == "run":
        logger.warning(
            "%s[%s] runs WITHOUT a lock because Redis is unavailable "
            "(redlock_on_unavailable='run'): %s",
            task.name, request.id, exc,
        )
        setattr(request, REQUEST_ATTR, Execution(None))
        return True
    if policy == "retry":
        base = spec.options.retry_countdown or 1.0
        countdown = _jittered(min(base * 2 ** (request.retries or 0), 300.0))
        logger.warning(
            "%s[%s] could not reach Redis to lock; retrying in %.1fs: %s",
            task.name, request.id, countdown, exc,
        )
        raise task.retry(countdown=countdown, exc=exc)
    raise exc


def skipped(request: Any) -> bool:
    """Whether :func:`enter` decided to skip the body of the attempt behind ``request``."""
    execution = getattr(request, REQUEST_ATTR, None)
    return execution is not None and execution.skipped


def leave(task: Any, request: Any = None, *, cooldown: bool = True) -> None:
    """Release the lock of the attempt behind ``request`` (default: the current one).

    Idempotent and never raises: a Redis error is a WARNING (the lock then expires by TTL), and
    the task's result is unchanged. With ``lock_cooldown`` the key is kept that many seconds,
    unless ``cooldown`` is False (a retry: the execution is not finished).
    """
    request = task.request if request is None else request
    execution = getattr(request, REQUEST_ATTR, None)
    if execution is None or execution.lock is None:
        return
    lock = execution.lock
    execution.lock = None
    spec = spec_of(task)
    try:
        lock.release(keep=spec.options.cooldown if spec is not None and cooldown else 0)
    except LockLost:
        pass  # already logged as an ERROR by Lock.on_lost
    except LockUnavailable as exc:
        logger.warning(
            "%s[%s]: could not release %s, it will expire within %.0fs: %s",
            task.name, request.id, lock.key, lock.ttl, exc,
        )
    except Exception:
        logger.exception("%s[%s]: unexpected error releasing %s", task.name, request.id, lock.key)
    else:
        logger.debug("%s[%s] released %s", task.name, request.id, lock.key)
        _emit(task, request.id, "released", signals.lock_released, key=lock.key, by="task")


def report_parent_release(task: Any, task_id: str, key: str) -> None:
    """Report a release done by the worker's main process for a dead child."""
    _emit(task, task_id, "released", signals.lock_released, key=key, by="parent")


# -- enqueue-time de-duplication -----------------------------------------------------------------


def mark_queued(task: Any, args: Any, kwargs: Any, task_id: str) -> str | None:
    """Mark the call as queued; return the task id already queued for its key, if any.

    Raises :class:`LockUnavailable` when Redis does not answer (the caller then publishes:
    an outage never drops a call).
    """
    spec = spec_of(task)
    assert spec is not None
    settings = settings_for(task.app)
    keys = _keys.keys_for(settings.prefix, lock_name_for(task, spec, args, kwargs))
    call = ([keys.queued], [task_id, int(spec.options.enqueue_ttl * 1000)])
    reply = nodes_for(settings.url).run(_scripts.MARK_QUEUED, call, keys.queued)
    if int(reply[0]) == 1:
        return None
    existing = reply[1]
    return existing.decode() if isinstance(existing, bytes) else existing


def clear_queued(task: Any, args: Any, kwargs: Any, task_id: str) -> None:
    """Clear the queued marker of a call that will never start (revoked or expired)."""
    spec = spec_of(task)
    if spec is not None and spec.options.enqueue:
        settings = settings_for(task.app)
        _clear_queued(task, settings, lock_name_for(task, spec, args, kwargs), task_id)


def _clear_queued(task: Any, settings: Settings, name: str, task_id: str) -> None:
    keys = _keys.keys_for(settings.prefix, name)
    try:
        nodes_for(settings.url).run(_scripts.CLEAR_QUEUED, ([keys.queued], [task_id]), keys.queued)
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
