"""The queue of blocking waiters: a waiter queues itself (WAIT) and gives up (LEAVE).

A release (:mod:`celery_redlock._redis.scripts.lock`) hands a freed lock to the first queued
waiter; these two scripts are the waiter's side of that queue.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..keys import LockKeys
from .base import Script
from .lock import _HAND_ON, _NUDGE, _text

WAIT = (
    _NUDGE
    + """
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
-- A waiter that takes the lock free wakes the waiter queued next (nudge): it slept on the
-- TTL of a holder whose lease ended.
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, #ARGV[5] + 1) == ARGV[5] .. '|' then
  redis.pcall('ZREM', KEYS[2], ARGV[3])
  return {1, held}
end
if not held then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  redis.pcall('ZREM', KEYS[2], ARGV[3])
  nudge(KEYS[2])
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
)

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
if redis.call('ZREM', KEYS[2], ARGV[1]) == 1 then
  nudge(KEYS[2])  -- the waiter next in line may have slept on an older holder's TTL
  return {1}
end
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, #ARGV[2] + 1) == ARGV[2] .. '|' then return {2, held} end
if not held then hand_on(KEYS[2], KEYS[1], ARGV[3] == '1') end
return {0}
"""
)


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


#: How long a waiter queue outlives its holder's expiry (see :data:`WAIT`), in ms.
QUEUE_GRACE_MS = 5000


def queue_member(channel: str, token: str, ttl_ms: int) -> str:
    """A waiter's member of the queue (see :data:`WAIT`): its ttl, channel and owner token.
    The channel's length is in bytes, as the scripts cut it (a lock name may be non-ASCII)."""
    return f"{ttl_ms}:{len(channel.encode())}:{channel}{token}"


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


#: What each script runs (:class:`~celery_redlock._redis.scripts.base.Script`).
SCRIPTS = (
    Script(
        "wait",
        WAIT,
        ("GET", "SET", "TIME", "ZADD", "PTTL", "PEXPIRE"),
        tolerated=("ZREM", "ZRANGE", "PUBLISH"),
    ),
    Script(
        "leave",
        LEAVE,
        ("ZREM", "GET", "SET", "TIME", "DEL"),
        tolerated=("EXISTS", "ZPOPMIN", "PUBLISH", "ZRANGE"),
    ),
)
