"""Tight polling for latency measurements, built on :func:`celery_redlock.testing.wait_until`.

Every other wait uses ``wait_until`` directly (20 ms polls). These poll every 2 ms and return
*when* something happened (``time.time()``), for ordering and latency figures: a child's death
versus its lock's release, a kill versus the next start. :func:`max_in_window` reads a rate
from such times.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from celery_redlock.testing import wait_until

#: Seconds between two looks: the resolution of the times returned.
TIGHT = 0.002


def wait_for_change(predicate: Callable[[], object], timeout: float, what: str) -> float:
    """Wait until ``predicate`` is true; return the ``time.time()`` it was seen true."""
    wait_until(predicate, timeout, what, poll=TIGHT)
    return time.time()


def watch_events(events: dict[str, Callable[[], object]], timeout: float) -> dict[str, float]:
    """Poll every predicate until each has been true once; return when each first was.

    Raises :class:`AssertionError` naming the events not seen after ``timeout`` seconds.
    """
    seen: dict[str, float] = {}

    def all_seen() -> bool:
        now = time.time()
        for name, predicate in events.items():
            if name not in seen and predicate():
                seen[name] = now
        return len(seen) == len(events)

    try:
        wait_until(all_seen, timeout, "every event", poll=TIGHT)
    except AssertionError:
        missing = sorted(set(events) - set(seen))
        raise AssertionError(f"timed out after {timeout}s waiting for {missing}") from None
    return seen


def max_in_window(times: list[int], period: int) -> int:
    """The most of ``times`` in any half-open interval of length ``period``."""
    times = sorted(times)
    most, first = 0, 0
    for last, t in enumerate(times):
        while times[first] <= t - period:
            first += 1
        most = max(most, last - first + 1)
    return most
