"""An opt-in pytest plugin: a throwaway Redis for locks and helpers to assert on lock outcomes.

Enable it in your top-level ``conftest.py`` (it is not loaded automatically)::

    pytest_plugins = ["celery_redlock.testing.pytest_plugin"]

Fixtures:

* ``redlock_server`` (session): a ``redis-server`` on a free loopback port
  (:class:`celery_redlock.testing.RedisServer`), killed at the end of the session, also when
  pytest is ended by SIGTERM (what a CI job's cancel, ``timeout`` or ``docker stop`` send) or
  SIGHUP (a closed terminal, a dropped ssh session): while it runs, such a signal that nothing
  else handles is raised in pytest as ``KeyboardInterrupt``, so the session's teardown still
  stops the server (which runs in a session of its own, out of reach of the signals sent to
  pytest's process group). In a pytest-xdist worker it is also stopped, and its folder
  removed, as soon as the worker's parent (the controller) is gone (:func:`_orphan_stops`);
* ``redlock_url``: its URL, the database emptied before each test;
* ``configure_redlock``: ``configure_redlock(app)`` points an app's locks at ``redlock_url``
  (also when its settings were already resolved) and returns the app; the app gets its own
  ``redlock_url`` back when the test ends;
* ``lock_events``: the lock signals sent during the test (:class:`LockEvents`), which also
  makes :func:`assert_skipped` / :func:`assert_acquired` work without an argument.

Helpers, importable from :mod:`celery_redlock.testing`: :func:`hold_lock`,
:func:`record_lock_events`, :func:`assert_skipped`, :func:`assert_acquired`.

With Celery's classic fixtures (``celery_app``, ``celery_worker`` from
``celery.contrib.pytest``), return ``redlock_url`` as ``broker_url``, ``result_backend`` and
``redlock_url`` from a function-scoped ``celery_config`` fixture (or ``redlock_server.url`` from
a session-scoped one). pytest-celery 1.x loads the classic fixtures but shadows
``celery_worker`` with its Docker worker: import ``celery_worker`` from
``celery.contrib.pytest`` in ``conftest.py`` to get the in-process one back. The recipe is in
``docs/testing.md``.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
from collections.abc import Callable, Generator, Iterator
from typing import Any

import pytest

from .. import metrics
from .._celery.options import reset_settings
from ._assertions import LockEvents, record_lock_events, use_redlock_url
from ._server import RedisServer

__all__ = ["configure_redlock", "lock_events", "redlock_server", "redlock_url"]


@pytest.fixture(scope="session")
def redlock_server(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    """A throwaway ``redis-server`` for the whole session. Counts still to be written to it
    are dropped before it stops: the background flush logged a WARNING ("could not flush lock
    counters ... Connection refused") after every session of an xdist worker."""
    worker = hasattr(request.config, "workerinput")  # a pytest-xdist worker
    with _signals_interrupt(), RedisServer() as server, _orphan_stops(server, worker):
        try:
            yield server
        finally:
            metrics.forget(server.url)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _default_in_child() -> None:
    """In a child forked while :func:`_signals_interrupt` runs: SIGTERM and SIGHUP get their
    default action back. Timeline without: (1) a test forks a ``multiprocessing`` child; (2)
    ``terminate()`` sends it SIGTERM; (3) the child raised ``KeyboardInterrupt`` (exit code 1,
    a traceback) instead of ending by the signal, but only after a test that used the
    server: the outcome hung on the order of the tests."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) is _interrupt:
            signal.signal(signum, signal.SIG_DFL)


os.register_at_fork(after_in_child=_default_in_child)


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    """Raise SIGTERM and SIGHUP as ``KeyboardInterrupt`` while inside, each that still has its
    default action (a handler of the user's, or a thread other than the main one, is left
    alone), in this process only (:func:`_default_in_child`). Timeline without it: (1) the
    server starts in a session of its own; (2) a CI cancel sends SIGTERM to pytest (a closed
    terminal, SIGHUP), which dies at once; (3) no teardown runs: the server lives on."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    taken = [s for s in (signal.SIGTERM, signal.SIGHUP) if signal.getsignal(s) is signal.SIG_DFL]
    for signum in taken:
        signal.signal(signum, _interrupt)
    try:
        yield
    finally:
        for signum in taken:
            signal.signal(signum, signal.SIG_DFL)


@contextlib.contextmanager
def _orphan_stops(server: RedisServer, enabled: bool) -> Iterator[None]:
    """While inside, stop ``server`` and remove its folder as soon as this process's parent
    is gone (``enabled``: in a pytest-xdist worker, whose parent is the controller). Timeline
    without it, for a SIGTERM sent to the main pytest process alone (``kill``, ``timeout``,
    ``docker stop``):

    1. the controller, which runs no test and so installed no handler, dies at once;
    2. its workers get no signal; execnet sees their input end, sends each a SIGINT 5 s later
       (ignored in a process started in the background by a shell) and calls ``os._exit``
       10 s after that;
    3. no teardown runs: every worker's server lives on, and its folder stays.

    A watcher thread waits for the parent's exit (on a pidfd where the system has them, else
    it looks at ``os.getppid()`` 5 times a second) or for the end of the block; the worker's
    own test carries on against a stopped server until execnet ends the worker."""
    parent = os.getppid()
    if not enabled or parent == 1:
        yield
        return
    wake_read, wake_write = os.pipe()
    watcher = threading.Thread(
        target=_watch_parent,
        args=(parent, wake_read, lambda: server.__exit__(None, None, None)),
        name="redlock-orphan-watcher",
        daemon=True,
    )
    watcher.start()
    try:
        yield
    finally:
        try:
            os.write(wake_write, b"x")
            watcher.join()  # before the server's own teardown (which stop() also guards)
        finally:
            os.close(wake_read)
            os.close(wake_write)


def _watch_parent(parent: int, wake: int, orphaned: Callable[[], None]) -> None:
    """Call ``orphaned`` once process ``parent`` is no longer this process's parent; return
    without calling it when ``wake`` becomes readable."""
    pidfd = None
    with contextlib.suppress(AttributeError, OSError):  # no pidfd_open: not Linux 5.3+
        pidfd = os.pidfd_open(parent)
    try:
        watched = [wake] if pidfd is None else [wake, pidfd]
        while True:
            if os.getppid() != parent:  # also when it died before pidfd_open (a reused pid)
                orphaned()
                return
            ready, _, _ = select.select(watched, [], [], 0.2 if pidfd is None else None)
            if wake in ready:
                return
            if pidfd is not None and pidfd in ready:  # the parent exited
                orphaned()
                return
    finally:
        if pidfd is not None:
            os.close(pidfd)


@pytest.fixture
def redlock_url(redlock_server: RedisServer) -> str:
    """The URL of the session's server; its database is emptied before each test, and the
    counts earlier tests left to be written there are dropped (:func:`metrics.forget`)."""
    metrics.forget(redlock_server.url)
    client = redlock_server.client()
    try:
        client.flushdb()
    finally:
        client.close()
    return redlock_server.url


@pytest.fixture
def configure_redlock(redlock_url: str) -> Iterator[Callable[[Any], Any]]:
    """``configure_redlock(app)``: the app's locks go to ``redlock_url``; returns the app.

    When the test ends, each app gets back the ``redlock_url`` it had (none, or the value its
    configuration gives), and resolves its settings again. Timeline without: (1) a test
    configures the project's app; (2) a later test forgets to, and passes, locking on the
    plugin's server; (3) in another order it runs first and locks on the app's own URL (the
    developer's Redis), or fails: the outcome hung on the order of the tests.
    """
    restores: list[Callable[[], None]] = []

    def configure(app: Any) -> Any:
        changes = app.conf.changes  # what was set on top of the app's configuration
        had, before = "redlock_url" in changes, changes.get("redlock_url")

        def restore() -> None:
            if had:
                changes["redlock_url"] = before
            else:
                changes.pop("redlock_url", None)
            reset_settings(app)

        restores.append(restore)
        return use_redlock_url(app, redlock_url)

    yield configure
    for restore in reversed(restores):
        restore()


@pytest.fixture
def lock_events() -> Iterator[LockEvents]:
    """The lock signals sent in this process during the test."""
    with record_lock_events() as events:
        yield events


#: Said under a test whose ``celery_worker`` failed to start a Docker container.
DOCKER_WORKER_HINT = (
    "celery_worker here is pytest-celery's worker in a Docker container, which shadows "
    "Celery's in-process one; for the in-process worker, add to conftest.py:\n"
    "    from celery.contrib.pytest import celery_worker  # noqa: F401\n"
    "(or disable pytest-celery with -p no:celery and list celery.contrib.pytest in "
    "pytest_plugins); see celery-redlock's docs/testing.md"
)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    """Name the fix under a test whose ``celery_worker`` failed in Docker. Timeline without:
    (1) a user enables this plugin beside pytest-celery, and leaves out the recipe's import
    of ``celery_worker``; (2) pytest-celery's Docker worker shadows the in-process one; (3)
    on a machine without Docker every such test errors in its setup with ``DockerException:
    Error while fetching server API version``, which names neither the shadowing nor the
    one-line fix."""
    outcome = yield
    error = call.excinfo
    if (
        call.when == "setup"
        and error is not None
        and type(error.value).__module__.split(".")[0] == "docker"
        and "celery_worker" in getattr(item, "fixturenames", ())
        and item.config.pluginmanager.has_plugin("celery")
    ):
        report = outcome.get_result()
        if hasattr(report.longrepr, "addsection"):
            report.longrepr.addsection("celery-redlock", DOCKER_WORKER_HINT)
        else:
            report.sections.append(("celery-redlock", DOCKER_WORKER_HINT))
