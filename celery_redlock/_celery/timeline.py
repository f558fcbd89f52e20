"""The opt-in ring of recent lock events that the dashboard draws as a timeline.

Off by default. With ``app.conf.redlock_timeline = N`` (N > 0), every lock event a worker
reports (acquired, skipped, waited, retried, rate_limited, lost, released, ...) is also pushed
to one Redis list, ``<prefix>:timeline``, newest first, and the list is cut to its N newest
entries in the same script (:func:`celery_redlock._redis.timeline.push`: ``LTRIM``, then
``LPUSH``, ``PEXPIRE``; the worker's startup check asks for them): the ring never holds more
than N entries, whatever the traffic (an unbounded event log in Redis once grew to 3 GB in
another library). It expires an hour after the last event. Each entry is about 200 bytes of
JSON (``t`` wall-clock ms of the reporting process, ``task``, ``id``, ``event``, ``key`` where
the event has one, ``policy``, ``holder``); argument values are never in it, only key names.

The cost: one round trip per event on the task's path, two per execution
(acquired, released); off, one check of the resolved settings per event (in
:func:`~celery_redlock._celery.events.emit`: :func:`record` is not called).
A push that fails is logged at DEBUG and dropped: the ring is a picture
for people, never a reason for a task to fail.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Mapping
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded

from .._redis import timeline as _ring
from .._redis.clients import redact
from .options import settings_for

__all__ = ["read", "record", "record_for", "size_for"]

logger = logging.getLogger("celery_redlock.timeline")

#: Per app: ``(size, url, prefix)``, read once (``app.conf`` is read lazily, on the first event).
_targets: weakref.WeakKeyDictionary[Any, tuple[int, str, str]] = weakref.WeakKeyDictionary()


def size_for(app: Any) -> int:
    """How many events ``app``'s ring keeps (``redlock_timeline``; 0: none).

    :raises ~celery_redlock.LockConfigError: for bad ``redlock_*`` settings (a worker refuses
        to start with one, as for every setting).
    """
    return int(settings_for(app).timeline)


def _url(app: Any) -> tuple[str, str]:
    """The node the ring lives on (a quorum's first) and the prefix, from ``app``'s settings."""
    settings = settings_for(app)
    url = settings.url if isinstance(settings.url, str) else settings.url[0]
    return url, settings.prefix


def _target(app: Any) -> tuple[int, str, str]:
    try:
        return _targets[app]
    except KeyError:
        target = _targets[app] = (size_for(app), *_url(app))
        return target


def record(task: Any, task_id: str, event: str, fields: Mapping[str, Any]) -> None:
    """Push one event of ``task`` to its app's ring, if the app keeps one. Never raises."""
    record_for(task.app, task.name, task_id, event, fields)


def record_for(
    app: Any, task_name: str, task_id: str, event: str, fields: Mapping[str, Any]
) -> None:
    """:func:`record` by names: also for an event no task reported, such as the dashboard's
    release of a dead worker's lock (``by`` says who), which ends that holder's bar."""
    try:
        size, url, prefix = _target(app)
        if not size:
            return
        entry = {"t": int(time.time() * 1000), "task": task_name, "id": task_id, "event": event}
        for name in ("key", "policy", "holder", "by"):
            if fields.get(name) is not None:
                entry[name] = str(fields[name])
        _ring.push(url, prefix, entry, size)
    except SoftTimeLimitExceeded:  # the task's limit, not the ring's failure (see events)
        raise
    except Exception as exc:  # Redis down, a bad setting: the task goes on
        logger.debug("lock timeline: event %r of %s not recorded: %s", event, task_id, redact(exc))


def read(app: Any, limit: int, since_ms: int | None = None) -> list[dict[str, Any]]:
    """The newest ``limit`` entries of ``app``'s ring, oldest first; with ``since_ms``, read
    only as far back as that time (:func:`celery_redlock._redis.timeline.read`).

    :raises ~celery_redlock.LockConfigError: for bad ``redlock_*`` settings; Redis errors
        propagate (the dashboard says them on the page).
    """
    return _ring.read(*_url(app), limit, since_ms)
