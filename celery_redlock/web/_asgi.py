"""The dashboard as an ASGI app (Starlette): served by ``celery redlock web``, or mounted.

Routes (relative to where it is mounted): ``GET /`` the locks, ``GET /stats`` the counters,
``GET /timeline`` the timeline, ``POST /action/<name>`` an action, ``GET``/``POST /login``
the token form (standalone). No GET changes anything.

Every request passes :func:`_who`: with ``authenticate`` (a mount: the host app decides, from
its own session or user, and returns a name or ``None``), else the environment's credentials
(:class:`~celery_redlock.web._security.Credentials`); with neither, the page is open and
read-only, and answers requests from a loopback address to a loopback host only
(``localhost``, ``127.0.0.1``, ``[::1]``), as the command line serves it on loopback only,
unless ``allowed_hosts`` names others. Timeline it closes: (1) ``create_app(app)`` is
mounted in a public FastAPI site for a quick look; (2) the site has a login, which a mounted
app does not inherit; (3) anyone on the internet reads the lock list (task ids, hosts,
pids). Every POST then needs our CSRF token and no foreign ``Origin``, also when mounted: the
ASGI frameworks (FastAPI, Starlette) have no CSRF protection of their own to inherit.
"""

from __future__ import annotations

import inspect
import ipaddress
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from .._celery.identity import import_task_modules
from ._core import Dashboard
from ._security import (
    CSRF_COOKIE,
    LOOPBACK_NAMES,
    PAGE_HEADERS,
    SESSION_COOKIE,
    Credentials,
    Guard,
    origin_ok,
)

__all__ = ["create_app"]

CSRF_FIELD = "csrf_token"

#: What ``authenticate`` may be: a function or a coroutine function of the request.
Authenticate = Callable[[Request], "str | Awaitable[str | None] | None"]


def _from_network(request: Request) -> bool:
    """Whether ``request`` may come from another machine: its peer is no loopback IP address.
    A peer that is none (a Unix socket: nginx in front passes ``Host: localhost`` by default)
    or no address (a test client's name) may be anyone."""
    peer = request.client.host if request.client is not None else ""
    try:
        address = ipaddress.ip_address(peer)
    except ValueError:
        return True
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return not (address.is_loopback or (mapped is not None and mapped.is_loopback))


async def _name_of(authenticate: Authenticate, request: Request) -> str | None:
    """Who ``authenticate`` says is asking: a non-empty ``str``, or ``None`` (refused).

    ``""`` is a refusal too (an empty header). Anything else raises :class:`TypeError` (the
    request fails with a 500): a user object
    would otherwise let everyone in. Timeline: (1) ``authenticate=lambda r: r.user`` under
    Starlette's ``AuthenticationMiddleware``; (2) an anonymous visitor's ``request.user`` is an
    ``UnauthenticatedUser``, which is not ``None``; (3) taken for a name, it may release locks.
    """
    name = authenticate(request)
    if inspect.isawaitable(name):
        name = await name
    if name is None or name == "":  # an empty header or field: nobody
        return None
    if isinstance(name, str):
        return name
    raise TypeError(
        f"the dashboard's authenticate= returned {type(name).__name__} {name!r}: it must return "
        "the user's name (a non-empty str) or None to refuse, e.g. "
        "`lambda request: request.user.display_name if request.user.is_authenticated else None`"
    )


