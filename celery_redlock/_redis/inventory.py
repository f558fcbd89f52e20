"""The inventory of an app's locks: what is held, by whom, until when; counters; clean-up.

What ``celery redlock`` and a dashboard read and change, in the Redis layer (no Celery)::

    inventory = Inventory("redis://localhost:6379/1", "redlock")
    page = inventory.page()                      # one SCAN step: Page(locks, cursor)
    while page.cursor != "0":
        page = inventory.page(page.cursor)       # cursors page across Cluster primaries too
    inventory.read("redlock:{proj.sync:9f…}")    # one lock, or None
    inventory.release(lock, unless_renewed=True) # owner-checked, never a renewed lease
    view = inventory.view(name_prefix="proj.")   # a dashboard's page: locks, markers, waiters
    inventory.clear_marker(view.markers[0].key, view.markers[0].fingerprint)

Every read returns :class:`HeldLock` values; a node that does not answer raises
:class:`~celery_redlock.LockUnavailable` naming it (credentials hidden), and an ACL user refused
a command raises :class:`InventoryRefused` naming the command. For a quorum (a list of URLs) a
lock is listed when a majority of nodes hold the same token; its TTL is the time until fewer
than a majority do. A minority of a quorum's nodes down changes nothing, as for the locks
themselves: the listing, reads and releases go on with the nodes that answer, and each node
that did not is reported (:meth:`Inventory.on_unanswered`, :attr:`View.unanswered`); fewer than
a majority answering raises, naming them. A node that did not answer is left out of this
inventory's calls for :data:`DOWN_FOR` seconds: a node that hangs (a paused process, a link
dropping packets) costs a whole socket timeout per call, so a listing of 10,000 locks and a
release of each would otherwise wait 5 s per page and per lock. Nodes left out that way are
asked again at once when the others are fewer than a majority, and a node that answers is
no longer left out. Timeline without: (1) two nodes of three freeze, and a page fails, naming
them; (2) they resume; (3) every page of the dashboard went on failing for 30 s, with the
old error, while ``celery redlock ls`` worked.

Every release is a compare-and-delete of the exact value that was read, so a lock that changed
owner meanwhile is never deleted:

1. ``KEY = V`` is read (held by task T on worker w1);
2. the operator decides w1 is gone;
3. V expires and a task on w2 acquires ``KEY = V'``;
4. the release compares ``V'`` with ``V``, deletes nothing: :attr:`Released.CHANGED`.

With ``unless_renewed`` the delete also requires that the lock's TTL did not grow since it was
read: a holder's renewal resets the TTL to the full lease, so a holder that renewed between the
read and the delete (alive, whatever else said it was dead) keeps its lock
(:attr:`Released.RENEWED`). Both checks run in the one script that deletes.

A :meth:`Inventory.view` is a page for people: ``SCAN`` steps over the same cursor as
:meth:`Inventory.page` until it has :data:`ROWS` keys or more (the step that reaches them
is kept whole: a cursor resumes only between steps) or has looked at :data:`BUDGET`, so the
first page costs the same at 1,000 locks or 1,000,000, and a filter that matches few keys
returns a short page and a cursor instead of walking the whole key space (a step that matched
little makes the next one look at four times as many keys, up to :data:`MAX_STEP`). Beside the
locks it lists the markers that keep calls out (:class:`Marker`: ``lock_enqueue``'s queued
marker, ``lock_rate``'s window, the newest-call marker of ``replace``/``lock_debounce``) and
counts each lock's blocking waiters. A marker is cleared only if unchanged since it was shown
(:meth:`Inventory.clear_marker` compares a digest of its ``DUMP``):

1. the page shows the queued marker of call A;
2. A starts, and a newer call B is queued: the marker now names B;
3. the operator clears "A's" marker: the digest differs, nothing is deleted (B stays queued).
"""

from __future__ import annotations

import datetime
import enum
import hashlib
import json
import re
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis as redis_py
from redis.cluster import RedisCluster

from ..exceptions import LockUnavailable
from . import owner as _owner
from . import scripts as _scripts
from .clients import (
    UNAVAILABLE_ERRORS,
    as_text,
    client_for,
    gives_client_cert,
    missing_tls_files,
    redact,
    refused,
)
from .commands import run_script
from .core import (
    Outcome,
    classify,
    connect_hint,
    denied_by_acl,
    describe,
    lost_reply,
    refusal_hints,
    warn_not_notified,
)
from .keys import (
    CHECK_NAME,
    LockKeys,
    call_key,
    fence_of,
    is_slot,
    keys_for,
    lock_pattern,
    stats_key,
    stats_pattern,
    validate_name,
)
from .nodes import majority
from .probe import acl_rule, misfit

__all__ = [
    "BUDGET",
    "MAX_FILTER",
    "PAGE",
    "ROWS",
    "HeldLock",
    "Inventory",
    "InventoryRefused",
    "Marker",
    "Page",
    "Released",
    "View",
    "add_counts",
    "check_filter",
    "lease_age",
]

T = TypeVar("T")

#: Keys per ``SCAN`` step (one :meth:`Inventory.page`), each page read in one pipelined round
#: trip per node.
PAGE = 1000

#: Keys a :meth:`Inventory.view` aims at (also the ``COUNT`` of its first step); the largest
#: ``COUNT`` of a step; the keys a view looks at, at most.
ROWS = 100
MAX_STEP = 5000
BUDGET = 50_000

#: The longest name prefix a view takes: long ``SCAN`` patterns made Redis < 7.2.6 crash
#: (CVE-2024-31228).
MAX_FILTER = 200

#: Seconds for which a quorum node that did not answer is left out of an inventory's calls.
DOWN_FOR = 30.0

#: The markers a view lists, by :class:`Marker` ``kind`` (a :class:`LockKeys` property).
MARKERS = ("queued", "rate", "newest")

_HEX = frozenset("0123456789abcdef")

#: What a plain URL sees of the locks on a server :func:`~.probe.misfit` names (a Cluster's
#: node, a Sentinel), by whether it is a Sentinel.
_UNSEEN = {
    False: "a listing leaves out the locks of other nodes' slots, or is refused (CROSSSLOT: "
    "it reads keys of several slots at once)",
    True: "no lock can be seen",
}


def _lock_name(name: str) -> str:
    """``name`` without its argument digest (a task lock's ``<lock_name>:<32 hex>``)."""
    head, _, tail = name.rpartition(":")
    is_digest = len(tail) == 32 and _HEX.issuperset(tail)
    return head if head and is_digest else name


