"""``celery -A proj redlock ...``: list, inspect and release the locks of an app; show counters.

Installed through the ``celery.commands`` entry point, so Celery's own ``-A`` option picks the
app (its ``redlock_*`` settings say where the locks are)::

    celery -A proj redlock ls [--json]               every held lock: key, holder, TTL, fence
    celery -A proj redlock inspect KEY [--json]      one lock, whether its holder is alive, and
                                                     the per-call overrides it was taken with
    celery -A proj redlock inspect --task-id ID      the locks held by one task id
    celery -A proj redlock release KEY [--force]     owner-checked release of one lock
    celery -A proj redlock release --dead            release the locks of workers that are gone
    celery -A proj redlock stats [--json]            event counters per task

A holder is *alive* when its worker (the node name ``name@host`` stored in the lock's token)
answers a control ping within ``--timeout`` seconds, *dead* when it does not, and *unknown*
when the lock was not taken in a worker (a plain :class:`~celery_redlock.Lock`, an eager call):
then nothing can be pinged, and only ``release KEY --force`` releases it. A holder that does not
answer under its stored name while a live worker answers under a similar one (the same name
with ``|`` stored as ``_`` by an older version) is *unknown* too:
``dead`` is said only when no live worker could be the holder.

Text output escapes control characters (``\n`` in a lock name that a plain ``Lock`` user
chose, say), so each lock stays one row; ``--json`` escapes them as JSON does.

Every release is a compare-and-delete of the exact value that was read (the package's release
script, which also wakes waiters), so a lock that changed owner meanwhile is never deleted:

1. the command reads ``KEY = V`` (held by task T on worker w1);
2. it pings w1, which does not answer;
3. V expires and a task on w2 acquires ``KEY = V'``;
4. the release compares ``V'`` with ``V``, deletes nothing and says so.

Hazard, as a timeline: a live worker that cannot answer a ping in time looks dead.

1. a ``solo`` (or ``eventlet``) worker runs a long task; its event loop, which answers control
   commands, is blocked until the task ends (equally: remote control disabled, a broker
   partition between this command and the worker, a ``--timeout`` that is too short);
2. ``release --dead`` pings it, gets no answer, and deletes its lock;
3. a second execution of the same key starts beside the first one;
4. the first holder's renewal finds the key gone within a third of the lease, logs
   ``lock ... lost`` and sends ``lock_lost``; its body keeps running.

So ``--dead`` is for workers that were killed or lost (SIGKILL, OOM, a host that is gone),
whose locks otherwise stay until their TTL runs out; use a generous ``--timeout``.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii as _json_str
from typing import Any, TypeVar

import click
import redis as redis_py
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from ._celery.options import Settings, quorum_size, settings_for
from ._redis import owner as _owner
from ._redis import scripts as _scripts
from ._redis.clients import UNAVAILABLE_ERRORS, client_for, redact
from ._redis.keys import call_key, fence_of, is_slot, keys_for, lock_pattern, validate_name
from ._redis.nodes import nodes_for
from .exceptions import LockConfigError, LockUnavailable
from .metrics import EVENTS, read_stats
from .web._command import web as _web  # click only: the web extra loads when it runs

__all__ = ["HeldLock", "LockStore", "liveness", "redlock"]

T = TypeVar("T")

#: Errors that mean a node cannot be read now (a cluster client may fail while it connects).
_READ_ERRORS: tuple[type[BaseException], ...] = (
    *UNAVAILABLE_ERRORS,
    redis_py.RedisError,
    RedisClusterException,
)

#: How a holder's liveness is reported.
ALIVE, DEAD, UNKNOWN = "alive", "dead", "unknown"


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
    ttl: float | None
    fencing_token: int | None
    #: The per-call overrides the holder took it with (``apply_async(..., lock_ttl=...)``).
    overrides: dict[str, Any] | None = None

    @property
    def lock_name(self) -> str:
        """The name without the argument digest: the task's ``lock_name`` for a task lock."""
        head, _, tail = self.name.rpartition(":")
        is_digest = len(tail) == 32 and _HEX.issuperset(tail)
        return head if head and is_digest else self.name

    def as_dict(self, alive: str | None = None) -> dict[str, Any]:
        """JSON-ready fields; the token's secret part is never shown, only its first 8 chars."""
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
            "acquired_at": _iso(holder.acquired_ms) if holder else None,
            "ttl": self.ttl,
            "fencing_token": self.fencing_token,
            "token_prefix": self.value[:8],
            "overrides": self.overrides,
        }
        if alive is not None:
            out["alive"] = alive
        return out


