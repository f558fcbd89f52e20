"""The README's top-level Python blocks run, against a private server, so they cannot rot."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import redis as redis_py

from celery_redlock import Lock, lock_key
from celery_redlock.testing import RedisServer
from tests.conftest import lock_keys

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
BLOCKS = re.findall(r"^```python\n(.*?)^```", README, flags=re.S | re.M)


def run_block(index: int, server: RedisServer) -> dict[str, Any]:
    code = BLOCKS[index].replace("redis://localhost:6379", f"redis://127.0.0.1:{server.port}")
    namespace: dict[str, Any] = {"__name__": "readme"}
    exec(compile(code, f"README block {index}", "exec"), namespace)
    return namespace


def test_quickstart_locks_and_releases(redis_server: RedisServer, r: redis_py.Redis) -> None:
    ns = run_block(0, redis_server)
    app, task = ns["app"], ns["sync_account"]
    assert "localhost:6379" not in app.conf.redlock_url
    assert task.apply(args=(42,)).get() == 42
    locks = redis_py.Redis(port=redis_server.port, db=1)
    assert lock_key(task, 42).startswith("redlock:{readme.sync_account:")
    assert lock_keys(locks) == []
    assert locks.exists(lock_key(task, 42) + ":fence")  # it did take a lock
    app.close()


def test_lock_primitive_example(redis_server: RedisServer, redis_url: str) -> None:
    ns = run_block(1, redis_server)

    class Cache:
        def rebuild(self) -> str:
            return "fresh"

        def stale(self) -> str:
            return "stale"

    assert ns["homepage"](Cache(), redis_url) == "fresh"
    with Lock(redis_url, "rebuild:homepage", ttl=30):
        assert ns["homepage"](Cache(), redis_url) == "stale"  # after its 2 s timeout
