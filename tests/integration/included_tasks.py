"""The tasks of :mod:`tests.integration.included_app`, imported only through its ``include``."""

from __future__ import annotations

from celery_redlock import LockedTask
from tests.integration.included_app import app


@app.task(base=LockedTask, name="included.sync", lock_name="grp", lock_by=["x"], shared=False)
def sync(x: int) -> int:
    return x
