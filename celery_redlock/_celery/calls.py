"""What one call carries in its message: per-call overrides, the bypass, its first attempt.

A locked call may carry one message header, ``redlock`` (:data:`HEADER`), a small JSON object:

* ``overrides``: options given to ``apply_async`` for this call only
  (``lock_on_contention``, ``lock_wait_timeout``, ``lock_ttl``, ``lock_retry_countdown``),
  stored without their ``lock_`` prefix;
* ``bypass``: ``true`` when ``apply_async(..., lock_bypass=True)`` asked to run this call
  without the lock;
* ``first``: the wall-clock time (epoch seconds) of the call's first attempt, set by the first
  requeue caused by the lock (:func:`celery_redlock._celery.engine.lock_retry`), so that
  ``lock_retry_for`` is measured from it, and ``retries``: the call's ``request.retries`` then
  (a requeue by the lock leaves it unchanged; the task's own retry adds one, and starts the
  budget anew: :func:`first_attempt`);
* ``redelivered``: ``true`` once a redelivered copy of the call was requeued for finding its
  key held. A requeue is a new message, without the broker's ``redelivered`` flag: without
  this, (1) copies A and C of a lost worker's calls find the dead A holding the key and are
  requeued; (2) C's comes back first and runs; (3) A's finds C's key, not its own task id, and
  under ``skip`` is skipped: A never runs.

Celery copies a message's custom headers into every retry it publishes (``self.retry()``,
``autoretry_for``) on 5.3 through 5.7, so the header lives as long as the call.

Where it is written:

* ``LockedTask.apply_async`` takes the ``lock_*`` keywords out of the options, validates them
  (a bad value raises :class:`~celery_redlock.LockConfigError` there) and sets the header;
* any other publish (``@single_instance``, whose task class is not ours, and
  ``app.send_task``) passes unknown keywords on as message properties. The app's router
  validates them first (:mod:`celery_redlock._celery.routing`): a bad value raises in
  ``apply_async``/``send_task`` and nothing is published. Then the ``before_task_publish``
  receiver moves them into the header (:func:`move_from_properties`).
* a publish that does not ask the app's router (a ``router=`` argument, an app never
  finalized in the caller) reaches only the receiver, which cannot make the publish fail
  (Celery's ``Signal.send`` logs what it raises): an invalid value is logged at ERROR in the
  caller and the worker fails the call with ``LockConfigError`` without running its body.

The worker validates the header again (:func:`call_spec`), whoever published it.

A message the running call publishes under its own task id is a retry or a requeue by the
lock, unless Celery marks it as the call's replacement (``self.replace()``): :func:`replaces`.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import math
from collections.abc import Mapping, MutableMapping
from typing import Any

from ..exceptions import LockConfigError
from .identity import Spec
from .options import BYPASS, OPTIONS, check_unknown

logger = logging.getLogger("celery_redlock.task")

#: The message header of a call's lock data.
HEADER = "redlock"

#: The task options one call may override.
OVERRIDABLE: tuple[str, ...] = ("on_contention", "wait_timeout", "ttl", "retry_countdown")


def _validated(owner: str, raw: Mapping[str, Any]) -> dict[str, Any]:
    """``raw`` (names without ``lock_``) validated like the task options; JSON-ready."""
    check_unknown(owner, list(raw), list(OVERRIDABLE), "per-call option (without lock_)")
    return {
        name: OPTIONS[name].check(owner, f"lock_{name}", value, None) for name, value in raw.items()
    }


def _bypass(owner: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise LockConfigError(
            f"{owner}: option {BYPASS}={value!r} is invalid; expected True or False"
        )
    return value


def take(owner: str, options: MutableMapping[str, Any]) -> dict[str, Any] | None:
    """Take the ``lock_*`` keywords out of ``options``; the header value, or ``None``.

    Raises :class:`~celery_redlock.LockConfigError` for an unknown name (with a "did you mean"
    hint), an option that cannot be overridden per call, or an invalid value.
    """
    names = [name for name in options if isinstance(name, str) and name.startswith("lock_")]
    if not names:
        return None
    raw = {name: options.pop(name) for name in names}
    bypass = _bypass(owner, raw.pop(BYPASS, False))
    for name in raw:
        if name[len("lock_") :] in OPTIONS and name[len("lock_") :] not in OVERRIDABLE:
            raise LockConfigError(
                f"{owner}: option {name} cannot be given per call; expected one of "
                f"{', '.join(f'lock_{n}' for n in OVERRIDABLE)} or {BYPASS}"
            )
    known = [f"lock_{n}" for n in OVERRIDABLE] + [BYPASS]
    for name in (n for n in raw if n not in known):
        # A typo of a task option (lock_byy) is not hinted as lock_bypass, which drops the lock.
        hint = difflib.get_close_matches(name, [f"lock_{n}" for n in OPTIONS] + [BYPASS], n=1)
        if hint and hint[0] not in known:
            raise LockConfigError(
                f"{owner}: unknown per-call option {name!r}; did you mean {hint[0]!r}? It "
                f"cannot be given per call; expected one of {', '.join(known)}"
            )
    check_unknown(owner, list(raw), known, "per-call option")
    header: dict[str, Any] = {}
    overrides = _validated(owner, {name[len("lock_") :]: value for name, value in raw.items()})
    if overrides:
        header["overrides"] = overrides
    if bypass:
        header["bypass"] = True
    return header or None


def put(options: MutableMapping[str, Any], value: Mapping[str, Any] | None) -> None:
    """Merge ``value`` into the ``headers`` option of an ``apply_async`` call."""
    if value:
        headers = dict(options.get("headers") or {})
        headers[HEADER] = {**(headers.get(HEADER) or {}), **value}
        options["headers"] = headers


def move_from_properties(
    sender: Any,
    headers: MutableMapping[str, Any],
    properties: MutableMapping[str, Any],
    *,
    unlocked: bool = False,
) -> None:
    """In ``before_task_publish``: move ``lock_*`` message properties into :data:`HEADER`.

    Never raises: an invalid value is logged at ERROR and travels as given, so the worker
    fails the call with :class:`~celery_redlock.LockConfigError`. For a task that takes no
    lock in this process (``unlocked``: its options already warned about as ignored) it is
    a WARNING, once per task and option: a worker where the task takes no lock runs the
    call, and one where it takes a lock (this process has a plain stub of it) fails it.
    Timeline of an ERROR there: a beat entry's ``"options": {"lock_ttl": "abc"}`` on a plain
    task said at every tick that the worker would fail the call, which the worker ran.
    """
    if not any(isinstance(n, str) and n.startswith("lock_") for n in properties):
        return
    owner = f"task {sender}"
    raw = {n: properties[n] for n in list(properties) if str(n).startswith("lock_")}
    try:
        value = take(owner, properties)
    except LockConfigError as exc:
        for name in raw:
            properties.pop(name, None)
        if not unlocked:
            logger.error(
                "%s[%s]: %s; the worker will fail this call", sender, headers.get("id"), exc
            )
        elif (str(sender), tuple(sorted(raw))) not in _told_invalid:
            _told_invalid.add((str(sender), tuple(sorted(raw))))
            logger.warning(
                "%s: %s; a worker where the task takes no lock ignores it, one where it takes "
                "a lock fails the call",
                sender,
                exc,
            )
        value = {"invalid": {name[len("lock_") :]: raw[name] for name in raw}}
    current = headers.get(HEADER)
    headers[HEADER] = {**(current if isinstance(current, Mapping) else {}), **(value or {})}


#: The (task, options) of unlocked tasks whose invalid per-call options were warned about.
_told_invalid: set[tuple[str, tuple[str, ...]]] = set()

#: The keys of :data:`HEADER` that this version reads (the module docstring).
KEYS = ("overrides", "bypass", "first", "retries", "redelivered", "invalid")

#: Where :func:`header_of` files a value that is no mapping, for :func:`call_spec` to refuse
#: (no JSON header can carry this key).
_MALFORMED = object()


def header_of(request: Any) -> Mapping[Any, Any]:
    """The :data:`HEADER` value of the message behind ``request`` (empty if none)."""
    value = (getattr(request, "headers", None) or {}).get(HEADER)
    if value is None:  # the usual call (spares the ABC check of a Mapping)
        return {}
    return value if isinstance(value, Mapping) else {_MALFORMED: value}


#: The (task, unknown header keys) already warned about in this process.
_told: set[tuple[str, tuple[str, ...]]] = set()


def _check_header(owner: str, header: Mapping[Any, Any]) -> None:
    """Refuse a header that no ``apply_async`` wrote: one written by hand
    (``headers={"redlock": ...}``) skips the caller's checks, and a bypass spelled ``"yes"``
    would else run the call locked, with nothing said. A key this version does not read is
    a WARNING, not a refusal: a later version may add one, and its callers' calls reach the
    workers not upgraded yet during a rolling upgrade."""
    why = None
    if _MALFORMED in header:
        why = f"is {type(header[_MALFORMED]).__name__}, expected a mapping"
    elif "bypass" in header and not isinstance(header["bypass"], bool):
        why = f"has bypass={header['bypass']!r:.40}, expected true or false"
    elif odd := [
        k for k in ("overrides", "invalid") if k in header and not isinstance(header[k], Mapping)
    ]:
        why = f"has {odd[0]} that are no mapping"
    if why is not None:
        raise LockConfigError(
            f"{owner}: the message's {HEADER!r} header {why}; it is written by apply_async's "
            "lock_* options (lock_bypass=True, lock_ttl=...), not by hand"
        )
    unknown = tuple(sorted(str(k)[:40] for k in header if k not in KEYS))
    if unknown and (owner, unknown) not in _told and len(_told) < 100:
        _told.add((owner, unknown))  # once per process: each requeue carries them again
        logger.warning(
            "%s: the message's %r header carries %s, which this version does not read; "
            "ignored (a newer version's caller, or written by hand)",
            owner,
            HEADER,
            ", ".join(map(repr, unknown)),
        )


def overrides_of(header: Mapping[str, Any]) -> dict[str, Any]:
    """The per-call overrides in a message's ``header`` (:func:`header_of`), as sent (not
    validated)."""
    overrides = header.get("overrides")
    return dict(overrides) if isinstance(overrides, Mapping) else {}


def call_spec(spec: Spec, header: Mapping[str, Any]) -> Spec:
    """``spec`` with the per-call overrides in ``header`` (:func:`header_of`) applied,
    validated again here.

    Raises :class:`~celery_redlock.LockConfigError` when the message carries an invalid
    override (one that ``before_task_publish`` could only log).
    """
    if not header:  # the usual call: no overrides
        return spec
    _check_header(spec.owner, header)
    invalid = header.get("invalid")
    if isinstance(invalid, Mapping):
        raw = {f"lock_{name}": value for name, value in invalid.items()}
        take(spec.owner, raw)  # raises the same error the caller logged
    overrides = overrides_of(header)
    if not overrides:
        return spec
    options = dataclasses.replace(spec.options, **_validated(spec.owner, overrides))
    return dataclasses.replace(spec, options=options)


def bypassed(header: Mapping[str, Any]) -> bool:
    """Whether a message's ``header`` (:func:`header_of`) asks to run without the lock."""
    return header.get("bypass") is True


