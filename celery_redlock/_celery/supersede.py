"""Newest wins (``lock_enqueue="replace"``) and debounce (``lock_debounce``): a later call of a
key supersedes the calls of that key still waiting to start.

Both options keep one marker per key, ``<key>:newest`` (:mod:`celery_redlock._redis.keys`): the
newest call known to be published, the number of the last call numbered, and for a debounce the
start of the open window. Each side is one script (:mod:`celery_redlock._redis.companions`):

* **before the publish** (:func:`on_publish`, a ``before_task_publish`` receiver of
  :mod:`celery_redlock._celery.wiring`): the call gets the next number of its key, stamped on
  the message as the :data:`HEADER`. With a debounce the message gets an ETA: ``lock_debounce``
  from now, capped so that it is due at most ``lock_debounce_max`` after the first call of the
  window. Doing it in the receiver serves both APIs (``@single_instance`` cannot change the
  task class's ``apply_async``) and every way of publishing (``delay``, ``apply_async``,
  ``send_task``, canvas parts, beat). The task is found from the ``Celery.send_task`` call
  that publishes (:func:`publishing_task`): the signal does not carry the app.
* **after the publish** (:func:`on_published`, ``after_task_publish``): the call becomes the
  newest, unless a later-numbered one already is. A publish that fails (broker unreachable,
  kombu's retries used up) never gets here, so the queued calls are not superseded by a call
  that does not exist.
* **at start** (:func:`superseded`, from :func:`celery_redlock._celery.engine.enter`, before the
  lock is taken, and again once a call that waited for it has it): a stamped call superseded
  by a later-numbered newest call ends like a skip (SUCCESS, ``None``, so chords complete)
  with an INFO line naming the newer call. A call
  numbered above the newest known runs and becomes the newest (it arrived, so its publish
  succeeded, even if its confirmation has not been written yet). The newest closes its
  debounce window.

What is never superseded:

1. A call whose body started. Its retries (``self.retry()``, ``autoretry_for``) keep its
   number under the ``wait`` and ``retry`` contention policies, where a newer call runs in
   its turn, so a newer call supersedes them (:func:`_retry_superseded`), unless it failed
   without running (:func:`superseded`); under ``skip`` and
   ``fail`` they are stamped ``false`` here, although Celery copies the original headers into
   them. So are messages published while Redis was unreachable or refused the marker
   (``false``), messages without the header (older versions, eager calls) and
   ``lock_bypass`` calls, which write no marker either. A replacement (``self.replace()``)
   is not such a message although it carries the running task id: it is a new call, numbered
   (and debounced) as any. A requeue by the lock itself
   (contention ``retry``, ``lock_rate``, ``redlock_on_unavailable="retry"``), whose body did
   not start, keeps its number and is checked again when it comes back: an older call retried
   with jitter, or for an outage, never runs after a newer one.
2. The newest call. Since its id stays in the marker after it starts, an older message that a
   slow worker starts afterwards is still superseded: old arguments never run after new ones.

Hazards, stated in the guide: the newest message carries the batch, so revoking it (or losing
it) leaves the calls it superseded unrun; a marker that expired (``lock_enqueue_ttl`` after the
call was due; the TTL is never shortened by a later call) or was lost (the lock Redis restarted)
lets the older calls run: the first to start marks itself the newest (``CHECK_NEWEST``), so of
those that start after it only the newer ones run, until a later call is published (numbers
follow the server's clock across markers: ``MARK_NEWEST`` in
:mod:`celery_redlock._redis.scripts.companions`). Timeline without that mark: (1) calls 1 and 2
wait, their marker is lost; (2) call 2 starts first (a retry's jitter) and runs; (3) call 1
starts, finds no marker, and runs: its old arguments undo the newest. With a
debounce, every superseded message waits for its ETA in a worker's memory, as Celery holds ETA
messages, and an ``expires`` shorter than the debounce revokes every call of the window.
"""

from __future__ import annotations

import datetime
import logging
import threading
from collections.abc import Mapping, MutableMapping
from typing import Any

from celery import current_app, current_task
from celery.utils.time import maybe_make_aware

from .._redis import companions
from .._redis import keys as _keys
from .._redis.clients import redact
from ..exceptions import LockConfigError, LockUnavailable
from . import calls, routing
from .events import emit
from .identity import Spec, lock_name_for, spec_of
from .options import Settings, contention_policy, settings_for, supersedes
from .results import ended_unrun

