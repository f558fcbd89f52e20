"""The worker's main process releases a dead pool child's lock once per death: its reaper and
Celery's ``on_failure`` both reach :func:`~celery_redlock._celery.parent.release_for_dead_child`
for one death, in either order. The request here stands for Celery's (the attributes that
function reads); the lock, its key and Redis are real."""

from __future__ import annotations

import logging
import os
import types

import pytest
import redis as redis_py
from celery import Celery

from celery_redlock import Lock, LockedTask
from celery_redlock._celery.identity import lock_name_for, spec_of
from celery_redlock._celery.options import settings_for
from celery_redlock._celery.parent import release_for_dead_child


def test_a_dead_childs_lock_is_released_once_and_said_once(
    app: Celery, r: redis_py.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """(1) the reaper sees the child gone and releases; (2) Celery notices the death up to
    5 s later and ``on_failure`` released again: a second round trip, and "died holding no
    lock of this call" after "released the lock of dead child"."""

    @app.task(base=LockedTask, name="parent.job")
    def job(n: int) -> None: ...

    spec = spec_of(job)
    assert spec is not None
    settings = settings_for(app)
    name = lock_name_for(job, spec, (1,), {})
    held = Lock(settings.url, name, prefix=settings.prefix, owner="call-1", host="w1@host")
    assert held.acquire(blocking=False)
    request = types.SimpleNamespace(
        task=job, args=(1,), kwargs={}, id="call-1", hostname="w1@host", worker_pid=os.getpid()
    )
    with caplog.at_level(logging.INFO, logger="celery_redlock"):
        release_for_dead_child(request)  # the reaper
        release_for_dead_child(request)  # on_failure
    said = [record.getMessage() for record in caplog.records]
    assert said == [f"parent.job[call-1]: released the lock of dead child {os.getpid()}"]
    assert r.exists(held.key) == 0
