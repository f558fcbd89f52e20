"""The lock's scripts: acquire (with fencing token), release, extend, the parent-side release.

Every operation on a lock is one script, so each is a single round trip and atomic on the
server. None of the known broken patterns appear here: no ``SETNX`` followed by ``EXPIRE`` (a
crash in between leaves an immortal key), no client-clock timestamps compared with ``GETSET``,
no ``DEL`` without checking the owner, no ``GET`` then ``DEL`` as two commands (the key can
change owner in between).

A script stops at the first ``redis.call`` that fails, and what it wrote before stays written
(Redis has no rollback). So the notification after a delete is a ``redis.pcall``: an ACL user
without ``PUBLISH`` (Redis 7 refuses it inside the script too) gets "released, waiters not
notified" (reply 2) instead of an error reply for a release that did happen.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from ..keys import FENCE_TTL_MS, LockKeys
from .base import Script

ACQUIRE = """
-- KEYS[1] fencing counter key, KEYS[2] the high-water mark of tokens in the lock's Cluster
--         slot, KEYS[3..n] the lock's slot keys (one, or lock_limit of them)
-- ARGV[1] owner token, ARGV[2] ttl in ms (> 0), ARGV[3] fencing counter ttl in ms,
-- ARGV[4] '1': the server time in microseconds, else in whole seconds * 10^6 (microseconds
--         still where the slot has no mark: a node that restarted empty, see below),
-- ARGV[5] '1': write the counter, '0': only read it (a lock of one slot on one deployment)
-- ARGV[6] a task id that may hold one slot only ('' for none): a slot held by a token of
--         that task id refuses the attempt (a duplicate delivery of a running task)
-- returns {1, fencing_token, slot}     acquired the first free slot (1-based)
--         {0, holder_token, pttl_ms}   every slot held, the holder of the one freeing first;
--                                      or the slot of the same task id
-- The fencing token is max(server time, counter + 1, high-water mark + 1), and the mark is
-- set to it (no TTL): tokens keep increasing after the counter expires, and across a step
-- back of the server clock (the mark is ahead of the clock until the clock catches up).
-- Whole seconds make independent nodes (quorum) usually agree on the token; microseconds
-- keep a single node's tokens above those read lazily by FENCE. A quorum node with no mark
-- in the slot (it restarted empty, or the slot is new to it) counts in microseconds too.
-- Timeline with whole seconds there, in one second S, nodes A, B, C: (1) T0 is written on
-- all three; (2) with B down, three acquisitions on A and C hand out T0+1..T0+3; (3) B is
-- back, C restarts empty; (4) with A down, B answers T0+1 and C S * 10^6: the token is
-- T0+1, below T0+3. C's clock in microseconds is past every token of S handed out before.
if ARGV[6] ~= '' then
  for i = 3, #KEYS do
    local held = redis.call('GET', KEYS[i])
    if held and string.match(held, '^[^|]*|[^|]*|[^|]*|[^|]*|(.*)$') == ARGV[6] then
      return {0, held, redis.call('PTTL', KEYS[i])}
    end
  end
end
-- Read before the first write: a command refused (an ACL user without TIME) or failing here
-- leaves no key behind (a script is not rolled back), held by nobody until its TTL.
local now = redis.call('TIME')
-- A counter or mark that is not a number (text written by hand) counts as none.
local mark = tonumber(redis.call('GET', KEYS[2]))
local last = math.max(tonumber(redis.call('GET', KEYS[1])) or 0, mark or 0)
for i = 3, #KEYS do
  if redis.call('SET', KEYS[i], ARGV[1], 'NX', 'PX', ARGV[2]) then
    local token = tonumber(now[1]) * 1000000
    if ARGV[4] == '1' or not mark then token = token + tonumber(now[2]) end
    if last + 1 > token then token = last + 1 end
    if token > 2^53 then token = 2^53 end  -- see FENCE
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

