"""The Lua scripts, each with its contract, and the one place their replies are decoded.

Every operation on a lock is one script, so each is a single round trip and atomic on the
server. Keys always arrive through ``KEYS[]`` (built by :mod:`celery_redlock._keys`); no script
builds a key name. Scripts are registered once per client and run with ``EVALSHA``; redis-py's
:class:`~redis.commands.core.Script` reloads them after a ``NOSCRIPT`` reply (server restart,
``SCRIPT FLUSH``).

None of the known broken patterns appear here: no ``SETNX`` followed by ``EXPIRE`` (a crash in
between leaves an immortal key), no client-clock timestamps compared with ``GETSET``, no ``DEL``
without checking the owner, no ``GET`` then ``DEL`` as two commands (the key can change owner in
between).
"""

from __future__ import annotations

import hashlib
import weakref
from dataclasses import dataclass
from typing import Any

from ._keys import FENCE_TTL_MS, LockKeys

ACQUIRE = """
-- KEYS[1] lock key, KEYS[2] fencing counter key
-- ARGV[1] owner token, ARGV[2] ttl in ms (> 0), ARGV[3] fencing counter ttl in ms
-- returns {1, fencing_token}         acquired; the token is larger than any earlier one
--         {0, holder_token, pttl_ms} held by someone else
-- The fencing token is max(counter + 1, server time in whole seconds * 10^6): it keeps
-- increasing after the counter itself expires, as long as the server clock does not step
-- backwards; whole seconds make independent nodes (quorum) usually agree on the token.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local token = tonumber(redis.call('TIME')[1]) * 1000000
  local last = tonumber(redis.call('GET', KEYS[2]) or '0')
  if last + 1 > token then token = last + 1 end
  redis.call('SET', KEYS[2], string.format('%d', token), 'PX', ARGV[3])
  return {1, token}
end
return {0, redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}
"""

RELEASE = """
-- KEYS[1] lock key, KEYS[2] release channel
-- ARGV[1] owner token
-- returns 1 deleted (and a release notification published), 0 not the owner or already gone
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', KEYS[2], '1')
  return 1
end
return 0
"""

EXTEND = """
-- KEYS[1] lock key
-- ARGV[1] owner token, ARGV[2] new ttl in ms (> 0)
-- returns 1 extended, 0 not the owner (expired or taken over)
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

RELEASE_ATTEMPT = """
-- KEYS[1] lock key, KEYS[2] release channel
-- ARGV[1] task id, ARGV[2] host, ARGV[3] pid
-- Deletes the lock only if it was taken by that attempt: the token layout is
-- secret|pid|acquired_ms|host|task_id (see celery_redlock._owner).
-- returns 1 deleted, 0 missing or owned by another attempt
local value = redis.call('GET', KEYS[1])
if not value then return 0 end
local pid, host, task_id = string.match(value, '^[^|]*|([^|]*)|[^|]*|([^|]*)|(.*)$')
if task_id == ARGV[1] and host == ARGV[2] and pid == ARGV[3] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', KEYS[2], '1')
  return 1
end
return 0
"""


RAISE_FENCE = """
-- KEYS[1] fencing counter key
-- ARGV[1] fencing token, ARGV[2] fencing counter ttl in ms
-- Raises the counter to the token if it is lower (quorum write-back). returns 1
local last = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) > last then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
return 1
"""


@dataclass(frozen=True)
class AcquireResult:
    """Decoded reply of :data:`ACQUIRE`."""

    acquired: bool
    fencing_token: int | None = None
    holder: str | None = None
    pttl_ms: int | None = None


def decode_acquire(reply: Any) -> AcquireResult:
    """Decode a reply of :data:`ACQUIRE`."""
    if int(reply[0]) == 1:
        return AcquireResult(True, fencing_token=int(reply[1]))
    holder = reply[1]
    if isinstance(holder, bytes):
        holder = holder.decode("utf-8", "replace")
    return AcquireResult(False, holder=holder or None, pttl_ms=int(reply[2]))


def acquire_call(keys: LockKeys, token: str, ttl_ms: int) -> tuple[list[str], list[Any]]:
    """``(KEYS, ARGV)`` of :data:`ACQUIRE`."""
    return [keys.lock, keys.fence], [token, ttl_ms, FENCE_TTL_MS]


def release_call(keys: LockKeys, token: str) -> tuple[list[str], list[Any]]:
    """``(KEYS, ARGV)`` of :data:`RELEASE`."""
    return [keys.lock, keys.channel], [token]


def extend_call(keys: LockKeys, token: str, ttl_ms: int) -> tuple[list[str], list[Any]]:
    """``(KEYS, ARGV)`` of :data:`EXTEND`."""
    return [keys.lock], [token, ttl_ms]


def release_attempt_call(
    keys: LockKeys, task_id: str, host: str, pid: int
) -> tuple[list[str], list[Any]]:
    """``(KEYS, ARGV)`` of :data:`RELEASE_ATTEMPT`."""
    return [keys.lock, keys.channel], [task_id, host, str(pid)]


def raise_fence_call(keys: LockKeys, token: int) -> tuple[list[str], list[Any]]:
    """``(KEYS, ARGV)`` of :data:`RAISE_FENCE`."""
    return [keys.fence], [token, FENCE_TTL_MS]


def sha1(source: str) -> str:
    """The SHA1 under which Redis caches ``source`` (what ``EVALSHA`` takes)."""
    return hashlib.sha1(source.encode()).hexdigest()


_registry: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def script(client: Any, source: str) -> Any:
    """``source`` registered on ``client`` (once per client): a callable doing ``EVALSHA``."""
    try:
        scripts = _registry[client]
    except KeyError:
        scripts = _registry[client] = {}
    registered = scripts.get(source)
    if registered is None:
        registered = scripts[source] = client.register_script(source)
    return registered
