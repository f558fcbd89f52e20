"""Whether the holder of a lock is alive: a control ping, and the lock's own renewal.

A holder is *alive* when its worker (the node name ``name@host`` stored in the lock's token)
answers a control command (``stats``) within ``--timeout`` seconds with the holder's pid among
its processes (:class:`Heard`), **or** when its task renews its lock and
the lease was set (acquired or renewed) within the last two thirds of the lease
(:data:`RENEWED_WITHIN`): a renewing holder resets its TTL to ``redlock_lease`` every
``lease / 3``, so a TTL above a third of the lease proves a holder that was alive that recently,
whatever the ping says. Two thirds, not one: a renewal comes *about* every third, and one that
runs late (a body holding the GIL in a C call, a GC pause, a slow Redis) must not make a live
holder look dead. Timeline with one third: (1) w1 is in warm shutdown, its task computing in a
C call that holds the GIL; (2) the renewal, due at 10 s of a 30 s lease, runs at 11 s; (3) at
10.5 s ``release --dead`` pings w1, hears nothing, reads an age of 10.5 s and deletes the lock
of a running task.

A holder is *dead* when neither holds, and *unknown* when the lock was not taken in a worker
(a plain :class:`~celery_redlock.Lock`, an eager call): then nothing can be pinged, and only
``release KEY --force`` releases it. A holder that does not answer under its stored name
while a live worker answers under a similar one (the same name with ``|`` stored as ``_`` by
an older version) is *unknown* too: ``dead`` is said only when no live worker could be the
holder.

Why the renewal counts, as a timeline (a rolling deploy):

1. worker w1 gets SIGTERM and starts a warm shutdown: it finishes its running tasks, but it
   stops consuming, control commands included, at once;
2. ``release --dead`` pings w1 and hears nothing;
3. w1's task is still running, and its watchdog renewed the lock 4 s ago (TTL 26 s of a 30 s
   lease): the lock is kept;
4. had the renewal been due just then, the release script sees the TTL grow since it was read
   and deletes nothing (:attr:`~celery_redlock._redis.inventory.Released.RENEWED`).

A renewing holder records its lease in its token (``~<lease_ms>``, see
:mod:`celery_redlock._redis.owner`): its lock is judged by that lease, and known renewed,
whatever ``redlock_lease`` the command runs with (:func:`_judged_by`). Timeline without it, a
deploy that lengthens the lease: (1) workers renew under 10 s, their TTLs between 6.7 and
10 s; (2) the command runs with the deploy's 60 s; (3) a draining old worker does not answer;
(4) its TTL of 8 s reads as a 60 s lease not renewed for 52 s, and its running task's lock is
released. What follows is for a token without it: a fixed TTL's, or a renewing holder's of
an earlier version.

Whether a lock is renewed at all (:func:`renewals`): a TTL below the lease reads the same for a
lease set 5 s ago and for a fixed ``lock_ttl`` counting down, and nothing in such a token tells
them apart (``acquired_ms`` dates the acquisition, not the TTL's last setting; ``max_hold`` is
recorded only when a hard time limit caps a renewed lease). The app does: the lock name maps
to its tasks (``lock_name``, else the task's name), and their ``lock_ttl``, or the holder's
per-call override recorded beside the lock, says whether it is renewed. Timeline the age alone
got wrong (``lock_ttl=25``, ``redlock_lease=15``):

1. the task takes its key for 25 s, never renewed, and its worker is SIGKILLed at 2 s;
2. at 12 s the TTL is 13 s, below the lease: read as a lease "renewed 2 s ago", within two
   thirds of it, so the silent worker was called *alive* and its lock kept;
3. at 20 s the TTL (5 s) reads as a lease not renewed for 10 s, and the lock is *dead* again.

So a lock the app says is fixed (:data:`FIXED`) is never *alive* by its TTL, nor said
renewed. Nor is it *dead* while its TTL is also a lease's set within two thirds of the lease:
the app's word cannot rule out a renewal (review, timeline: (1) old workers renew ``job``'s
lock under a 30 s lease; (2) the new code, given to the command, sets ``lock_ttl=60``; (3)
a lock renewed 5 s ago has TTL 25 s; (4) its worker, in warm shutdown, does not answer: it
would be released while its task runs). The same holds for a call whose per-call
``lock_ttl=None`` record was lost. It is *unknown*, and kept, like a lock whose renewal is not
known (:data:`UNSURE`); one of a renewing task (:data:`RENEWED`) is *alive*, as above. A TTL
above the lease is no lease of this command's: *unknown* (kept) for a renewing task's, which
a longer lease renews (workers of a deploy that shortened ``redlock_lease``), *dead* for any
other (a fixed one, or one the app knows nothing of: run the command with the workers' app);
past two thirds of the lease without a renewal a lock is *dead* whatever kind it is: a
renewing holder would have renewed, and a fixed one never proves its holder alive.

Hazard, as a timeline: a live worker whose lease is not renewed and that cannot answer a ping
in time looks dead.

1. a task with a fixed ``lock_ttl`` (no renewal) runs in a worker in warm shutdown, or in a
   ``solo`` worker whose event loop the task blocks (equally: remote control disabled, a
   broker partition, a ``--timeout`` that is too short);
2. ``release --dead`` pings it, gets no answer, sees no renewal (there is none), and deletes
   its lock;
3. a second execution of the same key starts beside the first one.

So ``--dead`` is for workers that were killed or lost (SIGKILL, OOM, a host that is gone).
A renewed lock of a dead worker is released once it has gone two thirds of a lease without
renewal (it expires at the whole lease anyway); a fixed-TTL lock as soon as its worker does
not answer while its TTL is above the lease, else once that TTL is below a third of it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import click

from .._celery.identity import import_task_modules, spec_of
from .._redis.clients import redact
from .._redis.core import ms
from .._redis.inventory import HeldLock, capped, lease_age

#: How a holder's liveness is reported; ``cooldown``: no holder runs, the task ended and its
#: ``lock_cooldown`` keeps the key (released by ``--force`` only, never as a dead worker's).
ALIVE, DEAD, UNKNOWN, COOLDOWN = "alive", "dead", "unknown", "cooldown"

#: The part of ``redlock_lease`` within which a renewal proves a live holder (see above).
RENEWED_WITHIN = 2 / 3

#: How a lock's TTL is kept (:class:`Renewal`): a lease renewed while its task runs; a fixed
#: ``lock_ttl``, never renewed; not known (see the module's docstring).
RENEWED, FIXED, UNSURE = "renewed", "fixed", "unsure"

#: The shortest and longest waits for the workers' pings, in seconds.
PING_WAITS = (0.1, 3600.0)


def checked_wait(value: float) -> float:
    """``value``, seconds to wait for the workers' answers, if it is from 0.1 to 3600
    (:data:`PING_WAITS`); :class:`ValueError` otherwise. With 0, or a wait as short as
    ``1e-300``, no worker has time to answer, so every live one looks dead (``release --dead
    --dry-run --timeout 1e-300`` said "would release" of a live worker's lock in 4 runs of
    21); above about 25 days the ping cannot wait that long and said the broker did not
    answer; ``nan`` and ``inf`` are no waits."""
    low, high = PING_WAITS
    if not (isinstance(value, (int, float)) and math.isfinite(value) and low <= value <= high):
        raise ValueError(
            f"{value!r} is not a wait for the workers' answers: expected a number of seconds "
            f"from {low:g} to {high:g}"
        )
    return float(value)


@dataclass(frozen=True)
class Verdict:
    """Whether a lock's holder is alive, and why it is said so (one phrase)."""

    state: str
    reason: str
    #: Alive by its lease's recent renewal (its worker did not answer the ping).
    renewed: bool = False
    #: Dead though its worker answers: the holder's process is none of that worker's.
    gone: bool = False


