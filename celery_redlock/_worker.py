"""Worker wiring: the receivers and the Request class that release locks on every ending.

Which process can release, for each way an attempt ends (measured on Celery 5.7, see the
README's "Guarantees and limits"):

* return, exception, soft time limit: the pool child, in ``after_return`` (LockedTask) or in the
  ``@single_instance`` wrapper;
* ``Ignore``, ``Reject``, ``SystemExit`` (SIGTERM from revoke/hard limit/cold shutdown): the
  child, from the ``task_postrun`` receiver below (``after_return`` does not run then);
* ``self.retry()``: the child, from the ``before_task_publish`` receiver, because Celery
  publishes the retry message *before* any hook runs:
  1. the body calls ``self.retry()``;
  2. Celery publishes the retry message (our receiver releases here);
  3. another worker may receive and start the retry at once;
  4. only now do ``on_retry`` and ``task_postrun`` run in the first child.
  Releasing in step 4 would let the retry find its own earlier attempt's lock and skip itself.
* hard time limit, child SIGKILL/OOM, ``revoke(terminate=True)``: the child is gone, so the
  worker's main process releases in :meth:`ParentReleaseMixin.on_failure`, which runs before
  any requeue (``task_reject_on_worker_lost``). The release is owner-checked for that attempt
  (task id, host, child pid): it can never delete a successor's lock. For a hard time limit,
  billiard calls ``on_failure`` *before* it kills the child:
  1. the limit's timer fires on the event loop; billiard calls ``Request.on_failure``;
  2. billiard sends SIGTERM, waits up to 0.1 s, then sends SIGKILL;
  3. only then does the timer callback return.
  Releasing in step 1 would let the next execution start while the child still runs (its
  ``finally`` blocks, or all of it if it does not die on SIGTERM), so :func:`release_when_dead`
  waits on the event loop until the child can no longer run.
  Celery itself may notice a SIGKILLed child only at its next ``maintain_pool`` tick, up to
  5 s later; so the main process also looks for dead children of locked executions every
  ``REAP_INTERVAL`` (:func:`_reap_dead_children`), and :meth:`ParentReleaseMixin.terminate`
  releases right after a ``revoke(terminate=True, signal="SIGKILL")``.
* the whole worker killed: nobody; the TTL frees the key (see :mod:`celery_redlock._engine`).
"""

from __future__ import annotations

import logging
import os
import signal as signal_module
import time
from dataclasses import dataclass
from typing import Any

from celery import current_task, signals
from celery.concurrency import get_implementation
from celery.platforms import signals as _signals
from celery.worker import state as worker_state
from kombu.asynchronous import get_event_loop
from kombu.utils.imports import symbol_by_name

from . import _checks, _engine  # noqa: F401  (_checks connects its worker_ready receiver)
from ._keys import keys_for
from .config import settings_for
from .exceptions import LockUnavailable
from .lock import release_attempt

logger = logging.getLogger("celery_redlock.worker")

_SIGKILL: int | None = getattr(signal_module, "SIGKILL", None)  # not on Windows

#: Pools that enforce a task's hard time limit by killing it.
_ENFORCING_POOLS = ("celery.concurrency.prefork", "celery.concurrency.gevent")


@dataclass
class WorkerState:
    """Facts about the worker this process belongs to, captured before the pool forks."""

    #: The worker's ``--time-limit`` / ``task_time_limit`` (invisible in a pool child).
    time_limit: float | None = None
    #: Whether the pool enforces hard time limits; ``False`` outside a worker (eager, apply).
    enforces_limits: bool = False
    #: Whether the worker sends task events (``-E``): then contention sends ``task-lock-*``.
    task_events: bool = False


state = WorkerState()


class ParentReleaseMixin:
    """Mixed into a locked task's Request class in the worker's main process.

    ``on_failure`` with ``return_ok=False`` is how the main process learns that a child died
    with the task (hard time limit, SIGKILL/OOM, ``revoke(terminate=True)``); it runs on the
    worker's event loop before a requeue, so the release uses a client with 1 s timeouts and
    never raises.
    """

    id: str
    args: Any
    kwargs: Any
    task: Any
    hostname: str
    worker_pid: int | None
    time_start: float | None

    def on_failure(self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False)\
            -> None:
        if not return_ok:
            # For a hard time limit the child is killed only after this returns (billiard:
            # on_failure, then SIGTERM, then SIGKILL 0.1 s later): release once it is dead.
            release_when_dead(self)
        super().on_failure(  # type: ignore[misc]
            exc_info, send_failed_event=send_failed_event, return_ok=return_ok
        )

    def on_accepted(self, pid: int, time_accepted: float) -> None:
        super().on_accepted(pid, time_accepted)  # type: ignore[misc]
        _start_reaper()

    def terminate(self, pool: Any, signal: Any = None) -> None:
        """``revoke(terminate=True)``: with SIGKILL the child is dead once this returns.

        The pool may notice that death only at its next ``maintain_pool`` tick (measured: up
        to 5 s later), and ``on_failure(Terminated)`` waits for that: release now instead.
        Other signals let the child unwind and release by itself.
        """
        super().terminate(pool, signal)  # type: ignore[misc]
        killed = _SIGKILL is not None and _signals.signum(signal or "SIGTERM") == _SIGKILL
        if killed and self.time_start:  # time_start: accepted, so the child was signalled
            release_when_dead(self)


#: Seconds between two looks for pool children that died with a locked task.
REAP_INTERVAL = 0.1
_reaper_pid: int | None = None