#: Lua shared by the scripts after which the first queued waiter may sleep on a stale TTL (a
#: handoff, a waiter that takes the lock free, a waiter that leaves the queue): wake it, so
#: that it reads the new holder's TTL.
_NUDGE = """
-- Wakes the first live waiter of the queue ('1': try again); it keeps its place, as the queue
-- is only read (ZRANGE), and waiters that are gone (no subscriber) are dropped on the way. A
-- queued waiter sleeps until the TTL it read at its last try ends, so without this:
-- (1) H holds for 20 s, W1 and W2 are queued, both sleeping on H's TTL;
-- (2) H releases at 1 s and the lock is handed to W1 for its 2 s lease;
-- (3) W1 dies, or its process is stopped: its lease ends at 3 s and the key is free;
-- (4) W2 sleeps on until 20 s, while any non-blocking caller may take the key ahead of it.
-- A user without ZRANGE or PUBLISH wakes nobody (each is a pcall); without ZREM, a gone
-- waiter ends the wake.
local function nudge(queue)
  while true do
    local first = redis.pcall('ZRANGE', queue, 0, 0)
    if type(first) ~= 'table' or first.err or #first == 0 then return end
    local n, rest = string.match(first[1], '^%d+:(%d+):(.*)$')
    if n then
      local got = redis.pcall('PUBLISH', string.sub(rest, 1, tonumber(n)), '1')
      if type(got) == 'table' or got > 0 then return end
    end
    local removed = redis.pcall('ZREM', queue, first[1])
    if type(removed) == 'table' then return end
  end
end
"""

#: Lua shared by the release scripts: hand a freed lock to the next queued waiter, or free it.
_HAND_ON = (
    _NUDGE
    + """
-- Pops waiters of the queue, earliest first, until one is still there (its channel has a
-- subscriber); waiters that are gone are dropped on the way. A queue member is
-- '<ttl ms>:<channel length>:<channel><owner token>' (see WAIT). With handoff (a single-slot
-- lock on a plain node), that waiter gets the lock: it is set to the waiter's token, with
-- the server time as acquisition time (its '+<max_hold_ms>' and '~<lease_ms>' kept), for the
-- waiter's ttl, and the token is published to the waiter; the lock is never free in
-- between. Without handoff the waiter is sent '1' and
-- tries itself. A handoff also wakes the waiter queued next (nudge). Returns 2 handed over,
-- 1 woken, 0 nobody queued, -1 PUBLISH or ZPOPMIN refused (queued waiters not reached: an
-- ACL user of the command line without +zpopmin, say).
local function hand_on(queue, lock, handoff)
  while true do
    local popped = redis.pcall('ZPOPMIN', queue)
    if type(popped) == 'table' and popped.err then return -1 end
    if type(popped) ~= 'table' or #popped == 0 then return 0 end
    local ttl, n, rest = string.match(popped[1], '^(%d+):(%d+):(.*)$')
    if ttl then
      local channel = string.sub(rest, 1, tonumber(n))
      local secret, pid, cap, tail = string.match(
        string.sub(rest, tonumber(n) + 1), '^([^|]*)|([^|]*)|%d*([^|]*)|(.*)$')
      local message = '1'
      if handoff and secret then
        local t = redis.call('TIME')
        local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        message = secret .. '|' .. pid .. '|' .. string.format('%d', now) .. cap .. '|' .. tail
      end
      local got = redis.pcall('PUBLISH', channel, message)
      if type(got) == 'table' then return -1 end
      if got > 0 then
        if message == '1' then return 1 end
        redis.call('SET', lock, message, 'PX', ttl)
        nudge(queue)
        return 2
      end
    end
  end
end

-- Frees a slot its owner gives up: hands it to the first queued waiter, or deletes it and
-- notifies the release channel (quorum, semaphore and asyncio waiters) and the first queued
-- waiter. Returns 1 released, 2 deleted but PUBLISH was refused (waiters not notified).
-- kept: the owner keeps the slot until its TTL ends (a release with keep, which has just set
-- that TTL): nothing is handed over or deleted, but the same waiters are woken, so that they
-- read the new TTL and try when it ends, not when the old lease would have.
-- The queue is looked at only if it exists (most releases have nobody queued, and EXISTS
-- costs less than a ZPOPMIN pcall answering an empty table).
local function free_slot(channel, queue, slot, handoff, kept)
  local handed = 0
  if redis.pcall('EXISTS', queue) == 1 then
    handed = hand_on(queue, slot, handoff and not kept)
  end
  if handed == 2 then return 1 end
  if not kept then redis.call('DEL', slot) end
  local published = redis.pcall('PUBLISH', channel, '1')
  if type(published) == 'table' and published.err then return 2 end
  if handed == -1 then return 2 end
  return 1
end
"""
)

