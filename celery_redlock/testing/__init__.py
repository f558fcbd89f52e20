"""Helpers for testing code that uses celery-redlock, and an opt-in pytest plugin.

* :class:`RedisServer`, :func:`free_port`, :func:`wait_until`: a throwaway ``redis-server`` on a
  free loopback port, and polling with a deadline;
* :func:`record_lock_events`, :func:`assert_skipped`, :func:`assert_acquired`,
  :func:`hold_lock`, :func:`use_redlock_url`: assertions on the lock outcome of a task call;
* :mod:`celery_redlock.testing.pytest_plugin`: fixtures (enable it with
  ``pytest_plugins = ["celery_redlock.testing.pytest_plugin"]``).
"""

from ._assertions import (
    HOLDER,
    LockEvent,
    LockEvents,
    assert_acquired,
    assert_skipped,
    hold_lock,
    record_lock_events,
    use_redlock_url,
)
from ._server import RedisServer, free_port, redis_server_binary, wait_until

__all__ = [
    "HOLDER",
    "LockEvent",
    "LockEvents",
    "RedisServer",
    "assert_acquired",
    "assert_skipped",
    "free_port",
    "hold_lock",
    "record_lock_events",
    "redis_server_binary",
    "use_redlock_url",
    "wait_until",
]
