"""What ``celery redlock`` answers to a new user's mistakes and to hostile input (issue 22 item
12, issue 24 item 10), run as an operator runs it: a subprocess, a real worker where a lock
must be held by a task.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import termios
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py
from celery import Celery

from celery_redlock import Lock
from celery_redlock.testing import RedisServer, wait_until
from support import ROOT
from support.workers import WorkerProcess
from tests.e2e.cli.tooling import APP, COUNTED, HOLD, cli, started

pytestmark = pytest.mark.slow


def test_a_stdout_that_cannot_show_a_name_gets_escapes_not_a_crash(server: RedisServer) -> None:
    url = f"redis://127.0.0.1:{server.port}/0"
    lock = Lock(url, "snow-\u2603-\u00e9", ttl=60, owner="t-\u2603")
    assert lock.acquire()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REDLOCK_TEST_PORT": str(server.port)}
    try:
        for args in (("ls",), ("inspect", lock.key), ("release", "--dead", "--dry-run")):
            done = subprocess.run(
                [sys.executable, "-m", "celery", "-A", APP, "redlock", *args],
                cwd=ROOT,
                capture_output=True,
                timeout=30,
                check=False,
                env={**env, "PYTHONIOENCODING": "latin-1"},
            )
            out, err = done.stdout.decode("latin-1"), done.stderr.decode("latin-1")
            assert done.returncode == 0, err
            assert "Traceback" not in err, err
            assert "snow-\\u2603-\u00e9" in out  # what Latin-1 can show, it shows
    finally:
        lock.release()


def test_release_dead_into_a_closed_pipe_still_releases_every_dead_workers_lock(
    server: RedisServer,
) -> None:
    """Helper probe, round 3: ``release --dead | head -1`` printed a line, then exited 1 with
    no message and no lock released: the next line raised ``BrokenPipeError``. The lines stop;
    the releases go on, and it exits 1 as click ends a command whose output was cut. Here the
    pipe is a page long and closed once the command blocks on it (it filled the page)."""
    url = f"redis://127.0.0.1:{server.port}/0"
    locks = [
        Lock(url, f"gone-{i:02}", ttl=60, owner=f"t-{i}", host="w-gone@nowhere") for i in range(60)
    ]
    for lock in locks:
        assert lock.acquire(blocking=False)
    read, write = os.pipe()
    fcntl.fcntl(read, fcntl.F_SETPIPE_SZ, 4096)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REDLOCK_TEST_PORT": str(server.port)}
    command = [sys.executable, "-m", "celery", "-A", APP, "redlock", "release", "--dead"]
    with subprocess.Popen(
        [*command, "--timeout", "0.2"], cwd=ROOT, stdout=write, stderr=subprocess.PIPE, env=env
    ) as process:
        os.close(write)

        def queued() -> int:
            out = fcntl.ioctl(read, termios.FIONREAD, b"\0\0\0\0")
            return int.from_bytes(out, sys.byteorder)

        wait_until(lambda: queued() > 4096 - 200, 30, "the command to fill the pipe")
        os.close(read)
        _, err = process.communicate(timeout=30)
    assert process.returncode == 1, err
    assert b"Traceback" not in err, err
    keys = redis_py.Redis(port=server.port)
    assert [lock.key for lock in locks if keys.exists(lock.key)] == []
    keys.close()


def test_an_argument_that_is_not_utf8_is_refused_clearly(server: RedisServer) -> None:
    done = cli(server.port, "inspect", "redlock:{\udcff}")  # the byte 0xff on the command line
    assert done.returncode == 2, done.stdout
    assert "KEY 'redlock:{\\xff}' is not UTF-8 text" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("inspect", ""), "KEY is empty; expected a lock key (redlock:{...}), a lock name or a"),
        (("inspect", "--task-id", ""), "--task-id is empty; expected a task id"),
        (("release", " "), "KEY is empty; expected a lock key (redlock:{...}) or a lock's name"),
    ],
)
def test_empty_values_are_refused(server: RedisServer, args: tuple[str, ...], message: str) -> None:
    done = cli(server.port, *args)
    assert done.returncode == 2, done.stdout
    assert message in done.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("release", "--dead", "--timeout", "0"),  # every live worker would look dead
        ("release", "--dead", "--dry-run", "--timeout", "1e-300"),  # as good as 0
        ("release", "--dead", "--dry-run", "--timeout", "0.05"),
        ("inspect", "--task-id", "t", "--timeout", "3e6"),  # no ping waits that long
        ("release", "--dead", "--dry-run", "--timeout", "-1"),
        ("release", "redlock:{job}", "--timeout", "nan"),
        ("inspect", "--task-id", "t", "--timeout", "inf"),
        ("web", "--ping-timeout", "0"),
    ],
)
def test_a_timeout_that_is_no_wait_is_a_usage_error(
    server: RedisServer, args: tuple[str, ...]
) -> None:
    done = cli(server.port, *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"Invalid value for '{args[-2]}'" in done.stderr
    assert "expected a number of seconds from 0.1 to 3600" in done.stderr
    assert not done.stdout and "Traceback" not in done.stderr


@pytest.mark.parametrize("broker", ["memory", "redis"])
def test_without_an_app_the_error_shows_how_to_give_one(server: RedisServer, broker: str) -> None:
    """Helper probe, round 3: with a Redis broker in the environment (a container's shell), a
    command without ``-A`` ran on Celery's default settings (another prefix, the default
    lease), and ``release --dead`` released a live worker's renewed lock."""
    env = {k: v for k, v in os.environ.items() if k not in ("APP", "CELERY_APP")}
    done = subprocess.run(
        [sys.executable, "-m", "celery", "redlock", "ls"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**env, "CELERY_BROKER_URL": "memory://" if broker == "memory" else server.url},
    )
    assert done.returncode == 1
    assert "no app given" in done.stderr
    assert "celery -A yourproject redlock ls" in done.stderr
    assert "Traceback" not in done.stderr