RELEASE = (
    _HAND_ON
    + """
-- KEYS[1] release channel, KEYS[2] waiter queue, KEYS[3..n] the lock's slot keys; on a
--         Cluster, the slot keys alone, with the channel and the queue after the other ARGV
--         (see _on_cluster)
-- ARGV[1] owner token, ARGV[2] keep in ms ('0': delete now; > 0: keep the slot that long, its
--         token's secret marked 'cooldown': the task ended; see celery_redlock._redis.owner),
-- ARGV[3] '1': hand a single-slot lock over to the first queued waiter (a plain node, where
--         PUBLISH counts every subscriber; not a Cluster, where it counts one node's),
-- ARGV[4] '1': wake nobody here (a quorum node: the waiters are woken by a PUBLISH once
--         every node answered; a waiter woken by the first node to free the lock could win
--         the others before the release reached the last, and hold it on a bare majority);
--         the reply then says whether anyone listens on the release channel here,
-- ARGV[5] release channel, ARGV[6] waiter queue: on a Cluster only (see _on_cluster)
-- returns 1 released (handed over, or deleted, or kept until expiry; the waiters notified;
--           with ARGV[4] '1': nobody listening here),
--         2 released (deleted or kept) but PUBLISH was refused: waiters not notified,
--         3 with ARGV[4] '1': released, someone listening here (or PUBSUB refused: someone
--           may be),
--         0 not the owner of any slot (expired or taken over)
-- A release with keep sent again (a client's retry after a lost reply) finds the slot it
-- marked and answers 1 again, as it did when keeping left the token in place.
local channel, queue, first = KEYS[1], KEYS[2], 3
if ARGV[5] then channel, queue, first = ARGV[5], ARGV[6], 1 end
local function released()
  local n = redis.pcall('PUBSUB', 'NUMSUB', channel)
  if n.err == nil and tonumber(n[2]) == 0 then return 1 end
  return 3
end
local cooling = 'cooldown' .. string.sub(ARGV[1], 9)
for i = first, #KEYS do
  local value = redis.call('GET', KEYS[i])
  if value == ARGV[1] or (ARGV[2] ~= '0' and value == cooling) then
    if ARGV[2] ~= '0' then
      redis.call('SET', KEYS[i], cooling, 'PX', ARGV[2])
      if ARGV[4] == '1' then return released() end
      return free_slot(channel, queue, KEYS[i], false, true)
    end
    if ARGV[4] == '1' then
      redis.call('DEL', KEYS[i])
      return released()
    end
    return free_slot(channel, queue, KEYS[i], ARGV[3] == '1' and #KEYS == first)
  end
end
return 0
"""
)

EXTEND = (
    _NUDGE
    + """
-- KEYS[1] release channel, KEYS[2] waiter queue, KEYS[3..n] the lock's slot keys; on a
--         Cluster, the slot keys alone, with the channel and the queue after the other ARGV
--         (see _on_cluster)
-- ARGV[1] owner token, ARGV[2] new ttl in ms (> 0),
-- ARGV[3] '1': re-assert the lock on this node if no slot exists (a quorum node that was down
--         at acquisition, or restarted empty), '0': never,
-- ARGV[4] '1': wake nobody here (a quorum node: the driver wakes every node once all answered),
-- ARGV[5] release channel, ARGV[6] waiter queue: on a Cluster only (see _on_cluster)
-- returns 1 extended, 3 extended to a shorter TTL (the waiters woken, unless ARGV[4]),
--         2 re-asserted (it was missing here), 0 not the owner (taken over, or missing
--         without re-assertion)
-- An extend that shortens the slot's TTL by more than SHORTER ms wakes the waiters (the
-- release channel's, and the first queued waiter), as a release that keeps the slot does, so
-- that they read the new TTL. A waiter sleeps until the TTL it read at its last try ends, so
-- without this: (1) H holds for 60 s, W is queued, sleeping on H's TTL; (2) H extends to 1 s,
-- then dies; (3) the key is free at 1 s, and W sleeps on to 60 s (or its timeout), while any
-- non-blocking caller may take the key ahead of it. A renewal wakes nobody: it asks for the
-- lease again, or, capped by max_hold, for the same end as the renewal before, which a faster
-- round trip makes a few ms shorter (within SHORTER: a waiter oversleeps by less than that).
local SHORTER = 250
local channel, queue, slot = KEYS[1], KEYS[2], 3
if ARGV[5] then channel, queue, slot = ARGV[5], ARGV[6], 1 end
local first = redis.call('GET', KEYS[slot])
for i = slot, #KEYS do
  local value = first
  if i > slot then value = redis.call('GET', KEYS[i]) end
  if value == ARGV[1] then
    local left = redis.call('PTTL', KEYS[i])
    redis.call('PEXPIRE', KEYS[i], ARGV[2])
    if left >= 0 and tonumber(ARGV[2]) + SHORTER >= left then return 1 end
    if ARGV[4] ~= '1' then
      redis.pcall('PUBLISH', channel, '1')
      if redis.pcall('EXISTS', queue) == 1 then nudge(queue) end
    end
    return 3
  end
end
if ARGV[3] == '1' and not first then
  redis.call('SET', KEYS[slot], ARGV[1], 'PX', ARGV[2])
  return 2
end
return 0
"""
)

