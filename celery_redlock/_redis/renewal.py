"""The watchdog that keeps held leases alive.

One daemon thread per process renews every lock registered with :func:`watch`. Each lock
decides by itself what a renewal means (:meth:`Renewable.renew_step` returns the delay until its
next renewal, or ``None`` to stop); this module only schedules.

Hazards, as timelines:

1. Fork. A prefork child inherits the registry but not the thread: the parent's watchdog
   thread does not exist in the child. :func:`watch` notices the PID change and starts a fresh
   thread with an empty registry, so a child never renews its parent's locks and vice versa.
2. A renewal that blocks. The thread calls ``renew_step`` for one lock at a time; a Redis call
   stuck until its socket timeout delays the other locks by that long. Keep the socket timeout
   well under a third of the lease (the defaults are 5 s against a 30 s lease).
3. An abandoned lock. (a) Code acquires ``Lock(auto_renew=True)`` and drops it without
   releasing; (b) nothing references the lock any more. The watchdog holds only a weak
   reference, so the lock is garbage-collected, renewal stops, and the key expires within one
   lease instead of being renewed for as long as the process lives.
4. gevent/eventlet. Under monkey-patching this thread is a greenlet and gets no time while a
   task runs CPU-bound code without yielding: a lease can then expire under a live holder, which
   the next renewal detects and reports as lost.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Protocol

logger = logging.getLogger("celery_redlock.renewal")


class Renewable(Protocol):
    def renew_step(self) -> float | None:
        """Renew once; return seconds until the next renewal, or ``None`` to stop."""


class _Watchdog:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, weakref.ref[Renewable]]] = []
        #: id(item) -> sequence number of its one live heap entry; other entries are stale.
        self._live: dict[int, int] = {}
        #: id(item) -> the weak reference of a watched item (its callback forgets the item).
        self._refs: dict[int, weakref.ref[Renewable]] = {}
        self._seq = itertools.count()
        self._thread = threading.Thread(target=self._run, name="celery-redlock-renewal")
        self._thread.daemon = True
        self._thread.start()

    def _schedule(self, item: Renewable, delay: float) -> None:
        key = id(item)
        seq = next(self._seq)
        self._live[key] = seq
        ref = self._refs.get(key)
        if ref is None or ref() is not item:
            ref = self._refs[key] = weakref.ref(item, self._collected(key))
        due = time.monotonic() + delay
        # Wake the thread only if it sleeps past the new due time (saves a context switch
        # per task: the heap usually holds an earlier entry).
        wake = not self._heap or due < self._heap[0][0]
        heapq.heappush(self._heap, (due, seq, ref))
        if wake:
            self._cond.notify()

    def _collected(self, key: int) -> Callable[[weakref.ref[Renewable]], None]:
        def forget(ref: weakref.ref[Renewable]) -> None:
            with self._cond:
                if self._refs.get(key) is ref:
                    del self._refs[key]
                    self._live.pop(key, None)

        return forget

    def watch(self, item: Renewable, delay: float) -> None:
        with self._cond:
            self._schedule(item, delay)

    def unwatch(self, item: Renewable) -> None:
        with self._cond:
            self._live.pop(id(item), None)
            self._refs.pop(id(item), None)

    def _stale(self, seq: int, ref: weakref.ref[Renewable]) -> Renewable | None:
        item = ref()
        if item is None or self._live.get(id(item)) != seq:
            return None
        return item

    def _next_due(self) -> tuple[int, Renewable]:
        with self._cond:
            while True:
                while self._heap and self._stale(*self._heap[0][1:]) is None:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                due = self._heap[0][0] - time.monotonic()
                if due <= 0:
                    _, seq, ref = heapq.heappop(self._heap)
                    item = self._stale(seq, ref)
                    if item is not None:
                        return seq, item
                    continue
                self._cond.wait(due)

    def _run(self) -> None:
        while True:
            # A call, so that no strong reference to the item outlives it while we sleep.
            self._renew(*self._next_due())

    def _renew(self, seq: int, item: Renewable) -> None:
        try:
            delay = item.renew_step()
        except Exception:
            logger.exception("lock renewal failed unexpectedly; renewal stopped")
            delay = None
        with self._cond:
            if self._live.get(id(item)) != seq:
                return
            if delay is None:
                del self._live[id(item)]
                self._refs.pop(id(item), None)
            else:
                self._schedule(item, delay)


_watchdog: _Watchdog | None = None
_guard = threading.Lock()


def _current() -> _Watchdog:
    global _watchdog
    watchdog = _watchdog
    if watchdog is not None and watchdog.pid == os.getpid():
        return watchdog  # the usual case, without taking the guard
    with _guard:
        if _watchdog is None or _watchdog.pid != os.getpid():
            _watchdog = _Watchdog()
        return _watchdog


def watch(item: Renewable, delay: float) -> None:
    """Call ``item.renew_step()`` after ``delay`` seconds, and again as long as it asks."""
    _current().watch(item, delay)


def unwatch(item: Renewable) -> None:
    """Stop renewing ``item`` (idempotent)."""
    _current().unwatch(item)
