"""``celery redlock web`` as an operator starts it: the address it announces is the one it
listens on (``--port 0`` included), a port it cannot take is one error line before any
announcement, and without ``-A`` it says so at once instead of serving pages of errors."""

from __future__ import annotations

import http.client
import os
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from celery_redlock.cli import redlock
from celery_redlock.testing import RedisServer
from support import ROOT
from tests.e2e.web.tooling import APP, Dashboard

#: The line the command writes once it listens.
ANNOUNCED = re.compile(r"celery-redlock dashboard on (http://\S+/) \(read-only\)")


def _env(server: RedisServer) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REDLOCK_TEST_PORT": str(server.port)}
    for name in ("REDLOCK_WEB_TOKEN", "CELERY_BROKER_URL", "BROKER_URL", "CELERY_APP", "APP"):
        env.pop(name, None)
    return env


def web(server: RedisServer, *args: str, cwd: object = ROOT) -> subprocess.CompletedProcess[str]:
    """``celery redlock web ARGS`` run to its end (``-A`` the test app, unless ``cwd`` is
    elsewhere)."""
    app = ["-A", APP] if cwd == ROOT else []
    return subprocess.run(
        [sys.executable, "-m", "celery", *app, "redlock", "web", *args],
        cwd=str(cwd),
        env=_env(server),
        capture_output=True,
        text=True,
        timeout=60,
    )


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
        done = web(redis_server, "--port", str(port))
    assert done.returncode == 1, done.stderr
    assert f"Error: cannot listen on 127.0.0.1 port {port}: Address already in use" in (done.stderr)
    assert "dashboard on" not in done.stderr and "Traceback" not in done.stderr


def test_without_an_app_it_says_so_at_once(redis_server: RedisServer, tmp_path: object) -> None:
    """Without ``-A`` it announced itself and served a 400 page of a settings error on every
    request; every other command says at once how to give the app."""
    done = web(redis_server, "--port", "0", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "no app given" in done.stderr and "celery -A yourproject redlock web" in done.stderr
    assert "dashboard on" not in done.stderr


def test_under_a_proxy_path_links_redirects_and_cookies_stay_under_it(
    redis_server: RedisServer,
) -> None:
    """Behind a proxy that serves the dashboard under /locks/ and strips that prefix, every
    redirect, form and cookie pointed at / (probe, round 23): the login led out of the prefix.
    The requests here are those the proxy passes on, without the prefix."""
    board = Dashboard(redis_server.port, "--root-path", "/locks")
    try:
        host = urllib.parse.urlsplit(board.url).netloc
        connection = http.client.HTTPConnection(host, timeout=10)
        connection.request("GET", "/")
        reply = connection.getresponse()
        reply.read()
        assert (reply.status, reply.getheader("Location")) == (303, "/locks/login")
        connection.request("GET", "/login")
        reply = connection.getresponse()
        form = reply.read().decode()
        assert reply.status == 200 and 'action="/locks/login"' in form, form
        cookies = reply.headers.get_all("Set-Cookie") or []
        assert cookies and all("Path=/locks" in c for c in cookies), cookies
        connection.close()
    finally:
        board.stop()


@pytest.mark.parametrize("path", ["locks", "/locks/", "/a b", "/x?y"])
def test_a_root_path_that_is_no_path_is_refused(path: str) -> None:
    """Refused as click parses the option, before the command runs (so in this process)."""
    done = CliRunner().invoke(redlock, ["web", "--root-path", path])
    assert done.exit_code == 2, done.output
    assert "Invalid value for '--root-path': expected a path such as /locks" in done.output
