"""What the Celery layer knows about the worker this process belongs to (a leaf module).

The worker's main process fills :data:`state` from the ``worker_init`` receiver in
:mod:`celery_redlock._celery.wiring`, before the pool forks, so pool children inherit it. Outside
a worker (eager calls, ``apply()``, a client process) it keeps its defaults.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class WorkerState:
    """Facts about the worker, captured before the pool forks."""

    #: The worker's ``--time-limit`` / ``task_time_limit`` (invisible in a pool child).
    time_limit: float | None = None
    #: Whether the pool enforces hard time limits; ``False`` outside a worker (eager, apply).
    enforces_limits: bool = False
    #: Whether executions run in prefork pool children, whose main process settles the queued
    #: marker of a call whose child died (``_celery.parent``); ``False`` in any other pool.
    pool_children: bool = False
    #: Whether the worker sends task events (``-E``): then contention sends ``redlock-*``.
    task_events: bool = False


state = WorkerState()