@dataclass(frozen=True)
class Renewal:
    """Whether a lock is renewed, as its tasks' options (or its holder's per-call override)
    and its TTL tell (:func:`renewals`)."""

    #: :data:`RENEWED`, :data:`FIXED` or :data:`UNSURE`.
    kind: str
    #: A phrase: the fixed ``lock_ttl`` and where it comes from (:data:`FIXED`), or why it is
    #: not known (:data:`UNSURE`); empty for :data:`RENEWED`.
    why: str = ""


#: What is known of a lock's renewal without the app's tasks.
NOT_KNOWN = Renewal(UNSURE, "no task of the app is known to take it")


#: The verdict on a slot kept by ``lock_cooldown``: no holder runs, none is pinged.
COOLING = Verdict(
    COOLDOWN, "its task ended, and its lock_cooldown keeps the key until its TTL ends"
)


class Heard(str):
    """A worker's liveness (``alive``, ``dead``, ``unknown``), with the ids of the processes
    of a live worker that may hold a lock (:attr:`pids`; ``None`` when not known). A ``str``,
    so that what was heard is kept and compared as the state it is.

    The processes are the worker's main process and its prefork pool children, from its
    ``stats`` reply. Timeline they tell apart: (1) worker ``w1`` runs a ``lock_ttl=3600``
    task; (2) it is SIGKILLed and restarted under the same name (a redeploy, a crash loop);
    (3) ``release --dead`` pings ``w1``, hears it, and kept the dead process's lock "alive"
    for the rest of its hour, every call of its key skipped. The holder's pid is now none of
    the live ``w1``'s, so its lock is judged as one whose worker did not answer.

    A worker in a container restarted with the container gets a new pid namespace, so its
    children usually get the dead ones' pids again: such a holder still reads alive (the
    safe side), and its lock ends with its TTL or ``release --force``.
    """

    pids: frozenset[int] | None
    #: Whether every answer under the name was waited for (:func:`confirmed`).
    confirmed: bool

    def __new__(
        cls, state: str, pids: frozenset[int] | None = None, confirmed: bool = False
    ) -> Heard:
        heard = super().__new__(cls, state)
        heard.pids = pids
        heard.confirmed = confirmed
        return heard


