"""The dashboard in headless Chromium, against a real prefork worker and a real Redis.

Each test drives the page as an operator does (log in with the token, filter, press a
button) and checks Redis afterwards: a lock listed with its holder, released from the page,
refused in read-only mode and to a cross-site form, a filter that shows markup as text, and
a skip that really happened drawn on the timeline.
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import redis as redis_py
from celery import Celery

from celery_redlock.testing import RedisServer, free_port, wait_until
from tests.e2e.web.tooling import HOLD, TOKEN, Dashboard

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("shot")]

HOST = socket.gethostname()


def started(records: redis_py.Redis, key: str) -> dict[str, Any]:
    raw = wait_until(lambda: records.get(f"started:{key}"), 15, f"hold({key!r}) to start")
    out: dict[str, Any] = json.loads(raw)  # type: ignore[arg-type]
    return out


def login(browser: Any, board: Dashboard) -> None:
    from selenium.webdriver.common.by import By

    browser.get(board.url + "/login")
    browser.find_element(By.NAME, "token").send_keys(TOKEN)
    browser.find_element(By.CSS_SELECTOR, "#login button").click()
    wait_until(lambda: browser.find_elements(By.ID, "locks"), 10, "the locks page after login")


def row_of(browser: Any, task_id: str) -> Any:
    from selenium.webdriver.common.by import By

    rows = [
        r for r in browser.find_elements(By.CSS_SELECTOR, "#locks tbody tr") if task_id in r.text
    ]
    assert len(rows) == 1, browser.page_source
    return rows[0]


@pytest.fixture
def held(
    client: Celery, records: redis_py.Redis, request: pytest.FixtureRequest
) -> Iterator[tuple[str, dict[str, Any]]]:
    """A ``hold`` task holding the lock of a key named after the test; let go afterwards."""
    key = request.node.name
    result = client.send_task(HOLD, args=(key,))
    holder = started(records, key)
    assert holder["id"] == result.id
    yield key, holder
    records.rpush(f"go:{key}", 1)
    result.get(timeout=20)


def test_the_page_lists_a_held_lock_with_its_holder(
    browser: Any, dashboard: Dashboard, held: tuple[str, dict[str, Any]]
) -> None:
    from selenium.webdriver.common.by import By

    _, holder = held
    login(browser, dashboard)
    browser.get(dashboard.url + "/?task=" + urllib.parse.quote(HOLD))
    cells = [c.text for c in row_of(browser, holder["id"]).find_elements(By.TAG_NAME, "td")]
    key, task, mode, task_id, host, pid, alive = cells[:7]
    assert key.startswith(f"redlock:{{{HOLD}:") and task == HOLD
    assert mode.startswith("lock") and task_id == holder["id"]
    assert (host, pid, alive) == (f"w1@{HOST}", str(holder["pid"]), "alive")
    assert float(cells[8].rstrip("s")) > 0  # TTL left


def test_a_release_from_the_page_frees_the_lock(
    browser: Any,
    dashboard: Dashboard,
    held: tuple[str, dict[str, Any]],
    server: RedisServer,
) -> None:
    from selenium.webdriver.common.by import By

    _, holder = held
    login(browser, dashboard)
    browser.get(dashboard.url + "/?task=" + urllib.parse.quote(HOLD))
    lock_key = row_of(browser, holder["id"]).get_attribute("data-key")
    r = redis_py.Redis(port=server.port)
    # Without force, a live holder is refused.
    row_of(browser, holder["id"]).find_element(By.CSS_SELECTOR, "button").click()
    result = wait_until(lambda: browser.find_elements(By.ID, "result"), 10, "the refusal")[0]
    assert result.text.startswith("refused:") and "answers a control ping" in result.text
    assert r.exists(lock_key)
    # With force, released.
    browser.get(dashboard.url + "/?task=" + urllib.parse.quote(HOLD))
    row = row_of(browser, holder["id"])
    row.find_element(By.NAME, "force").click()
    row.find_element(By.CSS_SELECTOR, "button").click()
    result = wait_until(lambda: browser.find_elements(By.ID, "result"), 10, "the release")[0]
    assert result.text == f"released {lock_key} (holder alive)"
    assert not r.exists(lock_key)
    log = dashboard.log.read_text()
    assert f"dashboard: release {lock_key} by token (session) (forced): released" in log


def test_read_only_mode_refuses_the_action(
    browser: Any,
    readonly: Dashboard,
    held: tuple[str, dict[str, Any]],
    server: RedisServer,
) -> None:
    from selenium.webdriver.common.by import By

    _, holder = held
    login(browser, readonly)
    browser.get(readonly.url + "/?task=" + urllib.parse.quote(HOLD))
    assert browser.find_element(By.ID, "mode").text == "read-only"
    row = row_of(browser, holder["id"])
    assert not row.find_elements(By.TAG_NAME, "form")  # no button to press
    lock_key = row.get_attribute("data-key")
    # A form built by hand in the page, with the page's own CSRF token: still refused.
    browser.execute_script(
        """
        const meta = document.querySelector('meta[name="csrf-field"]');
        const form = document.createElement('form');
        form.method = 'post'; form.action = '/action/release';
        for (const [n, v] of [[meta.content, meta.dataset.value], ['key', arguments[0]],
                              ['force', '1']]) {
          const input = document.createElement('input');
          input.type = 'hidden'; input.name = n; input.value = v; form.appendChild(input);
        }
        document.body.appendChild(form); form.submit();
        """,
        lock_key,
    )
    result = wait_until(lambda: browser.find_elements(By.ID, "result"), 10, "the refusal")[0]
    assert "read-only" in result.text
    assert redis_py.Redis(port=server.port).exists(lock_key)


class _Attacker(http.server.BaseHTTPRequestHandler):
    """Another origin: a page that posts a release form to the dashboard on load."""

    target = ""
    key = ""

    def do_GET(self) -> None:
        body = (
            f'<form id="f" method="post" action="{self.target}/action/release">'
            f'<input name="key" value="{self.key}"><input name="force" value="1"></form>'
            "<script>document.getElementById('f').submit()</script>"
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_cross_site_post_without_token_is_refused(
    browser: Any,
    dashboard: Dashboard,
    held: tuple[str, dict[str, Any]],
    server: RedisServer,
) -> None:
    from selenium.webdriver.common.by import By

    _, holder = held
    login(browser, dashboard)  # the victim is logged in: the session cookie is there
    browser.get(dashboard.url + "/?task=" + urllib.parse.quote(HOLD))
    lock_key = row_of(browser, holder["id"]).get_attribute("data-key")
    handler = type("Handler", (_Attacker,), {"target": dashboard.url, "key": lock_key})
    evil = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    try:
        browser.get(f"http://127.0.0.1:{evil.server_address[1]}/")
        wait_until(
            lambda: "refused" in browser.find_element(By.TAG_NAME, "body").text,
            10,
            "the dashboard's answer to the cross-site form",
        )
        assert browser.current_url == dashboard.url + "/action/release"
    finally:
        evil.shutdown()
        evil.server_close()
    assert redis_py.Redis(port=server.port).exists(lock_key)


def test_the_filter_escapes_markup(browser: Any, dashboard: Dashboard) -> None:
    from selenium.webdriver.common.by import By

    login(browser, dashboard)
    markup = "<img src=x onerror=\"document.title='pwned'\">"
    browser.get(dashboard.url + "/?prefix=" + urllib.parse.quote(markup))
    shown = browser.find_element(By.ID, "filtered")
    assert markup in shown.text  # shown as text
    assert not shown.find_elements(By.TAG_NAME, "img")  # not as an element
    assert browser.find_element(By.NAME, "prefix").get_attribute("value") == markup
    assert browser.title != "pwned"
    # Pattern characters are matched literally, and a long filter is refused.
    browser.get(dashboard.url + "/?prefix=" + urllib.parse.quote("*"))
    assert browser.find_element(By.ID, "empty")
    browser.get(dashboard.url + "/?prefix=" + "a" * 201)
    assert "at most 200" in browser.find_element(By.ID, "error").text


def test_the_timeline_shows_a_skip_that_really_happened(
    browser: Any,
    dashboard: Dashboard,
    held: tuple[str, dict[str, Any]],
    client: Celery,
) -> None:
    from selenium.webdriver.common.by import By

    key, holder = held
    duplicate = client.send_task(HOLD, args=(key,))
    assert duplicate.get(timeout=20) is None  # skipped: the lock is held
    login(browser, dashboard)
    browser.get(dashboard.url + "/timeline?minutes=5&task=" + urllib.parse.quote(HOLD))
    svg = browser.find_element(By.CSS_SELECTOR, "#timeline svg")
    skips = svg.find_elements(
        By.CSS_SELECTOR, f'circle[data-event="skipped"][data-id="{duplicate.id}"]'
    )
    assert len(skips) == 1
    bars = svg.find_elements(By.CSS_SELECTOR, f'rect.bar[data-id="{holder["id"]}"]')
    assert len(bars) == 1  # the holder, still holding


def test_the_page_shows_every_mode_and_a_dead_holder(
    browser: Any,
    dashboard: Dashboard,
    held: tuple[str, dict[str, Any]],
    server: RedisServer,
) -> None:
    """Also the page docs/operations.md shows (its screenshot, taken by this test)."""
    from selenium.webdriver.common.by import By

    from celery_redlock._redis.keys import keys_for
    from celery_redlock._redis.owner import new_token

    r = redis_py.Redis(port=server.port)
    name = "reports.nightly"
    sem = keys_for("redlock", f"{name}:{'a' * 32}", limit=2)
    r.set(sem.slots[1], new_token("5f0c-dead-holder", f"w7@{HOST}", 4242), px=50_000)
    r.zadd(sem.waiters, {"waiter-1": 1})
    r.set(sem.slots[0], new_token("77aa-other-slot", f"w7@{HOST}", 4243), px=50_000)
    r.set(sem.queued, "9e1d-queued-call", px=40_000)
    r.rpush(sem.rate, 1, 2, 3)
    r.pexpire(sem.rate, 30_000)
    login(browser, dashboard)
    browser.get(dashboard.url + "/?prefix=")
    modes = {
        row.get_attribute("data-key"): row.find_elements(By.TAG_NAME, "td")
        for row in browser.find_elements(By.CSS_SELECTOR, "#locks tbody tr")
    }
    assert modes[sem.slots[1]][2].text.startswith("semaphore slot")
    assert modes[sem.slots[1]][6].text == "dead"  # w7 is no worker that answers
    assert modes[sem.slots[0]][2].text.startswith("semaphore slot")  # its slot 2 is listed
    assert modes[sem.slots[0]][10].text == "1"  # one waiter queued
    assert modes[sem.queued][2].text.startswith("enqueue marker")
    assert modes[sem.queued][3].text == "9e1d-queued-call"
    assert modes[sem.rate][2].text.startswith("rate window")
    assert "3 start(s)" in modes[sem.rate][2].text
    r.delete(*sem.slots, sem.waiters, sem.queued, sem.rate)


def test_a_loopback_dashboard_without_credentials_refuses_a_foreign_host_header(
    server: RedisServer,
) -> None:
    """DNS rebinding: a page of evil.example, made to resolve to 127.0.0.1, reads the open
    read-only dashboard as same-origin; its requests carry ``Host: evil.example``."""
    board = Dashboard(server.port, token=None)
    try:
        port = board.url.rsplit(":", 1)[1]
        foreign = urllib.request.Request(board.url + "/", headers={"Host": f"evil.example:{port}"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(foreign, timeout=10)
        assert refused.value.code == 400
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "LOCALHOST"):
            named = urllib.request.Request(board.url + "/", headers={"Host": host})
            with urllib.request.urlopen(named, timeout=10) as page:
                assert page.status == 200 and 'id="locks"' in page.read().decode()
    finally:
        board.stop()


def test_a_loopback_dashboard_with_credentials_serves_behind_a_reverse_proxy(
    readonly: Dashboard,
) -> None:
    """Behind a TLS proxy on the same machine (the dashboard on 127.0.0.1, the proxy passing
    the original ``Host``, as the operations guide says it must), every page was a 400
    "unknown Host header", the login page too. The Host check guards an open dashboard
    against DNS rebinding; with credentials, the login does (a rebound page has no session)."""
    proxied = {"Host": "locks.example.com", "X-Forwarded-Proto": "https"}
    login = urllib.request.Request(readonly.url + "/login", headers=proxied)
    with urllib.request.urlopen(login, timeout=10) as page:
        assert page.status == 200
    signed_in = urllib.request.Request(
        readonly.url + "/", headers={**proxied, "Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(signed_in, timeout=10) as page:
        assert page.status == 200 and 'id="locks"' in page.read().decode()
