"""Which Redis-compatible server answers, from its ``INFO``, and what that means for a lock.

:func:`identify` reads the fields each server adds to the ``Server`` section (or the fields
only it has); :func:`verdict` says, as log levels and messages, where a guarantee of the lock
breaks on that server. Pure functions of the ``INFO`` reply as redis-py parses it (a dict):
the worker's startup check (:mod:`celery_redlock._celery.checks`) calls them with the ``INFO``
it already read. docs/servers.md has the table, and what was tested here versus read.

==========  ============================================  ====================================
server      recognised by                                 verdict
==========  ============================================  ====================================
Redis       none of the below (``redis_version``)         supported
Valkey      ``server_name:valkey`` or ``valkey_version``  supported (the Redis 7.2 protocol)
Dragonfly   ``dragonfly_version``                         INFO: scripts must declare their keys,
                                                          which ours do (pinned by a test)
KeyDB       a ``KeyDB`` section (``mvcc_depth``), an      ERROR with ``role:active-replica``
            executable named ``keydb-server``, or         (active replication: both sides of a
            ``role:active-replica``                       split grant the same lock); else INFO
Garnet      ``garnet_version``                            ERROR: scripts run without isolation
                                                          unless started with
                                                          ``--lua-transaction-mode``, which
                                                          ``INFO`` does not show
==========  ============================================  ====================================

Nothing here refuses to run: the check logs, and the lock works as the server lets it.
This module never imports Celery.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Server", "identify", "verdict"]


@dataclass(frozen=True)
class Server:
    """A server as its ``INFO`` describes it."""

    #: ``"Redis"``, ``"Valkey"``, ``"Dragonfly"``, ``"KeyDB"`` or ``"Garnet"``.
    product: str
    #: The product's own version (Valkey's ``valkey_version``...); for Redis ``redis_version``.
    version: str
    #: The Redis version the server claims compatibility with (``redis_version``).
    redis_version: str

    def __str__(self) -> str:
        if self.product == "Redis":
            return f"Redis {self.version}"
        return f"{self.product} {self.version} (redis_version {self.redis_version})"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def identify(info: Mapping[str, Any]) -> Server:
    """The server that replied ``info`` (an ``INFO`` or ``INFO server`` reply, parsed)."""
    redis_version = _text(info.get("redis_version", "?"))
    if "garnet_version" in info:
        return Server("Garnet", _text(info["garnet_version"]), redis_version)
    if "dragonfly_version" in info:
        return Server("Dragonfly", _text(info["dragonfly_version"]), redis_version)
    if _text(info.get("server_name", "")).lower() == "valkey" or "valkey_version" in info:
        return Server("Valkey", _text(info.get("valkey_version", redis_version)), redis_version)
    executable = _text(info.get("executable", "")).rsplit("/", 1)[-1]
    if "mvcc_depth" in info or executable == "keydb-server" or _active_replica(info):
        return Server("KeyDB", redis_version, redis_version)
    return Server("Redis", redis_version, redis_version)


def _active_replica(info: Mapping[str, Any]) -> bool:
    return _text(info.get("role", "")) == "active-replica"


def verdict(info: Mapping[str, Any]) -> list[tuple[int, str]]:
    """What a user must know about locks on the server that replied ``info``.

    Returns ``(logging level, message)`` pairs; empty for Redis and Valkey.
    """
    server = identify(info)
    if server.product == "Garnet":
        return [
            (
                logging.ERROR,
                f"{server}: Garnet runs Lua scripts without isolation unless it was started "
                "with --lua-transaction-mode (its INFO does not say): without it, two "
                "acquisitions can interleave inside the compare-and-set and both win, and a "
                "release can delete a lock another worker just took. Start Garnet with "
                "--lua --lua-transaction-mode, or use Redis or Valkey for locks",
            )
        ]
    if server.product == "KeyDB" and _active_replica(info):
        return [
            (
                logging.ERROR,
                f"{server}: this KeyDB node is an active replica (active-replica yes): "
                "every node of the group accepts writes and a split is merged by last write "
                "wins, so workers on both sides of a split each get the same lock. Point "
                "redlock_url at one primary without active replication",
            )
        ]
    if server.product == "KeyDB":
        return [(logging.INFO, f"{server}: a single KeyDB primary works like Redis for locks")]
    if server.product == "Dragonfly":
        return [
            (
                logging.INFO,
                f"{server}: Dragonfly runs a script only on the keys it declares in KEYS; "
                "every celery-redlock script declares all it touches",
            )
        ]
    return []
