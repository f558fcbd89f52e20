"""The Lua scripts, each with its contract, and the one place their replies are decoded.

Every operation on a lock is one script, so each is a single round trip and atomic on the
server. Keys always arrive through ``KEYS[]`` (built by :mod:`celery_redlock._keys`); no script
builds a key name. Scripts run with ``EVALSHA``, loaded again after a ``NOSCRIPT`` reply (server
restart, ``SCRIPT FLUSH``): :func:`run`.

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

import functools
import hashlib
from dataclasses import dataclass
from typing import Any, NamedTuple

from redis.exceptions import NoScriptError

from .keys import FENCE_TTL_MS, LockKeys

ACQUIRE = """
-- KEYS[1] fencing counter key, KEYS[2] the high-water mark of tokens in the lock's Cluster
--         slot, KEYS[3..n] the lock's slot keys (one, or lock_limit of them)
-- ARGV[1] owner token, ARGV[2] ttl in ms (> 0), ARGV[3] fencing counter ttl in ms,
-- ARGV[4] '1': the server time in microseconds, else in whole seconds * 10^6,
-- ARGV[5] '1': write the counter, '0': only read it (a lock of one slot on one deployment)
-- returns {1, fencing_token, slot}     acquired the first free slot (1-based)
--         {0, holder_token, pttl_ms}   every slot held; the holder of the one freeing first
-- The fencing token is max(server time, counter + 1, high-water mark + 1), and the mark is
-- set to it (no TTL): tokens keep increasing after the counter expires, and across a step
-- back of the server clock (the mark is ahead of the clock until the clock catches up).
-- Whole seconds make independent nodes (quorum) usually agree on the token; microseconds
-- keep a single node's tokens above those read lazily by FENCE.
for i = 3, #KEYS do
  if redis.call('SET', KEYS[i], ARGV[1], 'NX', 'PX', ARGV[2]) then
    local now = redis.call('TIME')
    local token = tonumber(now[1]) * 1000000
    if ARGV[4] == '1' then token = token + tonumber(now[2]) end
    local last = math.max(tonumber(redis.call('GET', KEYS[1]) or '0'),
                          tonumber(redis.call('GET', KEYS[2]) or '0'))
    if last + 1 > token then token = last + 1 end
    local text = string.format('%d', token)
    if ARGV[5] == '1' then redis.call('SET', KEYS[1], text, 'PX', ARGV[3]) end
    redis.call('SET', KEYS[2], text)
    return {1, token, i - 2}
  end
end
local first, first_ttl = 3, redis.call('PTTL', KEYS[3])
for i = 4, #KEYS do
  local ttl = redis.call('PTTL', KEYS[i])
  if ttl < first_ttl then first, first_ttl = i, ttl end
end
return {0, redis.call('GET', KEYS[first]), first_ttl}
"""

#: Lua shared by the release scripts: hand a freed lock to the next queued waiter, or free it.
_HAND_ON = """
-- Pops waiters of the queue, earliest first, until one is still there (its channel has a
-- subscriber); waiters that are gone are dropped on the way. A queue member is
-- '<ttl ms>:<channel length>:<channel><owner token>' (see WAIT). With handoff (a single-slot
-- lock on a plain node), that waiter gets the lock: it is set to the waiter's token, with
-- the server time as acquisition time, for the waiter's ttl, and the token is published to
-- the waiter; the lock is never free in between. Without handoff the waiter is sent '1' and
-- tries itself. Returns 2 handed over, 1 woken, 0 nobody queued, -1 PUBLISH refused. A user
-- without EXISTS or ZPOPMIN (an ACL written before the queue) has no queue: 0.
local function hand_on(queue, lock, handoff)
  while true do
    local popped = redis.pcall('ZPOPMIN', queue)
    if type(popped) ~= 'table' or popped.err or #popped == 0 then return 0 end
    local ttl, n, rest = string.match(popped[1], '^(%d+):(%d+):(.*)$')
    if ttl then
      local channel = string.sub(rest, 1, tonumber(n))
      local secret, pid, tail = string.match(
        string.sub(rest, tonumber(n) + 1), '^([^|]*)|([^|]*)|[^|]*|(.*)$')
      local message = '1'
      if handoff and secret then
        local t = redis.call('TIME')
        local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        message = secret .. '|' .. pid .. '|' .. string.format('%d', now) .. '|' .. tail
      end
      local got = redis.pcall('PUBLISH', channel, message)
      if type(got) == 'table' then return -1 end
      if got > 0 then
        if message == '1' then return 1 end
        redis.call('SET', lock, message, 'PX', ttl)
        return 2
      end
    end
  end