RELEASE_ATTEMPT = (
    _HAND_ON
    + """
-- KEYS[1] release channel, KEYS[2] waiter queue, KEYS[3..n] the lock's slot keys; on a
--         Cluster, the slot keys alone, with the channel and the queue after the other ARGV
--         (see _on_cluster)
-- ARGV[1] task id, ARGV[2] host, ARGV[3] pid, ARGV[4] '1': handoff (as in RELEASE),
-- ARGV[5] keep in ms ('0': delete; > 0: the task's cooldown: the slot is kept that long,
--         marked as the child's own release with a cooldown leaves it),
-- ARGV[6] '1': wake nobody here (a quorum node, as in RELEASE),
-- ARGV[7] release channel, ARGV[8] waiter queue: on a Cluster only (see _on_cluster)
-- A slot already marked as a cooldown was released (by the child before it died, or by an
-- earlier call of this script): it is left as it is, and this returns 0.
-- Releases the slot taken by that attempt: the token layout is
-- secret|pid|acquired_ms|host|task_id (see celery_redlock._redis.owner); host is compared as
-- stored, with '%' and '|' escaped (ARGV[2] comes from owner.normalize_host, escaped alike).
-- returns 1 released (handed over to the first queued waiter, or deleted),
--         2 deleted but PUBLISH was refused (waiters not notified),
--         0 no slot owned by that attempt
local channel, queue, first = KEYS[1], KEYS[2], 3
if ARGV[7] then channel, queue, first = ARGV[7], ARGV[8], 1 end
for i = first, #KEYS do
  local value = redis.call('GET', KEYS[i])
  if value then
    local pid, host, task_id = string.match(value, '^[^|]*|([^|]*)|[^|]*|([^|]*)|(.*)$')
    if task_id == ARGV[1] and host == ARGV[2] and pid == ARGV[3] then
      if string.sub(value, 1, 8) == 'cooldown' then return 0 end
      if ARGV[5] ~= '0' then
        redis.call('SET', KEYS[i], 'cooldown' .. string.sub(value, 9), 'PX', ARGV[5])
        if ARGV[6] == '1' then return 1 end
        return free_slot(channel, queue, KEYS[i], false, true)
      end
      if ARGV[6] == '1' then
        redis.call('DEL', KEYS[i])
        return 1
      end
      return free_slot(channel, queue, KEYS[i], ARGV[4] == '1' and #KEYS == first)
    end
  end
end
return 0
"""
)

