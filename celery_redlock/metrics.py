"""Event counters per task: acquired, skipped, superseded, expired, ... (see :data:`EVENTS`).

Every process counts in memory and a daemon thread adds the counts to a Redis hash per task
(``<prefix>:stats:<task name>``, see the README's key table) once a second, so counting costs
no round trip on the task's path and ``celery redlock stats`` sees the sum over all workers.
Counts still in memory when a process is SIGKILLed are lost (at most one second's worth);
a process that exits flushes them (``atexit``, a pool child's ``worker_process_shutdown``, and
a ``multiprocessing`` child's finalizers, as its fork ends with ``os._exit``).
A flush that fails (Redis down, a Cluster that cannot be reached, an ACL without
``HINCRBY``, ``OOM``) keeps the counts for the next flush and logs once per outage: the thread
never ends from an exception. Only the events Redis did not add are kept: a counter field that
is no whole number (written by hand) refuses its own event, whose counts are dropped with a
WARNING, while the task's other events go on counting once each. Hazard, as a timeline: (1) a
flush is sent; (2) Redis stalls past the read timeout, and the flush fails; (3) Redis then
applies it; (4) the next flush sends the same counts again. So a stall can count events twice:
the counters are for dashboards.

With ``prometheus_client`` installed, :class:`PrometheusCollector` exposes the same sums::

    from prometheus_client import REGISTRY
    from celery_redlock.metrics import PrometheusCollector

    REGISTRY.register(PrometheusCollector(app))
    # celery_redlock_events_total{task="proj.sync_account",event="skipped"} 12.0
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing.util
import threading
from collections import Counter, deque
from collections.abc import Iterator, Mapping
from typing import Any

from celery.signals import worker_process_shutdown

from ._celery.options import Settings, settings_for
from ._redis import owner as _owner
from ._redis.clients import redact
from ._redis.core import Outcome, classify
from ._redis.forks import Guard
from ._redis.inventory import Inventory, add_counts
from ._redis.keys import stats_key
from ._redis.owner import current_pid
from .exceptions import LockUnavailable

__all__ = ["EVENTS", "PrometheusCollector", "by_event", "count", "flush", "read_stats"]

logger = logging.getLogger("celery_redlock.metrics")

#: The events counted.
EVENTS = (
    "acquired",
    "skipped",
    "superseded",
    "retried",
    "rate_limited",
    "waited",
    "failed",
    "unavailable",
    "lost",
    "released",
    "unreleased",
    "bypassed",
    "expired",
)

FLUSH_INTERVAL = 1.0


class _Counters:
    def __init__(self) -> None:
        self.pid = current_pid()
        self.lock = threading.Lock()
        #: Held for a whole flush: :meth:`forget` waits for a flush that took its counts.
        self.flushing = threading.Lock()
        #: Events counted and not yet taken by a flush: one shared ``(url, key, event)`` per
        #: event (:func:`count`). A deque's append and popleft are atomic: counting takes no
        #: lock, and a count made while a flush drains is taken by that flush or the next.
        self.counted: deque[tuple[str, str, str]] = deque()
        #: Counts taken from :attr:`counted` and not yet written (or kept after a failure).
        self.pending: dict[tuple[str, str], Counter[str]] = {}
        #: URLs whose last flush failed (their next failure is logged at DEBUG only).
        self.failing: set[str] = set()
        #: ``(key, event)`` whose counts Redis would not add, already logged at WARNING.
        self.dropped: set[tuple[str, str]] = set()
        self.wake = threading.Event()
        self.thread = threading.Thread(target=self._run, name="celery-redlock-metrics")
        self.thread.daemon = True
        self.thread.start()
        # A child forked by multiprocessing (Django's `test --parallel`) ends with os._exit
        # after the finalizers registered since its fork: atexit never runs there.
        multiprocessing.util.Finalize(None, _flush_at_exit, exitpriority=0)

    def _take_counted(self) -> None:
        """Add the events counted since the last call to :attr:`pending` (under ``lock``)."""
        counted, pending = self.counted, self.pending
        while counted:
            url, key, event = counted.popleft()
            counts = pending.get((url, key))
            if counts is None:
                counts = pending[url, key] = Counter()
            counts[event] += 1

    def _run(self) -> None:
        while True:
            self.wake.wait(FLUSH_INTERVAL)
            self.wake.clear()
            try:
                self.flush()
            except Exception:  # a bug, not Redis: flush() keeps the counts itself
                logger.exception("lock counters: unexpected error while flushing; retrying")

    def flush(self, quiet: bool = False) -> None:
        """Write the pending counts; a failure keeps them and logs (at DEBUG if ``quiet``)."""
        with self.flushing:
            self._flush(quiet)

    def forget(self, url: str) -> None:
        """Drop the pending counts bound for ``url``, once a flush writing them has ended."""
        with self.flushing, self.lock:
            self._take_counted()
            self.pending = {k: v for k, v in self.pending.items() if k[0] != url}

    def _flush(self, quiet: bool) -> None:
        with self.lock:
            self._take_counted()
            pending, self.pending = self.pending, {}
        for (url, key), counts in pending.items():
            try:
                errors = add_counts(url, key, counts)
            except Exception as exc:  # RedisError, RedisClusterException, LockUnavailable...
                self._keep(url, key, counts, exc, quiet)
                continue
            kept = Counter({event: counts[event] for event in errors if _for_now(errors[event])})
            for event, error in errors.items():
                if event not in kept:
                    self._drop(key, event, counts[event], error, quiet)
            if kept:
                self._keep(url, key, kept, errors[next(iter(kept))], quiet)
                continue
            with self.lock:
                recovered = url in self.failing
                self.failing.discard(url)
            if recovered:
                logger.info("lock counters flushed again to %s", key)

    def _keep(
        self, url: str, key: str, counts: Counter[str], exc: BaseException, quiet: bool
    ) -> None:
        """Keep ``counts`` for the next flush: Redis did not answer, or refused them for now."""
        with self.lock:
            self.pending.setdefault((url, key), Counter()).update(counts)
            failing = url in self.failing
            self.failing.add(url)
        log = logger.debug if failing or quiet else logger.warning
        log("could not flush lock counters to %s, keeping them: %s", key, redact(exc))

    def _drop(self, key: str, event: str, n: int, exc: BaseException, quiet: bool) -> None:
        """Drop the ``n`` counts of ``event``, whose field Redis will never add to."""
        log = logger.debug if (key, event) in self.dropped or quiet else logger.warning
        self.dropped.add((key, event))
        log(
            "lock counter %r of %s cannot be added to (%s): %d dropped; delete the field",
            event,
            key,
            redact(exc),
            n,
        )


def _for_now(exc: BaseException) -> bool:
    """Whether a flush's ``HINCRBY`` error passes (no answer, a Cluster down, ``NOPERM``,
    ``OOM``...), so that its counts are kept; an error reply about the field is for good."""
    return classify(exc) in (Outcome.UNAVAILABLE, Outcome.REFUSED)


_counters: _Counters | None = None
_guard = Guard()


def _current() -> _Counters:
    global _counters
    with _guard:
        if _counters is None or _counters.pid != current_pid():
            _counters = _Counters()
        return _counters


def count(app: Any, task_name: str, event: str, settings: Settings | None = None) -> None:
    """Count one ``event`` of the task called ``task_name`` (flushed within a second).

    ``settings``: ``app``'s, when the caller has them resolved."""
    counters = _counters
    if counters is None or counters.pid != _owner.process_id:
        counters = _current()
    if settings is None:
        settings = settings_for(app)
    counted = _counted.get((settings.url, settings.prefix, task_name, event))
    if counted is None:
        counted = _event_of(settings, task_name, event)
    counters.counted.append(counted)