#: The pools whose tasks run in the worker's main process (prefork lists its children).
_IN_MAIN = frozenset(
    f"celery.concurrency.{name}" for name in ("thread", "solo", "gevent", "eventlet")
)


def _processes(stats: Any) -> frozenset[int] | None:
    """The ids of the processes of a worker that may hold a lock, from its ``stats`` reply;
    ``None`` for a pool whose processes it does not list (a pool of another package)."""
    if not isinstance(stats, Mapping):
        return None
    main, pool = stats.get("pid"), stats.get("pool")
    if isinstance(main, bool) or not isinstance(main, int) or not isinstance(pool, Mapping):
        return None
    children = pool.get("processes")
    if isinstance(children, list) and all(type(pid) is int for pid in children):
        return frozenset([main, *children])
    if str(pool.get("implementation", "")).partition(":")[0] in _IN_MAIN:
        return frozenset([main])
    return None


def _ping(
    app: Any, destination: list[str] | None, timeout: float, every: bool = False
) -> dict[str, Heard]:
    """The workers that answer a control command (``stats``; ``None``: every worker), with
    their processes (:class:`Heard`), without waiting for the timeout once every destination
    answered, unless ``every`` answer is waited for: two answers under one name (two workers
    started with the same ``-n``) leave its processes unknown, as either one's children
    could be the holder, and the first answer alone cannot tell (:func:`confirmed`). Such two
    workers share the name's own control queue, so a command sent to the name reaches one of
    them: ``every`` sends it to all workers, and keeps the destinations' answers.

    On a connection of its own that tries each broker of the URL once (a failover list's next
    one after a failure), without sleeping between tries: a broker that is down fails the
    ping at once (kombu's default retries took 6 s whatever ``timeout`` said, and a page view
    waiting for another's ping waited that long again). Each try's connect is bounded by the
    app's ``broker_connection_timeout`` (4 s by default), a Redis broker's too (its socket
    had no connect timeout: a broker host that dropped packets hung the ping, and with it every
    dashboard view behind it), and no deadline over all tries cuts a failover list short. A
    Redis broker's reads are bounded too, by the ping's timeout (at least kombu's polling
    interval) plus that connect timeout: a broker that accepts connections and never answers
    (a stopped or hung server) held ``release --dead`` forever."""
    if not app.conf.broker_write_url:
        # Timeline without this: (1) `celery --config cfg redlock release --dead`, cfg setting
        # redlock_url alone; (2) the ping goes to Celery's default broker, amqp://localhost,
        # where a RabbitMQ of something else answers and no worker does; (3) every holder
        # looks dead, and a live worker's lock is released.
        raise click.ClickException(
            "cannot ping workers through the broker: no broker_url is set, and Celery's "
            "default (amqp://guest@localhost//) may not be the workers' broker, where every "
            "worker would look dead; run it with the workers' app (-A) or broker (-b)"
        )
    limit = len(destination) if destination and not every else None
    try:
        with app.connection_for_write() as connection:
            options = connection.transport_options
            options.update(
                max_retries=max(len(connection.alt) - 1, 0),
                interval_start=0,
                interval_step=0,
                interval_max=0,
                connect_retries_timeout=None,
            )
            if connection.transport.driver_type == "redis":
                connect = connection.connect_timeout or 4.0
                options.setdefault("socket_connect_timeout", connect)
                # Past kombu's blocking read of replies (polling_interval, 1 s by default)
                poll = float(options.get("polling_interval") or 1.0)
                options.setdefault("socket_timeout", max(timeout, poll) + connect)
            replies = app.control.broadcast(
                "stats",
                destination=None if every else destination,
                reply=True,
                timeout=timeout,
                limit=limit,
                connection=connection,
            )
    except Exception as exc:
        raise click.ClickException(
            f"cannot ping workers through the broker ({redact(exc)})"
        ) from exc
    answered: dict[str, Heard] = {}
    for reply in replies or []:
        for name, stats in reply.items():
            if destination is not None and name not in destination:
                continue
            pids = None if name in answered else _processes(stats)
            answered[name] = Heard(ALIVE, pids, confirmed=every)
    return answered


