"""The dashboard mounted in a host app: FastAPI (ASGI, served by a real uvicorn), Flask (WSGI,
through a2wsgi) and the Django admin (Django's test client with CSRF checks on). The host app's
login decides who may look and act; the actor is logged and sent with
:data:`lock_admin_action`."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import Any

import anyio.from_thread
import httpx
import pytest
import redis as redis_py

from celery_redlock._redis.keys import keys_for
from celery_redlock._redis.owner import new_token
from celery_redlock.testing import RedisServer
from celery_redlock.web._core import Dashboard
from celery_redlock.web._security import PAGE_HEADERS
from support.apps import layout_app
from support.servers import dead_port
from support.web import admin_actions, served
from tests.integration.included_app import fresh_app


@pytest.fixture
def held(redis_url: str, r: redis_py.Redis) -> str:
    key = keys_for("redlock", "mounted:job").lock
    r.set(key, new_token("id-1", "w9@gone", 7), px=60_000)
    return key


@pytest.fixture
def celery_app(redis_url: str, redis_server: RedisServer) -> Any:
    return layout_app("mounted", f"redis://127.0.0.1:{redis_server.port}", set_as_current=False)


@pytest.fixture
def actions() -> Iterator[list[dict[str, Any]]]:
    with admin_actions() as seen:
        yield seen


def fields(html: str) -> dict[str, str]:
    return dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', html))


class HostUser:
    """The host app's login, as an ASGI middleware: a user from its own header."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            scope["host_user"] = headers.get(b"x-host-user", b"").decode() or None
        await self.app(scope, receive, send)


def test_mounted_in_fastapi(
    celery_app: Any, held: str, r: redis_py.Redis, actions: list[dict[str, Any]], caplog: Any
) -> None:
    from fastapi import FastAPI

    from celery_redlock.web import create_app

    host = FastAPI()
    host.add_middleware(HostUser)
    host.mount(
        "/locks",
        create_app(
            celery_app,
            actions=True,
            authenticate=lambda req: req.scope.get("host_user"),
            ping_timeout=0.3,
        ),
    )
    with served(host) as base:
        assert httpx.get(f"{base}/locks/").status_code == 401  # the host app's login decides
        with httpx.Client(base_url=base, headers={"x-host-user": "alice"}) as alice:
            page = alice.get("/locks/")
            assert page.status_code == 200 and held in page.text
            assert 'action="/locks/action/release"' in page.text  # links under the mount
            form = fields(page.text)
            no_token = {k: v for k, v in form.items() if k != "csrf_token"}
            assert alice.post("/locks/action/release", data=no_token).status_code == 403
            foreign = alice.post(
                "/locks/action/release", data=form, headers={"Origin": "http://evil.example"}
            )
            assert foreign.status_code == 403 and r.exists(held)
            with caplog.at_level(logging.INFO, logger="celery_redlock.web"):
                done = alice.post("/locks/action/release", data=form)
            assert done.status_code == 200 and not r.exists(held), done.text
    assert f"dashboard: release {held} by alice: released {held} (holder dead)" in caplog.text
    assert actions[-1] == {
        "action": "release",
        "key": held,
        "actor": "alice",
        "outcome": f"released {held} (holder dead)",
        "forced": False,
    }


