"""``LockedTask``: a Celery base task whose executions exclude each other per arguments.

::

    @app.task(base=LockedTask, lock_by=["account_id"], lock_on_contention="retry")
    def sync_account(account_id, full=False): ...

Each execution runs through the one engine path shared with ``@single_instance``
(:func:`celery_redlock._celery.engine.execute`): the lock is taken when the tracer calls the
task, and released as soon as the body returns or raises, *before* Celery stores the result and
sends callbacks. The ``task_postrun`` receiver (which Celery runs on every ending, unlike
``after_return``) is the idempotent backstop.

Options are class attributes (Celery turns ``@app.task(lock_...=...)`` keywords into class
attributes), one per row of :data:`celery_redlock._celery.options.OPTIONS`, and are validated
when Celery builds the task class: at decoration time for a finalized app or ``lazy=False``,
otherwise when the app finalizes (worker start, the first ``delay()``, or ``app.finalize()``).
Combinations with the app's settings that cannot work (``lock_limit`` > 1 over a quorum) are
rejected when the task is bound to its app. Every name starting with ``lock_`` is reserved, and
the other API's spelling is refused with the right one (``by=[...]`` names ``lock_by``). So is a
``run`` already decorated with ``@single_instance``: the call would take its lock twice and
contend with itself; and a base class's ``__call__`` that does not call ``super().__call__``,
which would run every execution unlocked.
"""

from __future__ import annotations

import inspect
import logging
import types
from datetime import datetime
from typing import Any

from celery import Task
from celery._state import get_current_worker_task
from celery.backends.rpc import RPCBackend
from celery.utils.time import maybe_make_aware
from kombu.utils.uuid import uuid

from ._celery import (
    calls,
    engine,
    routing,
    wiring,  # noqa: F401  (importing it connects the worker receivers)
)
from ._celery.identity import (
    OPTIONS_ATTR,
    check_bound_by,
    check_not_mapped,
    check_task_name,
    spec_of,
)
from ._celery.options import (
    KEEPING_MODES,
    OPTIONS,
    cross_check,
    parameters_of,
    resolve,
    validate_options,
)
from .exceptions import LockConfigError, LockUnavailable

__all__ = ["LockedTask"]

logger = logging.getLogger("celery_redlock.task")


