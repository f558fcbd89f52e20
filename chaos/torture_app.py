"""The Celery app that ``python -m chaos.torture`` runs in its ``celery worker`` subprocesses.

Configured from the environment, in the ``REDLOCK_TEST_*`` convention of :mod:`support.apps`
(set by :mod:`chaos.torture`; every server is private to the run):

============================  ================================================================
``REDLOCK_TEST_BROKER``       broker URL (a server that chaos never stops)
``REDLOCK_TEST_BACKEND``      result backend URL (same server, another database)
``REDLOCK_TEST_RECORDS``      the record server: where critical sections record themselves
``REDLOCK_TEST_URL``          lock server URL, or comma-separated URLs of 3 or 5 quorum nodes
``REDLOCK_TEST_LEASE``        ``redlock_lease`` in seconds (also the TTL of the flawed patterns)
``REDLOCK_TEST_TTL_MARGIN``   ``redlock_ttl_margin`` in seconds
``REDLOCK_TEST_VISIBILITY``   the Redis transport's ``visibility_timeout``: how long a message
                              of a SIGKILLed worker stays invisible before it is redelivered
``REDLOCK_TEST_CLOCK_SKEW``   seconds added to this worker's clock, seen by the GETSET pattern
                              only
``REDLOCK_TEST_WINDOW``       seconds of each kill window (see :func:`window`)
============================  ================================================================

Tasks, all with ``acks_late`` and ``task_reject_on_worker_lost`` (a task whose child is killed
is redelivered), each taking ``(key, duration, seq)``:

* ``torture.ours_retry``: ``LockedTask``, ``lock_on_contention="retry"``, unlimited retries;
* ``torture.ours_wait``: ``LockedTask``, ``lock_on_contention="wait"``; when the wait times
  out the call is retried, never dropped. Both share ``lock_name="ours"``: one lock per key.
* ``torture.flawed``: a plain task locking with one of the patterns of
  :mod:`chaos.flawed` (its first argument names it), polling for the lock, then retrying.

Every critical section records itself on the record server (:func:`enter`, :func:`leave`);
:mod:`chaos.torture` explains how those records are checked. Before and after its section a task
sleeps in a *kill window* that it announces on the record server (``window:<pid>``), so that
the chaos loop can aim SIGKILLs at the moments between two steps of a lock protocol.
"""

from __future__ import annotations

import json
import logging
import os
import random
import secrets
import time
from collections.abc import Callable
from typing import Any

import redis
from celery import Celery, signals

from celery_redlock import LockContended, LockedTask, current_lock
from chaos import flawed
from chaos.torture import message_id
from support.apps import env
from support.procfs import pid_alive, sigkill_pending, start_time


def _required(name: str) -> str:
    value = env(name)
    if value is None:
        raise RuntimeError(f"REDLOCK_TEST_{name} is not set: run python -m chaos.torture")
    return value


LOCK_URLS = _required("URL").split(",")
LEASE = float(env("LEASE") or 2)
WINDOW = float(env("WINDOW") or 0.03)
SKEW = float(env("CLOCK_SKEW") or 0)
#: Seconds between two acquisition attempts of a flawed pattern, and how long it polls.
POLL, POLL_FOR = 0.05, 2.0

app = Celery("torture", broker=_required("BROKER"), backend=_required("BACKEND"))
app.conf.update(
    redlock_url=LOCK_URLS[0] if len(LOCK_URLS) == 1 else LOCK_URLS,
    redlock_prefix="torture",
    redlock_lease=LEASE,
    redlock_ttl_margin=float(env("TTL_MARGIN") or 1.5),
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    broker_transport_options={
        "visibility_timeout": float(env("VISIBILITY") or 10),
        "unacked_restore_interval": 0.5,
        "unacked_restore_throttle": 1,
        # A worker SIGKILLed inside a restore sweep leaves this mutex behind (default 300 s).
        "unacked_mutex_expire": 5,
    },
    worker_hijack_root_logger=True,
)

records = redis.Redis.from_url(_required("RECORDS"), socket_timeout=10)
#: The flawed patterns lock on the first lock server (they know nothing of quorums).
flawed_locks = redis.Redis.from_url(LOCK_URLS[0], socket_timeout=5, socket_connect_timeout=2)

#: Per-task log lines (received, succeeded, contended) drown the log; keep WARNING and up.
_QUIET = ("celery.app.trace", "celery.worker.strategy", "celery_redlock.task")


@signals.after_setup_logger.connect(weak=False)
def _quiet(**_: Any) -> None:
    for name in _QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)


@signals.after_task_publish.connect(weak=False)
def _published(headers: Any = None, **_: Any) -> None:
    """A retry or requeue was published (from a pool child): hash ``published``,
    :func:`message_id` -> unix time."""
    if headers and headers.get("id"):
        message = message_id(headers["id"], headers.get("retries"), headers.get("eta"))
        records.hset("published", message, time.time())