def _iso(ms: int) -> str:
    moment = datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)
    return moment.isoformat(timespec="milliseconds")


_HEX = frozenset("0123456789abcdef")

#: An ``ls --json`` row: :meth:`HeldLock.as_dict` as ``json.dumps(..., sort_keys=True)`` lays
#: it out, its keys in sorted order.
_ROW = (
    '{"acquired_at": %s, "acquired_ms": %s, "fencing_token": %s, "host": %s, "key": %s, '
    '"lock_name": %s, "name": %s, "overrides": %s, "pid": %s, "slot": %s, "task_id": %s, '
    '"token_prefix": %s, "ttl": %s}'
)


def _json_row(lock: HeldLock) -> str:
    """``json.dumps(lock.as_dict(), sort_keys=True)``, written out: without a dict and a key
    sort per row, in half the time (a unit test pins the equality). ``%s`` of an int or a
    finite float is its JSON text."""
    h = lock.holder
    overrides = lock.overrides
    return _ROW % (
        _json_str(_iso(h.acquired_ms)) if h else "null",
        h.acquired_ms if h else "null",
        "null" if lock.fencing_token is None else lock.fencing_token,
        _json_str(h.host) if h else "null",
        _json_str(lock.key),
        _json_str(lock.lock_name),
        _json_str(lock.name),
        "null" if overrides is None else json.dumps(overrides, sort_keys=True),
        h.pid if h else "null",
        lock.slot,
        _json_str(h.task_id) if h else "null",
        _json_str(lock.value[:8]),
        "null" if lock.ttl is None else lock.ttl,
    )


#: Keys per ``SCAN`` step and per pipelined read of :meth:`LockStore.pages`.
PAGE = 1000


