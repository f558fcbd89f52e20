"""The dashboard over real HTTP (uvicorn in a thread, httpx) against a real redis-server: what
an action acts on, who a session cookie still lets in, what the audit log and the
``lock_admin_action`` signal receive from a hostile post, and what a page says when Redis is
down or the app's lock options are invalid.

Dead holders are tokens of a worker that does not exist (``w9@gone``): no worker answers
their ping, and their TTL (9 s of a 30 s lease) says they were not renewed lately.
"""

from __future__ import annotations

import html
import logging
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis as redis_py
from celery import Celery

from celery_redlock import LockedTask
from celery_redlock._redis.keys import keys_for
from celery_redlock._redis.owner import new_token
from celery_redlock.testing import RedisServer
from celery_redlock.web import create_app
from celery_redlock.web._security import SECRET_ENV, SESSION_COOKIE, SESSION_LIFETIME, Credentials
from support.apps import layout_app, make_app
from support.servers import dead_port
from support.web import admin_actions, served
from tests.e2e.web.tooling import TOKEN

BEARER = {"Authorization": f"Bearer {TOKEN}"}
TASK = "proj.hold"
LONG = "redlock:{" + "k" * 990 + "}"
#: A key whose second line is a whole audit line of its own, as the log handler writes them.
FORGED = (
    "redlock:{x}\n[2026-12-04 03:30:00,000: INFO] dashboard: release redlock:{billing:42} "
    "by alice (forced): released redlock:{billing:42} (holder alive)"
)


@pytest.fixture
def celery_app(redis_url: str, redis_server: RedisServer) -> Celery:
    return make_app(redis_server, name="http")


@pytest.fixture
def actions() -> Iterator[list[dict[str, Any]]]:
    """Every ``lock_admin_action`` sent during the test."""
    with admin_actions() as seen:
        yield seen


def dead_lock(r: redis_py.Redis, name: str) -> str:
    key = keys_for("redlock", name).lock
    r.set(key, new_token(f"id-{name[-4:]}", "w9@gone", 7), px=9_000)
    return key


def form_fields(page: str, form_id: str) -> dict[str, str]:
    """The hidden fields of the form ``form_id`` of ``page``, unescaped."""
    found = re.search(rf'<form [^>]*id="{form_id}">(.*?)</form>', page, re.S)
    assert found is not None, page
    pairs = re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', found.group(1))
    return {name: html.unescape(value) for name, value in pairs}


def filtered(page: httpx.Response) -> tuple[list[str], str]:
    """The keys a locks page lists, and what its banner says the filter selects."""
    assert page.status_code == 200, page.text
    banner = re.search(r'id="filtered">(.*?)</p>', page.text)
    assert banner is not None, page.text
    return re.findall(r'<tr data-key="([^"]+)"', page.text), banner.group(1)


def csrf_field(page: str) -> dict[str, str]:
    found = re.search(r'<meta name="csrf-field" content="([^"]+)" data-value="([^"]+)">', page)
    assert found is not None, page
    return {found.group(1): found.group(2)}


def test_release_dead_releases_only_the_locks_the_filter_shows(
    celery_app: Celery, r: redis_py.Redis
) -> None:
    shown, hidden = dead_lock(r, f"{TASK}:{'a' * 32}"), dead_lock(r, f"{TASK}:{'b' * 32}")
    board = create_app(
        celery_app, actions=True, credentials=Credentials(token=TOKEN), ping_timeout=0.3
    )
    with served(board) as url, httpx.Client(base_url=url, headers=BEARER) as ops:
        page = ops.get("/", params={"task": TASK, "prefix": f"{TASK}:aaaa"})
        assert filtered(page) == (
            [html.escape(shown)],
            f"Locks whose name starts with <code>{TASK}:aaaa</code>, of the lock name "
            f"<code>{TASK}</code>",
        )
        form = form_fields(page.text, "release-dead")
        assert form["prefix"] == f"{TASK}:aaaa" and form["lock_name"] == TASK
        done = ops.post("/action/release-dead", data=form)
        assert done.status_code == 200, done.text
        assert "released 1 lock(s) of dead workers; kept 0" in done.text
        assert not r.exists(shown) and r.exists(hidden)
        # A refused filter lists nothing: no button that would act on every lock.
        refused = ops.get("/", params={"prefix": "x" * 201})
        assert refused.status_code == 400 and 'id="release-dead"' not in refused.text


