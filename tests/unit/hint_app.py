"""A Celery app for ``-A`` in the command-line hint tests (Celery 5.3 loads it as it parses)."""

from __future__ import annotations

from celery import Celery

app = Celery("hint", set_as_current=False)
