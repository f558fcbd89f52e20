"""Startup checks: what a worker says about its lock Redis when it becomes ready.

Run once per worker, in its main process, for an app with at least one locked task. Each
finding is one log line on the ``celery_redlock.worker`` logger; nothing here stops the worker,
because a Redis that is down at startup may be up a second later, and the
``redlock_on_unavailable`` policy already decides what a task does meanwhile. (Invalid settings
and option mixes do stop it, earlier: see :mod:`celery_redlock._celery.wiring`.)

=========================================  =======  ===========================================
finding                                    level    why
=========================================  =======  ===========================================
a node does not answer ``PING`` (a         ERROR    tasks follow ``redlock_on_unavailable``
refusal is an answer: only a quorum needs
``+ping``)
a command a registered task needs, or its  ERROR    one line per feature (the lock; enqueue,
key or channel, is refused (ACL:                    replace/debounce, rate where a task uses
``NOPERM``), found by a dry run                     them), naming the commands and the ACL
(:mod:`celery_redlock._redis.probe`)                rules to grant (``+cmd``, ``~<prefix>:*``
                                                    or ``&<prefix>:*``)
a command of the waiters' queue refused    WARNING  a release wakes every waiter instead of
                                                    handing the lock over
a command only ``celery redlock`` sends    INFO     ``SCAN``, ``HGETALL``...: the command line
is refused                                          run as this user is refused
the node is out of memory (``OOM``: full   ERROR    acquisitions are refused; tasks follow
under ``noeviction``)                               ``redlock_on_unavailable``
server version                             INFO     for bug reports; below 5.0 it is an ERROR:
                                                    the acquire script writes after ``TIME``
``maxmemory-policy`` other than            WARNING  lock keys carry a TTL, so both
``noeviction``                                      ``allkeys-*`` and ``volatile-*`` may evict a
                                                    held lock, and a second execution enters
a task's fixed ``lock_ttl`` is shorter     WARNING  a run longer than the TTL goes on after
than its hard time limit (the task's or             its key expires, beside the next call
the worker's ``--time-limit``)
a pool that enforces no time limits        INFO     only the lease bounds a lock (TTL rule)
a gevent or eventlet pool                  WARNING  renewal runs only while a task yields: a
                                                    CPU-bound run longer than the lease loses
                                                    its lock while it runs
Garnet; a KeyDB active replica             ERROR    a guarantee of the lock breaks there:
                                                    :mod:`celery_redlock._redis.servers`
=========================================  =======  ===========================================

Messages name a node by its URL with credentials hidden
(:func:`~celery_redlock._redis.clients.redact`).
"""

from __future__ import annotations

import logging
from typing import Any

from .._redis import probe, servers
from .._redis.clients import gives_client_cert, missing_files, redact
from .._redis.core import connect_hint, describe, refusal_hints, refused_by_acl
from .identity import spec_of
from .options import TaskLockOptions, contention_policy, quorum_size, settings_for, supersedes
from .timeline import size_for

logger = logging.getLogger("celery_redlock.worker")

#: Socket timeouts of the checks: they run on the worker's main thread at startup.
CHECK_TIMEOUT = 1.0

#: The oldest Redis whose scripts may write after ``TIME`` (effects replication by default).
MIN_VERSION = (5, 0)


