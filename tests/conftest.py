"""Shared fixtures: a private redis-server per session, Celery apps pointed at it, and
Django-style settings modules made without Django.

Tests never touch 127.0.0.1:6379 (a shared server on developer machines): every server is
started here on a free loopback port. Database 0 holds locks, 1 the broker, 2 the results, 3
what tasks record about themselves.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
import types
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis as redis_py
from celery import Celery, _state

from celery_redlock.testing import RedisServer
from support.apps import make_app
from support.workers import Holder


@pytest.fixture(scope="session")
def postgres() -> str:
    """The local PostgreSQL's DSN (database ``test``, user ``postgres``, trust auth), once it
    answers. Without one, the test is skipped, naming what it needs; where
    ``REDLOCK_TEST_REQUIRE_POSTGRES=1`` (``.ci/run``), it fails instead, so a run that lost its
    PostgreSQL cannot pass by skipping."""
    required = os.environ.get("REDLOCK_TEST_REQUIRE_POSTGRES") == "1"
    psycopg = importlib.import_module("psycopg") if required else pytest.importorskip("psycopg")
    dsn = "host=127.0.0.1 port=5432 dbname=test user=postgres"
    try:
        psycopg.connect(f"{dsn} connect_timeout=5").close()
    except psycopg.OperationalError as exc:
        if required:
            raise
        why = " ".join(str(exc).split())
        pytest.skip(f"needs a PostgreSQL at '{dsn}' with trust auth ({why})")
    return dsn


@pytest.fixture(autouse=True)
def _forget_shared_tasks() -> Iterator[None]:
    """Tasks a test defines are shared (Celery's default): forget them after the test, so
    the next test's app does not inherit them under the same names."""
    before = set(_state._on_app_finalizers)
    yield
    _state._on_app_finalizers.intersection_update(before)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server
        # Collect the tests' AsyncResults while the server still answers: Celery < 5.7 retries
        # their unsubscribe 20 times, 1 s apart, when they are collected at exit.
        gc.collect()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The lock database of the session server, emptied (all databases) before the test."""
    redis_server.client().flushall()
    return redis_server.url


@pytest.fixture
def r(redis_url: str) -> Iterator[redis_py.Redis]:
    client = redis_py.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def app(redis_url: str, redis_server: RedisServer) -> Celery:
    return make_app(redis_server)


@pytest.fixture
def h() -> Iterator[Holder]:
    holder = Holder()
    yield holder
    holder.gate.set()  # a failing test must not leave a worker thread blocked


# -- Django-style settings modules, without Django ---------------------------------------------


class LazySettings:
    """Like ``django.conf.settings``: reads its module on first attribute access, and counts."""

    def __init__(self, module: types.ModuleType) -> None:
        self._module = module
        self.reads: list[str] = []

    def __getattr__(self, name: str) -> Any:
        self.reads.append(name)
        return getattr(self._module, name)

    def __dir__(self) -> list[str]:
        self.reads.append("__dir__")
        return dir(self._module)


@pytest.fixture
def settings_path() -> Iterator[tuple[str, types.ModuleType, LazySettings]]:
    """``("<module>:settings", the settings module, the lazy settings object)``."""
    name = f"proj_settings_{uuid.uuid4().hex}"
    module = types.ModuleType(name)
    holder = types.ModuleType(name + "_conf")
    lazy = holder.settings = LazySettings(module)  # type: ignore[attr-defined]
    sys.modules[holder.__name__] = holder
    yield f"{holder.__name__}:settings", module, lazy
    del sys.modules[holder.__name__]