def confirmed(
    app: Any, locks: Iterable[HeldLock], heard: Mapping[str, str], timeout: float
) -> dict[str, str]:
    """``heard``, with each live worker asked again, waiting for every answer, where a
    holder's pid is none of its processes (:func:`_ping`, ``every``). Timeline it closes: (1)
    two workers run under one name ``w@dup``, each with a task holding a ``lock_ttl=120``
    lock; (2) ``release --dead`` hears the first answer and stops waiting; (3) the other
    worker's holder's pid is none of the first one's processes, and its live lock was
    released. A name that answers twice, or not again, leaves its processes unknown."""
    doubt = {
        lock.holder.host
        for lock in locks
        if lock.holder is not None
        and not lock.holder.cooling
        and isinstance(said := heard.get(lock.holder.host), Heard)
        and said == ALIVE
        and not said.confirmed
        and said.pids is not None
        and lock.holder.pid not in said.pids
    }
    if not doubt:
        return dict(heard)
    again = _ping(app, sorted(doubt), timeout, every=True)
    return {**heard, **{host: again.get(host, Heard(ALIVE, None, True)) for host in doubt}}


def _spelling(name: str) -> str:
    """What two spellings of one worker name have in common (older tokens stored ``|``
    as ``_``)."""
    return name.replace("|", "_")