#: :func:`count`'s ``(url, key, event)`` per ``(settings url, prefix, task name, event)``,
#: built once and shared by every count of it (at most :data:`COUNTED_MAX`).
_counted: dict[tuple[Any, str, str, str], tuple[str, str, str]] = {}
COUNTED_MAX = 4096


def _event_of(settings: Settings, task_name: str, event: str) -> tuple[str, str, str]:
    """What :func:`count` queues for ``event`` of ``task_name`` under ``settings``: the
    counters live on the first node of a quorum."""
    url = settings.url if isinstance(settings.url, str) else settings.url[0]
    counted = (url, stats_key(settings.prefix, task_name), event)
    if len(_counted) < COUNTED_MAX:
        _counted[settings.url, settings.prefix, task_name, event] = counted
    return counted


def flush() -> None:
    """Write this process's pending counts to Redis now."""
    if _counters is not None and _counters.pid == current_pid():
        _counters.flush()


def forget(url: str) -> None:
    """Drop this process's pending counts bound for ``url`` (not yet written), after a flush
    in progress has written what it took. The pytest plugin's ``redlock_url`` calls it before
    it empties the database. Timeline without it: (1) a test makes 5 skipped calls; (2) the
    next test's database is emptied; (3) the background flush, up to a second later, writes
    the 5 skips into it, and that test's ``read_stats`` sees them."""
    if _counters is not None and _counters.pid == current_pid():
        _counters.forget(url)


def _flush_at_exit(**_: Any) -> None:
    """The last flush of a process: a Redis that is gone by then is no news (DEBUG)."""
    if _counters is not None and _counters.pid == current_pid():
        _counters.flush(quiet=True)


atexit.register(_flush_at_exit)

#: Prefork children end with ``os._exit`` (no ``atexit``): flush before that.
worker_process_shutdown.connect(_flush_at_exit, weak=False)


def read_stats(app: Any) -> dict[str, dict[str, int]]:
    """The counters of every task of ``app``'s lock prefix, summed over all processes.

    Raises :class:`~celery_redlock.LockUnavailable` naming the node (credentials hidden) when
    it does not answer or refuses the read (an ACL user without ``+scan`` or ``+hgetall``).
    """
    settings = settings_for(app)
    return Inventory(settings.url, settings.prefix).counters()


def by_event(stats: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """``stats`` (:func:`read_stats`) as every output shows them: tasks in order, each with
    every event of :data:`EVENTS` in that order (0 until it happens) and nothing else.

    A field of the hash that is no event (``HSET <prefix>:stats:<task> <anything> 7``, by hand
    or by another program) is left out: it became a column for every task of
    ``celery redlock stats``, its ``--json`` and the dashboard's Counters tab, where whoever
    may write to the lock Redis chose its name.
    """
    return {task: {e: counts.get(e, 0) for e in EVENTS} for task, counts in sorted(stats.items())}


class PrometheusCollector:
    """A ``prometheus_client`` collector of the counters (read from Redis at each scrape)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        family = CounterMetricFamily(
            "celery_redlock_events", "Lock events of Celery tasks", labels=["task", "event"]
        )
        try:
            stats = read_stats(self.app)
        except LockUnavailable as exc:  # one failing collector must not fail the scrape
            logger.warning("lock counters unavailable for Prometheus: %s", exc)
            stats = {}
        for task, counts in by_event(stats).items():  # 0 too; no stray field of the hash
            for event, n in counts.items():
                family.add_metric([task, event], n)
        yield family