def _start_reaper() -> None:
    """Once per worker main process: look for dead children every ``REAP_INTERVAL``."""
    global _reaper_pid
    hub = get_event_loop()
    if hub is None or _reaper_pid == os.getpid():
        return
    _reaper_pid = os.getpid()
    hub.call_repeatedly(REAP_INTERVAL, _reap_dead_children)


def _reap_dead_children() -> None:
    """Release the locks of executions whose pool child is gone, before Celery notices.

    Celery notices a SIGKILLed (OOM-killed) child either at once or at its next periodic pool
    check, up to 5 s later (measured); only then does ``on_failure`` run. Meanwhile the key
    would stay locked by a dead process. The release is owner-checked for the attempt (task
    id, host, dead child's pid), so a child that finished and released by itself, or a
    successor, is never touched.
    """
    for request in list(worker_state.active_requests):
        pid = getattr(request, "worker_pid", None)
        if (not pid or not isinstance(request, ParentReleaseMixin)
                or request.__dict__.get("_redlock_reaped") or _running(pid)):
            continue
        request.__dict__["_redlock_reaped"] = True
        release_for_dead_child(request)


#: How long the main process waits for a killed child to be gone.
DEATH_WAIT = 3.0
_DEATH_POLL = 0.005


def _running(pid: int) -> bool:
    """Whether process ``pid`` can still run code (a zombie cannot)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rpartition(b")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def release_when_dead(request: Any, deadline: float | None = None) -> None:
    """Release the dead child's lock once the child can no longer run (never before).

    Timeline this prevents: (1) the hard limit fires, Celery calls ``on_failure``; (2) a
    release here would let the next execution start; (3) the child, which blocks or ignores
    SIGTERM, still runs its body for 0.1 s until billiard's SIGKILL. So the release waits on
    the worker's event loop, polling ``/proc`` every 5 ms, until the child is gone. A child
    still running after ``DEATH_WAIT`` s is left alone: while it runs it holds (and renews)
    its lock, which its own exit or its lease's expiry frees.
    """
    hub = get_event_loop()
    pid = request.worker_pid
    if hub is None or not pid or not _running(pid):
        release_for_dead_child(request)
        return
    now = time.monotonic()
    deadline = now + DEATH_WAIT if deadline is None else deadline
    if now < deadline:
        hub.call_later(_DEATH_POLL, release_when_dead, request, deadline)
    else:
        logger.info("%s[%s]: child %s still runs %.0fs after it was killed; its lock stays "
                    "until it exits or its lease expires", request.task.name, request.id, pid,
                    DEATH_WAIT)


def release_for_dead_child(request: Any) -> None:
    """Release the lock a dead pool child took for ``request`` (owner-checked, never raises)."""
    pid = request.worker_pid
    if not pid:
        return  # never accepted by a child: it cannot have taken a lock
    task = request.task
    try:
        spec = _engine.spec_of(task)
        if spec is None:
            return
        settings = settings_for(task.app)
        name = _engine.lock_name_for(task, spec, request.args, request.kwargs)
        released = release_attempt(
            settings.url, name, settings.prefix, request.id, request.hostname, pid,
            limit=spec.options.limit, timeout=1.0,
        )
    except LockUnavailable as exc:
        logger.warning(
            "%s[%s]: child %s died; could not release its lock, it will expire by TTL: %s",
            task.name, request.id, pid, exc,
        )
    except Exception:
        logger.exception("%s[%s]: releasing the lock of dead child %s failed",
                         task.name, request.id, pid)
    else:
        if released:
            logger.info("%s[%s]: released the lock of dead child %s", task.name, request.id, pid)
            key = keys_for(settings.prefix, name).lock
            _engine.report_parent_release(task, request.id, key)


def _install_request_class(task: Any) -> None:
    current = symbol_by_name(task.Request)
    if issubclass(current, ParentReleaseMixin):
        return
    task.Request = type(f"Locked{current.__name__}", (ParentReleaseMixin, current), {})


@signals.worker_init.connect(weak=False)
def _on_worker_init(sender: Any = None, **_: Any) -> None:
    """In the worker's main process, before the pool forks."""
    pool_cls = get_implementation(sender.pool_cls)
    state.enforces_limits = pool_cls.__module__ in _ENFORCING_POOLS
    state.time_limit = float(sender.time_limit) if sender.time_limit else None
    state.task_events = bool(sender.task_events)
    for task in sender.app.tasks.values():
        if _engine.spec_of(task) is not None:
            _install_request_class(task)


@signals.task_postrun.connect(weak=False)
def _on_task_postrun(sender: Any = None, **_: Any) -> None:
    """Backstop: RETRY, IGNORED, REJECTED and ``SystemExit`` endings skip ``after_return``."""
    if sender is not None:
        _engine.leave(sender)


@signals.before_task_publish.connect(weak=False)
def _on_before_task_publish(headers: Any = None, **_: Any) -> None:
    """Release before a retry of the running attempt is published (see the module docstring)."""
    task = current_task._get_current_object()
    if task is None or not headers:
        return
    request = task.request
    if headers.get("id") != request.id or request.called_directly:
        return
    if int(headers.get("retries") or 0) > int(request.retries or 0):
        _engine.leave(task, request, cooldown=False)


@signals.task_revoked.connect(weak=False)
def _on_task_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    """A revoked or expired message never starts: clear its queued marker (lock_enqueue).

    Runs in the worker's main process, which discards such messages before any task hook.
    ``sender`` is the task, ``request`` the message's context (id, args, kwargs).
    """
    if sender is None or request is None:
        return
    try:
        _engine.clear_queued(sender, request.args, request.kwargs, request.id)
    except Exception:
        logger.exception("%s[%s]: clearing the queued marker failed", sender.name, request.id)