def liveness(app: Any, hosts: Iterable[str], timeout: float) -> dict[str, Heard]:
    """``alive``/``dead``/``unknown`` per holder host, with one control ping for all workers.

    A worker's node name is ``name@host``; any other host (a lock taken outside a worker, an
    eager call) is ``unknown``: there is nothing to ping. A worker that does not answer is
    ``dead`` only if no live worker answers under a similar name (:func:`_spelling`): when
    one with ``_`` in its stored name (perhaps a ``|`` stored by an older version) did not
    answer, every worker is pinged once more, and a look-alike makes it ``unknown``. Never
    ``dead`` when unsure. (The ping only: :func:`verdicts` adds the renewal.)
    """
    hosts = set(hosts)
    workers = sorted(h for h in hosts if "@" in h)
    answered = _ping(app, workers, timeout) if workers else {}
    silent = [h for h in workers if h not in answered and "_" in h]
    lookalikes: set[str] = set()
    if silent:
        everyone = {_spelling(name) for name in _ping(app, None, timeout)}
        lookalikes = {h for h in silent if _spelling(h) in everyone}
    return {
        h: answered[h]
        if h in answered
        else Heard(UNKNOWN if "@" not in h or h in lookalikes else DEAD)
        for h in hosts
    }


def verdicts(
    app: Any, locks: Iterable[HeldLock], timeout: float, lease: float
) -> dict[str, Verdict]:
    """The :class:`Verdict` on each lock's holder, by key: the ping, then the renewal (the
    app's task modules imported first, so that every lock name finds its tasks)."""
    locks = list(locks)
    import_task_modules(app)
    renewed = renewals(app, locks)
    pinged = confirmed(app, locks, liveness(app, hosts_to_ping(locks), timeout), timeout)
    return {lock.key: verdict(lock, pinged, timeout, lease, renewed[lock.key]) for lock in locks}


def renewals(app: Any, locks: Iterable[HeldLock]) -> dict[str, Renewal]:
    """The :class:`Renewal` of each lock, by key, from ``app``'s tasks (the ones imported so
    far) and the per-call overrides recorded beside the lock."""
    try:
        ttls = _lock_ttls(app)
    except Exception as exc:  # the app cannot be finalized: a task's options are refused
        unread = Renewal(UNSURE, f"the app's tasks cannot be read ({type(exc).__name__})")
        return {lock.key: unread for lock in locks}
    return {lock.key: _renewal(lock, ttls) for lock in locks}


def _lock_ttls(app: Any) -> dict[str, set[float | None]]:
    """The ``lock_ttl`` of ``app``'s locked tasks (``None``: a renewed lease), by lock name. A
    task whose lock options cannot be read adds :data:`_UNREAD` under its own name: its locks
    are unsure."""
    ttls: dict[str, set[float | None]] = {}
    for name, task in list(app.tasks.items()):
        try:
            spec = spec_of(task)
        except Exception:  # a LockConfigError: its worker would not run it either
            ttls.setdefault(name, set()).add(_UNREAD)
            continue
        if spec is not None:
            ttls.setdefault(spec.options.name or name, set()).add(spec.options.ttl)
    return ttls


#: What :func:`_lock_ttls` says of a task whose lock options cannot be read (no ``lock_ttl``
#: is negative).
_UNREAD = -1.0


def _renewal(lock: HeldLock, ttls: Mapping[str, set[float | None]]) -> Renewal:
    overrides = lock.overrides or {}
    if "ttl" in overrides:  # the holder's call set its lock_ttl (None: a renewed lease)
        ttl = overrides["ttl"]
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, (int, float))):
            return Renewal(UNSURE, f"its call's recorded lock_ttl {ttl!r} is no number of seconds")
        known: set[float | None] = {ttl}
        source = "its call's per-call lock_ttl"
    elif lock.name != lock.lock_name:  # a task's lock: <lock_name>:<digest>
        known = ttls.get(lock.lock_name, set())
        source = f"the lock_ttl of its tasks (lock name {lock.lock_name})"
    else:
        return NOT_KNOWN
    if not known:
        return Renewal(UNSURE, f"no task of the app takes the lock name {lock.lock_name}")
    if _UNREAD in known:
        return Renewal(UNSURE, f"the lock options of a task of {lock.lock_name} cannot be read")
    if known == {None}:
        return Renewal(RENEWED)
    if None in known:
        return Renewal(
            UNSURE, f"the tasks of lock name {lock.lock_name} renew it or not (their lock_ttl)"
        )
    shown = " or ".join(f"{t:g}s" for t in sorted(t for t in known if t is not None))
    return Renewal(FIXED, f"{source} is a fixed {shown}")


