"""Worker wiring: the one module that connects the receivers releasing locks on every ending.

Imported by ``LockedTask``, ``@single_instance`` and the other names of the Celery layer
taken from ``celery_redlock`` (its ``__getattr__``), never by the CLI; in a worker or a beat
started by Celery's command line for an app with a ``redlock_*`` setting, whose project
imported none of those, when it starts (:mod:`celery_redlock._celery.entry`).

Which process releases, for each way an attempt ends (measured on Celery 5.7, see
``docs/guide.md``):

* return, exception, soft time limit, ``Ignore``, ``Reject``, ``SystemExit`` (SIGTERM from
  revoke/hard limit/cold shutdown): the pool child, in
  :func:`celery_redlock._celery.engine.execute`, before the result is stored; the
  ``task_postrun`` receiver below, which Celery runs on every one of these endings, is the
  idempotent backstop;
* ``self.retry()``: the child, from the ``before_task_publish`` receiver, because Celery
  publishes the retry message *before* the body's ``Retry`` reaches ``execute``:

  1. the body calls ``self.retry()``;
  2. Celery publishes the retry message (our receiver releases here);
  3. another worker may receive and start the retry at once;
  4. only now does ``Retry`` propagate out of the body.

  Releasing in step 4 would let the retry find its own earlier attempt's lock and skip itself.
  ``self.replace()`` likewise publishes the replacement before its ``Ignore`` reaches
  ``execute``: released here too, or the replacement finds the key held. A task replacement
  has the running task's id: it would be requeued for the lock's remaining TTL (a whole
  lease). A chain's or group's first message has a new id (Celery gives the running id to a
  chain's last task): under ``skip`` it would be skipped. Every message of a replacement
  carries a ``replaced_task_nesting`` above the running request's, whatever its id.
* hard time limit, child SIGKILL/OOM, ``revoke(terminate=True)``: the worker's main process
  (:mod:`celery_redlock._celery.parent`);
* the whole worker killed: nobody; the TTL frees the key (see the engine's TTL rule).

In every process, each app's router checks per-call ``lock_*`` options before a call is
published, so that a bad value raises in the caller for ``@single_instance`` tasks and
``send_task`` too (:mod:`celery_redlock._celery.routing`, installed below when an app finalizes);
the ``before_task_publish`` receiver here moves them into the message's header.

At worker start the options of every locked task are cross-checked against the app's
settings (:func:`celery_redlock._celery.options.cross_check`): a combination that cannot work,
or settings that are invalid, stop the worker before it consumes anything, so no task fails
one execution at a time. Under Celery's command line (``celery -A proj worker``), such a
:class:`~celery_redlock.LockConfigError` ends the process with one ``Error:`` line naming the
task or setting and the fix, exit status 1, instead of a traceback through Celery and click
(:func:`_brief_config_errors`; every other exception keeps the usual traceback).

Unknown ``redlock_*`` (``CELERY_REDLOCK_*``) settings, which Celery would silently ignore, are
logged at WARNING with a "did you mean" hint, once, when an app finalizes, first publishes or
first resolves its settings (a process that only sends tasks may never finalize its app). Under
Celery's command line an app finalizes before Celery sets up logging (``celery worker``,
``celery beat``): the warning would be a bare line on stderr, outside the log file, so it waits
for Celery's logging (``after_setup_logger``, or ``beat_init`` where a project's
``setup_logging`` receiver replaces Celery's logging setup); a worker's start logs what is still
unlogged.
"""

from __future__ import annotations

import logging
import sys
from types import TracebackType
from typing import Any

from celery import bootsteps, current_task, signals
from celery._state import _get_active_apps, connect_on_app_finalize
from celery.beat import PersistentScheduler
from celery.concurrency import get_implementation
from celery.utils.imports import load_extension_class_names
from kombu.utils.imports import symbol_by_name

from ..exceptions import LockConfigError
from . import calls, checks, routing, supersede
from .engine import clear_queued, held, leave
from .identity import Spec, check_ignored_options, spec_of
from .options import (
    cross_check,
    settings_for,
    warn_unknown_settings,
    warn_waiting,
    warn_when_logged,
)
from .parent import ParentReleaseMixin
from .state import state

logger = logging.getLogger("celery_redlock.worker")

#: Pools that enforce a task's hard time limit by killing it.
_ENFORCING_POOLS = ("celery.concurrency.prefork", "celery.concurrency.gevent")


