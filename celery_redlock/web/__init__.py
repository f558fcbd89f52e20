"""A dashboard of an app's locks, in a browser: ``celery -A proj redlock web``, or mounted.

Needs the ``web`` extra (``pip install "celery-redlock[web]"``: Starlette, Jinja2, uvicorn).
Importing this package imports none of them: each entry point loads its libraries on first
use, so ``celery redlock ls`` and ``import celery_redlock`` never do.

* :func:`create_app`: the dashboard as an ASGI app, for ``app.mount("/locks", ...)`` in
  FastAPI or Starlette (what ``celery redlock web`` serves);
* :func:`django_urls`: the dashboard as Django admin views, to ``include()`` in ``urls.py``;
* :class:`Credentials` and ``Authenticate``: the types of ``create_app``'s ``credentials`` and
  ``authenticate``.

docs/operations.md shows the page and documents the mounts, the authentication, read-only
mode and the actions.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._asgi import Authenticate, create_app
    from ._django import django_urls
    from ._security import Credentials

__all__ = ["Authenticate", "Credentials", "create_app", "django_urls"]

_LAZY = {
    "Authenticate": "._asgi",
    "Credentials": "._security",
    "create_app": "._asgi",
    "django_urls": "._django",
}

#: What a missing library of the dashboard is reported as (followed by the import's error).
NEEDS_EXTRA = 'the dashboard needs the web extra: pip install "celery-redlock[web]"'


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'celery_redlock.web' has no attribute {name!r}")
    try:
        loaded = importlib.import_module(module, __name__)
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] == "django":  # the project's, not the extra's
            raise ModuleNotFoundError(
                f"django_urls mounts the dashboard in a Django project, and Django is not "
                f"installed here ({exc})",
                name=exc.name,
            ) from exc
        raise ModuleNotFoundError(f"{NEEDS_EXTRA} ({exc})", name=exc.name) from exc
    return getattr(loaded, name)


def __dir__() -> list[str]:
    """The module's names with each lazy one whose libraries are installed (tab completion):
    ``inspect.getmembers`` and ``help()`` get every name listed, where one that raised
    :class:`ModuleNotFoundError` (``django_urls`` without Django, which the extra does not
    bring) made them fail."""
    names = set(globals())
    for name, module in _LAZY.items():
        try:
            importlib.import_module(module, __name__)
        except ImportError:
            continue
        names.add(name)
    return sorted(names)