def hosts_to_ping(locks: Iterable[HeldLock]) -> set[str]:
    """The hosts of the holders that may be running: every token's but a cooldown's."""
    return {lk.holder.host for lk in locks if lk.holder and not lk.holder.cooling}


def verdict(
    lock: HeldLock,
    pinged: Mapping[str, str],
    timeout: float,
    lease: float,
    renewal: Renewal = NOT_KNOWN,
) -> Verdict:
    """The :class:`Verdict` on ``lock``'s holder from what its worker's ping said (``pinged``:
    :func:`liveness` of the holder hosts, perhaps heard a moment ago), whether the lock is
    renewed (``renewal``: :func:`renewals`) and its TTL."""
    if lock.holder is None:
        # Said after "held by a value that is not a celery-redlock token" (``who``): the
        # reason adds what follows from it, not the same words again.
        return Verdict(UNKNOWN, "it names no worker, so its liveness is unknown")
    if lock.holder.cooling:
        return COOLING
    host = lock.holder.host
    state = pinged.get(host, UNKNOWN)
    pids = getattr(state, "pids", None)
    if state == ALIVE and (pids is None or lock.holder.pid in pids):
        return Verdict(ALIVE, f"its worker {host} answers a control ping")
    if state == UNKNOWN:
        if "@" not in host:
            return Verdict(UNKNOWN, "it was not taken in a worker, so its liveness is unknown")
        return Verdict(
            UNKNOWN,
            f"its worker {host} did not answer under that name, but a live worker answers "
            "under a similar one, so its liveness is unknown",
        )
    if state == ALIVE:  # its worker answers, and the holder's process is none of its own
        silent = unanswered = (
            f"its worker {host} answers, but its process {lock.holder.pid} is none of that "
            "worker's (restarted under the same name, or a pool child that died)"
        )
    else:
        silent = (
            f"its worker {host} does not answer a control ping (a worker in warm shutdown "
            "stops answering at once)"
        )
        unanswered = f"its worker {host} did not answer a control ping within {timeout}s"
    lease, named, renewal = _judged_by(lock, lease, renewal)
    if capped(lock, lease):
        return Verdict(UNKNOWN, f"{silent}, and {_CAPPED}")
    age = lease_age(lock, lease)
    if age is not None and age < lease * RENEWED_WITHIN:
        return _recent(silent, age, lease, renewal, named)
    if lock.holder.lease_ms is not None and age is None and lock.ttl is not None:
        return Verdict(
            UNKNOWN,
            f"{silent}, and its TTL ({lock.ttl:.1f}s) is longer than {named} ({lease:g}s): "
            "extended past it by its holder, so its liveness is unknown",
        )
    if renewal.kind == RENEWED and age is None and lock.ttl is not None:
        # Deploy probe, session 30: (1) workers renew under redlock_lease=30; (2) a deploy
        # brings 10, and the command runs with it; (3) an old worker in warm shutdown, still
        # running and renewing, does not answer; (4) its TTL, 29 s, is no 10 s lease's: it
        # was released as dead, and the next call of the key ran beside it.
        return Verdict(
            UNKNOWN,
            f"{silent}, and its TTL ({lock.ttl:.1f}s) is longer than redlock_lease={lease:g}s, "
            "which its task renews: renewed under a longer lease (workers of another "
            "redlock_lease), or by a call whose lock_ttl record is lost, so its liveness is "
            "unknown",
        )
    if renewal.kind == FIXED:
        shown = f"{renewal.why}, never renewed, and its TTL is no lease's set lately"
    elif age is not None:
        shown = f"its TTL shows no renewal for {age:.1f}s, two thirds of {named} or more"
    else:
        shown = "its TTL is not a renewed lease's"
    return Verdict(DEAD, f"{unanswered}, and {shown}", gone=state == ALIVE)


