"""Fixtures of the dashboard's browser tests: one redis-server, one prefork worker, two
``celery redlock web`` servers (actions enabled, read-only) and one headless Chromium per
module. Screenshots go to ``$REDLOCK_TEST_ARTIFACTS`` (default /tmp/celery-redlock-artifacts)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
import redis as redis_py
from celery import Celery

from celery_redlock.testing import RedisServer
from support.apps import make_app
from support.workers import WorkerProcess
from tests.e2e.web.tooling import APP, ARTIFACTS, CHROMEDRIVER, CHROMIUM, Dashboard


def browser_missing() -> str | None:
    for path in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(path) is None:
            return f"{path} is not installed (apt-get install chromium chromium-driver)"
    return None


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as srv:
        yield srv


@pytest.fixture(scope="module")
def w1(server: RedisServer) -> Iterator[WorkerProcess]:
    with WorkerProcess(server.port, "w1", app=APP) as worker:
        yield worker


@pytest.fixture(scope="module")
def dashboard(server: RedisServer, w1: WorkerProcess) -> Iterator[Dashboard]:
    board = Dashboard(server.port, "--actions")
    yield board
    board.stop()


@pytest.fixture(scope="module")
def readonly(server: RedisServer, w1: WorkerProcess) -> Iterator[Dashboard]:
    board = Dashboard(server.port)
    yield board
    board.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    missing = browser_missing()
    if missing and os.environ.get("CI"):  # .ci/run installs them: a CI run never skips
        pytest.fail(missing)
    if missing:
        pytest.skip(missing)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="redlock-chromium-")
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,900",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def shot(browser: Any, request: pytest.FixtureRequest) -> Iterator[None]:
    """A screenshot of the browser at the end of the test, as a CI artifact."""
    yield
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / f"{request.node.name}.png"))


@pytest.fixture
def client(server: RedisServer) -> Iterator[Celery]:
    app = make_app(server, name="web_app")
    yield app
    app.close()


@pytest.fixture
def records(server: RedisServer) -> Iterator[redis_py.Redis]:
    r = redis_py.Redis(port=server.port, db=3)
    yield r
    r.close()
