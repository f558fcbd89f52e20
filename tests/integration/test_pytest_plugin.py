"""The opt-in pytest plugin, run by pytester on small test files, and its helpers in-process.

The files under ``EXAMPLE`` are what a user writes; the first test is the eager-mode example
of docs/testing.md, verbatim.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py
from celery import Celery

from celery_redlock import LockedTask, lock_key
from celery_redlock.testing import (
    HOLDER,
    assert_acquired,
    assert_skipped,
    hold_lock,
    record_lock_events,
    wait_until,
)
from support.workers import running_worker

pytest_plugins = ["pytester"]

CONFTEST = 'pytest_plugins = ["celery_redlock.testing.pytest_plugin"]\n'

TESTING_DOC = (Path(__file__).resolve().parents[2] / "docs" / "testing.md").read_text()
#: The docs' example test for users of the plugin, run as it stands there.
DOC_EXAMPLE = next(
    block
    for block in re.findall(r"^```python\n(.*?)^```", TESTING_DOC, flags=re.S | re.M)
    if "def test_a_duplicate_call_is_skipped" in block
)

MORE = """
import pytest
from celery_redlock import Lock, LockContended, LockedTask, metrics
from celery_redlock.testing import (
    HOLDER, assert_skipped, hold_lock, record_lock_events,
)
from test_readme import app


@app.task(base=LockedTask, lock_by=(), lock_on_contention="fail")
def report():
    return "ran"


@app.task(base=LockedTask, lock_by=(), lock_on_contention="retry", max_retries=2)
def retrying():
    return "ran"


@app.task(base=LockedTask, lock_by=(), lock_on_contention="wait", lock_wait_timeout=0.1)
def waiting():
    return "ran"


def test_fail_raises_lock_contended_naming_the_holder(configure_redlock):
    configure_redlock(app)
    with hold_lock(report), pytest.raises(LockContended) as info:
        report.delay().get()
    assert info.value.holder == HOLDER


def test_eager_retry_fails_at_once(configure_redlock, lock_events):
    configure_redlock(app)
    with hold_lock(retrying), pytest.raises(LockContended):
        retrying.delay().get()
    assert [e.policy for e in lock_events.events if e.kind == "contended"] == ["retry"]


def test_wait_gives_up_after_its_timeout(configure_redlock, lock_events):
    configure_redlock(app)
    with hold_lock(waiting), pytest.raises(LockContended):
        waiting.delay().get()
    assert [e.policy for e in lock_events.events] == ["wait"]


@app.task(base=LockedTask, lock_by=(), lock_on_contention="skip")
def skipping():
    return "ran"


def test_leaves_counts_to_be_written(configure_redlock):
    configure_redlock(app)
    with hold_lock(skipping):
        assert [skipping.delay().get() for _ in range(5)] == [None] * 5


def test_each_test_starts_without_counts(configure_redlock):
    configure_redlock(app)
    metrics.flush()  # what the background flush does within a second
    assert metrics.read_stats(app) == {}


def test_leaves_a_lock_behind(redlock_url):
    assert Lock(redlock_url, "left-behind", ttl=60).acquire()


def test_each_test_starts_without_locks(redlock_url):
    assert not Lock(redlock_url, "left-behind", ttl=60).locked()


def test_assert_skipped_fails_for_a_call_that_ran(configure_redlock):
    configure_redlock(app)
    with record_lock_events():
        result = report.delay()
        key = r"redlock:\\{test_more.report:\\w+\\}"
        expected = rf"was not skipped; its key: {key}; its lock events: acquired"
        with pytest.raises(AssertionError, match=expected + r".* \\(its key was free: a hold_lock"):
            assert_skipped(result)


def test_a_call_that_failed_on_its_held_key_is_not_blamed_on_another_key(configure_redlock):
    configure_redlock(app)
    with record_lock_events(), hold_lock(report):
        result = report.delay()
        with pytest.raises(AssertionError) as info:
            assert_skipped(result)
    assert "policy='fail'" in str(info.value) and "hold_lock" not in str(info.value)


def test_assert_skipped_needs_a_recording(configure_redlock):
    configure_redlock(app)
    with pytest.raises(RuntimeError, match="lock_events fixture"):
        assert_skipped(report.delay())
"""


def test_the_plugin_in_a_user_test_suite(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makeini(
        "[pytest]\naddopts = -p no:celery -p no:cacheprovider\nfilterwarnings = error\n"
    )
    pytester.makepyfile(test_readme=DOC_EXAMPLE, test_more=MORE)
    result = pytester.runpytest_subprocess("-q", timeout=60)
    result.assert_outcomes(passed=11)


FLUSHED = """
import logging
from pathlib import Path

from celery import Celery

from celery_redlock import LockedTask, metrics

pytest_plugins = ["celery_redlock.testing.pytest_plugin"]

app = Celery("flushed", set_as_current=False)
app.conf.task_always_eager = True


@app.task(base=LockedTask, lock_by=())
def counted():
    return "ran"