@signals.task_received.connect(weak=False)
def _received(request: Any = None, **_: Any) -> None:
    """In the worker's main process, once kombu recorded the message as unacked (from then on
    a SIGKILLed worker's message is redelivered): ``received`` gets its :func:`message_id`."""
    if request is not None:
        body = request.request_dict
        records.sadd("received", message_id(request.id, body.get("retries"), body.get("eta")))


# -- records --------------------------------------------------------------------------------------

ENTER = """
-- KEYS[1] inside:<pattern>:<key> (hash: attempt -> its process), KEYS[2] the events stream
-- ARGV[1] attempt id, ARGV[2] its process (json), ARGV[3] verdicts (json: attempt -> verdict
--   on the processes of the attempts found inside just before), ARGV[4] pattern, ARGV[5] key,
--   ARGV[6] task id, ARGV[7] fencing token, ARGV[8] pid, ARGV[9] acquired at (unix seconds)
-- returns the number of overlapped attempts. An attempt still inside is an overlap when its
-- process was alive at the check, or was not checked (it entered after the read); one whose
-- process was dead is removed ("reaped").
local verdicts = cjson.decode(ARGV[3])
local members = redis.call('HGETALL', KEYS[1])
local overlaps, reaped = {}, {}
for i = 1, #members, 2 do
  local verdict = verdicts[members[i]]
  if verdict == nil or verdict == 'alive' then
    table.insert(overlaps, members[i] .. '=' .. (verdict or 'entered-after-check'))
  else
    redis.call('HDEL', KEYS[1], members[i])
    table.insert(reaped, members[i] .. '=' .. verdict)
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local t = redis.call('TIME')
redis.call('XADD', KEYS[2], '*', 'ev', 'enter', 'p', ARGV[4], 'key', ARGV[5], 'att', ARGV[1],
           'tid', ARGV[6], 'tok', ARGV[7], 'pid', ARGV[8], 'acq', ARGV[9],
           't', t[1] .. '.' .. string.format('%06d', t[2]),
           'ovl', table.concat(overlaps, ' '), 'reaped', table.concat(reaped, ' '))
return #overlaps
"""

EXIT = """
-- KEYS[1] inside:<pattern>:<key>, KEYS[2] the events stream
-- ARGV[1] attempt id, ARGV[2] pattern, ARGV[3] key, ARGV[4] task id, ARGV[5] fencing token,
-- ARGV[6] pid, ARGV[7] "1" if the holder's lock reported itself lost
-- Idempotent: records 'exit' once; an attempt that is not inside (reaped as dead while it was
-- in fact alive: a checker miss) is recorded as 'exit-orphan'. returns 1 exit, 0 orphan.
local t = redis.call('TIME')
local ev = 'exit-orphan'
if redis.call('HDEL', KEYS[1], ARGV[1]) == 1 then ev = 'exit' end
redis.call('XADD', KEYS[2], '*', 'ev', ev, 'p', ARGV[2], 'key', ARGV[3], 'att', ARGV[1],
           'tid', ARGV[4], 'tok', ARGV[5], 'pid', ARGV[6], 'lost', ARGV[7],
           't', t[1] .. '.' .. string.format('%06d', t[2]))
if ev == 'exit' then return 1 end
return 0
"""

_enter = records.register_script(ENTER)
_exit = records.register_script(EXIT)


_own: dict[int, str] = {}


def own_start() -> str:
    pid = os.getpid()
    if pid not in _own:
        _own[pid] = start_time(pid) or "?"
    return _own[pid]


def verdict(process: dict[str, Any]) -> str:
    """Whether the process of an attempt can still execute code: ``alive`` or ``dead:<why>``.

    A process with SIGKILL pending never returns to user space, so it counts as dead although
    ``/proc`` may still show it running for a moment (the hard time limit and
    ``revoke(terminate=True, signal="SIGKILL")`` release its lock right after sending SIGKILL).
    """
    pid = int(process["pid"])
    started = start_time(pid)
    if started is None:
        return "dead:gone"
    if started != process["start"]:
        return "dead:pid-reused"
    if not pid_alive(pid):
        return "dead:zombie"
    if sigkill_pending(pid):
        return "dead:sigkill-pending"
    return "alive"


