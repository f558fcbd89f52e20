"""``celery redlock inspect KEY`` shows the per-call overrides a held lock was taken with.

A real prefork worker (``tests.e2e.tooling_app``) runs ``hold`` published with per-call
options; the CLI runs in a subprocess like an operator's.
"""

from __future__ import annotations

import json

import pytest
import redis as redis_py
from celery import Celery

import celery_redlock.task  # noqa: F401  (connects the publish receiver for send_task)
from celery_redlock.testing import RedisServer
from support.workers import WorkerProcess
from tests.e2e.cli.tooling import HOLD, cli, started

pytestmark = pytest.mark.slow


def held_key(port: int, task_id: str) -> str:
    done = cli(port, "ls", "--json")
    assert done.returncode == 0, done.stderr
    (lock,) = [item for item in json.loads(done.stdout) if item["task_id"] == task_id]
    return str(lock["key"])


def test_inspect_shows_the_overrides_of_the_holder(
    server: RedisServer, w1: WorkerProcess, client: Celery, records: redis_py.Redis
) -> None:
    result = client.send_task(
        HOLD, args=("ovr",), lock_ttl=40, lock_on_contention="wait", lock_wait_timeout=5
    )
    started(records, "ovr")
    key = held_key(server.port, result.id)

    as_json = cli(server.port, "inspect", key, "--json")
    assert as_json.returncode == 0, as_json.stderr
    shown = json.loads(as_json.stdout)
    assert shown["overrides"] == {"ttl": 40.0, "on_contention": "wait", "wait_timeout": 5.0}
    assert 30 < shown["ttl"] <= 40  # the fixed TTL of the override, not the 30 s lease

    text = cli(server.port, "inspect", key)
    assert text.returncode == 0, text.stderr
    assert "lock_on_contention='wait', lock_ttl=40.0, lock_wait_timeout=5.0" in text.stdout
    records.rpush("go:ovr", 1)
    assert result.get(timeout=10) == "ovr"

    records.delete("started:ovr")
    plain = client.send_task(HOLD, args=("ovr",))  # the next holder took it without overrides
    started(records, "ovr")
    key = held_key(server.port, plain.id)
    again = cli(server.port, "inspect", key, "--json")
    assert json.loads(again.stdout)["overrides"] is None
    assert "overrides none" in cli(server.port, "inspect", key).stdout
    records.rpush("go:ovr", 1)
    assert plain.get(timeout=10) == "ovr"
