"""``LockedTask``: a Celery base task whose executions exclude each other per arguments.

::

    @app.task(base=LockedTask, lock_by=["account_id"], lock_on_contention="retry")
    def sync_account(account_id, full=False): ...

The lock is taken in ``before_start`` and released in ``after_return``; the receivers in
:mod:`celery_redlock._worker` release it on the endings that skip ``after_return`` (retry,
``Ignore``, ``Reject``, ``SystemExit``) and when the pool child dies.

Options are class attributes (Celery turns ``@app.task(lock_...=...)`` keywords into class
attributes) and are validated when Celery builds the task class: at decoration time for a
finalized app or ``lazy=False``, otherwise when the app finalizes (worker start, the first
``delay()``, or ``app.finalize()``). Every name starting with ``lock_`` is reserved.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, ClassVar

from celery import Task
from kombu.utils.uuid import uuid

from . import _engine
from .config import LockBy, Policy, parameters_of, validate_options
from .exceptions import LockContended, LockUnavailable

__all__ = ["LockedTask"]

logger = logging.getLogger("celery_redlock.task")


class LockedTask(Task):  # type: ignore[misc]
    """Base class for tasks that take a Redis lock before their body runs."""

    #: Parameters forming the lock identity: ``None`` all, ``()`` one lock per task name, a
    #: list of parameter names, or a callable ``(args, kwargs) -> str``.
    lock_by: ClassVar[LockBy] = None
    #: Name part of the key (default: the task's name); tasks sharing it exclude each other.
    lock_name: ClassVar[str | None] = None
    #: Fixed TTL in seconds, never renewed; ``None`` derives it from the time limits.
    lock_ttl: ClassVar[float | None] = None
    #: ``"skip"``, ``"retry"``, ``"fail"`` or ``"wait"``; ``None`` = ``redlock_on_contention``.
    lock_on_contention: ClassVar[Policy | None] = None
    #: Seconds (plus up to 20% jitter) before a retry under ``"retry"``.
    lock_retry_countdown: ClassVar[float] = 5.0
    #: Seconds to wait for the holder under ``"wait"``.
    lock_wait_timeout: ClassVar[float] = 30.0
    #: How many executions may hold the key at once (a counting semaphore of owner-checked,
    #: expiring slots). Needs a single Redis deployment, not a list of nodes.
    lock_limit: ClassVar[int] = 1
    #: Seconds the key stays held after the run finishes: calls in that window contend, which
    #: makes a beat job run at most once per window even with two beat processes.
    lock_cooldown: ClassVar[float] = 0.0
    #: De-duplicate at enqueue time (see :meth:`apply_async`).
    lock_enqueue: ClassVar[bool] = False
    #: Seconds a queued marker lives if its task never starts.
    lock_enqueue_ttl: ClassVar[float] = 3600.0

    #: Contention failures are expected outcomes: logged without a traceback.
    throws: ClassVar[tuple[type[BaseException], ...]] = (LockContended,)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if LockContended not in cls.throws:
            cls.throws = (*cls.throws, LockContended)
        raw = {name: getattr(cls, name) for name in dir(cls) if name.startswith("lock_")}
        run = inspect.getattr_static(cls, "run")
        params = None
        if run is not Task.__dict__["run"]:
            fun = run.__func__ if isinstance(run, staticmethod) else run
            params = parameters_of(fun, bound=not isinstance(run, staticmethod))
        owner = f"task {cls.__dict__.get('name') or cls.__qualname__}"
        setattr(cls, _engine.OPTIONS_ATTR, validate_options(owner, raw, params))

    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        **options: Any,
    ) -> Any:
        """Publish the call; with ``lock_enqueue``, not if a call of the same key is queued.

        De-duplication, when ``lock_enqueue=True``:

        1. ``delay()``/``apply_async()`` sets the key's queued marker to the new task id,
           unless a marker exists: then it returns that queued task's ``AsyncResult`` instead
           of publishing.
        2. The marker clears when that execution starts (so one call can run while one more
           waits) or after ``lock_enqueue_ttl`` seconds if it never starts.
        3. Retries (``self.retry()``, ``autoretry_for``) always publish: an execution is never
           rejected by a marker. ``app.send_task()`` never looks at markers.
        4. If Redis does not answer, the call is published anyway (never dropped); the lock
           still guarantees exclusion when it runs.
        """
        spec = _engine.spec_of(self)
        if (
            spec is None
            or not spec.options.enqueue
            or options.get("retries")
            or self.app.conf.task_always_eager
        ):
            return super().apply_async(args, kwargs, task_id=task_id, **options)
        task_id = task_id or uuid()
        try:
            queued = _engine.mark_queued(self, args, kwargs, task_id)
        except LockUnavailable as exc:
            logger.warning("%s: enqueue de-duplication skipped, Redis unavailable: %s",
                           self.name, exc)
            queued = None
        if queued is not None and queued != task_id:
            logger.info("%s[%s] not queued: the same call is queued as %s",
                        self.name, task_id, queued)
            return self.AsyncResult(queued)
        return super().apply_async(args, kwargs, task_id=task_id, **options)

    def before_start(self, task_id: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        _engine.enter(self, args, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request_stack.top
        if request is None or request.called_directly:
            return super().__call__(*args, **kwargs)
        if _engine.skipped(request):
            return None
        return self.run(*args, **kwargs)

    def after_return(
        self,
        status: str,
        retval: Any,
        task_id: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        einfo: Any,
    ) -> None:
        _engine.leave(self)