def test_authenticate_may_be_async_and_must_return_a_name(
    celery_app: Any, held: str, r: redis_py.Redis, actions: list[dict[str, Any]]
) -> None:
    """Under Starlette's ``AuthenticationMiddleware`` an anonymous ``request.user`` is an
    object, not ``None``: returned as is, it let every visitor in (and release locks). A value
    that is not a name fails the request; an ``async def`` is awaited (its coroutine, never
    ``None``, let everyone in too)."""
    from fastapi import FastAPI
    from starlette.authentication import AuthCredentials, AuthenticationBackend, SimpleUser
    from starlette.middleware.authentication import AuthenticationMiddleware

    from celery_redlock.web import create_app

    class Header(AuthenticationBackend):
        async def authenticate(self, conn: Any) -> Any:
            name = conn.headers.get("x-user")
            return None if name is None else (AuthCredentials(["authenticated"]), SimpleUser(name))

    async def by_name(request: Any) -> str | None:
        return request.user.display_name if request.user.is_authenticated else None

    host = FastAPI()
    host.add_middleware(AuthenticationMiddleware, backend=Header())
    board = {"actions": True, "ping_timeout": 0.3}
    host.mount("/objects", create_app(celery_app, authenticate=lambda req: req.user, **board))
    host.mount("/named", create_app(celery_app, authenticate=by_name, **board))
    with served(host) as base:
        for user in ({}, {"x-user": "alice"}):
            assert httpx.get(f"{base}/objects/", headers=user).status_code == 500
        assert httpx.get(f"{base}/named/").status_code == 401
        with httpx.Client(base_url=base, headers={"x-user": "alice"}) as alice:
            page = alice.get("/named/")
            assert page.status_code == 200 and held in page.text
            done = alice.post("/named/action/release", data=fields(page.text))
            assert done.status_code == 200 and not r.exists(held), done.text
    assert actions[-1]["actor"] == "alice"


def test_mounted_in_flask(
    celery_app: Any, held: str, r: redis_py.Redis, actions: list[dict[str, Any]]
) -> None:
    from a2wsgi import ASGIMiddleware
    from flask import Flask
    from werkzeug.middleware.dispatcher import DispatcherMiddleware

    from celery_redlock.web import create_app

    host = Flask("host")
    board = create_app(
        celery_app,
        actions=True,
        authenticate=lambda request: request.headers.get("x-host-user"),
        ping_timeout=0.3,
    )
    host.wsgi_app = DispatcherMiddleware(host.wsgi_app, {"/locks": ASGIMiddleware(board)})
    client = host.test_client()
    assert client.get("/locks/").status_code == 401
    page = client.get("/locks/", headers={"x-host-user": "dora"})
    assert page.status_code == 200 and held in page.text
    assert 'action="/locks/action/release"' in page.text
    form = {**fields(page.text), "key": held}
    refused = client.post(
        "/locks/action/release", data={"key": held}, headers={"x-host-user": "dora"}
    )
    assert refused.status_code == 403 and r.exists(held)
    done = client.post("/locks/action/release", data=form, headers={"x-host-user": "dora"})
    assert done.status_code == 200 and not r.exists(held), done.text
    assert actions[-1]["actor"] == "dora"


def test_without_a_login_a_mount_answers_localhost_only(celery_app: Any, held: str) -> None:
    """``create_app(app)`` with neither ``authenticate`` nor credentials, mounted in a public
    site: it served the lock list to any ``Host``. It answers loopback names only, as the
    command serves it on loopback only, and says how to open it up; ``allowed_hosts`` names
    others."""
    from fastapi import FastAPI

    from celery_redlock.web import create_app
    from celery_redlock.web._security import Credentials

    site = FastAPI()
    site.mount("/locks", create_app(celery_app, credentials=Credentials()))
    site.mount(
        "/internal",
        create_app(celery_app, credentials=Credentials(), allowed_hosts=["ops.internal"]),
    )
    with served(site) as base:
        public = httpx.get(f"{base}/locks/", headers={"Host": "public.example.com"})
        assert public.status_code == 403 and held not in public.text
        assert "pass authenticate= to create_app, or set REDLOCK_WEB_TOKEN" in public.text
        assert "allowed_hosts= names other hosts" in public.text
        local = httpx.get(f"{base}/locks/")  # Host: 127.0.0.1:<port>
        assert local.status_code == 200 and held in local.text
        named = httpx.get(f"{base}/internal/", headers={"Host": "ops.internal"})
        assert named.status_code == 200 and held in named.text


