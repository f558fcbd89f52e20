"""Owner tokens: the value stored in a lock key.

A token is ``<secret>|<pid>|<acquired_ms>|<host>|<task_id>``, with ``+<max_hold_ms>`` after
``acquired_ms`` in the third field for a lock capped by ``max_hold``, and then ``~<lease_ms>``
for a lock renewed while held (``auto_renew``):

* ``secret``: 32 hex characters from ``os.urandom`` (what :mod:`secrets` uses), fresh for
  every acquisition attempt, so a token cannot be guessed and two attempts of the same task id
  never share one. The bytes are drawn 4 KiB at a time and each 16 bytes handed out once
  (:func:`new_secret`): one system call per 256 tokens instead of one each. Hazard, as a
  timeline: (a) a process draws a block; (b) it forks; (c) parent and child would hand out
  the same rest of the block, two owners with one token. So a forked child starts with an
  empty block (``os.register_at_fork``), as it also reads its own pid again;
* ``pid`` and ``host``: the process that acquired (for a Celery task, the pool child and the
  worker's node name), so the worker's main process can release the lock of a child that died;
* ``acquired_ms``: wall-clock milliseconds, informational only (shown by tooling, never used to
  decide expiry: expiry is Redis' own ``PX`` TTL);
* ``max_hold_ms``: the lock's ``max_hold`` (a task's hard time limit plus
  ``redlock_ttl_margin``), so that tooling can tell a TTL cut short by that cap from a lease
  that was not renewed. Timeline without it: (1) a task with ``time_limit=4`` runs, its TTL
  capped at 9 s, renewed to what is left of the cap; (2) its worker gets SIGTERM (a deploy)
  and stops answering pings while the task finishes; (3) ``celery redlock release --dead``
  reads a 30 s lease renewed 21 s ago, calls the holder dead and releases: a second run of
  the key starts beside the first. A handoff keeps the field's ``+<max_hold_ms>``;
* ``lease_ms``: the lease a renewing holder renews its TTL to, so that tooling judges a
  renewal by the holder's own lease, not by the one it is configured with. Timeline without
  it: (1) workers renew under ``redlock_lease=10``, their TTLs between 6.7 and 10 s; (2) a
  deploy brings ``redlock_lease=60``; (3) an old worker in warm shutdown still runs its task
  and renews, but does not answer pings; (4) ``celery redlock release --dead``, run with the
  new 60 s, reads a TTL of 8 s as a lease not renewed for 52 s, calls the holder dead and
  releases: the next call of the key runs beside the task. The handoff keeps it too. A token
  without it is a fixed TTL's, or a renewing holder's of an earlier version: for those
  :mod:`celery_redlock.cli._liveness` asks the app whether the lock is renewed;
* ``task_id`` last, so that it may contain any character.

The host field escapes ``%`` as ``%25`` and ``|`` as ``%7C`` (:func:`normalize_host`), and
:func:`parse` gives the real name back: a worker named ``w|x@host`` is stored as ``w%7Cx@host``
and pinged as ``w|x@host``. (Replacing ``|`` by ``_`` lost the name, and ``celery redlock
release`` then pinged ``w_x@host``, heard nothing and called a live worker dead.)

The parent-side release script in :mod:`celery_redlock._redis.scripts` parses the same layout
and compares the host field as stored, escaped.

A release with a cooldown (``lock_cooldown``) keeps the slot with its token's first 8
characters replaced by :data:`COOLDOWN` (the release scripts do it): the other fields stay, so
a duplicate of the same task id is still found, but the value is no holder's token any more,
and tooling tells a finished task's cooldown from a running holder (:attr:`Owner.cooling`).
"""

from __future__ import annotations

import functools
import os
import re
import socket
import threading
import time
from dataclasses import dataclass

SEPARATOR = "|"
#: The largest pid a token may name (a 32-bit ``pid_t``).
MAX_PID = 2**31 - 1
#: The latest time a token may name: the last millisecond of year 9999, the last one
#: :mod:`datetime` can show.
MAX_MS = 253_402_300_799_999

#: What the first 8 characters of a token's secret become when its task ended and the slot is
#: kept for ``lock_cooldown`` (written by the release scripts: a secret is hex, never this).
COOLDOWN = "cooldown"