def check_filter(name_prefix: str) -> str:
    """``name_prefix`` if a view may filter by it (``SCAN`` matches it literally).

    :raises ValueError: for one longer than :data:`MAX_FILTER`, with control characters, or
        with braces (a name has none).
    """
    if len(name_prefix) > MAX_FILTER:
        raise ValueError(f"the filter is {len(name_prefix)} characters; at most {MAX_FILTER}")
    if not name_prefix.isprintable() or "{" in name_prefix or "}" in name_prefix:
        raise ValueError("the filter must be printable and have no '{' or '}'")
    return name_prefix


class InventoryRefused(LockUnavailable):
    """The lock Redis refused a command to this ACL user (``NOPERM``); the message names it."""


class ReleaseUnanswered(LockUnavailable):
    """A release was sent, and too few nodes answered it: the key may be deleted or not.

    Timeline: the owner-checked release is written to the socket; the node hangs (stopped,
    paused by a failover) before it replies; the read times out; the node resumes and runs the
    release, deleting the key and handing it to a waiter. Reported as "cannot reach", it would
    tell the operator that the holder still holds the lock. Read the lock again to know.
    """


@dataclass(frozen=True)
class HeldLock:
    """One held lock (one slot of a lock) as read from Redis."""

    key: str
    #: The name inside the braces: ``<lock_name>:<digest>`` for a task's lock.
    name: str
    #: 1 for a lock; 1..``lock_limit`` for the slots of a semaphore.
    slot: int
    #: The stored value; ``holder`` is ``None`` when it is not a token of this package.
    value: str
    holder: _owner.Owner | None
    #: Seconds left (for a quorum: until fewer than a majority hold it); ``None``: no expiry.
    ttl: float | None
    #: The fencing counter (a quorum's or a semaphore's); ``None`` for a one-server lock, whose
    #: holder reads its token from the server clock on first use and stores none.
    fencing_token: int | None
    #: The per-call overrides the holder took it with (``apply_async(..., lock_ttl=...)``).
    overrides: dict[str, Any] | None = None
    #: The largest PTTL in ms that a node holding it answered, -1 for no expiry: the bound of
    #: :meth:`Inventory.release`'s renewal check (``None``: not read from Redis).
    pttl_ms: int | None = None

    @property
    def lock_name(self) -> str:
        """The name without the argument digest: the task's ``lock_name`` for a task lock."""
        return _lock_name(self.name)

    @property
    def fingerprint(self) -> str:
        """A digest of the stored value, for a page to show and an action to compare: never
        the value, whose secret part would let anyone who sees the page release the lock as
        its owner."""
        return hashlib.sha256(self.value.encode()).hexdigest()[:16]

    def as_dict(self, alive: str | None = None) -> dict[str, Any]:
        """JSON-ready fields; the token's secret part is never shown, only its first 8 chars.
        ``cooldown``: the task ended and ``lock_cooldown`` keeps the slot until its TTL ends."""
        holder = self.holder
        out: dict[str, Any] = {
            "key": self.key,
            "name": self.name,
            "lock_name": self.lock_name,
            "slot": self.slot,
            "task_id": holder.task_id if holder else None,
            "host": holder.host if holder else None,
            "pid": holder.pid if holder else None,
            "acquired_ms": holder.acquired_ms if holder else None,
            "acquired_at": iso(holder.acquired_ms) if holder else None,
            "ttl": self.ttl,
            "fencing_token": self.fencing_token,
            "token_prefix": self.value[:8],
            "overrides": self.overrides,
            "cooldown": holder.cooling if holder else False,
        }
        if alive is not None:
            out["alive"] = alive
        return out


def add_counts(url: str, key: str, counts: Mapping[str, int]) -> dict[str, BaseException]:
    """Add ``counts`` (``{event: n}``) to the counter hash ``key`` on the Redis at ``url``, in
    one pipelined round trip (``HINCRBY`` each): what :mod:`celery_redlock.metrics` flushes and
    :meth:`Inventory.counters` reads. A node that does not answer raises redis-py's error.

    Returns the events that were not added, with the error reply of each (a field that is no
    whole number, a key that is no hash, an ACL without ``HINCRBY``). The others were added:
    the pipeline is no transaction, so sending them again would count them twice."""
    pipe = client_for(url).pipeline(transaction=False)
    for event, n in counts.items():
        pipe.hincrby(key, event, n)
    replies = pipe.execute(raise_on_error=False)
    return {
        event: reply
        for event, reply in zip(counts, replies, strict=True)
        if isinstance(reply, BaseException)
    }


#: A reply refused with ``WRONGTYPE`` (:func:`_replies`).
FOREIGN = object()


def _replies(pipe: Any) -> list[Any]:
    """Run ``pipe``. A reply refused with ``WRONGTYPE`` becomes :data:`FOREIGN`: another
    program's key under the prefix, of a type ours never have, is left out of what is shown
    instead of failing the whole page or listing as an outage. Any other error is raised (a
    refusal such as ``NOPERM``, or no answer: not the key's fault)."""
    replies = pipe.execute(raise_on_error=False)
    for reply in replies:
        if isinstance(reply, Exception) and "WRONGTYPE" not in str(reply):
            raise reply
    return [FOREIGN if isinstance(reply, Exception) else reply for reply in replies]


def iso(ms: int) -> str:
    """Milliseconds since the epoch as an ISO 8601 UTC time."""
    moment = datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)
    return moment.isoformat(timespec="milliseconds")


def lease_age(lock: HeldLock, lease: float) -> float | None:
    """Seconds since ``lock``'s TTL was last set to ``lease`` (by its acquisition or a
    renewal), read from what is left of it; ``None`` when its TTL is longer than ``lease``,
    it has no expiry (a fixed ``lock_ttl``, a lock of another lease: not renewed with this
    one), or it may be cut short by the holder's ``max_hold`` (:func:`capped`).

    A renewing holder resets its TTL to the lease about every ``lease / 3``: a small age
    proves a holder that was alive that recently.
    """
    if lock.ttl is None or lock.ttl > lease or capped(lock, lease):
        return None
    return lease - lock.ttl


