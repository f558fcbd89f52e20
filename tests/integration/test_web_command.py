"""``celery redlock web`` in a fresh interpreter: what importing loads, and the refusals of the
command line before it serves anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from celery_redlock.web._security import SECRET_ENV, TOKEN_ENV
from support import ROOT


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("REDLOCK_WEB_")}
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**clean, "PYTHONPATH": str(ROOT), "REDLOCK_TEST_PORT": "1", **(env or {})},
    )


def test_importing_the_package_and_the_cli_loads_no_web_library() -> None:
    code = (
        "import json, sys, celery_redlock, celery_redlock.cli, celery_redlock.web\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('starlette', 'jinja2', 'uvicorn', 'fastapi'))))\n"
    )
    done = run("-c", code)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


CMD = ("-m", "celery", "-A", "tests.e2e.web.web_app", "redlock")


def test_the_group_lists_web() -> None:
    done = run(*CMD, "--help")
    assert done.returncode == 0 and "web" in done.stdout, done.stderr


def test_no_public_address_without_credentials() -> None:
    done = run(*CMD, "web", "--host", "0.0.0.0")
    assert done.returncode == 1
    assert "refusing to serve on 0.0.0.0 without credentials" in done.stderr


def test_no_actions_without_credentials() -> None:
    done = run(*CMD, "web", "--actions")
    assert done.returncode == 1 and "--actions needs credentials in the environment" in done.stderr


def test_a_short_token_is_refused() -> None:
    done = run(*CMD, "web", env={TOKEN_ENV: "abc"})
    assert done.returncode == 1 and "REDLOCK_WEB_TOKEN must be at least 16" in done.stderr


def test_a_short_secret_is_refused() -> None:
    done = run(*CMD, "web", env={TOKEN_ENV: "t" * 20, SECRET_ENV: "hunter2"})
    assert done.returncode == 1 and "REDLOCK_WEB_SECRET must be at least 32" in done.stderr


def test_a_token_no_authorization_header_carries_is_refused() -> None:
    """curl sends "ä" in UTF-8 and the server reads header bytes as Latin-1: such a token
    logged in through the form, but every scripted request went to the login page."""
    done = run(*CMD, "web", env={TOKEN_ENV: "p\u00e4sswort-token-1234"})
    assert done.returncode == 1, done.stderr
    assert "REDLOCK_WEB_TOKEN must be printable ASCII" in done.stderr


def test_a_token_of_whitespace_only_is_refused() -> None:
    done = run(*CMD, "web", env={TOKEN_ENV: " " * 20 + "\n"})
    assert done.returncode == 1 and "REDLOCK_WEB_TOKEN is only whitespace" in done.stderr