def enter(pattern: str, key: str, task_id: str, token: int, acquired: float) -> str:
    """Record entry into the critical section of ``key``; return the attempt id.

    Runs while the lock is held: (1) read who is inside, (2) judge their processes, (3) one
    atomic script re-reads who is inside, reports overlaps and adds this attempt.
    """
    inside = f"inside:{pattern}:{key}"
    found = records.hgetall(inside)
    verdicts = {att.decode(): verdict(json.loads(proc)) for att, proc in found.items()}
    pid = os.getpid()
    att = f"{pid}.{own_start()}.{token}.{secrets.token_hex(3)}"
    process = json.dumps({"pid": pid, "start": own_start(), "tid": task_id})
    _enter(
        keys=[inside, "events"],
        args=[
            att,
            process,
            json.dumps(verdicts),
            pattern,
            key,
            task_id,
            token,
            pid,
            f"{acquired:.6f}",
        ],
    )
    return att


def leave(att: str, pattern: str, key: str, task_id: str, token: int, lost: bool) -> None:
    """Record the exit; retried if a SIGTERM (``SystemExit``) interrupts it, then re-raised.

    The exit must be on record before the lock is released (it is: this runs in the body's
    ``finally``, the release after the body), or the next holder would see this attempt inside
    while its process is alive.
    """
    interrupted: BaseException | None = None
    for _ in range(5):
        try:
            _exit(
                keys=[f"inside:{pattern}:{key}", "events"],
                args=[att, pattern, key, task_id, token, os.getpid(), int(lost)],
            )
            break
        except SystemExit as exc:
            interrupted = exc
    if interrupted is not None:
        raise interrupted


def window(name: str, seconds: float = WINDOW) -> None:
    """Sleep ``seconds`` in a kill window announced as ``window:<pid>`` = ``<name>|<start>``.

    Names starting with ``step:`` are windows between two steps of a lock protocol.
    """
    if seconds <= 0:
        return
    marker = f"window:{os.getpid()}"
    records.set(marker, f"{name}|{own_start()}", px=int(seconds * 1000) + 500)
    time.sleep(seconds)
    records.delete(marker)


def critical(
    pattern: str,
    key: str,
    task_id: str,
    token: int,
    acquired: float,
    duration: float,
    lost: Callable[[], bool],
) -> None:
    """The critical section: windows around a recorded sleep of ``duration`` seconds."""
    window("gen:after-acquire")
    att = enter(pattern, key, task_id, token, acquired)
    try:
        time.sleep(duration)
    finally:
        leave(att, pattern, key, task_id, token, lost())
    window("gen:before-release")


# -- our lock ----------------------------------------------------------------------------------


class WaitThenRetry(LockedTask):
    """``lock_on_contention="wait"``; a wait that times out becomes a retry, never a failure."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except LockContended as exc:  # the wait ran out; the body never started
            raise self.retry(countdown=random.uniform(0.1, 0.4), exc=exc) from None


def _ours(task: Any, key: str, duration: float) -> str:
    lock = current_lock()
    token = -1 if lock is None else int(lock.fencing_token or -1)  # -1: ran unlocked (a bug)
    critical(
        "ours",
        key,
        task.request.id,
        token,
        time.time(),
        duration,
        lambda: bool(lock is not None and lock.lost),
    )
    return key


@app.task(
    base=LockedTask,
    bind=True,
    name="torture.ours_retry",
    lock_name="ours",
    lock_by=["key"],
    lock_on_contention="retry",
    lock_retry_countdown=0.3,
    max_retries=None,
)
def ours_retry(self: Any, key: str, duration: float, seq: int) -> str:
    return _ours(self, key, duration)


@app.task(
    base=WaitThenRetry,
    bind=True,
    name="torture.ours_wait",
    lock_name="ours",
    lock_by=["key"],
    lock_on_contention="wait",
    lock_wait_timeout=3.0,
    max_retries=None,
)
def ours_wait(self: Any, key: str, duration: float, seq: int) -> str:
    return _ours(self, key, duration)


# -- the flawed patterns -----------------------------------------------------------------------


def _skewed_clock() -> float:
    return time.time() + SKEW


CONTEXT = flawed.Context(window=window, clock=_skewed_clock, ttl=LEASE)


@app.task(bind=True, name="torture.flawed", max_retries=15)
def flawed_task(self: Any, pattern: str, key: str, duration: float, seq: int) -> str:
    impl = flawed.PATTERNS[pattern]
    name = flawed.lock_key(pattern, key)
    token = secrets.token_hex(16)
    deadline = time.monotonic() + POLL_FOR
    while not impl.acquire(flawed_locks, name, token, CONTEXT):
        if time.monotonic() > deadline:
            raise self.retry(countdown=random.uniform(0.5, 1.0))
        time.sleep(POLL)
    acquired = time.time()
    fence = int(flawed_locks.incr(f"{name}:fence"))  # a naive fencing counter: a second command
    try:
        critical(pattern, key, self.request.id, fence, acquired, duration, lambda: False)
    finally:
        impl.release(flawed_locks, name, token, CONTEXT)
    return key
