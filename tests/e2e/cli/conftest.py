"""The fixtures of the CLI tests: one redis-server and one worker (``w1``) per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis as redis_py
from celery import Celery

from celery_redlock.testing import RedisServer
from support.apps import make_app
from support.workers import WorkerProcess
from tests.e2e.cli.tooling import APP


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as srv:
        yield srv


@pytest.fixture(scope="module")
def w1(server: RedisServer) -> Iterator[WorkerProcess]:
    with WorkerProcess(server.port, "w1", app=APP) as worker:
        yield worker


@pytest.fixture
def client(server: RedisServer) -> Iterator[Celery]:
    app = make_app(server, name="tooling_app")
    yield app
    app.close()


@pytest.fixture
def records(server: RedisServer) -> Iterator[redis_py.Redis]:
    r = redis_py.Redis(port=server.port, db=3)
    yield r
    r.close()