def pytest_unconfigure(config):
    # After the session's teardown (the server is gone): a flush logs what it could not write.
    logger = logging.getLogger("celery_redlock.metrics")
    handler = logging.FileHandler("flush.log")
    logger.addHandler(handler)
    try:
        metrics.flush()
    finally:
        logger.removeHandler(handler)
        handler.close()
"""

COUNTS_AT_THE_END = """
from conftest import app, counted


def test_counts_to_the_end(configure_redlock):
    configure_redlock(app)
    assert counted.delay().get() == "ran"  # acquired and released: counted, not yet written
"""


def test_counts_left_at_the_end_of_the_session_are_not_flushed_to_its_stopped_server(
    pytester: pytest.Pytester,
) -> None:
    """Helper probe, round 3: every xdist run ended with a WARNING "could not flush lock
    counters to redlock:stats:... Connection refused": the last test's counts, written by the
    background flush after the session's server had stopped."""
    pytester.makeconftest(FLUSHED)
    pytester.makepyfile(test_counts=COUNTS_AT_THE_END)
    result = pytester.runpytest_subprocess("-q", "-p", "no:celery", timeout=60)
    result.assert_outcomes(passed=1)
    assert (pytester.path / "flush.log").read_text() == ""


WAITS = """
import pathlib, time

def test_waits(redlock_server):
    pathlib.Path("server.pid").write_text(str(redlock_server.process.pid))
    time.sleep(60)  # until the signal
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_sigterm_or_sighup_to_pytest_still_stops_the_server(
    pytester: pytest.Pytester, signum: signal.Signals
) -> None:
    """A CI job's cancel sends SIGTERM, a closed terminal SIGHUP: the session's server, in a
    session of its own, used to outlive pytest."""
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_waits=WAITS)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:celery"]
    run = subprocess.Popen(command, cwd=pytester.path, stdout=subprocess.PIPE, text=True)
    pid_file = pytester.path / "server.pid"
    try:
        wait_until(lambda: pid_file.exists() and pid_file.read_text(), 30, "the test to start")
        server = int(pid_file.read_text())
        run.send_signal(signum)
        out, _ = run.communicate(timeout=30)
    finally:
        run.kill()
    assert "KeyboardInterrupt" in out
    with pytest.raises(ProcessLookupError):  # the fixture waited for it: gone, not a zombie
        os.kill(server, 0)


def test_the_plugin_is_opt_in() -> None:
    plugins = metadata.entry_points(group="pytest11")
    assert not [ep for ep in plugins if ep.value.startswith("celery_redlock")]


def test_helpers_see_an_in_process_worker(app: Celery, r: redis_py.Redis) -> None:
    @app.task(base=LockedTask, lock_by=(), lock_limit=2)
    def pair() -> str:
        return "ran"

    with running_worker(app), record_lock_events() as events:
        with hold_lock(pair) as held:
            assert len(held) == 2  # every slot of the semaphore
            skipped = pair.delay()
            assert skipped.get(timeout=10) is None
        ran = pair.delay()
        assert ran.get(timeout=10) == "ran"
        assert_skipped(skipped)
        assert_acquired(ran, events)
        (contended,) = events.contended(skipped)
        assert (contended.holder, contended.policy, contended.task) == (HOLDER, "skip", pair.name)
        assert contended.key in {lock_key(pair), lock_key(pair) + ":2"}
    assert events.skipped(skipped.id) and not events.skipped(ran)
    with pytest.raises(AssertionError, match="was not skipped"):
        assert_skipped(ran, events)


def test_hold_lock_refuses_a_key_that_is_held(app: Celery) -> None:
    @app.task(base=LockedTask, lock_by=["x"])
    def work(x: int) -> None: ...

    def nested() -> Any:
        with hold_lock(work, 1), hold_lock(work, x=1):
            pass

    with pytest.raises(RuntimeError, match="already held"):
        nested()
    with hold_lock(work, 1):  # the failed attempt left nothing behind
        pass


def test_hold_lock_and_lock_key_pass_every_keyword_to_the_task(
    app: Celery, r: redis_py.Redis
) -> None:
    """Helper probe, round 3: ``hold_lock(refresh, "k", ttl=10)`` took ``ttl`` for its own
    holder TTL and held the key of ``refresh("k")``, so ``refresh.delay("k", ttl=10)`` ran;
    a parameter named ``task`` was "multiple values for argument 'task'"."""

    @app.task(base=LockedTask, lock_by=["key", "ttl", "task"])
    def refresh(key: str, ttl: int = 300, task: str = "all") -> None: ...

    expected = lock_key(refresh, "k", ttl=10, task="export")
    assert expected != lock_key(refresh, "k")
    with hold_lock(refresh, "k", ttl=10, task="export") as held:
        assert [lock.key for lock in held] == [expected]
        assert held[0].auto_renew  # held for as long as the block runs
        assert r.get(expected) is not None
    assert r.get(expected) is None
    with record_lock_events(), pytest.raises(TypeError, match="expected the AsyncResult of"):
        assert_skipped(None)
