"""The commands of ``celery redlock``: ``ls``, ``inspect``, ``release`` and ``stats``."""

from __future__ import annotations

import re
from typing import Any

import click

from .._celery.identity import import_task_modules, lock_name_of
from .._redis.inventory import HeldLock, Released
from ..metrics import EVENTS, by_event
from ._format import (
    dead_released,
    dump,
    fence,
    json_row,
    safe,
    shown_overrides,
    table,
    ttl,
    who,
)
from ._group import TIMEOUT, LockStore, answers, command_line, redlock, store_of, text_argument
from ._liveness import (
    COOLDOWN,
    DEAD,
    UNKNOWN,
    Verdict,
    judged_unpinged,
    unpinged_why,
    verdicts,
)

#: What KEY may be (the messages of an empty or undecodable one say so).
KEY_FORMS = "a lock key (redlock:{...}), a lock name or a task name"

#: The ``ls --json`` format, as ``--help`` and docs/operations.md describe it.
JSON_HELP = (
    "Print a JSON list, one lock object per line (key, name, lock_name, slot, task_id, host, "
    "pid, acquired_ms, acquired_at, ttl, fencing_token, token_prefix, overrides, cooldown), "
    "streamed in SCAN order a page at a time."
)


@redlock.command(name="ls")
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
@click.pass_context
def ls(ctx: click.Context, as_json: bool) -> None:
    """List every held lock: key, lock name, holder, acquired at, TTL, fencing token.

    FENCE is the fencing counter of a quorum lock or a semaphore slot (the latest token handed
    out, by any slot: the holder's own is at most this); "-" for a one-server lock, which stores
    none (its holder reads its fencing token from the server clock when asked:
    current_lock().fencing_token).
    """
    store = store_of(ctx)
    with answers():
        if as_json:  # streamed a page at a time, in SCAN order: a JSON list, one lock per line
            opened = False
            for page in store.pages():
                items = ",\n ".join(map(json_row, page))
                click.echo(("," if opened else "[") + "\n " + items, nl=False)
                opened = True
            click.echo("\n]" if opened else "[]")
            return
        locks = store.all()
    if not locks:
        click.echo(f"no locks held{store.answering()}{store.unanswered()}")
        return
    rows = [["KEY", "LOCK", "TASK ID", "WORKER", "PID", "ACQUIRED", "TTL", "FENCE"]]
    for lock in locks:
        d = lock.as_dict()
        rows.append(
            [
                lock.key,
                lock.lock_name + (" (cooldown)" if d["cooldown"] else ""),
                d["task_id"] or "-",
                d["host"] or "-",
                str(d["pid"] or "-"),
                d["acquired_at"] or "-",
                ttl(lock.ttl),
                fence(lock),
            ]
        )
    click.echo(table(rows))


def _lock_names(app: Any, name: str) -> list[str]:
    """The lock names ``name`` may mean: itself, and the ``lock_name`` of the task so named
    (none for a key: a name has no braces)."""
    if "{" in name or "}" in name:
        return []
    if name not in app.tasks:  # a task of a module the worker imports, not `-A`'s
        import_task_modules(app)
    own = lock_name_of(app, name)
    return [name] if own == name else [name, own]


def _matching(ctx: click.Context, store: LockStore, key: str) -> tuple[list[HeldLock], bool]:
    """The held locks KEY names, and whether KEY is a lock's own key or bare name: that lock;
    a semaphore's bare name or first slot's key: each of its held slots (any may be free, the
    first too); else every lock of the lock name or task name KEY (each argument digest)."""
    parsed = store.parse(key)
    if parsed is not None:
        lock = store.read(key)
        # One read tells a lock from a slot: on one deployment only a slot keeps a counter.
        if lock is not None and (lock.slot > 1 or store.quorum > 1 or lock.fencing_token is None):
            return [lock], True
        if parsed[2] > 1:  # the key of a later slot names that slot alone: it is free
            return [], True
        name = parsed[1]
        slots = store.all(lambda lk: lk.name == name, name_prefix=name)
        if slots:
            return slots, False
    found: dict[str, HeldLock] = {}
    for name in _lock_names(ctx.obj.app, key):
        found.update((lk.key, lk) for lk in store.of_lock_name(name))
    return sorted(found.values(), key=lambda lk: lk.key), False


