"""The connection pool of the clients built from a ``redis://``, ``rediss://`` or ``unix://``
URL: redis-py's plain pool, which waits for a free connection when all of them are in use.

redis-py's ``BlockingConnectionPool`` waits too, but every command it serves takes and gives
back its connection through a ``queue.LifoQueue`` (a condition variable and its locks, in
Python) and times the wait: 67,601 instructions per command for the connection, against 62,430
from the plain pool (docs/benchmarks.md). :class:`WaitingPool` takes the plain pool's path
(one lock, in C) while a connection is free, and waits only when all :attr:`max_connections`
are out (65,967).

The wait, as a timeline (100 connections, 101 threads):

1. threads 1 to 100 each hold a connection; thread 101 asks, and the plain pool refuses it
   ("Too many connections");
2. thread 101 waits on :attr:`WaitingPool.timeout` (the URL's socket timeout, 5 s unless it
   sets one), and asks again each time a connection comes back;
3. a connection is back within the timeout: thread 101 runs its command; none is back: it
   fails with redis-py's ``ConnectionError("No connection available.")``, as the blocking
   pool's, and the lock names the pool, not the server (:func:`~.core.unavailable`).

This module never imports Celery.
"""

from __future__ import annotations

import inspect
import threading
import time
from typing import Any

import redis as redis_py

#: The plain pool's refusal when all its connections are out (redis-py 5 to 8).
_FULL = ("Too many connections",)


class WaitingPool(redis_py.ConnectionPool):
    """redis-py's plain pool that, with every connection out, waits up to :attr:`timeout`
    seconds for one to come back instead of failing (module docstring)."""

    #: Seconds a caller waits for a free connection when all are out.
    timeout: float = 5.0

    def reset(self) -> None:
        """The plain pool's reset (in a forked child too), and no one waiting."""
        super().reset()
        self._returned = threading.Condition(threading.Lock())
        self._waiting = 0
        self._given_back = 0

    def get_connection(self, *args: Any, **options: Any) -> Any:
        """A connected connection: the plain pool's, or the first one given back within
        :attr:`timeout` when all are out."""
        try:
            return super().get_connection(*args, **options)
        except redis_py.ConnectionError as exc:
            if exc.args != _FULL:
                raise
        return self._wait(args, options)

    #: Read by :func:`~.commands.connection_of`, which passes a command's name only to a pool
    #: that wants one (redis-py < 5.3).
    get_connection.__signature__ = inspect.signature(  # type: ignore[attr-defined]
        redis_py.ConnectionPool.get_connection
    )

    def _wait(self, args: tuple[Any, ...], options: dict[str, Any]) -> Any:
        deadline = time.monotonic() + self.timeout
        with self._returned:
            self._waiting += 1
        try:
            while True:
                with self._returned:
                    seen = self._given_back
                try:
                    return super().get_connection(*args, **options)
                except redis_py.ConnectionError as exc:
                    if exc.args != _FULL:
                        raise
                with self._returned:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise redis_py.ConnectionError("No connection available.") from None
                    if self._given_back == seen:
                        self._returned.wait(left)
        finally:
            with self._returned:
                self._waiting -= 1

    def release(self, connection: Any) -> None:
        """The plain pool's release, and a wake-up for one caller waiting for a connection.

        A waiter that counted the connections given back before its last try sees the count
        move, so a connection given back between its try and its wait is not missed."""
        super().release(connection)
        if self._waiting:
            with self._returned:
                self._given_back += 1
                self._returned.notify()
