"""What every benchmark script records about the run it measured."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import celery
import redis

from celery_redlock.testing import RedisServer

ROOT = Path(__file__).resolve().parents[1]


def git_state() -> str:
    """Commit of the checkout the package is imported from, ``+dirty`` if it has edits."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            text=True,
            capture_output=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "celery_redlock"],
            cwd=ROOT,
            text=True,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty.strip() else "")


def environment(server: RedisServer) -> dict[str, Any]:
    """Versions, CPUs, load and commit: printed in each benchmark's header and its JSON."""
    probe = server.client()
    info = probe.info("server")
    probe.close()
    return {
        "python": platform.python_version(),
        "redis_py": redis.__version__,
        "celery": celery.__version__,
        "redis_server": info.get("redis_version"),
        "cpus": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
        "package_commit": git_state(),
    }