#: Keys beside a lock's, by their last part, and what they are.
_BESIDE = {
    "queued": "the lock_enqueue marker of a queued call",
    "publishing": "the lock_enqueue marker of a call being published",
    "newest": "the newest-call marker of lock_enqueue='replace' or lock_debounce",
    "rate": "the lock_rate window",
    "next": "the lock_rate window's next promised slot",
    "waiters": "the queue of a lock's waiters",
    "fence": "a fencing counter",
    "call": "a holder's per-call overrides",
}


#: An escape :func:`~._format.safe` writes for a control character of a name.
_ESCAPE = re.compile(r"\\(?:[ntr]|x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8})")


def _hint(key: str) -> str:
    """Why a KEY found no lock, when its form says: a key beside a lock's (the dashboard,
    ``celery redlock web``, shows the markers and rate windows), slot 1 of a semaphore
    given as ``:1`` (the probe's operators read "not held" of a marker that still
    de-duplicated every ``delay()``, and of a slot that was held), or a key copied from
    ``ls`` with a name's control characters escaped (a line break shown as ``\n``; "not
    held" of a lock ``ls`` listed, held). Said by ``inspect`` and ``release`` alike."""
    last = key.rsplit(":", 1)[-1]
    if _ESCAPE.search(key):
        return (
            "; `ls` shows the control characters of a name escaped (\\n, \\u202e): give "
            "the key with the characters themselves, in bash $'...' (`release --dead` takes "
            "a dead holder's too)"
        )
    if key.endswith("}:1"):
        return f"; slot 1 of a semaphore is its name's key, without ':1': {key[:-2]}"
    if "}:" in key and last in _BESIDE:
        return f"; it is {_BESIDE[last]}, not a lock: `celery redlock web` shows those"
    return ""