def run_startup_checks(
    app: Any,
    pool_enforces_limits: bool,
    *,
    pool: str | None = None,
    time_limit: float | None = None,
) -> None:
    """Check the lock Redis of ``app`` and log what a user should know (see the module doc).

    Does nothing for an app without locked tasks. ``pool`` names the pool in the message about
    time limits (``threads``, ``solo``, ...); ``time_limit`` is the worker's ``--time-limit``.
    Never raises for a Redis or settings problem.
    """
    features = features_of(app)
    if not features:
        return
    _check_fixed_ttls(app, time_limit)
    settings = settings_for(app)
    waiting = sorted(
        task.name
        for task in app.tasks.values()
        if (spec := spec_of(task)) is not None
        and contention_policy(spec.options, settings) == "wait"
    )
    if waiting:  # the commands of the waiters' queue are then a WARNING's
        features["wait"] = waiting
    urls = [settings.url] if isinstance(settings.url, str) else list(settings.url)
    if app.conf.get("redlock_url") is None:  # told before logging was set up: tell the log
        logger.info(
            "celery_redlock: redlock_url is not set; locks live on the Redis broker at %s",
            redact(settings.url),
        )
    answered = {
        url: _check_node(url, settings.on_unavailable, len(urls) > 1, settings.prefix, features)
        for url in urls
    }
    down = [url for url, server in answered.items() if server is None]
    if len(urls) > 1:
        _check_distinct(answered, len(urls))
    if len(urls) > 1 and len(urls) - len(down) < quorum_size(settings):  # one node: said
        logger.error(
            "celery_redlock: %d of %d lock Redis nodes do not answer, no quorum; locked tasks "
            "follow redlock_on_unavailable=%r until a majority answers",
            len(down),
            len(urls),
            settings.on_unavailable,
        )
    if pool in _GREEN_POOLS:
        limit = (  # gevent's; eventlet enforces no time limit
            f", or under a hard time limit T past T + redlock_ttl_margin={settings.ttl_margin:g}s"
            " (the pool stops a task at T only where it yields),"
            if pool_enforces_limits
            else ""
        )
        logger.warning(
            "celery_redlock: the %s pool renews locks in a greenlet, which runs only while a "
            "task waits on I/O: a task that computes (or blocks in C code) without yielding "
            "for longer than redlock_lease=%gs%s loses its lock while it runs, and another "
            "worker may then run the same key; give such a task a lock_ttl longer than its "
            "longest run, or run it on a prefork or threads worker",
            pool,
            settings.lease,
            limit,
        )
    if not pool_enforces_limits:
        logger.info(
            "celery_redlock: the %s pool enforces no time limits, so a lock lives by its "
            "lease: redlock_lease=%gs, renewed while the task runs (or lock_ttl where a task "
            "sets one); a task's time_limit does not bound it",
            pool or "worker's",
            settings.lease,
        )


def _check_fixed_ttls(app: Any, worker_limit: float | None) -> None:
    """A WARNING per task whose fixed ``lock_ttl`` is shorter than its hard time limit (its
    own ``time_limit``, else the worker's). Timeline without it: (1) a task with
    ``lock_ttl=2`` and ``time_limit=60`` takes its key for 2 s, never renewed; (2) its run
    takes 6 s; (3) at 2 s the key expires and a second call of the key starts beside it; (4)
    only when the first run ends does an ERROR say so. A per-call ``lock_ttl`` or
    ``time_limit`` is not seen here."""
    for task in sorted(app.tasks.values(), key=lambda t: str(t.name)):
        spec = spec_of(task)
        limit = task.time_limit or worker_limit
        if (
            spec is None
            or spec.options.ttl is None
            or spec.options.limit is None  # lock_rate alone takes no lock
            or not limit
            or limit <= spec.options.ttl
        ):
            continue
        logger.warning(
            "celery_redlock: task %s has lock_ttl=%gs, shorter than its time limit of %gs: a "
            "run longer than %gs goes on after its key expires, and another call of the same "
            "key may start beside it; raise lock_ttl to the time limit or more, or leave it "
            "None (the lock is then renewed while the task runs)",
            task.name,
            spec.options.ttl,
            float(limit),
            spec.options.ttl,
        )


#: Pools whose tasks and renewal share one OS thread (``celery worker -P`` names).
_GREEN_POOLS = ("gevent", "eventlet")


def _uses(options: TaskLockOptions) -> list[str]:
    """The features (:data:`celery_redlock._redis.probe.FEATURES`) a task's options use."""
    used = ["lock"]
    if options.enqueue == "keep":
        used.append("enqueue")
    if supersedes(options):
        used.append("newest")
    if options.rate is not None:
        used.append("rate")
    return used


def features_of(app: Any) -> dict[str, list[str]]:
    """``{feature: names of the registered tasks that use it}``; empty without locked tasks."""
    found: dict[str, list[str]] = {}
    for task in app.tasks.values():
        spec = spec_of(task)
        if spec is not None:
            for feature in _uses(spec.options):
                found.setdefault(feature, []).append(task.name)
    if "lock" in found:  # every locked task counts its events (and pushes them to the ring)
        found["counters"] = list(found["lock"])
        if size_for(app) > 0:
            found["timeline"] = list(found["lock"])
    return found


