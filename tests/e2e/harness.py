"""Real ``celery worker`` subprocesses for the end-to-end tests.

Tests synchronize on events: the worker's log lines (``ready.``), keys the tasks write, and
task results; never on a guessed sleep.
"""

from __future__ import annotations

import datetime
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from celery import Celery

from celery_redlock.testing import wait_until

ROOT = Path(__file__).resolve().parents[2]

__all__ = ["ROOT", "WorkerProcess", "wait_until"]


class WorkerProcess:
    """``celery -A tests.e2e.proj worker`` in its own process group, logging to a file."""

    def __init__(
        self,
        port: int,
        name: str = "w1",
        concurrency: int = 2,
        pool: str = "prefork",
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        app: str = "tests.e2e.proj",
    ) -> None:
        self.name = name
        self.log = Path(tempfile.mkstemp(prefix=f"worker-{name}-", suffix=".log")[1])
        self.cmd = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            app,
            "worker",
            "-P",
            pool,
            "-c",
            str(concurrency),
            "-n",
            f"{name}@%h",
            "-l",
            "INFO",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "--logfile",
            str(self.log),
            *args,
        ]
        self.env = {
            **os.environ,
            "REDLOCK_TEST_PORT": str(port),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            **(env or {}),
        }
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> WorkerProcess:
        self.process = subprocess.Popen(
            self.cmd,
            cwd=ROOT,
            env=self.env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        self.wait_for_log(r"ready\.", timeout)
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for_log(self, pattern: str, timeout: float = 30.0) -> re.Match[str]:
        def found() -> re.Match[str] | None:
            if self.process is not None and self.process.poll() is not None:
                raise AssertionError(f"worker {self.name} exited:\n{self.text()[-3000:]}")
            return re.search(pattern, self.text())

        return wait_until(found, timeout, f"/{pattern}/ in {self.log}")  # type: ignore[return-value]

    def children(self) -> list[int]:
        path = Path(f"/proc/{self.pid}/task/{self.pid}/children")
        return [int(p) for p in path.read_text().split()] if path.exists() else []

    def send(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Send ``sig`` and wait for the worker to exit; SIGKILL the group if it does not."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        os.kill(self.pid, sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        """SIGKILL the whole process group (worker and pool children)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.pid, signal.SIGKILL)
            self.process.wait()

    def __enter__(self) -> WorkerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()


def layout_app(name: str, base: str, **conf: Any) -> Celery:
    """A Celery app on one test redis-server at ``base`` (``redis://host:port``).

    Every test and benchmark app uses the same layout: db 0 holds the locks (``redlock_url``
    unless ``conf`` names another), 1 the broker, 2 the results; tasks record in db 3.
    """
    set_as_current = conf.pop("set_as_current", True)
    app = Celery(name, broker=f"{base}/1", backend=f"{base}/2", set_as_current=set_as_current)
    app.conf.update(
        {"redlock_url": f"{base}/0", "broker_connection_retry_on_startup": True, **conf}
    )
    return app


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (Linux ``/proc``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


_LOG_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): ", re.MULTILINE)


def log_time(worker: WorkerProcess, pattern: str, timeout: float = 10.0) -> float:
    """Wall-clock time (``time.time()``) of the first log record of ``worker`` matching
    ``pattern`` (waiting for it up to ``timeout``)."""
    found = worker.wait_for_log(pattern, timeout)
    stamps = list(_LOG_STAMP.finditer(worker.text(), 0, found.start() + 1))
    assert stamps, f"no timestamp before /{pattern}/"
    stamp = datetime.datetime.strptime(stamps[-1].group(1), "%Y-%m-%d %H:%M:%S,%f")
    return stamp.timestamp()


def wait_for_change(
    predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.002
) -> float:
    """Poll ``predicate`` tightly until it is true; return the ``time.time()`` it was seen.

    For latency measurements (kill → lock released): 2 ms resolution.
    """
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
    return time.time()


def watch_events(
    events: dict[str, Callable[[], object]], timeout: float, interval: float = 0.002
) -> dict[str, float]:
    """Poll every predicate tightly until all have been true once; return when each first was.

    Times are ``time.time()`` values, 2 ms resolution: for ordering and latency measurements
    (a child's death versus its lock's release, say).
    """
    seen: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(seen) < len(events):
        now = time.time()
        for name, predicate in events.items():
            if name not in seen and predicate():
                seen[name] = now
        if len(seen) == len(events):
            break
        if time.monotonic() > deadline:
            missing = sorted(set(events) - set(seen))
            raise AssertionError(f"timed out after {timeout}s waiting for {missing}")
        time.sleep(interval)
    return seen


#: The two public APIs, and the task of ``tests.e2e.proj`` playing each role under each: a test
#: parametrized over ``API_TASKS`` picks its task by role (the twins share one lock).
API_TASKS: dict[str, dict[str, str]] = {
    "task": {"ending": "ending", "waiter": "waiter", "critical": "critical"},
    "decorator": {"ending": "plain_ending", "waiter": "plain_waiter", "critical": "plain_critical"},
}


def run_to_exit(worker: WorkerProcess, timeout: float = 30.0) -> tuple[int, str]:
    """Run ``worker`` until it exits by itself (a worker that refuses to start); return its
    exit status and everything it printed, its log file included.

    Raises :class:`AssertionError` (after killing its process group) if it still runs after
    ``timeout`` seconds.
    """
    process = subprocess.Popen(
        worker.cmd,
        cwd=ROOT,
        env=worker.env,
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
            f"worker {worker.name} still runs after {timeout}s:\n{output[-3000:]}"
        ) from None
    return process.returncode, output + worker.text()
