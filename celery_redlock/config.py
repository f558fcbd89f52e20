"""Settings: ``app.conf.redlock_*`` and the ``lock_*`` task options, validated and resolved.

Precedence is *task option > app setting > default*. App settings are read lazily (at the first
lock operation, not at import) and resolved once per app into a frozen :class:`Settings`; task
options are validated when Celery builds the task class, so a typo fails at registration.

With ``config_from_object(obj, namespace="CELERY")`` the settings are spelled
``CELERY_REDLOCK_URL`` and so on; Celery strips the prefix, and they arrive here as
``redlock_url``.

``redlock_url`` missing: if the broker is Redis (``redis://``, ``rediss://``, ``unix://``) its
URL is used, with one INFO log line saying so; otherwise the first lock operation raises
:class:`~celery_redlock.LockConfigError`.
"""

from __future__ import annotations

import difflib
import inspect
import logging
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ._clients import SCHEMES
from .exceptions import LockConfigError

__all__ = ["OPTION_DEFAULTS", "Settings", "TaskLockOptions", "settings_for"]

logger = logging.getLogger("celery_redlock.config")

Policy = Literal["skip", "retry", "fail", "wait"]
UnavailablePolicy = Literal["retry", "fail", "run"]
LockBy = Callable[[tuple[Any, ...], dict[str, Any]], str] | Sequence[str] | None

POLICIES: tuple[str, ...] = ("skip", "retry", "fail", "wait")
UNAVAILABLE_POLICIES: tuple[str, ...] = ("retry", "fail", "run")

#: Task options and their defaults (``lock_on_contention`` falls back to the app setting).
OPTION_DEFAULTS: dict[str, Any] = {
    "lock_by": None,
    "lock_name": None,
    "lock_ttl": None,
    "lock_on_contention": None,
    "lock_retry_countdown": 5.0,
    "lock_wait_timeout": 30.0,
    "lock_limit": 1,
    "lock_cooldown": 0.0,
    "lock_enqueue": False,
    "lock_enqueue_ttl": 3600.0,
}

#: App settings and their defaults.
SETTING_DEFAULTS: dict[str, Any] = {
    "redlock_url": None,
    "redlock_prefix": "redlock",
    "redlock_lease": 30.0,
    "redlock_ttl_margin": 5.0,
    "redlock_on_contention": "skip",
    "redlock_on_unavailable": "retry",
}


@dataclass(frozen=True)
class Settings:
    """The ``redlock_*`` settings of one app, validated."""

    #: One URL, or a tuple of 3, 5, ... URLs of independent nodes (the Redlock quorum).
    url: str | tuple[str, ...]
    prefix: str
    lease: float
    ttl_margin: float
    on_contention: Policy
    on_unavailable: UnavailablePolicy


@dataclass(frozen=True)
class TaskLockOptions:
    """The ``lock_*`` options of one task, validated (``None`` = use the app setting)."""

    by: LockBy
    name: str | None
    ttl: float | None
    on_contention: Policy | None
    retry_countdown: float
    wait_timeout: float
    #: How many executions may hold the key at once (a counting semaphore).
    limit: int = 1
    #: Seconds the key stays held after the run finishes ("at most once per window").
    cooldown: float = 0.0
    #: De-duplicate at enqueue time: a call whose key is already queued is not queued again.
    enqueue: bool = False
    #: Seconds a queued marker lives if its task never starts.
    enqueue_ttl: float = 3600.0


def _number(owner: str, option: str, value: Any, *, allow_none: bool, allow_zero: bool) -> Any:
    if value is None and allow_none:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and (value > 0 or (allow_zero and value == 0)):
        return float(value)
    expected = "a number of seconds " + (">= 0" if allow_zero else "> 0")
    if allow_none:
        expected += " or None"
    raise LockConfigError(f"{owner}: option {option}={value!r} is invalid; expected {expected}")


def _choice(owner: str, option: str, value: Any, choices: tuple[str, ...]) -> Any:
    if value in choices:
        return value
    hint = difflib.get_close_matches(str(value), choices, n=1)
    did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
    raise LockConfigError(
        f"{owner}: option {option}={value!r} is invalid; expected one of "
        f"{', '.join(map(repr, choices))}{did_you_mean}"
    )


def check_unknown(owner: str, names: Sequence[str], known: Sequence[str], what: str) -> None:
    """Raise for any name not in ``known``, with a "did you mean" hint."""
    for name in names:
        if name not in known:
            hint = difflib.get_close_matches(name, known, n=1)
            did_you_mean = f"; did you mean {hint[0]!r}?" if hint else ""
            raise LockConfigError(
                f"{owner}: unknown {what} {name!r}{did_you_mean} "
                f"(known: {', '.join(sorted(known))})"
            )


def parameters_of(fun: Callable[..., Any], bound: bool) -> list[inspect.Parameter]:
    """The parameters a caller passes to ``fun`` (without ``self`` for a bound task)."""
    params = list(inspect.signature(fun).parameters.values())
    return params[1:] if bound and params else params