@dataclass(frozen=True)
class Owner:
    """A decoded owner token."""

    token: str
    pid: int
    acquired_ms: int
    host: str
    task_id: str
    #: The lock's ``max_hold`` in milliseconds (from acquisition), ``None`` when it has none.
    max_hold_ms: int | None = None
    #: The lease a renewing holder renews to, in milliseconds; ``None`` for a lock not renewed,
    #: or one taken by a version that did not record it.
    lease_ms: int | None = None

    @property
    def cooling(self) -> bool:
        """Whether the slot is kept for ``lock_cooldown`` after its task ended."""
        return self.token.startswith(COOLDOWN)


@functools.lru_cache(maxsize=1)
def _this_host() -> str:
    return socket.gethostname()


@functools.lru_cache(maxsize=256)
def normalize_host(host: str | None) -> str:
    """The host field as stored: the given name (or this machine's), ``%`` and ``|`` escaped."""
    return (host or _this_host()).replace("%", "%25").replace(SEPARATOR, "%7C")


_ESCAPED = re.compile("%(25|7C)")


def unescape_host(field: str) -> str:
    """The host name stored as ``field`` by :func:`normalize_host`."""
    return _ESCAPED.sub(lambda m: "%" if m.group(1) == "25" else SEPARATOR, field)


#: Bytes drawn from ``os.urandom`` at once for :func:`new_secret`.
ENTROPY_BLOCK = 4096

#: This process's id, set again in a forked child: read it as ``owner.process_id`` (an import
#: of the name would keep the parent's), or call :func:`current_pid`.
process_id = os.getpid()
_block = b""
_used = 0
_block_guard = threading.Lock()


def _forked() -> None:
    """In a forked child: its own pid, none of the parent's unused random bytes, and a guard
    of its own. Timeline this stops: (a) a thread of the parent takes the guard to draw a
    secret; (b) another thread forks; (c) the child's copy of the guard is held by a thread
    the child does not have, and its first acquisition would wait forever."""
    global process_id, _block, _used, _block_guard
    process_id = os.getpid()
    _block, _used = b"", 0
    _block_guard = threading.Lock()


os.register_at_fork(after_in_child=_forked)


def current_pid() -> int:
    """This process's id, without a system call (``os.getpid`` makes one each time)."""
    return process_id


def new_secret() -> str:
    """32 hex characters from ``os.urandom``, never handed out twice (see the module's
    docstring)."""
    global _block, _used
    with _block_guard:
        if _used + 16 > len(_block):
            _block, _used = os.urandom(ENTROPY_BLOCK), 0
        start = _used
        _used = start + 16
        return _block[start : start + 16].hex()


def new_token(
    task_id: str = "",
    host: str | None = None,
    pid: int | None = None,
    max_hold_ms: int = 0,
    lease_ms: int = 0,
) -> str:
    """Build a fresh, unguessable owner token for one acquisition attempt (``max_hold_ms``:
    the lock's cap, 0 for none; ``lease_ms``: the lease it is renewed to, 0 if not renewed)."""
    pid = process_id if pid is None else pid
    at: int | str = int(time.time() * 1000)
    if max_hold_ms:
        at = f"{at}+{max_hold_ms}"
    if lease_ms:
        at = f"{at}~{lease_ms}"
    # The fields joined by SEPARATOR, in one f-string (once per acquisition attempt).
    return f"{new_secret()}|{pid}|{at}|{normalize_host(host)}|{task_id}"


def parse(token: str | bytes | None) -> Owner | None:
    """Decode a stored token; ``None`` for a missing or foreign value."""
    if token is None:
        return None
    if isinstance(token, bytes):
        token = token.decode("utf-8", "replace")
    parts = token.split(SEPARATOR, 4)
    if len(parts) != 5:
        return None
    acquired, tilde, renewed = parts[2].partition("~")
    acquired, plus, cap = acquired.partition("+")
    pid, acquired_ms = _number(parts[1], MAX_PID), _number(acquired, MAX_MS)
    max_hold = _number(cap, MAX_MS) if plus else None
    lease = _number(renewed, MAX_MS) if tilde else None
    if pid is None or acquired_ms is None or (plus and max_hold is None) or (tilde and not lease):
        return None
    return Owner(token, pid, acquired_ms, unescape_host(parts[3]), parts[4], max_hold, lease)


def _number(field: str, most: int) -> int | None:
    """``field`` as a number of ASCII digits up to ``most``; ``None`` for anything else.

    ``str.isdigit()`` alone accepts ``"²"``, which ``int()`` refuses, and a time of year 10000
    parses but cannot be shown: a key another program wrote under the prefix would stop
    ``celery redlock ls`` and the dashboard for every lock, instead of being listed as foreign.
    """
    if not (field.isascii() and field.isdigit()) or len(field) > len(str(most)):
        return None
    value = int(field)
    return value if value <= most else None
