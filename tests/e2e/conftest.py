"""Fixtures of the end-to-end tests (the roles the tasks of :mod:`tests.e2e.proj` play are
:data:`support.apps.API_TASKS`).

The worker subprocesses themselves come from :mod:`support.workers`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery import Celery

from celery_redlock.testing import RedisServer
from support.apps import env, make_app


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Soak tests (marker ``soak``, a minute or more) run only with ``REDLOCK_TEST_SOAK=1``."""
    if env("SOAK") == "1":
        return
    skip = pytest.mark.skip(reason="soak test: run with REDLOCK_TEST_SOAK=1")
    for item in items:
        if item.get_closest_marker("soak") is not None:
            item.add_marker(skip)


@pytest.fixture
def proj_client(redis_url: str, redis_server: RedisServer) -> Iterator[Celery]:
    """A client-side app matching ``tests.e2e.proj`` on the session server (emptied)."""
    app = make_app(redis_server, name="proj")
    yield app
    app.close()
