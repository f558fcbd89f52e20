"""The names of the Celery events of a contended task, as event consumers read them.

Celery's ``State`` (what Flower shows) splits an event type at its first ``-``: the group
``task`` updates the task, and an unknown subject becomes the task's state (``task-lock-skipped``
made a skipped task ``LOCK-SKIPPED`` until its ``task-succeeded``); exporters that map every
``task-*`` event to a state (``TASK_EVENT_TO_STATE[type[5:]]``) raise ``KeyError`` on it. The
``redlock-*`` group leaves both alone. ``redlock_event_names="task-lock"`` keeps the old names
for a deprecation period.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis as redis_py
from celery.events import group_from
from celery.events.state import TASK_EVENT_TO_STATE, State

from celery_redlock.testing import RedisServer, wait_until
from support.apps import make_app
from support.workers import WorkerProcess
from tests.e2e.test_worker_signals import APP, HOLD, EventTap

pytestmark = pytest.mark.slow


def skip_one(redis_server: RedisServer, env: dict[str, str]) -> tuple[list[dict[str, Any]], str]:
    """Run ``hold('n')`` and a second call skipped by it on a ``-E`` worker; return every event
    seen (in order, until the skipped call's ``task-succeeded``; worker events, which carry no
    ``uuid``, among them) and the skipped call's id."""
    records = redis_py.Redis(port=redis_server.port, db=3)
    client = make_app(redis_server, name="tooling_app", task_send_sent_event=True)
    seen: list[dict[str, Any]] = []
    with (
        WorkerProcess(redis_server.port, "w1", app=APP, args=["-E"], env=env),
        EventTap(client) as tap,
    ):
        first = client.send_task(HOLD, args=("n",))
        wait_until(lambda: records.get("started:n"), 10, "hold('n') to start")
        second = client.send_task(HOLD, args=("n",))
        assert second.get(timeout=10) is None

        def done(event: dict[str, Any]) -> bool:
            seen.append(event)
            return event["type"] == "task-succeeded" and event.get("uuid") == second.id

        tap.wait_for(done, 10)
        records.rpush("go:n", 1)
        assert first.get(timeout=10) == "n"
    client.close()
    records.close()
    return seen, second.id


def test_a_skip_is_a_redlock_event_and_the_task_keeps_its_celery_states(
    redis_server: RedisServer, redis_url: str
) -> None:
    seen, skipped = skip_one(redis_server, {})
    ours = [e for e in seen if e.get("uuid") == skipped and e["type"].startswith("redlock-")]
    assert [e["type"] for e in ours] == ["redlock-skipped"]
    assert group_from("redlock-skipped") == "redlock"
    # Celery's State (Flower's) walks the task through real states only.
    state = State()
    states = []
    for event in seen:
        state.event(event)
        if skipped in state.tasks:
            states.append(state.tasks[skipped].state)
    assert set(states) <= {"PENDING", "RECEIVED", "STARTED", "SUCCESS"}, states
    assert states[-1] == "SUCCESS"
    # An exporter mapping every task-* event to a state finds a state for each.
    for event in seen:
        if group_from(event["type"]) == "task":
            assert event["type"][5:] in TASK_EVENT_TO_STATE, event["type"]


def test_the_deprecated_names_are_still_sent_on_request(
    redis_server: RedisServer, redis_url: str
) -> None:
    seen, skipped = skip_one(redis_server, {"REDLOCK_TEST_EVENT_NAMES": "task-lock"})
    ours = [e for e in seen if e.get("uuid") == skipped and "lock-" in e["type"]]
    assert [e["type"] for e in ours] == ["task-lock-skipped"]
    state = State()
    for event in seen:
        state.event(event)
        if event["type"] == "task-lock-skipped":
            # What redlock-* avoids: Celery's State takes the subject for a task state.
            assert state.tasks[skipped].state == "LOCK-SKIPPED"
