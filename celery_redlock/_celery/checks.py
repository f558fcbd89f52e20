"""Startup checks: what a worker says about its lock Redis when it becomes ready.

Run once per worker, in its main process, for an app with at least one locked task. Each
finding is one log line on the ``celery_redlock.worker`` logger; nothing here stops the worker,
because a Redis that is down at startup may be up a second later, and the
``redlock_on_unavailable`` policy already decides what a task does meanwhile. (Invalid settings
and option mixes do stop it, earlier: see :mod:`celery_redlock._celery.wiring`.)

=========================================  =======  ===========================================
finding                                    level    why
=========================================  =======  ===========================================
a node does not answer ``PING``            ERROR    tasks follow ``redlock_on_unavailable``
a command the package needs is refused     ERROR    one line naming every refused command
(ACL: ``NOPERM``), found by a dry run               (``EVALSHA``, ``PUBLISH``...): see
                                                    :func:`dry_run`
the node is out of memory (``OOM``: full   ERROR    acquisitions are refused; tasks follow
under ``noeviction``)                               ``redlock_on_unavailable``
server version                             INFO     for bug reports; below 5.0 it is an ERROR:
                                                    the acquire script writes after ``TIME``
``maxmemory-policy`` other than            WARNING  lock keys carry a TTL, so both
``noeviction``                                      ``allkeys-*`` and ``volatile-*`` may evict a
                                                    held lock, and a second execution enters
a pool that enforces no time limits        INFO     only the lease bounds a lock (TTL rule)
=========================================  =======  ===========================================

Messages name a node by its URL with credentials hidden
(:func:`~celery_redlock._redis.clients.redact`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import secrets
from collections.abc import Callable
from typing import Any

import redis as redis_py
from redis.cluster import RedisCluster

from .._redis import scripts as _scripts
from .._redis.clients import UNAVAILABLE_ERRORS, client_for, redact, refused
from .._redis.keys import keys_for, lock_pattern, stats_key
from .identity import spec_of
from .options import quorum_size, settings_for

logger = logging.getLogger("celery_redlock.worker")

#: Socket timeouts of the checks: they run on the worker's main thread at startup.
CHECK_TIMEOUT = 1.0

#: What ends the dry run early: a node that stops answering, an unexpected error reply.
_DRY_RUN_ERRORS: tuple[type[BaseException], ...] = (*UNAVAILABLE_ERRORS, redis_py.RedisError)

#: The oldest Redis whose scripts may write after ``TIME`` (effects replication by default).
MIN_VERSION = (5, 0)


def run_startup_checks(app: Any, pool_enforces_limits: bool, *, pool: str | None = None) -> None:
    """Check the lock Redis of ``app`` and log what a user should know (see the module doc).

    Does nothing for an app without locked tasks. ``pool`` names the pool in the message about
    time limits (``threads``, ``solo``, ...). Never raises for a Redis or settings problem.
    """
    if not any(spec_of(task) is not None for task in app.tasks.values()):
        return
    settings = settings_for(app)
    urls = [settings.url] if isinstance(settings.url, str) else list(settings.url)
    down = [
        url
        for url in urls
        if not _check_node(url, settings.on_unavailable, len(urls) > 1, settings.prefix)
    ]
    if len(urls) > 1 and len(urls) - len(down) < quorum_size(settings):  # one node: said
        logger.error(
            "celery_redlock: %d of %d lock Redis nodes do not answer, no quorum; locked tasks "
            "follow redlock_on_unavailable=%r until a majority answers",
            len(down),
            len(urls),
            settings.on_unavailable,
        )
    if not pool_enforces_limits:
        logger.info(
            "celery_redlock: the %s pool enforces no time limits, so a lock lives by its "
            "lease: redlock_lease=%gs, renewed while the task runs (or lock_ttl where a task "
            "sets one); a task's time_limit does not bound it",
            pool or "worker's",
            settings.lease,
        )


def _check_node(url: str, on_unavailable: str, in_quorum: bool, prefix: str) -> bool:
    """Check one node; return whether it answered.

    A node of a quorum that does not answer is a WARNING (a minority down is tolerated); the
    caller reports an ERROR when no majority answers.
    """
    shown = redact(url)
    try:
        client = client_for(url, CHECK_TIMEOUT)
        client.ping()
    except Exception as exc:  # any failure here means "not usable now", never fatal
        if in_quorum:
            logger.warning(
                "celery_redlock: lock Redis node %s does not answer (%s: %s); the quorum "
                "works while a majority answers",
                shown,
                type(exc).__name__,
                exc,
            )
        else:
            logger.error(
                "celery_redlock: cannot reach the lock Redis at %s (%s: %s); locked tasks "
                "follow redlock_on_unavailable=%r until it answers",
                shown,
                type(exc).__name__,
                exc,
                on_unavailable,
            )
        return False
    try:
        infos = _infos(client)
    except redis_py.RedisError as exc:  # e.g. an ACL that denies INFO
        logger.info("celery_redlock: locks on %s; INFO is not readable (%s)", shown, exc)
        infos = []
    for info in infos:
        _check_info(shown, info)
    try:
        refusals = dry_run(client, prefix)
    except _DRY_RUN_ERRORS as exc:
        logger.warning(
            "celery_redlock: the dry run of lock commands on %s did not complete (%s: %s)",
            shown,
            type(exc).__name__,
            redact(exc),
        )
        return True
    _report_dry_run(shown, refusals, on_unavailable)
    return True


def dry_run(client: Any, prefix: str) -> dict[str, str]:
    """Run every command the package sends on throwaway keys under ``prefix``; return the
    refused ones, ``{name: error reply}``.

    The commands: ``SET``, ``GET``, ``PTTL``, ``PEXPIRE``, ``DEL``, ``TIME`` (the scripts'
    own), ``SCRIPT LOAD`` and ``EVALSHA`` of each script, ``PUBLISH`` and ``SUBSCRIBE`` (release
    notifications), ``ZADD``, ``ZREM``, ``ZPOPMIN`` and ``EXISTS`` (the queue of blocking
    waiters), ``SCAN`` (``celery redlock ls``), ``HINCRBY`` and ``HGETALL`` (counters).
    An ACL user may lack any of them (``NOPERM``), and a command refused inside a script stops
    the script half-way, where Redis 7 does not name the command: the direct calls do. A full
    ``noeviction`` node is reported under the name ``"OOM"``. The keys live a second at most,
    but for the high-water mark of fencing tokens in the check lock's Cluster slot (one of the
    16384 a deployment keeps at most; raising it to the server time changes no later token);
    nothing of a real lock is touched. Redis errors other than refusals propagate.
    """
    lock = keys_for(prefix, f"celery-redlock-check:{os.getpid()}:{secrets.token_hex(4)}")
    counters = stats_key(prefix, f"celery-redlock-check:{os.getpid()}")
    token = f"{secrets.token_hex(16)}|0|0|check|check"
    ttl_ms = 1000
    refusals: dict[str, str] = {}

    def attempt(name: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except redis_py.exceptions.OutOfMemoryError as exc:
            refusals.setdefault("OOM", _reply(exc))
        except redis_py.exceptions.ResponseError as exc:
            if not refused(exc):
                raise
            refusals[name] = _reply(exc)
        return None

    def subscribe() -> None:
        pubsub = client.pubsub()
        try:
            pubsub.subscribe(lock.channel)
            pubsub.get_message(timeout=CHECK_TIMEOUT)
        finally:
            pubsub.close()

    attempt("SET", lambda: client.set(lock.lock, token, nx=True, px=ttl_ms))
    attempt("GET", lambda: client.get(lock.lock))
    attempt("PTTL", lambda: client.pttl(lock.lock))
    attempt("PEXPIRE", lambda: client.pexpire(lock.lock, ttl_ms))
    attempt("DEL", lambda: client.delete(lock.lock))
    attempt("TIME", client.time)
    attempt("PUBLISH", lambda: client.publish(lock.channel, "0"))
    attempt("SUBSCRIBE", subscribe)
    attempt("ZADD", lambda: client.zadd(lock.waiters, {lock.channel: 0}))
    attempt("ZREM", lambda: client.zrem(lock.waiters, lock.channel))
    attempt("ZPOPMIN", lambda: client.zpopmin(lock.waiters))
    attempt("EXISTS", lambda: client.exists(lock.waiters))
    attempt("SCAN", lambda: next(iter(client.scan_iter(match=lock_pattern(prefix))), None))
    attempt("HINCRBY", lambda: client.hincrby(counters, "check", 0))
    attempt("HGETALL", lambda: client.hgetall(counters))
    with contextlib.suppress(redis_py.RedisError):
        client.pexpire(counters, ttl_ms)
    scripts: dict[str, tuple[str, list[str], list[Any]]] = {
        "acquire": (
            _scripts.ACQUIRE,
            [lock.fence, lock.high_water, lock.lock],
            [token, ttl_ms, ttl_ms, "0", "1"],
        ),
        "extend": (_scripts.EXTEND, [lock.lock], [token, ttl_ms, "0"]),
        "raise_fence": (_scripts.RAISE_FENCE, [lock.fence, lock.high_water], [0, ttl_ms]),
        "wait": (
            _scripts.WAIT,
            [lock.lock, lock.waiters],
            [token, ttl_ms, _scripts.queue_member(lock.channel, token, ttl_ms), 0, "check"],
        ),
        "leave": (_scripts.LEAVE, [lock.lock, lock.waiters], [lock.channel, "check", "0"]),
        "release": (_scripts.RELEASE, [lock.channel, lock.waiters, lock.lock], [token, 0, "0"]),
        "release_attempt": (
            _scripts.RELEASE_ATTEMPT,
            [lock.channel, lock.waiters, lock.lock],
            ["", "", 0, "0"],
        ),
        "mark_queued": (_scripts.MARK_QUEUED, [lock.queued], [token, ttl_ms]),
        "clear_queued": (_scripts.CLEAR_QUEUED, [lock.queued], [token]),
        "mark_newest": (_scripts.MARK_NEWEST, [lock.newest], [token, 0, 0, ttl_ms]),
        "check_newest": (_scripts.CHECK_NEWEST, [lock.newest], [token]),
    }
    for name, (source, keys, args) in scripts.items():
        if attempt("SCRIPT LOAD", functools.partial(client.script_load, source)) is None:
            break  # without it, EVALSHA finds no script to run
        try:
            reply = client.evalsha(_scripts.sha1(source), len(keys), *keys, *args)
        except redis_py.exceptions.NoPermissionError as exc:
            refusals["EVALSHA"] = _reply(exc)  # EVALSHA itself: every script is refused
            break
        except redis_py.exceptions.ResponseError as exc:
            if not refused(exc):
                raise
            key = "OOM" if isinstance(exc, redis_py.exceptions.OutOfMemoryError) else ""
            refusals.setdefault(key or f"a command in the {name} script", _reply(exc))
            continue
        if name == "release" and reply == _scripts.RELEASED_NOT_NOTIFIED:
            refusals["PUBLISH in the release script"] = "refused: waiters are not notified"
    return refusals


def _reply(exc: BaseException) -> str:
    """A refusal's message without the script SHA and line Redis appends."""
    return str(exc).partition(" script: ")[0].strip()


