"""``@single_instance``: the lock of :class:`~celery_redlock.LockedTask` for any task class.

Place it directly under ``@app.task(...)`` or ``@shared_task(...)``, bare or with keywords: the
task options without their ``lock_`` prefix (``by``, ``name``, ``ttl``, ``on_contention``,
``retry_countdown``, ``wait_timeout``, ``limit``, ``cooldown``; the table in
``docs/configuration.md``)::

    @shared_task(bind=True, base=MyAuditedTask)
    @single_instance(by=["account_id"], on_contention="retry")
    def sync_account(self, account_id, full=False): ...

The wrapper runs the same engine path as ``LockedTask``
(:func:`celery_redlock._celery.engine.execute`): it takes the lock before calling the function,
skips it under ``skip``, and releases when the function returns or raises, before Celery stores
the result; the worker receivers cover retries, ``SystemExit`` and dead children exactly as for
``LockedTask``. Options are validated at decoration; combinations with the app's settings that
cannot work are rejected when a worker starts (and at the first lock operation elsewhere).

Called outside a worker (a direct call, or the plain function), the function runs unlocked.

Per-call options (``task.apply_async(..., lock_ttl=5)``, ``lock_bypass=True``) work as for
``LockedTask`` on every published call; an eager call (``apply()``, ``task_always_eager``)
publishes nothing, and the task class's own ``apply()`` drops them, a misspelled one too
(``LockedTask`` has an ``apply()`` that takes them). ``apply_async`` is the task class's,
not ours, so the options are validated by the router that every app gets
(:mod:`celery_redlock._celery.routing`; the decorator gives the apps that exist when it runs a
checking ``amqp_cls``): a bad value raises :class:`~celery_redlock.LockConfigError` in
``apply_async``, finalized app or not, and nothing is published. Where the router cannot be
given (an app with an ``amqp_cls`` of its own that never finalized, a publish with its own
``router=``) only the ``before_task_publish`` receiver sees them, and it cannot make the
publish fail: a bad value is logged at ERROR by the caller, and the worker fails the call
without running the body (:mod:`celery_redlock._celery.calls`).

``enqueue=True`` (``"keep"``) is refused at decoration: it changes what ``delay()`` and
``apply_async()`` return (the queued call's ``AsyncResult``), and a decorator on the function
cannot change the methods of the task class that ``@app.task`` builds around it. Use
``base=LockedTask`` for it. ``enqueue="replace"`` and ``debounce`` work here as with
``LockedTask``: they act when the message is published (:mod:`celery_redlock._celery.supersede`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar, overload

from celery import Task
from celery._state import get_current_task
from celery.local import Proxy

from ._celery import (
    engine,
    routing,
    wiring,  # noqa: F401  (importing it connects the worker receivers)
)
from ._celery.identity import OPTIONS_ATTR, WRAPPERS, check_not_stacked, run_function, spec_of
from ._celery.options import (
    BYPASS,
    OPTIONS,
    EnqueueMode,
    LockBy,
    Policy,
    check_unknown,
    in_keywords,
    parameters_of,
    validate_options,
)
from .exceptions import LockConfigError

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["InstanceOptions", "single_instance"]

F = TypeVar("F", bound=Callable[..., Any])


class InstanceOptions(TypedDict, total=False):
    """The keywords of ``@single_instance``: the rows of the options table (a test pins it)."""

    by: LockBy
    name: str | None
    ttl: float | None
    on_contention: Policy | None
    retry_countdown: float
    wait_timeout: float
    limit: int | None
    cooldown: float
    enqueue: bool | EnqueueMode
    enqueue_ttl: float
    debounce: float | None
    debounce_max: float | None
    rate: str | None
    retry_for: float


_WRONG_ORDER = (
    "@single_instance must be placed directly under @app.task(...) or @shared_task(...), "
    "so that it wraps the function, not the task:\n\n"
    "    @app.task\n    @single_instance{options}\n    def {name}(...): ...\n"
)


@overload
def single_instance(fun: F, /) -> F: ...


@overload
def single_instance(**options: Unpack[InstanceOptions]) -> Callable[[F], F]: ...


def single_instance(fun: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    """Make a task function mutually exclusive per (lock name, arguments)."""
    if fun is not None:
        return _decorate(fun, options)
    return lambda f: _decorate(f, options)


def _label(fun: Any) -> str:
    """The name of the function behind ``fun`` (a task, a task's lazy proxy, or else)."""
    try:
        # A task's class is named after its function; a proxy builds its task to tell.
        task = fun._get_current_object() if isinstance(fun, Proxy) else fun
        name = type(task).__name__ if isinstance(task, Task) else task.__name__
    except Exception:
        name = None
    return name if isinstance(name, str) and name.isidentifier() else "my_task"


def _runs(task: Any, wrapper: Any) -> bool:
    """Whether ``task`` runs ``wrapper`` (and not a task calling the wrapped function as a
    plain function). Celery's task class holds ``run`` itself (a ``staticmethod``, or the
    function for ``bind=True``): read there, without :func:`inspect.getattr_static`'s walk."""
    run = vars(type(task)).get("run")
    if run is None:
        return run_function(task)[0] is wrapper
    return getattr(run, "__func__", run) is wrapper


def _decorate(fun: Any, options: dict[str, Any]) -> Any:
    if isinstance(fun, (str, list, tuple)):  # @single_instance(["account_id"])
        raise LockConfigError(
            f"@single_instance takes its options as keywords, got {fun!r} positionally; "
            f"expected @single_instance(by={fun!r}) (or name=, ttl=, ...)"
        )
    if isinstance(fun, (Proxy, Task)) or not inspect.isfunction(fun):
        given = ", ".join(f"{name}={value!r}" for name, value in options.items())
        raise LockConfigError(
            _WRONG_ORDER.format(name=_label(fun), options=f"({given})" if given else "")
        )
    owner = f"task function {fun.__module__}.{fun.__qualname__}"
    for name in options:
        if name.startswith("lock_") and name[len("lock_") :] in OPTIONS:
            raise LockConfigError(
                f"{owner}: unknown @single_instance keyword {name!r}; drop the lock_ prefix: "
                f"{name[len('lock_') :]}= (the lock_ names are the task options of "
                "base=LockedTask)"
            )
    if "bypass" in options or BYPASS in options:
        raise LockConfigError(
            f"{owner}: unknown @single_instance keyword "
            f"{'bypass' if 'bypass' in options else BYPASS!r}: it is given per call, not to "
            f"the task (task.apply_async(..., {BYPASS}=True))"
        )
    check_unknown(owner, list(options), list(OPTIONS), "@single_instance keyword")
    if options.get("enqueue") in (True, "keep", "until_executed"):
        raise LockConfigError(
            f"{owner}: keyword enqueue={options['enqueue']!r} is not supported by "
            f"@single_instance; expected base=LockedTask with lock_enqueue={options['enqueue']!r} "
            "(keeping the queued call changes what delay() "
            "returns, which only the task class can do)"
        )
    raw = {OPTIONS[name].attr: value for name, value in options.items()}
    routing.adopt_all()  # the app of this task, unknown here, checks per-call options
    # bind=True is not known yet: check lock_by names against every parameter.
    try:
        validated = validate_options(owner, raw, parameters_of(fun, bound=False))
    except LockConfigError as exc:
        raise LockConfigError(in_keywords(owner, str(exc))) from exc.__cause__

    @functools.wraps(fun)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        # What celery.current_task resolves to, without its proxy (about 3,700 instructions
        # an execution); wiring imports from celery._state too, and every Celery of the
        # test matrix runs this wrapper.
        task = get_current_task()
        if task is None:
            return fun(*args, **kwargs)
        # A misconfiguration is refused here even on a plain call (an eager call has no
        # worker start or publish checks).
        spec = spec_of(task)
        if not _runs(task, wrapper):  # a plain call from a task, or a decorator in between
            check_not_stacked(task)  # or a @single_instance above this one: refused
            return fun(*args, **kwargs)
        call_args = args[1:] if spec is not None and spec.bound else args
        return engine.execute(
            task, call_args, kwargs, lambda: fun(*args, **kwargs), task.request_stack.top, spec
        )

    wrapper.__signature__ = inspect.signature(fun)  # type: ignore[attr-defined]
    setattr(wrapper, OPTIONS_ATTR, validated)
    WRAPPERS.add(wrapper)
    return wrapper
