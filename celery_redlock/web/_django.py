"""The dashboard as Django admin views: the admin's login, permissions and CSRF protection.

::

    # urls.py
    from django.contrib import admin
    from django.urls import include, path
    from celery_redlock.web import django_urls
    from proj.celery import app as celery_app

    urlpatterns = [
        path("admin/locks/", include(django_urls(celery_app, actions=True))),
        path("admin/", admin.site.urls),
    ]

Each view is wrapped in ``admin.site.admin_view``: an anonymous or non-staff user is sent to
the admin's login page, and POSTs pass Django's CSRF middleware (its token, its ``Origin``
check). An action also needs ``request.user.is_superuser`` (or the ``can_act`` you pass):
a user who may not act sees the pages read-only, without the buttons; the actor logged and
sent with the signal is the Django user name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.middleware.csrf import get_token
from django.urls import URLPattern, path
from django.views.decorators.http import require_POST, require_safe

from .._celery.identity import import_task_modules
from ._core import Dashboard
from ._security import PAGE_HEADERS

__all__ = ["django_urls"]


def _page(body: str, status: int) -> HttpResponse:
    """A page with the ASGI app's headers (no script, no frame, no cache)."""
    return HttpResponse(body, status=status, headers=PAGE_HEADERS)


def _superuser(request: HttpRequest) -> bool:
    return bool(getattr(request.user, "is_superuser", False))


def django_urls(
    app: Any,
    *,
    actions: bool = False,
    site: admin.AdminSite | None = None,
    can_act: Callable[[HttpRequest], bool] = _superuser,
    ping_timeout: float = 1.0,
) -> list[URLPattern]:
    """URL patterns of the dashboard of the Celery ``app``, to ``include()`` under a path."""
    board = Dashboard(app, actions=actions, ping_timeout=ping_timeout)
    admin_site = site or admin.site

    def base(request: HttpRequest, suffix: str) -> str:
        return str(request.path[: len(request.path) - len(suffix)]).rstrip("/")

    def form(request: HttpRequest) -> dict[str, str]:
        return {"csrfmiddlewaretoken": get_token(request)}

    def page(request: HttpRequest, suffix: str) -> dict[str, Any]:
        """What every page takes: the CSRF field, the mount path, whether this user may act.
        The first one imports the app's task modules, as ``create_app`` does at start (here
        Django is not ready when the URLconf is built); every later one finds them done."""
        import_task_modules(app, set_up=True)
        return {
            "form": form(request),
            "base": base(request, suffix),
            "may_act": actions and can_act(request),
        }

    @require_safe
    def locks(request: HttpRequest) -> HttpResponse:
        status, body = board.locks_page(request.GET.dict(), **page(request, ""))
        return _page(body, status)

    @require_safe
    def stats(request: HttpRequest) -> HttpResponse:
        status, body = board.stats_page(**page(request, "stats"))
        return _page(body, status)

    @require_safe
    def timeline(request: HttpRequest) -> HttpResponse:
        status, body = board.timeline_page(request.GET.dict(), **page(request, "timeline"))
        return _page(body, status)

    @require_POST
    def action(request: HttpRequest, name: str) -> HttpResponse:
        if not can_act(request):
            return HttpResponse("refused: this user may not act on locks", status=403)
        actor = request.user.get_username() if request.user.is_authenticated else "anonymous"
        result = board.act(name, request.POST.dict(), actor)
        body = board.render(
            "result.html",
            status=result.status,
            message=result.message,
            form=form(request),
            base=base(request, f"action/{name}"),
        )
        return _page(body, result.status)

    wrap = admin_site.admin_view
    return [
        path("", wrap(locks), name="redlock-locks"),
        path("stats", wrap(stats), name="redlock-stats"),
        path("timeline", wrap(timeline), name="redlock-timeline"),
        path("action/<str:name>", wrap(action), name="redlock-action"),
    ]
