"""How the Celery layer reports a lock event: a counter, a signal and, with ``-E``, a task event.

Reporting never raises into the task: a failing signal receiver or counter is logged.
"""

from __future__ import annotations

import logging
from typing import Any

from .. import metrics, signals
from .options import Settings
from .state import state

logger = logging.getLogger("celery_redlock.task")


def emit(
    task: Any,
    task_id: str,
    event: str,
    signal: Any = None,
    *,
    settings: Settings | None = None,
    **fields: Any,
) -> None:
    """Count ``event``, send ``signal`` and, with task events on, a ``task-lock-*`` event.

    ``settings``: the app's, when the caller has them (spares resolving them again)."""
    try:
        metrics.count(task.app, task.name, event, settings)
        if signal is not None and signal.receivers:  # send() does nothing without receivers
            signal.send(sender=task, task_id=task_id, **fields)
        if state.task_events and signal is signals.lock_contended:
            task.send_event(f"task-lock-{event}", key=fields["key"], holder=fields["holder"])
    except Exception:
        logger.exception("%s[%s]: reporting lock event %r failed", task.name, task_id, event)
