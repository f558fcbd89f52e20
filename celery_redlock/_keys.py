"""The only place where Redis key names are built.

Every key of one lock shares a ``{hash tag}`` so that a script touching several of them runs in
one Redis Cluster slot::

    <prefix>:{<name>}            the lock itself (string: owner token), TTL = lease
    <prefix>:{<name>}:fence      fencing counter (string: integer), TTL = FENCE_TTL_MS
    <prefix>:{<name>}:released   pub/sub channel a release publishes on (not a stored key)

For a task, ``<name>`` is ``<lock_name>:<digest>`` where the digest is a fixed-length hash of the
task's canonical arguments: argument values never appear in a key.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

#: How long a fencing counter outlives the last acquisition of its lock.  After that the next
#: token restarts from the Redis server's clock (microseconds), which is still larger than any
#: token handed out before unless that server's clock stepped backwards by more than the idle
#: period.
FENCE_TTL_MS = 24 * 3600 * 1000

_FORBIDDEN = set("{}")


@dataclass(frozen=True)
class LockKeys:
    """The Redis names belonging to one lock."""

    lock: str
    fence: str
    channel: str


def validate_name(name: str) -> None:
    """Reject names that would break the hash tag (``{`` or ``}``) or are empty."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"lock name must be a non-empty string, got {name!r}")
    if _FORBIDDEN & set(name):
        raise ValueError(f"lock name {name!r} must not contain '{{' or '}}'")


def keys_for(prefix: str, name: str) -> LockKeys:
    """Return the keys of the lock called ``name`` under ``prefix``."""
    validate_name(name)
    base = f"{prefix}:{{{name}}}"
    return LockKeys(lock=base, fence=f"{base}:fence", channel=f"{base}:released")


def digest(canonical: bytes) -> str:
    """Fixed-length (32 hex characters, 128 bits) digest of a canonical argument encoding."""
    return hashlib.blake2b(canonical, digest_size=16).hexdigest()


def task_lock_name(lock_name: str, canonical: bytes) -> str:
    """The lock name of one task call: its ``lock_name`` and the digest of its arguments."""
    return f"{lock_name}:{digest(canonical)}"


def lock_pattern(prefix: str) -> str:
    """A ``SCAN`` pattern that matches every lock key (not fences) under ``prefix``."""
    return f"{prefix}:{{*}}"
