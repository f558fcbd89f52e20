"""The scripts of a lock's companion keys: the queued marker, the newest-call marker, the rate,
an operator's fingerprinted clean-up of any of them (``CLEAR_MARKER``), and the push to the
ring of recent lock events (``RING_PUSH``, :mod:`celery_redlock._redis.timeline`).

Their callers are the typed functions of :mod:`celery_redlock._redis.companions` (and, for
``CLEAR_MARKER``, :meth:`celery_redlock._redis.inventory.Inventory.clear_marker`); the keys
are those of :class:`~celery_redlock._redis.keys.LockKeys` (``queued``, ``newest``, ``rate``,
``rate_next``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..keys import LockKeys
from .base import Script

MARK_QUEUED = """
-- KEYS[1] queued marker key, KEYS[2] its publishing key
-- ARGV[1] task id, ARGV[2] ttl in ms while the call is being published,
-- ARGV[3] a task id given up on ('' none): the call whose publish was waited for too long (its
--         caller died while publishing, say); its marker is taken over if it still names that
--         call, still being published
-- Marks the call as queued, and as being published until CONFIRM_QUEUED (the publishing key
-- names it: the marker itself holds the bare task id, which every reader takes as it is).
-- returns {1} marked (nothing of this key was queued, or the call given up on), {0, task id,
--         1 if that call is still being published else 0} already marked
local queued = redis.call('GET', KEYS[1])
local publishing = queued and redis.call('GET', KEYS[2]) == queued
if not queued or (publishing and ARGV[3] ~= '' and queued == ARGV[3]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
  return {1}
end
if publishing then
  return {0, queued, 1}
end
return {0, queued, 0}
"""

CONFIRM_QUEUED = """
-- KEYS[1] queued marker key, KEYS[2] its publishing key
-- ARGV[1] task id, ARGV[2] ttl in ms
-- returns 1 confirmed (the call is published), 0 the marker is no longer this call's (its
--         execution started and cleared it, or it expired)
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

CLEAR_QUEUED = """
-- KEYS[1] queued marker key, KEYS[2] its publishing key
-- ARGV[1] task id
-- returns 1 cleared (the marker was this task's), 0 otherwise
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if redis.call('GET', KEYS[2]) == ARGV[1] then
    redis.call('DEL', KEYS[2])
  end
  return 1
end
return 0
"""

#: The newest-call marker's fields, shared by the three scripts below (a hash):
#: ``n`` the last number handed to a call being published, ``id``/``seq`` the newest call
#: known to be published (confirmed after its publish, or seen starting), ``first`` the server
#: time in ms of the first call of the open debounce window.
#:
#: A number is the server's time in microseconds, or the last number + 1 if that is later, so
#: numbers keep growing when the marker expires or is lost with a restart. Timeline they close:
#: (1) calls 1 to 5 wait in the broker; (2) the marker expires; (3) call 6 is published into a
#: new marker: were numbers counted from 1 in each marker, call 6 would be 1, call 5 would pass
#: for the newer one when it starts, and call 6, the newest, would end as superseded. What is
#: left: a server clock stepped back (or a failover to a server whose clock is behind) by more
#: than the time since the older calls were numbered, together with a lost marker.
MARK_NEWEST = """
-- KEYS[1] newest-call marker (fields n, id, seq, first: see the module)
-- ARGV[1] debounce in ms (0: none), ARGV[2] debounce_max in ms (0: none),
-- ARGV[3] ms the marker outlives the moment the call is due
-- returns {delay_ms, seq}: the delay until the call is due (the debounce, capped so that the
--         call is due at most debounce_max after the first call of the window; 0 without a
--         debounce), and the number of this call (its message carries it): the server time
--         in microseconds, or the last number + 1 if that is later (see the fields above)
-- Runs before the publish and does not make the call the newest: CONFIRM_NEWEST does, after
-- the publish succeeded (a failed publish leaves the queued calls as they were). A window
-- opens with a call that finds no 'first' field, or finds that the old window's cap passed
-- more than a debounce ago (its newest call never started: revoked, expired); it closes when
-- its newest call starts (CHECK_NEWEST deletes 'first'). The TTL is never shortened: an older
-- call due later keeps its marker.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local delay, cap = tonumber(ARGV[1]), tonumber(ARGV[2])
local first = tonumber(redis.call('HGET', KEYS[1], 'first') or now)
if cap > 0 and first + cap + delay <= now then first = now end
if delay > 0 and cap > 0 and first + cap - now < delay then
  delay = math.max(first + cap - now, 0)
end
local last = tonumber(redis.call('HGET', KEYS[1], 'n') or '0')
local seq = math.max(last + 1, tonumber(t[1]) * 1000000 + tonumber(t[2]))
redis.call('HSET', KEYS[1], 'n', string.format('%d', seq), 'first', string.format('%d', first))
local keep = delay + tonumber(ARGV[3])
if redis.call('PTTL', KEYS[1]) < keep then redis.call('PEXPIRE', KEYS[1], keep) end
return {delay, seq}
"""

