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

import logging
from typing import Any

import redis as redis_py
from redis.cluster import RedisCluster

from .._redis.clients import client_for, redact
from .identity import spec_of
from .options import quorum_size, settings_for

logger = logging.getLogger("celery_redlock.worker")

#: Socket timeouts of the checks: they run on the worker's main thread at startup.
CHECK_TIMEOUT = 1.0

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
    down = [url for url in urls if not _check_node(url, settings.on_unavailable, len(urls) > 1)]
    if len(urls) - len(down) < quorum_size(settings):
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


def _check_node(url: str, on_unavailable: str, in_quorum: bool) -> bool:
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
        return True
    for info in infos:
        _check_info(shown, info)
    return True


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
