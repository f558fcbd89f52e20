"""A Celery app whose locked task cannot work with its settings: the worker must refuse to start.

Configured from the environment: ``REDLOCK_TEST_PORT`` is the test's private redis-server
(broker db 1), ``REDLOCK_TEST_URL`` is ``redlock_url`` (a JSON list of URLs, or one URL), and
``REDLOCK_TEST_API`` (``task`` or ``decorator``) picks the API declaring the one locked task,
``limited``, with ``REDLOCK_TEST_LIMIT`` (default 2) executions at once.
"""

from __future__ import annotations

import json
import os
from typing import Any

from celery_redlock import LockedTask, single_instance
from support.apps import layout_app

PORT = int(os.environ["REDLOCK_TEST_PORT"])
BASE = f"redis://127.0.0.1:{PORT}"
URL = os.environ["REDLOCK_TEST_URL"]
LIMIT = int(os.environ.get("REDLOCK_TEST_LIMIT", "2"))

app = layout_app("crosscheck_app", BASE, redlock_url=json.loads(URL) if URL[0] == "[" else URL)

if os.environ["REDLOCK_TEST_API"] == "task":

    @app.task(base=LockedTask, lock_limit=LIMIT)
    def limited(key: str) -> Any:
        return key

else:

    @app.task
    @single_instance(limit=LIMIT)
    def limited(key: str) -> Any:
        return key