def test_without_a_login_a_mount_refuses_a_network_client_naming_localhost(
    celery_app: Any, held: str
) -> None:
    """The ``Host`` check stops a browser, not a client that sends ``Host: localhost`` from
    the network: it read every row of a mount without a login on a public address. The peer
    must be this machine too (here the ASGI scope's ``client``, as uvicorn fills it in)."""
    from fastapi import FastAPI

    from celery_redlock.web import create_app
    from celery_redlock.web._security import Credentials

    site = FastAPI()
    site.mount("/locks", create_app(celery_app, credentials=Credentials()))
    site.mount(
        "/internal",
        create_app(celery_app, credentials=Credentials(), allowed_hosts=["ops.internal"]),
    )

    def get(peer: str, path: str, host: str) -> httpx.Response:
        transport = httpx.ASGITransport(app=site, client=(peer, 41000))
        with anyio.from_thread.start_blocking_portal() as portal:

            async def fetch() -> httpx.Response:
                async with httpx.AsyncClient(transport=transport, base_url="http://x") as c:
                    return await c.get(path, headers={"Host": host})

            return portal.call(fetch)

    for peer in ("192.0.2.7", "testclient"):  # no address: a Unix socket's peer may be anyone
        remote = get(peer, "/locks/", "localhost")
        assert remote.status_code == 403 and held not in remote.text
        assert "answers requests from this machine to localhost only" in remote.text
    for peer in ("127.0.0.1", "::1", "::ffff:127.0.0.1"):
        local = get(peer, "/locks/", "localhost")
        assert local.status_code == 200 and held in local.text
    named = get("192.0.2.7", "/internal/", "ops.internal")  # allowed_hosts: any machine
    assert named.status_code == 200 and held in named.text