def test_the_task_filter_selects_its_own_lock_name_not_a_longer_one(
    celery_app: Celery, r: redis_py.Redis
) -> None:
    """``?task=proj.hold`` lists, and its release-dead releases, only ``proj.hold:<digest>``:
    the task ``proj.hold:b``'s locks (``proj.hold:b:<digest>``) start with the same
    ``proj.hold:`` and were listed and released with them, as ``celery redlock inspect
    proj.hold`` does not."""
    own, other = dead_lock(r, f"{TASK}:{'a' * 32}"), dead_lock(r, f"{TASK}:b:{'c' * 32}")
    board = create_app(
        celery_app, actions=True, credentials=Credentials(token=TOKEN), ping_timeout=0.3
    )
    with served(board) as url, httpx.Client(base_url=url, headers=BEARER) as ops:
        page = ops.get("/", params={"task": TASK})
        assert filtered(page) == (
            [html.escape(own)],
            f"Locks whose name starts with <code>{TASK}:</code>, of the lock name "
            f"<code>{TASK}</code>",
        )
        done = ops.post("/action/release-dead", data=form_fields(page.text, "release-dead"))
        assert done.status_code == 200, done.text
        assert "released 1 lock(s) of dead workers; kept 0" in done.text
        assert not r.exists(own) and r.exists(other)
        # The name prefix alone still selects both: it says "starts with".
        again = dead_lock(r, f"{TASK}:{'a' * 32}")
        both = ops.get("/", params={"prefix": f"{TASK}:"})
        assert filtered(both) == (
            sorted([html.escape(again), html.escape(other)]),
            f"Locks whose name starts with <code>{TASK}:</code>",
        )


def test_a_lock_of_a_long_name_is_released_from_its_row(
    celery_app: Celery, r: redis_py.Redis
) -> None:
    """A key of up to 4,096 characters (a lock name as long as a task's name) is acted on
    whole; a longer posted key is refused, naming the limit. Keys used to be cut to 1,000
    characters, so the row of a longer one could never be released."""
    key = dead_lock(r, f"{TASK}:{'n' * 3000}")
    board = create_app(
        celery_app, actions=True, credentials=Credentials(token=TOKEN), ping_timeout=0.3
    )
    with served(board) as url, httpx.Client(base_url=url, headers=BEARER) as ops:
        page = ops.get("/", params={"prefix": f"{TASK}:nnnn"})
        row = re.search(r'<tr data-key="[^"]+">.*?</tr>', page.text, re.S)
        assert row is not None, page.text
        pairs = re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', row.group(0))
        form = {name: html.unescape(value) for name, value in pairs}
        assert form["key"] == key
        done = ops.post("/action/release", data=form)
        assert done.status_code == 200 and "released" in done.text, done.text
        assert not r.exists(key)
        longer = ops.post("/action/release", data={**form, "key": "k" * 4097})
        assert longer.status_code == 400
        assert "the key is 4097 characters; at most 4096" in longer.text
        # The row of a longer key offered a Release button that could only answer that 400.
        beyond = dead_lock(r, f"{TASK}:{'m' * 5000}")
        shown = ops.get("/", params={"prefix": f"{TASK}:mmmm"}).text
        row = re.search(r'<tr data-key="[^"]+">.*?</tr>', shown, re.S)
        assert row is not None and "<form" not in row.group(0), shown
        assert "key over 4096 characters: <code>celery redlock release KEY</code>" in row.group(0)
        assert r.exists(beyond)


