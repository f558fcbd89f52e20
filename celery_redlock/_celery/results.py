"""What the result backend says of a call: whether it ended, and in which state.

Read by the engine (a redelivered copy of a call that succeeded, a queued marker whose call
ended) and by newest-wins (a newer call that failed without running supersedes no retry). Each
read is one round trip to the result backend; without a backend that keeps states, or when it
does not answer, the callers go on as they would without it.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from typing import Any

import celery
from celery import states

logger = logging.getLogger("celery_redlock.task")

#: Whether Celery may requeue a call that hit its hard time limit (5.7 and later, as its
#: ``acks_on_timeout`` says; a bound task has it set from the settings).
_REQUEUES_TIMEOUTS = celery.VERSION >= (5, 7)


def has_ended(task: Any, task_id: str) -> bool:
    """Whether the result backend says the call ``task_id`` has ended (a ready state), for
    :meth:`~celery_redlock.LockedTask.apply_async` to replace its queued marker.

    Not a hard time limit's ``FAILURE`` that Celery requeues: Celery 5.7, under ``acks_late``
    with ``task_acks_on_timeout`` (or the older ``task_acks_on_failure_or_timeout``) off,
    stores it, then queues the call again. Timeline without this: (1) X hits its hard limit;
    (2) Celery stores FAILURE and requeues X; (3) a ``delay()`` of the key reads FAILURE,
    takes X for ended, and publishes Y beside the queued X. Celery before 5.7 has no
    ``acks_on_timeout`` and never requeues a timed-out call: that FAILURE is its end.
    """
    meta = _stored(task, task_id)
    if meta is None or meta.get("status") not in states.READY_STATES:
        return False
    requeues = _REQUEUES_TIMEOUTS and task.acks_late and task.acks_on_timeout is False
    timed_out = type(meta.get("result")).__name__ == "TimeLimitExceeded"
    return not (meta["status"] == states.FAILURE and timed_out and requeues)


#: The exceptions of a call that failed without running its body: the key stayed held past
#: its wait (``lock_wait_timeout``, ``lock_retry_for``), or the lock Redis did not answer.
_UNRUN = frozenset({"LockContended", "LockUnavailable"})


def ended_unrun(task: Any, task_id: str) -> bool:
    """Whether the result backend says the call ``task_id`` failed without running its body
    (:data:`_UNRUN`); ``False`` when it ran (whatever its end), has not ended, or cannot be
    told (no backend that keeps states, ``ignore_result``, a backend that does not answer).
    The exception is told by its class name, as Celery rebuilds it from the stored one."""
    meta = _stored(task, task_id)
    if meta is None or meta.get("status") != states.FAILURE:
        return False
    return type(meta.get("result")).__name__ in _UNRUN


def stored_state(task: Any, task_id: str) -> str | None:
    """The state the result backend keeps for ``task_id`` (see :func:`_stored`)."""
    meta = _stored(task, task_id)
    return None if meta is None else str(meta.get("status"))


def _stored(task: Any, task_id: str) -> dict[str, Any] | None:
    """What the result backend keeps for ``task_id``; ``None`` without a backend that keeps
    states (none, or ``rpc://``, whose answer for another client's call is only what its own
    queue holds), or when the backend does not answer (the caller then goes on as it would
    without it, and a WARNING says so, at most once a minute).

    A backend that refuses to be read from a thread running an event loop (Django's ORM, so
    ``django-db``, raises ``SynchronousOnlyOperation`` there) is read from a thread of its
    own. Timeline without: (1) a call of ``sync_account(42)`` ended, and its queued marker
    stayed (the worker could not clear it); (2) an ``async def`` Django view calls
    ``sync_account.delay(42)``; (3) the read of the backend raised, the call was taken for
    still queued, and ``delay()`` returned the ended call's id: nothing ran, in sync views
    the same call was published."""
    backend = task.backend
    if not getattr(backend, "persistent", False):
        return None
    try:
        return dict(backend.get_task_meta(task_id))
    except Exception as exc:
        if type(exc).__name__ == "SynchronousOnlyOperation":
            return _stored_off_the_loop(task, backend, task_id)
        _unread(task, task_id, exc)
        return None


def _stored_off_the_loop(task: Any, backend: Any, task_id: str) -> dict[str, Any] | None:
    """:func:`_stored`, read from a thread of its own; the database connections Django opened
    in it are closed as it ends (each read opens one: the thread's are its own)."""
    found: list[dict[str, Any]] = []
    failed: list[BaseException] = []

    def read() -> None:
        try:
            found.append(dict(backend.get_task_meta(task_id)))
        except Exception as exc:
            failed.append(exc)
        finally:
            django_db = sys.modules.get("django.db")
            if django_db is not None:
                with contextlib.suppress(Exception):
                    django_db.connections.close_all()

    reader = threading.Thread(target=read, name="redlock-result-read", daemon=True)
    reader.start()
    reader.join()
    if failed:
        _unread(task, task_id, failed[0])
    return found[0] if found else None


#: ``time.monotonic()`` of the last :func:`_unread` WARNING.
_warned = [-60.0]


def _unread(task: Any, task_id: str, exc: BaseException) -> None:
    """WARNING (at most once a minute): the result backend did not answer for a call."""
    now = time.monotonic()
    if now - _warned[0] < 60:
        return
    _warned[0] = now
    logger.warning(
        "%s[%s]: could not read the result backend (%s: %s); the lock goes on as without a "
        "result backend (a queued marker of the call is kept, a redelivered copy runs)",
        task.name,
        task_id,
        type(exc).__name__,
        exc,
    )
