"""Newest wins (``lock_enqueue="replace"``) and debounce (``lock_debounce``): a later call of a
key supersedes the calls of that key still waiting to start.

Both options keep one marker per key, ``<key>:newest`` (:mod:`celery_redlock._redis.keys`): the
task id of the newest call published, and for a debounce the start of the open window. Both
sides are one script each, so each costs one round trip:

* **publish** (:func:`on_publish`, the ``before_task_publish`` receiver of
  :mod:`celery_redlock._celery.wiring`): the call becomes the newest, and the message is stamped
  with the :data:`HEADER` ``true``. With a debounce the message gets an ETA: ``lock_debounce``
  from now, capped so that it is due at most ``lock_debounce_max`` after the first call of the
  window. Doing it in the receiver serves both APIs (``@single_instance`` cannot change the
  task class's ``apply_async``) and every way of publishing (``delay``, ``apply_async``,
  ``send_task``, canvas parts, beat). The task is found from the ``Celery.send_task`` call
  that publishes (:func:`publishing_task`): the signal does not carry the app.
* **start** (:func:`superseded`, from :func:`celery_redlock._celery.engine.enter`, before the
  lock is taken): a stamped call whose id is not the newest ends like a skip (SUCCESS,
  ``None``, so chords complete) with an INFO line naming the newer call. The newest runs, takes
  the lock as usual, and closes its debounce window.

What is never superseded:

1. A call that started: a message republished by the running execution (``self.retry()``,
   ``autoretry_for``, a contention or rate-limit requeue) is stamped ``false`` here, although
   Celery copies the original headers into it; so are messages published while Redis was
   unreachable (``false``) and messages without the header (older versions, eager calls).
2. The newest call. Since its id stays in the marker after it starts, an older message that a
   slow worker starts afterwards is still superseded: old arguments never run after new ones.

Hazards, stated in the guide: the newest message carries the batch, so revoking it (or losing
it) leaves the calls it superseded unrun; a marker that expired (``lock_enqueue_ttl`` after the
call was due) lets every older call run; with a debounce, every superseded message waits for
its ETA in a worker's memory, as Celery holds ETA messages.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import MutableMapping
from typing import Any

from celery import current_app, current_task
from celery.utils.time import maybe_make_aware

from .._redis import keys as _keys
from .._redis import scripts as _scripts
from .._redis.clients import redact
from .._redis.nodes import nodes_for
from ..exceptions import LockUnavailable
from . import routing
from .events import emit
from .identity import Spec, lock_name_for, spec_of
from .options import Settings, TaskLockOptions, settings_for

logger = logging.getLogger("celery_redlock.task")

#: Message header: ``true`` when the publish marked the call as the newest of its key.
HEADER = "redlock_newest"


def supersedes(options: TaskLockOptions) -> bool:
    """Whether a later call of a key supersedes the waiting ones (replace or debounce)."""
    return options.enqueue == "replace" or options.debounce is not None


def publishing_task(name: str) -> Any:
    """The task published as ``name`` in this thread, or ``None``.

    It is the task noted for this call (:func:`celery_redlock._celery.routing.routed_task`:
    by ``LockedTask.apply_async``, and by the app's router, to which ``apply_async`` passes
    the task itself and ``send_task`` the task it looks up in its app), or else the current
    app's task of that name.
    """
    task = routing.routed_task(name)
    return task if task is not None else current_app.tasks.get(name)


def _republished(headers: MutableMapping[str, Any]) -> bool:
    """Whether this message requeues the execution running in this thread."""
    task = current_task._get_current_object()
    if task is None:
        return False
    request = task.request
    return not request.called_directly and headers.get("id") == request.id


def on_publish(headers: MutableMapping[str, Any] | None, body: Any) -> None:
    """Mark the call being published as the newest of its key (see the module docstring)."""
    if not headers or "id" not in headers:
        return  # task protocol 1: the call is not marked, and runs
    if _republished(headers):
        if HEADER in headers:
            headers[HEADER] = False  # a started call is never superseded
        return
    task = publishing_task(str(headers.get("task")))
    spec = None if task is None else spec_of(task)
    if spec is None or not supersedes(spec.options):
        return
    if not isinstance(body, (tuple, list)) or len(body) < 2:
        return
    options = spec.options
    task_id = str(headers["id"])
    now = task.app.now()
    pending_ms = _pending_ms(task.app, headers.get("eta"), now)
    debounce_ms = round((options.debounce or 0) * 1000)
    headers[HEADER] = False
    try:
        delay_ms = _mark(task, spec, body[0], body[1], task_id, debounce_ms, pending_ms)
        headers[HEADER] = True
    except LockUnavailable as exc:
        logger.warning(
            "%s[%s]: published without the newest-call marker, Redis is unavailable (it will "
            "run, not superseded): %s",
            task.name,
            task_id,
            exc,
        )
        delay_ms = debounce_ms
    except Exception as exc:  # never make the publish fail: the call runs, unmarked
        logger.warning(
            "%s[%s]: published without the newest-call marker (it will run, not superseded): "
            "%s: %s",
            task.name,
            task_id,
            type(exc).__name__,
            redact(exc),
        )
        delay_ms = debounce_ms
    if delay_ms > pending_ms:
        headers["eta"] = (now + datetime.timedelta(milliseconds=delay_ms)).isoformat()


def _pending_ms(app: Any, eta: Any, now: datetime.datetime) -> int:
    """Milliseconds until the ETA the caller gave (``countdown``/``eta``), 0 without one."""
    if not eta:
        return 0
    try:
        parsed = datetime.datetime.fromisoformat(eta) if isinstance(eta, str) else eta
        due: datetime.datetime = maybe_make_aware(parsed, app.timezone)
        return max(0, round((due - now).total_seconds() * 1000))
    except (TypeError, ValueError):
        return 0


def _mark(
    task: Any, spec: Spec, args: Any, kwargs: Any, task_id: str, debounce_ms: int, pending_ms: int
) -> int:
    """Make ``task_id`` the newest call of its key; return its delay in ms (the debounce)."""
    options = spec.options
    settings = settings_for(task.app)
    keys = _keys.keys_for(settings.prefix, lock_name_for(task, spec, args, kwargs))
    max_ms = round((options.debounce_max or 0) * 1000)
    ttl_ms = round(options.enqueue_ttl * 1000) + pending_ms
    call = _scripts.mark_newest_call(keys, task_id, debounce_ms, max_ms, ttl_ms)
    return int(nodes_for(settings.url).run(_scripts.MARK_NEWEST, call, keys.newest))


def superseded(task: Any, spec: Spec, settings: Settings, name: str, request: Any) -> bool:
    """Whether the call starting now was superseded by a newer one; logs and counts it."""
    if not supersedes(spec.options) or getattr(request, HEADER, None) is not True:
        return False
    keys = _keys.keys_for(settings.prefix, name)
    try:
        reply = nodes_for(settings.url).run(
            _scripts.CHECK_NEWEST, _scripts.check_newest_call(keys, request.id), keys.newest
        )
    except LockUnavailable as exc:
        logger.warning(
            "%s[%s]: could not read the newest-call marker of %s, so the call runs: %s",
            task.name,
            request.id,
            keys.lock,
            exc,
        )
        return False
    newest = _scripts.decode_check_newest(reply)
    if newest is None:
        return False
    logger.info(
        "%s[%s] superseded by %s: a newer call of %s was published; not run",
        task.name,
        request.id,
        newest,
        keys.lock,
    )
    emit(task, request.id, "superseded")
    return True
