"""A lock's companion keys, one typed call each: the queued marker, the newest-call marker, the
rate window and the per-call record.

The Celery layer decides *when* (at publish, at start, after the lock is taken); this module
sends the commands, through the scripts of :mod:`celery_redlock._redis.scripts.companions`.
``target`` is what :func:`~celery_redlock._redis.nodes.nodes_for` takes (a URL, a client, or a
quorum's list). Companions are advisory, so a quorum keeps the queued marker and the call record
on the first node that answers. The newest-call marker is kept on every node, and each of its
scripts needs a majority's answers: a call's number is the largest its nodes gave, and a call is
superseded when any node knows a newer one. Timeline on the first node that answers: (1) call A
is numbered and made the newest on node 0; (2) node 0 stalls for a second while B is published:
B is numbered by node 1's clock and made the newest there; (3) node 0 answers again, and the
workers read its marker: A runs, and with node 1's clock behind node 0's by more than the time
between the two calls, B is superseded by A: the newest edit is dropped.

A node that does not answer, or refuses (``NOPERM``, ``OOM``...), raises
:class:`~celery_redlock.LockUnavailable`; :func:`acl_refusal` tells an ACL refusal apart and
names the commands the script needs, so a caller can say "permission" instead of "unavailable".
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any, NamedTuple

import redis as redis_py

from ..exceptions import LockUnavailable
from . import scripts as _scripts
from .clients import client_for, redact, refused
from .core import denied_by_acl
from .keys import LockKeys, call_key
from .nodes import nodes_for
from .probe import FEATURES, key_refused, refused_command

logger = logging.getLogger("celery_redlock.task")

_BY_NAME = {script.name: script for script in _scripts.SCRIPTS}
#: The features of a worker's companions (:data:`~celery_redlock._redis.probe.FEATURES`).
_WORKER = ("enqueue", "newest", "rate", "timeline")


def _run(
    target: Any,
    source: str,
    call: tuple[list[str], list[Any]],
    key: str,
    timeout: float | None = None,
) -> Any:
    try:
        return nodes_for(target, timeout).run(source, call, key)
    except redis_py.exceptions.ResponseError as exc:  # a quorum node's refusal
        if not refused(exc):
            raise
        raise LockUnavailable(f"Redis refused {key}: {exc}", key=key) from exc


def _run_each(target: Any, source: str, call: tuple[list[str], list[Any]], key: str) -> list[Any]:
    """The replies of a majority of a quorum's nodes (one node: its one reply), as :func:`_run`
    raises."""
    try:
        return nodes_for(target).run_each(source, call, key)
    except redis_py.exceptions.ResponseError as exc:
        if not refused(exc):
            raise
        raise LockUnavailable(f"Redis refused {key}: {exc}", key=key) from exc


def acl_refusal(exc: BaseException, script: str) -> str | None:
    """When ``exc`` (raised by a function here) is an ACL refusal (``NOPERM``) of the script
    named ``script`` (``"mark_newest"``...): what to grant, for a message; else ``None``.

    A refusal of the script's call itself names its command (``EVALSHA``) or a key: that is
    what it names. Inside a script Redis 7.0 does not name the refused command (7.2 and newer
    do, but granting that one would leave the script's others refused), so this names the
    commands that the lock itself does not need: of the whole feature the script is part of,
    for a worker's feature (the guide's addition for it: granting one script's would leave its
    others refused), else of the script.
    """
    cause = exc.__cause__ if isinstance(exc, LockUnavailable) else exc
    text = str(cause)
    denied = isinstance(cause, redis_py.exceptions.NoPermissionError) or (
        isinstance(cause, redis_py.exceptions.ResponseError) and denied_by_acl(text)
    )
    if not denied:
        return None
    if key_refused(text):
        return f"access to its keys, a ~pattern covering the key prefix (for the {script} script)"
    named = None if "script" in text.lower() else refused_command(text)  # 7.2+ names it inside
    if named is not None:
        return f"+{named} (refused before the {script} script ran)"
    declared = _BY_NAME[script]
    base = set(FEATURES["lock"].commands)
    needs = next(
        (f.commands for f in FEATURES.values() if f.name in _WORKER and declared in f.scripts),
        declared.commands,
    )
    extra = [c for c in needs if c not in base]
    grant = " ".join(f"+{c.lower()}" for c in extra) or "the commands of the guide's ACL line"
    return f"{grant} (the {script} script runs {', '.join(declared.commands)})"


# -- the queued marker (lock_enqueue="keep") -----------------------------------------------------


class Queued(NamedTuple):
    """The call a queued marker names, as :func:`mark_queued` found it."""

    task_id: str
    #: It is still being published (:func:`confirm_queued` not yet run).
    publishing: bool


def mark_queued(
    target: Any, keys: LockKeys, task_id: str, ttl_ms: int, given_up: str = ""
) -> Queued | None:
    """Mark ``task_id`` as the queued call of ``keys``, being published, for ``ttl_ms``
    (:func:`confirm_queued` once it is); else the call already marked. ``given_up``: a call
    still being published that was waited for too long, whose marker is taken over."""
    script = _scripts.MARK_QUEUED
    call = _scripts.queued_call(keys, task_id, ttl_ms, given_up)
    reply = _run(target, script, call, keys.queued)
    if int(reply[0]) == 1:
        return None
    existing = reply[1]
    text = existing.decode() if isinstance(existing, bytes) else str(existing)
    return Queued(text, int(reply[2]) == 1)


def confirm_queued(target: Any, keys: LockKeys, task_id: str, ttl_ms: int) -> bool:
    """After its publish: ``task_id`` is queued, no longer being published, for ``ttl_ms``,
    unless the marker is no longer that call's (its execution already started and cleared
    it, or it expired)."""
    script = _scripts.CONFIRM_QUEUED
    reply = _run(target, script, _scripts.queued_call(keys, task_id, ttl_ms), keys.queued)
    return bool(reply)


def clear_queued(target: Any, keys: LockKeys, task_id: str, timeout: float | None = None) -> bool:
    """Clear the queued marker of ``keys`` if it is ``task_id``'s; whether it was.
    ``timeout`` sets the socket timeouts of clients built from URLs."""
    script = _scripts.CLEAR_QUEUED
    call = ([keys.queued, keys.publishing], [task_id])
    return bool(_run(target, script, call, keys.queued, timeout))


# -- the newest-call marker (lock_enqueue="replace", lock_debounce) ------------------------------


class Marked(NamedTuple):
    """What :func:`mark_newest` answered: the call's delay (its debounce) and its number."""

    delay_ms: int
    seq: int


