"""A dashboard of an app's locks, in a browser: ``celery -A proj redlock web``, or mounted.

Needs the ``web`` extra (``pip install "celery-redlock[web]"``: Starlette, Jinja2, uvicorn).
Importing this package imports none of them: each entry point loads its libraries on first
use, so ``celery redlock ls`` and ``import celery_redlock`` never do.

* :func:`create_app`: the dashboard as an ASGI app, for ``app.mount("/locks", ...)`` in
  FastAPI or Starlette (what ``celery redlock web`` serves);
* :func:`django_urls`: the dashboard as Django admin views, to ``include()`` in ``urls.py``.

docs/operations.md shows the page and documents the mounts, the authentication, read-only
mode and the actions.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._asgi import create_app
    from ._django import django_urls

__all__ = ["create_app", "django_urls"]

_LAZY = {"create_app": "._asgi", "django_urls": "._django"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'celery_redlock.web' has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