def _without_app(folder: Path, *options: str, **environment: str) -> Any:
    """``celery <options> redlock ls`` without ``-A``, run in ``folder`` (importable), with
    ``environment`` added."""
    env = {k: v for k, v in os.environ.items() if k not in ("APP", "CELERY_APP")}
    return subprocess.run(
        [sys.executable, "-m", "celery", *options, "redlock", "ls"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**env, **environment, "PYTHONPATH": str(folder)},
    )


@pytest.mark.parametrize("given", ["--config", "CELERY_CONFIG_MODULE"])
def test_a_configuration_module_with_redlock_settings_needs_no_app(
    server: RedisServer, tmp_path: Path, given: str
) -> None:
    """Review, round 3: refusing every command without ``-A`` refused a configuration module
    given to Celery's default app, whose ``redlock_*`` settings are the real ones."""
    (tmp_path / "lockconf.py").write_text(
        f'broker_url = "{server.url}"\nredlock_url = "{server.url}"\nredlock_prefix = "lockconf"\n'
    )
    lock = Lock(server.url, "configured", ttl=60, prefix="lockconf")
    assert lock.acquire(blocking=False)
    if given == "--config":
        done = _without_app(tmp_path, "--config", "lockconf")
    else:
        done = _without_app(tmp_path, CELERY_CONFIG_MODULE="lockconf")
    lock.release()
    assert done.returncode == 0, done.stderr
    assert "lockconf:{configured}" in done.stdout


@pytest.mark.parametrize("spelled", ["REDLOCK_LEASE", "CELERY_REDLOCK_LEASE", "redlock_leas"])
def test_a_configuration_module_whose_settings_celery_ignores_still_needs_an_app(
    server: RedisServer, tmp_path: Path, spelled: str
) -> None:
    """Review, round 3: a configuration module counted as giving the settings when one of its
    names merely looked like one (upper case, a namespace, a misspelling), which Celery's
    default app ignores: the command ran on the default 30 s lease."""
    (tmp_path / "otherconf.py").write_text(f'broker_url = "{server.url}"\n{spelled} = 120\n')
    done = _without_app(tmp_path, "--config", "otherconf")
    assert done.returncode == 1, done.stdout
    assert "no app given" in done.stderr and "--config otherconf" in done.stderr


def test_inspect_takes_a_task_or_lock_name_and_lists_its_held_keys(
    server: RedisServer, w1: WorkerProcess, client: Celery, records: redis_py.Redis
) -> None:
    first = client.send_task(HOLD, args=("by-name",))
    started(records, "by-name")
    named = client.send_task(COUNTED, args=("n",), kwargs={"wait": True})
    wait_until(lambda: records.get("started:counted:n"), 10, "counted('n') to start")
    try:
        listed = json.loads(cli(server.port, "ls", "--json").stdout)
        (hold_lock,) = [item for item in listed if item["task_id"] == first.id]
        (counted_lock,) = [item for item in listed if item["task_id"] == named.id]
        assert hold_lock["lock_name"] == HOLD and counted_lock["lock_name"] == "counted"

        by_task = cli(server.port, "inspect", HOLD)  # the LOCK column of `ls`
        assert by_task.returncode == 0, by_task.stderr
        assert hold_lock["key"] in by_task.stdout and "alive" in by_task.stdout
        # A task whose lock_name differs from its name: by either.
        for name in (COUNTED, "counted"):
            done = cli(server.port, "inspect", name, "--json")
            assert done.returncode == 0, done.stderr
            assert [item["key"] for item in json.loads(done.stdout)] == [counted_lock["key"]]
        direct = json.loads(cli(server.port, "inspect", hold_lock["key"], "--json").stdout)
        assert direct["key"] == hold_lock["key"]  # a key: its one object, as before

        missing = cli(server.port, "inspect", "proj.nothing")
        assert missing.returncode == 1
        assert "proj.nothing is not held (no lock has that key, lock name or task name)" in (
            missing.stderr
        )
        # release takes one lock: given the task name, it says how to find the key.
        refused = cli(server.port, "release", HOLD, "--force")
        assert refused.returncode == 1
        assert f"{HOLD} names 1 held lock(s) of a task or lock name; release takes" in (
            refused.stderr
        )
        assert f"`celery -A {APP} redlock inspect {HOLD}` lists them" in refused.stderr
        assert json.loads(cli(server.port, "inspect", hold_lock["key"], "--json").stdout)
        gone = cli(server.port, "release", "proj.nothing")
        assert "proj.nothing is not held: nothing released" in gone.stderr
    finally:
        records.rpush("go:by-name", 1)
        records.rpush("go:counted:n", 1)
    assert first.get(timeout=10) == "by-name"
    assert named.get(timeout=10) == "n"
