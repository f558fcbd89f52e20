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

A script stops at the first ``redis.call`` that fails, and what it wrote before stays written
(Redis has no rollback). So the notification after a delete is a ``redis.pcall``: an ACL user
without ``PUBLISH`` (Redis 7 refuses it inside the script too) gets "released, waiters not
notified" (reply 2) instead of an error reply for a release that did happen.
"""

from __future__ import annotations

import hashlib
import weakref
from dataclasses import dataclass
from typing import Any

from .keys import FENCE_TTL_MS, LockKeys

ACQUIRE = """
-- KEYS[1] fencing counter key, KEYS[2..n] the lock's slot keys (one, or lock_limit of them)
-- ARGV[1] owner token, ARGV[2] ttl in ms (> 0), ARGV[3] fencing counter ttl in ms
-- returns {1, fencing_token, slot}     acquired the first free slot (1-based)
--         {0, holder_token, pttl_ms}   every slot held; the holder of the one freeing first
-- The fencing token is max(counter + 1, server time in whole seconds * 10^6): it keeps
-- increasing after the counter itself expires, as long as the server clock does not step
-- backwards; whole seconds make independent nodes (quorum) usually agree on the token.
for i = 2, #KEYS do
  if redis.call('SET', KEYS[i], ARGV[1], 'NX', 'PX', ARGV[2]) then
    local token = tonumber(redis.call('TIME')[1]) * 1000000
    local last = tonumber(redis.call('GET', KEYS[1]) or '0')
    if last + 1 > token then token = last + 1 end
    redis.call('SET', KEYS[1], string.format('%d', token), 'PX', ARGV[3])
    return {1, token, i - 1}
  end
end
local first, first_ttl = 2, redis.call('PTTL', KEYS[2])
for i = 3, #KEYS do
  local ttl = redis.call('PTTL', KEYS[i])
  if ttl < first_ttl then first, first_ttl = i, ttl end
end
return {0, redis.call('GET', KEYS[first]), first_ttl}
"""

RELEASE = """
-- KEYS[1] release channel, KEYS[2..n] the lock's slot keys
-- ARGV[1] owner token, ARGV[2] keep in ms (0: delete now; > 0: keep the slot that long)
-- returns 1 released (deleted and a notification published, or kept until expiry),
--         2 released (deleted) but PUBLISH was refused: waiters were not notified,
--         0 not the owner of any slot (expired or taken over)
for i = 2, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    if tonumber(ARGV[2]) > 0 then
      redis.call('PEXPIRE', KEYS[i], ARGV[2])
    else
      redis.call('DEL', KEYS[i])
      local published = redis.pcall('PUBLISH', KEYS[1], '1')
      if type(published) == 'table' and published.err then return 2 end
    end
    return 1
  end
end
return 0
"""

EXTEND = """
-- KEYS[1..n] the lock's slot keys
-- ARGV[1] owner token, ARGV[2] new ttl in ms (> 0),
-- ARGV[3] '1': re-assert the lock on this node if no slot exists (a quorum node that was down
--         at acquisition, or restarted empty), '0': never
-- returns 1 extended, 2 re-asserted (it was missing here), 0 not the owner (taken over, or
--         missing without re-assertion)
local first = redis.call('GET', KEYS[1])
for i = 1, #KEYS do
  local value = first
  if i > 1 then value = redis.call('GET', KEYS[i]) end
  if value == ARGV[1] then
    redis.call('PEXPIRE', KEYS[i], ARGV[2])
    return 1
  end
end
if ARGV[3] == '1' and not first then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 2
end
return 0
"""

RELEASE_ATTEMPT = """
-- KEYS[1] release channel, KEYS[2..n] the lock's slot keys
-- ARGV[1] task id, ARGV[2] host, ARGV[3] pid
-- Deletes the slot taken by that attempt: the token layout is
-- secret|pid|acquired_ms|host|task_id (see celery_redlock._redis.owner); host is compared as
-- stored, with '%' and '|' escaped (ARGV[2] comes from owner.normalize_host, escaped alike).
-- returns 1 deleted, 2 deleted but PUBLISH was refused (waiters not notified),
--         0 no slot owned by that attempt
for i = 2, #KEYS do
  local value = redis.call('GET', KEYS[i])
  if value then
    local pid, host, task_id = string.match(value, '^[^|]*|([^|]*)|[^|]*|([^|]*)|(.*)$')
    if task_id == ARGV[1] and host == ARGV[2] and pid == ARGV[3] then
      redis.call('DEL', KEYS[i])
      local published = redis.pcall('PUBLISH', KEYS[1], '1')
      if type(published) == 'table' and published.err then return 2 end
      return 1
    end
  end
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

MARK_QUEUED = """
-- KEYS[1] queued marker key
-- ARGV[1] task id, ARGV[2] ttl in ms
-- returns {1} marked (nothing of this key was queued), {0, task_id} already queued
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1}
end
return {0, redis.call('GET', KEYS[1])}
"""

CLEAR_QUEUED = """
-- KEYS[1] queued marker key
-- ARGV[1] task id
-- returns 1 cleared (the marker was this task's), 0 otherwise
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""


#: Reply of :data:`RELEASE` and :data:`RELEASE_ATTEMPT`: deleted, but ``PUBLISH`` was refused.
RELEASED_NOT_NOTIFIED = 2


@dataclass(frozen=True)
class AcquireResult:
    """Decoded reply of :data:`ACQUIRE`."""

    acquired: bool
    fencing_token: int | None = None
    slot: int | None = None
    holder: str | None = None
    pttl_ms: int | None = None


def decode_acquire(reply: Any) -> AcquireResult:
    """Decode a reply of :data:`ACQUIRE`."""
    if int(reply[0]) == 1:
        return AcquireResult(True, fencing_token=int(reply[1]), slot=int(reply[2]))
    holder = reply[1]
    if isinstance(holder, bytes):
        holder = holder.decode("utf-8", "replace")
    return AcquireResult(False, holder=holder or None, pttl_ms=int(reply[2]))


def acquire_call(keys: LockKeys, token: str, ttl_ms: int) -> tuple[list[str], list[Any]]:
    """``(KEYS, ARGV)`` of :data:`ACQUIRE`."""
    return [keys.fence, *keys.slots], [token, ttl_ms, FENCE_TTL_MS]


def release_call(keys: LockKeys, token: str, keep_ms: int = 0) -> tuple[list[str], list[Any]]:
    """``(KEYS, ARGV)`` of :data:`RELEASE`."""
    return [keys.channel, *keys.slots], [token, keep_ms]


def extend_call(
    keys: LockKeys, token: str, ttl_ms: int, reassert: bool = False
) -> tuple[list[str], list[Any]]:
    """``(KEYS, ARGV)`` of :data:`EXTEND`."""
    return list(keys.slots), [token, ttl_ms, "1" if reassert else "0"]


def release_attempt_call(
    keys: LockKeys, task_id: str, host: str, pid: int
) -> tuple[list[str], list[Any]]:
    """``(KEYS, ARGV)`` of :data:`RELEASE_ATTEMPT`."""
    return [keys.channel, *keys.slots], [task_id, host, str(pid)]


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