def test_a_session_ends_with_its_token_and_its_lifetime(
    celery_app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several processes share REDLOCK_WEB_SECRET: one that runs with the same token accepts
    the session, one restarted with a rotated token does not."""
    monkeypatch.setenv(SECRET_ENV, "shared-by-every-process-" + "s" * 16)
    rotated = "rotated-" + TOKEN
    same = create_app(celery_app, credentials=Credentials(token=TOKEN))
    new = create_app(celery_app, credentials=Credentials(token=rotated))
    with served(same) as first, served(new) as second, httpx.Client() as browser:
        login = browser.get(f"{first}/login")
        answer = browser.post(f"{first}/login", data={**csrf_field(login.text), "token": TOKEN})
        assert answer.status_code == 303
        cookie = answer.headers["set-cookie"]
        assert cookie.startswith(f"{SESSION_COOKIE}=")
        assert f"Max-Age={SESSION_LIFETIME}" in cookie
        assert browser.get(f"{first}/").status_code == 200
        kept = create_app(celery_app, credentials=Credentials(token=TOKEN))
        with served(kept) as restarted:
            assert browser.get(f"{restarted}/").status_code == 200
        after = browser.get(f"{second}/")
        assert after.status_code == 303 and after.headers["location"] == "/login"
        assert httpx.get(f"{second}/", headers=BEARER).status_code == 303


def test_a_session_ends_at_log_out_and_no_page_is_cached(celery_app: Celery) -> None:
    """There was no way to end a session from the page (the cookie lasts 12 hours, a browser
    restart included), and the pages carrying the lock list and a CSRF token had no
    ``Cache-Control``. "Log out" is a POST, CSRF-checked as every action is."""
    board = create_app(celery_app, credentials=Credentials(token=TOKEN))
    with served(board) as base, httpx.Client() as browser:
        login = browser.get(f"{base}/login")
        browser.post(f"{base}/login", data={**csrf_field(login.text), "token": TOKEN})
        page = browser.get(f"{base}/")
        assert page.status_code == 200 and page.headers["cache-control"] == "no-store"
        fields = form_fields(page.text, "logout")
        forged = browser.post(f"{base}/logout", data={}, headers={"Origin": base})
        assert forged.status_code == 403 and browser.get(f"{base}/").status_code == 200
        out = browser.post(f"{base}/logout", data=fields, headers={"Origin": base})
        assert out.status_code == 303 and out.headers["location"] == "/login"
        assert f'{SESSION_COOKIE}=""' in out.headers["set-cookie"]
        after = browser.get(f"{base}/")
        assert after.status_code == 303 and after.headers["location"] == "/login"
        assert "Log out" not in browser.get(f"{base}/login").text


def test_an_anonymous_upload_is_never_read(celery_app: Celery) -> None:
    """``/login`` and ``/logout`` read any body, a multipart upload spooled to disk (500 MB in
    2.4 s), before answering a stranger "missing or wrong CSRF token". No form of the
    dashboard posts a file: a file part is refused (400) as soon as it starts, and a logout
    without a session is answered from its headers."""
    board = create_app(celery_app, credentials=Credentials(token=TOKEN))
    big = {"upload": ("big.bin", b"x" * 5_000_000, "application/octet-stream")}
    with served(board) as base, httpx.Client() as stranger:
        login = stranger.post(f"{base}/login", files=big, headers={"Origin": base})
        assert login.status_code == 400 and "files" in login.text
        out = stranger.post(f"{base}/logout", files=big, headers={"Origin": base})
        assert out.status_code == 303 and out.headers["location"] == "/login"
        assert "set-cookie" not in out.headers


def test_a_posted_key_cannot_forge_an_audit_line(
    celery_app: Celery,
    actions: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    board = create_app(
        celery_app, actions=True, credentials=Credentials(token=TOKEN), ping_timeout=0.3
    )
    with served(board) as url, httpx.Client(base_url=url, headers=BEARER) as ops:
        token = csrf_field(ops.get("/").text)
        with caplog.at_level(logging.INFO, logger="celery_redlock.web"):
            for name, key in (
                ("release", FORGED),
                ("clear-marker", FORGED),
                ("release", LONG),
            ):
                done = ops.post(f"/action/{name}", data={**token, "key": key, "fingerprint": "0"})
                assert done.status_code in (400, 409), done.text
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "celery_redlock.web"]
    assert len(lines) == 3 and all(rec.levelno == logging.INFO for rec in caplog.records)
    assert all("\n" not in line and len(line) < 1000 for line in lines), lines
    assert lines[1].startswith("dashboard: clear-marker redlock:{x}\\n[2026-12-04 03:30:00")
    assert [a["key"] for a in actions] == [FORGED, FORGED, LONG]
    assert all("\n" not in a["outcome"] for a in actions)


def test_a_refused_action_sends_no_signal_and_logs_a_warning(
    celery_app: Celery,
    r: redis_py.Redis,
    actions: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    key = dead_lock(r, f"{TASK}:{'c' * 32}")
    readonly = create_app(celery_app, credentials=Credentials())  # no login, read-only
    guarded = create_app(celery_app, actions=True, credentials=Credentials(token=TOKEN))
    with served(readonly) as open_url, served(guarded) as guarded_url, httpx.Client() as anyone:
        token = csrf_field(anyone.get(f"{open_url}/").text)
        with caplog.at_level(logging.INFO, logger="celery_redlock.web"):
            forged = {**token, "key": FORGED + "\n", "fingerprint": "0", "force": "1"}
            refused = anyone.post(f"{open_url}/action/release", data=forged)
            assert refused.status_code == 403 and "read-only" in refused.text
            no_csrf = {"key": key, "force": "1"}
            signed_in = anyone.post(f"{guarded_url}/action/release", data=no_csrf, headers=BEARER)
            assert signed_in.status_code == 403 and "CSRF" in signed_in.text
            # Not signed in: sent to the login before its body is read (a 200 MB upload was
            # read and spooled to disk before the refusal).
            unsigned = anyone.post(f"{guarded_url}/action/release", data=no_csrf)
            assert unsigned.status_code == 303 and unsigned.headers["location"] == "/login"
    assert r.exists(key) and actions == []
    records = [rec for rec in caplog.records if rec.name == "celery_redlock.web"]
    assert [(rec.levelno, "\n" in rec.getMessage()) for rec in records] == [
        (logging.WARNING, False)
    ]
    assert (
        records[0]
        .getMessage()
        .startswith(
            "dashboard: refused action release redlock:{x}\\n[2026-12-04 03:30:00,000: INFO]"
        )
    )


def test_a_page_says_once_that_the_lock_redis_is_down() -> None:
    down = f"redis://127.0.0.1:{dead_port()}"
    app = layout_app("down", down, set_as_current=False, redlock_timeline=100)
    with served(create_app(app, credentials=Credentials())) as url:
        for path in ("/", "/stats", "/timeline?task=x"):
            page = httpx.get(url + path)
            assert page.status_code == 503, (path, page.text)
            said = re.search(r'(?:class="error"|id="result")[^>]*>(.*?)</p>', page.text, re.S)
            assert said is not None, page.text
            assert re.match(
                rf"cannot (reach|read) the lock Redis: {re.escape(down)}/0 \(", said.group(1)
            )
            assert said.group(1).count("lock Redis") == 1, said.group(1)


def test_invalid_lock_options_are_named_on_every_page(
    celery_app: Celery, redis_server: RedisServer
) -> None:
    @celery_app.task(base=LockedTask, lock_ttl=-5, shared=False)
    def broken() -> None:
        """Never runs: its lock_ttl is refused when the app is finalized."""

    with served(create_app(celery_app, credentials=Credentials())) as url:
        for path in ("/", "/", "/timeline"):  # Celery raises it on the first look only
            page = httpx.get(url + path)
            assert page.status_code == 400, (path, page.text)
            assert "option lock_ttl=-5 is invalid" in page.text
    bad_setting = make_app(redis_server, name="http", redlock_lease="long")
    with served(create_app(bad_setting, credentials=Credentials())) as url:
        for path in ("/", "/stats", "/timeline"):
            page = httpx.get(url + path)
            assert page.status_code == 400, (path, page.text)
            assert "setting redlock_lease=&#39;long&#39; is invalid" in page.text
