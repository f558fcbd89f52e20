"""The rows of the locks page, from one :meth:`~celery_redlock._redis.inventory.Inventory.view`.

Reading (cursor pages over every primary, the markers, the waiter counts) is the Redis layer's
inventory; here is only what a row shows. A row is a slot of a lock or semaphore (held by its
token), or a marker that keeps calls out: an enqueue marker (``lock_enqueue``), a rate window
(``lock_rate``), a newest-call marker (``lock_debounce`` and ``lock_enqueue='replace'``). Slot 1
of a semaphore shows as a lock unless another slot of it is on the same page.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .._redis.inventory import HeldLock, Marker, View

__all__ = ["MODES", "Row", "rows_of"]

#: What a marker's row says it is, by :attr:`Marker.kind`.
MODES = {"queued": "enqueue marker", "rate": "rate window", "newest": "debounce"}


@dataclass(frozen=True)
class Row:
    """One row of the page."""

    key: str
    #: ``lock``, ``semaphore slot``, ``cooldown`` (a slot kept by ``lock_cooldown`` after its
    #: task ended), ``enqueue marker``, ``rate window`` or ``debounce``.
    mode: str
    #: A slot of a semaphore (whose slots share one fencing counter), in cooldown or not.
    semaphore: bool
    #: The lock's name (``<lock_name>:<digest>`` for a task), and the ``lock_name`` alone.
    name: str
    lock_name: str
    task_id: str | None
    host: str | None
    pid: int | None
    acquired_ms: int | None
    ttl: float | None
    fencing_token: int | None
    waiters: int
    #: For a marker: what it holds (queued call, starts in the window, newest call).
    detail: str
    #: What an action must find unchanged (:attr:`HeldLock.fingerprint`,
    #: :attr:`Marker.fingerprint`): a digest, never the stored value.
    fingerprint: str
    #: The slot as read, for an owner-checked release; ``None`` for a marker.
    lock: HeldLock | None = dataclasses.field(default=None, repr=False, compare=False)


def rows_of(view: View) -> list[Row]:
    """The rows of ``view``'s locks and markers, sorted by key."""
    semaphores = {lock.name for lock in view.locks if lock.slot > 1}
    rows = [
        _slot_row(lock, view.waiters.get(lock.key, 0), lock.name in semaphores)
        for lock in view.locks
    ]
    rows += [_marker_row(marker) for marker in view.markers]
    return sorted(rows, key=lambda r: r.key)


def _slot_row(lock: HeldLock, waiters: int, semaphore: bool) -> Row:
    h = lock.holder
    return Row(
        key=lock.key,
        mode="cooldown" if h and h.cooling else "semaphore slot" if semaphore else "lock",
        semaphore=semaphore,
        name=lock.name,
        lock_name=lock.lock_name,
        task_id=h.task_id if h else None,
        host=h.host if h else None,
        pid=h.pid if h else None,
        acquired_ms=h.acquired_ms if h else None,
        ttl=lock.ttl,
        fencing_token=lock.fencing_token,
        waiters=waiters,
        detail=("semaphore " if semaphore else "")
        + f"slot {lock.slot}"
        + ("; its task ended" if h and h.cooling else ""),
        fingerprint=lock.fingerprint,
        lock=lock,
    )


def _marker_row(marker: Marker) -> Row:
    if marker.kind == "rate":
        detail = f"{marker.starts or 0} start(s) in the window"
    else:
        detail = "queued call" if marker.kind == "queued" else "newest call"
    return Row(
        key=marker.key,
        mode=MODES[marker.kind],
        semaphore=False,
        name=marker.name,
        lock_name=marker.lock_name,
        task_id=marker.task_id,
        host=None,
        pid=None,
        acquired_ms=None,
        ttl=marker.ttl,
        fencing_token=None,
        waiters=0,
        detail=detail,
        fingerprint=marker.fingerprint,
    )
