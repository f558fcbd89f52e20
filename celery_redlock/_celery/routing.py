"""A bad per-call ``lock_*`` option raises in the caller, for every task: a task router.

``LockedTask.apply_async`` validates its per-call options itself. ``@single_instance`` tasks
(whose ``apply_async`` is their task class's) and ``app.send_task`` pass them on to Celery as
message properties, and the ``before_task_publish`` receiver that moves them into the message's
header cannot fail the publish: Celery's ``Signal.send`` logs what a receiver raises. A router
can. On Celery 5.3 through 5.7, ``Celery.send_task`` asks ``app.amqp.router`` for the call's
route before it builds the message, and the router calls each entry of its ``routes`` list as
``route(name, args, kwargs, options, task=task_type)``, letting what it raises through
``apply_async``, ``delay`` and ``send_task``. :func:`check_lock_options` is such an entry: it
validates the ``lock_*`` keys of ``options`` with :func:`celery_redlock._celery.calls.take`
(on a copy: the receiver still moves them) and returns ``None``, so every call is routed as
without it, by the ``task_routes`` setting. It must come first: the lookup stops at the first
entry that returns a route.

Two ways put it there:

* :func:`adopt`, for an app that has not built its ``app.amqp`` yet (Celery builds it at the
  first publish, or when the app finalizes): the app's ``amqp_cls``, Celery's own extension
  point, becomes :class:`CheckedAMQP`, whose every router (the first, and each one Celery
  builds again when ``task_routes`` changes) has the check first. ``wiring`` adopts every app
  that exists when it is imported, and makes :class:`CheckedAMQP` the default of the apps
  created after (:func:`adopt_later`: ``Celery.amqp_cls``, which ``Celery()`` copies when not
  given ``amqp=``); ``@single_instance`` adopts every app that exists when it decorates,
  ``LockedTask`` the app it is bound to. So the first ``delay()`` of an ``@app.task`` task in a
  process whose app never finalizes (a client, a shell) is checked too, also in the usual
  layout: ``from celery_redlock import LockedTask``, then ``app = Celery(...)``, then the tasks
  (bound lazily: a ``@app.task(lock_by=...)`` without ``base=LockedTask`` was published, and
  ran unlocked, until a worker refused to start).
* :func:`install`, for an app whose ``app.amqp`` was built before (or whose ``amqp_cls`` is
  the user's own), when it finalizes (``wiring`` connects it, and installs it on the apps
  finalized before the import). Celery caches the router and builds a new one when
  ``task_routes`` changes, so :func:`install` also puts the check back then:

  1. the app finalizes: :func:`install` builds ``app.amqp.router`` (Celery would at the first
     publish), puts the check first in its ``routes``, and observes ``app.conf`` after
     Celery's own observer (``AMQP`` binds it when the app first uses ``app.amqp``);
  2. ``app.conf.update(task_routes=...)``: Celery's observer builds a new router, without the
     check (Celery 5.3 does it for every app with a router, whichever app was updated);
  3. ours, next, puts the check first in the new router, before any publish can use it.

Hazards:

* with :func:`install` (not for an adopted app), the router is built when the app finalizes,
  not at its first publish: ``task_routes`` and ``task_queues`` assigned
  (``app.conf.task_queues = ...``) between the two are not seen (after the first publish
  Celery does not see them either; ``app.conf.update(task_routes=...)`` still applies, step 2);
* an app created after every task of ours was defined, whose own ``amqp_cls`` is not Celery's,
  or that publishes without asking ``app.amqp.router`` (``send_task(..., router=...)``, a
  router assigned to ``app.amqp.router`` by hand) and never finalizes is checked only by the
  ``before_task_publish`` receiver: the bad value is logged at ERROR and the worker fails the
  call (:mod:`celery_redlock._celery.calls`).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Mapping
from typing import Any

from celery import Celery, current_task
from celery._state import _get_active_apps
from celery.app.amqp import AMQP
from celery.canvas import Signature

from . import calls
from .identity import MAPPERS, check_ignored_options, check_not_mapped, lock_name_for, spec_of
from .options import supersedes, warn_when_logged

logger = logging.getLogger("celery_redlock.config")

#: The apps :func:`install` has seen (an app is installed once).
_installed: weakref.WeakSet[Any] = weakref.WeakSet()


#: The task of the call this thread is publishing: set by :func:`check_lock_options`, read
#: (once) by :func:`routed_task` from the ``before_task_publish`` receiver that follows.
_routing = threading.local()


def check_lock_options(
    name: str, args: Any, kwargs: Any, options: dict[str, Any], task: Any = None, **_: Any
) -> None:
    """A router that routes nothing: raise :class:`~celery_redlock.LockConfigError` for a bad
    per-call ``lock_*`` option in ``options`` (naming the task, the option and what was
    expected), return ``None`` otherwise. Notes ``task`` for :func:`routed_task`. The first
    call of a task also refuses ``lock_*`` options the task does not read
    (:func:`celery_redlock._celery.identity.check_ignored_options`) and a lock the task cannot
    take (:func:`~celery_redlock._celery.identity.spec_of`: ``by=["self"]`` on a bound task):
    no worker would run the call, so it is not published. So is a call of a ``replace`` or
    debounce task whose lock name cannot be built (a ``lock_by`` callable that raises, or
    arguments that do not bind), as ``LockedTask.apply_async`` refuses one under ``keep``:
    the receiver that numbers the call cannot fail the publish, and the worker would fail it
    (a publish from inside the task itself is left to the receiver: :func:`_inside`).
    A ``lock_*`` option given to a call of a task that takes no lock (``base=LockedTask``
    forgotten) is warned about (:func:`_warn_unlocked`), and so are the app's misspelled
    settings, once (a process that only sends tasks may never finalize its app). A ``map()``,
    ``starmap()`` or ``chunks()`` of a locked task is refused (:func:`_check_mapped`)."""
    note(task)
    spec = None
    if task is not None:
        warn_when_logged(task.app)
        check_ignored_options(task)
        spec = spec_of(task)
    mapper = name if task is None else task.name  # a mapper is routed by its task's name
    if mapper in MAPPERS:
        _check_mapped(task, mapper, kwargs)
    raw = {n: v for n, v in options.items() if isinstance(n, str) and n.startswith("lock_")}
    header = None
    if raw and task is not None and spec is None:
        _warn_unlocked(name, raw)
        _routing.unlocked = name
    elif raw:
        header = calls.take(f"task {name}", raw)
    if spec is not None and supersedes(spec.options) and not _inside(task):
        if header is None:  # LockedTask.apply_async took them, into the message's headers
            header = (options.get("headers") or {}).get(calls.HEADER)
        if not (isinstance(header, Mapping) and calls.bypassed(header)):
            _routing.lock_name = (task, args, kwargs, lock_name_for(task, spec, args, kwargs))


def _check_mapped(task: Any, name: str, kwargs: Any) -> None:
    """Refuse, in the caller, a ``map()``, ``starmap()`` or ``chunks()`` of a locked task,
    whose worker would refuse every item (:func:`.identity.check_not_mapped`).
    ``kwargs["task"]`` is the signature of the mapped task, as Celery's builtins take it;
    ``task``, the builtin, is ``None`` where the app has not finalized."""
    sig = kwargs.get("task") if isinstance(kwargs, Mapping) else None
    if not isinstance(sig, Mapping):
        return
    if isinstance(sig, Signature):
        tasks = sig.app.tasks
    elif task is not None:
        tasks = task.app.tasks
    else:
        return
    mapped = tasks.get(sig.get("task"))
    if mapped is not None:
        check_not_mapped(mapped, name)


def _inside(task: Any) -> bool:
    """Whether this publish comes from an execution of ``task`` itself: its retry, a requeue
    by the lock, or a call it makes of its own task. Its lock name is left to the receiver
    (:func:`celery_redlock._celery.supersede.on_publish`), which numbers no republish. Timeline
    it keeps out: (1) a ``lock_by`` callable reads a database; (2) the database blips as the
    call's ``self.retry()`` publishes; (3) an error here would make Celery reject the retry
    (``Reject(requeue=False)``): the call would be dropped, where the retry had to run."""
    running = current_task._get_current_object()
    return running is not None and running.name == task.name and not running.request.called_directly


def routed_lock_name(task: Any, args: Any, kwargs: Any) -> str | None:
    """The lock name :func:`check_lock_options` built for this thread's call of ``task`` with
    ``args`` and ``kwargs``, once; else ``None``. (A ``lock_by`` callable is called once per
    publish.) The arguments are compared too. Timeline without it: (1) a publish is routed and
    its name noted; (2) it fails before the message is built; (3) the next publish of that task
    in this thread is not routed (``send_task(..., router=...)``), and its receiver would
    number it under the first call's key."""
    noted = getattr(_routing, "lock_name", None)
    _routing.lock_name = None
    if noted is None or noted[0] is not task:
        return None
    _, noted_args, noted_kwargs, name = noted
    try:  # Celery hands the same objects on; else equal ones (a list for a tuple)
        same = (noted_args is args or tuple(noted_args or ()) == tuple(args or ())) and (
            noted_kwargs is kwargs or dict(noted_kwargs or {}) == dict(kwargs or {})
        )
    except Exception:  # an argument whose == raises (an array): build the name again
        return None
    return str(name) if same else None


