"""OpenTelemetry spans of the lock operations of a task: optional, and never in the way.

With ``opentelemetry-api`` installed (``pip install celery-redlock[otel]``) and a tracer
provider set, a locked task records, in the current trace context:

* ``redlock.acquire`` (INTERNAL): taking the lock, from the first try to the decision, under
  the ``run/<task>`` span of ``opentelemetry-instrumentation-celery`` (or under whatever span
  is current in an eager ``apply()``);
* ``redlock.hold`` (INTERNAL): from the acquisition to the release, as a sibling of
  ``redlock.acquire``; a renewal that failed (``redlock.renewal_failed``) and the loss of the
  lock (``redlock.lost``) are events of this span;
* ``redlock.enqueue`` (INTERNAL): ``lock_enqueue=True`` setting the queued marker, in the
  caller of ``delay()``/``apply_async()``: a duplicate dropped there publishes no message and
  so gets no ``apply_async/<task>`` span, but it gets this one, with outcome ``skipped``.

Attributes, all in the ``redlock.*`` namespace (there are no semantic conventions for locks):
``redlock.mode`` (``run``, ``semaphore``, ``rate``, ``enqueue``), ``redlock.outcome``
(``acquired``, ``waited`` (acquired after a wait), ``skipped``, ``retried``, ``failed``,
``bypassed``, ``unavailable``, and on the hold span ``released``, ``lost``, ``unreleased``),
``redlock.reason`` (``superseded``, ``expired``, ``rate_limited``, a loss's reason),
``redlock.policy``, ``redlock.wait_time`` (seconds), ``redlock.attempts`` (the tries the lock
made: 1 without a wait, one more per try of a wait), ``redlock.fencing_token`` (only when one
was read for a ``lock_acquired`` receiver: reading it costs a round trip),
``redlock.key.prefix``, ``redlock.key.name`` (the ``lock_name``) and ``redlock.key.hash``
(the argument digest), and on a skipped enqueue ``redlock.queued_task_id`` (the call
``delay()`` returned instead). Argument values are never recorded: the key holds only their
digest, and an exception's stack trace is recorded without its chained causes (a ``lock_by``
callable's own error, the cause of its ``LockConfigError``, can quote a value).

The spans are fed by the engine's report points (:func:`record` is called by
:func:`~celery_redlock._celery.events.emit` for every lock event) and by three wrappers
(:func:`traced_acquire`, :func:`traced_release`, :func:`traced_enqueue`). Without
``opentelemetry-api`` (checked once, at import) each wrapper returns the function itself and
:func:`record` returns at once. With it but no tracer provider set, the acquire and enqueue
wrappers ask whether one is set and call through (no span object is built), the release
wrapper calls through while no hold span is open; once a provider is set, that is decided for
good (a process sets its global provider at most once). Every tracing call is guarded: an
error in a tracer, an exporter or this module is logged at DEBUG and the lock operation goes
on unchanged.

A loss is usually found by the renewal thread, where the task's trace context is not current:

1. at 0 s the task acquires; ``redlock.hold`` opens under ``run/<task>`` and is filed by
   (task id, key);
2. at 10 s the key is gone (deleted, evicted); the renewal thread marks the lock lost and the
   ``lost`` event reaches :func:`record` there, which finds the hold span by (task id, key);
3. the body returns; the release finds the lock lost, and the hold span ends, outcome ``lost``.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import os
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from celery import signals
from celery.exceptions import Retry, SoftTimeLimitExceeded

from .._redis.keys import keys_for

try:
    from opentelemetry import trace as _trace
except ImportError:  # the otel extra is not installed: every function here is a no-op
    _trace = None  # type: ignore[assignment]

__all__ = [
    "attempts",
    "enabled",
    "lock_name",
    "record",
    "renewal_failed",
    "traced_acquire",
    "traced_enqueue",
    "traced_release",
]

logger = logging.getLogger("celery_redlock.tracing")

F = TypeVar("F", bound=Callable[..., Any])

#: Engine events and the outcome they decide for the operation under way.
_OUTCOMES = {
    "acquired": "acquired",
    "skipped": "skipped",
    "superseded": "skipped",
    "expired": "skipped",
    "retried": "retried",
    "rate_limited": "retried",
    "failed": "failed",
    "bypassed": "bypassed",
    "unavailable": "unavailable",
}
#: Events whose name is also the ``redlock.reason`` of the outcome.
_REASONS = frozenset({"superseded", "expired", "rate_limited"})


def enabled() -> bool:
    """Whether ``opentelemetry-api`` is importable (spans still need a tracer provider)."""
    return _trace is not None


@dataclass
class _Operation:
    """One acquisition or enqueue under way: the span and what the engine reported."""

    span: Any
    outcome: str | None = None
    waited_at: float | None = None
    attributes: dict[str, Any] = field(default_factory=dict)


#: The operation under way in this thread or task (set by the wrappers, read by :func:`record`).
_current: contextvars.ContextVar[_Operation | None] = contextvars.ContextVar(
    "redlock_operation", default=None
)
#: Open hold spans by (task id, lock key): a loss or a failed renewal is reported from the
#: renewal thread, where the task's context is not current.
_holds: dict[tuple[str, str], Any] = {}


def _key_attributes(key: str) -> dict[str, str]:
    """``<prefix>:{<lock_name>:<digest>}[...]`` as its three parts (never argument values)."""
    start, end = key.find("{"), key.rfind("}")
    if start < 1 or end < start:
        return {"redlock.key.prefix": key}
    name, _, digest = key[start + 1 : end].rpartition(":")
    return {
        "redlock.key.prefix": key[: start - 1],
        "redlock.key.name": name,
        "redlock.key.hash": digest,
    }


#: The ``OTEL_PYTHON_TRACER_PROVIDER`` value found unloadable (see :func:`_unloadable`), or
#: ``None``.
_unloadable_name: str | None = None

#: Whether :func:`_active` may read the global provider (see there) instead of asking.
_GLOBAL_READABLE = False


def _read_environment(**_: Any) -> None:
    """Decide :data:`_GLOBAL_READABLE`: at import, and again when a worker starts and when each
    pool process starts, where a settings module imported after the tasks may have named a
    provider in the environment (``OTEL_PYTHON_TRACER_PROVIDER``) since. Outside a worker, a
    provider named there after this module's import is loaded by the first call of
    ``get_tracer_provider()`` (Celery's instrumentation makes one), or else not at all. A name
    found unloadable is not asked again: only a provider set in code can come."""
    global _GLOBAL_READABLE
    _GLOBAL_READABLE = (
        _trace is not None
        and getattr(_trace, "_TRACER_PROVIDER", False) is None
        and os.environ.get("OTEL_PYTHON_TRACER_PROVIDER", _unloadable_name) == _unloadable_name
    )


def _log_unloadable() -> None:
    logger.warning(
        "OTEL_PYTHON_TRACER_PROVIDER=%r names a tracer provider that cannot be loaded; "
        "celery-redlock records no spans until a provider is set in code "
        "(trace.set_tracer_provider); install the package that provides it, or unset the "
        "variable",
        _unloadable_name,
    )


def _unloadable(exc: Exception) -> None:
    """Log, once per name, that the provider the environment names cannot be loaded; spans
    wait for a provider set in code.

    ``OTEL_PYTHON_TRACER_PROVIDER`` names an entry point that ``get_tracer_provider()`` loads
    while no provider is set; a name no installed package provides (the SDK's
    ``sdk_tracer_provider`` without the SDK, a typo) raises ``StopIteration`` from that call,
    on each call. Without this, that raised from this module's import (the worker did not
    start: "Unable to load celery application"), or, named after the import, from every
    locked call's acquire, while plain tasks ran. A provider set in code later is what
    OpenTelemetry itself then uses: from here on :func:`_active` reads the global (it never
    asks the failing call again), and a worker logs this once more when it is ready
    (:func:`_worker_ready`)."""
    global _unloadable_name
    name = os.environ.get("OTEL_PYTHON_TRACER_PROVIDER")
    logger.debug("loading the tracer provider failed", exc_info=exc)
    if name != _unloadable_name:
        _unloadable_name = name
        _log_unloadable()
    _read_environment()


def _get_tracer() -> Any:
    """Our tracer: a proxy until a tracer provider is set, then the provider's (looked up
    once); ``None`` without ``opentelemetry-api``. When the environment's provider cannot be
    loaded (:func:`_unloadable`), a proxy of its own, which finds a provider set in code."""
    if _trace is None:
        return None
    try:
        return _trace.get_tracer("celery_redlock")
    except Exception as exc:
        _unloadable(exc)
        return _trace.ProxyTracerProvider().get_tracer("celery_redlock")


_read_environment()
_tracer = _get_tracer()

#: Whether spans can be recorded: ``None`` while no tracer provider is set (asked again on the
#: next operation), then decided for good: a global provider is set at most once per process.
_recording: bool | None = None if _tracer is not None else False


def _active() -> bool:
    """Whether a tracer provider that records spans is set: a cached answer once one is set;
    until then one look at the global ``opentelemetry.trace`` holds the provider in, once per
    acquisition or enqueue (about 20 ns). :func:`record` needs no check: without an operation
    under way (no span started) it returns at its first lookup.

    That global, ``_TRACER_PROVIDER`` (``None`` until a provider is set), is private; the
    public ``get_tracer_provider()`` costs 40 times as much without a provider (it looks for
    the ``OTEL_PYTHON_TRACER_PROVIDER`` environment variable through a ``KeyError``, about 9,000
    instructions, 2 % of what an execution's lock adds). ``test_tracing_global.py`` (unit and
    integration tiers) pins that the global holds the provider on the lowest and newest
    ``opentelemetry-api`` the matrix installs; if a release renames it, or the environment
    names a provider (``OTEL_PYTHON_TRACER_PROVIDER``, loaded by the public call) when this
    module is imported or a worker or pool process starts (:func:`_read_environment`), the
    public call is asked instead.

    The usual order in a worker: this module is imported at 0 s (no provider yet: no spans,
    and no span objects built), the provider is set at worker start, and the next operation
    sees it and records from then on.
    """
    global _recording
    if _recording is not None:
        return _recording
    if _GLOBAL_READABLE and _trace._TRACER_PROVIDER is None:
        return False  # none set yet
    try:
        provider = _trace.get_tracer_provider()
    except Exception as exc:  # named after this module's import, and not loadable
        _unloadable(exc)
        if not _GLOBAL_READABLE:  # nothing cheap to watch: off for good
            _recording = False
        return False
    if isinstance(provider, _trace.ProxyTracerProvider):
        return False  # none set yet
    _recording = not isinstance(provider, _trace.NoOpTracerProvider)
    return _recording


def _worker_ready(**_: Any) -> None:
    """Log the unloadable provider again when the worker's logging is set up: the first
    WARNING came at import, before it, and a detached worker's stderr goes nowhere."""
    if _unloadable_name is not None:
        _log_unloadable()