def mark_newest(
    target: Any, keys: LockKeys, debounce_ms: int, debounce_max_ms: int, ttl_ms: int
) -> Marked:
    """Number a call about to be published and open (or extend) its debounce window.

    The call becomes the newest only with :func:`confirm_newest`, once published. On a quorum
    its number is the largest of the nodes' and its delay the shortest (the window's cap
    counts from the earliest first call any node saw).
    """
    call = _scripts.mark_newest_call(keys, debounce_ms, debounce_max_ms, ttl_ms)
    replies = _run_each(target, _scripts.MARK_NEWEST, call, keys.newest)
    return Marked(min(int(r[0]) for r in replies), max(int(r[1]) for r in replies))


def confirm_newest(target: Any, keys: LockKeys, task_id: str, seq: int) -> bool:
    """After its publish: make the call numbered ``seq`` the newest, unless a later one is
    (on a quorum: on the nodes where none is; whether one of them made it the newest)."""
    call = ([keys.newest], [task_id, seq])
    return any(_run_each(target, _scripts.CONFIRM_NEWEST, call, keys.newest))


def check_newest(target: Any, keys: LockKeys, task_id: str, seq: int, ttl_ms: int) -> str | None:
    """At start: the task id of the newer call that supersedes ``task_id``, or ``None`` (run;
    a debounce window it is the newest of closes; with no marker left, the call is marked the
    newest for ``ttl_ms``, so that older calls starting after it are superseded). On a
    quorum, a newer call that any node of the majority knows supersedes it."""
    call = _scripts.check_newest_call(keys, task_id, seq, ttl_ms)
    replies = _run_each(target, _scripts.CHECK_NEWEST, call, keys.newest)
    return next(filter(None, map(_scripts.decode_check_newest, replies)), None)


# -- the rate window (lock_rate) -----------------------------------------------------------------


def admit_rate(
    target: Any, keys: LockKeys, count: int, period: float, promise: bool = True
) -> _scripts.RateDecision:
    """Admit a start under ``count`` per ``period`` seconds, or say when to come back
    (``promise``: the slot is promised to this call, which will come back then)."""
    call = _scripts.rate_call(keys, count, period, promise)
    return _scripts.decode_rate(_run(target, _scripts.RATE, call, keys.rate))


# -- the per-call record (for `celery redlock inspect`) ------------------------------------------


def write_call_record(
    urls: Sequence[str], slot: str, token: str, task_id: str, overrides: dict[str, Any], ttl_ms: int
) -> str | None:
    """Store a holder's per-call overrides beside its slot (one ``SET PX``), on the first of
    ``urls`` that answers; that URL, or ``None``. Advisory: failures are logged at DEBUG."""
    key = call_key(slot)
    value = json.dumps({"token": token, "task_id": task_id, "overrides": overrides})
    for url in urls:
        try:
            client_for(url).set(key, value, px=max(1, ttl_ms))
        except Exception as error:
            logger.debug("could not write the overrides record %s: %s", key, redact(error))
            continue
        return url
    return None


def extend_call_record(url: str, slot: str, ttl_ms: int) -> None:
    """Extend the per-call record of ``slot`` with its lock (advisory: errors are logged)."""
    key = call_key(slot)
    try:
        client_for(url).pexpire(key, max(1, ttl_ms))
    except Exception as error:
        logger.debug("could not extend the overrides record %s: %s", key, redact(error))