def capped(lock: HeldLock, lease: float) -> bool:
    """Whether ``lock``'s TTL may be its holder's ``max_hold`` cap rather than a lease: a
    renewal then sets it to what is left of the cap, so it shows no renewal, and the key
    expires by itself at the cap. Judged by this machine's clock against the holder's
    acquisition time; a clock behind the holder's by less than a third of the lease changes
    nothing (the age the cap gives starts from 0 when it begins to bind)."""
    holder = lock.holder
    if holder is None or holder.max_hold_ms is None:
        return False
    left = holder.acquired_ms + holder.max_hold_ms - time.time() * 1000
    return left < lease * 1000


@dataclass(frozen=True)
class Page:
    """One :meth:`Inventory.page`: the locks of one ``SCAN`` step and where to go on."""

    locks: list[HeldLock]
    #: Pass to the next :meth:`Inventory.page`; ``"0"`` once every node is scanned. A page may
    #: be empty while the cursor is not ``"0"`` (a step that found no lock).
    cursor: str


@dataclass(frozen=True)
class Marker:
    """A companion key that keeps calls out of a lock, as read by :meth:`Inventory.view`."""

    key: str
    #: The lock's name (inside the braces).
    name: str
    #: ``queued`` (``lock_enqueue``), ``rate`` (``lock_rate``'s window) or ``newest`` (the
    #: newest-call marker of ``lock_enqueue='replace'`` and ``lock_debounce``).
    kind: str
    #: Seconds left; ``None``: no expiry.
    ttl: float | None
    #: The queued call's task id, or the newest call's; ``None`` for a rate window.
    task_id: str | None
    #: Starts in a rate window; ``None`` for the other kinds.
    starts: int | None
    #: What :meth:`Inventory.clear_marker` compares: the first 16 hex characters of the SHA1
    #: of the marker's ``DUMP`` (as ``CLEAR_MARKER`` computes it).
    fingerprint: str

    @property
    def lock_name(self) -> str:
        """The name without the argument digest, as :attr:`HeldLock.lock_name`."""
        return _lock_name(self.name)


@dataclass(frozen=True)
class View:
    """One :meth:`Inventory.view`: the locks and markers of a few ``SCAN`` steps."""

    #: Sorted by key.
    locks: list[HeldLock]
    markers: list[Marker]
    #: Blocking waiters queued for each lock, by :attr:`HeldLock.key` (0 for none).
    waiters: dict[str, int]
    #: Pass to the next :meth:`Inventory.view` (or :meth:`Inventory.page`); ``"0"``: done.
    cursor: str
    #: Keys the ``SCAN`` steps looked at (their ``COUNT``), at most :data:`BUDGET`.
    looked_at: int
    #: The quorum nodes that did not answer while a majority did (the view shows what the
    #: majority holds): ``{node URL, credentials hidden: why}``.
    unanswered: dict[str, str] = field(default_factory=dict)


class Released(enum.Enum):
    """What :meth:`Inventory.release` did."""

    #: Deleted (waiters woken, or the first queued waiter handed the lock).
    RELEASED = "released"
    #: Nothing deleted: it expired or changed owner since it was read.
    CHANGED = "changed"
    #: Nothing deleted: its holder renewed it since it was read (``unless_renewed``).
    RENEWED = "renewed"

    def __bool__(self) -> bool:
        """True only for :attr:`RELEASED` (``release`` used to return a bool)."""
        return self is Released.RELEASED