#: The tasks without a lock already warned about a per-call ``lock_*`` option.
_warned_unlocked: set[str] = set()


def _warn_unlocked(name: str, raw: dict[str, Any]) -> None:
    """Warn, once per task and process, that a call of task ``name``, which takes no lock, was
    given ``lock_*`` options: Celery publishes them as message properties nothing reads.

    A warning, not an error: Celery itself hands a group's or chord's options to every part
    (a published chain's ``apply_async`` options reach its first step only; an eager one's
    reach every step). Timeline of
    an error here: (1) ``chord([locked.s(1), locked.s(2)], plain.s()).apply_async(
    lock_wait_timeout=5)`` publishes the locked header; (2) they run; (3) the worker publishes
    the body ``plain`` with the chord's options, which it copied; (4) the refusal fails the
    whole chord after its header did its work.
    """
    if name in _warned_unlocked:
        return
    _warned_unlocked.add(name)
    logger.warning(
        "task %s takes no lock, so the per-call option %s is ignored (a task with "
        "base=LockedTask or @single_instance reads it; a group or chord passes its options "
        "to every part, a published chain to its first step)",
        name,
        ", ".join(sorted(raw)),
    )


def note(task: Any) -> None:
    """Note ``task`` as the task of the call this thread is about to publish.

    ``LockedTask.apply_async`` notes itself too: an app whose ``amqp`` was built, by a
    concurrent first publish, before it could be given the checking router has no
    :func:`check_lock_options` to note it.
    """
    _routing.task = task
    _routing.lock_name = None
    _routing.unlocked = None


