"""``celery -A proj redlock ...``: list, inspect and release the locks of an app; show counters.

Installed through the ``celery.commands`` entry point, so Celery's own ``-A`` option picks the
app (its ``redlock_*`` settings say where the locks are)::

    celery -A proj redlock ls [--json]               every held lock: key, holder, TTL, fence
    celery -A proj redlock inspect KEY [--json]      one lock (its key or name; a task or lock
                                                     name: each of its held locks), whether its
                                                     holder is alive, its per-call overrides
    celery -A proj redlock inspect --task-id ID      the locks held by one task id
    celery -A proj redlock release KEY [--force]     owner-checked release of one lock
    celery -A proj redlock release --dead            release the locks of workers that are gone
    celery -A proj redlock stats [--json]            event counters per task

The package reads like the design: the inventory (what is held, releases, counters) is the
Redis layer's :mod:`celery_redlock._redis.inventory`; here are the click group and what its
commands share (:mod:`._group`), whether a holder is alive (:mod:`._liveness`: a control ping
and the lease's renewal; its docstring tells the hazards of ``--dead`` as timelines), how rows
are printed (:mod:`._format`) and the commands (:mod:`._commands`). A new subcommand joins with
``@redlock.command()`` in a module imported here.
"""

from __future__ import annotations

from .._celery import entry as _entry  # noqa: F401  (wires a worker or beat when it starts)
from .._redis.inventory import PAGE, HeldLock
from ..web._command import web as _web  # click only: the web extra loads when it runs
from . import _commands  # noqa: F401  (registers the commands on the group)
from ._group import LockStore, redlock
from ._liveness import liveness

redlock.add_command(_web)

__all__ = ["PAGE", "HeldLock", "LockStore", "liveness", "redlock"]
