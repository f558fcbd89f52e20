"""What the CLI tests share: the worker app they run, and the CLI run as an operator runs it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from typing import Any

import redis as redis_py

from celery_redlock.testing import wait_until
from support import ROOT

APP = "tests.e2e.tooling_app"
HOLD = f"{APP}.hold"
COUNTED = f"{APP}.counted"
HOST = socket.gethostname()


def cli(
    port: int, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``celery -A tests.e2e.tooling_app redlock <args>`` in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", APP, "redlock", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT), "REDLOCK_TEST_PORT": str(port), **(env or {})},
    )


def started(records: redis_py.Redis, key: str) -> dict[str, Any]:
    """What ``hold(key)`` recorded when it started (its pid, ...), once it has."""
    raw = wait_until(lambda: records.get(f"started:{key}"), 10, f"hold({key!r}) to start")
    out: dict[str, Any] = json.loads(raw)  # type: ignore[arg-type]
    return out