def routed_unlocked(name: str) -> bool:
    """Whether this thread's last routed call was of task ``name`` that takes no lock, its
    ``lock_*`` options warned about as ignored (:func:`_warn_unlocked`); once (the receiver's
    :func:`~.calls.move_from_properties` then warns of a bad one, not an ERROR)."""
    unlocked = getattr(_routing, "unlocked", None)
    _routing.unlocked = None
    return bool(unlocked == name)


def routed_task(name: str) -> Any:
    """The task this thread's last routed call named ``name`` (its app's), once; else ``None``.

    ``Celery.send_task`` routes a call, then publishes it, in one thread, so the
    ``before_task_publish`` receiver finds the task (with its app) that the signal does not
    carry. The note is taken, so a later publish never reads a stale one.
    """
    task = getattr(_routing, "task", None)
    _routing.task = None
    return task if getattr(task, "name", None) == name else None


def _put_first(router: Any) -> None:
    """Make :func:`check_lock_options` the first entry of ``router.routes``."""
    routes = router.routes
    if routes and routes[0] is check_lock_options:
        return
    if isinstance(routes, list):  # the list of app.amqp.routes: keep sharing it
        routes.insert(0, check_lock_options)
    else:  # () when task_routes is unset
        router.routes = [check_lock_options, *routes]


def install(app: Any) -> None:
    """Put :func:`check_lock_options` first in ``app``'s router, now and whenever Celery
    builds a new one (see the module docstring). Once per app: later calls do nothing, and so
    does a call for an adopted app (its routers check by themselves, and are built when Celery
    builds them)."""
    if app in _installed or app.amqp_cls == CHECKED_AMQP:
        return
    _installed.add(app)
    amqp = app.amqp

    def on_conf_update(*_: Any, **__: Any) -> None:
        _put_first(amqp.router)

    _put_first(amqp.router)
    app.conf.bind_to(on_conf_update)


class CheckedAMQP(AMQP):  # type: ignore[misc]
    """Celery's ``AMQP`` whose every router has :func:`check_lock_options` first."""

    def Router(self, queues: Any = None, create_missing: Any = None) -> Any:
        router = super().Router(queues, create_missing)
        _put_first(router)
        return router


#: ``Celery.amqp_cls`` values :func:`adopt` replaces: Celery's default, by path or by class.
CELERY_AMQP = ("celery.app.amqp:AMQP", AMQP)

#: What :func:`adopt` sets: a path, so that an app pickled for another process keeps it.
CHECKED_AMQP = f"{__name__}:CheckedAMQP"


def adopt(app: Any) -> None:
    """Give ``app`` :class:`CheckedAMQP` if it has not built its ``amqp`` yet and uses
    Celery's (see the module docstring); otherwise do nothing."""
    if "amqp" not in app.__dict__ and app.amqp_cls in CELERY_AMQP:
        app.amqp_cls = CHECKED_AMQP


def adopt_all() -> None:
    """:func:`adopt` every app of this process."""
    for app in list(_get_active_apps()):
        adopt(app)


def adopt_later() -> None:
    """Make :class:`CheckedAMQP` the ``amqp_cls`` of every app created from now on, unless
    ``Celery.amqp_cls`` is already another than Celery's (then those apps route their own way)."""
    if Celery.amqp_cls in CELERY_AMQP:
        Celery.amqp_cls = CHECKED_AMQP
