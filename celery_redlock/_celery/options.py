"""The ``lock_*`` task options and the ``redlock_*`` app settings: declared once, validated once.

:data:`OPTIONS` is the one table of task options. Each row gives the option's default, its type,
its validation and its documentation line; ``LockedTask``'s class attributes, the keywords of
``@single_instance`` (the name without ``lock_``) and the options table in
``docs/configuration.md`` all come from it (a test pins the last two).

Precedence is *task option > app setting > default*. App settings are read lazily (at the first
lock operation, not at import) and resolved once per app into a frozen :class:`Settings`; task
options are validated when the task is declared, so a typo fails at registration.
:func:`cross_check` then rejects the combinations of options and settings that cannot work
(``lock_limit`` > 1 or ``lock_rate`` over a quorum); it runs when a ``LockedTask`` is bound to
its app (the app finalizes) and, for every locked task, when a worker starts, which then refuses
to start.

With ``config_from_object(obj, namespace="CELERY")`` the settings are spelled
``CELERY_REDLOCK_URL`` and so on; Celery strips the prefix, and they arrive here as
``redlock_url``. A setting's error then names it ``CELERY_REDLOCK_URL``, as written in Django's
settings.

``redlock_url`` missing: if the broker is Redis (``redis://``, ``rediss://``, ``unix://``, or
kombu's ``redis+socket://``, used as ``unix://``) its URL is used, with one INFO log line saying
so; otherwise the first lock operation raises :class:`~celery_redlock.LockConfigError`, as it
does for a Redis broker URL no lock client could be built from (naming ``broker_url``: the user
never wrote ``redlock_url``).
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import logging
import math
import re
import sys
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit

from .._redis import keys as _keys
from .._redis.clients import (
    SCHEMES,
    check_member,
    node_identity,
    redact,
    redact_url,
    validate_url,
    with_tls,
)
from .._redis.nodes import majority
from ..exceptions import LockConfigError

__all__ = ["OPTIONS", "Option", "Settings", "TaskLockOptions", "settings_for"]

logger = logging.getLogger("celery_redlock.config")

Policy = Literal["skip", "retry", "fail", "wait"]
EnqueueMode = Literal["keep", "until_executed", "replace"] | None
UnavailablePolicy = Literal["retry", "fail", "run"]
LockBy = Callable[[tuple[Any, ...], dict[str, Any]], str] | Sequence[str] | None

POLICIES: tuple[str, ...] = ("skip", "retry", "fail", "wait")
UNAVAILABLE_POLICIES: tuple[str, ...] = ("retry", "fail", "run")
ENQUEUE_MODES: tuple[str, ...] = ("keep", "until_executed", "replace")
#: The values of ``lock_enqueue``, as messages list them.
ENQUEUE_SHOWN = "False, True ('keep'), 'until_executed' or 'replace'"
#: The modes that keep the queued call (``delay()`` returns its ``AsyncResult``).
KEEPING_MODES: tuple[str, ...] = ("keep", "until_executed")

#: The largest number of seconds any option or setting accepts (ten years): Redis keeps TTLs
#: in milliseconds, and a larger value only ever means a mistake.
MAX_SECONDS = 10 * 365 * 24 * 3600.0

Params = list[inspect.Parameter] | None
Check = Callable[[str, str, Any, Params], Any]


@dataclass(frozen=True)
class Option:
    """One task option: ``lock_<name>`` on a task, ``<name>=`` on ``@single_instance``."""

    name: str
    default: Any
    #: The accepted values, as shown in the docs.
    kind: str
    doc: str
    #: ``check(owner, option, value, params)`` returns the validated value or raises.
    check: Check

    @property
    def attr(self) -> str:
        """The task attribute (and ``@app.task`` keyword): ``lock_<name>``."""
        return f"lock_{self.name}"


def _invalid(owner: str, option: str, value: Any, expected: str) -> LockConfigError:
    what = "setting" if "redlock_" in option.lower() else "option"
    return LockConfigError(f"{owner}: {what} {option}={value!r} is invalid; expected {expected}")


def seconds(*, none: bool = False, zero: bool = False, ms: bool = False) -> Check:
    """A check for a finite number of seconds in ``(0, MAX_SECONDS]`` (or ``[0, ...]``);
    ``ms``: at least a millisecond (the value is sent to Redis in whole milliseconds)."""

    def check(owner: str, option: str, value: Any, _: Params = None) -> float | None:
        if value is None and none:
            return None
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        positive = ok and (value >= 0.001 if ms else value > 0 or (zero and value == 0))
        if positive and value <= MAX_SECONDS:  # not NaN, inf, nor an int no float can hold
            return float(value)
        low = "> 0 (at least 0.001: whole milliseconds)" if ms else ">= 0" if zero else "> 0"
        expected = f"a number of seconds {low} and <= {MAX_SECONDS:.0f}"
        expected += (" or None" if none else "") + _numeric_text(option, value)
        raise _invalid(owner, option, value, expected)

    return check


def _numeric_text(option: str, value: Any) -> str:
    """The hint for a number given as text (a setting read from an environment variable):
    ``", not a string: write X=10"``; else ``""``."""
    if not isinstance(value, str):
        return ""
    try:
        number = float(value)
    except ValueError:
        return ""
    return f", not a string: write {option}={number:g}" if math.isfinite(number) else ""


def choice(choices: tuple[str, ...], *, none: bool = False, shown: str = "") -> Check:
    """A check for one of ``choices`` (with a "did you mean" hint); ``shown``: the accepted
    values as the message lists them, when the option takes others too."""

    def check(owner: str, option: str, value: Any, _: Params = None) -> str | None:
        if value is None and none:
            return None
        if value in choices:
            return str(value)
        hint = difflib.get_close_matches(str(value), choices, n=1)
        did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
        listed = shown or ", ".join(map(repr, choices)) + (" or None" if none else "")
        raise _invalid(owner, option, value, f"one of {listed}{did_you_mean}")

    return check


def _by(owner: str, option: str, value: Any, params: Params) -> LockBy:
    expected = "a list of parameter names, (), None or a callable (args, kwargs) -> str"
    if isinstance(value, str):
        raise _invalid(owner, option, value, f"{expected} (write {option}=[{value!r}])")
    if value is None:
        return None
    if callable(value):
        try:
            signature = inspect.signature(value)
        except ValueError:  # no signature to read (some builtins): its first call will tell
            return value  # type: ignore[no-any-return]
        try:
            signature.bind((), {})
        except TypeError:
            raise LockConfigError(
                f"{owner}: option {option} is a callable taking {signature}; expected a "
                "callable taking (args, kwargs), the call's positional arguments as a tuple "
                "and its keyword arguments as a dict, and returning a string"
            ) from None
        return value  # type: ignore[no-any-return]
    if not isinstance(value, Sequence) or not all(isinstance(n, str) for n in value):
        raise _invalid(owner, option, value, expected)
    twice = next((name for i, name in enumerate(value) if name in value[:i]), None)
    if twice is not None:  # a typo for another parameter, most likely
        raise _invalid(owner, option, value, f"each parameter once ({twice!r} is listed twice)")
    if params is not None:
        names = [p.name for p in params]
        # @single_instance checks before bind=True is known: a leading ``self`` is accepted here
        # (and refused with its own message at the first call), never offered in a hint.
        shown = names[1:] if names[:1] == ["self"] else names
        variadic = any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params)
        note = (
            f"; a value passed through *args or **kwargs is named by a callable: "
            f"{option}=lambda args, kwargs: ..."
            if variadic
            else ""
        )
        for name in value:
            if name not in names:
                bound = "; with bind=True, self is the task itself, not an argument of the call"
                check_unknown(
                    owner, [name], shown, f"{option} parameter", bound if name == "self" else note
                )
    return tuple(value)


def _name(owner: str, option: str, value: Any, _: Params) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or set(value) & set("{}") or not value.isprintable():
        raise _invalid(
            owner, option, value, "a non-empty string without '{', '}' or control characters"
        )
    return value


def _limit(owner: str, option: str, value: Any, _: Params) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 1000:
        raise _invalid(owner, option, value, "an integer from 1 to 1000, or None (with lock_rate)")
    return value


#: sidekiq-unique-jobs lifetimes that are not a value of lock_enqueue, and what gives them
#: (docs/lifetimes.md): a "did you mean" by spelling would offer 'until_executed' for each.
SIDEKIQ_LIFETIMES = {
    "until_executing": "True ('keep')",
    "until_and_while_executing": "True ('keep')",
    "while_executing": "False: the run lock alone, with lock_on_contention",
    "until_expired": "False with lock_cooldown=<seconds> (or lock_rate)",
}


def _enqueue(owner: str, option: str, value: Any, _: Params) -> EnqueueMode:
    if value is False or value is None:
        return None
    if value is True:
        return "keep"
    if isinstance(value, str) and value in SIDEKIQ_LIFETIMES:
        raise _invalid(
            owner,
            option,
            value,
            f"one of {ENQUEUE_SHOWN}; sidekiq's "
            f"{value} is lock_enqueue={SIDEKIQ_LIFETIMES[value]} (docs/lifetimes.md)",
        )
    check = choice(ENQUEUE_MODES, shown=ENQUEUE_SHOWN)
    return check(owner, option, value, None)  # type: ignore[no-any-return]


#: The periods of a rate (Celery's ``rate_limit`` syntax), in seconds.
RATE_PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class Rate:
    """A validated ``lock_rate``: at most ``count`` starts per ``period`` seconds."""

    count: int
    period: float

    def __str__(self) -> str:
        unit = next(u for u, p in RATE_PERIODS.items() if p == self.period)
        return f"{self.count}/{unit}"


def _rate(owner: str, option: str, value: Any, _: Params) -> Rate | None:
    if value is None:
        return None
    expected = "a rate 'N/s', 'N/m' or 'N/h' with N an integer from 1 to 1000000, or None"
    if not isinstance(value, str):
        raise _invalid(owner, option, value, expected)
    count, _sep, unit = value.strip().partition("/")
    # isascii: str.isdigit() accepts '²', which int() refuses.
    digits = count.isascii() and count.isdigit()
    if not digits or not 1 <= int(count) <= 1_000_000 or unit not in RATE_PERIODS:
        raise _invalid(owner, option, value, expected)
    return Rate(int(count), RATE_PERIODS[unit])


#: The task options, in the order the docs list them.
OPTIONS: dict[str, Option] = {
    o.name: o
    for o in (
        Option(
            "by",
            None,
            "list of parameter names, (), None or callable",
            "Parameters forming the lock identity: None all of them, () one lock per task, or "
            "a callable (args, kwargs) -> str.",
            _by,
        ),
        Option(
            "name",
            None,
            "str or None",
            "Name part of the key (default: the task's name); tasks sharing it exclude each "
            "other, and those whose calls can share a key must agree on `lock_limit` and "
            "`lock_rate` (else a worker refuses to start with a `LockConfigError`; an eager call "
            "is not checked).",
            _name,
        ),
        Option(
            "ttl",
            None,
            "seconds or None",
            "A fixed TTL, never renewed; None derives the lock's life from the lease and the "
            "time limits.",
            seconds(none=True, ms=True),
        ),
        Option(
            "on_contention",
            None,
            "'skip', 'retry', 'fail', 'wait' or None",
            "What a call does when its key is held; None uses redlock_on_contention ('retry' "
            "under a lock_rate, lock_enqueue='replace' or a lock_debounce).",
            choice(POLICIES, none=True),
        ),
        Option(
            "retry_countdown",
            5.0,
            "seconds",
            "Delay (plus up to 20 % jitter) before a retry under 'retry', and before a "
            "redelivered call held off by another call comes back (at least 1 s there); 0 "
            "requeues at once, so a contended call goes round the broker as fast as it can "
            "while the key is held.",
            seconds(zero=True),
        ),
        Option(
            "wait_timeout",
            30.0,
            "seconds",
            "How long a call waits for the holder under 'wait'.",
            seconds(zero=True),
        ),
        Option(
            "limit",
            1,
            "int, 1 to 1000, or None",
            "How many executions may hold the key at once (a semaphore); needs one Redis "
            "deployment, not a quorum. None, with lock_rate: no exclusion, only the rate.",
            _limit,
        ),
        Option(
            "cooldown",
            0.0,
            "seconds",
            "The key stays held this long after the run: at most one run per window.",
            seconds(zero=True),
        ),
        Option(
            "enqueue",
            False,
            "False, True ('keep'), 'until_executed' or 'replace'",
            "De-duplicate at enqueue time: 'keep' (True) returns the queued call's AsyncResult; "
            "'until_executed' too, and also while that call runs (these two: LockedTask only); "
            "'replace' publishes the new call and the queued one ends like a skip (unset, "
            "lock_on_contention is then 'retry': under 'skip' the newest call would be skipped "
            "while a run of its key is in progress).",
            _enqueue,
        ),
        Option(
            "enqueue_ttl",
            3600.0,
            "seconds",
            "How long an enqueue marker lives: with 'keep' ('until_executed'), if its task "
            "never starts (never ends); with "
            "'replace' or lock_debounce, after its call is due.",
            seconds(ms=True),
        ),
        Option(
            "debounce",
            None,
            "seconds or None",
            "Calls of one key less than this apart collapse into one run, this long after the "
            "last call, with the last call's arguments; the others end like a skip.",
            seconds(none=True, ms=True),
        ),
        Option(
            "debounce_max",
            None,
            "seconds or None",
            "With lock_debounce (and >= it): a key under a steady stream of calls still runs, "
            "with the newest arguments, at least once this often.",
            seconds(none=True, ms=True),
        ),
        Option(
            "rate",
            None,
            "'N/s', 'N/m', 'N/h' or None",
            "At most N starts in any sliding window of the period, per lock identity, across "
            "all workers; a call over it is requeued for its slot, never dropped: with a rate, "
            "lock_on_contention None means 'retry' (single Redis deployment).",
            _rate,
        ),
        Option(
            "retry_for",
            3600.0,
            "seconds",
            "How long requeues caused by the lock (contention, redelivery, rate) may go on, "
            "from the first one; a requeue that would end past it fails the call at once. "
            "They never count against max_retries.",
            seconds(),
        ),
    )
}


@dataclass(frozen=True)
class TaskLockOptions:
    """The validated ``lock_*`` options of one task (``None`` = use the app setting).

    Its fields are the rows of :data:`OPTIONS`, in order (checked at import).
    """

    by: LockBy
    name: str | None
    ttl: float | None
    on_contention: Policy | None
    retry_countdown: float
    wait_timeout: float
    limit: int | None
    cooldown: float
    enqueue: EnqueueMode
    enqueue_ttl: float
    debounce: float | None
    debounce_max: float | None
    rate: Rate | None
    retry_for: float


if [f.name for f in dataclasses.fields(TaskLockOptions)] != list(OPTIONS):
    raise AssertionError("TaskLockOptions must list the rows of OPTIONS, in order")


#: The ``apply_async`` keyword that runs one call without the lock (per call only).
BYPASS = "lock_bypass"


def check_unknown(
    owner: str, names: Sequence[str], known: Sequence[str], what: str, note: str = ""
) -> None:
    """Raise for any name not in ``known``, with a "did you mean" hint and ``note`` last."""
    for name in names:
        if name not in known:
            hint = difflib.get_close_matches(name, known, n=1)
            did_you_mean = f"; did you mean {hint[0]!r}?" if hint else ""
            raise LockConfigError(
                f"{owner}: unknown {what} {name!r}{did_you_mean} "
                f"(known: {', '.join(sorted(known))}){note}"
            )


def parameters_of(fun: Callable[..., Any], bound: bool) -> list[inspect.Parameter]:
    """The parameters a caller passes to ``fun`` (without ``self`` for a bound task)."""
    params = list(inspect.signature(fun).parameters.values())
    return params[1:] if bound and params else params


def validate_options(owner: str, raw: Mapping[str, Any], params: Params) -> TaskLockOptions:
    """Validate raw ``lock_*`` options of the task called ``owner``.

    ``params`` are the task's parameters, to check ``lock_by`` names against (``None`` when the
    task body is not known yet, as for an abstract base class).
    """
    attrs = {option.attr: option for option in OPTIONS.values()}
    names = [k for k in raw if k.startswith("lock_")]
    if BYPASS in names:  # not "did you mean lock_by"
        raise LockConfigError(
            f"{owner}: unknown option {BYPASS!r}: it is given per call, not to the task "
            f"(task.apply_async(..., {BYPASS}=True))"
        )
    for name in names:
        setting = f"redlock_{name[len('lock_') :]}"
        if name not in attrs and setting in SETTINGS:  # lock_lease: not "did you mean lock_rate"
            raise LockConfigError(
                f"{owner}: unknown option {name!r}: {setting[len('redlock_') :]} is an app "
                f"setting, not a task option (app.conf.{setting} = ...)"
            )
    check_unknown(owner, names, list(attrs), "option")
    values = {
        option.name: option.check(owner, attr, raw.get(attr, option.default), params)
        for attr, option in attrs.items()
    }
    _check_mixes(owner, values)
    return TaskLockOptions(**values)


def _check_mixes(owner: str, values: Mapping[str, Any]) -> None:
    """Reject option mixes that cannot be honoured."""
    if values["limit"] is None and (values["rate"] is None or values["cooldown"]):
        raise LockConfigError(
            f"{owner}: option lock_limit=None (no exclusion) is invalid "
            + (
                f"with lock_cooldown={values['cooldown']!r} (a cooldown keeps a held key); "
                if values["rate"] is not None
                else "without lock_rate (it would lock nothing); "
            )
            + "expected lock_limit from 1 to 1000, or lock_limit=None with a lock_rate alone"
        )
    debounce, cap = values["debounce"], values["debounce_max"]
    if cap is not None and (debounce is None or cap < debounce):
        expected = (
            "None without a lock_debounce, which it caps: set lock_debounce too"
            if debounce is None
            else f"None or >= lock_debounce (which is {debounce!r})"
        )
        raise _invalid(owner, "lock_debounce_max", cap, expected)
    if debounce is not None and values["enqueue"] in KEEPING_MODES:
        raise LockConfigError(
            f"{owner}: option lock_debounce={debounce!r} is invalid with "
            f"lock_enqueue={values['enqueue']!r} "
            "(a debounce runs the last call, that mode the first); expected lock_enqueue=False or "
            "'replace'"
        )


#: A task option's name in a message (``lock_ttl``), and the word before it.
_OPTION_NAME = re.compile(
    r"(?<!['\"])\b(?:(option) )?lock_(" + "|".join(sorted(OPTIONS, key=len, reverse=True)) + r")\b"
)


def in_keywords(owner: str, message: str) -> str:
    """A message of the options' checks in ``@single_instance``'s words: ``option
    lock_ttl='x'`` becomes ``@single_instance keyword ttl='x'`` (the user wrote ``ttl=``).
    The owner (the function's own name) and the values shown are left as they are."""
    head, rest = (owner, message[len(owner) :]) if message.startswith(owner) else ("", message)
    return head + _OPTION_NAME.sub(
        lambda m: ("@single_instance keyword " if m[1] else "") + m[2], rest
    )


def cross_check(
    owner: str, options: TaskLockOptions, settings: Settings, keywords: bool = False
) -> None:
    """Reject task options that cannot work with the app's settings (LockConfigError);
    ``keywords``: the options are ``@single_instance``'s, and the message names them so."""
    try:
        _cross_check(owner, options, settings)
    except LockConfigError as exc:
        if not keywords:
            raise
        raise LockConfigError(in_keywords(owner, str(exc))) from None


def _cross_check(owner: str, options: TaskLockOptions, settings: Settings) -> None:
    if (options.limit or 1) > 1 and isinstance(settings.url, tuple):
        raise LockConfigError(
            f"{owner}: option lock_limit={options.limit} is invalid with a Redlock quorum "
            f"(redlock_url lists {len(settings.url)} independent nodes); expected lock_limit=1, "
            "or a single Redis deployment (a node, Sentinel or Cluster): over independent "
            "nodes, more than lock_limit owners could each win a majority of slots"
        )
    if options.rate is not None and isinstance(settings.url, tuple):
        raise LockConfigError(
            f"{owner}: option lock_rate={str(options.rate)!r} is invalid with a Redlock quorum "
            f"(redlock_url lists {len(settings.url)} independent nodes); expected lock_rate=None, "
            "or a single Redis deployment (a node, Sentinel or Cluster): the start log of a "
            "rate lives on one server, and independent nodes would each count their own"
        )


# -- app settings ---------------------------------------------------------------------------


@dataclass(frozen=True, repr=False)
class Settings:
    """The ``redlock_*`` settings of one app, validated (the rows of :data:`SETTINGS`).

    Its repr shows the URLs with their credentials hidden, and not the key secret: an error
    tracker that records the local variables of a failing frame (Sentry does) records it.
    """

    #: One URL, or a tuple of 3, 5, ... URLs of independent nodes (the Redlock quorum).
    url: str | tuple[str, ...]
    prefix: str
    lease: float
    ttl_margin: float
    on_contention: Policy
    on_unavailable: UnavailablePolicy
    #: Keys the argument digest (a MAC); ``None``: a plain hash. Never shown in a repr.
    key_secret: bytes | None = None
    #: Group of the Celery events of a contended task: ``"redlock"`` (``redlock-skipped``...)
    #: or the deprecated ``"task-lock"`` (``task-lock-skipped``...).
    event_names: str = "redlock"
    #: ``redlock_timeline``: events the dashboard's ring keeps (0: no ring).
    timeline: int = 0

    def __repr__(self) -> str:
        url = (
            redact_url(self.url) if isinstance(self.url, str) else tuple(map(redact_url, self.url))
        )
        shown = [f"url={url!r}"] + [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in dataclasses.fields(self)
            if f.name not in ("url", "key_secret")
        ]
        return f"Settings({', '.join(shown)})"


_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def _url(owner: str, setting: str, url: Any) -> str | tuple[str, ...]:
    urls = [url] if isinstance(url, str) else url
    expected = (
        f"a Redis URL ({', '.join(s.rstrip('/') for s in SCHEMES)}) or a list of 3, 5, ... of them"
    )
    if not isinstance(urls, (list, tuple)) or not all(
        isinstance(u, str) and u.startswith(SCHEMES) for u in urls
    ):
        raise LockConfigError(
            f"{owner}: setting {setting}={redact(repr(url))} is invalid; expected {expected}"
        )
    if len(urls) != 1 and (len(urls) < 3 or len(urls) % 2 == 0):
        raise LockConfigError(
            f"{owner}: setting {setting} lists {len(urls)} nodes; a Redlock quorum needs an "
            "odd number of independent nodes, at least 3"
        )
    seen: dict[tuple[Any, ...], str] = {}
    for item in urls:
        if len(urls) > 1:
            try:
                check_member(item)
            except ValueError as exc:
                raise LockConfigError(f"{owner}: setting {setting} is invalid: {exc}") from None
        try:
            identity = node_identity(item)
        except ValueError as exc:
            raise LockConfigError(
                f"{owner}: setting {setting}={redact_url(item)!r} is invalid ({redact(exc)}); "
                f"expected {expected}"
            ) from None
        if identity in seen:
            raise LockConfigError(
                f"{owner}: setting {setting} names the same node twice "
                f"({redact_url(seen[identity])} and {redact_url(item)}); a Redlock quorum needs "
                "independent nodes, each once"
            )
        seen[identity] = item
    return urls[0] if len(urls) == 1 else tuple(urls)


def _prefix(owner: str, setting: str, value: Any) -> str:
    if isinstance(value, str) and value and not set(value) & set("{}") and value.isprintable():
        return value
    raise _invalid(
        owner, setting, value, "a non-empty string without '{', '}' or control characters"
    )


def _secret(owner: str, setting: str, value: Any) -> bytes | None:
    if value is None:
        return None
    if not isinstance(value, (str, bytes)) or not value:
        shown = "***" if isinstance(value, (str, bytes)) else type(value).__name__
        raise LockConfigError(
            f"{owner}: setting {setting}={shown} is invalid; expected a non-empty str or bytes, "
            "or None"
        )
    return _keys.secret_key(value)


#: ``redlock_event_names`` values; ``"task-lock"`` is deprecated (docs/guide.md#task-events).
EVENT_NAMES = ("redlock", "task-lock")


def _event_names(owner: str, setting: str, value: Any) -> str:
    names = choice(EVENT_NAMES)(owner, setting, value, None)
    if names == "task-lock":
        message = (
            f"{owner}: {setting}='task-lock' is deprecated: task-lock-* events are "
            "read as task states by Celery's State (Flower shows LOCK-SKIPPED) and break "
            "exporters that map every task-* event to a state; consume redlock-* events"
        )
        # Python hides a DeprecationWarning outside __main__: the log carries it to operators.
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        logger.warning("%s", message)
    return str(names)


#: The largest ``redlock_timeline``: about 200 MB of ring at 200 bytes an event, and a
#: size the ring script's Lua numbers (doubles) hold exactly.
MAX_TIMELINE = 1_000_000
TIMELINE_EXPECTED = f"a whole number from 0 to {MAX_TIMELINE}"


def _timeline(owner: str, setting: str, value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TIMELINE:
        raise _invalid(owner, setting, value, TIMELINE_EXPECTED)
    return value


@dataclass(frozen=True)
class Setting:
    """One app setting: ``redlock_<name>`` in ``app.conf`` (``CELERY_REDLOCK_<NAME>`` under
    ``config_from_object(..., namespace="CELERY")``)."""

    name: str
    default: Any
    #: The default as the docs show it.
    shown: str
    #: The accepted values, as shown in the docs.
    kind: str
    doc: str
    #: ``check(owner, setting, value)`` returns the validated value or raises.
    check: Callable[[str, str, Any], Any]

    @property
    def key(self) -> str:
        """The ``app.conf`` key: ``redlock_<name>``."""
        return f"redlock_{self.name}"


def _as(check: Check) -> Callable[[str, str, Any], Any]:
    return lambda owner, setting, value: check(owner, setting, value, None)


#: The least ``redlock_ttl_margin``, in seconds.
MIN_TTL_MARGIN = 0.5


def _ttl_margin(owner: str, setting: str, value: Any) -> float:
    """``redlock_ttl_margin``: seconds, :data:`MIN_TTL_MARGIN` at least. Timeline below it
    (seen with 0 on a real worker): (1) a task with ``time_limit=2`` takes its lock; (2) the
    main process counts the limit from when it saw the task accepted, a little after the
    acquire; (3) the lock expires at acquisition + 2 s and a waiter takes it; (4) billiard's
    SIGKILL comes about 0.1 s later: both children ran the key for that long."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if number and value < MIN_TTL_MARGIN:  # -1 too: not "expected >= 0", then 0 ">= 0.5"
        raise _invalid(
            owner,
            setting,
            value,
            f"a number of seconds >= {MIN_TTL_MARGIN} (below that, a child killed at its hard "
            "time limit may still run when its lock expires)",
        )
    return seconds()(owner, setting, value, None) or MIN_TTL_MARGIN  # None only with none=True


#: The app settings, in the order the docs list them; the fields of :class:`Settings`.
SETTINGS: dict[str, Setting] = {
    s.key: s
    for s in (
        Setting(
            "url",
            None,
            "the broker's URL if it is Redis",
            "a Redis URL, or a list of 3, 5, ... URLs of independent nodes (a list of one URL is "
            "that one server)",
            "Where locks live ([URL forms](guide.md#where-locks-live)); unset with a non-Redis "
            "broker, a worker refuses to start and the first lock operation raises "
            "LockConfigError.",
            _url,
        ),
        Setting(
            "prefix",
            "redlock",
            "`'redlock'`",
            "a non-empty string without `{`, `}` or control characters",
            "First part of every key.",
            _prefix,
        ),
        Setting(
            "lease",
            30.0,
            "`30.0`",
            "seconds >= 0.001",
            "The lease, renewed every lease/3 while the task runs.",
            _as(seconds(ms=True)),
        ),
        Setting(
            "ttl_margin",
            5.0,
            "`5.0`",
            "seconds >= 0.5",
            "Added to the hard time limit T: renewal never extends a lock past acquisition + "
            "T + margin.",
            _ttl_margin,
        ),
        Setting(
            "on_contention",
            "skip",
            "`'skip'`",
            "'skip', 'retry', 'fail', 'wait'",
            "Policy of tasks whose lock_on_contention is None (except tasks with a lock_rate, "
            "lock_enqueue='replace' or a lock_debounce, which retry: they never drop the newest "
            "call).",
            _as(choice(POLICIES)),
        ),
        Setting(
            "on_unavailable",
            "retry",
            "`'retry'`",
            "'retry', 'fail', 'run'",
            "What a call does when the lock Redis does not answer "
            "([guide](guide.md#when-redis-does-not-answer)).",
            _as(choice(UNAVAILABLE_POLICIES)),
        ),
        Setting(
            "key_secret",
            None,
            "`None`",
            "None, or a non-empty str or bytes",
            "Keys the argument digests of task keys (keyed BLAKE2b, a MAC), so that "
            "low-entropy arguments (an account number) cannot be found from a key by trying "
            "guesses; None uses a plain hash. Keys then differ between apps with different "
            "secrets (and across a rotation), which do not exclude each other: set the same "
            "secret wherever keys of the same tasks are computed (workers, and producers or "
            "beat using lock_enqueue or lock_key()).",
            _secret,
        ),
        Setting(
            "event_names",
            "redlock",
            "`'redlock'`",
            "'redlock', 'task-lock' (deprecated)",
            "Group of the Celery events a contended task sends with -E: redlock-skipped, "
            "redlock-retried, redlock-failed, redlock-waited; 'task-lock' sends the old "
            "task-lock-* names, which Celery's State (Flower) reads as task states and some "
            "exporters fail on ([operations](operations.md#signals-and-events)).",
            _event_names,
        ),
        Setting(
            "timeline",
            0,
            "`0` (off)",
            TIMELINE_EXPECTED,
            "How many recent lock events the in-Redis ring of the dashboard's timeline keeps "
            "(`<prefix>:timeline`, [operations](operations.md#dashboard)); each event then "
            "costs the task one round trip (a script).",
            _timeline,
        ),
    )
}

#: App settings and their defaults (from :data:`SETTINGS`).
SETTING_DEFAULTS: dict[str, Any] = {key: s.default for key, s in SETTINGS.items()}

if [f"redlock_{f.name}" for f in dataclasses.fields(Settings)] != list(SETTINGS):
    raise AssertionError("Settings must list the rows of SETTINGS, in order")


def resolve(app: Any) -> Settings:
    """Read and validate ``app``'s ``redlock_*`` settings (uncached: see :func:`settings_for`)."""
    conf = app.conf
    owner = f"app {app.main or app!r}"
    values = {key: conf.get(key, s.default) for key, s in SETTINGS.items()}
    if values["redlock_url"] is None:
        name = spelled(app, "redlock_url")
        values["redlock_url"] = _broker_url(owner, conf, name)
        _tell_once(app, f"{name} is not set; using the Redis broker's URL for locks")
    checked = {
        s.name: s.check(owner, spelled(app, key), values[key]) for key, s in SETTINGS.items()
    }
    return Settings(**checked)


def spelled(app: Any, key: str) -> str:
    """Setting ``key`` (``redlock_url``) as the user writes it, for messages: under
    ``config_from_object(..., namespace="CELERY")`` Celery reads ``CELERY_REDLOCK_URL``, in the
    namespace's case (``namespace="celery"``: ``celery_redlock_url``)."""
    space = getattr(app, "namespace", None)
    if not space:
        return key
    name = f"{space.rstrip('_')}_{key}"
    return name.upper() if space.isupper() else name.lower()


def _broker_url(owner: str, conf: Any, name: str) -> str:
    """The broker's URL when it can serve as ``redlock_url`` (a single Redis, its connection
    options all in the URL); else a :class:`LockConfigError` saying what to set (``name``, the
    setting as the user spells it)."""
    broker = conf.broker_url or ""  # with CELERY_BROKER_URL (and `celery -b`), as Celery reads it
    missing = f"{owner}: setting {name} is missing and"
    fix = f"; set {name} to a Redis URL such as 'redis://localhost:6379/0'" + (
        " (CELERY_REDLOCK_URL with the CELERY namespace)" if name == "redlock_url" else ""
    )
    if isinstance(broker, str) and broker.startswith("sentinel://"):
        raise LockConfigError(
            f"{missing} the broker is kombu's sentinel:// transport, whose URL is not one of "
            f"ours; set {name} to 'redis+sentinel://host:26379/<master_name>'"
        )
    if isinstance(broker, (list, tuple)) or (isinstance(broker, str) and ";" in broker):
        raise LockConfigError(
            f"{missing} broker_url is a failover list, whose nodes hold separate data (locks "
            f"need one deployment, or a quorum list){fix}"
        )
    if not broker:
        raise LockConfigError(
            f"{missing} no broker_url is set to reuse (Celery's default broker is AMQP){fix}; "
            "in a test with our pytest plugin, configure_redlock(app) sets it"
        )
    if not (isinstance(broker, str) and broker.startswith((*_REDIS_SCHEMES, _KOMBU_SOCKET))):
        raise LockConfigError(
            f"{missing} the broker is not Redis, so its URL cannot be reused{fix}"
        )
    tls = conf.get("broker_use_ssl")
    url = _unix_url(broker) if broker.startswith(_KOMBU_SOCKET) else broker
    if tls:
        try:
            url = with_tls(url, tls)
        except ValueError as exc:
            raise LockConfigError(
                f"{missing} {exc}, so the broker's URL cannot serve for locks; set {name} to a "
                "rediss:// URL with the TLS options as query options"
            ) from None
    # Checked here, not as redlock_url's value: the user never wrote that setting, and the
    # message must name the one they wrote (and that setting redlock_url is the way out).
    try:
        validate_url(url)
    except ValueError as exc:
        with_ssl = " with broker_use_ssl" if tls else ""
        raise LockConfigError(
            f"{missing} broker_url={redact_url(broker)!r}{with_ssl}, the Redis broker's URL "
            f"reused for locks, is invalid for them ({redact(exc)}){fix}"
        ) from None
    return url


#: kombu's (and Celery's) scheme of a Redis broker reached through a Unix socket.
_KOMBU_SOCKET = "redis+socket://"


def _unix_url(broker: str) -> str:
    """kombu's ``redis+socket:///path/redis.sock[?virtual_host=<db>]`` as redis-py's
    ``unix:///path/redis.sock[?db=<db>]``: the same server and database (kombu reads the
    database from ``virtual_host`` only), with the credentials and other query options kept."""
    parts = urlsplit(broker)
    query = parts.query
    items = parse_qsl(query, keep_blank_values=True)
    if any(key == "virtual_host" for key, _ in items):
        query = urlencode(
            [("db", v.strip("/") or "0") if k == "virtual_host" else (k, v) for k, v in items]
        )
    # Built by hand: urlunsplit writes "unix:/path" (no "//") for a scheme without a host.
    return f"unix://{parts.netloc}{parts.path}" + (f"?{query}" if query else "")


#: The apps already told that their broker's URL is used for locks (once per process).
_told: weakref.WeakSet[Any] = weakref.WeakSet()


def _tell_once(app: Any, message: str) -> None:
    if app not in _told:
        _told.add(app)
        logger.info(message)


def unknown_settings(app: Any) -> list[str]:
    """A message for each ``redlock_*``/``CELERY_REDLOCK_*`` key (or one of the app's own
    namespace) of ``app.conf`` that is no setting (a misspelling is silently ignored by
    Celery), with a "did you mean" hint, and for each key that names a setting but is spelled
    so that Celery does not hand it over (``REDLOCK_URL``; ``CELERY_REDLOCK_URL`` without
    ``namespace="CELERY"``): ignored too."""
    known = [s.name for s in SETTINGS.values()]
    spaces = {"celery", (getattr(app, "namespace", None) or "celery").rstrip("_").lower()}
    messages = []
    for key in list(app.conf.keys()):
        if not isinstance(key, str):
            continue
        lower = key.lower()
        space = next((f"{s}_" for s in spaces if lower.startswith(f"{s}_redlock_")), "")
        base = lower[len(space) :]
        if base in SETTINGS:
            read = app.conf.get(base, _UNSET)
            # The key's own value: under a namespace, app.conf[key] answers for the namespaced
            # spelling of the setting, not for this key.
            own = next((m[key] for m in app.conf.maps if key in m), _UNSET)
            if read is _UNSET or (read is not own and read != own):  # NaN != NaN
                messages.append(f"app {app.main or app!r}: {_ignored(app, key, base)}")
            continue
        if not base.startswith("redlock_"):
            continue
        hint = difflib.get_close_matches(base[len("redlock_") :], known, n=1)
        cased = (lambda name: name.upper()) if key.isupper() else (lambda name: name)
        prefix = f"{space}redlock_"
        did_you_mean = f"; did you mean {cased(prefix + hint[0])!r}?" if hint else ""
        messages.append(
            f"app {app.main or app!r}: unknown setting {key!r}{did_you_mean} (it is ignored; "
            f"known: {', '.join(cased(prefix + n) for n in known)})"
        )
    return messages


def _ignored(app: Any, key: str, base: str) -> str:
    """What to write instead of ``key``, a spelling of the setting ``base`` Celery ignores."""
    if getattr(app, "namespace", None):
        return f"setting {key!r} is ignored: write it {spelled(app, base)!r}"
    return (
        f"setting {key!r} is ignored: write it {base!r} ({f'CELERY_{base.upper()}'!r} only "
        "under config_from_object(..., namespace='CELERY'))"
    )


#: No value in ``app.conf``.
_UNSET = object()


#: Per app: the settings warnings logged so far (each is logged once per process).
_warned: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


#: Apps whose settings warnings wait for Celery to set up logging (:func:`warn_when_logged`).
_unlogged: weakref.WeakSet[Any] = weakref.WeakSet()
#: Apps whose settings were looked at (:func:`warn_when_logged` is asked at every publish).
_asked: weakref.WeakSet[Any] = weakref.WeakSet()


def warn_when_logged(app: Any) -> None:
    """:func:`warn_unknown_settings`, once per app: asked when an app finalizes, when its
    settings are first resolved and at each publish (a process that only sends tasks, a web
    process's ``delay()``, may never finalize its app). Under Celery's command line before
    Celery set up logging (``celery worker``, ``celery beat``), the app waits for
    :func:`warn_waiting`, or for a publish once the root logger has a handler: the warning
    would be a bare line on stderr, outside the log file."""
    if app in _asked:
        return
    if "celery.bin.celery" in sys.modules and not logging.getLogger().handlers:
        _unlogged.add(app)
        return
    _asked.add(app)
    _unlogged.discard(app)
    warn_unknown_settings(app)


def warn_unknown_settings(app: Any) -> None:
    """Log each of :func:`unknown_settings` at WARNING, once per app; never raises.

    The logger is switched back on first: timeline without, (1) the project's module runs a
    logging configuration that disables the loggers it does not name (Django's ``LOGGING``
    with ``disable_existing_loggers``, at ``django.setup()``), ours included; (2) the root
    logger has a handler now, so the app's finalize at worker start warns at once; (3) the
    warning was dropped, and a misspelt ``CELERY_REDLOCK_URL`` put the locks on the broker's
    Redis without a trace in the log (the worker switches our loggers on only later)."""
    try:
        messages = unknown_settings(app)
    except Exception:  # a conf that cannot be read is reported by the lock operations
        return
    if messages:
        logger.disabled = False
    warned = _warned.setdefault(app, set())
    for message in messages:
        if message not in warned:
            warned.add(message)
            logger.warning("%s", message)


def warn_waiting() -> None:
    """Celery has set up logging (``after_setup_logger``), or a beat started (``beat_init``:
    a project's ``setup_logging`` receiver replaces Celery's logging setup, and with it
    ``after_setup_logger``): log the settings warnings that waited for it. A worker logs them
    at start in any case (its cross-check step)."""
    for app in list(_unlogged):
        _unlogged.discard(app)
        _asked.add(app)
        warn_unknown_settings(app)


#: ``id(app)`` -> (a weak reference to the app, its settings). Read once per execution: a
#: plain dict lookup by id is several times cheaper than a ``WeakKeyDictionary``'s, and the
#: reference tells a reused id from the app it was cached for.
_settings: dict[int, tuple[weakref.ref[Any], Settings]] = {}


def contention_policy(options: TaskLockOptions, settings: Settings) -> str:
    """The task's ``lock_on_contention``; unset, ``retry`` under a ``lock_rate`` (a rate never
    drops a call: it delays it, as Celery's ``rate_limit`` does) and under ``replace`` or a
    debounce (the newest call is never dropped: timeline under ``skip``, (1) a run of key 7
    is in progress; (2) the newest call of 7, its last edit, starts and finds the key held;
    (3) it ends unrun, and the edit is lost), else ``redlock_on_contention``.
    """
    if options.on_contention is not None:
        return options.on_contention
    if options.rate is not None or supersedes(options):
        return "retry"
    return settings.on_contention


def supersedes(options: TaskLockOptions) -> bool:
    """Whether a later call of a key supersedes the waiting ones (replace or debounce)."""
    return options.enqueue == "replace" or options.debounce is not None


def settings_for(app: Any) -> Settings:
    """The resolved settings of ``app``, computed on first use and then cached."""
    cached = _settings.get(id(app))
    if cached is not None and cached[0]() is app:
        return cached[1]
    warn_when_logged(app)  # first: a misspelled redlock_url is named before resolve() fails
    settings = resolve(app)  # outside an except block: its errors chain to nothing
    key = id(app)

    def forget(ref: weakref.ref[Any]) -> None:  # the app is collected: drop its entry
        if _settings.get(key, (None,))[0] is ref:
            del _settings[key]

    _settings[key] = (weakref.ref(app, forget), settings)
    return settings


def reset_settings(app: Any) -> None:
    """Forget ``app``'s resolved settings: the next lock operation reads ``app.conf`` again.

    For tests that change ``redlock_*`` settings after the first lock operation.
    """
    _settings.pop(id(app), None)


def quorum_size(settings: Settings) -> int:
    """How many of the settings' nodes must answer (1 for a single deployment)."""
    return 1 if isinstance(settings.url, str) else majority(len(settings.url))