signals.worker_init.connect(_read_environment, weak=False)
signals.worker_process_init.connect(_read_environment, weak=False)
signals.worker_ready.connect(_worker_ready, weak=False)


def _start(name: str, attributes: Mapping[str, Any]) -> _Operation | None:
    try:
        span = _tracer.start_span(name, kind=_trace.SpanKind.INTERNAL, attributes=attributes)
        return _Operation(span) if span.is_recording() else None
    except SoftTimeLimitExceeded:  # the task's limit (see events)
        raise
    except Exception:
        logger.debug("starting span %s failed", name, exc_info=True)
        return None


def _finish(
    op: _Operation, outcome: str, error: BaseException | None = None, *, before_body: bool = False
) -> None:
    """End ``op``'s span with ``outcome``. A soft time limit landing here goes on to the task
    only ``before_body`` (the call took its lock and is about to run); on every other path the
    call's outcome is decided (an exception on its way, an ``Ignore``, a publish done), and
    raising it there turned a published retry into a FAILURE: under ``until_executed`` its
    marker was then cleared, and a call published meanwhile ran beside the retry."""
    try:
        attributes = {"redlock.outcome": op.outcome or outcome, **op.attributes}
        if op.waited_at is not None:
            attributes["redlock.wait_time"] = time.monotonic() - op.waited_at
            if attributes["redlock.outcome"] == "acquired":
                attributes["redlock.outcome"] = "waited"
        op.span.set_attributes(attributes)
        if isinstance(error, Retry) and isinstance(error.exc, BaseException):
            error = error.exc  # retried for an outage: what happened is the outage
        if error is not None and attributes["redlock.outcome"] not in ("retried", "skipped"):
            # Without the chained causes: a lock_by callable's own error (the cause of its
            # LockConfigError) can quote an argument's value.
            stack = traceback.format_exception(type(error), error, error.__traceback__, chain=False)
            op.span.record_exception(error, attributes={"exception.stacktrace": "".join(stack)})
            op.span.set_status(_trace.Status(_trace.StatusCode.ERROR, type(error).__name__))
        op.span.end()
    except SoftTimeLimitExceeded:
        if before_body:  # the task's limit (see events)
            raise
        logger.debug("ending a lock span was interrupted by a soft time limit", exc_info=True)
    except Exception:
        logger.debug("ending a lock span failed", exc_info=True)


