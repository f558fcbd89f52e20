"""celery-redlock: mutual exclusion for Celery tasks through owner-checked Redis locks."""

from ._engine import current_lock, lock_key
from ._worker import state as _worker_state  # noqa: F401  (connects the worker receivers)
from .decorators import single_instance
from .exceptions import (
    LockConfigError,
    LockContended,
    LockLost,
    LockNotOwned,
    LockUnavailable,
    RedlockError,
)
from .lock import Lock
from .task import LockedTask

__all__ = [
    "Lock",
    "LockConfigError",
    "LockContended",
    "LockLost",
    "LockNotOwned",
    "LockUnavailable",
    "LockedTask",
    "RedlockError",
    "current_lock",
    "lock_key",
    "single_instance",
]

__version__ = "0.1.0"