end

-- Frees a slot its owner gives up: hands it to the first queued waiter, or deletes it and
-- notifies the release channel (quorum, semaphore and asyncio waiters) and the first queued
-- waiter. Returns 1 released, 2 deleted but PUBLISH was refused (waiters not notified).
-- The queue is looked at only if it exists (most releases have nobody queued, and EXISTS
-- costs less than a ZPOPMIN pcall answering an empty table).
local function free_slot(channel, queue, slot, handoff)
  local handed = 0
  if redis.pcall('EXISTS', queue) == 1 then handed = hand_on(queue, slot, handoff) end
  if handed == 2 then return 1 end
  redis.call('DEL', slot)
  local published = redis.pcall('PUBLISH', channel, '1')
  if type(published) == 'table' and published.err then return 2 end
  if handed == -1 then return 2 end
  return 1
end
"""

RELEASE = (
    _HAND_ON
    + """
-- KEYS[1] release channel, KEYS[2] waiter queue, KEYS[3..n] the lock's slot keys
-- ARGV[1] owner token, ARGV[2] keep in ms ('0': delete now; > 0: keep the slot that long),
-- ARGV[3] '1': hand a single-slot lock over to the first queued waiter (a plain node, where
--         PUBLISH counts every subscriber; not a Cluster, where it counts one node's)
-- returns 1 released (handed over, or deleted and the waiters notified, or kept until expiry),
--         2 released (deleted) but PUBLISH was refused: waiters were not notified,
--         0 not the owner of any slot (expired or taken over)
for i = 3, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    if ARGV[2] ~= '0' then
      redis.call('PEXPIRE', KEYS[i], ARGV[2])
      return 1
    end
    return free_slot(KEYS[1], KEYS[2], KEYS[i], ARGV[3] == '1' and #KEYS == 3)
  end
end
return 0
"""
)

WAIT = """
-- KEYS[1] the lock (a single slot), KEYS[2] its waiter queue (sorted set: member -> server ms
--         of the waiter's first registration)
-- ARGV[1] owner token for this try, ARGV[2] ttl in ms (> 0), ARGV[3] this waiter's queue
--         member, '<ttl ms>:<channel length>:<channel><owner token of the wait>' (the same
--         for the whole wait), ARGV[4] ms the queue outlives the holder's expiry,
-- ARGV[5] the secret of the wait's owner token (its first field)
-- returns {1, token}             held: handed over to this waiter since its last try (token:
--                                 what the release set), or taken now (token: ARGV[1]);
--                                 either way this waiter left the queue
--         {0, holder, pttl_ms}   held by holder; this waiter is queued, keeping its first
--                                 place, until a release pops it
-- A blocking waiter runs this once subscribed to its channel, so a release that pops it
-- always finds a subscriber. The queue outlives the holder's expiry by ARGV[4] ms, longer
-- than a waiter sleeps without trying again (it wakes at the holder's expiry at the latest),
-- so a live waiter's entry never expires; a dead waiter's entry is dropped by the release
-- that pops it (no subscriber), or expires.
-- Nothing is written before a command the user may lack (ZADD) could stop the script, and
-- the ZREMs after a write are pcalls: a script stopped half-way must not leave the lock set
-- to a token its waiter never learns.
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, #ARGV[5] + 1) == ARGV[5] .. '|' then
  redis.pcall('ZREM', KEYS[2], ARGV[3])
  return {1, held}
end
if not held then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  redis.pcall('ZREM', KEYS[2], ARGV[3])
  return {1, ARGV[1]}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[2], 'NX', now, ARGV[3])
local pttl = redis.call('PTTL', KEYS[1])
local keep = math.max(pttl, 0) + tonumber(ARGV[4])
if redis.call('PTTL', KEYS[2]) < keep then redis.call('PEXPIRE', KEYS[2], keep) end
return {0, held, pttl}
"""

LEAVE = (
    _HAND_ON
    + """
-- KEYS[1] the lock, KEYS[2] its waiter queue
-- ARGV[1] the queue member of a waiter that gives up (its deadline passed), ARGV[2] the
--         secret of its wait's owner token, ARGV[3] '1': handoff (as in RELEASE)
-- returns {1}         it left the queue
--         {2, token}  a release handed the lock to it meanwhile: it holds the lock
--         {0}         it was no longer queued: a release popped it and its notification may
--                     be unread, so when the lock is free the next waiter gets its turn
if redis.call('ZREM', KEYS[2], ARGV[1]) == 1 then return {1} end
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, #ARGV[2] + 1) == ARGV[2] .. '|' then return {2, held} end
if not held then hand_on(KEYS[2], KEYS[1], ARGV[3] == '1') end
return {0}
"""
)

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

RELEASE_ATTEMPT = (
    _HAND_ON
    + """
-- KEYS[1] release channel, KEYS[2] waiter queue, KEYS[3..n] the lock's slot keys
-- ARGV[1] task id, ARGV[2] host, ARGV[3] pid, ARGV[4] '1': handoff (as in RELEASE)
-- Releases the slot taken by that attempt: the token layout is
-- secret|pid|acquired_ms|host|task_id (see celery_redlock._redis.owner); host is compared as
-- stored, with '%' and '|' escaped (ARGV[2] comes from owner.normalize_host, escaped alike).
-- returns 1 released (handed over to the first queued waiter, or deleted),
--         2 deleted but PUBLISH was refused (waiters not notified),
--         0 no slot owned by that attempt
for i = 3, #KEYS do
  local value = redis.call('GET', KEYS[i])
  if value then
    local pid, host, task_id = string.match(value, '^[^|]*|([^|]*)|[^|]*|([^|]*)|(.*)$')
    if task_id == ARGV[1] and host == ARGV[2] and pid == ARGV[3] then
      return free_slot(KEYS[1], KEYS[2], KEYS[i], ARGV[4] == '1' and #KEYS == 3)
    end
  end
end
return 0
"""
)

PTTLS = """
-- KEYS[1..n] any keys (of one node; read only)
-- returns the PTTL of each, in order: one command for a page of keys instead of one each
local out = {}
for i = 1, #KEYS do out[i] = redis.call('PTTL', KEYS[i]) end
return out
"""


FENCE = """
-- KEYS[1] the held slot key, KEYS[2] fencing counter key (if any: the acquire script writes
--         one, FENCE never does), KEYS[3] the high-water mark of tokens in its Cluster slot
-- ARGV[1] owner token
-- returns the fencing token, max(server time in microseconds, counter + 1, mark + 1), and
--         sets the mark to it (no TTL), while ARGV[1] holds KEYS[1]; false when it does not
--         (expired or taken over)
-- Read on first use by a single-node lock, which acquired with a plain SET NX PX. Tokens of
-- one name strictly increase: the next holder's SET runs after this key is gone, so after
-- this script, and its own read finds the mark this script set. So a server clock stepping
-- backwards cannot make a token smaller than one handed out before in the same slot.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return false end
local now = redis.call('TIME')
local token = tonumber(now[1]) * 1000000 + tonumber(now[2])
local last = math.max(tonumber(redis.call('GET', KEYS[2]) or '0'),
                      tonumber(redis.call('GET', KEYS[3]) or '0'))
if last + 1 > token then token = last + 1 end
redis.call('SET', KEYS[3], string.format('%d', token))
return token
"""

RAISE_FENCE = """
-- KEYS[1] fencing counter key, KEYS[2] the high-water mark of its Cluster slot
-- ARGV[1] fencing token, ARGV[2] fencing counter ttl in ms
-- Raises the counter and the mark to the token where lower (quorum write-back). returns 1
if tonumber(ARGV[1]) > tonumber(redis.call('GET', KEYS[1]) or '0') then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
if tonumber(ARGV[1]) > tonumber(redis.call('GET', KEYS[2]) or '0') then
  redis.call('SET', KEYS[2], ARGV[1])
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

MARK_NEWEST = """
-- KEYS[1] newest-call marker (hash: id = the newest call's task id, first = server time in ms
--         of the first call of the open debounce window)
-- ARGV[1] task id, ARGV[2] debounce in ms (0: none), ARGV[3] debounce_max in ms (0: none),
-- ARGV[4] ms the marker outlives the moment the call is due
-- returns the delay in ms until the call is due: the debounce, capped so that the call is due
--         at most debounce_max after the first call of the window (0 without a debounce)
-- A window opens with a call that finds no 'first' field, and closes when its newest call
-- starts (CHECK_NEWEST deletes 'first').
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local first = tonumber(redis.call('HGET', KEYS[1], 'first') or now)
local delay, cap = tonumber(ARGV[2]), tonumber(ARGV[3])
if delay > 0 and cap > 0 and first + cap - now < delay then
  delay = math.max(first + cap - now, 0)
end
redis.call('HSET', KEYS[1], 'id', ARGV[1], 'first', string.format('%d', first))
redis.call('PEXPIRE', KEYS[1], delay + tonumber(ARGV[4]))
return delay
"""

CHECK_NEWEST = """
-- KEYS[1] newest-call marker (see MARK_NEWEST)
-- ARGV[1] task id of a call about to start
-- returns {0}          no marker (expired, or never written): the call runs
--         {1}          the call is the newest: it runs, and its debounce window closes
--         {2, task_id} the call is superseded by that newer call
local newest = redis.call('HGET', KEYS[1], 'id')
if not newest then return {0} end
if newest == ARGV[1] then
  redis.call('HDEL', KEYS[1], 'first')
  return {1}
end
return {2, newest}
"""


RATE = """
-- KEYS[1] start log (list: server times in microseconds of the last starts, oldest first),
-- KEYS[2] next promised slot (string: server time in microseconds)
-- ARGV[1] count N >= 1, ARGV[2] period P in microseconds, ARGV[3] P / N in microseconds
-- returns {1, now_us}   admitted: a start at server time now_us, appended to the log
--         {0, wait_us}  refused: come back in wait_us (> 0), the slot promised to this call
-- Exact sliding window: a call is admitted at server time t only if the log holds fewer than
-- N starts in (t - P, t], i.e. its N-th newest entry is <= t - P; so no interval of length P
-- holds more than N admitted starts. The log keeps the N newest starts and expires P after
-- the newest. A refused call is promised max(next, the time a start leaves the window) and
-- next moves P / N further, so a crowd of refused calls comes back spread out, not at once.
-- A server clock that steps backwards is clamped to the newest start (the log stays sorted).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local n, period, step = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local len = redis.call('LLEN', KEYS[1])
if len > 0 then
  local newest = tonumber(redis.call('LINDEX', KEYS[1], -1))
  if newest > now then now = newest end
end
local free = now
if len >= n then free = tonumber(redis.call('LINDEX', KEYS[1], len - n)) + period end
if free <= now then
  redis.call('RPUSH', KEYS[1], string.format('%d', now))
  redis.call('LTRIM', KEYS[1], -n, -1)
  redis.call('PEXPIRE', KEYS[1], math.ceil(period / 1000))
  return {1, now}
end
local slot = tonumber(redis.call('GET', KEYS[2]) or '0')
if slot < free then slot = free end
local later = slot + step
redis.call('SET', KEYS[2], string.format('%d', later), 'PX', math.ceil((later - now) / 1000))
return {0, slot - now}
"""


#: Reply of :data:`RELEASE` and :data:`RELEASE_ATTEMPT`: deleted, but ``PUBLISH`` was refused.
RELEASED_NOT_NOTIFIED = 2


class AcquireResult(NamedTuple):
    """Decoded reply of an acquisition: a plain tuple, what ``Lock.do_acquire`` returns."""

    acquired: bool
    fencing_token: int | None = None
    slot: int | None = None
    holder: str | None = None
    pttl_ms: int | None = None


class WaitReply(NamedTuple):
    """Decoded reply of :data:`WAIT` and :data:`LEAVE`."""

    #: The owner token this waiter holds the lock with now (``None``: it does not hold it).
    held: str | None
    #: Not held: the holder's token seen (``None`` if the lock just expired), and its PTTL.
    holder: str | None = None
    pttl_ms: int | None = None


def decode_wait(reply: Any) -> WaitReply:
    """Decode a reply of :data:`WAIT` or :data:`LEAVE`."""
    kind = int(reply[0])
    if kind == 0 and len(reply) == 3:
        return WaitReply(None, _text(reply[1]), int(reply[2]))
    if kind in (1, 2) and len(reply) == 2:
        return WaitReply(_text(reply[1]))
    return WaitReply(None)


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value or None


def decode_acquire(reply: Any) -> AcquireResult:
    """Decode a reply of :data:`ACQUIRE`."""
    if int(reply[0]) == 1:
        return AcquireResult(True, fencing_token=int(reply[1]), slot=int(reply[2]))
    holder = reply[1]
    if isinstance(holder, bytes):
        holder = holder.decode("utf-8", "replace")
    return AcquireResult(False, holder=holder or None, pttl_ms=int(reply[2]))


@dataclass(frozen=True)
class RateDecision:
    """Decoded reply of :data:`RATE`."""

    admitted: bool
    #: Admitted: the server time of the start, in microseconds.
    start_us: int | None = None
    #: Refused: seconds until the slot promised to the call.
    wait: float = 0.0


def decode_rate(reply: Any) -> RateDecision:
    """Decode a reply of :data:`RATE`."""
    if int(reply[0]) == 1:
        return RateDecision(True, start_us=int(reply[1]))
    return RateDecision(False, wait=int(reply[1]) / 1e6)


def rate_call(keys: LockKeys, count: int, period: float) -> tuple[list[str], list[Any]]:
    """``(KEYS, ARGV)`` of :data:`RATE` for at most ``count`` starts per ``period`` seconds."""
    period_us = round(period * 1e6)
    return [keys.rate, keys.rate_next], [count, period_us, period_us // count]


def acquire_call(
    keys: LockKeys, token: str, ttl_ms: int, single: bool = False
) -> tuple[list[str], list[Any]]:
    """``(KEYS, ARGV)`` of :data:`ACQUIRE`. ``single``: on one deployment (microseconds; and
    for a lock of one slot, no counter written), else on a quorum node."""
    counter = not single or len(keys.slots) > 1
    argv = [token, ttl_ms, FENCE_TTL_MS, "1" if single else "0", "1" if counter else "0"]
    return [keys.fence, keys.high_water, *keys.slots], argv


def fence_call(keys: LockKeys, slot: str, token: str) -> tuple[list[str], list[Any]]:
    """``(KEYS, ARGV)`` of :data:`FENCE` for the held ``slot``."""
    return [slot, keys.fence, keys.high_water], [token]


def release_call(
    keys: LockKeys, token: str, keep_ms: int = 0, handoff: bool = False
) -> tuple[list[str], list[Any]]:
    """``(KEYS, ARGV)`` of :data:`RELEASE`; ``handoff``: only for a plain node (see there)."""
    return [keys.channel, keys.waiters, *keys.slots], [token, keep_ms, "1" if handoff else "0"]


#: How long a waiter queue outlives its holder's expiry (see :data:`WAIT`), in ms.
QUEUE_GRACE_MS = 5000


def queue_member(channel: str, token: str, ttl_ms: int) -> str:
    """A waiter's member of the queue (see :data:`WAIT`): its ttl, channel and owner token."""
    return f"{ttl_ms}:{len(channel)}:{channel}{token}"


def wait_call(
    keys: LockKeys, token: str, ttl_ms: int, member: str, secret: str
) -> tuple[list[str], list[Any]]:
    """``(KEYS, ARGV)`` of :data:`WAIT` for the waiter queued as ``member``."""
    return [keys.lock, keys.waiters], [token, ttl_ms, member, QUEUE_GRACE_MS, secret]


def leave_call(
    keys: LockKeys, member: str, secret: str, handoff: bool
) -> tuple[list[str], list[Any]]:
    """``(KEYS, ARGV)`` of :data:`LEAVE` for the waiter queued as ``member``."""
    return [keys.lock, keys.waiters], [member, secret, "1" if handoff else "0"]


def extend_call(
    keys: LockKeys, token: str, ttl_ms: int, reassert: bool = False
) -> tuple[list[str], list[Any]]:
    """``(KEYS, ARGV)`` of :data:`EXTEND`."""
    return list(keys.slots), [token, ttl_ms, "1" if reassert else "0"]


def release_attempt_call(
    keys: LockKeys, task_id: str, host: str, pid: int, handoff: bool = False
) -> tuple[list[str], list[Any]]:
    """``(KEYS, ARGV)`` of :data:`RELEASE_ATTEMPT`."""
    argv = [task_id, host, str(pid), "1" if handoff else "0"]
    return [keys.channel, keys.waiters, *keys.slots], argv


def raise_fence_call(keys: LockKeys, token: int) -> tuple[list[str], list[Any]]:
    """``(KEYS, ARGV)`` of :data:`RAISE_FENCE`."""
    return [keys.fence, keys.high_water], [token, FENCE_TTL_MS]


def mark_newest_call(
    keys: LockKeys, task_id: str, debounce_ms: int, debounce_max_ms: int, ttl_ms: int
) -> tuple[list[str], list[Any]]:
    """``(KEYS, ARGV)`` of :data:`MARK_NEWEST`."""
    return [keys.newest], [task_id, debounce_ms, debounce_max_ms, ttl_ms]


def check_newest_call(keys: LockKeys, task_id: str) -> tuple[list[str], list[Any]]:
    """``(KEYS, ARGV)`` of :data:`CHECK_NEWEST`."""
    return [keys.newest], [task_id]


def decode_check_newest(reply: Any) -> str | None:
    """Decode a reply of :data:`CHECK_NEWEST`: the superseding task id, or ``None`` (run)."""
    if int(reply[0]) != 2:
        return None
    newest = reply[1]
    return newest.decode("utf-8", "replace") if isinstance(newest, bytes) else str(newest)


@functools.cache
def sha1(source: str) -> str:
    """The SHA1 under which Redis caches ``source`` (what ``EVALSHA`` takes); computed once
    per script."""
    return hashlib.sha1(source.encode()).hexdigest()


def run(client: Any, source: str, keys: list[str], args: list[Any]) -> Any:
    """Run ``source`` on ``client`` with ``EVALSHA``; after a ``NOSCRIPT`` reply (a server
    that restarted or ran ``SCRIPT FLUSH``), ``SCRIPT LOAD`` it and run it again (not ``EVAL``:
    an ACL user may have ``+evalsha +script|load`` only)."""
    sha = sha1(source)
    try:
        return client.execute_command("EVALSHA", sha, len(keys), *keys, *args)
    except NoScriptError:
        client.script_load(source)
        return client.execute_command("EVALSHA", sha, len(keys), *keys, *args)