class Inventory:
    """The Redis node(s) holding the locks under ``prefix``: list, read, release, clean up.

    :param url: one URL (a server, Sentinel or Cluster), or the URLs of a quorum.
    """

    def __init__(self, url: str | Sequence[str], prefix: str) -> None:
        self.urls = [url] if isinstance(url, str) else list(url)
        self.prefix = prefix
        self.quorum = majority(len(self.urls)) if len(self.urls) > 1 else 1
        #: Quorum nodes that did not answer: ``{index: (when, error)}`` (:data:`DOWN_FOR`).
        self._down: dict[int, tuple[float, LockUnavailable]] = {}
        #: Whether the server was found fit for a listing (:meth:`_check_fit`): ``None``
        #: until checked, else ``True`` or why not, raised on every call (the dashboard keeps
        #: one inventory for its life: it listed that node's own locks from its second page
        #: view on).
        self._fits: bool | str | None = None

    def on_unanswered(self, node: str, error: LockUnavailable) -> None:
        """Called for each quorum node that did not answer a read or a release while a majority
        did (the call went on without it), and for each Cluster primary that did not answer a
        listing while another did (its slots' locks are left out): ``node`` is its URL
        (``host:port`` for a primary), credentials hidden, and ``error`` says what failed.
        Does nothing; a command line overrides it to warn."""

    # -- listing --------------------------------------------------------------------------------

    def page(
        self,
        cursor: str = "0",
        *,
        name_prefix: str = "",
        task_id: str | None = None,
        count: int = PAGE,
    ) -> Page:
        """The held locks of one ``SCAN`` step of about ``count`` keys from ``cursor`` (``"0"``:
        the start), whose name starts with ``name_prefix`` (matched by ``SCAN`` itself) and,
        with ``task_id``, whose holder is that task id.

        The cursor walks the nodes in turn: the primaries of a Cluster, the nodes of a quorum
        (a quorum lock is listed by the first node that holds it). As with ``SCAN``, a lock held
        during the whole walk is listed at least once, and may be listed twice when the key
        space shrinks a lot meanwhile.
        """
        i, raw, next_cursor = self._step(cursor, lock_pattern(self.prefix, name_prefix), count)
        locks = self._read_page(self._slots(raw), listed_by=i if self.quorum > 1 else None)
        kept = [
            lock
            for lock in locks
            if lock is not None
            and (task_id is None or (lock.holder is not None and lock.holder.task_id == task_id))
        ]
        return Page(kept, next_cursor)

    def view(self, cursor: str = "0", *, name_prefix: str = "", lock_name: str = "") -> View:
        """The locks, markers and waiter counts of ``SCAN`` steps from ``cursor`` (``"0"``: the
        start) until :data:`ROWS` locks or markers matched (the last step is kept whole, so a
        page can hold more than :data:`ROWS`; on a quorum's later nodes, a lock an earlier node
        listed is left out, so their pages can be short) or :data:`BUDGET` keys were looked
        at; names start with ``name_prefix`` (:func:`check_filter`). ``lock_name`` keeps only the
        locks and markers of that lock name (a task's: ``<lock_name>:<digest>``), which a prefix
        cannot say: ``a:`` selects the task ``a:b``'s locks too. Read-only: ``SCAN``, then one
        pipelined round trip per node for the locks (as :meth:`page`) and one for the markers
        and the waiters.

        :raises ValueError: for a refused filter or a cursor this walk did not hand out.
        """
        pattern = lock_pattern(self.prefix, check_filter(name_prefix))
        # By the index of the node that listed them: slot keys, and markers {key: (name, kind)}.
        slots: dict[int, list[str]] = {}
        named: dict[int, dict[str, tuple[str, str]]] = {}
        missed: dict[str, str] = {}
        looked_at, count, matched = 0, ROWS, 0
        while True:
            i, raw, cursor = self._step(cursor, pattern, count, missed)
            looked_at += count
            rows = 0
            for key in map(as_text, raw):
                if is_slot(key):
                    slots.setdefault(i, []).append(key)
                elif (marker := self._marker(key)) is not None:
                    named.setdefault(i, {})[key] = marker[1:]
                else:  # a fence or a call record, beside a lock: no row
                    continue
                rows += 1
            matched += rows
            if rows < count // 2:  # steps of fences alone grow too (a day's names keep one)
                count = min(count * 4, MAX_STEP)
            if cursor == "0" or matched >= ROWS or looked_at >= BUDGET:
                break
        locks: dict[str, HeldLock] = {}
        markers: dict[str, Marker] = {}
        for i in sorted(slots.keys() | named.keys()):
            listed_by = i if self.quorum > 1 else None
            page = self._slots(slots.get(i, []))
            for lock in self._read_page(page, listed_by=listed_by, missed=missed):
                if lock is not None and lock.lock_name == (lock_name or lock.lock_name):
                    locks[lock.key] = lock
            markers.update(
                (m.key, m)
                for m in self._read_markers(i, named.get(i, {}))
                if m.lock_name == (lock_name or m.lock_name)
            )
        held = sorted(locks.values(), key=lambda lk: lk.key)
        return View(
            held,
            sorted(markers.values(), key=lambda m: m.key),
            self._waiters(held),
            cursor,
            looked_at,
            missed,
        )

    def pages(self, *, name_prefix: str = "") -> Iterator[list[HeldLock]]:
        """Every held lock, a :meth:`page` at a time: memory stays flat."""
        cursor = "0"
        while True:
            page = self.page(cursor, name_prefix=name_prefix)
            if page.locks:
                yield page.locks
            cursor = page.cursor
            if cursor == "0":
                return

    def all(
        self, where: Callable[[HeldLock], bool] | None = None, *, name_prefix: str = ""
    ) -> list[HeldLock]:
        """Every held lock once (those for which ``where`` is true), sorted by key."""
        unique = {
            lock.key: lock
            for page in self.pages(name_prefix=name_prefix)
            for lock in page
            if where is None or where(lock)
        }
        return sorted(unique.values(), key=lambda lk: lk.key)

    def of_lock_name(self, lock_name: str) -> list[HeldLock]:
        """The held locks whose :attr:`HeldLock.lock_name` is ``lock_name`` (every argument
        digest of a task's lock), sorted by key."""
        return self.all(lambda lock: lock.lock_name == lock_name, name_prefix=lock_name)

    def of_task_id(self, task_id: str) -> list[HeldLock]:
        """The held locks whose holder is the task id ``task_id``, sorted by key."""
        return self.all(lambda lock: lock.holder is not None and lock.holder.task_id == task_id)

    def read(self, key: str) -> HeldLock | None:
        """The lock at ``key`` (a slot key or a bare name), or ``None`` when nobody holds it."""
        parsed = self.parse(key)
        return None if parsed is None else self._read_page([parsed])[0]

    def parse(self, key: str) -> tuple[str, str, int] | None:
        """``(slot key, name, slot)`` of a slot key, or of a bare name (its first slot)."""
        head = f"{self.prefix}:{{"
        if not key.startswith(head):
            try:
                return keys_for(self.prefix, key).lock, key, 1
            except ValueError:
                return None
        name, _, tail = key[len(head) :].rpartition("}")
        # Slot 1 has no suffix and slot i >= 2 ends in ":<i>" (keys_for): checked here without
        # building the slots, which for a key ending in ":99999999" would be as many names.
        number = tail[1:]
        canonical = number.isascii() and number.isdigit() and number[0] != "0" and number != "1"
        if tail and not (tail[0] == ":" and canonical):
            return None
        try:
            validate_name(name)
        except ValueError:
            return None
        return key, name, int(number) if tail else 1

    # -- changing -------------------------------------------------------------------------------

    def release(self, lock: HeldLock, *, unless_renewed: bool = False) -> Released:
        """Delete ``lock.key`` only if it still holds ``lock.value`` (and, ``unless_renewed``,
        only if its TTL did not grow since it was read); on every node of a quorum."""
        keys = keys_for(self.prefix, lock.name)
        limit = lock.pttl_ms if unless_renewed else None

        unanswered: list[BaseException] = []  # sent, and no reply came: it may have run

        def one(client: Any) -> int:
            # Handoff as the holder's own release does it: on one plain node only (a quorum's
            # and a Cluster's waiters listen on the shared channel; see scripts.RELEASE).
            cluster = isinstance(client, RedisCluster)
            handoff = len(self.urls) == 1 and not cluster
            # A quorum's nodes wake nobody: the waiters are woken once every node answered.
            call = _scripts.release_unrenewed_call(
                keys, lock.key, lock.value, limit, handoff, len(self.urls) == 1, cluster
            )
            try:
                return int(run_script(client, _scripts.RELEASE_UNRENEWED, *call))
            except Exception as exc:
                if lost_reply(exc):
                    unanswered.append(exc)
                raise

        try:
            answers = self._each(one)
        except LockUnavailable as exc:
            if not unanswered:  # refused, or never sent: certainly not released
                raise
            raise ReleaseUnanswered(
                f"no answer to the release of {lock.key}, which may have happened or not: "
                f"read the lock again ({exc})",
                key=lock.key,
                nodes=exc.nodes,
            ) from exc
        replies = [r for r in answers if r is not None]
        if len(self.urls) > 1 and any(r > 0 for r in replies):
            answers = self._wake(keys, answers)
        refused = [  # the nodes where the user lacks +publish or +zpopmin
            redact(url)
            for url, reply in zip(self.urls, answers, strict=True)
            if reply == _scripts.RELEASED_NOT_NOTIFIED
        ]
        if refused:
            warn_not_notified(lock.key, refused)
        failed = len(self.urls) - len(replies)
        if sum(1 for r in replies if r > 0) + failed >= self.quorum:
            # Released on a majority even if one node saw a renewal meanwhile: the lock is
            # gone, and its holder's next renewal finds it lost (reporting RENEWED would tell
            # the operator the holder kept a lock that no majority holds any more).
            return Released.RELEASED
        if -1 in replies:
            return Released.RENEWED
        return Released.CHANGED

    def _wake(self, keys: LockKeys, answers: list[int | None]) -> list[int | None]:
        """After a quorum release freed the lock on every node: wake the waiters on each node
        that answered (see :meth:`~celery_redlock._redis.nodes.Quorum.wake`); ``answers``,
        with :data:`~._scripts.RELEASED_NOT_NOTIFIED` where ``PUBLISH`` was refused. A node
        that does not answer is not the release's error: its waiters wake at the TTL."""
        out = list(answers)
        for i, reply in enumerate(answers):
            if reply is not None:
                try:
                    self._client(i).publish(keys.channel, "1")
                except Exception as exc:  # a node that fails now: its waiters wake at the TTL
                    if classify(exc) is Outcome.REFUSED:
                        out[i] = _scripts.RELEASED_NOT_NOTIFIED
        return out

    def queued(self, name: str) -> str | None:
        """The task id of ``name``'s queued call (``lock_enqueue``), or ``None``."""
        marker = self._first(lambda c: c.get(keys_for(self.prefix, name).queued))
        return None if marker is None else as_text(marker)

    def clear_marker(self, key: str, fingerprint: str) -> bool:
        """Delete the marker at ``key`` (a rate window with its promised next slot) if its
        :attr:`Marker.fingerprint` is still ``fingerprint``, on every node; whether it did.
        The next call is then queued, marked or admitted afresh.

        :raises ValueError: when ``key`` is not a marker's key under the prefix.
        """
        marker = self._marker(key)
        if marker is None:
            raise ValueError(f"{key!r} is not an enqueue marker, rate window or debounce marker")
        keys, _, kind = marker
        if kind == "newest" and len(self.urls) > 1:
            return self._clear_newest(key, fingerprint)
        call = ([key, keys.rate_next if kind == "rate" else key], [fingerprint])
        cleared = self._each(lambda c: run_script(c, _scripts.CLEAR_MARKER, *call))
        return any(bool(r) for r in cleared)

    def _clear_newest(self, key: str, fingerprint: str) -> bool:
        """A quorum's newest-call marker: on every node, each copy numbered by that node's
        clock, so no two copies have one fingerprint. The copies naming the call of the copy
        shown are cleared, each by its own fingerprint, when the shown copy is still there;
        a copy rewritten since it was read is kept, as :data:`CLEAR_MARKER` keeps it."""

        def read(client: Any) -> tuple[str, Any] | None:
            dumped, newest = client.dump(key), client.hget(key, "id")
            return (
                None if dumped is None else (hashlib.sha1(bytes(dumped)).hexdigest()[:16], newest)
            )

        copies = self._each(read)
        matching = [c for c in copies if c is not None and c[0] == fingerprint]
        if not matching:
            return False
        shown = matching[0][1]  # None: a call numbered whose publish was never confirmed
        cleared = False
        for i, copy in enumerate(copies):
            if copy is None or copy[1] != shown:
                continue
            try:
                call = ([key, key], [copy[0]])
                cleared |= bool(run_script(self._client(i), _scripts.CLEAR_MARKER, *call))
            except Exception as exc:
                error = self._failure(self.urls[i], exc)
                if isinstance(error, InventoryRefused):
                    raise error from exc
                self.on_unanswered(redact(self.urls[i]), error)
        return cleared

    # -- counters -------------------------------------------------------------------------------

    def counters(self) -> dict[str, dict[str, int]]:
        """The event counters of every task under the prefix, ``{task: {event: count}}``,
        summed over all processes (they live on the first node). On a quorum, the error of a
        first node that fails says that only the counters need it: "cannot reach the lock
        Redis" read as an outage of every lock while they worked on the majority."""
        client = self._client(0)
        head = stats_key(self.prefix, "")
        out: dict[str, dict[str, int]] = {}
        try:
            page: list[Any] = []
            for key in client.scan_iter(match=stats_pattern(self.prefix), count=PAGE):
                page.append(key)
                if len(page) == PAGE:
                    self._count(client, page, head, out)
                    page = []
            self._count(client, page, head, out)
        except Exception as exc:
            failure = self._failure(self.urls[0], exc)
            if len(self.urls) > 1 and type(failure) is LockUnavailable:
                failure = LockUnavailable(
                    f"{failure}; the counters live on the quorum's first node only (the locks "
                    "need a majority: `celery redlock ls` lists them)",
                    nodes=failure.nodes,
                )
            raise failure from exc
        return out

    @staticmethod
    def _count(client: Any, page: list[Any], head: str, out: dict[str, dict[str, int]]) -> None:
        """Read ``page``'s counter hashes into ``out``, leaving out what is no counter: the
        startup check's throwaway hash (:data:`~celery_redlock._redis.keys.CHECK_NAME`), a
        key of another type, a field that is not a whole number (another program's keys
        under the prefix must not make every count unreadable)."""
        pipe = client.pipeline(transaction=False)
        for key in page:
            pipe.hgetall(key)
        replies = _replies(pipe) if page else []
        for key, values in zip(page, replies, strict=True):
            if values is FOREIGN:
                continue
            task = as_text(key)[len(head) :]
            if task.startswith(CHECK_NAME):
                continue
            out[task] = {
                as_text(k): int(v) for k, v in values.items() if re.fullmatch(rb"-?\d+", v)
            }

    # -- internals ------------------------------------------------------------------------------

    def _client(self, i: int) -> Any:
        try:
            client = client_for(self.urls[i])
        except Exception as exc:
            raise self._failure(self.urls[i], exc) from exc
        if self._fits is None:
            self._check_fit(client)
        if isinstance(self._fits, str):
            raise LockUnavailable(self._fits, nodes=(redact(self.urls[i]),))
        return client

    def _check_fit(self, client: Any) -> None:
        """Find whether the one plain URL reaches a server through which the locks cannot be
        listed (:func:`~.probe.misfit`: a Sentinel, or any node of a Redis Cluster), and then
        why, naming the URL to use; once per inventory, by one ``INFO`` (asked again only
        after an ``INFO`` that got no answer). An ``INFO`` that is refused (an ACL without
        ``+info``) checks nothing: a listing of a Cluster node then shows its own slots' locks
        only, and a read of a key in another slot is refused with ``MOVED`` and the same hint
        (:func:`~.core.refusal_hints`)."""
        url = self.urls[0]
        if len(self.urls) > 1 or isinstance(client, RedisCluster):
            self._fits = True
            return
        try:
            info = client.info()
        except Exception as exc:
            error = self._failure(url, exc)
            if type(error) is LockUnavailable and error.nodes:  # no answer: say so
                raise error from exc
            self._fits = True  # refused: not known
            return
        found = misfit(client, info, listing=True)
        self._fits = (
            True
            if found is None
            else f"the lock Redis at {redact(url)} is {found.what}: through a "
            f"{url.partition('://')[0]}:// URL {_UNSEEN[found.sentinel]}; {found.fix}"
        )

    def _step(
        self, cursor: str, pattern: str, count: int, missed: dict[str, str] | None = None
    ) -> tuple[int, list[Any], str]:
        """One ``SCAN`` step of about ``count`` keys from ``cursor``: the index of the node
        scanned, the keys matching ``pattern``, and the cursor to go on from (``"0"``: every
        node is scanned). The one walker of :meth:`page` and :meth:`view`.

        A quorum node that does not answer is skipped (no keys, the cursor goes on to the next
        node) once a majority of the nodes answer a ``PING`` (else this raises): a lock is held
        by a majority, so the nodes that answer list it."""
        targets = self._targets()
        i, position = _cursor(cursor, len(targets))
        client, node = targets[i]
        if i in self._known_down():
            self._each(lambda c: c.ping(), missed)  # a majority still answers, or this raises
        if i in self._known_down():  # not asked again: the others make a majority
            return i, [], f"{i + 1}:0" if i + 1 < len(targets) else "0"
        try:
            if node is None:
                next_scan, raw = client.scan(position, match=pattern, count=count)
            else:
                cursors, raw = client.scan(position, match=pattern, count=count, target_nodes=node)
                next_scan = next(iter(cursors.values()))
        except Exception as exc:
            error = self._failure(self.urls[i if len(self.urls) > 1 else 0], exc)
            if isinstance(error, InventoryRefused) or (len(self.urls) == 1 and node is None):
                raise error from exc
            if node is None:
                self._down[i] = (time.monotonic(), error)
                self._each(lambda c: c.ping(), missed)
            else:
                self._primary_down(client, node, error, missed)
            next_scan, raw = 0, []
        if int(next_scan) != 0:
            return i, list(raw), f"{i}:{int(next_scan)}"
        return i, list(raw), f"{i + 1}:0" if i + 1 < len(targets) else "0"

    def _primary_down(
        self, client: Any, node: Any, error: LockUnavailable, missed: dict[str, str] | None
    ) -> None:
        """A Cluster primary that did not answer the walk: the locks in its slots are left out
        (they are unreachable to their holders too), and the walk goes on while another
        primary answers a ``PING``; else this raises ``error``. Timeline without it: (1) one
        of three primaries dies, the others serve their slots (full coverage off); (2) an
        operator runs ``celery redlock ls``, or ``release --dead`` for the dead workers'
        locks; (3) both failed, "cannot reach the lock Redis", when they are needed most."""
        others = [n for n in client.get_primaries() if n.name != node.name]
        for other in others:
            try:
                client.ping(target_nodes=other)
                break
            except Exception:
                continue
        else:
            raise error
        if missed is not None:
            missed[node.name] = str(error)
        self.on_unanswered(node.name, error)

    def _slots(self, keys: Iterable[Any]) -> list[tuple[str, str, int]]:
        """``(slot key, name, slot)`` of each slot key among the keys a ``SCAN`` matched (once
        each: a ``SCAN`` may return a key twice)."""
        parsed: dict[str, tuple[str, str, int]] = {}
        for item in keys:
            key = as_text(item)
            slot = self.parse(key) if is_slot(key) else None
            if slot is not None:
                parsed[key] = slot
        return list(parsed.values())

    def _marker(self, key: str) -> tuple[LockKeys, str, str] | None:
        """The keys and the name of the lock whose marker ``key`` is, and the :class:`Marker`
        kind; ``None`` for any other key."""
        head = f"{self.prefix}:{{"
        name = key[len(head) : key.rfind("}")] if key.startswith(head) else ""
        try:
            keys = keys_for(self.prefix, name)
        except ValueError:
            return None
        kind = next((kind for kind in MARKERS if getattr(keys, kind) == key), None)
        return None if kind is None else (keys, name, kind)

    def _read_markers(self, i: int, named: dict[str, tuple[str, str]]) -> list[Marker]:
        """The markers ``{key: (name, kind)}`` found on the ``i``-th node of the walk, read
        there: one pipelined round trip (a quorum keeps its newest-call markers on every node,
        the others on the first node that answers; on a later node, one more per earlier node
        for the newest-call markers, :meth:`_not_listed_before`). A marker gone since the
        ``SCAN`` is left out."""
        if i > 0 and len(self.urls) > 1:
            named = self._not_listed_before(i, named)
        if not named:
            return []
        client = self._targets()[i][0]
        url = self.urls[i if len(self.urls) > 1 else 0]
        pipe = client.pipeline(transaction=False)
        for key, (_, kind) in named.items():
            pipe.pttl(key)
            pipe.dump(key)
            if kind == "queued":
                pipe.get(key)
            elif kind == "rate":
                pipe.llen(key)
            else:
                pipe.hget(key, "id")
        try:
            replies = _replies(pipe)
        except Exception as exc:
            raise self._failure(url, exc) from exc
        out = []
        for n, (key, (name, kind)) in enumerate(named.items()):
            pttl, dumped, info = replies[3 * n : 3 * n + 3]
            if dumped is None or info is FOREIGN:
                continue
            out.append(
                Marker(
                    key=key,
                    name=name,
                    kind=kind,
                    ttl=None if int(pttl) < 0 else int(pttl) / 1000.0,
                    task_id=None if kind == "rate" or info is None else as_text(info),
                    starts=int(info or 0) if kind == "rate" else None,
                    fingerprint=hashlib.sha1(bytes(dumped)).hexdigest()[:16],
                )
            )
        return out

    def _not_listed_before(
        self, i: int, named: dict[str, tuple[str, str]]
    ) -> dict[str, tuple[str, str]]:
        """On a quorum's ``i``-th node, the markers of ``named`` that no earlier node lists: a
        newest-call marker is on every node (:mod:`~celery_redlock._redis.companions`), and is
        listed by the first node that has it, as a lock is. An earlier node that does not
        answer lists nothing."""
        newest = [key for key, (_, kind) in named.items() if kind == "newest"]
        for j in range(i):
            if not newest:
                break
            if j in self._known_down():
                continue
            pipe = self._client(j).pipeline(transaction=False)
            for key in newest:
                pipe.exists(key)
            try:
                found = _replies(pipe)
            except Exception as exc:
                if classify(exc) is None:
                    raise
                continue
            newest = [key for key, there in zip(newest, found, strict=True) if not there]
        listed = set(named) - {k for k, (_, kind) in named.items() if kind == "newest"}
        return {key: value for key, value in named.items() if key in listed or key in newest}

    def _waiters(self, locks: Sequence[HeldLock]) -> dict[str, int]:
        """The blocking waiters queued for each of ``locks``, by key, read on the first node
        (one ``EXISTS`` for them all where it can: waiters are rare; a ``ZCARD`` each then).
        None for a quorum: its waiters never queue (they listen on the release channel)."""
        counts = dict.fromkeys((lock.key for lock in locks), 0)
        if not locks or len(self.urls) > 1:
            return counts
        queues = [keys_for(self.prefix, lock.name).waiters for lock in locks]
        client = self._client(0)
        try:
            if not isinstance(client, RedisCluster) and not client.exists(*queues):
                return counts
            pipe = client.pipeline(transaction=False)
            for queue in queues:
                pipe.zcard(queue)
            replies = _replies(pipe)
        except Exception as exc:
            raise self._failure(self.urls[0], exc) from exc
        counts.update(
            (lock.key, 0 if n is FOREIGN else int(n or 0))
            for lock, n in zip(locks, replies, strict=True)
        )
        return counts

    def _targets(self) -> list[tuple[Any, Any]]:
        """What the cursor walks: ``(client, cluster node or None)`` in a stable order."""
        if len(self.urls) > 1:
            return [(self._client(i), None) for i in range(len(self.urls))]
        client = self._client(0)
        if not isinstance(client, RedisCluster):
            return [(client, None)]
        try:
            primaries = client.get_primaries()
        except Exception as exc:
            raise self._failure(self.urls[0], exc) from exc
        return [(client, node) for node in sorted(primaries, key=lambda n: n.name)]

    def _failure(self, url: str, exc: BaseException) -> LockUnavailable:
        """``exc`` from the node at ``url`` as the error to raise (credentials hidden)."""
        shown = redact(url)
        if isinstance(exc, LockUnavailable):
            return exc
        if isinstance(exc, redis_py.exceptions.ResponseError) and refused(exc):
            text = str(exc)
            if denied_by_acl(text) or isinstance(exc, redis_py.exceptions.NoPermissionError):
                rule = acl_rule(text, self.prefix)
                grant = (
                    f"grant the ACL user {rule}; the guide's ACL section lists what the "
                    "command line and the dashboard need"
                    if rule
                    else "grant that command to the ACL user: the command line needs +scan "
                    "+exists +mget +pttl +hgetall +zpopmin +zrange +zrem, see the guide's ACL "
                    "section"
                )
                return InventoryRefused(
                    f"permission denied by the lock Redis at {shown}: {redact(exc)} ({grant})",
                    nodes=(shown,),
                )
            text, hints = refusal_hints(exc)
            return LockUnavailable(
                f"the lock Redis at {shown} refused: {redact(text)}"
                + "".join(f" ({hint})" for hint in hints)
            )
        if isinstance(exc, redis_py.exceptions.AuthenticationError):  # it answered: no outage
            parts = urllib.parse.urlsplit(url)
            if parts.password is None and "password" not in urllib.parse.parse_qs(parts.query):
                what = (
                    "wants a password (or an ACL user) that the URL does not give: add it to "
                    "redlock_url"
                )
            else:
                what = (
                    "refused the URL's credentials (a wrong password or ACL user: fix redlock_url)"
                )
            return LockUnavailable(
                f"the lock Redis at {shown} {what}: {redact(exc)}", nodes=(shown,)
            )
        if isinstance(exc, (*UNAVAILABLE_ERRORS, redis_py.RedisError)):
            return LockUnavailable(
                f"cannot reach the lock Redis: {shown} ({_reason(url, exc)})", nodes=(shown,)
            )
        raise exc  # a bug, not Redis: its own traceback

    def _each(
        self, call: Callable[[Any], T], missed: dict[str, str] | None = None
    ) -> list[T | None]:
        """``call(client)`` on every node but those known down (:meth:`_known_down`); ``None``
        for a node that does not answer. Raises when fewer than a majority answer, or
        on a refused permission; else reports each node that did not answer
        (:meth:`on_unanswered`, and into ``missed``)."""
        out: list[T | None] = []
        failed = self._known_down()
        if len(failed) > len(self.urls) - self.quorum:  # left out, no majority: ask them again
            failed = {}
        for i in range(len(self.urls)):
            if i in failed:
                out.append(None)
                continue
            try:
                out.append(call(self._client(i)))
                self._down.pop(i, None)
            except Exception as exc:
                error = self._failure(self.urls[i], exc)
                if isinstance(error, InventoryRefused):
                    raise error from exc
                out.append(None)
                failed[i] = error
                if len(self.urls) > 1:
                    self._down[i] = (time.monotonic(), error)
        errors = [failed[i] for i in sorted(failed)]
        if len(errors) > len(self.urls) - self.quorum:
            if len(errors) == 1:
                raise errors[0]
            raise LockUnavailable(
                f"fewer than {self.quorum} of the {len(self.urls)} lock Redis nodes answer: "
                + "; ".join(map(str, errors)),
                nodes=tuple(n for e in errors for n in e.nodes),
            )
        for i in sorted(failed):
            node = redact(self.urls[i])
            if missed is not None:
                missed[node] = str(failed[i])
            self.on_unanswered(node, failed[i])
        return out

    def _known_down(self) -> dict[int, LockUnavailable]:
        """The quorum nodes that did not answer within the last :data:`DOWN_FOR` seconds."""
        now = time.monotonic()
        return {i: error for i, (when, error) in list(self._down.items()) if now - when < DOWN_FOR}

    def _first(self, call: Callable[[Any], T]) -> T | None:
        """``call(client)`` on the nodes in turn: the first answer that is not ``None``."""
        return next((r for r in self._each(call) if r is not None), None)

    def _read_page(
        self,
        parsed: Sequence[tuple[str, str, int]],
        listed_by: int | None = None,
        missed: dict[str, str] | None = None,
    ) -> list[HeldLock | None]:
        """The lock at each ``(slot key, name, slot)``: one pipelined round trip per node (a
        second one when some of them have a fencing counter or a call record). With
        ``listed_by`` (a quorum node's index), a lock that an earlier node holds is left out:
        that node lists it."""
        if not parsed:
            return []
        # As bytes: redis-py sends bytes as they are, and a str is encoded argument by argument.
        keys = [key.encode() for key, _, _ in parsed]
        fences = [fence_of(key).encode() for key, _, _ in parsed]
        records = [call_key(key).encode() for key, _, _ in parsed]

        def many(client: Any) -> list[tuple[Any, ...]]:
            pipe = client.pipeline(transaction=False)
            if isinstance(client, RedisCluster):  # keys of other slots: one GET each
                for key, fence, record in zip(keys, fences, records, strict=True):
                    pipe.get(key)
                    pipe.get(fence)
                    pipe.get(record)
                for key in keys:
                    pipe.pttl(key)
                flat = pipe.execute()
                n = 3 * len(keys)
                return list(zip(flat[0:n:3], flat[n:], flat[1:n:3], flat[2:n:3], strict=True))
            # An MGET and a PTTL script for the whole page, and an EXISTS each for the fencing
            # counters and the call records: few locks have them (a quorum's or a semaphore's
            # counter; per-call overrides), and a count is one reply to parse where an MGET is
            # one per lock. A page that has some reads them with an MGET more.
            pipe.mget(keys)
            pipe.script_load(_scripts.PTTLS)  # in the same round trip: never a NOSCRIPT
            pipe.evalsha(_scripts.sha1(_scripts.PTTLS), len(keys), *keys)
            pipe.exists(*fences)
            pipe.exists(*records)
            values, _, pttls, any_fenced, any_recorded = pipe.execute()
            none = [None] * len(keys)
            fenced = client.mget(fences) if any_fenced else none
            recorded = client.mget(records) if any_recorded else none
            return list(zip(values, pttls, fenced, recorded, strict=True))

        per_node = self._each(many, missed)
        out: list[HeldLock | None] = []
        for k, (key, name, slot) in enumerate(parsed):
            replies = [node[k] for node in per_node if node is not None]
            if listed_by is not None and any(
                node is not None and node[k][0] is not None for node in per_node[:listed_by]
            ):
                out.append(None)
                continue
            out.append(self._held(key, name, slot, replies))
        return out

    def _held(
        self, key: str, name: str, slot: int, replies: Sequence[tuple[Any, ...]]
    ) -> HeldLock | None:
        """What the nodes' ``(value, pttl, fence, call record)`` replies say about ``key``."""
        if self.quorum == 1 and len(replies) == 1:  # one node: its reply is the answer
            raw, raw_pttl, fence, record = replies[0]
            if raw is None:
                return None
            value, pttl = as_text(raw), int(raw_pttl)
            largest = pttl
            fencing = None if fence is None else int(fence)
            overrides = None if record is None else _overrides(value, [record])
        else:
            replies = [r for r in replies if r[0] is not None]
            values = [as_text(r[0]) for r in replies]
            majority_value = max(set(values), key=values.count) if values else None
            if majority_value is None or values.count(majority_value) < self.quorum:
                return None
            value = majority_value
            pttls = sorted((int(r[1]) for r in replies if as_text(r[0]) == value), reverse=True)
            pttl, largest = pttls[self.quorum - 1], pttls[0]
            fences = [int(r[2]) for r in replies if r[2] is not None]
            fencing = max(fences) if fences else None
            overrides = _overrides(value, [r[3] for r in replies])
        return HeldLock(
            key=key,
            name=name,
            slot=slot,
            value=value,
            holder=_owner.parse(value),
            ttl=None if pttl < 0 else pttl / 1000.0,
            fencing_token=fencing,
            overrides=overrides,
            pttl_ms=largest,
        )


