"""Signals sent by locked tasks, for your own metrics, alerts or audit logs.

Connect like any Celery signal (receivers run in the process that ran the task, usually a pool
child; connect module-level functions, or pass ``weak=False``)::

    from celery_redlock.signals import lock_contended

    @lock_contended.connect
    def on_contended(sender, task_id, key, holder, policy, **kwargs):
        statsd.incr(f"lock.contended.{sender.name}.{policy}")

Every signal's ``sender`` is the task. Arguments:

======================  ====================================================================
``lock_acquired``       ``task_id``, ``key``, ``fencing_token``
``lock_contended``      ``task_id``, ``key``, ``holder`` (its task id), ``policy`` applied
                        (``skip``, ``retry``, ``fail``, ``wait`` when a wait starts;
                        ``redelivered`` for a copy of a task retried instead of skipped)
``lock_released``       ``task_id``, ``key``, ``by`` (``"task"``, or ``"parent"`` when the
                        worker's main process released for a dead child)
``lock_lost``           ``task_id``, ``key``, ``reason``
``lock_admin_action``   sent by the dashboard (``celery redlock web``), ``sender`` the app:
                        ``action``, ``key``, ``actor`` (who), ``outcome``, ``forced``
======================  ====================================================================

With task events enabled (``celery worker -E`` or ``worker_send_task_events``), a contended
task also sends a Celery event with ``uuid`` (its task id), ``key`` and ``holder``:
``redlock-skipped``, ``redlock-retried`` (retry, redelivered), ``redlock-failed`` (fail) or
``redlock-waited`` (a wait started), a group of its own so that Celery's ``State`` (and Flower)
keep the task's real state; ``redlock_event_names="task-lock"`` sends the old, deprecated
``task-lock-*`` names instead.
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

__all__ = ["lock_acquired", "lock_admin_action", "lock_contended", "lock_lost", "lock_released"]

lock_acquired = Signal(name="lock_acquired", providing_args={"task_id", "key", "fencing_token"})
lock_contended = Signal(
    name="lock_contended", providing_args={"task_id", "key", "holder", "policy"}
)
lock_released = Signal(name="lock_released", providing_args={"task_id", "key", "by"})
lock_lost = Signal(name="lock_lost", providing_args={"task_id", "key", "reason"})
lock_admin_action = Signal(
    name="lock_admin_action", providing_args={"action", "key", "actor", "outcome", "forced"}
)