def validate_options(
    owner: str, raw: Mapping[str, Any], params: list[inspect.Parameter] | None
) -> TaskLockOptions:
    """Validate raw ``lock_*`` options of the task called ``owner``.

    ``params`` are the task's parameters, to check ``lock_by`` names against (``None`` when the
    task body is not known yet, as for an abstract base class).
    """
    check_unknown(owner, [k for k in raw if k.startswith("lock_")], list(OPTION_DEFAULTS), "option")
    opts = {**OPTION_DEFAULTS, **raw}
    by = opts["lock_by"]
    if isinstance(by, str):
        raise LockConfigError(
            f"{owner}: option lock_by={by!r} is invalid; expected a list of parameter names "
            f"(write lock_by=[{by!r}]), (), None or a callable (args, kwargs) -> str"
        )
    if by is not None and not callable(by):
        if not isinstance(by, Sequence) or not all(isinstance(n, str) for n in by):
            raise LockConfigError(
                f"{owner}: option lock_by={by!r} is invalid; expected a list of parameter "
                "names, (), None or a callable (args, kwargs) -> str"
            )
        by = tuple(by)
        if params is not None:
            names = [p.name for p in params]
            for name in by:
                if name not in names:
                    check_unknown(owner, [name], names, "lock_by parameter")
    name = opts["lock_name"]
    if name is not None and (not isinstance(name, str) or not name or set(name) & set("{}")):
        raise LockConfigError(
            f"{owner}: option lock_name={name!r} is invalid; expected a non-empty string "
            "without '{' or '}'"
        )
    policy = opts["lock_on_contention"]
    if policy is not None:
        policy = _choice(owner, "lock_on_contention", policy, POLICIES)
    limit = opts["lock_limit"]
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise LockConfigError(
            f"{owner}: option lock_limit={limit!r} is invalid; expected an integer >= 1"
        )
    if not isinstance(opts["lock_enqueue"], bool):
        raise LockConfigError(
            f"{owner}: option lock_enqueue={opts['lock_enqueue']!r} is invalid; expected a bool"
        )
    return TaskLockOptions(
        by=by,
        name=name,
        ttl=_number(owner, "lock_ttl", opts["lock_ttl"], allow_none=True, allow_zero=False),
        on_contention=policy,
        retry_countdown=_number(
            owner, "lock_retry_countdown", opts["lock_retry_countdown"],
            allow_none=False, allow_zero=True,
        ),
        wait_timeout=_number(
            owner, "lock_wait_timeout", opts["lock_wait_timeout"],
            allow_none=False, allow_zero=True,
        ),
        limit=limit,
        cooldown=_number(
            owner, "lock_cooldown", opts["lock_cooldown"], allow_none=False, allow_zero=True
        ),
        enqueue=opts["lock_enqueue"],
        enqueue_ttl=_number(
            owner, "lock_enqueue_ttl", opts["lock_enqueue_ttl"],
            allow_none=False, allow_zero=False,
        ),
    )


_settings: weakref.WeakKeyDictionary[Any, Settings] = weakref.WeakKeyDictionary()

_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def _resolve(app: Any) -> Settings:
    conf = app.conf
    owner = f"app {app.main or app!r}"
    values = {k: conf.get(k, d) for k, d in SETTING_DEFAULTS.items()}
    url = values["redlock_url"]
    if url is None:
        broker = conf.get("broker_url") or ""
        if isinstance(broker, str) and broker.startswith(_REDIS_SCHEMES):
            url = broker
            logger.info("redlock_url is not set; using the Redis broker's URL for locks")
        else:
            raise LockConfigError(
                f"{owner}: setting redlock_url is missing; expected a Redis URL such as "
                "'redis://localhost:6379/0' (the broker is not Redis, so it cannot be reused)"
            )
    urls = [url] if isinstance(url, str) else url
    if not isinstance(urls, (list, tuple)) or not all(
        isinstance(u, str) and u.startswith(SCHEMES) for u in urls
    ):
        raise LockConfigError(
            f"{owner}: setting redlock_url={_redact(url)!r} is invalid; expected a Redis URL "
            f"({', '.join(s.rstrip('/') for s in SCHEMES)}) or a list of 3, 5, ... of them"
        )
    if len(urls) != 1 and (len(urls) < 3 or len(urls) % 2 == 0):
        raise LockConfigError(
            f"{owner}: setting redlock_url lists {len(urls)} nodes; a Redlock quorum needs an "
            "odd number of independent nodes, at least 3"
        )
    prefix = values["redlock_prefix"]
    if not isinstance(prefix, str) or not prefix or set(prefix) & set("{}"):
        raise LockConfigError(
            f"{owner}: setting redlock_prefix={prefix!r} is invalid; expected a non-empty "
            "string without '{' or '}'"
        )
    return Settings(
        url=urls[0] if len(urls) == 1 else tuple(urls),
        prefix=prefix,
        lease=_number(owner, "redlock_lease", values["redlock_lease"],
                      allow_none=False, allow_zero=False),
        ttl_margin=_number(owner, "redlock_ttl_margin", values["redlock_ttl_margin"],
                           allow_none=False, allow_zero=True),
        on_contention=_choice(owner, "redlock_on_contention",
                              values["redlock_on_contention"], POLICIES),
        on_unavailable=_choice(owner, "redlock_on_unavailable",
                               values["redlock_on_unavailable"], UNAVAILABLE_POLICIES),
    )


def _redact(url: Any) -> Any:
    if isinstance(url, (list, tuple)):
        return [_redact(u) for u in url]
    if isinstance(url, str) and "@" in url:
        scheme, _, rest = url.partition("://")
        return f"{scheme}://***@{rest.rpartition('@')[2]}"
    return url


def settings_for(app: Any) -> Settings:
    """The resolved settings of ``app``, computed on first use and then cached."""
    try:
        return _settings[app]
    except KeyError:
        settings = _settings[app] = _resolve(app)
        return settings


def reset_settings(app: Any) -> None:
    """Forget ``app``'s resolved settings: the next lock operation reads ``app.conf`` again.

    For tests that change ``redlock_*`` settings after the first lock operation.
    """
    _settings.pop(app, None)
