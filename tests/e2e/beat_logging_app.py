"""A beat app whose project configures logging itself (a ``setup_logging`` receiver, as a
Django ``LOGGING`` or structlog setup does), with a misspelled setting: the warning must reach
the project's log (``REDLOCK_TEST_LOG``). Celery sends no ``after_setup_logger`` then."""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import Celery, signals

from celery_redlock import LockedTask

app = Celery("beat_logging_app", broker=f"redis://127.0.0.1:{os.environ['REDLOCK_TEST_PORT']}/1")
app.conf.redlock_ulr = "redis://127.0.0.1:1/0"


@app.task(base=LockedTask, name="beat_logging_app.job")
def job() -> None:
    """Never sent: the beat has no schedule."""


@signals.setup_logging.connect
def _project_logging(**_: Any) -> None:
    logging.basicConfig(filename=os.environ["REDLOCK_TEST_LOG"], level=logging.INFO, force=True)
