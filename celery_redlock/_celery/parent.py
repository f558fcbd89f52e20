"""Parent-side release: the worker's main process frees the lock of a pool child that died.

For a hard time limit, a child SIGKILL/OOM and ``revoke(terminate=True)`` the child never
returns to :func:`celery_redlock._celery.engine.execute`, so the worker's main process
releases in :meth:`ParentReleaseMixin.on_failure`, which Celery runs before any requeue
(``task_reject_on_worker_lost``). The release is owner-checked for that attempt (task id,
host, child pid): it can never delete a successor's lock. For a hard time limit, billiard calls
``on_failure`` *before* it kills the child:

1. the limit's timer fires on the event loop; billiard calls ``Request.on_failure``;
2. billiard sends SIGTERM, waits up to 0.1 s, then sends SIGKILL;
3. only then does the timer callback return.

Releasing in step 1 would let the next execution start while the child still runs (its
``finally`` blocks, or all of it if it does not die on SIGTERM), so :func:`release_when_dead`
waits on the event loop until the child can no longer run. Celery itself may notice a
SIGKILLed child only at its next ``maintain_pool`` tick, up to 5 s later; so the main process
also looks for dead children of locked executions every ``REAP_INTERVAL``
(:func:`_reap_dead_children`), and :meth:`ParentReleaseMixin.terminate` releases right after a
``revoke(terminate=True, signal="SIGKILL")``.

Liveness is decided by :func:`process_state`, which answers ``gone`` only when it is sure:
from ``/proc/<pid>/stat`` where it exists (Linux: a zombie is gone), otherwise from
``os.kill(pid, 0)`` (a process that no longer exists is gone; one that exists may be a zombie,
so it is ``unknown``). The early paths release only a child that is ``gone``. Timeline this
prevents, on a system without ``/proc`` if "cannot tell" meant "dead": (1) a child takes its
lock and runs; (2) the reaper cannot read its state and releases; (3) a second execution of the
same key starts beside the first. Where the state stays ``unknown`` (macOS, a hard limit whose
zombie billiard has not reaped within ``DEATH_WAIT``), the lock is left to its lease, which
the dead child no longer renews.
"""

from __future__ import annotations

import logging
import os
import signal as signal_module
import threading
import time
from typing import Any, Literal

from celery.platforms import signals as _signals
from celery.signals import task_retry
from celery.worker import state as worker_state
from kombu.asynchronous import get_event_loop

from .. import signals
from .._redis.core import GIVE_BACK_FOR
from .._redis.givebacks import give_back
from .._redis.keys import keys_for
from .._redis.lock import release_attempt
from ..exceptions import LockUnavailable
from .engine import clear_queued
from .events import emit
from .identity import lock_name_for, spec_of
from .options import settings_for

logger = logging.getLogger("celery_redlock.worker")

_SIGKILL: int | None = getattr(signal_module, "SIGKILL", None)  # not on Windows

#: Where process states are read (Linux). Elsewhere, or when it cannot be read, liveness
#: falls back to ``os.kill(pid, 0)``.
PROC = "/proc"


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
    acknowledged: bool

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> None:
        if return_ok:
            super().on_failure(  # type: ignore[misc]
                exc_info, send_failed_event=send_failed_event, return_ok=return_ok
            )
            return
        # For a hard time limit the child is killed only after this returns (billiard:
        # on_failure, then SIGTERM, then SIGKILL 0.1 s later): release once it is dead.
        release_when_dead(self)
        _resent.ids = set()
        try:
            super().on_failure(  # type: ignore[misc]
                exc_info, send_failed_event=send_failed_event, return_ok=return_ok
            )
        finally:
            resent, _resent.ids = self.id in _resent.ids, None
            if not (self.__dict__.get("_redlock_requeued") or resent or not self.acknowledged):
                settle_marker(self)

    def reject(self, requeue: bool = False) -> None:
        """Note a requeue: the call is queued again, so its ``lock_enqueue`` marker stays."""
        if requeue:
            self.__dict__["_redlock_requeued"] = True
        super().reject(requeue)  # type: ignore[misc]

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
        if (
            not pid
            or not isinstance(request, ParentReleaseMixin)
            or request.__dict__.get("_redlock_reaped")
            or process_state(pid) != "gone"
        ):
            continue
        request.__dict__["_redlock_reaped"] = True
        release_for_dead_child(request)


#: How long the main process waits for a killed child to be gone.
DEATH_WAIT = 3.0
_DEATH_POLL = 0.005


