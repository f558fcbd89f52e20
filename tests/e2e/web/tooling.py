"""What the dashboard's tests share: the worker app, the browser's paths, the token,
``celery redlock web`` run in a subprocess as an operator runs it, and an ASGI app served by
uvicorn in a thread."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from celery_redlock.testing import free_port, wait_until
from celery_redlock.web._security import TOKEN_ENV
from support import ROOT

APP = "tests.e2e.web.web_app"
HOLD = f"{APP}.hold"
CHROMIUM = os.environ.get("REDLOCK_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("REDLOCK_TEST_CHROMEDRIVER", "/usr/bin/chromedriver")
ARTIFACTS = Path(os.environ.get("REDLOCK_TEST_ARTIFACTS") or "/tmp/celery-redlock-artifacts")
TOKEN = secrets.token_urlsafe(24)


class Dashboard:
    """``celery -A tests.e2e.web.web_app redlock web`` in a subprocess."""

    def __init__(self, port: int, *args: str, token: str | None = TOKEN) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{(p := free_port())}"
        self.log = Path(tempfile.mkstemp(prefix="dashboard-", suffix=".log")[1])
        env = {**os.environ, "PYTHONPATH": str(ROOT), "REDLOCK_TEST_PORT": str(port)}
        env.pop(TOKEN_ENV, None)
        if token is not None:  # None: no credentials, read-only on loopback
            env[TOKEN_ENV] = token
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
        except urllib.error.HTTPError:  # no credentials: no login page, but it answers
            return True
        except OSError:
            return False

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)