def redelivered(header: Mapping[str, Any]) -> bool:
    """Whether a message's ``header`` (:func:`header_of`) is a requeue of a redelivered copy."""
    return header.get("redelivered") is True


def first_attempt(header: Mapping[str, Any], now: float, retries: int) -> float:
    """When the attempts of the call whose message carries ``header`` (:func:`header_of`)
    began to be requeued by the lock (epoch seconds); ``now`` on the first requeue, and on the
    first since the task's own retry (``retries``, the request's, differs from the header's).

    Celery copies the header into the task's own retries. Timeline without the count: (1) the
    call is requeued by the lock for 1.6 s, then runs; (2) its body calls
    ``self.retry(countdown=5)``; (3) the retry finds the key held and, with
    ``lock_retry_for=3``, fails at once, "requeued by the lock for 6.6s". A header of an
    earlier version, without ``retries``, is measured from its ``first``.

    Measured on each worker's wall clock: workers whose clocks disagree by D seconds end a
    call's lock retries up to D seconds early or late.
    """
    if "retries" in header and header["retries"] != retries:
        return now
    first = header.get("first")
    if isinstance(first, (int, float)) and not isinstance(first, bool) and math.isfinite(first):
        return float(first)
    return now


def replaces(request: Any, headers: Any, properties: Any) -> bool:
    """Whether a message published by the running ``request`` is (part of) its replacement
    (``Task.replace()``): the task, or a chain's or group's message, whose id is new.

    Celery marks a replacement with a ``replaced_task_nesting`` one above the running
    request's: in the headers from Celery 5.3.5; before, in the message's properties, while the
    running request always reads 0 (the mark never reached it). A retry, and a requeue by the
    lock, carry the running request's own. Celery before 5.3.5 leaves the mark off a chain
    built for a running task that is itself a link of a chain.
    """
    nesting = headers.get("replaced_task_nesting", (properties or {}).get("replaced_task_nesting"))
    return int(nesting or 0) > int(request.replaced_task_nesting or 0)