#: Why a lock whose TTL is its holder's ``max_hold`` cap is not judged by its renewal.
_CAPPED = (
    "its TTL is cut to its task's hard time limit (max_hold), which no renewal moves, so its "
    "liveness is unknown; the key expires by itself at that limit"
)


def unpinged(lock: HeldLock, lease: float, why: str, renewal: Renewal = NOT_KNOWN) -> Verdict:
    """The :class:`Verdict` on ``lock``'s holder when the workers could not be pinged (``why``:
    the broker does not answer): alive by a recent renewal of a renewed lock (``renewal``:
    :func:`renewals`), as when its worker is silent; else unknown, never dead."""
    if lock.holder is not None and lock.holder.cooling:
        return COOLING
    unpinged = f"the workers could not be pinged ({why})"
    lease, named, renewal = _judged_by(lock, lease, renewal)
    if capped(lock, lease):
        return Verdict(UNKNOWN, f"{unpinged}, and {_CAPPED}")
    age = lease_age(lock, lease)
    if lock.holder is not None and age is not None and age < lease * RENEWED_WITHIN:
        return _recent(unpinged, age, lease, renewal, named)
    return Verdict(UNKNOWN, unpinged)


#: How a verdict names the lease it judges a lock by when that is the command's own.
LEASE_SETTING = "redlock_lease"


def _judged_by(lock: HeldLock, lease: float, renewal: Renewal) -> tuple[float, str, Renewal]:
    """The lease to judge ``lock``'s TTL by, its name in a verdict, and the lock's renewal:
    the holder's own lease where its token records one (a renewing holder of this version:
    see :mod:`celery_redlock._redis.owner`), else ``lease`` (the command's ``redlock_lease``)
    and ``renewal`` (what the app says). The recorded lease is the one the holder renews to,
    whatever lease the command runs with: a deploy that changes ``redlock_lease`` leaves the
    draining workers' locks judged by the lease they renew under."""
    holder = lock.holder
    if holder is None or holder.lease_ms is None:
        return lease, LEASE_SETTING, renewal
    named = LEASE_SETTING if holder.lease_ms == ms(lease) else "its holder's own lease"
    return holder.lease_ms / 1000, named, Renewal(RENEWED)


def unpinged_why(app: Any) -> str:
    """Why the workers of ``app`` could not be pinged, for a verdict (:func:`_ping` refused,
    or failed)."""
    return "the broker does not answer" if app.conf.broker_write_url else "no broker_url is set"


def judged_unpinged(
    app: Any, locks: Iterable[HeldLock], lease: float, why: str
) -> dict[str, Verdict]:
    """:func:`unpinged` of each lock, by key, with its :func:`renewals`."""
    locks = list(locks)
    renewed = renewals(app, locks)
    return {lock.key: unpinged(lock, lease, why, renewed[lock.key]) for lock in locks}


def _recent(silence: str, age: float, lease: float, renewal: Renewal, named: str) -> Verdict:
    """The verdict on a silent holder whose TTL is that of a lease set ``age`` seconds ago,
    within two thirds of the lease (``named`` so in the reason): alive if its lock is renewed,
    else unknown."""
    within = f"within two thirds of {named} ({lease * RENEWED_WITHIN:.1f}s)"
    if renewal.kind == RENEWED:
        return Verdict(
            ALIVE,
            f"{silence}, but its lease was set {age:.1f}s ago (acquired or renewed), "
            f"{within}, and its task renews it, so its holder is alive",
            renewed=True,
        )
    if renewal.kind == FIXED:  # see the module's docstring
        return Verdict(
            UNKNOWN,
            f"{silence}; {renewal.why}, which this app never renews, but its TTL is also that "
            f"of a lease set {age:.1f}s ago, {within} (the workers' older code, or a call "
            "whose per-call lock_ttl record was lost, would renew it), so whether its holder "
            "is alive is unknown",
        )
    return Verdict(
        UNKNOWN,
        f"{silence}; its TTL is that of a lease set {age:.1f}s ago, {within}, but "
        f"{renewal.why}, so whether it was renewed, and its holder alive, is unknown",
    )
