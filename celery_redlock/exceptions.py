"""Exceptions raised by celery-redlock.

Every exception derives from :class:`RedlockError`, so one ``except RedlockError`` catches
anything this package raises on purpose::

    RedlockError
     ├── LockContended      another owner holds the key and we could not get it in time
     │    └── RateLimited   the key's lock_rate is used up until a later slot
     ├── LockUnavailable    Redis could not be reached (or no quorum of nodes answered)
     ├── LockLost           the lock expired or changed owner while we believed we held it
     ├── LockNotOwned       release() or extend() of a lock this object does not hold
     └── LockConfigError    a bad task option or app setting (also a ValueError/TypeError)

The context attributes (``key``, ``holder``, ``ttl``) are keyword-only so that an exception
rebuilt by Celery's result backend from ``(message,)`` alone still constructs: on the caller's
side the message survives, the attributes are ``None``.
"""

from __future__ import annotations

__all__ = [
    "LockConfigError",
    "LockContended",
    "LockLost",
    "LockNotOwned",
    "LockUnavailable",
    "RateLimited",
    "RedlockError",
]


class RedlockError(Exception):
    """Root of every error celery-redlock raises.

    ``key`` is the Redis key involved, when there is one.
    """

    def __init__(self, message: str = "", *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class LockContended(RedlockError):
    """The lock is held by another owner and could not be acquired in time.

    ``holder`` is the task id stored by the current holder (``""`` for a lock taken outside a
    task, ``None`` when unknown), ``ttl`` its remaining time to live in seconds.
    """

    def __init__(
        self,
        message: str = "",
        *,
        key: str | None = None,
        holder: str | None = None,
        ttl: float | None = None,
    ) -> None:
        super().__init__(message, key=key)
        self.holder = holder
        self.ttl = ttl


class RateLimited(LockContended):
    """The key's ``lock_rate`` is used up: no start is allowed before a later slot.

    A task call over its rate is retried with this as the reason (never failed for it);
    ``retry_after`` is the number of seconds until the slot promised to it, ``None`` when
    unknown (an exception rebuilt by the result backend).
    """

    def __init__(
        self, message: str = "", *, key: str | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message, key=key)
        self.retry_after = retry_after


class LockUnavailable(RedlockError):
    """Redis did not answer, so nothing is known about the lock.

    ``nodes`` names the Redis nodes that failed (one entry per node, host:port).
    """

    def __init__(
        self, message: str = "", *, key: str | None = None, nodes: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message, key=key)
        self.nodes = nodes


class LockLost(RedlockError):
    """The lock expired or was taken over while its holder was still running."""


class LockNotOwned(RedlockError):
    """``release()`` or ``extend()`` was called on a lock this object does not hold."""


class LockConfigError(RedlockError, ValueError, TypeError):
    """A task option or app setting is misspelled, of the wrong type, or out of range.

    It is both a :class:`ValueError` and a :class:`TypeError` so that code written against
    either builtin catches it; the message names the task, the option and what was expected.
    """
