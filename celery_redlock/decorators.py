"""``@single_instance``: the lock of :class:`~celery_redlock.LockedTask` for any task class.

Place it directly under ``@app.task(...)`` or ``@shared_task(...)``, bare or with options that
mirror the task options (``by`` = ``lock_by``, ``name`` = ``lock_name``, ``ttl`` = ``lock_ttl``,
``on_contention``, ``retry_countdown``, ``wait_timeout``, ``limit``, ``cooldown``)::

    @shared_task(bind=True, base=MyAuditedTask)
    @single_instance(by=["account_id"], on_contention="retry")
    def sync_account(self, account_id, full=False): ...

The wrapper runs the same engine as ``LockedTask`` (:mod:`celery_redlock._engine`): it takes
the lock before calling the function, skips it under ``skip``, and releases when the function
returns or raises; the worker receivers cover retries, ``SystemExit`` and dead children exactly
as for ``LockedTask``. Options are validated at import time (decoration).

Called outside a worker (a direct call, or the plain function), the function runs unlocked.
Enqueue-time de-duplication (``lock_enqueue``) needs ``base=LockedTask``: a decorator on the
function cannot change what ``delay()`` returns.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, overload

from celery import Task, current_task
from celery.local import Proxy

from . import _engine
from .config import Policy, parameters_of, validate_options

__all__ = ["single_instance"]

F = TypeVar("F", bound=Callable[..., Any])

_WRONG_ORDER = (
    "@single_instance must be placed directly under @app.task(...) or @shared_task(...), "
    "so that it wraps the function, not the task:\n\n"
    "    @app.task\n    @single_instance\n    def {name}(...): ...\n"
)


@overload
def single_instance(fun: F, /) -> F: ...


@overload
def single_instance(
    *,
    by: Sequence[str] | Callable[[tuple[Any, ...], dict[str, Any]], str] | None = None,
    name: str | None = None,
    ttl: float | None = None,
    on_contention: Policy | None = None,
    retry_countdown: float | None = None,
    wait_timeout: float | None = None,
    limit: int | None = None,
    cooldown: float | None = None,
) -> Callable[[F], F]: ...


def single_instance(
    fun: Callable[..., Any] | None = None,
    /,
    *,
    by: Sequence[str] | Callable[[tuple[Any, ...], dict[str, Any]], str] | None = None,
    name: str | None = None,
    ttl: float | None = None,
    on_contention: Policy | None = None,
    retry_countdown: float | None = None,
    wait_timeout: float | None = None,
    limit: int | None = None,
    cooldown: float | None = None,
) -> Any:
    """Make a task function mutually exclusive per (lock name, arguments)."""
    given = {
        "lock_by": by,
        "lock_name": name,
        "lock_ttl": ttl,
        "lock_on_contention": on_contention,
        "lock_retry_countdown": retry_countdown,
        "lock_wait_timeout": wait_timeout,
        "lock_limit": limit,
        "lock_cooldown": cooldown,
    }
    raw = {k: v for k, v in given.items() if v is not None}
    if fun is not None:
        return _decorate(fun, raw)
    return lambda f: _decorate(f, raw)


def _decorate(fun: Any, raw: dict[str, Any]) -> Any:
    if isinstance(fun, (Proxy, Task)) or not inspect.isfunction(fun):
        label = getattr(fun, "__name__", None) if not isinstance(fun, Proxy) else None
        raise TypeError(_WRONG_ORDER.format(name=label or "my_task"))
    owner = f"task function {fun.__module__}.{fun.__qualname__}"
    # bind=True is not known yet: check lock_by names against every parameter.
    options = validate_options(owner, raw, parameters_of(fun, bound=False))

    @functools.wraps(fun)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        task = current_task._get_current_object()
        if task is None or _engine.run_function(task)[0] is not wrapper:
            return fun(*args, **kwargs)
        spec = _engine.spec_of(task)
        call_args = args[1:] if spec is not None and spec.bound else args
        if not _engine.enter(task, call_args, kwargs):
            return None
        try:
            return fun(*args, **kwargs)
        finally:
            _engine.leave(task)

    wrapper.__signature__ = inspect.signature(fun)  # type: ignore[attr-defined]
    setattr(wrapper, _engine.OPTIONS_ATTR, options)
    return wrapper
