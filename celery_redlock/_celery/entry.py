"""What the ``celery.commands`` entry point wires in every ``celery`` process: the worker wiring
(:mod:`celery_redlock._celery.wiring`), imported when a worker or a beat starts.

Celery loads the entry point (:mod:`celery_redlock.cli`) in every ``celery`` command, but the
wiring is imported only by ``LockedTask`` and ``@single_instance``, and ``celery redlock ls``
must not load it. Timeline without this module: (1) a new user writes
``@app.task(lock_by=["account_id"])``, forgetting ``base=LockedTask``, in a project that
imports nothing else of ours; (2) ``celery -A proj worker`` starts without a word, since the
check that refuses options nobody reads is the wiring's; (3) two calls of account 42 run at
once. So the first ``worker_init`` (``beat_init``) imports the wiring, which then refuses the
worker (checks the schedule) as if a locked task had imported it. A process that had imported
it already is left to the wiring's own receivers.

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


@signals.worker_init.connect(weak=False)
def _on_worker_init(sender: Any = None, **_: Any) -> None:
    if _WIRING not in sys.modules:
        # Its own worker_init receiver connects during this send, too late to be called.
        importlib.import_module(_WIRING).on_worker_init(sender=sender)


@signals.beat_init.connect(weak=False)
def _on_beat_init(sender: Any = None, **_: Any) -> None:
    if _WIRING not in sys.modules:
        wiring = importlib.import_module(_WIRING)
        wiring.on_logging_set_up()
        wiring.check_beat_schedule(sender=sender)