def lock_name(prefix: str, name: str) -> None:
    """Record on the operation under way the key parts of lock ``name`` (from the start, so
    that an outcome without a lock event, such as superseded, unavailable or an enqueue,
    carries them too)."""
    if _trace is None:
        return
    op = _current.get()
    if op is not None:
        op.attributes.update(_key_attributes(keys_for(prefix, name).lock))


def attempts(count: int) -> None:
    """Record on the acquisition under way how many tries its lock made (``redlock.attempts``)."""
    if _trace is None:
        return
    op = _current.get()
    if op is not None:
        op.attributes["redlock.attempts"] = count


def record(task_id: str | None, event: str, fields: Mapping[str, Any]) -> None:
    """Add the engine's lock ``event`` (with the fields of its signal) to the right span."""
    if _trace is None:
        return
    try:
        op = _current.get()
        if event == "lost":
            span = _holds.get((task_id or "", fields.get("key", "")))
            if span is not None:
                reason = str(fields.get("reason", ""))
                span.add_event("redlock.lost", {"redlock.reason": reason})
                span.set_attributes({"redlock.outcome": "lost", "redlock.reason": reason})
            return
        if op is None:
            return
        if event == "waited":
            op.waited_at = time.monotonic()
        elif event in _OUTCOMES:
            op.outcome = _OUTCOMES[event]
            if event in _REASONS:
                op.attributes["redlock.reason"] = event
        if fields.get("key"):
            op.attributes.update(_key_attributes(fields["key"]))
        if fields.get("policy"):
            op.attributes["redlock.policy"] = fields["policy"]
        if fields.get("fencing_token") is not None:
            op.attributes["redlock.fencing_token"] = int(fields["fencing_token"])
    except SoftTimeLimitExceeded:  # the task's limit (see events)
        raise
    except Exception:
        logger.debug("recording lock event %r in a span failed", event, exc_info=True)


