"""A real redis-server is recognised from its ``INFO`` (``celery_redlock._redis.servers``),
read through redis-py and through the valkey client alike; the startup check then says
nothing more about it."""

from __future__ import annotations

import logging

import pytest
import redis as redis_py
import valkey
from celery import Celery

from celery_redlock import LockedTask
from celery_redlock._celery.checks import run_startup_checks
from celery_redlock._redis.servers import identify, verdict
from celery_redlock.testing import RedisServer


@pytest.mark.parametrize("client_cls", [redis_py.Redis, valkey.Valkey], ids=["redis", "valkey"])
def test_our_redis_server_is_redis_with_its_version(
    redis_server: RedisServer, client_cls: type
) -> None:
    client = client_cls(port=redis_server.port)
    try:
        info = client.info()
    finally:
        client.close()
    server = identify(info)
    assert server.product == "Redis"
    assert server.version == info["redis_version"]
    assert verdict(info) == []


def test_the_startup_check_on_redis_logs_no_server_finding(
    app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    @app.task(base=LockedTask)
    def locked() -> None: ...

    with caplog.at_level(logging.INFO, logger="celery_redlock.worker"):
        run_startup_checks(app, pool_enforces_limits=True)
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("celery_redlock: locks on Redis ") for line in lines), lines
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], lines