def _check_distinct(answered: dict[str, str | None], size: int) -> None:
    """Log an ERROR for each server that several nodes of the quorum name (one ``run_id``):
    one server by its TCP port and by its unix socket, by two of its addresses, or by a DNS
    alias, which the URL check (:func:`~celery_redlock._redis.clients.check_distinct`) cannot
    see. Timeline: (1) ``redlock_url`` lists A by port, A by socket, and B; (2) A crashes;
    (3) two of three nodes are down, and no lock is taken while B, a majority of the servers,
    answers; and a lock held on A alone passes for a majority."""
    by_server: dict[str, list[str]] = {}
    for url, server in answered.items():
        if server:
            by_server.setdefault(server, []).append(url)
    for urls in by_server.values():
        if len(urls) > 1:
            logger.error(
                "celery_redlock: redlock_url names one Redis server %d times (%s: one run_id): "
                "the quorum of %d counts it as %d nodes, so its one crash takes %d votes; give "
                "each node its own server",
                len(urls),
                ", ".join(redact(u) for u in urls),
                size,
                len(urls),
                len(urls),
            )


def _check_node(
    url: str, on_unavailable: str, in_quorum: bool, prefix: str, features: dict[str, list[str]]
) -> str | None:
    """Check one node; return the ``run_id`` of the server that answered (``""`` when its
    ``INFO`` is not readable), or ``None`` when it did not answer.

    A node of a quorum that does not answer is a WARNING (a minority down is tolerated); the
    caller reports an ERROR when no majority answers.
    """
    shown = redact(url)
    try:
        client = probe.connect(url, CHECK_TIMEOUT)
    except Exception as exc:  # any failure here means "not usable now", never fatal
        fix = probe.login_refusal(exc)
        if fix is not None:
            log = logger.warning if in_quorum else logger.error
            log(
                "celery_redlock: the lock Redis at %s refused the connection (%s: %s): %s; "
                "fix redlock_url. Until then locked tasks follow redlock_on_unavailable=%r",
                shown,
                type(exc).__name__,
                redact(describe(exc)),
                fix,
                on_unavailable,
            )
            return None
        hint = connect_hint(url.startswith("rediss"), exc, gives_client_cert(url))
        missing = missing_files(url)  # redis-py's "No such file or directory" names none
        if missing:
            hint = f"the URL names a file that does not exist: {', '.join(missing)}"
        why = f"{type(exc).__name__}: {redact(describe(exc))}" + (f"; {hint}" if hint else "")
        if in_quorum:
            logger.warning(
                "celery_redlock: lock Redis node %s does not answer (%s); the quorum "
                "works while a majority answers",
                shown,
                why,
            )
        else:
            logger.error(
                "celery_redlock: cannot reach the lock Redis at %s (%s); locked tasks "
                "follow redlock_on_unavailable=%r until it answers",
                shown,
                why,
                on_unavailable,
            )
        return None
    try:
        infos = probe.infos(client)
    except probe.ERRORS as exc:  # e.g. an ACL that denies INFO
        logger.warning(
            "celery_redlock: locks on %s; INFO %s (%s), so the checks of its maxmemory-policy "
            "(an evicting policy drops held locks), its version and its kind of server%s are "
            "skipped%s",
            shown,
            "is refused" if refused_by_acl(exc) else "did not answer",
            redact(describe(exc)),
            ", and whether another node of the quorum is the same server" if in_quorum else "",
            "; grant +info to have them" if refused_by_acl(exc) else "",
        )
        infos = []
    for node, info in infos:  # a Cluster's primaries, each named
        _check_info(shown if node is None else f"{shown} (primary {node})", info)
    misfit = probe.misfit(client, infos[0][1]) if len(infos) == 1 and infos[0][0] is None else None
    server = str(infos[0][1].get("run_id") or "") if len(infos) == 1 else ""
    if misfit is not None:  # the dry run would only repeat it, command by command
        # A WARNING for a Cluster's node: the locks in its own slots work.
        (logger.error if misfit.sentinel else logger.warning)(
            "celery_redlock: the lock Redis at %s is %s: %s, and locked tasks follow "
            "redlock_on_unavailable=%r; %s",
            shown,
            misfit.what,
            "it refuses every lock command"
            if misfit.sentinel
            else "a lock whose key lives on another node is refused (MOVED)",
            on_unavailable,
            misfit.fix,
        )
        return server
    try:
        refusals = probe.dry_run(client, prefix, CHECK_TIMEOUT)
    except probe.ERRORS as exc:
        text, hints = refusal_hints(exc)
        logger.warning(
            "celery_redlock: the dry run of lock commands on %s did not complete (%s: %s)%s",
            shown,
            type(exc).__name__,
            redact(text),
            "".join(f"; {hint}" for hint in hints),
        )
        return server
    if not in_quorum:
        refusals.pop("PING", None)  # only a quorum pings its nodes
    _report_dry_run(shown, refusals, on_unavailable, features, prefix)
    return server


