"""Guards of module state that a forked child gets anew, unheld.

Threads of this package take a module's guard to build what the process shares: a client per
URL, a node per client, a subscriber, the renewal watchdog, the give-back sender, the event
counters. ``os.fork`` copies a held lock as held, and not the thread that holds it. Timeline:
(1) in a worker's main process, the counters' flush thread takes the clients' guard to build
a client; (2) meanwhile the prefork pool forks a child to replace one that was killed; (3) the
child's first lock operation waits on the guard forever: the call it was given never runs,
and a warm shutdown waits for it too (1 of 38 child kills on a real worker). So each
:class:`Guard` takes a fresh lock in a forked child, at its first use there: a fork counts a
generation (``os.register_at_fork``), and a guard of an older generation renews its lock
before taking it. (No registry of guards: a lock object built per task execution makes one,
and adding it to a ``WeakSet`` cost more than the rest of the guard.)

This module never imports Celery.
"""

from __future__ import annotations

import os
import threading
from typing import Any

__all__ = ["Guard"]


class Guard:
    """A lock (``with guard:``) that is free in a forked child, whoever held it at the fork;
    ``reentrant``: an ``RLock``. Also per object (a lock's own state, its renewal), for a child
    that inherits the object: one forked while a renewal of it was in flight waited on it
    forever in its own ``release()``."""

    __slots__ = ("_generation", "_lock", "_reentrant")

    def __init__(self, reentrant: bool = False) -> None:
        self._reentrant = reentrant
        self._lock: threading.Lock | threading.RLock = (
            threading.RLock() if reentrant else threading.Lock()
        )
        self._generation = _generation

    def __enter__(self) -> bool:
        if self._generation != _generation:
            self._renew()
        return self._lock.acquire()

    def __exit__(self, *_: Any) -> None:
        self._lock.release()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._generation != _generation:
            self._renew()
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def _renew(self) -> None:
        """A fresh lock for this process (the first use after a fork; two threads of the
        child that get here at once take the same one)."""
        with _renewing:
            if self._generation != _generation:
                self._lock = threading.RLock() if self._reentrant else threading.Lock()
                self._generation = _generation


#: How many forks led to this process (0 in the first): a guard made before the last one
#: renews its lock at its first use.
_generation = 0
#: Held while a guard renews its lock; made anew in each forked child.
_renewing = threading.Lock()


def _forked() -> None:
    global _generation, _renewing
    _generation += 1
    _renewing = threading.Lock()


os.register_at_fork(after_in_child=_forked)