def _install_request_class(task: Any) -> None:
    current = symbol_by_name(task.Request)
    if issubclass(current, ParentReleaseMixin):
        return
    task.Request = type(f"Locked{current.__name__}", (ParentReleaseMixin, current), {})


class CrossCheck(bootsteps.Step):  # type: ignore[misc]
    """A worker bootstep whose construction fails when a locked task cannot work.

    Added to the worker's blueprint from ``worker_init``; raising here stops the worker at
    start with the :class:`~celery_redlock.LockConfigError`, before it consumes a message.
    """

    name = "celery_redlock.CrossCheck"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        warn_unknown_settings(parent.app)
        check_app(parent.app)


def check_app(app: Any) -> None:
    """Raise :class:`~celery_redlock.LockConfigError` for invalid settings or option mixes,
    and for ``lock_*`` options given to a task that does not read them."""
    for task in app.tasks.values():
        check_ignored_options(task)
    specs: dict[str, Spec] = {}
    for task in app.tasks.values():
        spec = spec_of(task)
        if spec is not None:
            specs[task.name] = spec
    if specs:
        settings = settings_for(app)
        for spec in specs.values():
            cross_check(spec.owner, spec.options, settings, spec.keywords)
        _check_shared_names(specs)


def _check_shared_names(specs: dict[str, Spec]) -> None:
    """Tasks whose calls can share keys (the same lock name, and identities encoding the same
    parameter names, or both computed by a ``lock_by`` callable) must agree on ``lock_limit``
    and ``lock_rate``. Timeline of a mix: (1) a ``lock_limit=1`` task holds slot 1; (2) a
    ``lock_limit=3`` task of the same name finds slot 2 free and runs beside it. A shorter
    rate window alike trims the shared start log to its own count, and the longer one's
    history is lost. Tasks whose identities encode other names never share a key.

    At most one of them may keep each kind of marker (:func:`_marker_kind`), as a marker
    holds a call of its key, whatever its task. Timeline of two ``lock_enqueue=True`` tasks
    A and B: (1) ``A.delay(1)`` is queued and marks the key; (2) ``B.delay(1)`` finds the
    marker and returns A's call: B never runs, and B's caller gets A's result. Under
    ``lock_enqueue='replace'`` or ``lock_debounce``, B's call supersedes A's instead."""
    first: dict[tuple[str, Any], tuple[str, Spec]] = {}
    marking: dict[tuple[str, Any, str], str] = {}
    for name, spec in sorted(specs.items()):  # named in order, whatever the registration's
        shared = spec.options.name or name
        identity = "lock_by callable" if callable(spec.options.by) else spec.names
        seen = first.setdefault((shared, identity), (name, spec))
        kind = _marker_kind(spec)
        if kind is not None:
            other = marking.setdefault((shared, identity, kind), name)
            if other != name:
                raise LockConfigError(
                    f"tasks {other} and {name} share the lock name {shared!r} and both use "
                    f"{kind}: a call of one would be taken for a call of the other (a queued "
                    "call of the key is its marker's, whatever its task); give them each a "
                    f"lock_name of its own, or {kind} to one of them only"
                )
        for option, mine, theirs in (
            ("lock_limit", spec.options.limit, seen[1].options.limit),
            ("lock_rate", spec.options.rate, seen[1].options.rate),
        ):
            if mine != theirs:
                raise LockConfigError(
                    f"tasks {seen[0]} and {name} share the lock name {shared!r} but not "
                    f"{option} ({theirs} and {mine}): they would not limit each other; give "
                    f"them the same {option}, or each a lock_name of its own"
                )


def _marker_kind(spec: Spec) -> str | None:
    """The options of the marker a task keeps for its queued calls, named as a user sets
    them: the queued marker (``lock_enqueue`` True or ``'until_executed'``), the newest-call
    marker (``lock_enqueue='replace'`` or ``lock_debounce``), or ``None``."""
    if spec.options.enqueue == "replace" or spec.options.debounce is not None:
        return "lock_enqueue='replace' or lock_debounce"
    if spec.options.enqueue is not None:
        return "lock_enqueue"
    return None


def _on_app_finalize(app: Any) -> None:
    routing.install(app)
    warn_when_logged(app)


@signals.after_setup_logger.connect(weak=False)
@signals.beat_init.connect(weak=False)
def on_logging_set_up(**_: Any) -> None:
    """Celery has set up logging (worker, beat), or a beat started: log the warnings that
    waited for it, on our loggers switched back on (:func:`enable_loggers`)."""
    enable_loggers()
    warn_waiting()


