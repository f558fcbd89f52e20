"""Redis clients: one shared client per URL per process, and how errors are classified.

URLs are what redis-py's ``from_url`` accepts (``redis://``, ``rediss://`` with
``ssl_ca_certs``/``ssl_certfile``/``ssl_keyfile``/``ssl_cert_reqs`` query parameters,
``unix://``, user and password for ACL users). Socket timeouts default to 5 s (reads) and 2 s
(connect) unless the URL sets them, so an unreachable server fails an operation instead of
hanging a task.

This module never imports Celery.
"""

from __future__ import annotations

import threading
from typing import Any

import redis as redis_py

#: Errors that mean "this node did not answer": the lock state there is unknown.
UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (
    redis_py.exceptions.ConnectionError,
    redis_py.exceptions.TimeoutError,
    redis_py.exceptions.BusyLoadingError,
    OSError,
)

_clients: dict[tuple[str, float | None], redis_py.Redis] = {}
_guard = threading.Lock()


def client_for(url: str, timeout: float | None = None) -> redis_py.Redis:
    """A shared client for ``url`` (one per URL and timeout per process; fork-safe).

    ``timeout`` sets both socket timeouts (the worker's main process uses 1 s).
    """
    with _guard:
        client = _clients.get((url, timeout))
        if client is None:
            options: dict[str, Any] = {}
            if "socket_timeout=" not in url:
                options["socket_timeout"] = timeout or 5.0
            if "socket_connect_timeout=" not in url:
                options["socket_connect_timeout"] = timeout or 2.0
            client = _clients[(url, timeout)] = redis_py.Redis.from_url(url, **options)
        return client


def node_name(client: Any) -> str:
    """``host:port`` (or socket path) of a client, for messages; never includes credentials."""
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
    if "path" in kwargs:
        return str(kwargs["path"])
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"