class LockedTask(Task):  # type: ignore[misc]
    """Base class for tasks that take a Redis lock before their body runs.

    The ``lock_*`` attributes are the task options of ``docs/configuration.md``, each with its
    default.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _refuse_a_call_around_the_lock(cls)
        _freeze_options(cls)

    @classmethod
    def on_bound(cls, app: Any) -> None:
        """When the task is bound to ``app`` (the app finalizes): validate the options again,
        as Celery's ``task_annotations`` may have set some (``{"lock_ttl": 60}``) just before,
        then cross-check them with the settings.

        Settings that do not resolve yet (``redlock_url`` set later, say) are not an error
        here: they are checked at worker start and at the first lock operation.
        """
        super().on_bound(app)
        routing.adopt(app)  # app.send_task(name, lock_ttl=...) is checked too
        _freeze_options(cls)
        if cls.__dict__.get("name") is None:
            return  # an abstract base, not a task
        try:
            settings = resolve(app)
        except LockConfigError:
            return
        cross_check(f"task {cls.name}", getattr(cls, OPTIONS_ATTR), settings)

    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        **options: Any,
    ) -> Any:
        """Publish the call; with ``lock_enqueue``, not if a call of the same key is queued.

        De-duplication, when ``lock_enqueue=True`` (``"keep"``; ``"replace"`` and
        ``lock_debounce`` are handled when the message is published, for both APIs, in
        :mod:`celery_redlock._celery.supersede`):

        1. ``delay()``/``apply_async()`` sets the key's queued marker to the new task id,
           unless a marker exists: then it returns that queued task's ``AsyncResult`` instead
           of publishing.
        2. The marker clears when that execution takes its lock and starts (so one call can
           run while one more waits), or ends without running (skipped, failed), or after
           ``lock_enqueue_ttl`` seconds if it never starts. An execution requeued by the lock
           (``lock_on_contention='retry'``) or by ``lock_rate`` keeps it, and so does one
           waiting for the lock (``'wait'``): it is still the one call that waits. With
           ``lock_enqueue='until_executed'`` it clears when the execution ends instead: no
           second call is published while one is queued or running.
           A marker whose call the result backend says has ended (``SUCCESS``, ``FAILURE``,
           ``REVOKED``) is replaced at once. Timelines it closes: (a) Celery 5.7 marks a call
           ``REVOKED`` there when the workers get the revoke, but discards its message (and
           clears the marker) only at its ETA; (b) the lock Redis does not answer when the
           worker clears the marker (it logs a WARNING), and the marker stays for
           ``lock_enqueue_ttl``. Without it, every call of the key until then would get the
           ended call's id, and never run. Older Celery marks a revoke at the discard, and a
           call without a result backend (or with ``ignore_result``) is never checked. A
           task id you reuse (``task_id="report-42"``) while the backend keeps an earlier
           result of it is taken for ended: the next call is published beside it (the lock
           still excludes the two when they run).
        3. Retries (``self.retry()``, ``autoretry_for``) always publish: an execution is never
           rejected by a marker. ``app.send_task()`` never looks at markers.
        4. If Redis does not answer, the call is published anyway (never dropped); the lock
           still guarantees exclusion when it runs. If the publish fails (the broker is down,
           an argument does not serialize), the marker it set is cleared, owner-checked, as
           the error propagates: a marker left behind would send every later call of the key
           to a task id that was never queued, for ``lock_enqueue_ttl``. The call is marked
           as being published until the publish returns: a call of the key made meanwhile
           waits for it (:func:`~celery_redlock._celery.engine.mark_queued`), and is queued
           itself if that publish failed.
        5. A ``lock_bypass`` call, and a call with callbacks or in a canvas (``link``,
           ``link_error``, a chain, a group or a chord, and what a worker publishes for one:
           a chain's next step, a callback, a replacement), always publish and write no marker:
           the bypass runs on purpose; a canvas call de-duplicated would drop its callbacks
           and the rest of its chain, and leave its group or chord waiting forever on a task
           id that never runs. The lock still excludes it when it runs.
        6. A call with ``expires`` keeps its marker no longer than until it expires: the
           worker would discard it unrun, so a call made after that is queued.

        Per-call options (``lock_on_contention``, ``lock_wait_timeout``, ``lock_ttl``,
        ``lock_retry_countdown``, ``lock_bypass``) are validated here, raising
        :class:`~celery_redlock.LockConfigError`, and travel in the message's ``redlock`` header.
        """
        header = calls.take(f"task {self.name}", options)
        calls.put(options, header)
        routing.note(self)  # the task, with its app, for the before_task_publish receiver
        spec = spec_of(self)
        if (
            spec is None
            or spec.options.enqueue not in KEEPING_MODES  # 'replace', debounce: _celery.supersede
            or options.get("retries") is not None  # a retry (lock retries keep retries at 0)
            or self.app.conf.task_always_eager
            or (header is not None and calls.bypassed(header))
            or _in_canvas(options)
        ):
            return super().apply_async(args, kwargs, task_id=task_id, **options)
        task_id = task_id or uuid()
        # The task's own ``expires`` too, as Celery merges it into the options after this.
        expires = _seconds_left(self.app, options.get("expires", self.expires))
        marked = False
        try:
            queued = engine.mark_queued(self, args, kwargs, task_id, expires)
            marked = queued is None
        except LockUnavailable as exc:
            logger.warning("%s: enqueue de-duplication skipped: %s", self.name, exc)
            queued = None
        if queued is not None:  # its own task_id too: that call is queued, not published again
            logger.info(
                "%s[%s] not queued: the same call is queued as %s", self.name, task_id, queued
            )
            _warn_unfetchable(self)
            return self.AsyncResult(queued)
        try:
            result = super().apply_async(args, kwargs, task_id=task_id, **options)
        except BaseException:
            if marked:  # never published: nothing is queued under this id
                engine.clear_queued(self, args, kwargs, task_id)
            raise
        if marked:
            engine.confirm_queued(self, args, kwargs, task_id, expires)
        return result

    def apply(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """Run the call in this process (``apply()``; ``delay()`` under ``task_always_eager``
        comes here through :meth:`apply_async`), with the per-call ``lock_*`` options of
        :meth:`apply_async`: validated, and given to the lock in the request's headers. Celery's
        own ``apply()`` would drop them, a misspelled one too."""
        if options:  # the usual apply() has none
            calls.put(options, calls.take(f"task {self.name}", options))
        return super().apply(args, kwargs, **options)

    def on_replace(self, sig: Any) -> Any:
        """Release the lock, then let Celery publish the replacement (``self.replace()`` calls
        this hook on every supported Celery, before its ``Ignore``), as before a retry.

        The ``before_task_publish`` receiver also releases before a message marked as a
        replacement (:mod:`celery_redlock._celery.wiring`), for ``@single_instance``, but
        Celery before 5.3.5 leaves the mark off a chain built for a running task that is
        itself in a chain: its first message then found the key held, and was skipped or
        requeued for the whole lease. Under ``lock_enqueue='until_executed'`` the call's
        queued marker stays if ``sig`` is a call of this task on the same key, which finishes
        the call under its task id (:func:`~celery_redlock._celery.engine.replaced`).
        """
        engine.replaced(self, sig)
        return super().on_replace(sig)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request_stack.top
        if request is None or engine.called_directly(request):
            check_not_mapped(self, get_current_worker_task())
            return super().__call__(*args, **kwargs)
        return engine.execute(self, args, kwargs, lambda: self.run(*args, **kwargs), request)


def _refuse_a_call_around_the_lock(cls: type) -> None:
    """Refuse a ``__call__`` before ``LockedTask``'s in the MRO of ``cls`` that does not go on
    to it (:func:`_reaches_the_lock`: its code names neither ``super`` nor the ``__call__`` of
    a class deriving from ``LockedTask``).

    Celery runs each execution through the task's ``__call__``, and ``LockedTask`` takes the
    lock in its own. Timeline without this: (1) a base ``class DBTask(LockedTask)`` overrides
    ``__call__`` to open a session and ends with ``return self.run(*args, **kwargs)``, as
    Celery's guide shows for a plain ``Task``; (2) every execution runs the body with no lock
    and no warning: two workers run ``sync_account(42)`` at once. A ``__call__`` that reaches
    the lock only through a helper of its own is refused too: the check reads the method's
    code, and says what to write instead.
    """
    for klass in cls.__mro__:
        if klass is LockedTask:
            return
        method = klass.__dict__.get("__call__")
        if method is not None and not _reaches_the_lock(method):
            raise LockConfigError(
                f"task {cls.__dict__.get('name') or cls.__qualname__}: "
                f"{klass.__qualname__}.__call__ does not call super().__call__, where "
                "LockedTask takes the lock: every execution would run unlocked. Expected "
                "`return super().__call__(*args, **kwargs)` in it, in place of "
                "`self.run(*args, **kwargs)` (what Celery's guide shows for a plain Task)"
            )


def _reaches_the_lock(method: Any) -> bool:
    """Whether ``method``'s code may call ``LockedTask.__call__``: it (or a function defined in
    it, or one a decorator's wrapper holds in its closure) names ``super``, or names
    ``__call__`` and a class deriving from ``LockedTask`` (``AppTask.__call__(self, ...)``,
    under any alias). A callable that is no Python function is taken as reaching it."""
    functions, seen = [method], set()
    while functions:
        function = inspect.unwrap(functions.pop())
        code = getattr(function, "__code__", None)
        if code is None:
            return not isinstance(function, (staticmethod, classmethod))
        if id(code) in seen:
            continue
        seen.add(id(code))
        scope = getattr(function, "__globals__", {})
        codes = [code]
        while codes:
            current = codes.pop()
            names = current.co_names
            if "super" in names or (
                "__call__" in names and any(_is_locked_task(scope.get(name)) for name in names)
            ):
                return True
            codes.extend(c for c in current.co_consts if isinstance(c, types.CodeType))
        cells = getattr(function, "__closure__", None) or ()
        functions.extend(c.cell_contents for c in cells if callable(_content(c)))
    return False


def _content(cell: Any) -> Any:
    """A closure cell's content, or ``None`` for a cell not filled yet."""
    try:
        return cell.cell_contents
    except ValueError:
        return None


def _is_locked_task(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, LockedTask)


def _freeze_options(cls: type) -> None:
    """Validate the ``lock_*`` class attributes of ``cls`` and store them (``OPTIONS_ATTR``)."""
    owner = f"task {cls.__dict__.get('name') or cls.__qualname__}"
    _refuse_decorator_keywords(owner, cls)
    raw = {name: getattr(cls, name) for name in dir(cls) if name.startswith("lock_")}
    run = inspect.getattr_static(cls, "run")
    params = None
    if run is not Task.__dict__["run"]:
        fun = run.__func__ if isinstance(run, staticmethod) else run
        if getattr(fun, OPTIONS_ATTR, None) is not None:
            raise LockConfigError(
                f"{owner}: base=LockedTask and @single_instance on one task; the call "
                "would take the same lock twice and contend with itself forever. Expected "
                "one of them: drop @single_instance (and give its keywords as lock_* task "
                "options), or drop base=LockedTask (under Celery(task_cls=LockedTask), which "
                "makes every task a LockedTask: @app.task(base=celery.Task))"
            )
        bound = not isinstance(run, staticmethod)
        params = parameters_of(fun, bound=bound)
        if bound:
            check_bound_by(owner, "lock_by", fun, raw.get("lock_by"), params)
    options = validate_options(owner, raw, params)
    check_task_name(cls.__dict__.get("name"), options)
    setattr(cls, OPTIONS_ATTR, options)


#: ``apply_async`` options by which Celery sends a call's callbacks or its canvas: a call
#: carrying one is never de-duplicated (point 5 of :meth:`LockedTask.apply_async`).
_CANVAS_OPTIONS = ("link", "link_error", "chord", "group_id", "parent_id", "root_id")


def _in_canvas(options: dict[str, Any]) -> bool:
    """Whether Celery sends this call as part of a canvas, or as another call's callback.

    A worker publishes a chain's next step with ``chain`` (empty for the last step) and a
    ``link`` callback with ``parent_id`` and ``root_id``; ``replace()`` passes
    ``replaced_task_nesting``. A plain ``delay()`` has none of them (even inside a task:
    Celery fills in the parent after ``apply_async``). Timeline of a miss: (1) ``f(1)`` is
    queued, with its marker; (2) ``chain(g.s(), f.si(1))`` runs ``g``; (3) the worker
    publishes ``f(1)`` as the chain's last step: de-duplicated to the queued call, its task id
    never runs, and the chain's result stays PENDING for good.
    """
    return (
        "chain" in options
        or bool(options.get("replaced_task_nesting"))
        or any(options.get(name) for name in _CANVAS_OPTIONS)
    )


#: The ``@single_instance`` keywords that are no Celery task attribute: given to a
#: ``LockedTask`` without their ``lock_`` prefix, they would be ignored.
_DECORATOR_KEYWORDS = frozenset(OPTIONS) - set(dir(Task))


def _refuse_decorator_keywords(owner: str, cls: type) -> None:
    """Refuse ``@app.task(base=LockedTask, by=[...])``: the other API's spelling, which Celery
    would set as a plain class attribute that no lock reads (locking on every argument)."""
    for name in sorted(_DECORATOR_KEYWORDS & set(vars(cls))):
        raise LockConfigError(
            f"{owner}: option {name}={vars(cls)[name]!r} is not a LockedTask option; expected "
            f"lock_{name}= (the names without lock_ are @single_instance's keywords)"
        )


for _option in OPTIONS.values():
    setattr(LockedTask, _option.attr, _option.default)


#: The tasks already warned that a de-duplicated call's result cannot be fetched (once each).
_warned_rpc: set[str] = set()


def _seconds_left(app: Any, expires: Any) -> float | None:
    """Seconds until a call's ``expires`` (seconds, a datetime or an ISO 8601 string; a naive
    one is UTC, as Celery reads it), ``None`` without one."""
    if isinstance(expires, str):
        try:
            expires = datetime.fromisoformat(expires)
        except ValueError:
            return None  # not a form this Python reads: the marker keeps lock_enqueue_ttl
    if isinstance(expires, datetime):
        left = maybe_make_aware(expires) - app.now()
        return float(left.total_seconds())
    if isinstance(expires, (int, float)) and not isinstance(expires, bool):
        return float(expires)
    return None


def _warn_unfetchable(task: Any) -> None:
    """Warn, once per task and process, that under the ``rpc://`` result backend the
    ``AsyncResult`` a de-duplicated call returns cannot be waited on.

    Timeline: (1) process A calls ``sync.delay(1)``; (2) process B calls it too and is given
    A's call's ``AsyncResult``; (3) the worker sends the result to A's reply queue, the only
    place ``rpc://`` puts it; (4) ``get()`` in B waits forever (in A, a second ``get()`` of the
    same id does too). Nothing is wrong with the calls: one runs, as asked."""
    if task.name in _warned_rpc or not isinstance(task.backend, RPCBackend):
        return
    _warned_rpc.add(task.name)
    logger.warning(
        "%s: lock_enqueue returned the queued call's AsyncResult, whose result the rpc:// "
        "result backend sends only to the process that published that call: get() on it "
        "here may wait forever; use a result backend that stores results (Redis, a database) "
        "to wait on a de-duplicated call",
        task.name,
    )