RELEASE_UNRENEWED = (
    _HAND_ON
    + """
-- KEYS[1] release channel, KEYS[2] waiter queue, KEYS[3] one slot key; on a Cluster, the
--         slot key alone, with the channel and the queue after the other ARGV (see _on_cluster)
-- ARGV[1] owner token read from it, ARGV[2] '': no check, else the most PTTL in ms the slot may
--         have left (what was read: more means its holder renewed it since, so it is alive),
-- ARGV[3] '1': hand a single-slot lock over to the first queued waiter (as in RELEASE),
-- ARGV[4] '1': wake nobody here (a quorum node, as in RELEASE),
-- ARGV[5] release channel, ARGV[6] waiter queue: on a Cluster only (see _on_cluster)
-- returns 1 released (as RELEASE), 2 deleted but PUBLISH was refused,
--         0 not held by ARGV[1] any more (expired or taken over), -1 kept: renewed since read
-- The release of `celery redlock release` (an operator's, not the holder's): the owner check
-- and the renewal check are one step with the delete, so a renewal that lands between the
-- operator's read and the delete keeps the lock.
local channel, queue, slot = KEYS[1], KEYS[2], KEYS[3]
if ARGV[5] then channel, queue, slot = ARGV[5], ARGV[6], KEYS[1] end
if redis.call('GET', slot) ~= ARGV[1] then return 0 end
if ARGV[2] ~= '' and redis.call('PTTL', slot) > tonumber(ARGV[2]) then return -1 end
if ARGV[4] == '1' then
  redis.call('DEL', slot)
  return 1
end
return free_slot(channel, queue, slot, ARGV[3] == '1')
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
local last = math.max(tonumber(redis.call('GET', KEYS[2])) or 0,  -- text counts as none
                      tonumber(redis.call('GET', KEYS[3])) or 0)
if last + 1 > token then token = last + 1 end
-- Lua numbers are exact to 2^53; past it (a server clock beyond the year 2255, a mark set by
-- hand) tokens stay at 2^53, equal. Past 2^63 string.format('%d') wrapped negative, and the
-- tokens after it went back to the clock's.
if token > 2^53 then token = 2^53 end
redis.call('SET', KEYS[3], string.format('%d', token))
return token
"""

RAISE_FENCE = """
-- KEYS[1] fencing counter key, KEYS[2] the high-water mark of its Cluster slot
-- ARGV[1] fencing token, ARGV[2] fencing counter ttl in ms
-- Raises the counter and the mark to the token where lower (quorum write-back). returns 1
if tonumber(ARGV[1]) > (tonumber(redis.call('GET', KEYS[1])) or 0) then  -- text: none
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
if tonumber(ARGV[1]) > (tonumber(redis.call('GET', KEYS[2])) or 0) then
  redis.call('SET', KEYS[2], ARGV[1])
end
return 1
"""

#: Reply of :data:`RELEASE` and :data:`RELEASE_ATTEMPT`: deleted, but ``PUBLISH`` was refused.
RELEASED_NOT_NOTIFIED = 2
#: Reply of :data:`RELEASE` that wakes nobody (a quorum node's): released, with someone
#: listening on the release channel there (to be woken once every node answered).
RELEASED_LISTENED = 3
#: Reply of :data:`EXTEND`: extended to a shorter TTL (the waiters are to read it again).
EXTENDED_SHORTER = 3


class AcquireResult(NamedTuple):
    """Decoded reply of an acquisition: a plain tuple, what ``Lock.do_acquire`` returns."""

    acquired: bool
    fencing_token: int | None = None
    slot: int | None = None
    holder: str | None = None
    pttl_ms: int | None = None
    #: Every node granted it; False when a quorum acquired without a node (down or late).
    complete: bool = True
    #: A quorum's failed attempt found its holder on every node that answered (core's
    #: ``_again_soon``: a next try that does not is seeing its release under way).
    whole: bool = False


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


def acquire_call(
    keys: LockKeys, token: str, ttl_ms: int, single: bool = False, sole: str = ""
) -> tuple[list[str], list[Any]]:
    """``(KEYS, ARGV)`` of :data:`ACQUIRE`. ``single``: on one deployment (microseconds; and
    for a lock of one slot, no counter written), else on a quorum node. ``sole``: a task id
    that may hold one slot of a semaphore only."""
    counter = not single or len(keys.slots) > 1
    argv = [token, ttl_ms, FENCE_TTL_MS, "1" if single else "0", "1" if counter else "0", sole]
    return [keys.fence, keys.high_water, *keys.slots], argv


def fence_call(keys: LockKeys, slot: str, token: str) -> tuple[list[str], list[Any]]:
    """``(KEYS, ARGV)`` of :data:`FENCE` for the held ``slot``."""
    return [slot, keys.fence, keys.high_water], [token]


def _on_cluster(
    keys: LockKeys, slots: Sequence[str], argv: list[Any]
) -> tuple[list[str], list[Any]]:
    """``(KEYS, ARGV)`` on a Redis Cluster of a script that frees or extends ``slots`` and may
    wake the waiters (:data:`RELEASE`, :data:`EXTEND`, :data:`RELEASE_ATTEMPT`,
    :data:`RELEASE_UNRENEWED`): the slot keys alone, and the release channel and the waiter
    queue at the end of ARGV, where the script reads them when ARGV has them. Elsewhere the
    channel and the queue come first in KEYS, and ARGV is left as it is.

    Declared elsewhere, because Dragonfly runs a script only on the keys it declares (a queue
    reached by name could not be handed over). Not on a Cluster, timeline: (1) a reshard marks
    the lock's slot MIGRATING and stops part-way; (2) the queue key does not exist, so Redis
    answers every command naming it TRYAGAIN ("multiple keys request during rehashing"); (3)
    every renewal fails, the lease ends, and a contender's ``SET`` takes the lock beside its
    running holder (and a release fails: the key stays until its lease ends). There the
    script touches the queue by ``pcall`` only: a queue that is not local fails that call
    alone.
    """
    return [*slots], [*argv, keys.channel, keys.waiters]


def release_call(
    keys: LockKeys,
    token: str,
    keep_ms: int = 0,
    handoff: bool = False,
    wake: bool = True,
    cluster: bool = False,
) -> tuple[list[str], list[Any]]:
    """``(KEYS, ARGV)`` of :data:`RELEASE`; ``handoff``: only for a plain node; ``wake``
    False: a quorum's (see there); ``cluster``: the client is a Redis Cluster's."""
    argv = [token, keep_ms, "1" if handoff else "0", "0" if wake else "1"]
    if cluster:
        return _on_cluster(keys, keys.slots, argv)
    return [keys.channel, keys.waiters, *keys.slots], argv


def extend_call(
    keys: LockKeys,
    token: str,
    ttl_ms: int,
    reassert: bool = False,
    wake: bool = True,
    cluster: bool = False,
) -> tuple[list[str], list[Any]]:
    """``(KEYS, ARGV)`` of :data:`EXTEND`; ``wake`` False: a quorum's (see there);
    ``cluster``: the client is a Redis Cluster's."""
    argv = [token, ttl_ms, "1" if reassert else "0", "0" if wake else "1"]
    if cluster:
        return _on_cluster(keys, keys.slots, argv)
    return [keys.channel, keys.waiters, *keys.slots], argv


def release_attempt_call(
    keys: LockKeys,
    task_id: str,
    host: str,
    pid: int,
    handoff: bool = False,
    keep_ms: int = 0,
    wake: bool = True,
    cluster: bool = False,
) -> tuple[list[str], list[Any]]:
    """``(KEYS, ARGV)`` of :data:`RELEASE_ATTEMPT`; ``wake`` False: a quorum's (see there);
    ``cluster``: the client is a Redis Cluster's."""
    argv = [task_id, host, str(pid), "1" if handoff else "0", str(keep_ms), "0" if wake else "1"]
    if cluster:
        return _on_cluster(keys, keys.slots, argv)
    return [keys.channel, keys.waiters, *keys.slots], argv


def release_unrenewed_call(
    keys: LockKeys,
    slot: str,
    token: str,
    max_pttl_ms: int | None,
    handoff: bool,
    wake: bool = True,
    cluster: bool = False,
) -> tuple[list[str], list[Any]]:
    """``(KEYS, ARGV)`` of :data:`RELEASE_UNRENEWED` (``max_pttl_ms=None``: no renewal check;
    ``wake`` False: a quorum's, see there; ``cluster``: the client is a Redis Cluster's)."""
    limit = "" if max_pttl_ms is None else str(max_pttl_ms)
    argv = [token, limit, "1" if handoff else "0", "0" if wake else "1"]
    if cluster:
        return _on_cluster(keys, [slot], argv)
    return [keys.channel, keys.waiters, slot], argv


def raise_fence_call(keys: LockKeys, token: int) -> tuple[list[str], list[Any]]:
    """``(KEYS, ARGV)`` of :data:`RAISE_FENCE`."""
    return [keys.fence, keys.high_water], [token, FENCE_TTL_MS]


#: What each script runs (:class:`~celery_redlock._redis.scripts.base.Script`).
SCRIPTS = (
    Script("acquire", ACQUIRE, ("SET", "TIME", "GET", "PTTL")),
    Script(
        "release",
        RELEASE,
        ("GET", "SET", "DEL", "TIME"),
        tolerated=("EXISTS", "ZPOPMIN", "PUBLISH", "ZRANGE", "ZREM", "PUBSUB"),
    ),
    Script(
        "extend",
        EXTEND,
        ("GET", "PTTL", "PEXPIRE", "SET"),
        tolerated=("PUBLISH", "EXISTS", "ZRANGE", "ZREM"),
    ),
    Script(
        "release_attempt",
        RELEASE_ATTEMPT,
        ("GET", "SET", "DEL", "TIME"),
        tolerated=("EXISTS", "ZPOPMIN", "PUBLISH", "ZRANGE", "ZREM"),
    ),
    Script("fence", FENCE, ("GET", "TIME", "SET")),
    Script("raise_fence", RAISE_FENCE, ("GET", "SET")),
    Script("pttls", PTTLS, ("PTTL",)),
    Script(
        "release_unrenewed",
        RELEASE_UNRENEWED,
        ("GET", "PTTL", "SET", "DEL", "TIME"),
        tolerated=("EXISTS", "ZPOPMIN", "PUBLISH", "ZRANGE", "ZREM"),
    ),
)
