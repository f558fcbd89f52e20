"""Celery workers for tests: ``celery worker`` subprocesses, each in its own process group and
logging to a file (:class:`WorkerProcess`), and the in-process worker of the integration tier
(:func:`running_worker`, with :class:`Holder` to keep a task inside its body).

One subprocess class for the end-to-end tests, the benchmarks and the chaos checkers. Callers
synchronize on events: the worker's log lines (``ready.``), keys its tasks write, task results;
never on a guessed sleep. A worker is started either at once (:meth:`WorkerProcess.start`:
launch and wait until ready) or in two steps, so that several boot in parallel
(:meth:`~WorkerProcess.launch`, then :meth:`~WorkerProcess.ready`), and it can be started again
after it was killed.

Hazard, and why :meth:`WorkerProcess.kill` and :meth:`~WorkerProcess.join` signal the group
only while the main process is not reaped:

1. the worker's main process leads its process group, whose id is its pid;
2. once that process is reaped, the pid, hence the group id, may go to an unrelated process;
3. a ``killpg`` after that could kill somebody else: so the group is killed before the
   ``wait()`` that reaps the main process, never after (``join`` watches for the exit without
   reaping, with ``waitid(WNOWAIT)``).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

from celery import Celery, bootsteps
from celery.contrib.testing.worker import start_worker
from kombu.asynchronous import set_event_loop

from celery_redlock.testing import wait_until
from support import ROOT, procfs


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment with the repository root first on ``PYTHONPATH``, plus
    ``extra``: what a subprocess needs to import ``support``, ``tests`` or ``chaos``."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


class WorkerProcess:
    """``celery -A <app> worker`` in its own process group, logging to a file.

    :param port: the test's redis-server, passed as ``REDLOCK_TEST_PORT`` (``None``: the app
        reads its servers from ``env``).
    :param name: the node name is ``<name>@%h``.
    :param args: more command-line arguments (``-Q``, ``-E``, ...).
    :param env: more environment variables (``REDLOCK_TEST_*`` knobs of the app).
    :param app: the ``-A`` module.
    :param log: the log file (appended to on each start); a fresh temporary file by default.
    :param stderr: where stderr goes (appended); discarded by default.
    """

    #: The log line that says the process is ready.
    READY: ClassVar[str] = r"ready\."

    def __init__(
        self,
        port: int | None,
        name: str = "w1",
        concurrency: int = 2,
        pool: str = "prefork",
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        *,
        app: str,
        log: Path | None = None,
        stderr: Path | None = None,
    ) -> None:
        self.name = name
        self.app = app
        self.concurrency = concurrency
        if log is None:
            fd, path = tempfile.mkstemp(prefix=f"worker-{name}-", suffix=".log")
            os.close(fd)
            log = Path(path)
        self.log = log
        self.stderr = stderr
        self.cmd = self.command(pool, concurrency, args)
        self.env = child_env(
            **({"REDLOCK_TEST_PORT": str(port)} if port is not None else {}), **(env or {})
        )
        self.process: subprocess.Popen[bytes] | None = None
        #: How many times it was launched.
        self.starts = 0
        self._offset = 0  # size of the log when last launched: readiness is looked for after

    def command(self, pool: str, concurrency: int, args: Sequence[str]) -> list[str]:
        return [
            sys.executable,
            "-m",
            "celery",
            "-A",
            self.app,
            "worker",
            "-P",
            pool,
            "-c",
            str(concurrency),
            "-n",
            f"{self.name}@%h",
            "-l",
            "INFO",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "--logfile",
            str(self.log),
            *args,
        ]

    # -- starting -------------------------------------------------------------------------------

    def launch(self) -> WorkerProcess:
        """Start the process without waiting for it; :meth:`ready` waits."""
        self._offset = self.log.stat().st_size if self.log.exists() else 0
        with contextlib.ExitStack() as stack:
            err = (
                stack.enter_context(self.stderr.open("ab"))
                if self.stderr is not None
                else subprocess.DEVNULL
            )
            self.process = subprocess.Popen(
                self.cmd,
                cwd=ROOT,
                env=self.env,
                start_new_session=True,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        self.starts += 1
        return self

    def is_ready(self) -> bool:
        """Whether the process runs and logged :attr:`READY` since it was launched."""
        return self.alive and re.search(self.READY, self.text(since_launch=True)) is not None

    def ready(self, timeout: float = 30.0) -> WorkerProcess:
        """Wait until :meth:`is_ready`; :class:`AssertionError` (with the log's end) if the
        process exits first or ``timeout`` passes."""
        self.wait_for_log(self.READY, timeout, since_launch=True)
        return self

    def start(self, timeout: float = 30.0) -> WorkerProcess:
        """Launch and wait until ready; kill the group if it never gets ready."""
        self.launch()
        try:
            return self.ready(timeout)
        except BaseException:
            self.kill()
            raise

    # -- watching -------------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        assert self.process is not None, f"worker {self.name} was never started"
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def text(self, since_launch: bool = False) -> str:
        """The log so far (since the last launch only, with ``since_launch``)."""
        if not self.log.exists():
            return ""
        with self.log.open("rb") as f:
            f.seek(self._offset if since_launch else 0)
            return f.read().decode(errors="replace")

    def wait_for_log(
        self, pattern: str, timeout: float = 30.0, since_launch: bool = False
    ) -> re.Match[str]:
        """The first match of ``pattern`` in the log, waiting up to ``timeout`` seconds."""

        def found() -> re.Match[str] | None:
            if self.process is not None and self.process.poll() is not None:
                raise AssertionError(f"worker {self.name} exited:\n{self.text()[-3000:]}")
            return re.search(pattern, self.text(since_launch))

        match = wait_until(found, timeout, f"/{pattern}/ in {self.log}")
        assert match is not None
        return match

    def log_time(self, pattern: str, timeout: float = 10.0) -> float:
        """Wall-clock time (``time.time()``) of the first log record matching ``pattern``
        (waiting for it up to ``timeout``), from the record's timestamp (1 ms resolution)."""
        found = self.wait_for_log(pattern, timeout)
        stamps = list(_LOG_STAMP.finditer(self.text(), 0, found.start() + 1))
        assert stamps, f"no timestamp before /{pattern}/"
        stamp = datetime.datetime.strptime(stamps[-1].group(1), "%Y-%m-%d %H:%M:%S,%f")
        return stamp.timestamp()

    def children(self) -> list[int]:
        """The pool children now (``[]`` when the worker is not running)."""
        return procfs.children(self.pid) if self.alive else []

    # -- stopping -------------------------------------------------------------------------------

    def send(self, sig: int) -> None:
        """Send ``sig`` to the main process (if it still runs)."""
        if self.alive:
            os.kill(self.pid, sig)

    def _exited(self) -> bool:
        """Whether the main process exited, without reaping it: a zombie keeps its pid, hence
        the group id, ours."""
        assert self.process is not None
        if self.process.returncode is not None:
            return True
        return os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None

    def join(self, timeout: float = 20.0) -> bool:
        """Wait for the process to exit; SIGKILL the group after ``timeout``. True if it
        exited by itself (then also SIGKILL pool children it left behind, if any)."""
        if self.process is None:
            return True
        try:
            wait_until(self._exited, timeout, f"worker {self.name} to exit")
        except AssertionError:
            self.kill()
            return False
        if self.process.returncode is None:  # not reaped yet: the group id is still ours
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
        self.process.wait()
        return True

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Send ``sig`` (a warm shutdown by default) and return the exit status; raise
        :class:`AssertionError` (after killing the group) if it runs after ``timeout``."""
        if self.process is None:
            return 0
        self.send(sig)
        if not self.join(timeout):
            raise AssertionError(f"worker {self.name} still ran {timeout}s after signal {sig}")
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL the whole process group (main process and pool children) and reap it."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def run_to_exit(self, timeout: float = 30.0) -> tuple[int, str]:
        """Run until the process exits by itself (one that refuses to start); return its exit
        status and everything it printed, its log file included.

        Raises :class:`AssertionError` (after killing its group) if it runs after ``timeout``.
        """
        process = subprocess.Popen(
            self.cmd,
            cwd=ROOT,
            env=self.env,
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            raise AssertionError(
                f"worker {self.name} still runs after {timeout}s:\n{output[-3000:]}"
            ) from None
        return process.returncode, output + self.text()

    def __enter__(self) -> WorkerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()


_LOG_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): ", re.MULTILINE)


class PollTick(bootsteps.StartStopStep):
    """A timer that runs the in-process worker's event loop at least every 0.1 s.

    Kombu 5.3 (the floor; 5.7 has no such wait) stops the Redis transport's ``BRPOP`` while the
    prefetch window is full, and starts it again only at the event loop's next turn, which waits
    for the next timer, up to 10 s:

    1. a worker with one pool thread holds four messages, and a fifth waits in the broker;
    2. the four end; nothing is read on any socket, and no timer is due for seconds;
    3. the fifth is fetched up to 10 s later, however soon it was due.

    A worker in production meets the same wait; a test would only be slower for it (47 s of a
    run of the lowest dependencies' tiers). The tick changes nothing but how soon the loop
    turns.
    """

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def start(self, c: Any) -> None:
        c.timer.call_repeatedly(0.1, _nothing)


def _nothing() -> None:
    """The tick of :class:`PollTick`: the turn of the loop is what it is for."""


@contextlib.contextmanager
def running_worker(app: Celery, pool: str = "threads", concurrency: int = 4) -> Iterator[Any]:
    """An in-process worker, with :class:`PollTick`; register tasks on ``app`` before
    entering."""
    app.steps["consumer"].add(PollTick)
    try:
        with start_worker(
            app,
            pool=pool,
            concurrency=concurrency,
            perform_ping_check=False,
            loglevel="INFO",
            shutdown_timeout=30,
        ) as worker:
            yield worker
    finally:
        # kombu < 5.6.1 keeps a stopped worker's hub as the global event loop, and the next
        # in-process worker would put its ETA (countdown, retry) messages on that dead hub.
        set_event_loop(None)


def control_ready(app: Celery, worker: Any) -> None:
    """Wait until the in-process ``worker`` answers a control ping. ``running_worker`` returns
    once its consumer is ready, which may be before its pidbox subscription is: a broadcast
    (``revoke``) sent in between is lost, as a Redis ``PUBLISH`` without a subscriber is."""
    wait_until(
        lambda: app.control.ping([worker.hostname], timeout=0.5, limit=1),
        10,
        f"worker {worker.hostname} to answer a control ping",
    )


class Holder:
    """Holds a task inside its body until the test opens the gate."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.gate = threading.Event()

    def hold(self) -> None:
        self.entered.set()
        assert self.gate.wait(20), "test never opened the gate"
