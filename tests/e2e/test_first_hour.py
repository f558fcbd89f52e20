"""What a new user meets in the first hour, on a real prefork worker (issue 24, items 1, 5 and
7; issue 22, item 5).

The tasks are those of :mod:`tests.e2e.first_hour_app` (default contention policy,
``max_retries=0``), served by one ``celery worker -c 2`` on a private redis-server. The
refusals start their own worker (:mod:`tests.e2e.crosscheck_app`), which must exit by itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py
from celery import Celery

from celery_redlock import LockContended
from celery_redlock.testing import RedisServer, wait_until
from support.apps import make_app
from support.workers import WorkerProcess, child_env

pytestmark = pytest.mark.slow

APP = "tests.e2e.first_hour_app"


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def worker(server: RedisServer) -> Iterator[WorkerProcess]:
    with WorkerProcess(server.port, "w1", app=APP, concurrency=2) as worker:
        yield worker


@pytest.fixture
def client(server: RedisServer, worker: WorkerProcess) -> Iterator[Celery]:
    app = make_app(server, name="first_hour_app")
    yield app
    app.close()


@pytest.fixture
def records(server: RedisServer) -> Iterator[redis_py.Redis]:
    client = redis_py.Redis.from_url(f"{server.url.rsplit('/', 1)[0]}/3")
    yield client
    client.close()


@pytest.mark.parametrize("task", ["rated", "plain_rated"])
def test_a_rate_under_the_default_policy_runs_every_call(
    client: Celery, records: redis_py.Redis, task: str
) -> None:
    name = f"{APP}.{task}"
    results = [client.send_task(name, (n,)) for n in range(24)]
    wait_until(lambda: all(r.ready() for r in results), 90, "the 24 calls to end")
    assert sorted(r.get(timeout=5) for r in results) == list(range(24))  # none skipped
    assert sorted(int(n) for n in records.lrange(f"starts:{name}", 0, -1)) == list(range(24))


def test_a_rate_without_exclusion_runs_calls_side_by_side(
    server: RedisServer, client: Celery, records: redis_py.Redis
) -> None:
    env = {"REDLOCK_TEST_SIDE_BY_SIDE": "1"}
    with WorkerProcess(server.port, "w3", app=APP, args=["-Q", "side"], env=env):
        results = [client.send_task(f"{APP}.side_by_side", (n,), queue="side") for n in range(2)]
        _both_ran_at_once(records, results)


def _both_ran_at_once(records: redis_py.Redis, results: list[Any]) -> None:
    # Both bodies run at once: each waits inside for the test, which lets them go only then.
    wait_until(lambda: records.llen("together") == 2, 20, "two calls running at once")
    records.rpush("go", 1, 2)
    assert sorted(r.get(timeout=20) for r in results) == [0, 1]


def test_the_pool_children_start_and_run_a_call_without_a_traceback(
    server: RedisServer, client: Celery
) -> None:
    """Probe: with the lowest releases pyproject.toml accepted on Python 3.13 (kombu 5.3.0),
    every prefork child logged ``after fork raised exception: AttributeError("'cached_property'
    object has no attribute 'lock'")`` (kombu 5.3.3 mends it for Python 3.12 and later, which
    pyproject.toml now asks there). The ``lowest-3.13`` session runs this on those floors."""
    with WorkerProcess(server.port, "w4", app=APP, concurrency=2, args=["-Q", "fresh"]) as fresh:
        results = [client.send_task(f"{APP}.echo", (n,), queue="fresh") for n in (1, 2)]
        assert [r.get(timeout=30) for r in results] == [1, 2]
        for result in results:  # a child writes its line after the result: wait for it
            fresh.wait_for_log(rf"ForkPoolWorker-\d+\] Task \S+\[{result.id}\] succeeded")
        text = fresh.text()
    assert "raised exception" not in text and "Traceback" not in text, text


def test_lock_retry_for_bounds_a_rate_requeue(client: Celery, worker: WorkerProcess) -> None:
    first = client.send_task(f"{APP}.bounded", (1,))
    assert first.get(timeout=20) == 1
    second = client.send_task(f"{APP}.bounded", (2,))
    # Its slot is a minute away, past lock_retry_for=2: it fails now, it does not run later.
    with pytest.raises(LockContended) as info:
        second.get(timeout=20, propagate=True)
    assert "over its rate" in str(info.value)
    assert "lock_retry_for=2.0s" in worker.wait_for_log(rf"{second.id}\] gives up.*").group(0)


# -- a worker refused by a configuration error: one line (issue 24, items 1 and 7) -------------


def refusal(server: RedisServer, **knobs: object) -> list[str]:
    """Start ``tests.e2e.crosscheck_app`` with ``knobs``; assert that it exits non-zero
    without becoming ready; return the lines it printed (log file included)."""
    env = {
        "REDLOCK_TEST_API": "task",
        "REDLOCK_TEST_URL": f"redis://127.0.0.1:{server.port}/0",
        "REDLOCK_TEST_LIMIT": "1",
    }
    env.update({f"REDLOCK_TEST_{k.upper()}": str(v) for k, v in knobs.items()})
    status, output = WorkerProcess(
        server.port, "w2", app="tests.e2e.crosscheck_app", env=env
    ).run_to_exit()
    assert status != 0, output[-3000:]
    assert "ready." not in output
    # Python's SecurityWarning when the tests run as root (7 lines) is Celery's, not ours.
    return [line for line in output.splitlines() if line.strip()]


@pytest.mark.parametrize(
    ("knobs", "expected"),
    [
        (
            {"url": "null", "conf": json.dumps({"broker_url": "memory://"})},
            "setting redlock_url is missing and the broker is not Redis",
        ),
        (
            {"conf": json.dumps({"redlock_on_contention": "skipp"})},
            "setting redlock_on_contention='skipp' is invalid; expected one of 'skip'",
        ),
        (
            {"options": json.dumps({"lock_tll": 5})},
            "unknown option 'lock_tll'; did you mean 'lock_ttl'?",
        ),
        ({"api": "both"}, "base=LockedTask and @single_instance on one task"),
        (
            {"api": "plain", "options": json.dumps({"lock_by": ["key"]})},
            "option lock_by=['key'] is ignored: the task is not locked; expected "
            "@app.task(base=LockedTask, lock_by=...)",
        ),
        (
            {"api": "mixed", "options": json.dumps({"lock_on_contention": "fail"})},
            "option lock_on_contention='fail' is given to @app.task, and @single_instance reads "
            "only its own keywords",
        ),
        (
            {"conf": json.dumps({"redlock_timeline": "many"})},
            "setting redlock_timeline='many' is invalid; expected a whole number from 0 to 1000000",
        ),
    ],
    ids=["no-url", "skipp", "lock_tll", "both-apis", "no-base", "over-decorator", "timeline"],
)
def test_a_refused_worker_prints_the_error_line_and_no_traceback(
    server: RedisServer, knobs: dict[str, str], expected: str
) -> None:
    lines = refusal(server, **knobs)
    errors = [line for line in lines if line.startswith("Error: LockConfigError: ")]
    assert len(errors) == 1 and expected in errors[0], "\n".join(lines[-40:])
    assert not any("Traceback" in line or "KeyError" in line for line in lines)
    assert len(lines) <= 10, "\n".join(lines)


@pytest.mark.parametrize("dictconfig", ["", "1", "root"], ids=["none", "at-import", "with-root"])
def test_a_misspelled_setting_is_one_warning_in_the_worker_log(
    server: RedisServer, tmp_path: Path, dictconfig: str
) -> None:
    """The app finalizes before Celery sets up logging: the warning used to be printed twice,
    first as a bare line on stderr (outside the log file), then in the log at worker start.
    A ``dictConfig`` with ``disable_existing_loggers`` (common in Django's ``LOGGING``) run
    after our loggers exist switched them off in the worker, this warning and every lock-lost
    ERROR with them (probe, round 23). With a handler on the root logger too (Django's
    ``LOGGING`` usually has one), the warning was logged at the app's finalize, on the logger
    switched off, and dropped (Django probe, session 25)."""
    env = {
        "REDLOCK_TEST_API": "task",
        "REDLOCK_TEST_URL": f"redis://127.0.0.1:{server.port}/0",
        "REDLOCK_TEST_CONF": json.dumps({"redlock_ulr": "redis://127.0.0.1:1/0"}),
        **({"REDLOCK_TEST_DICTCONFIG": dictconfig} if dictconfig else {}),
    }
    log = tmp_path / "w3.log"  # the log file and stderr, both
    with WorkerProcess(
        server.port, "w3", app="tests.e2e.crosscheck_app", env=env, log=log, stderr=log
    ):
        output = log.read_text()
    warned = [line for line in output.splitlines() if "unknown setting 'redlock_ulr'" in line]
    assert len(warned) == 1, output[-3000:]
    if dictconfig != "root":  # else the project's own handler, on stderr, wrote it
        assert "WARNING/MainProcess] app 'crosscheck_app': unknown setting" in warned[0]


def test_a_project_configuring_logging_in_setup_logging_keeps_our_loggers_on(
    server: RedisServer, tmp_path: Path
) -> None:
    """Celery's recipe for Django configures ``LOGGING`` in a ``setup_logging`` receiver, which
    runs after ``worker_init``: with ``disable_existing_loggers`` it switched our loggers off
    again, and the startup checks' lines (a lost lock's ERROR too) were dropped (review,
    round 23)."""
    env = {
        "REDLOCK_TEST_API": "task",
        "REDLOCK_TEST_URL": f"redis://127.0.0.1:{server.port}/0",
        "REDLOCK_TEST_DICTCONFIG": "setup_logging",
    }
    log = tmp_path / "w5.log"
    with WorkerProcess(
        server.port, "w5", app="tests.e2e.crosscheck_app", env=env, log=log, stderr=log
    ) as worker:
        worker.wait_for_log(r"celery_redlock: locks on ", 30.0)


def test_a_misspelled_setting_is_one_warning_in_a_beat_whose_project_sets_up_logging(
    server: RedisServer, tmp_path: Path
) -> None:
    """With a ``setup_logging`` receiver Celery sends no ``after_setup_logger``, which the
    warning waited for: a beat that publishes nothing never logged it. It is logged when the
    beat starts (``beat_init``)."""
    log = tmp_path / "project.log"
    command = [sys.executable, "-m", "celery", "-A", "tests.e2e.beat_logging_app", "beat"]
    command += ["-s", str(tmp_path / "schedule"), "--max-interval", "1"]
    env = child_env(REDLOCK_TEST_PORT=str(server.port), REDLOCK_TEST_LOG=str(log))
    beat = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )

    def text() -> str:
        return log.read_text() if log.exists() else ""

    try:
        wait_until(lambda: "beat: Starting" in text(), 30, "the beat to start")
        wait_until(lambda: "unknown setting 'redlock_ulr'" in text(), 10, "the warning")
    finally:
        os.killpg(beat.pid, signal.SIGKILL)
        _, stderr = beat.communicate(timeout=10)
    warned = [line for line in text().splitlines() if "unknown setting 'redlock_ulr'" in line]
    assert len(warned) == 1, text()
    assert b"unknown setting" not in stderr


def test_a_project_importing_nothing_of_ours_is_refused_by_the_entry_point(
    server: RedisServer,
) -> None:
    """``@app.task(lock_by=[...])`` without ``base=LockedTask``, in a project that imports
    nothing of celery-redlock: the check that refuses it lives in the worker wiring, which only
    ``LockedTask`` and ``@single_instance`` imported, so the worker started and ran the calls
    unlocked, two at once. Celery loads our ``celery.commands`` entry point in every
    ``celery`` process, and it loads the wiring when the worker starts."""
    status, output = WorkerProcess(server.port, "w4", app="tests.e2e.unimported_app").run_to_exit()
    lines = [line for line in output.splitlines() if line.startswith("Error: LockConfigError: ")]
    assert status != 0 and "ready." not in output, output[-3000:]
    assert len(lines) == 1, output[-3000:]
    assert "task unimported_app.sync_account: option lock_by=['account_id'] is ignored" in lines[0]


def test_a_project_that_does_not_use_the_package_is_left_alone(server: RedisServer) -> None:
    """The entry point is loaded in every ``celery`` process where the package is installed:
    a project with no ``redlock_*`` setting that imports nothing of ours, whose own lock base
    reads ``lock_ttl``, starts its worker as without the package."""
    env = {"REDLOCK_TEST_FOREIGN": "1"}
    with WorkerProcess(server.port, "w5", app="tests.e2e.unimported_app", env=env) as worker:
        assert "lock_ttl" not in worker.text() and worker.alive