class LockStore:
    """The Redis node(s) holding an app's locks: read them, release one owner-checked.

    For a quorum (``redlock_url`` a list of nodes) a lock is shown when a majority of nodes
    hold the same token; its TTL is the time until fewer than a majority do.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.urls = [settings.url] if isinstance(settings.url, str) else list(settings.url)
        self.quorum = quorum_size(settings)

    def _each(self, call: Callable[[Any], T]) -> list[T | None]:
        """``call(client)`` on every node; ``None`` for a node that does not answer."""
        out: list[T | None] = []
        failed = []
        for url in self.urls:
            try:
                out.append(call(client_for(url)))
            except _READ_ERRORS as exc:
                out.append(None)
                failed.append(f"{redact(url)} ({redact(exc)})")
        if len(failed) > len(self.urls) - self.quorum:
            raise click.ClickException(f"cannot reach the lock Redis: {'; '.join(failed)}")
        return out

    def keys(self) -> list[str]:
        """Every slot key present on any node, sorted."""
        pattern = lock_pattern(self.settings.prefix)
        found: set[str] = set()
        for keys in self._each(lambda c: list(c.scan_iter(match=pattern, count=500))):
            found.update(_text(k) for k in keys or () if is_slot(k))
        return sorted(found)

    def read(self, key: str) -> HeldLock | None:
        """The lock at ``key`` (a slot key or a bare name), or ``None`` when nobody holds it."""
        parsed = self.parse(key)
        return None if parsed is None else self._read_page([parsed])[0]

    def _read_page(self, parsed: Sequence[tuple[str, str, int]]) -> list[HeldLock | None]:
        """The lock at each ``(slot key, name, slot)``: one pipelined round trip per node (a
        second one when some of them have a fencing counter or a call record)."""
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

        answered = [replies for replies in self._each(many) if replies is not None]
        return [
            self._held(key, name, slot, replies)
            for (key, name, slot), *replies in zip(parsed, *answered, strict=True)
        ]

    def _held(
        self, key: str, name: str, slot: int, replies: Sequence[tuple[Any, ...]]
    ) -> HeldLock | None:
        """What the nodes' ``(value, pttl, fence, call record)`` replies say about ``key``."""
        if self.quorum == 1 and len(replies) == 1:  # one node: its reply is the answer
            raw, raw_pttl, fence, record = replies[0]
            if raw is None:
                return None
            value, pttl = _text(raw), int(raw_pttl)
            fencing = None if fence is None else int(fence)
            overrides = None if record is None else _overrides(value, [record])
        else:
            replies = [r for r in replies if r[0] is not None]
            values = [_text(r[0]) for r in replies]
            majority = max(set(values), key=values.count) if values else None
            if majority is None or values.count(majority) < self.quorum:
                return None
            value = majority
            pttls = sorted((int(r[1]) for r in replies if _text(r[0]) == value), reverse=True)
            pttl = pttls[self.quorum - 1]
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
        )

    def pages(self) -> Iterator[list[HeldLock]]:
        """Every held lock, a page at a time: a ``SCAN`` step of up to :data:`PAGE` keys, read
        with one pipelined round trip per node. One node is streamed: memory stays flat, so
        only a page's keys are remembered, and a lock that ``SCAN`` returns twice (it may when
        the key space shrinks, most of the locks ending, during the listing) is in two
        pages. A quorum's key names are gathered from every node first, each once."""
        if len(self.urls) == 1:
            pattern = lock_pattern(self.settings.prefix)
            try:
                found: Iterable[Any] = client_for(self.urls[0]).scan_iter(match=pattern, count=PAGE)
                yield from self._pages_of(found)
            except _READ_ERRORS as exc:
                url = redact(self.urls[0])
                message = f"cannot reach the lock Redis: {url} ({redact(exc)})"
                raise click.ClickException(message) from exc
            return
        yield from self._pages_of(self.keys())

    def _pages_of(self, keys: Iterable[Any]) -> Iterator[list[HeldLock]]:
        page: dict[str, tuple[str, str, int]] = {}  # by key: SCAN may return a key twice
        for raw in keys:
            key = _text(raw)
            parsed = self.parse(key) if is_slot(key) else None
            if parsed is None:
                continue
            page[key] = parsed
            if len(page) == PAGE:
                yield [lock for lock in self._read_page(list(page.values())) if lock is not None]
                page = {}
        if page:
            yield [lock for lock in self._read_page(list(page.values())) if lock is not None]

    def all(self, where: Callable[[HeldLock], bool] | None = None) -> list[HeldLock]:
        """Every held lock once (those for which ``where`` is true), sorted by key."""
        unique = {
            lock.key: lock for page in self.pages() for lock in page if where is None or where(lock)
        }
        return sorted(unique.values(), key=lambda lk: lk.key)

    def parse(self, key: str) -> tuple[str, str, int] | None:
        """``(slot key, name, slot)`` of a slot key, or of a bare name (its first slot)."""
        prefix = self.settings.prefix
        head = f"{prefix}:{{"
        if not key.startswith(head):
            try:
                return keys_for(prefix, key).lock, key, 1
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

    def release(self, lock: HeldLock) -> bool:
        """Delete ``lock.key`` only if it still holds ``lock.value``; whether it did."""
        # Its own slot only: the release script compares the slots it is given. (With
        # keys_for(..., lock.slot), every slot below it would be built too.)
        keys = dataclasses.replace(keys_for(self.settings.prefix, lock.name), slots=(lock.key,))
        try:
            return nodes_for(self.settings.url).release(keys, lock.value)
        except LockUnavailable as exc:
            raise click.ClickException(str(exc)) from exc


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


def _shown_overrides(overrides: dict[str, Any] | None) -> str:
    if not overrides:
        return "none"
    return ", ".join(f"lock_{name}={value!r}" for name, value in sorted(overrides.items()))


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _ping(app: Any, destination: list[str] | None, timeout: float) -> set[str]:
    """Node names of the workers that answer a control ping (``None``: every worker)."""
    try:
        replies = app.control.ping(destination=destination, timeout=timeout) or []
    except Exception as exc:
        raise click.ClickException(
            f"cannot ping workers through the broker ({redact(exc)}); nothing was released"
        ) from exc
    answered: set[str] = set()
    for reply in replies:
        answered.update(reply)
    return answered


def _spelling(name: str) -> str:
    """What two spellings of one worker name have in common (older tokens stored ``|``
    as ``_``)."""
    return name.replace("|", "_")


def liveness(app: Any, hosts: Iterable[str], timeout: float) -> dict[str, str]:
    """``alive``/``dead``/``unknown`` per holder host, with one control ping for all workers.

    A worker's node name is ``name@host``; any other host (a lock taken outside a worker, an
    eager call) is ``unknown``: there is nothing to ping. A worker that does not answer is
    ``dead`` only if no live worker answers under a similar name (:func:`_spelling`): when
    one with ``_`` in its stored name (perhaps a ``|`` stored by an older version) did not
    answer, every worker is pinged once more, and a look-alike makes it ``unknown``. Never
    ``dead`` when unsure.
    """
    hosts = set(hosts)
    workers = sorted(h for h in hosts if "@" in h)
    answered = _ping(app, workers, timeout) if workers else set()
    silent = [h for h in workers if h not in answered and "_" in h]
    lookalikes: set[str] = set()
    if silent:
        everyone = {_spelling(name) for name in _ping(app, None, timeout)}
        lookalikes = {h for h in silent if _spelling(h) in everyone}
    return {
        h: ALIVE if h in answered else UNKNOWN if "@" not in h or h in lookalikes else DEAD
        for h in hosts
    }


