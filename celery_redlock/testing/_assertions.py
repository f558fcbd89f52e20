"""Celery-aware test helpers: record lock signals, assert a call was skipped, hold a task's lock.

Exported by :mod:`celery_redlock.testing`; they need no pytest, so a ``unittest`` suite can
use them too::

    with record_lock_events() as events, hold_lock(sync_account, 42):
        result = sync_account.delay(42)        # eager mode or an in-process worker
        assert_skipped(result)                 # the innermost recording open now
    assert events.contended(result)[0].holder == HOLDER  # the events outlive the block

Signals are received in the process that runs the task: eager mode (``task_always_eager``,
``.apply()``) and in-process workers (``celery.contrib.testing.worker.start_worker``) are seen,
a ``celery worker`` subprocess is not.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from celery.signals import task_prerun

from .._celery.identity import lock_name_for, locked_spec, spec_of
from .._celery.options import Settings, reset_settings, settings_for
from .._redis.lock import Lock
from ..exceptions import LockConfigError
from ..signals import lock_acquired, lock_contended, lock_lost, lock_released

__all__ = [
    "HOLDER",
    "LockEvent",
    "LockEvents",
    "assert_acquired",
    "assert_skipped",
    "hold_lock",
    "record_lock_events",
    "use_redlock_url",
]

#: The holder task id stored by :func:`hold_lock` (what ``LockContended.holder`` reports).
HOLDER = "held-by-test"

_SIGNALS = {
    "acquired": lock_acquired,
    "contended": lock_contended,
    "released": lock_released,
    "lost": lock_lost,
}


@dataclass(frozen=True)
class LockEvent:
    """One lock signal: which, for which task and call, and its own arguments."""

    kind: str  #: ``acquired``, ``contended``, ``released`` or ``lost``
    task: str  #: the task's name
    task_id: str
    key: str
    #: ``fencing_token`` (acquired), ``holder`` and ``policy`` (contended), ``by`` (released),
    #: ``reason`` (lost).
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def policy(self) -> str | None:
        return self.fields.get("policy")

    @property
    def holder(self) -> str | None:
        return self.fields.get("holder")


def _task_id(result_or_id: Any) -> str:
    if isinstance(result_or_id, str):
        return result_or_id
    task_id = getattr(result_or_id, "id", None)
    if not isinstance(task_id, str):
        raise TypeError(
            "expected the AsyncResult of a call (task.delay(...)) or its task id, got "
            f"{result_or_id!r}"
        )
    return task_id


class LockEvents:
    """The lock signals received while recording, in the order they were sent."""

    def __init__(self) -> None:
        self.events: list[LockEvent] = []
        self._guard = threading.Lock()
        #: The tasks that started in this process while recording, by task id (``task_prerun``):
        #: for a failure message on a call that sent no lock event.
        self._ran: dict[str, Any] = {}
        #: The keys a :func:`hold_lock` held while recording, for a failure message.
        self._held: set[str] = set()

    def _receive(self, kind: str, sender: Any, task_id: str, key: str, **fields: Any) -> None:
        fields.pop("signal", None)
        event = LockEvent(kind, getattr(sender, "name", str(sender)), task_id, key, fields)
        with self._guard:  # in-process workers send from their pool threads
            self.events.append(event)

    def _started(self, task_id: str, task: Any) -> None:
        with self._guard:
            self._ran[task_id] = task

    def of(self, result_or_id: Any, kind: str | None = None) -> list[LockEvent]:
        """The events of one call (an ``AsyncResult``/``EagerResult`` or a task id)."""
        task_id = _task_id(result_or_id)
        with self._guard:
            return [
                e for e in self.events if e.task_id == task_id and (kind is None or e.kind == kind)
            ]

    def acquired(self, result_or_id: Any) -> list[LockEvent]:
        return self.of(result_or_id, "acquired")

    def contended(self, result_or_id: Any) -> list[LockEvent]:
        return self.of(result_or_id, "contended")

    def skipped(self, result_or_id: Any) -> bool:
        """Whether the call found its key held and skipped its body (policy ``skip``)."""
        return any(e.policy == "skip" for e in self.contended(result_or_id))

    def assert_skipped(self, result_or_id: Any) -> None:
        assert_skipped(result_or_id, self)

    def assert_acquired(self, result_or_id: Any) -> None:
        assert_acquired(result_or_id, self)


_recording: list[LockEvents] = []
#: The keys of each :func:`hold_lock` block open now (a recording started inside one sees them).
_holding: list[list[str]] = []


@contextlib.contextmanager
def record_lock_events() -> Iterator[LockEvents]:
    """Collect every lock signal sent in this process while inside (see the module doc)."""
    events = LockEvents()
    receivers = []
    for kind, signal in _SIGNALS.items():

        def receiver(sender: Any = None, _kind: str = kind, **kwargs: Any) -> None:
            events._receive(_kind, sender, **kwargs)

        signal.connect(receiver, weak=False)
        receivers.append((signal, receiver))

    def started(sender: Any = None, task_id: str = "", **kwargs: Any) -> None:
        events._started(task_id, sender)

    task_prerun.connect(started, weak=False)
    events._held.update(key for keys in _holding for key in keys)
    _recording.append(events)
    try:
        yield events
    finally:
        _recording.remove(events)
        task_prerun.disconnect(started)
        for signal, receiver in receivers:
            signal.disconnect(receiver)


def _events(events: LockEvents | None, what: str) -> LockEvents:
    if events is not None:
        return events
    if not _recording:
        raise RuntimeError(
            f"{what} needs the lock signals of the call: use the lock_events fixture of "
            "celery_redlock.testing.pytest_plugin, or call it inside a `with "
            "record_lock_events():` block around the call (after the block, pass its events: "
            f"{what}(result, events))"
        )
    return _recording[-1]


def _describe(events: LockEvents, task_id: str) -> str:
    """What the recording saw of the call, and the likely reason, for a failed assertion."""
    seen = events.of(task_id)
    if not seen:
        return _unseen(events, task_id)
    keys = {e.key for e in seen}
    described = f"; its key: {', '.join(sorted(keys))}; its lock events: " + ", ".join(
        f"{e.kind}({', '.join(f'{k}={v!r}' for k, v in e.fields.items())})" for e in seen
    )
    if any(e.kind == "contended" for e in seen):
        return described
    with events._guard:
        held = set(events._held)
    if not held:
        why = "no hold_lock() held a key while recording"
    elif held & keys:
        why = "the hold_lock() of its key was not open when it ran"
    else:
        why = f"hold_lock() held {', '.join(sorted(held))}, not its key: check the arguments"
    return f"{described} (its key was free: {why})"


def _call(events: LockEvents, task_id: str) -> str:
    """``task <name>[<id>]`` when the recording saw the call start, else ``task <id>``."""
    with events._guard:
        task = events._ran.get(task_id)
    return f"task {task_id}" if task is None else f"task {task.name}[{task_id}]"


def _failure(result: Any) -> str:
    """The error the call behind ``result`` ended with, to quote (a call that failed before
    taking its lock, such as on a ``LockConfigError`` whose fix is ``configure_redlock(app)``,
    was described as "see its result"); empty for a task id, or a call that has not failed."""
    if isinstance(result, str) or not result.ready() or not result.failed():
        return ""
    error = result.result
    return f"; it failed with {type(error).__name__}: {error}"


def _unseen(events: LockEvents, task_id: str) -> str:
    """Why a call sent no lock event: its task takes no lock, or it ran elsewhere."""
    with events._guard:
        task = events._ran.get(task_id)
    if task is None:
        return (
            "; no lock event was recorded for it (signals are received in the process that "
            "ran the task: use eager mode or an in-process worker, and make sure the call "
            "finished)"
        )
    try:
        spec = spec_of(task)
    except Exception:  # a task whose lock options are wrong: its own call reported that
        spec = None
    if spec is None:
        return (
            f"; it ran here, but {task.name} takes no lock: it is not a locked task (use "
            "base=LockedTask or @single_instance)"
        )
    if spec.options.limit is None:
        return f"; it ran here, but {task.name} takes no lock (lock_limit=None)"
    return (
        "; it ran here without a lock event: called with lock_bypass=True, superseded by a "
        "newer call of its key (lock_enqueue='replace', lock_debounce: it ends SUCCESS with "
        "None, unrun and unlocked), or it failed before taking its lock"
    )


def assert_skipped(result: Any, events: LockEvents | None = None) -> None:
    """Assert that the call behind ``result`` found its key held and did not run its body.

    ``events``: default, the innermost :func:`record_lock_events` (or the ``lock_events``
    fixture) active now.
    """
    events = _events(events, "assert_skipped")
    task_id = _task_id(result)
    if not events.skipped(task_id):
        described = _describe(events, task_id)
        raise AssertionError(
            f"{_call(events, task_id)} was not skipped{described}{_failure(result)}"
        )
    if not isinstance(result, str) and result.ready():
        assert result.successful() and result.result is None, (
            f"task {task_id} was skipped but ended {result.state} with {result.result!r}"
        )


def assert_acquired(result: Any, events: LockEvents | None = None) -> None:
    """Assert that the call behind ``result`` took its lock (so its body ran locked)."""
    events = _events(events, "assert_acquired")
    task_id = _task_id(result)
    if not events.acquired(task_id):
        described = _describe(events, task_id)
        raise AssertionError(f"{_call(events, task_id)} took no lock{described}{_failure(result)}")


#: The lease of a :func:`hold_lock` holder (seconds), renewed while it holds.
HOLD_TTL = 60.0


@contextlib.contextmanager
def hold_lock(task: Any, /, *args: Any, **kwargs: Any) -> Iterator[list[Lock]]:
    """Hold the lock that ``task(*args, **kwargs)`` takes, as another worker running it would:
    renewed until the block ends, however long it takes (a breakpoint in it included).

    Every slot is held for a ``lock_limit`` > 1 task. The holder's task id is :data:`HOLDER`.
    Raises :class:`RuntimeError` if the key is already held. Every keyword is the task's: a
    task parameter named ``ttl`` or ``task`` is passed on.
    """
    spec = locked_spec(task, "hold_lock")
    if spec.options.limit is None:
        raise ValueError(f"{task.name} takes no lock (lock_limit=None): there is none to hold")
    settings = _settings_of(task)
    name = lock_name_for(task, spec, args, kwargs)
    held: list[Lock] = []
    keys: list[str] = []
    try:
        for _ in range(spec.options.limit):
            lock = Lock(
                settings.url,
                name,
                HOLD_TTL,
                prefix=settings.prefix,
                owner=HOLDER,
                limit=spec.options.limit,
                auto_renew=True,
            )
            if not lock.acquire(blocking=False):
                raise RuntimeError(f"cannot hold {lock.key}: it is already held")
            held.append(lock)
        keys.extend(lock.key for lock in held)
        _holding.append(keys)
        for events in list(_recording):
            with events._guard:
                events._held.update(keys)
        yield held
    finally:
        if keys:
            _holding.remove(keys)
        for lock in held:
            with contextlib.suppress(Exception):
                lock.release()


#: The apps a ``@shared_task`` resolves to in a test that requests ``celery_app`` alone, by
#: name: Celery's fallback app, and pytest-celery's, which importing pytest-celery (enabled)
#: makes current.
_NOT_THE_TEST_APPS = {
    "default": "Celery's fallback app 'default'",
    "celery_test_app": "pytest-celery's app 'celery_test_app'",
}


def _settings_of(task: Any) -> Settings:
    """The settings of ``task``'s app; a missing ``redlock_url`` of an app in
    :data:`_NOT_THE_TEST_APPS` says why a test can end up there: Celery's ``celery_app``
    fixture does not make its app current, so a ``@shared_task`` resolves to whichever app
    is current."""
    try:
        return settings_for(task.app)
    except LockConfigError as exc:
        which = _NOT_THE_TEST_APPS.get(getattr(task.app, "main", None) or "")
        if which is None:
            raise
        raise LockConfigError(
            f"{exc}. hold_lock(): {task.name} resolves to {which}, not to the test's app: a "
            "@shared_task binds to the current app, which Celery's celery_app fixture does "
            "not set; request celery_worker too (it does), or define the task on an explicit "
            "app (@app.task)"
        ) from None


def use_redlock_url(app: Any, url: str) -> Any:
    """Point ``app``'s locks at ``url``, even if its settings were already resolved."""
    app.conf.redlock_url = url
    reset_settings(app)
    return app
