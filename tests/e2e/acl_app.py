"""A Celery app for the ACL startup checks in real workers (see ``test_startup_checks.py``).

Configured like :mod:`tests.e2e.tooling_app`: ``REDLOCK_TEST_PORT`` is the broker's server,
``REDLOCK_TEST_URL`` the lock Redis (an ACL user's URL). ``REDLOCK_TEST_REPLACE=1`` registers a
``lock_enqueue="replace"`` task and a debounced ``@single_instance`` task beside the plain one.
"""

from __future__ import annotations

import os

from celery_redlock import LockedTask, single_instance
from support.apps import env, layout_app

BASE = f"redis://127.0.0.1:{os.environ['REDLOCK_TEST_PORT']}"

app = layout_app(
    "acl_app", BASE, redlock_url=env("URL") or f"{BASE}/0", worker_hijack_root_logger=True
)


@app.task(base=LockedTask)
def plain() -> str:
    return "plain"


if env("REPLACE"):

    @app.task(base=LockedTask, lock_enqueue="replace")
    def replaced() -> str:
        return "replaced"

    @app.task
    @single_instance(debounce=1.0)
    def debounced() -> str:
        return "debounced"