def _cursor(cursor: str, nodes: int) -> tuple[int, int]:
    """``(node index, SCAN cursor)`` of an inventory cursor (``"0"``: the start).

    :raises ValueError: for a cursor this walk of ``nodes`` nodes did not hand out.
    """
    index, _, position = cursor.partition(":") if cursor != "0" else ("0", "", "0")
    digits = all(p.isascii() and p.isdigit() for p in (index, position))
    # SCAN cursors are unsigned 64-bit: Redis refuses a larger one, which must not read as a
    # node that did not answer (every view would leave that node out for 30 s).
    if not digits or int(index) >= nodes or len(position) > 20 or int(position) >= 1 << 64:
        raise ValueError(f"not an inventory cursor: {cursor!r}")
    return int(index), int(position)


def _reason(url: str, exc: BaseException) -> str:
    """Why the node at ``url`` did not answer: redis-py's message, credentials hidden, with
    each client repr in it shortened to ``host:port``, naming the TLS file the URL gives that
    does not exist (redis-py says "No such file or directory." without the name), and what to
    check when the port may not be of the URL's kind (:func:`~.core.connect_hint`)."""
    text = redact(describe(exc))
    missing = missing_tls_files(url, exc)
    if missing:
        text += f" The URL names a file that does not exist: {', '.join(missing)}."
    hint = connect_hint(url.startswith("rediss"), exc, gives_client_cert(url))
    return f"{text}; {hint}" if hint else text


def _overrides(token: str, records: Sequence[Any]) -> dict[str, Any] | None:
    """The overrides in the first record written by the holder of ``token`` (see
    :func:`celery_redlock._celery.engine._record_overrides`); ``None`` when none is."""
    for record in records:
        try:
            data = json.loads(record) if record is not None else None
        except ValueError:
            continue
        if isinstance(data, dict) and data.get("token") == token:
            overrides = data.get("overrides")
            return dict(overrides) if isinstance(overrides, dict) else None
    return None
