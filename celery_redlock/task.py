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
from typing import Any, ClassVar

from celery import Task

from . import _engine
from .config import LockBy, Policy, parameters_of, validate_options
from .exceptions import LockContended

__all__ = ["LockedTask"]


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
