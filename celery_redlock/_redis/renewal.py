"""The watchdog that keeps held leases alive.

One daemon thread per process schedules the renewals of every lock registered with
:func:`watch`, and runs each in a short-lived thread of its own. Each lock decides by itself
what a renewal means (:meth:`Renewable.renew_step` returns the delay until its next renewal, or
``None`` to stop); this module only schedules.

Hazards, as timelines:

1. Fork. A prefork child inherits the registry but not the thread: the parent's watchdog
   thread does not exist in the child. :func:`watch` notices the PID change and starts a fresh
   thread with an empty registry, so a child never renews its parent's locks and vice versa.
2. A renewal that blocks. Each renewal runs in a thread of its own: the watchdog thread only
   schedules. Timeline when one thread ran them in turn (a Cluster with one primary frozen,
   a threads pool holding locks on several primaries): (1) the renewals of the locks on the
   frozen primary each wait until their lease ends; (2) a lock on a live primary, due
   meanwhile, waits behind them; (3) it is renewed after its own lease ended: lost, and a
   duplicate runs beside its live task. Now a server that does not answer delays only the
   renewals of its own locks. A lock is out of the schedule while its renewal runs, and a
   renewal of a lock released and taken again meanwhile waits for the one in flight (the
   lock's own ``_renewing``): one lock is never renewed by two threads at once.
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
import math
import threading
import time
import weakref
from typing import Protocol

from . import owner
from .forks import Guard
from .owner import current_pid

logger = logging.getLogger("celery_redlock.renewal")


class Renewable(Protocol):
    def renew_step(self) -> float | None:
        """Renew once; return seconds until the next renewal, or ``None`` to stop."""


class _Watchdog:
    def __init__(self) -> None:
        self.pid = current_pid()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        #: ``(due, seq, id(item), weak reference to item)``.
        self._heap: list[tuple[float, int, int, weakref.ref[Renewable]]] = []
        #: id(item) -> sequence number of its one live heap entry; other entries are stale.
        #: An item collected while watched is forgotten when its live entry comes due.
        self._live: dict[int, int] = {}
        #: Entries made stale by :meth:`unwatch` since the heap was last compacted.
        self._dropped = 0
        #: When the thread wakes by itself (``inf``: it waits to be notified).
        self._wakes_at = math.inf
        #: How long the thread sleeps with nothing to renew: the last delay scheduled (see
        #: :meth:`_next_due`); ``inf`` until the first.
        self._idle = math.inf
        self._seq = itertools.count()
        self._thread = threading.Thread(target=self._run, name="celery-redlock-renewal")
        self._thread.daemon = True
        self._thread.start()

    def _schedule(self, item: Renewable, delay: float) -> None:
        key = id(item)
        seq = next(self._seq)
        self._live[key] = seq
        self._idle = delay
        due = time.monotonic() + delay
        heapq.heappush(self._heap, (due, seq, key, weakref.ref(item)))
        # Wake the thread only if it sleeps past the new due time (saves a context switch
        # per task: it usually sleeps until an earlier entry's, stale or not).
        if due < self._wakes_at:
            self._cond.notify()

    # watch and unwatch run once each per task execution: acquire/release spare the ``with``
    # protocol's lookups and calls (about 0.1 us each).

    def watch(self, item: Renewable, delay: float) -> None:
        self._lock.acquire()
        try:
            self._schedule(item, delay)
        finally:
            self._lock.release()

    def unwatch(self, item: Renewable) -> None:
        self._lock.acquire()
        try:
            if self._live.pop(id(item), None) is not None:
                self._dropped += 1
                if self._dropped > COMPACT_AFTER and self._dropped * 2 > len(self._heap):
                    self._compact()
        finally:
            self._lock.release()

    def _compact(self) -> None:
        """Drop the heap's stale entries (called locked).

        Most locks are released long before their first renewal: without this, each would
        leave its entry in the heap until it comes due (a lease/3 later), and a busy worker
        would carry thousands of dead entries, each push costing more and every garbage
        collection walking them. Amortized O(1) per :meth:`unwatch`. The thread sleeps on until
        the due time it chose, before every entry left, then looks again.
        """
        self._heap[:] = [entry for entry in self._heap if self._live.get(entry[2]) == entry[1]]
        heapq.heapify(self._heap)
        self._dropped = 0

    def _stale(self, seq: int, key: int, ref: weakref.ref[Renewable]) -> Renewable | None:
        """The item of a heap entry, or ``None`` if the entry is stale (called locked)."""
        if self._live.get(key) != seq:
            return None
        item = ref()
        if item is None:  # collected while watched: its id may be reused, forget it
            del self._live[key]
        return item

    def _next_due(self) -> tuple[int, Renewable]:
        with self._cond:
            while True:
                while self._heap and self._stale(*self._heap[0][1:]) is None:
                    heapq.heappop(self._heap)
                if not self._heap:
                    # Idle, it wakes by itself one delay later rather than only when told:
                    # locks released before their first renewal (most tasks) leave the heap
                    # empty, and a notification for each next lock, due after that wake-up,
                    # would cost a thread switch per task for nothing.
                    idle = self._idle
                    self._wakes_at = time.monotonic() + idle
                    self._cond.wait(None if idle == math.inf else idle)
                    continue
                self._wakes_at = self._heap[0][0]
                due = self._wakes_at - time.monotonic()
                if due <= 0:
                    _, seq, key, ref = heapq.heappop(self._heap)
                    item = self._stale(seq, key, ref)
                    if item is not None:
                        return seq, item
                    continue
                self._cond.wait(due)

    def _run(self) -> None:
        while True:
            # A call, so that no strong reference to the item outlives it while we sleep.
            self._start(*self._next_due())

    def _start(self, seq: int, item: Renewable) -> None:
        """Run the renewal in a thread of its own; in this one when none can be started (a
        pids limit): an exception here would end the watchdog, and with it the renewal of
        every lock of the process, none of them marked lost."""
        thread = threading.Thread(
            target=self._renew, args=(seq, item), name="celery-redlock-renew", daemon=True
        )
        try:
            thread.start()
        except RuntimeError:
            logger.warning("could not start a renewal thread; renewing in the watchdog thread")
            self._renew(seq, item)

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
            else:
                self._schedule(item, delay)


#: :meth:`_Watchdog.unwatch` compacts the heap once more than this many entries went stale
#: since the last compaction and they are more than half of it.
COMPACT_AFTER = 64

_watchdog: _Watchdog | None = None
_guard = Guard()


def _current() -> _Watchdog:
    global _watchdog
    watchdog = _watchdog
    if watchdog is not None and watchdog.pid == current_pid():
        return watchdog  # the usual case, without taking the guard
    with _guard:
        if _watchdog is None or _watchdog.pid != current_pid():
            _watchdog = _Watchdog()
        return _watchdog


def watch(item: Renewable, delay: float) -> None:
    """Call ``item.renew_step()`` after ``delay`` seconds, and again as long as it asks."""
    watchdog = _watchdog  # the usual case, without a call to _current
    if watchdog is None or watchdog.pid != owner.process_id:
        watchdog = _current()
    watchdog.watch(item, delay)


def unwatch(item: Renewable) -> None:
    """Stop renewing ``item`` (idempotent)."""
    watchdog = _watchdog
    if watchdog is None or watchdog.pid != owner.process_id:
        watchdog = _current()
    watchdog.unwatch(item)