@signals.beat_init.connect(weak=False)
def check_beat_schedule(sender: Any = None, **_: Any) -> None:
    """A ``celery beat`` starts: log an ERROR for each ``beat_schedule`` entry whose
    ``options`` hold a ``lock_*`` option its task refuses, naming the entry.

    Timeline without it: (1) ``"options": {"lock_cooldown": 50}`` (a task option, not a
    per-call one) is added to a daily entry; (2) beat starts without a word; (3) at the
    entry's first tick, hours later, the publish is refused (Celery logs the
    :class:`~celery_redlock.LockConfigError`), and so at every tick after: the job never runs.
    Logged, not raised: Celery's ``Signal.send`` logs what a receiver raises, and the other
    entries still run. Entries of a scheduler of another kind are not read: django-celery-beat
    copies them into its database without the options it does not know (``lock_*``, and
    ``expires`` too), so an ERROR for them would be false.

    The app's ``redlock_*`` settings are checked too, whatever the scheduler, when the app
    has a locked task: a bad one (``redlock_lease = -1``) refused every publish that reads
    them (``lock_enqueue``, ``replace``, a debounce) from the first tick on, where a worker
    refuses to start.
    """
    app: Any = getattr(sender, "app", None)
    if app is not None and any(_locked(task) for task in app.tasks.values()):
        try:
            settings_for(app)
        except LockConfigError as exc:
            logger.error(
                "celery beat: %s; until fixed, the calls it sends with lock_enqueue or a "
                "lock_debounce are refused, and workers refuse to start",
                exc,
            )
    if not _schedules_from_conf(getattr(sender, "scheduler_cls", None)):
        return
    schedule = getattr(getattr(app, "conf", None), "beat_schedule", None)
    if app is None or not isinstance(schedule, dict):
        return
    for entry, fields in schedule.items():
        if not isinstance(fields, dict):
            continue
        options = fields.get("options") or {}
        raw = {n: v for n, v in options.items() if isinstance(n, str) and n.startswith("lock_")}
        task = app.tasks.get(fields.get("task"))
        if not raw or task is None or spec_of(task) is None:
            continue  # an unlocked task's lock_* options are warned about when sent
        try:
            calls.take(f"task {task.name}", raw)
        except LockConfigError as exc:
            logger.error("beat_schedule entry %r is never sent until fixed: %s", entry, exc)


def _locked(task: Any) -> bool:
    """Whether ``task`` takes a lock; a task whose options are refused counts (its refusal is
    logged where it is used)."""
    try:
        return spec_of(task) is not None
    except LockConfigError:
        return True


def _schedules_from_conf(kind: Any) -> bool:
    """Whether a beat's scheduler (a class, or its name as ``celery beat -S`` takes it) is one
    of Celery's own, or derives from its ``PersistentScheduler``: one that sends the entries of
    ``beat_schedule`` with their options."""
    try:
        cls = (
            kind
            if isinstance(kind, type)
            else symbol_by_name(
                kind or "celery.beat:PersistentScheduler",
                aliases=dict(load_extension_class_names("celery.beat_schedulers")),
            )
        )
    except Exception:  # not importable here: not ours to judge
        return False
    return isinstance(cls, type) and (
        cls.__module__ == "celery.beat" or issubclass(cls, PersistentScheduler)
    )


def _brief_config_errors(
    kind: type[BaseException], error: BaseException, tb: TracebackType | None
) -> None:
    """``sys.excepthook`` under Celery's command line: a :class:`LockConfigError` that ends the
    process (a worker refusing to start) is one line; anything else goes to the hook before."""
    if isinstance(error, LockConfigError) and "celery.bin.celery" in sys.modules:
        print(f"Error: {kind.__name__}: {error}", file=sys.stderr)
        return
    _previous_hook(kind, error, tb)


_previous_hook = sys.excepthook
sys.excepthook = _brief_config_errors

# Every app that has not built its amqp yet, and every app created later, checks from its
# first publish; as shared_task does, every app at its finalize, and the apps finalized
# before this import (routing's module docstring).
routing.adopt_all()
routing.adopt_later()
connect_on_app_finalize(_on_app_finalize)
for _app in _get_active_apps():
    if _app.finalized:
        _on_app_finalize(_app)