logger = logging.getLogger("celery_redlock.task")

#: Message header: the call's number (:func:`on_publish`), ``false`` when it is not marked
#: (``true``: stamped by an older version, which compares task ids only).
HEADER = "redlock_newest"

#: Attribute of ``task.request`` set while the lock requeues the call (its body did not run):
#: the republished message keeps its number (see the module docstring).
REQUEUE_ATTR = "redlock_requeue"

#: The call this thread is publishing: ``(task id, target, keys, number)`` for
#: :func:`on_published`.
_pending = threading.local()


def publishing_task(name: str) -> Any:
    """The task published as ``name`` in this thread, or ``None``.

    It is the task noted for this call (:func:`celery_redlock._celery.routing.routed_task`:
    by ``LockedTask.apply_async``, and by the app's router, to which ``apply_async`` passes
    the task itself and ``send_task`` the task it looks up in its app), or else the current
    app's task of that name.
    """
    task = routing.routed_task(name)
    return task if task is not None else current_app.tasks.get(name)


def _republished(headers: MutableMapping[str, Any], properties: Any) -> bool:
    """Whether this message requeues the execution running in this thread: its task id and
    task, and not its replacement (``self.replace()`` gives the running task id to another
    call, a new one: numbered and debounced as any call)."""
    task = current_task._get_current_object()
    if task is None:
        return False
    request = task.request
    return (
        not request.called_directly
        and headers.get("id") == request.id
        and headers.get("task") == task.name
        and not calls.replaces(request, headers, properties)
    )


def on_publish(headers: MutableMapping[str, Any] | None, body: Any, properties: Any = None) -> None:
    """Number the call being published (see the module docstring); with a debounce, delay it."""
    _pending.call = None
    if not headers or "id" not in headers:
        return  # task protocol 1: the call is not marked, and runs
    if _republished(headers, properties):
        task = current_task._get_current_object()
        requeued = getattr(task.request, REQUEUE_ATTR, False)
        if HEADER in headers and not requeued and not _retry_superseded(task):
            headers[HEADER] = False
        return
    task = publishing_task(str(headers.get("task")))
    spec = None if task is None else spec_of(task)
    if spec is None or not supersedes(spec.options):
        return
    if not isinstance(body, (tuple, list)) or len(body) < 2:
        return
    header = headers.get(calls.HEADER)
    if isinstance(header, Mapping) and calls.bypassed(header):
        return  # runs without the lock: neither marked nor superseded
    options = spec.options
    task_id = str(headers["id"])
    now = task.app.now()
    pending_ms = _pending_ms(task.app, headers.get("eta"), now)
    debounce_ms = round((options.debounce or 0) * 1000)
    headers[HEADER] = False
    delay_ms = debounce_ms
    try:
        settings = settings_for(task.app)
        name = routing.routed_lock_name(task, body[0], body[1]) or lock_name_for(
            task, spec, body[0], body[1]
        )
        keys = _keys.keys_for(settings.prefix, name)
        max_ms = round((options.debounce_max or 0) * 1000)
        ttl_ms = round(options.enqueue_ttl * 1000) + pending_ms
        marked = companions.mark_newest(settings.url, keys, debounce_ms, max_ms, ttl_ms)
        headers[HEADER] = marked.seq
        delay_ms = marked.delay_ms
        _pending.call = (task_id, settings.url, keys, marked.seq)
    except LockUnavailable as exc:
        grant = companions.acl_refusal(exc, "mark_newest")
        if grant is not None:
            logger.warning(
                "%s[%s]: published without the newest-call marker, the lock Redis refused "
                "permission (the ACL user needs %s for lock_enqueue='replace' and "
                "lock_debounce); it will run, not superseded: %s",
                task.name,
                task_id,
                grant,
                exc,
            )
        else:
            logger.warning(
                "%s[%s]: published without the newest-call marker, Redis is unavailable (it "
                "will run, not superseded): %s",
                task.name,
                task_id,
                exc,
            )
    except LockConfigError as exc:  # unchecked by the router (routing: hazards)
        logger.error(
            "%s[%s]: published without the newest-call marker, and no worker will run it: %s",
            task.name,
            task_id,
            exc,
        )
    except Exception as exc:  # never make the publish fail: the call runs, unmarked
        logger.warning(
            "%s[%s]: published without the newest-call marker (it will run, not superseded): "
            "%s: %s",
            task.name,
            task_id,
            type(exc).__name__,
            redact(exc),
        )
    if delay_ms > pending_ms:
        headers["eta"] = (now + datetime.timedelta(milliseconds=delay_ms)).isoformat()