def process_state(pid: int) -> Literal["running", "gone", "unknown"]:
    """Whether process ``pid`` can still run code: ``gone`` only when that is certain."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
        return "gone" if fields[0] in (b"Z", b"X") else "running"
    except FileNotFoundError:
        if os.path.isdir(PROC):  # /proc is there and the process is not: gone
            return "gone"
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "gone"
    except OSError:  # PermissionError: it exists under another user
        return "running"
    return "unknown"  # it exists, but a zombie exists too until it is reaped


def release_when_dead(request: Any, deadline: float | None = None) -> None:
    """Release the dead child's lock once the child can no longer run (never before).

    Timeline this prevents: (1) the hard limit fires, Celery calls ``on_failure``; (2) a
    release here would let the next execution start; (3) the child, which blocks or ignores
    SIGTERM, still runs its body for 0.1 s until billiard's SIGKILL. So the release waits on
    the worker's event loop, polling :func:`process_state` every 5 ms, until the child is
    gone. A child that is not known to be gone after ``DEATH_WAIT`` s is left alone: while it
    runs it holds (and renews) its lock, which its own exit or its lease's expiry frees.
    """
    hub = get_event_loop()
    pid = request.worker_pid
    if not pid or process_state(pid) == "gone":
        release_for_dead_child(request)
        return
    if hub is None:
        return  # no event loop to wait on: the lease frees the lock
    now = time.monotonic()
    deadline = now + DEATH_WAIT if deadline is None else deadline
    if now < deadline:
        hub.call_later(_DEATH_POLL, release_when_dead, request, deadline)
    else:
        logger.info(
            "%s[%s]: child %s is not known to be gone %.0fs after it was killed; its "
            "lock stays until it exits or its lease expires",
            request.task.name,
            request.id,
            pid,
            DEATH_WAIT,
        )


def settle_marker(request: Any) -> None:
    """Clear the queued marker (``lock_enqueue``, if still the call's) of a call whose pool
    child died and that Celery did not queue again (never raises).

    A child killed before its attempt decided (waiting for the lock), or under
    ``until_executed`` before its run ended, leaves the marker, and every later call of the
    key would be given the dead call's id until ``lock_enqueue_ttl``. A call queued again keeps
    it: its marker still names it. Whether Celery queued it again is what ``on_failure`` did,
    not a guess from the task's flags: it depends on the ending too (under ``acks_late``, a
    lost worker is requeued with ``reject_on_worker_lost``, a hard time limit is acknowledged
    unless ``task_acks_on_failure_or_timeout`` is off, on Celery 5.7), and Celery 5.7's
    ``retry_on_worker_lost`` sends the call again with the same id. So :class:`ParentReleaseMixin`
    settles the marker after Celery's ``on_failure``: the call is queued again if it was rejected
    with ``requeue``, sent again (the ``task_retry`` signal, in that ``on_failure``), or left
    unacknowledged (the broker delivers it again). A SIGKILLed child's marker is settled when
    Celery notices the death (at once, or up to 5 s later), not when the reaper releases its lock.
    """
    try:
        clear_queued(request.task, request.args, request.kwargs, request.id, timeout=1.0)
    except Exception:
        logger.exception(
            "%s[%s]: clearing the queued marker of dead child %s failed",
            request.task.name,
            request.id,
            request.worker_pid,
        )


#: The ids sent again by the ``task_retry`` signal in the ``on_failure`` that runs in this
#: thread (``None`` outside one): Celery 5.7's ``retry_on_worker_lost``.
_resent = threading.local()


@task_retry.connect(weak=False)
def _note_resent(request: Any = None, **_: Any) -> None:
    ids = getattr(_resent, "ids", None)
    if ids is not None and request is not None:
        ids.add(request.id)


def release_for_dead_child(request: Any) -> None:
    """Release the lock a dead pool child took for ``request`` (owner-checked, never raises).
    Its queued marker is :func:`settle_marker`'s.

    Once per request after Redis answered: the reaper and Celery's ``on_failure`` both come
    here for one death, in either order. Timeline otherwise: (1) the reaper sees the child
    gone and releases ("released the lock of dead child"); (2) Celery notices the death up
    to 5 s later, and ``on_failure`` releases again: a second round trip on the event loop,
    and "died holding no lock of this call", contradicting (1).

    A release that Redis does not answer is sent again in the background (the give-backs'
    thread: growing delays up to 1 s, for up to 10 minutes) until Redis answers. Timeline
    otherwise: (1) the lock Redis stops answering; (2) a child holding a ``lock_ttl=3600``
    lock is killed, and both releases fail; (3) Redis answers again seconds later, but the
    dead child's key stays for the rest of its hour, and every call of the key meanwhile is
    skipped. Owner-checked, so a late release never frees a successor's lock."""
    pid = request.worker_pid
    if not pid or request.__dict__.get("_redlock_parent_released"):
        return  # never accepted by a child (it took no lock), or released already
    task = request.task
    try:
        spec = spec_of(task)
        limit = None if spec is None else spec.options.limit
        if spec is None or limit is None:  # lock_limit=None takes no lock
            return
        settings = settings_for(task.app)
        name = lock_name_for(task, spec, request.args, request.kwargs)
        key = keys_for(settings.prefix, name).lock

        def release() -> bool:
            released = release_attempt(
                settings.url,
                name,
                settings.prefix,
                request.id,
                request.hostname,
                pid,
                limit=limit,
                timeout=1.0,
                keep=spec.options.cooldown,
            )
            if released:
                logger.info(
                    "%s[%s]: released the lock of dead child %s", task.name, request.id, pid
                )
                emit(
                    task,
                    request.id,
                    "released",
                    signals.lock_released,
                    fields={"key": key, "by": "parent"},
                )
            return released

        released = release()
    except LockUnavailable as exc:
        request.__dict__["_redlock_parent_released"] = True
        give_back(key, release, what=f"the release of dead child {pid}'s lock")
        logger.warning(
            "%s[%s]: child %s died, and Redis did not answer the release of any lock it held "
            "(the child may have held none: it may have been waiting); a lock it held is "
            "released once Redis answers again (tried for up to %.0f minutes; else it expires "
            "by TTL): %s",
            task.name,
            request.id,
            pid,
            GIVE_BACK_FOR / 60,
            exc,
        )
    except Exception:
        logger.exception(
            "%s[%s]: releasing the lock of dead child %s failed", task.name, request.id, pid
        )
    else:
        request.__dict__["_redlock_parent_released"] = True
        if not released:  # said too, so that a missing line above is never a silent path
            logger.info(
                "%s[%s]: child %s died holding no lock of this call (not taken, released by "
                "the child as it unwound, or expired): nothing to release",
                task.name,
                request.id,
                pid,
            )
