"""Fixtures of the dashboard's browser tests: one redis-server, one prefork worker, two
``celery redlock web`` servers (actions enabled, read-only) and one headless Chromium per
module. Screenshots go to ``$REDLOCK_ARTIFACTS`` (default /tmp/celery-redlock-artifacts)."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py
from celery import Celery

from celery_redlock.testing import RedisServer, free_port, wait_until
from support import ROOT
from support.workers import WorkerProcess
from tests.conftest import make_app

APP = "tests.e2e.web.web_app"
HOLD = f"{APP}.hold"
CHROMIUM = os.environ.get("REDLOCK_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("REDLOCK_CHROMEDRIVER", "/usr/bin/chromedriver")
ARTIFACTS = Path(os.environ.get("REDLOCK_ARTIFACTS") or "/tmp/celery-redlock-artifacts")
TOKEN = secrets.token_urlsafe(24)


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


class Dashboard:
    """``celery -A tests.e2e.web.web_app redlock web`` in a subprocess."""

    def __init__(self, port: int, *args: str) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{(p := free_port())}"
        self.log = Path(tempfile.mkstemp(prefix="dashboard-", suffix=".log")[1])
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "REDLOCK_TEST_PORT": str(port),
            "REDLOCK_WEB_TOKEN": TOKEN,
        }
        # A generous ping timeout: a live worker answers at once (the ping returns when every
        # holder asked has answered), and a loaded machine must not make it look dead.
        cmd = [sys.executable, "-m", "celery", "-A", APP, "redlock", "web", "--port", str(p)]
        cmd += ["--ping-timeout", "3", *args]
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        wait_until(self._answers, 30, f"the dashboard on {self.url} (log {self.log})")

    def _answers(self) -> bool:
        assert self.process.poll() is None, self.log.read_text()
        try:
            with urllib.request.urlopen(self.url + "/login", timeout=2) as reply:
                return bool(reply.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


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
