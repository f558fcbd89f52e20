"""Guards of module state that a forked child gets anew, unheld.

Threads of this package take a module's guard to build what the process shares: a client per
URL, a node per client, a subscriber, the renewal watchdog, the give-back sender, the event
counters. ``os.fork`` copies a held lock as held, and not the thread that holds it. Timeline:
(1) in a worker's main process, the counters' flush thread takes the clients' guard to build
a client; (2) meanwhile the prefork pool forks a child to replace one that was killed; (3) the
child's first lock operation waits on the guard forever: the call it was given never runs,
and a warm shutdown waits for it too (1 of 38 child kills on a real worker). So each
:class:`Guard` is replaced by a fresh lock in a forked child (``os.register_at_fork``).

This module never imports Celery.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

__all__ = ["Guard"]


class Guard:
    """A lock (``with guard:``) that is free in a forked child, whoever held it at the fork;
    ``reentrant``: an ``RLock``. Also per object (a lock's own state, its renewal), for a child
    that inherits the object: one forked while a renewal of it was in flight waited on it
    forever in its own ``release()``."""

    __slots__ = ("__weakref__", "_lock", "_reentrant")

    def __init__(self, reentrant: bool = False) -> None:
        self._reentrant = reentrant
        self._lock: threading.Lock | threading.RLock = (
            threading.RLock() if reentrant else threading.Lock()
        )
        _guards.add(self)

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *_: Any) -> None:
        self._lock.release()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()


_guards: weakref.WeakSet[Guard] = weakref.WeakSet()


def _forked() -> None:
    for guard in list(_guards):
        guard._lock = threading.RLock() if guard._reentrant else threading.Lock()


os.register_at_fork(after_in_child=_forked)
