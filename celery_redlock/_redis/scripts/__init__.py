"""The Lua scripts, each with its contract, by concern, and the one place their replies are
decoded.

* :mod:`.lock`: acquire (with fencing token), release, extend, the parent-side release;
* :mod:`.queue`: the queue of blocking waiters (wait, leave);
* :mod:`.companions`: the queued marker (``lock_enqueue``), the newest-call marker
  (``replace``, ``lock_debounce``), the rate window (``lock_rate``) and the timeline ring;
* :mod:`.base`: the :class:`Script` declaration (the commands each script runs) and its
  ``EVALSHA`` digest.

Keys always arrive through ``KEYS[]`` (built by :mod:`celery_redlock._redis.keys`); no script
builds a key name. Scripts run with ``EVALSHA``, loaded again after a ``NOSCRIPT`` reply (server
restart, ``SCRIPT FLUSH``): :func:`celery_redlock._redis.commands.run_script`. Every name is
importable from this package.
"""

from __future__ import annotations

from .base import Script, sha1
from .companions import (
    CHECK_NEWEST,
    CLEAR_MARKER,
    CLEAR_QUEUED,
    CONFIRM_NEWEST,
    CONFIRM_QUEUED,
    MARK_NEWEST,
    MARK_QUEUED,
    RATE,
    RING_PUSH,
    RateDecision,
    check_newest_call,
    decode_check_newest,
    decode_rate,
    mark_newest_call,
    queued_call,
    rate_call,
)
from .companions import SCRIPTS as COMPANION_SCRIPTS
from .lock import (
    ACQUIRE,
    EXTEND,
    EXTENDED_SHORTER,
    FENCE,
    PTTLS,
    RAISE_FENCE,
    RELEASE,
    RELEASE_ATTEMPT,
    RELEASE_UNRENEWED,
    RELEASED_LISTENED,
    RELEASED_NOT_NOTIFIED,
    AcquireResult,
    acquire_call,
    decode_acquire,
    extend_call,
    fence_call,
    raise_fence_call,
    release_attempt_call,
    release_call,
    release_unrenewed_call,
)
from .lock import SCRIPTS as LOCK_SCRIPTS
from .queue import (
    LEAVE,
    QUEUE_GRACE_MS,
    WAIT,
    WaitReply,
    decode_wait,
    leave_call,
    queue_member,
    wait_call,
)
from .queue import SCRIPTS as QUEUE_SCRIPTS

#: Every script, declared with the commands it runs.
SCRIPTS: tuple[Script, ...] = (*LOCK_SCRIPTS, *QUEUE_SCRIPTS, *COMPANION_SCRIPTS)

__all__ = [
    "ACQUIRE",
    "CHECK_NEWEST",
    "CLEAR_MARKER",
    "CLEAR_QUEUED",
    "COMPANION_SCRIPTS",
    "CONFIRM_NEWEST",
    "CONFIRM_QUEUED",
    "EXTEND",
    "EXTENDED_SHORTER",
    "FENCE",
    "LEAVE",
    "LOCK_SCRIPTS",
    "MARK_NEWEST",
    "MARK_QUEUED",
    "PTTLS",
    "QUEUE_GRACE_MS",
    "QUEUE_SCRIPTS",
    "RAISE_FENCE",
    "RATE",
    "RELEASE",
    "RELEASED_LISTENED",
    "RELEASED_NOT_NOTIFIED",
    "RELEASE_ATTEMPT",
    "RELEASE_UNRENEWED",
    "RING_PUSH",
    "SCRIPTS",
    "WAIT",
    "AcquireResult",
    "RateDecision",
    "Script",
    "WaitReply",
    "acquire_call",
    "check_newest_call",
    "decode_acquire",
    "decode_check_newest",
    "decode_rate",
    "decode_wait",
    "extend_call",
    "fence_call",
    "leave_call",
    "mark_newest_call",
    "queue_member",
    "queued_call",
    "raise_fence_call",
    "rate_call",
    "release_attempt_call",
    "release_call",
    "release_unrenewed_call",
    "sha1",
    "wait_call",
]
