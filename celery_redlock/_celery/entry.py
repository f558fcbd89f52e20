"""What the ``celery.commands`` entry point wires in every ``celery`` process: the worker wiring
(:mod:`celery_redlock._celery.wiring`), imported when a worker or a beat starts.

Celery loads the entry point (:mod:`celery_redlock.cli`) in every ``celery`` command, but the
wiring is imported only by ``LockedTask`` and ``@single_instance``, and ``celery redlock ls``
must not load it. Timeline without this module: (1) a new user writes
``@app.task(lock_by=["account_id"])``, forgetting ``base=LockedTask``, in a project that
imports nothing else of ours; (2) ``celery -A proj worker`` starts without a word, since the
check that refuses options nobody reads is the wiring's; (3) two calls of account 42 run at
once. So the first ``worker_init`` (``beat_init``) of an app with a ``redlock_*`` setting (any
spelling: ``redlock_url``, ``CELERY_REDLOCK_URL``...) imports the wiring, which then refuses
the worker (checks the schedule) as if a locked task had imported it. A process that had
imported it already is left to the wiring's own receivers.

An app without such a setting is left alone: the package may be installed beside projects
that do not use it, whose tasks may have attributes of our names for locks of their own.
Timeline otherwise: (1) a project's own lock base reads ``lock_ttl``, and nothing imports
celery-redlock; (2) the wiring, loaded by the entry point, refuses the worker ("lock_ttl is
ignored"), and beat's publishes of the task fail at every tick. A project that uses the
package only through the Redis broker's fallback (no ``redlock_*`` setting) and forgot
``base=LockedTask`` everywhere is not caught here: it imports nothing of ours.

This module imports no more than Celery's signals: the wiring loads only when a worker or a
beat starts.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from celery import signals

__all__: list[str] = []

_WIRING = "celery_redlock._celery.wiring"


def _configured(app: Any) -> bool:
    """Whether ``app`` has a ``redlock_*`` setting, in any spelling: it uses celery-redlock."""
    try:
        keys = [key.lower() for key in list(app.conf.keys()) if isinstance(key, str)]
    except Exception:  # a conf that cannot be read: not ours to judge
        return False
    return any(key.startswith("redlock_") or "_redlock_" in key for key in keys)


@signals.worker_init.connect(weak=False)
def _on_worker_init(sender: Any = None, **_: Any) -> None:
    if _WIRING not in sys.modules and _configured(getattr(sender, "app", None)):
        # Its own worker_init receiver connects during this send, too late to be called.
        importlib.import_module(_WIRING).on_worker_init(sender=sender)


@signals.beat_init.connect(weak=False)
def _on_beat_init(sender: Any = None, **_: Any) -> None:
    if _WIRING not in sys.modules and _configured(getattr(sender, "app", None)):
        wiring = importlib.import_module(_WIRING)
        wiring.on_logging_set_up()
        wiring.check_beat_schedule(sender=sender)
