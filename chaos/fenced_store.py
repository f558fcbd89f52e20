"""A PostgreSQL store that accepts a write only with a newer fencing token, and logs them all.

The guard is the guide's recipe (``docs/guide.md``, "A fenced PostgreSQL store"), its very
statement: an upsert that writes only where the stored token is not higher than the writer's,
``INSERT ... ON CONFLICT (key) DO UPDATE ... WHERE state.fence <= EXCLUDED.fence`` (equal: the
same holder writing again), with the writer in place of the balance. Every write, accepted or
not, is appended to a log in the order PostgreSQL applied it: the upsert locks the key's row
whether or not its ``WHERE`` lets the update through (PostgreSQL's ``ON CONFLICT DO UPDATE``
locks every conflicting row), and the log ``INSERT`` follows in the same transaction, so the
log's ``seq`` order per key is the store's own order of writes. The history checker
(:mod:`chaos.history`) reads it back, with each write's writer, as
:class:`~chaos.history.StoreWrite`. Its "stale writes accepted" check therefore tests this
statement under real concurrency: it can only fail if the guard itself is wrong.

A connection belongs to the thread, and the process, that made it. It is in autocommit mode,
each write one explicit transaction: a read through :meth:`FencedStore.connection` would
otherwise leave a transaction open, every later write would become a savepoint inside it
(reported accepted, never committed), and its row lock would block every other writer of the
key. Threads sharing one connection nested their transactions out of order the same way.

A prefork worker's pool children are forks: (1) a parent writes, making its connection; (2) it
forks; (3) the child writes. Had the child used the inherited connection, both would speak on
one socket and their statements and replies would interleave (a write applied in the wrong
transaction, a reply read by the wrong process), and closing it in the child would end the
parent's session. So the store remembers the pid that made its connection: a child makes its
own, and leaves the parent's alone.

Each run has its own two tables, named after a run id (``faults_<id>_state`` and
``faults_<id>_log``), dropped by :meth:`FencedStore.drop`.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Any

import psycopg

from chaos.history import StoreWrite

#: The local PostgreSQL of the machine: trust authentication, database ``test``.
DEFAULT_DSN = "host=127.0.0.1 port=5432 dbname=test user=postgres connect_timeout=5"


class FencedStore:
    """The two tables of one run, and the fenced write.

    :param run: the run id (letters, digits, ``_``): part of the table names.
    :param dsn: a libpq connection string.
    """

    def __init__(self, run: str, dsn: str = DEFAULT_DSN) -> None:
        if not re.fullmatch(r"[a-z0-9_]{1,40}", run):
            raise ValueError(f"run id must be 1-40 of [a-z0-9_], got {run!r}")
        self.dsn = dsn
        self.state = f"faults_{run}_state"
        self.log = f"faults_{run}_log"
        self._local = threading.local()
        #: Every connection made, with the pid of the process that made it (``append`` is
        #: atomic: no lock, which a fork could inherit held).
        self._made: list[tuple[int, Any]] = []

    def connection(self) -> Any:
        """This thread's connection (made on first use: a forked child makes its own)."""
        conn, pid = getattr(self._local, "conn", None), getattr(self._local, "pid", 0)
        # One inherited across a fork is the parent's, never to be used or closed here (it is
        # dropped; psycopg does not end a connection another process made).
        if conn is None or pid != os.getpid() or conn.closed:
            conn = psycopg.connect(self.dsn, autocommit=True)
            self._local.conn, self._local.pid = conn, os.getpid()
            self._made.append((os.getpid(), conn))
        return conn

    def create(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(
                f"CREATE TABLE {self.state} (key text PRIMARY KEY, fence bigint NOT NULL,"
                " writer text NOT NULL)"
            )
            conn.execute(
                f"CREATE TABLE {self.log} (seq bigserial PRIMARY KEY, key text NOT NULL,"
                " fence bigint NOT NULL, writer text NOT NULL, accepted boolean NOT NULL,"
                " at timestamptz NOT NULL DEFAULT clock_timestamp())"
            )

    def write(self, key: str, token: int, writer: str) -> bool:
        """Write ``writer`` to ``key`` through ``token``: True if the store accepted it (no
        write with a larger token came first).

        :raises TypeError: ``token`` is no :class:`int` (a :class:`bool` neither). PostgreSQL
            would convert it for the ``bigint`` column, and the guard would compare what it
            made of it. Timeline: (1) the holder with token 11 writes; (2) an older holder
            writes through ``10.6``; (3) PostgreSQL rounds it to 11, the guard lets an equal
            token through, and the stale write is accepted (``"10"`` was cast likewise).
        """
        if isinstance(token, bool) or not isinstance(token, int):
            raise TypeError(f"a fencing token is an int, got {token!r} ({type(token).__name__})")
        conn = self.connection()
        with conn.transaction():
            accepted = (
                conn.execute(
                    f"INSERT INTO {self.state} VALUES (%s, %s, %s) ON CONFLICT (key) DO UPDATE"
                    " SET fence = EXCLUDED.fence, writer = EXCLUDED.writer"
                    f" WHERE {self.state}.fence <= EXCLUDED.fence",
                    (key, token, writer),
                ).rowcount
                == 1
            )
            conn.execute(
                f"INSERT INTO {self.log} (key, fence, writer, accepted) VALUES (%s, %s, %s, %s)",
                (key, token, writer, accepted),
            )
        return bool(accepted)

    def writes(self) -> list[StoreWrite]:
        """The log, in the store's order, each write with the time it was applied (seconds
        since the epoch, from PostgreSQL's ``clock_timestamp()``: this machine's clock, which
        the workers' events are stamped with too)."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            rows = conn.execute(
                f"SELECT seq, key, fence, accepted, writer, extract(epoch FROM at)"
                f" FROM {self.log} ORDER BY seq"
            )
            return [
                StoreWrite(int(s), str(k), int(f), bool(a), str(w), float(t))
                for s, k, f, a, w, t in rows
            ]

    def close(self) -> None:
        """Close this process's connections (a parent's inherited ones are left open)."""
        made, self._made = self._made, []
        for pid, conn in made:
            if pid == os.getpid():
                conn.close()
        self._local = threading.local()

    def drop(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {self.state}, {self.log}")
        self.close()
