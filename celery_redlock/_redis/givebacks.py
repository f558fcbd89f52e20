"""Give-backs of acquisitions whose reply was lost, in one daemon thread per process.

The thread lock hands :func:`give_back` the owner-checked release of a token whose
acquisition got no answer; this thread sends it until the lock core's
:class:`~celery_redlock._redis.core.GiveBack` says stop (its docstring has the timeline).

Hazards, as timelines:

1. Fork. A prefork child inherits the pending give-backs but not the thread. The first
   :func:`give_back` in the child notices the PID change and starts afresh with none of the
   parent's, which the parent's own thread still sends.
2. An outage. Every acquisition that fails while Redis is silent adds one give-back: each is
   one entry here, not a thread, and tries with a growing delay (at most 1 s apart; once one
   is answered, the others to that server are tried at once). A release
   that blocks until its socket timeout delays the others by that long, never a renewal: the
   renewal watchdog is another thread. At most :data:`MAX_PENDING` wait at once; past that a
   WARNING says so, and the key of an acquisition not given back expires by its TTL.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

from .core import GiveBack
from .forks import Guard
from .owner import current_pid

__all__ = ["give_back"]

logger = logging.getLogger("celery_redlock.lock")

#: Give-backs waiting at most (a frozen node and thousands of releases a second).
MAX_PENDING = 10_000


class _Sender:
    def __init__(self) -> None:
        self.pid = current_pid()
        self._cond = threading.Condition()
        #: ``(due, seq, release, plan, node)``; ``node``: the server it goes to, or ``None``.
        self._heap: list[tuple[float, int, Callable[[], object], GiveBack, object]] = []
        self._seq = itertools.count()
        thread = threading.Thread(target=self._run, name="celery-redlock-give-back")
        thread.daemon = True
        thread.start()

    def add(
        self, release: Callable[[], object], plan: GiveBack, delay: float, node: object = None
    ) -> None:
        with self._cond:
            if len(self._heap) >= MAX_PENDING:
                logger.warning(
                    "lock %s: %d give-backs wait for Redis already; this one is dropped, and "
                    "the key expires by its TTL if its acquisition ran",
                    plan.key,
                    MAX_PENDING,
                )
                return
            due = time.monotonic() + delay
            heapq.heappush(self._heap, (due, next(self._seq), release, plan, node))
            self._cond.notify()

    def _next_due(self) -> tuple[Callable[[], object], GiveBack, object]:
        with self._cond:
            while True:
                due = self._heap[0][0] - time.monotonic() if self._heap else None
                if due is not None and due <= 0:
                    _, _, release, plan, node = heapq.heappop(self._heap)
                    return release, plan, node
                self._cond.wait(due)

    def _run(self) -> None:
        while True:
            release, plan, node = self._next_due()
            error: BaseException | None = None
            try:
                release()
            except Exception as exc:  # judged by the plan: retried, or the end
                error = exc
            answers = plan.answers
            delay = plan.after(error, time.monotonic())
            if delay is not None:
                self.add(release, plan, delay, node)
            if node is not None and plan.answers > answers:
                self._hasten(node)

    def _hasten(self, node: object) -> None:
        """``node`` answered a give-back: the others to it are due now, not after their backoff.

        Timeline this shortens: (1) a server frozen for a minute; every give-back to it backs
        off to :data:`~celery_redlock._redis.core.GIVE_BACK_DELAYS`' longest delay; (2) it
        answers again, and the first give-back due is answered; (3) the others would wait out
        their own delays, their keys held by nobody, and a call of such a key skipped
        meanwhile. Only those to ``node``: one to a node still frozen would hold up this one
        thread for its socket timeout. The answered one's next release goes first (it was
        added before, due at once).
        """
        with self._cond:
            now = time.monotonic()
            self._heap = [
                (min(due, now) if n is node else due, seq, r, p, n)
                for due, seq, r, p, n in self._heap
            ]
            heapq.heapify(self._heap)


_sender: _Sender | None = None
_sender_lock = Guard()


def give_back(
    key: str, release: Callable[[], object], what: str = "an acquisition", node: object = None
) -> None:
    """Send ``release()`` (the owner-checked release of a token whose acquisition's reply was
    lost, for lock ``key``; or ``what`` else lost it: a quorum node's release) to ``node`` (the
    client it goes through: an answer there makes the others to it due at once) in the
    background, as :class:`GiveBack` plans."""
    global _sender
    with _sender_lock:
        if _sender is None or _sender.pid != current_pid():
            _sender = _Sender()
        sender = _sender
    plan = GiveBack(key, time.monotonic(), what)
    sender.add(release, plan, plan.delay, node)