def test_an_empty_name_is_a_refusal_and_cookies_are_secure_over_https(
    celery_app: Any, held: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ``authenticate`` that reads an empty header returned ``""``: a 500. It is a 401 now.
    Over HTTPS (here a TLS proxy on loopback that says so, which uvicorn trusts by default)
    the cookies carry ``Secure``."""
    from celery_redlock.web import create_app
    from celery_redlock.web._security import PASSWORD_ENV, USER_ENV

    # The environment's credentials are the standalone dashboard's: a mount with its own login
    # does not read them (a short password there refused the mount at start).
    monkeypatch.setenv(USER_ENV, "ops")
    monkeypatch.setenv(PASSWORD_ENV, "short")
    board = create_app(celery_app, authenticate=lambda request: request.headers.get("x-user"))
    with served(board) as base:
        assert httpx.get(f"{base}/", headers={"x-user": ""}).status_code == 401
        tls = httpx.get(f"{base}/", headers={"x-user": "erin", "x-forwarded-proto": "https"})
        assert tls.status_code == 200 and held in tls.text
        assert "secure" in tls.headers["set-cookie"].lower()
        plain = httpx.get(f"{base}/", headers={"x-user": "erin"})
        assert "secure" not in plain.headers["set-cookie"].lower()


def test_actions_without_any_login_are_refused_at_build(celery_app: Any) -> None:
    from celery_redlock.web import create_app
    from celery_redlock.web._security import Credentials

    with pytest.raises(ValueError, match="REDLOCK_WEB_TOKEN"):
        create_app(celery_app, actions=True, credentials=Credentials())


@pytest.fixture(scope="module")
def django_setup() -> None:
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            DEBUG=False,
            SECRET_KEY="test-only-" + "x" * 40,
            ALLOWED_HOSTS=["testserver"],
            ROOT_URLCONF="tests.integration.web_django_urls",
            INSTALLED_APPS=[
                "django.contrib.admin",
                "django.contrib.auth",
                "django.contrib.contenttypes",
                "django.contrib.sessions",
                "django.contrib.messages",
            ],
            MIDDLEWARE=[
                "django.contrib.sessions.middleware.SessionMiddleware",
                "django.middleware.csrf.CsrfViewMiddleware",
                "django.contrib.auth.middleware.AuthenticationMiddleware",
                "django.contrib.messages.middleware.MessageMiddleware",
            ],
            DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
            TEMPLATES=[
                {
                    "BACKEND": "django.template.backends.django.DjangoTemplates",
                    "APP_DIRS": True,
                    "OPTIONS": {
                        "context_processors": [
                            "django.contrib.auth.context_processors.auth",
                            "django.contrib.messages.context_processors.messages",
                            "django.template.context_processors.request",
                        ]
                    },
                }
            ],
            USE_TZ=True,
        )
        django.setup()
        from django.core.management import call_command

        call_command("migrate", run_syncdb=True, verbosity=0)


def test_mounted_in_the_django_admin(
    django_setup: None,
    celery_app: Any,
    held: str,
    r: redis_py.Redis,
    actions: list[dict[str, Any]],
) -> None:
    from django.contrib.auth.models import User
    from django.test import Client

    from tests.integration import web_django_urls

    web_django_urls.CELERY_APP[0] = celery_app
    anonymous = Client(enforce_csrf_checks=True)
    assert anonymous.get("/admin/locks/").status_code == 302  # to the admin's login

    staff = User.objects.create_user("bob", password="pw-bob", is_staff=True)
    root = User.objects.create_user("carol", password="pw-carol", is_staff=True, is_superuser=True)
    bob = Client(enforce_csrf_checks=True)
    bob.force_login(staff)
    page = bob.get("/admin/locks/")
    assert page.status_code == 200 and held in page.content.decode()
    # As the ASGI app's pages: HEAD answered (it was 405), the same CSP and cache headers.
    head = bob.head("/admin/locks/")
    assert head.status_code == 200 and head.content == b""
    for name, value in PAGE_HEADERS.items():  # the admin adds to Cache-Control (never_cache)
        assert page[name] == value or value in page[name].split(", ")
    # A staff user who may not act sees the page read-only: the Release buttons it showed
    # could only be answered 403.
    shown = page.content.decode()
    assert "Release" not in shown and "read-only" in shown, shown
    for tab in ("stats", "timeline"):
        assert "read-only" in bob.get(f"/admin/locks/{tab}").content.decode()
    token = re.search(r'content="csrfmiddlewaretoken" data-value="([^"]+)"', shown)
    assert token is not None, shown
    form = {"csrfmiddlewaretoken": token.group(1), "key": held}
    refused = bob.post("/admin/locks/action/release", form)
    assert refused.status_code == 403 and b"may not act" in refused.content  # not a superuser

    carol = Client(enforce_csrf_checks=True)
    carol.force_login(root)
    shown = carol.get("/admin/locks/").content.decode()
    assert "Release" in shown and "actions enabled" in shown
    form = fields(shown)
    no_token = {k: v for k, v in form.items() if k != "csrfmiddlewaretoken"}
    assert carol.post("/admin/locks/action/release", no_token).status_code == 403  # Django CSRF
    assert r.exists(held)
    done = carol.post("/admin/locks/action/release", form)
    assert done.status_code == 200 and not r.exists(held), done.content
    assert actions[-1]["actor"] == "carol" and actions[-1]["action"] == "release"
    User.objects.all().delete()


def test_a_user_who_may_not_act_sees_every_page_read_only(redis_server: RedisServer) -> None:
    """The stats page's error pages (the lock Redis down) said "actions enabled" to a user
    of a mount who may not act."""
    app = layout_app("down", redis_server.url.rsplit("/", 1)[0], set_as_current=False)
    app.conf.redlock_url = f"redis://127.0.0.1:{dead_port()}/0"
    board = Dashboard(app, actions=True, ping_timeout=0.2)
    status, body = board.stats_page({"csrf_token": "x"}, may_act=False)
    assert status == 503 and "read-only" in body and "actions enabled" not in body
    status, body = board.stats_page({"csrf_token": "x"})
    assert status == 503 and "actions enabled" in body
    app.close()


def test_the_django_mount_imports_the_task_modules_as_the_command_line_does(
    django_setup: None, redis_url: str
) -> None:
    """Probe, round 23: the Django mount never imported the app's task modules (Django's
    ``autodiscover_tasks()`` is lazy), so its task filter listed no task, and a lock whose task
    renews it was judged "unknown" where ``celery redlock inspect`` said "alive"."""
    from django.contrib.auth.models import User
    from django.test import Client

    from tests.integration import web_django_urls

    with fresh_app(redis_url) as app:
        web_django_urls.CELERY_APP[0] = app
        root = User.objects.create_user("dave", password="pw", is_staff=True, is_superuser=True)
        client = Client()
        client.force_login(root)
        try:
            page = client.get("/admin/locks/")
        finally:
            User.objects.all().delete()
        assert page.status_code == 200
        assert '<option value="included.sync">' in page.content.decode()
