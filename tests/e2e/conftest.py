from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery import Celery

from celery_redlock.testing import RedisServer
from tests.conftest import make_app


@pytest.fixture
def proj_client(redis_url: str, redis_server: RedisServer) -> Iterator[Celery]:
    """A client-side app matching ``tests.e2e.proj`` on the session server (emptied)."""
    app = make_app(redis_server, name="proj")
    yield app
    app.close()
