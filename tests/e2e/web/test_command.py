"""``celery redlock web`` as an operator starts it: the address it announces is the one it
listens on (``--port 0`` included), a port it cannot take is one error line before any
announcement, and without ``-A`` it says so at once instead of serving pages of errors."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from celery_redlock.testing import RedisServer
from support import ROOT
from tests.e2e.web.tooling import APP

#: The line the command writes once it listens.
ANNOUNCED = re.compile(r"celery-redlock dashboard on (http://\S+/) \(read-only\)")


def _env(server: RedisServer) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REDLOCK_TEST_PORT": str(server.port)}
    for name in ("REDLOCK_WEB_TOKEN", "CELERY_BROKER_URL", "BROKER_URL", "CELERY_APP", "APP"):
        env.pop(name, None)
    return env


@pytest.fixture
def dashboard(redis_server: RedisServer) -> Iterator[subprocess.Popen[str]]:
    cmd = [sys.executable, "-m", "celery", "-A", APP, "redlock", "web", "--port", "0"]
    process = subprocess.Popen(
        cmd, cwd=ROOT, env=_env(redis_server), stderr=subprocess.PIPE, text=True
    )
    yield process
    process.terminate()
    process.wait(10)
    if process.stderr is not None:
        process.stderr.close()


def test_port_0_is_announced_as_the_port_bound(dashboard: subprocess.Popen[str]) -> None:
    """``--port 0`` announced ``http://127.0.0.1:0/``: the port the system picked was
    printed nowhere."""
    assert dashboard.stderr is not None
    line = dashboard.stderr.readline()  # the announcement, written once it listens
    found = ANNOUNCED.search(line)
    assert found is not None, line
    url = found.group(1)
    assert not url.endswith(":0/")
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            status = reply.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    assert status == 200


def test_a_port_in_use_is_one_error_before_any_announcement(redis_server: RedisServer) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "celery", "-A", APP, "redlock", "web", "--port", str(port)],
            cwd=ROOT,
            env=_env(redis_server),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1, done.stderr
    assert f"Error: cannot listen on 127.0.0.1 port {port}: Address already in use" in (done.stderr)
    assert "dashboard on" not in done.stderr and "Traceback" not in done.stderr


def test_without_an_app_it_says_so_at_once(redis_server: RedisServer, tmp_path: object) -> None:
    """Without ``-A`` it announced itself and served a 400 page of a settings error on every
    request; every other command says at once how to give the app."""
    done = subprocess.run(
        [sys.executable, "-m", "celery", "redlock", "web", "--port", "0"],
        cwd=str(tmp_path),
        env=_env(redis_server),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert "no app given" in done.stderr and "celery -A yourproject redlock web" in done.stderr
    assert "dashboard on" not in done.stderr