def renewal_failed(task_id: str, key: str, error: BaseException) -> None:
    """Add a failed renewal of the lock ``key`` held by ``task_id`` to its hold span."""
    if _trace is None:
        return
    try:
        span = _holds.get((task_id, key))
        if span is not None:
            span.add_event(
                "redlock.renewal_failed",
                {"exception.type": type(error).__name__, "exception.message": str(error)},
            )
    except Exception:
        logger.debug("recording a failed renewal in a span failed", exc_info=True)


def _mode(spec: Any) -> str:
    options = spec.options
    if getattr(options, "rate", None) is not None:
        return "rate"
    limit = getattr(options, "limit", 1)
    return "semaphore" if isinstance(limit, int) and limit > 1 else "run"


def _open_hold(attributes: Mapping[str, Any], request: Any) -> None:
    """Start the hold span of an acquired lock, beside (not under) its acquire span."""
    key = _request_key(request)
    if key is None:
        return
    hold = _start("redlock.hold", attributes)
    if hold is not None:
        _holds[(request.id or "", key)] = hold.span


def _request_key(request: Any) -> str | None:
    """The key of the lock the attempt behind ``request`` holds, if it holds one."""
    execution = getattr(request, "redlock_execution", None)
    lock = getattr(execution, "lock", None)
    return None if lock is None else str(lock.key)


def _ended_by(exc: BaseException) -> str:
    """The outcome of an acquire that ``exc`` ended: ``interrupted`` for a soft time limit, a
    revoke (``SystemExit`` in the pool child) or a shutdown, which are not lock contention.

    Timeline of the false alarm this prevents: (1) a call waits for the lock (``wait``); (2) its
    soft time limit or ``revoke(terminate=True)`` ends the wait; (3) its span said ``failed``,
    the outcome of a contended call refused by the ``fail`` policy, while the counters added
    nothing (they count a wait's interruption as no failure): an alert on ``failed`` spans
    counted time limits and revokes as contention."""
    if isinstance(exc, SoftTimeLimitExceeded) or not isinstance(exc, Exception):
        return "interrupted"
    return "retried" if type(exc).__name__ == "Retry" else "failed"


