"""The worker's main process releases a dead pool child's lock once per death: its reaper and
Celery's ``on_failure`` both reach :func:`~celery_redlock._celery.parent.release_for_dead_child`
for one death, in either order. The request here stands for Celery's (the attributes that
function reads); the lock, its key and Redis are real."""

from __future__ import annotations

import logging
import os
import types
from typing import Any

import pytest
import redis as redis_py
from celery import Celery

from celery_redlock import Lock, LockedTask
from celery_redlock._celery.identity import lock_name_for, spec_of
from celery_redlock._celery.options import settings_for
from celery_redlock._celery.parent import release_for_dead_child
from celery_redlock.testing import RedisServer, wait_until
from support.apps import make_app


def dead_childs_lock(app: Celery, name: str, **options: Any) -> tuple[Lock, Any]:
    """The lock of call ``call-1`` of a task ``name`` (``job(1)``) held as a pool child of
    ``w1@host`` holds it (this process's pid stands for the child's), and the request that
    Celery's ``on_failure`` and the reaper hand over for that child's death."""

    @app.task(base=LockedTask, name=name, **options)
    def job(n: int) -> None: ...

    spec = spec_of(job)
    assert spec is not None
    settings = settings_for(app)
    lock_name = lock_name_for(job, spec, (1,), {})
    held = Lock(settings.url, lock_name, prefix=settings.prefix, owner="call-1", host="w1@host")
    assert held.acquire(blocking=False)
    request = types.SimpleNamespace(
        task=job, args=(1,), kwargs={}, id="call-1", hostname="w1@host", worker_pid=os.getpid()
    )
    return held, request


def test_a_dead_childs_lock_is_released_once_and_said_once(
    app: Celery, r: redis_py.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """(1) the reaper sees the child gone and releases; (2) Celery notices the death up to
    5 s later and ``on_failure`` released again: a second round trip, and "died holding no
    lock of this call" after "released the lock of dead child"."""

    held, request = dead_childs_lock(app, "parent.job")
    with caplog.at_level(logging.INFO, logger="celery_redlock"):
        release_for_dead_child(request)  # the reaper
        release_for_dead_child(request)  # on_failure
    said = [record.getMessage() for record in caplog.records]
    assert said == [f"parent.job[call-1]: released the lock of dead child {os.getpid()}"]
    assert r.exists(held.key) == 0


def test_a_release_redis_did_not_answer_is_sent_again_once_it_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Restart probe, round 3: (1) the lock Redis goes down; (2) a child holding a
    ``lock_ttl=120`` lock dies, and the main process's releases fail; (3) Redis is back
    seconds later, but the key stayed for its 120 s, every call of its key skipped."""
    with RedisServer(args=["--appendonly", "yes", "--appendfsync", "always"]) as server:
        app = make_app(server, "parent.outage")

        held, request = dead_childs_lock(app, "parent.outage.job", lock_ttl=120)
        server.stop()
        with caplog.at_level(logging.INFO, logger="celery_redlock"):
            release_for_dead_child(request)  # the reaper
            release_for_dead_child(request)  # on_failure: the first one's give-back is enough
            server.start()  # its append-only file kept the dead child's key
            client = server.client()
            wait_until(lambda: not client.exists(held.key), 10, "the dead child's key released")
            client.close()
            done = f"parent.outage.job[call-1]: released the lock of dead child {os.getpid()}"
            wait_until(lambda: done in caplog.text, 5, "the release said")
        assert caplog.text.count("did not answer the release of any lock it held") == 1
        assert "released once Redis answers again" in caplog.text
