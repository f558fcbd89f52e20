"""The torture run's record of task messages (``chaos.torture.Messages``) on a real Redis.

The run tells a task lost by the broker (its last message popped by a worker SIGKILLed before
kombu recorded it as unacked) from a task lost by the lock. A requeue by the lock keeps the
call's ``retries``, so a record keyed by task id and ``retries`` took a lost requeue for the
submission a worker had received, and the run failed with "1 tasks not ended after the drain"
and a call left in ``RETRY``.
"""

from __future__ import annotations

import time

import redis as redis_py
from celery import Celery
from kombu.utils.uuid import uuid

from chaos.torture import Messages, message_id


def _message(app: Celery, task_id: str, **options: float) -> str:
    """The :func:`message_id` of the message Celery builds for this call."""
    headers = app.amqp.as_task_v2(task_id, "torture.ours_retry", args=("k0", 0.1, 1), **options)[0]
    return message_id(task_id, headers.get("retries"), headers.get("eta"))


def test_a_lock_requeue_is_a_message_of_its_own(r: redis_py.Redis) -> None:
    app = Celery("torture-test", set_as_current=False)
    task_id = uuid()
    submission = _message(app, task_id)
    requeue = _message(app, task_id, countdown=0.3)  # the lock's requeue: same retries
    assert requeue != submission
    now = time.time()
    r.hset("published", submission, now)
    r.sadd("received", submission)
    r.hset("published", requeue, now + 0.5)
    messages = Messages(r, r)
    messages.refresh()
    assert messages.last(task_id) == requeue
    assert not messages.last_received(task_id)
    assert messages.stranded({task_id})  # popped by a worker that died: nothing can end it

    r.sadd("received", requeue)
    assert not messages.stranded({task_id})
    assert messages.last_received(task_id)
