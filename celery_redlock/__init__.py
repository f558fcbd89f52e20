"""celery-redlock: mutual exclusion for Celery tasks through owner-checked Redis locks.

The Redis layer (:class:`Lock` and the exceptions) imports without Celery; the Celery layer
(``LockedTask``, ``single_instance``, ``current_lock``, ``current_fencing_token``,
``lock_key``) is imported on first access, so ``from celery_redlock import Lock`` works in a
process that never loads Celery.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._redis.lock import Lock
from .exceptions import (
    LockConfigError,
    LockContended,
    LockLost,
    LockNotOwned,
    LockUnavailable,
    RateLimited,
    RedlockError,
)

if TYPE_CHECKING:
    from ._celery.engine import current_fencing_token, current_lock
    from ._celery.identity import lock_key
    from .decorators import single_instance
    from .task import LockedTask

__all__ = [
    "Lock",
    "LockConfigError",
    "LockContended",
    "LockLost",
    "LockNotOwned",
    "LockUnavailable",
    "LockedTask",
    "RateLimited",
    "RedlockError",
    "current_fencing_token",
    "current_lock",
    "lock_key",
    "single_instance",
]

__version__ = "0.2.0.dev0"

_CELERY_LAYER = {
    "LockedTask": "celery_redlock.task",
    "single_instance": "celery_redlock.decorators",
    "current_lock": "celery_redlock._celery.engine",
    "current_fencing_token": "celery_redlock._celery.engine",
    "lock_key": "celery_redlock._celery.identity",
}


def __getattr__(name: str) -> Any:
    module = _CELERY_LAYER.get(name)
    if module is None:
        raise AttributeError(f"module 'celery_redlock' has no attribute {name!r}")
    # The worker wiring comes with the Celery layer: its router refuses a lock_* option given
    # to a task that does not read it (base=LockedTask forgotten) at the first delay(), also
    # in a process that imports only current_fencing_token or lock_key.
    importlib.import_module("celery_redlock._celery.wiring")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    """The module's names with the Celery layer's (tab completion, ``inspect.getmembers``)."""
    return sorted({*globals(), *__all__})