def traced_acquire(enter: F) -> F:
    """Wrap the engine's ``enter(task, request, spec, args, kwargs)`` in ``redlock.acquire``
    (with that signature, not ``*args``: packing them costs on every execution)."""
    if _trace is None:
        return enter

    @functools.wraps(enter)
    def wrapper(task: Any, request: Any, spec: Any, args: Any, kwargs: Any) -> Any:
        if not (_recording or _active()):
            return enter(task, request, spec, args, kwargs)
        try:
            mode = _mode(spec)
        except SoftTimeLimitExceeded:  # the task's limit (see events)
            raise
        except Exception:
            logger.debug("reading the lock mode for a span failed", exc_info=True)
            return enter(task, request, spec, args, kwargs)
        op = _start("redlock.acquire", {"redlock.mode": mode})
        if op is None:
            return enter(task, request, spec, args, kwargs)
        token = _current.set(op)
        try:
            entered = enter(task, request, spec, args, kwargs)
        except BaseException as exc:
            if type(exc).__name__ == "Ignore":  # a redelivered copy of a call that ended
                _finish(op, "skipped")
            else:
                _finish(op, _ended_by(exc), exc)
            raise
        finally:
            _current.reset(token)
        _finish(op, "acquired" if entered else "skipped", before_body=bool(entered))
        if entered and op.outcome in (None, "acquired"):
            try:
                _open_hold({**op.attributes, "redlock.mode": mode}, request)
            except SoftTimeLimitExceeded:  # the task's limit (see events)
                raise
            except Exception:
                logger.debug("starting the hold span failed", exc_info=True)
        return entered

    return wrapper  # type: ignore[return-value]


def traced_release(release: F) -> F:
    """Wrap the engine's ``_release(task, request, lock, keep)``: it ends the hold span."""
    if _trace is None:
        return release

    @functools.wraps(release)
    def wrapper(task: Any, request: Any, lock: Any, keep: float = 0) -> Any:
        if not _holds:  # no hold span open anywhere (the usual case without a provider)
            return release(task, request, lock, keep)
        key = (request.id or "", str(lock.key))
        try:  # the span stays findable while releasing: a loss found there is its event
            released = release(task, request, lock, keep)
        finally:
            span = _holds.pop(key, None)
        if span is not None:
            try:
                if released:
                    span.set_attribute("redlock.outcome", "released")
                elif not lock.lost:
                    span.set_attribute("redlock.outcome", "unreleased")
                span.end()
            except Exception:
                logger.debug("ending the hold span failed", exc_info=True)
        return released

    return wrapper  # type: ignore[return-value]


def traced_enqueue(mark_queued: F) -> F:
    """Wrap the engine's ``mark_queued(task, args, kwargs, task_id)`` in ``redlock.enqueue``.

    Outcome ``acquired`` (the marker is this call's: it is published), ``skipped`` (a call
    of the same key is queued: this one is dropped) or ``unavailable`` (published anyway).
    """
    if _trace is None:
        return mark_queued

    @functools.wraps(mark_queued)
    def wrapper(task: Any, *args: Any, **kwargs: Any) -> Any:
        if not (_recording or _active()):
            return mark_queued(task, *args, **kwargs)
        op = _start("redlock.enqueue", {"redlock.mode": "enqueue"})
        if op is None:
            return mark_queued(task, *args, **kwargs)
        token = _current.set(op)
        try:
            queued = mark_queued(task, *args, **kwargs)
        except BaseException as exc:
            unavailable = type(exc).__name__ == "LockUnavailable"
            _finish(op, "unavailable" if unavailable else "failed", exc)
            raise
        finally:
            _current.reset(token)
        if queued is not None:
            op.attributes["redlock.queued_task_id"] = str(queued)
            _finish(op, "skipped")
        else:
            _finish(op, "acquired")
        return queued

    return wrapper  # type: ignore[return-value]