#: What a refusal costs, per feature a registered task uses (ERROR).
_CONSEQUENCES = {
    "lock": "this package needs",
    "counters": "the event counters need",
    "enqueue": "lock_enqueue=True needs",
    "newest": "lock_enqueue='replace' and lock_debounce need",
    "rate": "lock_rate needs",
    "timeline": "redlock_timeline needs",
}
#: What a refusal of the release notifications, or of a quorum's PING, costs (in the "lock"
#: feature, which works without them: waiting does not).
_NOTIFY = {
    "PUBLISH": "a release does not wake the blocking waiters (each tries again when the TTL it "
    "read ends; a WARNING at each release)",
    "SUBSCRIBE": "a blocking wait (lock_on_contention='wait', Lock.acquire()) fails with "
    "LockUnavailable",
    # Only a quorum's (a single node's is dropped before): it pings its nodes to pick one to
    # listen on.
    "PING": "a quorum's blocking wait (lock_on_contention='wait', Lock.acquire()) fails with "
    "LockUnavailable",
}
_UNTIL = {
    "lock": "until then lock operations fail and locked tasks follow redlock_on_unavailable={!r}",
    "counters": "until then `celery redlock stats` and Prometheus see no new counts (the tasks "
    "lock and run as usual)",
    "enqueue": "until then their calls are published without de-duplication",
    "newest": "until then their calls are published unmarked (each runs, none is superseded) "
    "with a WARNING in the caller",
    "rate": "until then their rate check follows redlock_on_unavailable={!r}",
    "timeline": "until then their events are not recorded (the dashboard's timeline stays "
    "empty; the tasks run on)",
}


def _grant(refused: list[str], refusals: dict[str, str], prefix: str) -> str:
    """The ACL rules that grant the ``refused`` probes: a command, or the key or channel
    pattern a refusal names (``~<prefix>:*``, ``&<prefix>:*``)."""
    rules = (probe.acl_rule(refusals[name], prefix, name) for name in refused)
    return " ".join(dict.fromkeys(rules))