def enable_loggers() -> None:
    """Switch our loggers back on where a logging configuration run after they were made
    switched them off: ``dictConfig`` with ``disable_existing_loggers`` (Django's ``LOGGING``
    often sets it; ``fileConfig`` does by default) disables every logger it does not name.
    Timeline: (1) Celery loads our entry point, making ``celery_redlock.lock``; (2) the worker
    imports the project, and ``django.setup()`` runs its ``LOGGING``; (3) a lost lock's ERROR,
    and every startup warning, is dropped unseen. A level or handler set for ``celery_redlock``
    is left as configured."""
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if name.partition(".")[0] == "celery_redlock" and isinstance(logger, logging.Logger):
            logger.disabled = False


@signals.celeryd_after_setup.connect(weak=False)
def _on_logging_configured(**_: Any) -> None:
    """``celery worker`` has set up logging, before its pool forks: a project's own
    ``setup_logging`` receiver (Celery's recipe for Django's ``LOGGING``) runs after
    ``worker_init``, and may switch our loggers off again (:func:`enable_loggers`)."""
    enable_loggers()


@signals.worker_init.connect(weak=False)
def on_worker_init(sender: Any = None, **_: Any) -> None:
    """In the worker's main process, before the pool forks."""
    enable_loggers()
    pool_cls = get_implementation(sender.pool_cls)
    state.enforces_limits = pool_cls.__module__ in _ENFORCING_POOLS
    state.pool_children = pool_cls.__module__ == "celery.concurrency.prefork"
    state.time_limit = float(sender.time_limit) if sender.time_limit else None
    state.task_events = bool(sender.task_events)
    sender.app.steps["worker"].add(CrossCheck)
    for task in sender.app.tasks.values():
        if spec_of(task) is not None:
            _install_request_class(task)


@signals.worker_ready.connect(weak=False)
def _on_worker_ready(sender: Any = None, **_: Any) -> None:
    """In the worker's main process, once the consumer is ready (before ``ready.`` is logged)."""
    try:
        checks.run_startup_checks(
            sender.app,
            state.enforces_limits,
            pool=checks.pool_name(sender),
            time_limit=state.time_limit,
        )
    except Exception:
        logger.exception("celery_redlock: the startup checks failed")


@signals.task_postrun.connect(weak=False)
def _on_task_postrun(sender: Any = None, **_: Any) -> None:
    """Backstop: an attempt whose body never returned to ``execute`` (idempotent); only
    while an execution of this process holds a lock (:data:`~.engine.held`)."""
    if sender is not None and held:
        leave(sender)


@signals.before_task_publish.connect(weak=False)
def _on_before_task_publish(
    sender: Any = None, headers: Any = None, properties: Any = None, **_: Any
) -> None:
    """Move per-call ``lock_*`` options into the message's header (``@single_instance``,
    ``send_task``); release before a retry or a replacement of the running attempt is
    published (see the module docstring), without cooldown: the call is not finished. A retry
    published by the lock keeps ``retries``: it holds no lock."""
    if headers is not None and properties:
        unlocked = routing.routed_unlocked(sender)
        calls.move_from_properties(sender, headers, properties, unlocked=unlocked)
    task = current_task._get_current_object()
    if task is None or not headers:
        return
    request = task.request
    if request.called_directly:
        return
    if calls.replaces(request, headers, properties) or (
        headers.get("id") == request.id
        and int(headers.get("retries") or 0) > int(request.retries or 0)
    ):
        leave(task, request, cooldown=False)


@signals.before_task_publish.connect(weak=False)
def _on_publish_newest(
    headers: Any = None, body: Any = None, properties: Any = None, **_: Any
) -> None:
    """``lock_enqueue='replace'``, ``lock_debounce``: mark the call as its key's newest (and
    delay it), or stamp a retry of the running call (as never superseded, or with its number)."""
    supersede.on_publish(headers, body, properties)


@signals.after_task_publish.connect(weak=False)
def _on_published_newest(headers: Any = None, **_: Any) -> None:
    """The publish succeeded: the call numbered before it becomes its key's newest."""
    supersede.on_published(headers)


@signals.task_revoked.connect(weak=False)
def _on_task_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    """A revoked or expired message never starts: clear its queued marker (lock_enqueue).

    Runs in the worker's main process, which discards such messages before any task hook.
    ``sender`` is the task, ``request`` the message's context (id, args, kwargs). With the
    main process's 1 s timeouts: with the socket timeout (5 s) a frozen lock Redis held it 5 s
    per discarded message, and no task started meanwhile, locked or not (six revoked calls
    of a beat entry with ``expires``: 30 s).
    """
    if sender is None or request is None:
        return
    try:
        clear_queued(sender, request.args, request.kwargs, request.id, timeout=1.0)
    except Exception:
        logger.exception("%s[%s]: clearing the queued marker failed", sender.name, request.id)