CONFIRM_NEWEST = """
-- KEYS[1] newest-call marker (see MARK_NEWEST)
-- ARGV[1] task id of a call just published, ARGV[2] its number (from MARK_NEWEST)
-- returns 1 it is the newest call now, 0 a later one is (or the marker expired: nothing is
--         written, so no key without a TTL is created)
-- The last number is raised to the call's: on a quorum the call's number is the largest its
-- nodes gave (each counts from its own clock), and the next call must be numbered above it
-- on any majority, whatever their clocks say.
local last = redis.call('HGET', KEYS[1], 'n')
if not last then return 0 end
if tonumber(ARGV[2]) > tonumber(last) then redis.call('HSET', KEYS[1], 'n', ARGV[2]) end
if tonumber(ARGV[2]) > tonumber(redis.call('HGET', KEYS[1], 'seq') or '0') then
  redis.call('HSET', KEYS[1], 'id', ARGV[1], 'seq', ARGV[2])
  return 1
end
return 0
"""

CHECK_NEWEST = """
-- KEYS[1] newest-call marker (see MARK_NEWEST)
-- ARGV[1] task id of a call about to start, ARGV[2] its number ('0': a message stamped by a
--         version without numbers: only the id is compared), ARGV[3] the TTL in ms of a
--         marker this call writes (lock_enqueue_ttl)
-- returns {0}          no marker and no number: the call runs
--         {1}          the call is the newest: it runs, and its debounce window closes
--         {2, task_id} the call is superseded by that newer call
-- A call whose number is above the newest known was published (it arrived), even if its
-- CONFIRM_NEWEST has not run yet: it becomes the newest here. So does a numbered call that
-- finds no marker (expired, or lost by a restart without persistence): the older calls that
-- start after it are superseded, whatever order they arrive in (numbers follow the server's
-- clock across markers).
if not redis.call('HGET', KEYS[1], 'n') then
  if ARGV[2] == '0' then return {0} end
  redis.call('HSET', KEYS[1], 'n', ARGV[2], 'id', ARGV[1], 'seq', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {1}
end
local newest = redis.call('HGET', KEYS[1], 'id')
local mine = tonumber(ARGV[2])
if newest == ARGV[1] then
  redis.call('HDEL', KEYS[1], 'first')
  return {1}
end
if mine == 0 then
  if newest then return {2, newest} end
  return {0}
end
if newest and tonumber(redis.call('HGET', KEYS[1], 'seq') or '0') > mine then
  return {2, newest}
end
redis.call('HSET', KEYS[1], 'id', ARGV[1], 'seq', ARGV[2])
if mine > tonumber(redis.call('HGET', KEYS[1], 'n')) then
  redis.call('HSET', KEYS[1], 'n', ARGV[2])  -- a quorum node that missed the call's numbering
end
redis.call('HDEL', KEYS[1], 'first')
return {1}
"""

RATE = """
-- KEYS[1] start log (list: server times in microseconds of the last starts, oldest first),
-- KEYS[2] next promised slot (string: server time in microseconds)
-- ARGV[1] count N >= 1, ARGV[2] period P in microseconds, ARGV[3] P / N in microseconds,
-- ARGV[4] '1': promise a slot to a refused call, '0': only say when the window frees
-- returns {1, now_us}   admitted: a start at server time now_us, appended to the log
--         {0, wait_us}  refused: come back in wait_us (> 0), the slot promised to this call
-- Exact sliding window: a call is admitted at server time t only if the log holds fewer than
-- N starts in (t - P, t], i.e. its N-th newest entry is <= t - P; so no interval of length P
-- holds more than N admitted starts. The log keeps the N newest starts and expires P after
-- the newest. A refused call is promised max(next, free), where free is the time a start
-- leaves the window, and next moves P / N further, so a crowd of refused calls comes back
-- spread out, not at once. A promise is at most one period past free: promises of calls that
-- never came back (revoked) would otherwise push every later call further out.
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
if ARGV[4] ~= '1' then return {0, free - now} end
local slot = tonumber(redis.call('GET', KEYS[2]) or '0')
if slot < free then slot = free end
if slot > free + period then slot = free + period end
local later = slot + step
redis.call('SET', KEYS[2], string.format('%d', later), 'PX', math.ceil((later - now) / 1000))
return {0, slot - now}
"""


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


