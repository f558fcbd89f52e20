"""A Celery app whose locked task cannot work with its settings: the worker must refuse to start.

Configured from the environment: ``REDLOCK_TEST_PORT`` is the test's private redis-server
(broker db 1), ``REDLOCK_TEST_URL`` is ``redlock_url`` (a JSON list of URLs, or one URL; the
JSON ``null`` leaves it unset), ``REDLOCK_TEST_CONF`` more settings (a JSON object, such as
``{"broker_url": "memory://"}``), and ``REDLOCK_TEST_API`` (``task``, ``decorator``, ``both``:
``base=LockedTask`` over ``@single_instance``, ``plain``: the options without ``LockedTask``,
``mixed``: the options over ``@single_instance``) picks the API declaring the one task,
``limited``, with ``REDLOCK_TEST_LIMIT`` (default 2) executions at once and the task options of
``REDLOCK_TEST_OPTIONS`` (a JSON object, ``lock_*`` names). ``REDLOCK_TEST_DICTCONFIG`` set
makes the module configure logging as a Django ``LOGGING`` with ``disable_existing_loggers``
does, once the package's loggers exist: at import (``root``: with a handler on stderr for the
root logger), or (``setup_logging``) in Celery's ``setup_logging`` signal, as Celery's recipe
for Django does, with a handler on stderr.
"""

from __future__ import annotations

import json
import logging.config
import os
from typing import Any

from celery import signals

from celery_redlock import LockedTask, single_instance
from support.apps import env, layout_app

PORT = int(os.environ["REDLOCK_TEST_PORT"])
BASE = f"redis://127.0.0.1:{PORT}"
URL = os.environ["REDLOCK_TEST_URL"]
LIMIT = int(env("LIMIT") or "2")
OPTIONS: dict[str, Any] = json.loads(env("OPTIONS") or "{}")
CONF: dict[str, Any] = json.loads(env("CONF") or "{}")

app = layout_app(
    "crosscheck_app",
    BASE,
    redlock_url=json.loads(URL) if URL[0] in "[n" else URL,
    **CONF,
)
API = os.environ["REDLOCK_TEST_API"]
if env("DICTCONFIG") == "setup_logging":

    @signals.setup_logging.connect(weak=False)
    def _configure(**_: Any) -> None:
        logging.config.dictConfig(
            {
                "version": 1,
                "disable_existing_loggers": True,
                "handlers": {"stderr": {"class": "logging.StreamHandler"}},
                "root": {"handlers": ["stderr"], "level": "INFO"},
                "loggers": {"celery": {"level": "INFO"}},  # Celery's own, named: kept on
            }
        )

elif env("DICTCONFIG") == "root":  # and a handler on the root logger, as Django's LOGGING has
    logging.config.dictConfig(
        {
            "version": 1,
            "disable_existing_loggers": True,
            "handlers": {"stderr": {"class": "logging.StreamHandler"}},
            "root": {"handlers": ["stderr"], "level": "INFO"},
        }
    )
elif env("DICTCONFIG"):
    logging.config.dictConfig({"version": 1, "disable_existing_loggers": True})

if API == "task":

    @app.task(base=LockedTask, lock_limit=LIMIT, **OPTIONS)
    def limited(key: str) -> Any:
        return key

elif API == "plain":  # lock options without LockedTask: nothing would read them

    @app.task(**OPTIONS)
    def limited(key: str) -> Any:
        return key

elif API == "mixed":  # task options over @single_instance, which reads only its keywords

    @app.task(**OPTIONS)
    @single_instance(limit=LIMIT)
    def limited(key: str) -> Any:
        return key

elif API == "both":

    @app.task(base=LockedTask)
    @single_instance(limit=LIMIT)
    def limited(key: str) -> Any:
        return key

else:

    @app.task
    @single_instance(limit=LIMIT, **{k.removeprefix("lock_"): v for k, v in OPTIONS.items()})
    def limited(key: str) -> Any:
        return key