def host_of(header: str) -> str:
    """The host of a ``Host`` header, without its port or an IPv6 address's brackets."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if ":" in header else header


#: The most fields a form of the dashboard posts (it posts no file: a file part is refused
#: with a 400 as soon as it starts, so a large upload is never read, nor spooled to disk).
FORM_FIELDS = 16


def create_app(
    app: Any,
    *,
    actions: bool = False,
    authenticate: Authenticate | None = None,
    credentials: Credentials | None = None,
    ping_timeout: float = 1.0,
    allowed_hosts: Collection[str] | None = None,
) -> Starlette:
    """The dashboard of the Celery ``app`` as an ASGI app.

    :param actions: allow the actions (read-only by default).
    :param authenticate: for a mount: ``authenticate(request)`` returns who is asking (a user
        name, logged and sent with each action) or ``None`` to refuse the request; it may be a
        coroutine function. ``""`` refuses too; any other value (a user object, ``False``) fails
        the request with a :class:`TypeError` naming the fix. Without it, ``credentials``
        (default: from the environment) are checked; with it, they are not read.
    :param allowed_hosts: the host names (no port) a request's ``Host`` header may give
        (``None``: any, with ``authenticate`` or credentials; else the loopback names only).
        ``celery redlock web`` on a loopback address allows the loopback names only. Timeline
        it closes (DNS rebinding): (1) a page on ``evil.example`` is open in a browser on the
        dashboard's machine; (2) ``evil.example`` is made to resolve to 127.0.0.1; (3) the
        page reads ``http://evil.example:8000/``, same-origin for the browser: an open
        read-only dashboard would hand it the lock list; its ``Host`` header is refused.
    :raises ValueError: when actions are enabled with neither ``authenticate`` nor
        credentials (anyone who reaches the port could release locks).

    It imports the app's task modules first, as a worker does (once per app:
    :func:`~celery_redlock._celery.identity.import_task_modules`), so that the task filter
    knows a task of a module in ``include`` by its ``lock_name``.
    """
    if credentials is not None:
        creds = credentials
    else:  # the environment's are the standalone dashboard's: a mount's login is its own
        creds = Credentials() if authenticate is not None else Credentials.from_env()
    # No login, no hosts named: loopback only (see the module doc).
    local_only = allowed_hosts is None and authenticate is None and not creds.configured
    if local_only:
        allowed_hosts = LOOPBACK_NAMES
    hosts = None if allowed_hosts is None else {h.lower().strip("[]") for h in allowed_hosts}
    if actions and authenticate is None and not creds.configured:
        raise ValueError(
            "actions=True needs authenticate= or credentials in the environment "
            "(REDLOCK_WEB_TOKEN, or REDLOCK_WEB_USER and REDLOCK_WEB_PASSWORD)"
        )
    import_task_modules(app)
    board = Dashboard(app, actions=actions, ping_timeout=ping_timeout)
    guard = Guard(creds)

    def foreign(request: Request) -> Response | None:
        """A 400 for a ``Host`` header outside ``allowed_hosts``; without a login, a 403 for
        a request from another machine too. The ``Host`` check alone stops a browser (DNS
        rebinding), not a client that sends ``Host: localhost`` from the network: (1) a site
        on a public address mounts ``create_app(app)`` with no login; (2) ``curl -H 'Host:
        localhost' http://site/locks/`` read every row."""
        remote = local_only and _from_network(request)
        if not remote and (hosts is None or host_of(request.headers.get("host", "")) in hosts):
            return None
        if local_only:
            return PlainTextResponse(
                "refused: this dashboard has no login (pass authenticate= to create_app, or set "
                "REDLOCK_WEB_TOKEN), so it answers requests from this machine to localhost only "
                "(allowed_hosts= names other hosts, from any machine)",
                status_code=403,
            )
        return PlainTextResponse("refused: unknown Host header", status_code=400)

    async def who(request: Request) -> str | None:
        if authenticate is not None:
            return await _name_of(authenticate, request)
        if not creds.configured:
            return "anonymous"
        session = request.cookies.get(SESSION_COOKIE)
        return guard.actor(request.headers.get("authorization"), session)

    def base(request: Request) -> str:
        return str(request.scope.get("root_path", "")).rstrip("/")

    def csrf_cookie(request: Request) -> str:
        return request.cookies.get(CSRF_COOKIE) or guard.new_csrf_cookie()

    def page(request: Request, status: int, body: str, cookie: str) -> Response:
        response = HTMLResponse(body, status_code=status, headers=PAGE_HEADERS)
        response.set_cookie(
            CSRF_COOKIE,
            cookie,
            httponly=True,
            samesite="strict",
            path=base(request) or "/",
            secure=request.url.scheme == "https",
        )
        return response

    def unauthenticated(request: Request) -> Response:
        if authenticate is None and creds.token is not None:
            return RedirectResponse(f"{base(request)}/login", status_code=303)
        headers = {"WWW-Authenticate": 'Basic realm="celery-redlock"'} if creds.user else {}
        return PlainTextResponse("authentication required", status_code=401, headers=headers)

    async def view(request: Request, tab: str) -> Response:
        refused = foreign(request)
        if refused is not None:
            return refused
        if await who(request) is None:
            return unauthenticated(request)
        cookie = csrf_cookie(request)
        form = {CSRF_FIELD: guard.csrf_token(cookie)}
        query = dict(request.query_params)
        if tab == "stats":
            status, body = await run_in_threadpool(board.stats_page, form, base(request))
            return page(request, status, body, cookie)
        if tab == "timeline":
            status, body = await run_in_threadpool(board.timeline_page, query, form, base(request))
            return page(request, status, body, cookie)
        status, body = await run_in_threadpool(board.locks_page, query, form, base(request))
        return page(request, status, body, cookie)

    def refuse_cross(request: Request) -> Response | None:
        """A POST's checks that need no body: the ``Host``, then the ``Origin``."""
        refused = foreign(request)
        if refused is not None:
            return refused
        own = f"{request.url.scheme}://{request.url.netloc}"
        if not origin_ok(request.headers.get("origin"), request.headers.get("sec-fetch-site"), own):
            return PlainTextResponse("refused: cross-origin request", status_code=403)
        return None

    def refuse_csrf(request: Request, data: Any) -> Response | None:
        if not guard.csrf_ok(request.cookies.get(CSRF_COOKIE), data.get(CSRF_FIELD)):
            return PlainTextResponse("refused: missing or wrong CSRF token", status_code=403)
        return None

    async def action(request: Request) -> Response:
        # Who asks is known from the headers: a body (a 200 MB upload) is read only for a
        # signed-in user.
        refused = refuse_cross(request)
        if refused is not None:
            return refused
        actor = await who(request)
        if actor is None:
            return unauthenticated(request)
        data = await request.form(max_files=0, max_fields=FORM_FIELDS)
        refused = refuse_csrf(request, data)
        if refused is not None:
            return refused
        fields = {k: str(v) for k, v in data.items() if isinstance(v, str)}
        name = request.path_params["name"]
        result = await run_in_threadpool(board.act, name, fields, actor)
        cookie = csrf_cookie(request)
        body = board.render(
            "result.html",
            status=result.status,
            message=result.message,
            form={CSRF_FIELD: guard.csrf_token(cookie)},
            base=base(request),
        )
        return page(request, result.status, body, cookie)

    async def login(request: Request) -> Response:
        refused = foreign(request)
        if refused is not None:
            return refused
        cookie = csrf_cookie(request)
        form = {CSRF_FIELD: guard.csrf_token(cookie)}
        error = None
        if request.method == "POST":
            refused = refuse_cross(request)
            if refused is not None:
                return refused
            data = await request.form(max_files=0, max_fields=FORM_FIELDS)
            refused = refuse_csrf(request, data)
            if refused is not None:
                return refused
            session = guard.login(str(data.get("token", "")))
            if session is not None:
                response = RedirectResponse(f"{base(request)}/", status_code=303)
                response.set_cookie(
                    SESSION_COOKIE,
                    session,
                    httponly=True,
                    samesite="strict",
                    path=base(request) or "/",
                    max_age=int(guard.lifetime),
                    secure=request.url.scheme == "https",
                )
                return response
            error = "wrong token"
        body = board.render("login.html", form=form, base=base(request), error=error)
        return page(request, 401 if error else 200, body, cookie)

    async def logout(request: Request) -> Response:
        """End this browser's session: its cookie is deleted. (The session is signed, not
        stored: a copy of the cookie taken elsewhere lasts its lifetime, or until the token
        is rotated.)"""
        refused = refuse_cross(request)
        if refused is not None:
            return refused
        response = RedirectResponse(f"{base(request)}/login", status_code=303)
        if await who(request) is None:  # no session to end: its body is not read
            return response
        data = await request.form(max_files=0, max_fields=FORM_FIELDS)
        refused = refuse_csrf(request, data)
        if refused is not None:
            return refused
        response.delete_cookie(
            SESSION_COOKIE,
            path=base(request) or "/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    async def locks(request: Request) -> Response:
        return await view(request, "locks")

    async def stats(request: Request) -> Response:
        return await view(request, "stats")

    async def timeline(request: Request) -> Response:
        return await view(request, "timeline")

    routes = [
        Route("/", locks, methods=["GET"]),
        Route("/stats", stats, methods=["GET"]),
        Route("/timeline", timeline, methods=["GET"]),
        Route("/action/{name:str}", action, methods=["POST"]),
    ]
    if authenticate is None and creds.token is not None:
        routes.insert(0, Route("/login", login, methods=["GET", "POST"]))
        routes.insert(1, Route("/logout", logout, methods=["POST"]))
        board.logout = True
    return Starlette(routes=routes)
