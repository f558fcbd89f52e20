"""Fixtures of the end-to-end tests, and the roles the tasks of :mod:`tests.e2e.proj` play.

The worker subprocesses themselves come from :mod:`support.workers`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from celery import Celery

from celery_redlock.testing import RedisServer
from tests.conftest import make_app

#: The two public APIs, and the task of :mod:`tests.e2e.proj` playing each role under each: a
#: test parametrized over ``API_TASKS`` picks its task by role (the twins share one lock).
API_TASKS: dict[str, dict[str, str]] = {
    "task": {"ending": "ending", "waiter": "waiter", "critical": "critical"},
    "decorator": {"ending": "plain_ending", "waiter": "plain_waiter", "critical": "plain_critical"},
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Soak tests (marker ``soak``, a minute or more) run only with ``REDLOCK_SOAK=1``."""
    if os.environ.get("REDLOCK_SOAK") == "1":
        return
    skip = pytest.mark.skip(reason="soak test: run with REDLOCK_SOAK=1")
    for item in items:
        if item.get_closest_marker("soak") is not None:
            item.add_marker(skip)


@pytest.fixture
def proj_client(redis_url: str, redis_server: RedisServer) -> Iterator[Celery]:
    """A client-side app matching ``tests.e2e.proj`` on the session server (emptied)."""
    app = make_app(redis_server, name="proj")
    yield app
    app.close()