def _report_dry_run(
    shown: str,
    refusals: dict[str, str],
    on_unavailable: str,
    features: dict[str, list[str]],
    prefix: str,
) -> None:
    """Log the refusals of :func:`~celery_redlock._redis.probe.dry_run` by what they cost."""
    oom = refusals.pop("OOM", None)
    if oom is not None:
        logger.error(
            "celery_redlock: the lock Redis at %s is out of memory (OOM: %s); it refuses new "
            "locks, and locked tasks follow redlock_on_unavailable=%r until memory is freed "
            "(raise maxmemory, or keep the lock database apart from bulk data)",
            shown,
            oom,
            on_unavailable,
        )
    reported: set[str] = set()
    for feature in ("lock", "counters", "enqueue", "newest", "rate", "timeline"):
        if feature not in features:
            continue
        # A refusal the lock's ERROR named is not repeated; one that two features need (LTRIM
        # for lock_rate and the ring) is named for each, with all that each needs.
        lock = set() if feature == "lock" else set(probe.FEATURES["lock"].checked)
        commands = probe.FEATURES[feature].checked
        refused = [c for c in commands if c in refusals and c not in lock]
        reported.update(refused)
        notify = [c for c in refused if feature == "lock" and c in _NOTIFY]
        refused = [c for c in refused if c not in notify]
        if notify:  # the locks work without them: waiting does not
            logger.error(
                "celery_redlock: the lock Redis at %s refuses %s: %s (%s); grant them to the "
                "ACL user (%s); until then %s",
                shown,
                "the commands of blocking waits"
                if notify == ["PING"]
                else "the release notifications",
                ", ".join(notify),
                "; ".join(f"{name}: {refusals[name]}" for name in notify),
                _grant(notify, refusals, prefix),
                ", and ".join(_NOTIFY[name] for name in notify),
            )
        if not refused:
            continue
        every = feature in ("lock", "counters")
        tasks = "" if every else f" (tasks: {', '.join(sorted(features[feature]))})"
        logger.error(
            "celery_redlock: the lock Redis at %s refuses commands %s%s: %s (%s); grant them to "
            "the ACL user (%s); %s",
            shown,
            _CONSEQUENCES[feature],
            tasks,
            ", ".join(refused),
            "; ".join(f"{name}: {refusals[name]}" for name in refused),
            _grant(refused, refusals, prefix),
            _UNTIL[feature].format(on_unavailable),
        )
    queue = [c for c in probe.FEATURES["queue"].commands if c in refusals and c not in reported]
    reported.update(queue)
    if queue:  # a WARNING when a registered task waits; else only a call told to wait would
        waiting = features.get("wait")
        (logger.warning if waiting else logger.info)(
            "celery_redlock: the lock Redis at %s refuses the commands of the queue of blocking "
            "waiters: %s; %s (grant %s to the ACL user)%s",
            shown,
            "; ".join(f"{name}: {refusals[name]}" for name in queue),
            _queue_consequence(set(queue)),
            _grant(queue, refusals, prefix),
            f"; tasks that wait: {', '.join(sorted(waiting))}"
            if waiting
            else "; no registered task waits (lock_on_contention='wait'), but a call given "
            "that policy, or a Lock's blocking acquire, would",
        )
    tools = [*probe.FEATURES["cli"].commands, *probe.FEATURES["dashboard"].commands]
    cli = [c for c in dict.fromkeys(tools) if c in refusals and c not in reported]
    if cli:
        logger.info(
            "celery_redlock: the lock Redis at %s refuses commands that only the `celery "
            "redlock` command line and dashboard send: %s (grant %s to the user they run as); "
            "workers do not need them",
            shown,
            ", ".join(cli),
            _grant(cli, refusals, prefix),
        )


def _queue_consequence(refused: set[str]) -> str:
    """What the queue of blocking waiters does without the ``refused`` commands."""
    if refused & {"ZADD", "ZREM"}:  # no waiter can queue: they wait on the release channel
        return (
            "a release then wakes every waiter of a lock, and each tries, instead of handing "
            "the lock to the first one"
        )
    if refused & {"ZPOPMIN", "EXISTS"}:  # waiters queue, and a release cannot reach them
        return (
            "waiters queue, but a release does not reach them: each tries again only when the "
            "TTL it last read ends"
        )
    return (  # ZRANGE
        "a release hands the lock to the first waiter, but the waiter queued next is not woken "
        "to read the new holder's TTL"
    )


def _check_info(shown: str, info: dict[str, Any]) -> None:
    version = str(info.get("redis_version", "?"))
    logger.info("celery_redlock: locks on %s at %s", servers.identify(info), shown)
    for level, message in servers.verdict(info):
        logger.log(level, "celery_redlock: locks on %s: %s", shown, message)
    parts = tuple(int(p) if p.isdigit() else 0 for p in version.split(".")[:2])
    if version != "?" and parts < MIN_VERSION:
        logger.error(
            "celery_redlock: Redis %s at %s is too old: lock scripts need Redis >= %d.%d "
            "(they write after TIME), so every lock operation will fail",
            version,
            shown,
            *MIN_VERSION,
        )
    policy = str(info.get("maxmemory_policy", "noeviction"))
    if policy != "noeviction":
        maxmemory = int(info.get("maxmemory", 0) or 0)
        volatile = " (lock keys carry a TTL, so volatile-* evicts them too)"
        logger.warning(
            "celery_redlock: Redis at %s has maxmemory-policy %s (maxmemory %s): under memory "
            "pressure it may evict a held lock%s, and a second execution of the same key "
            "would start; use maxmemory-policy noeviction for the lock database",
            shown,
            policy,
            f"{maxmemory} bytes" if maxmemory else "0: no limit set yet",
            volatile if policy.startswith("volatile-") else "",
        )


def pool_name(consumer: Any) -> str | None:
    """The pool's name as ``celery worker -P`` spells it (``threads``, ``solo``, ...)."""
    pool = getattr(consumer, "pool", None)
    if pool is None:
        return None
    name = type(pool).__module__.rpartition(".")[2]
    return {"thread": "threads"}.get(name, name)