def _safe(value: Any) -> str:
    """``value`` as text with control characters escaped (``\n``, ``\x1b``): one row stays
    one line, and a terminal never interprets a lock name."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def _store(ctx: click.Context) -> LockStore:
    app = ctx.obj.app
    try:
        return LockStore(settings_for(app))
    except LockConfigError as exc:
        raise click.ClickException(str(exc)) from exc


def _table(rows: Sequence[Sequence[str]]) -> str:
    rows = [[_safe(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def _ttl(ttl: float | None) -> str:
    return "no expiry" if ttl is None else f"{ttl:.1f}s"


def _who(lock: HeldLock) -> str:
    h = lock.holder
    if h is None:
        return "a value that is not a celery-redlock token"
    return _safe(f"task {h.task_id or '(none)'} on {h.host}, pid {h.pid}")


def _dump(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True))


# -- commands -----------------------------------------------------------------------------------


@click.group(name="redlock")
@click.pass_context
def redlock(ctx: click.Context, /, **_: Any) -> None:
    """Inspect and release celery-redlock locks; show their counters."""


@redlock.command(name="ls")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@click.pass_context
def ls(ctx: click.Context, as_json: bool) -> None:
    """List every held lock: key, lock name, holder, acquired at, TTL, fencing token."""
    store = _store(ctx)
    if as_json:  # streamed a page at a time, in SCAN order: a JSON list, one lock per line
        opened = False
        for page in store.pages():
            if page:
                items = ",\n ".join(map(_json_row, page))
                click.echo(("," if opened else "[") + "\n " + items, nl=False)
                opened = True
        click.echo("\n]" if opened else "[]")
        return
    locks = store.all()
    if not locks:
        click.echo("no locks held")
        return
    rows = [["KEY", "LOCK", "TASK ID", "WORKER", "PID", "ACQUIRED", "TTL", "FENCE"]]
    for lock in locks:
        d = lock.as_dict()
        rows.append(
            [
                lock.key,
                lock.lock_name,
                d["task_id"] or "-",
                d["host"] or "-",
                str(d["pid"] or "-"),
                d["acquired_at"] or "-",
                _ttl(lock.ttl),
                str(lock.fencing_token or "-"),
            ]
        )
    click.echo(_table(rows))


@redlock.command(name="inspect")
@click.argument("key", required=False)
@click.option("--task-id", help="Show the locks held by this task id instead.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--timeout", default=1.0, show_default=True, help="Seconds to wait for a ping.")
@click.pass_context
def inspect_(
    ctx: click.Context, key: str | None, task_id: str | None, as_json: bool, timeout: float
) -> None:
    """Show one lock (KEY: the key or its name) and whether its holder is alive."""
    if (key is None) == (task_id is None):
        raise click.UsageError("give either KEY or --task-id")
    store = _store(ctx)
    if key is not None:
        lock = store.read(key)
        locks = [] if lock is None else [lock]
    else:
        locks = store.all(lambda lock: lock.holder is not None and lock.holder.task_id == task_id)
    alive = liveness(ctx.obj.app, (lk.holder.host for lk in locks if lk.holder), timeout)
    state = {lk.key: alive.get(lk.holder.host, UNKNOWN) if lk.holder else UNKNOWN for lk in locks}
    if as_json:
        items = [lk.as_dict(state[lk.key]) for lk in locks]
        _dump(items if key is None else items[0] if items else None)
    else:
        for lk in locks:
            d = lk.as_dict(state[lk.key])
            click.echo(_safe(lk.key))
            for label, shown in (
                ("lock", f"{_safe(lk.lock_name)} (slot {lk.slot})"),
                ("holder", _who(lk)),
                ("alive", f"{d['alive']} (control ping, {timeout}s)"),
                ("acquired", d["acquired_at"] or "-"),
                ("ttl", _ttl(lk.ttl)),
                ("fencing", str(lk.fencing_token or "-")),
                ("token", f"{d['token_prefix']}..."),
                ("overrides", _shown_overrides(lk.overrides)),
            ):
                click.echo(f"  {label:<9} {shown}")
    if not locks:
        if not as_json:
            missing = f"{key} is not held" if key else f"task {task_id} holds no lock"
            click.echo(_safe(missing), err=True)
        ctx.exit(1)


@redlock.command(name="release")
@click.argument("key", required=False)
@click.option("--force", is_flag=True, help="Release even if the holder is alive.")
@click.option("--dead", is_flag=True, help="Release every lock whose worker does not answer.")
@click.option("--dry-run", is_flag=True, help="With --dead: only say what would be released.")
@click.option("--timeout", default=1.0, show_default=True, help="Seconds to wait for a ping.")
@click.pass_context
def release(
    ctx: click.Context, key: str | None, force: bool, dead: bool, dry_run: bool, timeout: float
) -> None:
    """Release KEY (refused while its holder is alive, unless --force), or with --dead the
    locks of workers that no longer answer a control ping. Owner-checked: a lock that
    changed owner since it was read is never deleted."""
    if dead == (key is not None) or (dead and force) or (dry_run and not dead):
        raise click.UsageError("use either KEY [--force] or --dead [--dry-run]")
    store = _store(ctx)
    if dead:
        _release_dead(ctx, store, timeout, dry_run)
        return
    assert key is not None
    lock = store.read(key)
    if lock is None:
        click.echo(f"{_safe(key)} is not held: nothing released", err=True)
        ctx.exit(1)
        return
    host = lock.holder.host if lock.holder else ""
    state = liveness(ctx.obj.app, [host], timeout)[host] if lock.holder else UNKNOWN
    reason = {
        ALIVE: f"its worker {host} answers a control ping",
        DEAD: f"its worker {host} did not answer a control ping within {timeout}s",
        UNKNOWN: (
            f"its worker {host} did not answer under that name, but a live worker answers "
            "under a similar one, so its liveness is unknown"
            if "@" in host
            else "it was not taken in a worker, so its liveness is unknown"
        ),
    }[state]
    shown = _safe(lock.key)
    if state != DEAD and not force:
        click.echo(
            f"refused: {shown} is held by {_who(lock)}, and {_safe(reason)}; "
            "use --force to release it anyway",
            err=True,
        )
        ctx.exit(1)
        return
    if store.release(lock):
        forced = " (forced)" if state != DEAD else ""
        click.echo(f"released {shown}{forced}: it was held by {_who(lock)}; {_safe(reason)}")
    else:
        click.echo(f"not released: {shown} expired or changed owner since it was read", err=True)
        ctx.exit(1)


def _release_dead(ctx: click.Context, store: LockStore, timeout: float, dry_run: bool) -> None:
    locks = store.all()
    alive = liveness(ctx.obj.app, (lk.holder.host for lk in locks if lk.holder), timeout)
    released = kept = 0
    for lock in locks:
        state = alive.get(lock.holder.host, UNKNOWN) if lock.holder else UNKNOWN
        shown = _safe(lock.key)
        if state != DEAD:
            kept += 1
            why = "worker alive" if state == ALIVE else "liveness unknown"
            click.echo(f"kept {shown}: {_who(lock)} ({why})")
        elif dry_run:
            released += 1
            click.echo(f"would release {shown}: {_who(lock)} (worker does not answer)")
        elif store.release(lock):
            released += 1
            click.echo(f"released {shown}: {_who(lock)} (worker does not answer)")
        else:
            kept += 1
            click.echo(f"skipped {shown}: it expired or changed owner since it was read")
    verb = "would release" if dry_run else "released"
    click.echo(f"{verb} {released} lock(s) of dead workers; kept {kept}")


@redlock.command(name="stats")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: {task: {event: count}}.")
@click.pass_context
def stats(ctx: click.Context, as_json: bool) -> None:
    """Lock event counters per task, summed over every worker process."""
    app = ctx.obj.app
    try:
        counts = read_stats(app)
    except LockConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    except UNAVAILABLE_ERRORS as exc:
        raise click.ClickException(f"cannot reach the lock Redis: {exc}") from exc
    events = [*EVENTS, *sorted({e for c in counts.values() for e in c} - set(EVENTS))]
    table = {task: {e: c.get(e, 0) for e in events} for task, c in sorted(counts.items())}
    if as_json:
        _dump(table)
        return
    if not table:
        click.echo("no lock events counted yet")
        return
    rows = [["TASK", *events]]
    rows += [[task, *(str(c[e]) for e in events)] for task, c in table.items()]
    click.echo(_table(rows))


redlock.add_command(_web)
