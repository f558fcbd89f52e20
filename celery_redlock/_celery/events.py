"""How the Celery layer reports a lock event: a counter, a signal, with ``-E`` a task event, and
with ``redlock_timeline`` an entry in the dashboard's ring.

Reporting never raises into the task: a failing signal receiver or counter is logged. A soft
time limit is not a failure of the reporting: its ``SoftTimeLimitExceeded``, raised by a signal
handler wherever the task is, goes on (caught with the rest, a limit that landed here was lost:
the task ran on past it and ended SUCCESS).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded

from .. import metrics, signals
from . import timeline, tracing
from .options import Settings, settings_for
from .state import state

logger = logging.getLogger("celery_redlock.task")

#: The fields of an event reported without any.
NO_FIELDS: Mapping[str, Any] = MappingProxyType({})


def emit(
    task: Any,
    task_id: str,
    event: str,
    signal: Any = None,
    settings: Settings | None = None,
    fields: Mapping[str, Any] = NO_FIELDS,
) -> None:
    """Count ``event``, send ``signal`` and, with task events on, a ``redlock-*`` event.

    ``settings``: the app's, when the caller has them (spares resolving them again).
    ``fields``: the signal's keyword arguments (``key``, ``holder``...), as a mapping, not as
    keywords: gathering ``**fields`` cost more than the rest of the call on every execution."""
    tracing.record(task_id, event, fields)
    try:
        if settings is None:
            settings = settings_for(task.app)
        metrics.count(task.app, task.name, event, settings)
        if settings.timeline:  # off by default: no ring, no lookup
            timeline.record(task, task_id, event, fields)
        if signal is not None and signal.receivers:  # send() does nothing without receivers
            signal.send(sender=task, task_id=task_id, **fields)
        if signal is signals.lock_contended and state.task_events:
            group = settings.event_names  # or task-lock (deprecated)
            task.send_event(f"{group}-{event}", key=fields["key"], holder=fields["holder"])
    except SoftTimeLimitExceeded:
        raise
    except Exception:
        logger.exception("%s[%s]: reporting lock event %r failed", task.name, task_id, event)
