"""The one layout of a Celery app on a test redis-server, and the environment convention of the
apps that run in ``celery worker`` subprocesses.

Layout: db 0 holds the locks (``redlock_url``), 1 the broker, 2 the results; tasks record what
they see in db 3.

Environment: a worker app is configured by ``REDLOCK_TEST_*`` variables only, set by its test
or checker (:class:`support.workers.WorkerProcess` sets ``REDLOCK_TEST_PORT``):

=============================  ===============================================================
``REDLOCK_TEST_PORT``          the private redis-server, in the layout above
``REDLOCK_TEST_URL``           ``redlock_url`` when it is not db 0 of that server
``REDLOCK_TEST_LEASE``         ``redlock_lease`` in seconds
``REDLOCK_TEST_TTL_MARGIN``    ``redlock_ttl_margin`` in seconds
``REDLOCK_TEST_VISIBILITY``    the Redis transport's ``visibility_timeout`` in seconds
``REDLOCK_TEST_<KNOB>``        anything else one app needs (documented in that app)
=============================  ===============================================================
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

#: The prefix of every variable a worker app reads.
PREFIX = "REDLOCK_TEST_"


def env(name: str) -> str | None:
    """``REDLOCK_TEST_<name>`` from the environment (``None`` when unset or empty)."""
    return os.environ.get(PREFIX + name) or None


def layout_app(name: str, base: str, **conf: Any) -> Celery:
    """A Celery app on one test redis-server at ``base`` (``redis://host:port``).

    ``conf`` updates the app's configuration (``redlock_url`` included);
    ``set_as_current=False`` keeps the app from becoming Celery's current app.
    """
    set_as_current = conf.pop("set_as_current", True)
    app = Celery(name, broker=f"{base}/1", backend=f"{base}/2", set_as_current=set_as_current)
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
