"""An app whose tasks live in another module, loaded through ``include`` (the usual layout,
and Django's ``autodiscover_tasks()``): see ``test_cli_listing.py``."""

from __future__ import annotations

from celery import Celery

app = Celery("included", set_as_current=False, include=["tests.integration.included_tasks"])
