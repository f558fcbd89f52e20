"""The one layout of a Celery app on a test redis-server, and the one environment convention of
the tests, the benchmarks and the checkers.

Layout: db 0 holds the locks (``redlock_url``), 1 the broker, 2 the results; tasks record what
they see in db 3.

Environment: every variable the suite, the benchmarks and the checkers read is named
``REDLOCK_TEST_*``; a worker app is configured by them only, set by its test or checker
(:class:`support.workers.WorkerProcess` sets ``REDLOCK_TEST_PORT``):

=============================  ===============================================================
``REDLOCK_TEST_PORT``          the private redis-server, in the layout above
``REDLOCK_TEST_URL``           ``redlock_url`` when it is not db 0 of that server
``REDLOCK_TEST_LEASE``         ``redlock_lease`` in seconds
``REDLOCK_TEST_TTL_MARGIN``    ``redlock_ttl_margin`` in seconds
``REDLOCK_TEST_VISIBILITY``    the Redis transport's ``visibility_timeout`` in seconds
``REDLOCK_TEST_REDIS_SERVER``  the ``redis-server`` binary every test server runs
                               (:func:`celery_redlock.testing.redis_server_binary`)
``REDLOCK_TEST_SOAK``          ``1``: run the soak tests (marker ``soak``) too
``REDLOCK_TEST_<KNOB>``        anything else one app needs (documented in that app)
=============================  ===============================================================
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
from typing import Any

import redis as redis_py
from celery import Celery

from celery_redlock._redis.keys import is_slot, lock_pattern
from celery_redlock.testing import RedisServer
from support.servers import dead_port

#: The prefix of every variable the tests, benchmarks and checkers read.
PREFIX = "REDLOCK_TEST_"


def env(name: str) -> str | None:
    """``REDLOCK_TEST_<name>`` from the environment (``None`` when unset or empty)."""
    return os.environ.get(PREFIX + name) or None


def layout_app(name: str, base: str, **conf: Any) -> Celery:
    """A Celery app on one test redis-server at ``base`` (``redis://host:port``).

    ``conf`` updates the app's configuration (``redlock_url`` included);
    ``set_as_current=False`` keeps the app from becoming Celery's current app, and
    ``task_cls`` is the app's base task class.
    """
    set_as_current = conf.pop("set_as_current", True)
    task_cls = conf.pop("task_cls", None)
    app = Celery(
        name,
        broker=f"{base}/1",
        backend=f"{base}/2",
        set_as_current=set_as_current,
        task_cls=task_cls,
    )
    app.conf.update(
        {
            "redlock_url": f"{base}/0",
            "broker_connection_retry_on_startup": True,
            # The Redis transport's BRPOP timeout: a worker stops within 0.1 s, not 1 s.
            "broker_transport_options": {"polling_interval": 0.1},
            **conf,
        }
    )
    return app


def make_app(server: RedisServer, name: str = "t", **conf: Any) -> Celery:
    """A test's app (not the current app) in the layout on ``server``; ``conf`` adds settings."""
    return layout_app(
        name,
        f"redis://127.0.0.1:{server.port}",
        set_as_current=False,
        result_extended=True,
        worker_hijack_root_logger=False,  # keep pytest's caplog handler on root
        **conf,
    )


def brokerless_app(lock_url: str, broker: str | None = None) -> Celery:
    """An app whose locks live at ``lock_url`` and whose broker does not answer (nothing
    listens on its port, or ``broker``, a :class:`DownBroker`'s URL): what a worker ping
    meets with the broker down. Kombu's connection settings are its defaults (they retry)."""
    return layout_app(
        "inv",
        broker or f"redis://127.0.0.1:{dead_port()}",
        set_as_current=False,
        redlock_url=lock_url,
    )


class DownBroker:
    """A broker's port that accepts each connection and closes it at once (a broker that is
    restarting, or a proxy in front of a dead one), counting them: a client's retries show."""

    def __init__(self) -> None:
        self._socket = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self._socket.getsockname()[1]}"
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:  # closed
                return
            self.connections += 1
            with connection:
                self._answer(connection)

    def _answer(self, connection: socket.socket) -> None:
        """What the port does with a connection before it closes it: nothing."""

    def close(self) -> None:
        self._socket.shutdown(socket.SHUT_RDWR)  # wakes the accept (Linux)
        self._socket.close()


class NotRedis(DownBroker):
    """A port where another service answers (an HTTP server): to anything sent, an HTTP 400.
    ``resets``: a service that resets the connection instead (RabbitMQ, to a client that does
    not speak AMQP; a TLS-only port does the same)."""

    def __init__(self, resets: bool = False) -> None:
        self.resets = resets
        super().__init__()

    def _answer(self, connection: socket.socket) -> None:
        with contextlib.suppress(OSError):
            connection.recv(4096)
            if self.resets:
                # Once the client waits for a reply (nothing more comes for 0.2 s): a reset
                # during its writes would fail them ("while writing"), not its read.
                connection.settimeout(0.2)
                with contextlib.suppress(TimeoutError):
                    while connection.recv(4096):
                        pass
                # Closed with a zero linger: a TCP reset.
                connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return
            connection.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")


class SilentBroker:
    """A broker's port where a connect never completes (a host that drops packets): a
    listening socket whose one-slot backlog is kept full, so the kernel ignores the next
    connection attempts."""

    def __init__(self) -> None:
        self._socket = socket.create_server(("127.0.0.1", 0), backlog=0)
        port = self._socket.getsockname()[1]
        self.url = f"redis://127.0.0.1:{port}"
        self._filler = socket.create_connection(("127.0.0.1", port))

    def close(self) -> None:
        self._filler.close()
        self._socket.close()


def app_from(path: str) -> Celery:
    """An app configured as Django projects do: ``config_from_object(path, namespace="CELERY")``."""
    app = Celery("proj", set_as_current=False)
    app.config_from_object(path, namespace="CELERY")
    return app


def lock_keys(client: redis_py.Redis, prefix: str = "redlock") -> list[bytes]:
    """Lock keys present now (fencing counters excluded)."""
    return [k for k in client.scan_iter(match=lock_pattern(prefix)) if is_slot(k)]


#: The two public APIs, and the task of :mod:`tests.e2e.proj` playing each role under each: a
#: test parametrized over ``API_TASKS`` picks its task by role (the twins share one lock).
API_TASKS: dict[str, dict[str, str]] = {
    "task": {"ending": "ending", "waiter": "waiter", "critical": "critical"},
    "decorator": {"ending": "plain_ending", "waiter": "plain_waiter", "critical": "plain_critical"},
}