@redlock.command(name="inspect")
@click.argument("key", required=False)
@click.option("--task-id", help="Show the locks held by this task id instead.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@TIMEOUT
@click.pass_context
def inspect_(
    ctx: click.Context, key: str | None, task_id: str | None, as_json: bool, timeout: float
) -> None:
    """Show the lock KEY (its key or name; a task or lock name: each of its held locks) and
    whether its holder is alive, or the locks held by --task-id."""
    key = text_argument(key, "KEY", KEY_FORMS)
    task_id = text_argument(task_id, "--task-id", "a task id")
    if (key is None) == (task_id is None):
        raise click.UsageError("give either KEY or --task-id")
    store = store_of(ctx)
    with answers():
        if key is not None:
            locks, direct = _matching(ctx, store, key)
        else:
            locks, direct = store.of_task_id(task_id or ""), False
    try:
        judged = verdicts(ctx.obj.app, locks, timeout, store.lease)
    except click.ClickException as exc:  # the ping needs the broker; the locks do not
        click.echo(f"WARNING: {exc.message}: liveness is judged by renewal alone", err=True)
        judged = judged_unpinged(ctx.obj.app, locks, store.lease, unpinged_why(ctx.obj.app))
    if as_json:  # KEY: its lock, or null; a lock or task name, --task-id: a list
        items = [lk.as_dict(judged[lk.key].state) for lk in locks]
        if direct:  # KEY: its lock, or null (a free slot's key)
            dump(items[0] if items else None)
        else:
            dump(items if items or task_id is not None else None)
    else:
        for lk in locks:
            verdict = judged[lk.key]
            click.echo(safe(lk.key))
            for label, shown in (
                ("lock", f"{safe(lk.lock_name)} (slot {lk.slot})"),
                ("holder", who(lk)),
                ("alive", f"{verdict.state} ({safe(verdict.reason)})"),
                ("acquired", lk.as_dict()["acquired_at"] or "-"),
                ("ttl", ttl(lk.ttl)),
                ("fencing", fence(lk) + ("" if lk.fencing_token else " (a one-server lock)")),
                ("token", f"{safe(lk.value[:8])}..."),
                ("overrides", shown_overrides(lk.overrides)),
            ):
                click.echo(f"  {label:<9} {shown}")
    if not locks:
        if not as_json:
            missing = (
                f"{key} is not held{store.answering()} (no lock has that key, lock name or task "
                f"name){_hint(key)}"
                if key
                else f"task {task_id} holds no lock{store.answering()}"
            )
            click.echo(safe(missing + store.unanswered()), err=True)
        ctx.exit(1)


@redlock.command(name="release")
@click.argument("key", required=False)
@click.option("--force", is_flag=True, help="Release even if the holder is alive.")
@click.option("--dead", is_flag=True, help="Release every lock whose holder is dead.")
@click.option("--dry-run", is_flag=True, help="With --dead: only say what would be released.")
@TIMEOUT
@click.pass_context
def release(
    ctx: click.Context, key: str | None, force: bool, dead: bool, dry_run: bool, timeout: float
) -> None:
    """Release KEY (refused while its holder is alive, unless --force), or with --dead the
    locks whose holder is dead: its worker does not answer a control ping, and its lock
    was not renewed within two thirds of redlock_lease. Owner-checked: a lock that changed
    owner, or was renewed, since it was read is never deleted."""
    key = text_argument(key, "KEY", "a lock key (redlock:{...}) or a lock's name")
    if dead == (key is not None) or (dead and force) or (dry_run and not dead):
        raise click.UsageError("use either KEY [--force] or --dead [--dry-run]")
    store = store_of(ctx)
    if dead:
        _release_dead(ctx, store, timeout, dry_run)
        return
    assert key is not None
    with answers():
        lock = store.read(key)
        held = [] if lock is not None else _matching(ctx, store, key)[0]
    if lock is None:
        message = f"{key} is not held{store.answering()}: nothing released{_hint(key)}"
        message += store.unanswered()
        if held:  # a task or lock name: one lock per argument digest, released by its key
            message = (
                f"{key} names {len(held)} held lock(s) of a task or lock name; release takes "
                f"one lock's key: `{command_line(ctx, 'inspect', key)}` lists them. Nothing "
                "released"
            )
        click.echo(safe(message), err=True)
        ctx.exit(1)
        return
    try:
        verdict = verdicts(ctx.obj.app, [lock], timeout, store.lease)[lock.key]
    except click.ClickException as exc:
        if not force:
            raise click.ClickException(
                f"{exc.message}; nothing was released (--force releases it without asking "
                "the workers: only when you know its holder is gone)"
            ) from exc
        # --force releases whatever the liveness: a broker that does not answer stops no one
        click.echo(f"WARNING: {exc.message}", err=True)
        why = unpinged_why(ctx.obj.app)
        verdict = judged_unpinged(ctx.obj.app, [lock], store.lease, why)[lock.key]
    shown = safe(lock.key)
    if verdict.state != DEAD and not force:
        click.echo(
            f"refused: {shown} is held by {who(lock)}, and {safe(verdict.reason)}; "
            "use --force to release it anyway",
            err=True,
        )
        ctx.exit(1)
        return
    with answers():
        outcome = store.release(lock, unless_renewed=not force)
    if outcome is Released.RELEASED:
        forced = " (forced)" if verdict.state != DEAD else ""
        click.echo(f"released {shown}{forced}: it was held by {who(lock)}; {safe(verdict.reason)}")
        others = _other_slots(store, lock)
        if others:
            click.echo(
                f"{len(others)} other slot(s) of semaphore {safe(lock.name)} still held (release "
                f"takes one slot's key: `{command_line(ctx, 'inspect', lock.name)}` lists them)"
            )
        return
    click.echo(f"not released: {shown} {_not_released(outcome)}", err=True)
    ctx.exit(1)


def _other_slots(store: LockStore, lock: HeldLock) -> list[HeldLock]:
    """The held slots of ``lock``'s semaphore other than ``lock``, when ``lock`` is slot 1 (its
    bare name's key) and may be a semaphore's: a bare name released slot 1 alone, and said
    nothing of the slots still held. One plain lock on one deployment keeps no counter, so it
    is not looked for (no ``SCAN``)."""
    if lock.slot != 1 or (store.quorum == 1 and lock.fencing_token is None):
        return []
    with answers():
        return store.all(lambda lk: lk.name == lock.name and lk.slot > 1, name_prefix=lock.name)


def _not_released(outcome: Released) -> str:
    if outcome is Released.RENEWED:
        return "was renewed by its holder since it was read: the holder is alive"
    return "expired or changed owner since it was read"


def _judged(
    ctx: click.Context, locks: list[HeldLock], timeout: float, store: LockStore
) -> dict[str, Verdict]:
    """:func:`verdicts` before releasing dead workers' locks: a ping that fails says that
    nothing was released."""
    try:
        return verdicts(ctx.obj.app, locks, timeout, store.lease)
    except click.ClickException as exc:
        raise click.ClickException(f"{exc.message}; nothing was released") from exc


def _release_dead(ctx: click.Context, store: LockStore, timeout: float, dry_run: bool) -> None:
    """Release every lock whose holder is dead, a line each. An output closed meanwhile
    (``| head -1``) stops the lines, not the releases; then the command ends as click ends
    one whose output was cut (exit 1, silently). Timeline without that: (1) the first line
    goes to ``head``, which exits; (2) the second line raises ``BrokenPipeError``; (3) the
    command ends with exit 1, no message, and none of the dead workers' locks released."""
    say = _Lines()
    with answers():
        locks = store.all()
    judged = _judged(ctx, locks, timeout, store)
    released = kept = gone = 0
    for lock in locks:
        verdict = judged[lock.key]
        shown = safe(lock.key)
        if verdict.state != DEAD:
            kept += 1
            say(f"kept {shown}: {who(lock)} ({_why_kept(verdict, lock)})")
            continue
        if dry_run:
            released += 1
            say(f"would release {shown}: {who(lock)} ({_dead(verdict)})")
            continue
        try:
            with answers():
                outcome = store.release(lock, unless_renewed=True)
        except click.ClickException:
            say(dead_released("released", released, kept, gone) + "; then:")
            raise
        if outcome is Released.RELEASED:
            released += 1
            say(f"released {shown}: {who(lock)} ({_dead(verdict)})")
        else:
            kept += outcome is Released.RENEWED
            gone += outcome is not Released.RENEWED
            say(f"skipped {shown}: it {_not_released(outcome)}")
    say(dead_released("would release" if dry_run else "released", released, kept, gone))
    if say.cut is not None:
        raise say.cut


class _Lines:
    """``click.echo`` to stdout until it is closed; the first ``BrokenPipeError`` is kept in
    :attr:`cut`, and the lines after it are dropped."""

    def __init__(self) -> None:
        self.cut: BrokenPipeError | None = None

    def __call__(self, line: str) -> None:
        if self.cut is not None:
            return
        try:
            click.echo(line)
        except BrokenPipeError as exc:
            self.cut = exc


def _dead(verdict: Verdict) -> str:
    """Why a lock is released as its holder's is dead, in a few words."""
    return "its process is gone" if verdict.gone else "worker does not answer"


def _why_kept(verdict: Verdict, lock: HeldLock) -> str:
    """Why ``release --dead`` keeps ``lock``; for an unknown holder, why, and its key's TTL
    (an operator deciding on ``release KEY --force`` needs both)."""
    if verdict.state == UNKNOWN:
        ends = (
            "its key has no expiry"
            if lock.ttl is None
            else f"its key expires in {lock.ttl:.1f}s unless its holder renews it"
        )
        return f"liveness unknown: {safe(verdict.reason)}; {ends}"
    if verdict.state == COOLDOWN:  # who() says so: "(ended; kept by its lock_cooldown)"
        return "it frees itself when the cooldown ends"
    if verdict.renewed:
        return f"renewed lease: {safe(verdict.reason)}"
    return "worker alive"


@redlock.command(name="stats")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: {task: {event: count}}.")
@click.pass_context
def stats(ctx: click.Context, as_json: bool) -> None:
    """Lock event counters per task, summed over every worker process."""
    store = store_of(ctx)
    with answers():
        counts = store.counters()
    by_task = by_event(counts)
    if as_json:
        dump(by_task)
        return
    if not by_task:
        click.echo("no lock events counted yet")
        return
    rows = [["TASK", *EVENTS]]
    rows += [[task, *map(str, c.values())] for task, c in by_task.items()]
    click.echo(table(rows))
