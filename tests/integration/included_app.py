"""An app whose tasks live in another module, loaded through ``include`` (the usual layout,
and Django's ``autodiscover_tasks()``): see ``test_cli_listing.py``."""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator

from celery import Celery

app = Celery("included", set_as_current=False, include=["tests.integration.included_tasks"])

MODULES = ("tests.integration.included_app", "tests.integration.included_tasks")


@contextlib.contextmanager
def fresh_app(redlock_url: str) -> Iterator[Celery]:
    """A fresh copy of :data:`app` whose task module is not imported yet, as in a fresh
    ``celery -A`` process (also on a second run in one process)."""
    for name in MODULES:
        sys.modules.pop(name, None)
    fresh: Celery = importlib.import_module(MODULES[0]).app
    fresh.conf.redlock_url = redlock_url
    assert "included.sync" not in fresh.tasks
    try:
        yield fresh
    finally:
        fresh.close()
        for name in MODULES:
            sys.modules.pop(name, None)