def _retry_superseded(task: Any) -> bool:
    """Whether a retry of the call running in this thread (``self.retry()``,
    ``autoretry_for``) keeps the call's number, so that a newer call supersedes it: under the
    ``wait`` and ``retry`` contention policies, where that newer call runs in its turn. Under
    ``skip`` and ``fail`` it may have ended unrun while this call held the lock, so the retry
    is never superseded (the newest call's loss is the guide's hazard of those policies).

    Timeline it closes: (1) call 1 runs and calls ``self.retry(countdown=5)``, which releases
    the lock and publishes the retry; (2) call 2 takes the lock and runs; (3) the retry of call
    1 runs after it: the older arguments land last.
    """
    spec = spec_of(task)
    if spec is None:
        return False
    header = calls.header_of(task.request)
    if header:
        spec = calls.call_spec(spec, header)
    return contention_policy(spec.options, settings_for(task.app)) in ("wait", "retry")


def on_published(headers: Mapping[str, Any] | None) -> None:
    """After a successful publish: the call numbered by :func:`on_publish` becomes the newest.

    Never raises: if the confirmation fails, the call still becomes the newest when it starts
    (:func:`superseded`); meanwhile older calls of its key still run.
    """
    pending = getattr(_pending, "call", None)
    _pending.call = None
    if pending is None or not headers or headers.get("id") != pending[0]:
        return
    task_id, target, keys, seq = pending
    try:
        companions.confirm_newest(target, keys, task_id, seq)
    except Exception as exc:
        logger.warning(
            "%s: could not confirm call %s as the newest of %s (older calls may still run): %s",
            headers.get("task"),
            task_id,
            keys.lock,
            redact(exc),
        )


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


def _number(value: Any) -> int | None:
    """The call's number from its :data:`HEADER` (0: an older version's ``true``), or ``None``
    when the call is not marked."""
    if value is True:
        return 0
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def superseded(task: Any, spec: Spec, settings: Settings, name: str, request: Any) -> bool:
    """Whether the call starting now was superseded by a newer one; logs and counts it.

    A retry of a started call (``request.retries``) is superseded only by a newer call that
    did not fail without running (:func:`~celery_redlock._celery.results.ended_unrun`: it
    found the key held past its wait, or Redis did not answer; without a result backend that
    keeps its state, the retry is superseded). A newer call whose body ran, and failed, or
    that was revoked, supersedes it: a revoked newest call leaves the calls it superseded
    unrun, as the guide says. Timeline it closes: (1) call 1 holds the key
    for 40 s; (2) call 2, published meanwhile, waits 30 s (``lock_wait_timeout``) and fails;
    (3) call 1 calls ``self.retry()``: superseded by call 2, neither call's work would be done.
    """
    if not supersedes(spec.options):
        return False
    seq = _number(getattr(request, HEADER, None))
    if seq is None:
        return False
    keys = _keys.keys_for(settings.prefix, name)
    try:
        ttl_ms = max(1, round(spec.options.enqueue_ttl * 1000))
        newest = companions.check_newest(settings.url, keys, request.id, seq, ttl_ms)
    except LockUnavailable as exc:
        grant = companions.acl_refusal(exc, "check_newest")
        logger.warning(
            "%s[%s]: could not read the newest-call marker of %s, so it is not skipped as "
            "superseded, and goes on to the lock (redlock_on_unavailable applies if that "
            "Redis does not answer): %s%s",
            task.name,
            request.id,
            keys.lock,
            exc,
            "" if grant is None else f" (the ACL user needs {grant})",
        )
        return False
    if newest is None:
        return False
    if request.retries and ended_unrun(task, newest):
        logger.info(
            "%s[%s] runs: a newer call of %s, %s, was published but failed without running",
            task.name,
            request.id,
            keys.lock,
            newest,
        )
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