#: Refusals that only cost the queue of blocking waiters (the lock works without it).
QUEUE_REFUSALS = (
    "ZADD",
    "ZREM",
    "ZPOPMIN",
    "EXISTS",
    "a command in the wait script",
    "a command in the leave script",
)


def _report_dry_run(shown: str, refusals: dict[str, str], on_unavailable: str) -> None:
    queue = {name: refusals.pop(name) for name in QUEUE_REFUSALS if name in refusals}
    if queue:
        logger.warning(
            "celery_redlock: the lock Redis at %s refuses the commands of the queue of blocking "
            "waiters: %s; a release then wakes every waiter of a lock, and each tries, instead "
            "of handing the lock to the first one (grant +zadd +zrem +zpopmin +exists to the "
            "ACL user)",
            shown,
            "; ".join(f"{name}: {reply}" for name, reply in queue.items()),
        )
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
    if refusals:
        logger.error(
            "celery_redlock: the lock Redis at %s refuses commands this package needs: %s "
            "(%s); grant them to the ACL user (e.g. ACL SETUSER <user> +@scripting +@keyspace "
            "+@read +@write +@pubsub ~<prefix>:* &<prefix>:*); until then lock operations fail "
            "and locked tasks follow redlock_on_unavailable=%r",
            shown,
            ", ".join(refusals),
            "; ".join(f"{name}: {reply}" for name, reply in refusals.items()),
            on_unavailable,
        )


def _infos(client: Any) -> list[dict[str, Any]]:
    """``INFO`` of the server, or of every primary of a cluster."""
    if isinstance(client, RedisCluster):
        return [client.info(target_nodes=node) for node in client.get_primaries()]
    return [client.info()]


def _check_info(shown: str, info: dict[str, Any]) -> None:
    version = str(info.get("redis_version", "?"))
    logger.info("celery_redlock: locks on Redis %s at %s", version, shown)
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
