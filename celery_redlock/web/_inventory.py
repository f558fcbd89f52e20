"""The dashboard's one door to the lock inventory: cursor pages of rows, owner-checked actions.

Built on the command line's :class:`celery_redlock.cli.LockStore`: its key parser, its
owner-checked release and its page reader (``_read_page``: one pipelined round trip per node
for a page of slots, the quorum's majority rule included); the rest of the dashboard imports
only this module, so moving to the Redis layer's own inventory API changes this file alone.

Paging, as one ``SCAN`` cursor the browser carries back (``<node>:<cursor>``): a page runs
``SCAN`` steps on one primary at a time (every primary of a Redis Cluster, in a fixed order)
until it has :data:`ROWS` rows or has looked at :data:`BUDGET` keys, so the first page costs
the same at 1,000 locks or 1,000,000, and a filter that matches few keys returns a short page
with a "next" link instead of walking the whole key space. A step that matched little makes
the next one look at four times as many keys (up to :data:`MAX_STEP`): a rare filter costs
tens of round trips per page, not hundreds. As with ``SCAN`` itself, a key that
exists for the whole walk is shown at least once, and may be shown twice when the key space
changes in between.

A row is a slot of a lock or semaphore (held by its token), or one of the markers that keep
calls out: an enqueue marker (``lock_enqueue``), a rate window (``lock_rate``), a newest-call
marker (``lock_debounce`` and ``lock_enqueue='replace'``). A quorum (several ``redlock_url``
nodes) is scanned on its first node and read on all of them: a lock missing from the first
node is not listed.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.cluster import RedisCluster

from .._celery.options import Settings
from .._redis.clients import client_for
from .._redis.keys import keys_for, lock_pattern
from ..cli import HeldLock, LockStore

__all__ = ["BUDGET", "ROWS", "Inventory", "Page", "Row", "fingerprint_of", "pattern_for"]

#: Rows a page aims at; the ``COUNT`` of a page's first ``SCAN`` step and the largest; keys a
#: page looks at, at most.
ROWS = 100
STEP = ROWS
MAX_STEP = 5000
BUDGET = 50_000

#: Longest filter accepted. Long ``SCAN`` patterns made Redis < 7.2.6 crash (CVE-2024-31228).
MAX_FILTER = 200

#: The markers shown beside the slots: key suffix -> mode shown.
_MARKERS = {":queued": "enqueue marker", ":rate": "rate window", ":newest": "debounce"}

CLEAR = """
-- KEYS[1] a marker (enqueue marker, rate window, newest-call marker), KEYS[2] a companion to
--         delete with it (the rate window's promised next slot; else KEYS[1] again)
-- ARGV[1] the fingerprint the page showed: SHA1 hex of the marker's DUMP, first 16 chars
-- returns 1 deleted, 0 it changed (or is gone) since the page was drawn: nothing deleted
local dumped = redis.call('DUMP', KEYS[1])
if not dumped then return 0 end
if string.sub(redis.sha1hex(dumped), 1, 16) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
return 1
"""


@dataclass(frozen=True)
class Row:
    """One row of the page."""

    key: str
    #: ``lock``, ``semaphore slot``, ``enqueue marker``, ``rate window`` or ``debounce``.
    mode: str
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
    #: For a marker: what it holds (queued task id, starts in the window, newest call id).
    detail: str
    #: What an action must find unchanged: a digest of the stored value (never the value).
    fingerprint: str
    #: The slot as read, for an owner-checked release; ``None`` for a marker.
    lock: HeldLock | None = dataclasses.field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class Page:
    rows: list[Row]
    #: The cursor of the next page; ``None`` when the walk is complete.
    next_cursor: str | None
    #: Keys ``SCAN`` looked at for this page.
    looked_at: int


def escape_glob(text: str) -> str:
    """``text`` with every ``SCAN`` pattern character escaped (``* ? [ ] \\``)."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def pattern_for(prefix: str, name_prefix: str) -> str:
    """The ``SCAN`` pattern of the keys of the locks whose name starts with ``name_prefix``.

    :raises ValueError: for a filter that is too long, has control characters or braces.
    """
    if len(name_prefix) > MAX_FILTER:
        raise ValueError(f"the filter is {len(name_prefix)} characters; at most {MAX_FILTER}")
    if not name_prefix.isprintable() or "{" in name_prefix or "}" in name_prefix:
        raise ValueError("the filter must be printable and have no '{' or '}'")
    if not name_prefix:
        return lock_pattern(prefix)
    return f"{escape_glob(prefix)}:{{{escape_glob(name_prefix)}*}}*"


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def fingerprint_of(value: bytes | str) -> str:
    """What a page shows of a slot's value, for an action to compare: never the value, whose
    secret part would let anyone who sees the page release the lock as its owner."""
    raw = value.encode() if isinstance(value, str) else value
    return hashlib.sha256(raw).hexdigest()[:16]


class Inventory:
    """The locks of one app's ``redlock_*`` settings, a page at a time."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.store = LockStore(settings)
        self.client = client_for(self.store.urls[0])
        self._clear = self.client.register_script(CLEAR)  # EVALSHA, loaded again on NOSCRIPT

    def _nodes(self) -> list[Any]:
        """A plain client per primary to ``SCAN``, in a fixed order."""
        if isinstance(self.client, RedisCluster):
            primaries = sorted(self.client.get_primaries(), key=lambda n: n.name)
            return [node.redis_connection for node in primaries]
        return [self.client]

    def page(self, name_prefix: str = "", cursor: str = "0:0") -> Page:
        """The rows from ``cursor`` on (``"0:0"``: the first page)."""
        pattern = pattern_for(self.settings.prefix, name_prefix)
        nodes = self._nodes()
        index, position = _parse_cursor(cursor, len(nodes))
        keys: list[str] = []
        looked_at = 0
        count = STEP
        while True:
            position, batch = nodes[index].scan(cursor=position, match=pattern, count=count)
            looked_at += count
            keys.extend(_text(k) for k in batch)
            if len(batch) < count // 2:
                count = min(count * 4, MAX_STEP)
            if position == 0:
                index, position = index + 1, 0
                if index == len(nodes):
                    next_cursor = None
                    break
            if len(keys) >= ROWS or looked_at >= BUDGET:
                next_cursor = f"{index}:{position}"
                break
        return Page(self._rows(keys), next_cursor, looked_at)

    def _rows(self, keys: Sequence[str]) -> list[Row]:
        """The rows of the slots and markers among ``keys``: one pipelined read per node for
        the slots (:class:`LockStore`), one more for the markers and the waiter counts."""
        wanted = set(keys)
        parsed = [self.store.parse(k) for k in sorted(wanted)]
        # parse() also maps a bare name to its slot 1: keep only the keys that are slots.
        slots = [p for p in parsed if p is not None and p[0] in wanted]
        held = [h for h in self.store._read_page(slots) if h is not None] if slots else []
        markers = [
            (k, mode) for k in sorted(wanted) for sfx, mode in _MARKERS.items() if k.endswith(sfx)
        ]
        if not held and not markers:
            return []
        waiters = [keys_for(self.settings.prefix, lock.name).waiters for lock in held]
        if (
            waiters
            and not isinstance(self.client, RedisCluster)
            and not self.client.exists(*waiters)
        ):
            waiters = []  # one EXISTS for the page: waiters are rare
        pipe = self.client.pipeline(transaction=False)
        for key in waiters:
            pipe.zcard(key)
        for key, _mode in markers:
            pipe.pttl(key)
            pipe.dump(key)
            if key.endswith(":queued"):
                pipe.get(key)
            elif key.endswith(":rate"):
                pipe.llen(key)
            else:
                pipe.hget(key, "id")
        replies = pipe.execute()
        counts = replies[: len(waiters)] if waiters else [0] * len(held)
        # Slot 1 of a semaphore looks like a lock: known when another slot is on the page.
        semaphores = {lock.name for lock in held if lock.slot > 1}
        rows = [
            self._slot_row(lock, int(n or 0), lock.name in semaphores)
            for lock, n in zip(held, counts, strict=True)
        ]
        rest = replies[len(waiters) :]
        for i, (key, mode) in enumerate(markers):
            pttl, dumped, info = rest[3 * i : 3 * i + 3]
            if dumped is not None:  # else gone since the SCAN
                rows.append(self._marker_row(key, mode, int(pttl), bytes(dumped), info))
        rows.sort(key=lambda r: r.key)
        return rows

    def _slot_row(self, lock: HeldLock, waiters: int, semaphore: bool) -> Row:
        h = lock.holder
        return Row(
            key=lock.key,
            mode="semaphore slot" if semaphore else "lock",
            name=lock.name,
            lock_name=lock.lock_name,
            task_id=h.task_id if h else None,
            host=h.host if h else None,
            pid=h.pid if h else None,
            acquired_ms=h.acquired_ms if h else None,
            ttl=lock.ttl,
            fencing_token=lock.fencing_token,
            waiters=waiters,
            detail=f"slot {lock.slot}",
            fingerprint=fingerprint_of(lock.value),
            lock=lock,
        )

    def _marker_row(self, key: str, mode: str, pttl: int, dumped: bytes, info: Any) -> Row:
        name = key[key.index("{") + 1 : key.rindex("}")]
        head, _, tail = name.rpartition(":")
        lock_name = head if head and len(tail) == 32 else name
        task_id: str | None = None
        if mode == "rate window":
            detail = f"{int(info or 0)} start(s) in the window"
        else:
            task_id = None if info is None else _text(info)
            detail = "queued call" if mode == "enqueue marker" else "newest call"
        return Row(
            key=key,
            mode=mode,
            name=name,
            lock_name=lock_name,
            task_id=task_id,
            host=None,
            pid=None,
            acquired_ms=None,
            ttl=None if pttl < 0 else pttl / 1000.0,
            fencing_token=None,
            waiters=0,
            detail=detail,
            # As CLEAR computes it: SHA1 of the DUMP, first 16 hex characters.
            fingerprint=hashlib.sha1(dumped).hexdigest()[:16],
        )

    # -- actions ------------------------------------------------------------------------------

    def read_slot(self, key: str) -> HeldLock | None:
        """The slot at ``key`` now, or ``None`` (not held, or not a slot key)."""
        parsed = self.store.parse(key)
        if parsed is None or parsed[0] != key:
            return None
        return self.store._read_page([parsed])[0]

    def release(self, lock: HeldLock) -> bool:
        """Owner-checked release of the slot as read (its exact value)."""
        return bool(self.store.release(lock, unless_renewed=True))

    def clear_marker(self, key: str, fingerprint: str) -> bool:
        """Delete a marker (with a rate window's promised next slot) if it is unchanged."""
        suffix = next((s for s in _MARKERS if key.endswith(s)), None)
        if suffix is None or self.store.parse(key[: -len(suffix)]) is None:
            raise ValueError(f"{key!r} is not an enqueue marker, rate window or debounce marker")
        companion = key + ":next" if suffix == ":rate" else key
        return bool(self._clear(keys=[key, companion], args=[fingerprint]))

    def each_slot(self, name_prefix: str) -> list[HeldLock]:
        """Every held slot whose name starts with ``name_prefix`` (a full walk)."""
        pattern = pattern_for(self.settings.prefix, name_prefix)
        found: dict[str, HeldLock] = {}
        for node in self._nodes():
            keys = [_text(k) for k in node.scan_iter(match=pattern, count=MAX_STEP)]
            for start in range(0, len(keys), 1000):
                for row in self._rows(keys[start : start + 1000]):
                    if row.lock is not None:
                        found[row.key] = row.lock
        return sorted(found.values(), key=lambda lk: lk.key)


def _parse_cursor(cursor: str, nodes: int) -> tuple[int, int]:
    """``(node index, SCAN cursor)`` of a page cursor.

    :raises ValueError: for a cursor this walk did not hand out.
    """
    head, _, tail = cursor.partition(":")
    if not (head.isascii() and head.isdigit() and tail.isascii() and tail.isdigit()):
        raise ValueError("the page cursor must be '<node>:<cursor>', two whole numbers")
    index, position = int(head), int(tail)
    if index >= nodes or len(tail) > 20:
        raise ValueError("the page cursor does not belong to this walk")
    return index, position
