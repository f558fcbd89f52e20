"""A real redis-server is recognised from its ``INFO`` (``celery_redlock._redis.servers``),
read through redis-py and through the valkey client alike; the startup check then says
nothing more about it."""

from __future__ import annotations

import logging
from pathlib import Path

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


def test_a_quorum_listing_one_server_twice_is_an_error_at_worker_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Helper probe, round 3: one server named by its TCP port and by its unix socket passed
    the URL check (the URLs differ), so a "quorum of 3" was two servers, and one crash took
    two votes. The startup check reads each node's ``run_id``."""
    socket = tmp_path / "a.sock"
    with (
        RedisServer(args=["--unixsocket", str(socket)]) as a,
        RedisServer() as b,
    ):
        app = Celery("twice", set_as_current=False)
        app.conf.redlock_url = [a.url, f"unix://{socket}?db=0", b.url]

        @app.task(base=LockedTask, shared=False)
        def locked() -> None: ...

        with caplog.at_level(logging.INFO, logger="celery_redlock.worker"):
            run_startup_checks(app, pool_enforces_limits=True)
        app.close()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [
        f"celery_redlock: redlock_url names one Redis server 2 times ({a.url}, "
        f"unix://{socket}?db=0: one run_id): the quorum of 3 counts it as 2 nodes, so its "
        "one crash takes 2 votes; give each node its own server"
    ]


def test_a_redis_broker_on_a_unix_socket_holds_the_locks_without_redlock_url(
    tmp_path: Path,
) -> None:
    """kombu's ``redis+socket:///path.sock?virtual_host=2`` is reused as
    ``unix:///path.sock?db=2``: the lock is written in that database of that server."""
    socket = tmp_path / "b.sock"
    with RedisServer(args=["--unixsocket", str(socket)]) as server:
        app = Celery(
            "socket", broker=f"redis+socket://{socket}?virtual_host=2", set_as_current=False
        )
        admin = redis_py.Redis(port=server.port, db=2)

        @app.task(base=LockedTask, shared=False)
        def locked() -> list[bytes]:
            return admin.keys("redlock:{*")  # type: ignore[return-value]

        try:
            keys = locked.apply().get()
        finally:
            admin.close()
            app.close()
    assert [k for k in keys if not k.endswith(b":fence")] != [], keys
