"""The URLconf of the Django mount test: the dashboard under the admin."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.urls import include, path

from celery_redlock.web import django_urls

#: The Celery app the test sets before its first request.
CELERY_APP: list[Any] = [None]


class _Later:
    """Resolves ``CELERY_APP[0]`` on each use: the URLconf is imported once per process."""

    def __getattr__(self, name: str) -> Any:
        return getattr(CELERY_APP[0], name)

    def _get_current_object(self) -> Any:
        """The app this stands for now, as ``celery.local.Proxy`` (``current_app``) says."""
        return CELERY_APP[0]


urlpatterns = [
    path("admin/locks/", include(django_urls(_Later(), actions=True, ping_timeout=0.3))),
    path("admin/", admin.site.urls),
]