def rate_call(
    keys: LockKeys, count: int, period: float, promise: bool = True
) -> tuple[list[str], list[Any]]:
    """``(KEYS, ARGV)`` of :data:`RATE` for at most ``count`` starts per ``period`` seconds;
    ``promise``: a refused call is promised a slot (it will come back then)."""
    period_us = round(period * 1e6)
    return [keys.rate, keys.rate_next], [count, period_us, period_us // count, int(promise)]


def queued_call(
    keys: LockKeys, task_id: str, ttl_ms: int, given_up: str = ""
) -> tuple[list[str], list[Any]]:
    """``(KEYS, ARGV)`` of :data:`MARK_QUEUED` (``given_up``: see there) and of
    :data:`CONFIRM_QUEUED`."""
    return [keys.queued, keys.publishing], [task_id, ttl_ms, given_up]


def mark_newest_call(
    keys: LockKeys, debounce_ms: int, debounce_max_ms: int, ttl_ms: int
) -> tuple[list[str], list[Any]]:
    """``(KEYS, ARGV)`` of :data:`MARK_NEWEST`."""
    return [keys.newest], [debounce_ms, debounce_max_ms, ttl_ms]


def check_newest_call(
    keys: LockKeys, task_id: str, seq: int, ttl_ms: int
) -> tuple[list[str], list[Any]]:
    """``(KEYS, ARGV)`` of :data:`CHECK_NEWEST` (``seq`` 0: compare the id only; ``ttl_ms``:
    of the marker a numbered call writes when it finds none)."""
    return [keys.newest], [task_id, seq, ttl_ms]


def decode_check_newest(reply: Any) -> str | None:
    """Decode a reply of :data:`CHECK_NEWEST`: the superseding task id, or ``None`` (run)."""
    if int(reply[0]) != 2:
        return None
    newest = reply[1]
    return newest.decode("utf-8", "replace") if isinstance(newest, bytes) else str(newest)


CLEAR_MARKER = """
-- KEYS[1] a companion marker (queued marker, newest-call marker, rate window), KEYS[2] a key
--         deleted with it (the rate window's promised next slot; else KEYS[1] again)
-- ARGV[1] the marker's fingerprint as it was shown: the first 16 hex characters of the SHA1
--         of its DUMP (the inventory's Marker.fingerprint)
-- returns 1 deleted, 0 it changed (or is gone) since it was read: nothing deleted
-- For an operator's clean-up (the dashboard): the DUMP compares the whole value, whatever
-- its type, so a marker rewritten by a newer call is never deleted on a stale page.
local dumped = redis.call('DUMP', KEYS[1])
if not dumped then return 0 end
if string.sub(redis.sha1hex(dumped), 1, 16) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
return 1
"""

RING_PUSH = """
-- KEYS[1] the ring of recent lock events (redlock_timeline)
-- ARGV[1] the entry, ARGV[2] the ring's size (>= 1), ARGV[3] its TTL in ms
-- returns the ring's length (<= ARGV[2])
-- Cuts before it pushes: a user who may LPUSH but not LTRIM is refused before the ring grows
-- (a pipeline of LPUSH then LTRIM grew it without bound, its TTL renewed by every push).
local last = tonumber(ARGV[2]) - 2
if last < 0 then
  redis.call('LTRIM', KEYS[1], 1, 0)
else
  redis.call('LTRIM', KEYS[1], 0, last)
end
local length = redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return length
"""

#: What each script runs (:class:`~celery_redlock._redis.scripts.base.Script`).
SCRIPTS = (
    Script("mark_queued", MARK_QUEUED, ("SET", "GET")),
    Script("confirm_queued", CONFIRM_QUEUED, ("GET", "DEL", "PEXPIRE")),
    Script("clear_queued", CLEAR_QUEUED, ("GET", "DEL")),
    Script("mark_newest", MARK_NEWEST, ("TIME", "HGET", "HSET", "PTTL", "PEXPIRE")),
    Script("confirm_newest", CONFIRM_NEWEST, ("HGET", "HSET")),
    Script("check_newest", CHECK_NEWEST, ("HGET", "HSET", "PEXPIRE", "HDEL")),
    Script("rate", RATE, ("TIME", "LLEN", "LINDEX", "RPUSH", "LTRIM", "PEXPIRE", "GET", "SET")),
    Script("clear_marker", CLEAR_MARKER, ("DUMP", "DEL")),
    Script("ring_push", RING_PUSH, ("LPUSH", "LTRIM", "PEXPIRE")),
)
