"""A call's lock identity: which task options apply, and the canonical encoding of its arguments.

:func:`spec_of` finds a task's validated options (set by ``LockedTask`` on the class or by
``@single_instance`` on the function) and the parameters its calls bind to;
:func:`lock_name_for` turns one call into its lock name, ``<lock_name>:<digest>``.

The canonical encoding is the input of the digest.

Two calls get the same encoding exactly when they bind to the same parameter values:
``f(1, b=2)``, ``f(a=1, b=2)`` and ``f(b=2, a=1)`` agree (arguments are bound to the signature,
defaults applied), while ``f(1)``, ``f("1")``, ``f(True)`` and ``f(1.0)`` all differ.

Values are encoded as they survive Celery's JSON serializer, so the key computed by the caller
(``lock_key``) equals the one the worker computes: tuples and lists are the same sequence, and
``datetime``, ``date``, ``time``, ``UUID``, ``Decimal`` and ``bytes`` (which kombu's JSON carries)
are tagged with their type. Every container is tagged too (``["L", ...]``, ``["D", ...]``), so
no user value can imitate another's encoding. Anything else raises :class:`TypeError` naming
the parameter: a silent ``repr()`` fallback would give keys that differ between processes. So do
a mapping whose keys collide once encoded (``{1: "a", "1": 2}``: JSON has string keys only) and
values nested deeper than :data:`MAX_DEPTH`.

A ``lock_by`` callable gets the call's ``args`` and ``kwargs`` as sent, not bound to the
signature (for it ``f(1)`` and ``f(a=1)`` differ), and, for a task whose serializer is JSON
(Celery's default), with their containers as JSON gives them back (:func:`as_sent`: tuples as
lists, mapping keys as strings; values kombu tags, such as a ``datetime``, as kombu gives
them back), in the caller and the worker alike; under pickle as they are; under another
serializer (msgpack, YAML) as that serializer gives them back (:func:`as_received`).
Timeline it closes: (1) ``delay(y=(1, 2))`` under ``lock_enqueue=True`` marks the key the
callable computes from the tuple; (2) the worker receives ``[1, 2]``, computes another key and
never clears that marker; (3) every later call of the value returns the finished call's result
for the marker's hour, and never runs.
"""

from __future__ import annotations

import datetime
import decimal
import functools
import inspect
import json
import logging
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import kombu.exceptions
import kombu.serialization
from celery import Task
from celery.app.annotations import MapAnnotation
from celery.app.annotations import resolve_all as resolve_annotations
from celery.app.autoretry import add_autoretry_behaviour
from celery.local import Proxy

from .._redis import keys as _keys
from .._redis.forks import Guard
from ..exceptions import LockConfigError, LockContended, LockUnavailable
from .options import OPTIONS, Settings, TaskLockOptions, parameters_of, settings_for

logger = logging.getLogger("celery_redlock.config")

_SCALARS = (str, int, float, type(None))
#: The exact types JSON gives back as they are (not subclasses: a named tuple is no int).
_ATOMS = frozenset({str, int, float, bool, type(None)})

#: How deeply containers may nest in an argument that is part of a lock identity.
MAX_DEPTH = 64


#: ``json.dumps(value, ensure_ascii=False, separators=(",", ":"))`` without building an encoder
#: per call. The values come from :func:`_encode` (lists, strings, numbers, ``None``) and are
#: never circular, so the circular-reference check is left out: the text is the same.
_compact_json = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), check_circular=False
).encode


def _encode(value: Any, owner: str, param: str, depth: int = 0) -> Any:
    if isinstance(value, _SCALARS):
        return 0.0 if value == 0.0 and isinstance(value, float) else value  # -0.0 too
    if depth >= MAX_DEPTH and isinstance(value, (list, tuple, Mapping)):
        raise TypeError(
            f"{owner}: argument {param!r} nests containers deeper than {MAX_DEPTH} levels, "
            "which has no canonical encoding for the lock key; choose the identity with lock_by"
        )
    if isinstance(value, (list, tuple)):
        return ["L", *(_encode(v, owner, param, depth + 1) for v in value)]
    if isinstance(value, Mapping):
        items = {}
        for k, v in value.items():
            encoded = _key(k, owner, param)
            if encoded in items:
                raise TypeError(  # never the key itself: it is an argument's value
                    f"{owner}: argument {param!r} is a mapping whose keys collide once encoded "
                    f"(a {type(k).__name__} key and another that both become one JSON key), "
                    "which has no canonical encoding for the lock key"
                )
            items[encoded] = _encode(v, owner, param, depth + 1)
        return ["D", *([k, items[k]] for k in sorted(items))]
    for kind, text in _TAGGED:  # a subclass (pendulum's, freezegun's) arrives as its base type
        if isinstance(value, kind):
            return ["T", kind.__name__, text(value)]
    if isinstance(value, (bytes, bytearray)):
        return ["T", "bytes", bytes(value).hex()]
    raise TypeError(
        f"{owner}: argument {param!r} has type {type(value).__name__}, which has no canonical "
        "encoding for the lock key; pass JSON-compatible values, or choose the identity with "
        "lock_by (parameter names or a callable returning a string)"
    )


#: The types kombu's JSON carries with a tag, as the worker gets them back: a subclass's value
#: arrives as its base type (``datetime`` before its base ``date``). Timeline with the
#: subclass's own name in the encoding: (1) ``delay(pendulum.now())`` under
#: ``lock_enqueue=True`` marks the key of a ``DateTime``; (2) the worker receives a
#: ``datetime``, computes another key and never clears that marker; (3) every later call of
#: the value returns the finished call's result for the marker's hour, and never runs.
_TAGGED: tuple[tuple[type, Callable[[Any], str]], ...] = (
    (datetime.datetime, datetime.datetime.isoformat),
    (datetime.date, datetime.date.isoformat),
    (datetime.time, datetime.time.isoformat),
    (uuid.UUID, uuid.UUID.__str__),
    (decimal.Decimal, decimal.Decimal.__str__),
)


def _key(key: Any, owner: str, param: str) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, _SCALARS):
        return json.dumps(key)  # what Celery's JSON serializer turns a non-string key into
    raise TypeError(
        f"{owner}: argument {param!r} is a mapping with a {type(key).__name__} key, which has "
        "no canonical encoding for the lock key"
    )


@functools.lru_cache(maxsize=1024)
def _signature(params: tuple[inspect.Parameter, ...]) -> inspect.Signature:
    return inspect.Signature(params)


def _bind_plain(
    params: list[inspect.Parameter], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> dict[str, Any] | None:
    """What ``Signature.bind`` + ``apply_defaults`` give, for the usual parameters (positional
    or keyword, keyword-only) and a call that fits them; ``None`` otherwise, and ``inspect``
    binds (and words the error). A few microseconds instead of some twenty per execution."""
    if len(args) > len(params):
        return None
    out: dict[str, Any] = {}
    taken = 0
    for i, param in enumerate(params):
        if param.kind is _POSITIONAL_OR_KEYWORD:
            if i < len(args):
                if param.name in kwargs:
                    return None
                out[param.name] = args[i]
                continue
        elif param.kind is not _KEYWORD_ONLY or i < len(args):
            return None
        if param.name in kwargs:
            out[param.name] = kwargs[param.name]
            taken += 1
        elif param.default is not param.empty:
            out[param.name] = param.default
        else:
            return None
    return out if taken == len(kwargs) else None


_POSITIONAL_OR_KEYWORD = inspect.Parameter.POSITIONAL_OR_KEYWORD
_KEYWORD_ONLY = inspect.Parameter.KEYWORD_ONLY


def bind(
    owner: str, params: list[inspect.Parameter], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """Bind a call to ``params`` with defaults applied; TypeError if it does not fit."""
    plain = _bind_plain(params, args, kwargs)
    if plain is not None:
        return plain
    signature = _signature(tuple(params))
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"{owner}: arguments do not match the task's signature: {exc}") from None
    bound.apply_defaults()
    return dict(bound.arguments)


def encode_call(
    owner: str,
    params: list[inspect.Parameter],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    by: Callable[[tuple[Any, ...], dict[str, Any]], str] | Sequence[str] | None,
    serializer: str = "json",
) -> bytes:
    """The canonical bytes identifying one call of the task called ``owner``.

    ``by`` selects the identity: ``None`` all parameters, a sequence some of them (in the given
    order), a callable a string computed from ``(args, kwargs)`` as the task's ``serializer``
    gives them back (:func:`as_received`).
    """
    if callable(by):
        args, kwargs = as_received(args, serializer), as_received(kwargs, serializer)
        try:
            ident = by(tuple(args), dict(kwargs))
        except Exception as exc:
            raise LockConfigError(
                f"{owner}: the lock_by callable raised {type(exc).__name__} (see the chained "
                "exception); it must return a string for every call of the task"
            ) from exc
        if not isinstance(ident, str):
            raise LockConfigError(
                f"{owner}: lock_by callable returned {type(ident).__name__}; expected str"
            )
        return json.dumps(["C", ident], ensure_ascii=False).encode("utf-8", "surrogatepass")
    names = [p.name for p in params] if by is None else by
    return _encode_arguments(owner, names, bind(owner, params, args, kwargs))


def as_received(value: Any, serializer: str) -> Any:
    """``value`` as the worker receives it under ``serializer``: pickle's as it is; JSON's of
    plain values by :func:`as_sent` (no encoding); any other, and JSON's with a value kombu
    tags, through the serializer and back (msgpack and YAML make tuples lists, YAML sorts
    mapping keys; JSON gives a ``datetime`` subclass back as a ``datetime``, and an aware one
    with a fixed offset for its ``ZoneInfo``). A value the serializer cannot carry is left
    as it is: publishing it fails with the serializer's own error."""
    if serializer == "pickle":
        return value
    if serializer == "json":
        try:
            return as_sent(value)
        except _NotPlain:
            pass
    try:
        content_type, encoding, data = kombu.serialization.dumps(value, serializer=serializer)
        return kombu.serialization.loads(data, content_type, encoding, force=True)
    except kombu.exceptions.KombuError:  # the publish reports it, in the serializer's words
        return value


class _NotPlain(Exception):
    """A value that is not a plain JSON value (a ``datetime``, an ``IntEnum``, nested deeper
    than :data:`MAX_DEPTH`...): only the serializer says what the worker gets."""


def as_sent(value: Any, depth: int = 0) -> Any:
    """``value``, made of plain JSON values, with its containers as Celery's JSON serializer
    gives them back: tuples as lists, mapping keys as strings (``json.dumps`` of a number,
    ``None`` or a bool key). A list of scalars is returned as it is, after one look at its
    element types (a large argument is not copied). :class:`_NotPlain` for any other value.
    Timeline it is the fast path of: (1) ``delay(y=(1, 2))`` under ``lock_enqueue=True``
    marked the key a callable computed from the tuple; (2) the worker received ``[1, 2]``,
    computed another key and never cleared that marker (see the module docstring)."""
    if depth >= MAX_DEPTH:
        raise _NotPlain
    if isinstance(value, (list, tuple)):
        if set(map(type, value)) <= _ATOMS:
            return value if type(value) is list else list(value)
        return [as_sent(v, depth + 1) for v in value]
    if isinstance(value, Mapping):
        return {
            k if isinstance(k, str) or not isinstance(k, _SCALARS) else json.dumps(k): as_sent(
                v, depth + 1
            )
            for k, v in value.items()
        }
    if type(value) in _ATOMS:
        return value
    raise _NotPlain


def _scalar_json(value: Any) -> str | None:
    """The text :data:`_compact_json` gives ``value``, for the usual scalars; ``None`` for any
    other value (the encoder then writes it).

    A string needs no escape when it is printable (no character below U+0020) and holds no
    ``"`` or ``\\``: the encoder, with ``ensure_ascii=False``, escapes only those. A test
    compares the two on many values (``tests/unit/test_canonical_text.py``).
    """
    kind = type(value)
    if kind is str:
        return (
            f'"{value}"' if value.isprintable() and '"' not in value and "\\" not in value else None
        )
    if kind is int:
        return str(value)
    if value is None:
        return "null"
    if kind is bool:
        return "true" if value else "false"
    return None  # floats (repr, NaN, infinities), subclasses, containers: the encoder


def _encode_arguments(owner: str, names: Sequence[str], arguments: Mapping[str, Any]) -> bytes:
    """The canonical bytes of the parameters ``names`` of a bound call (``["A", ...]``)."""
    keys = [_scalar_json(name) for name in names]
    return _encode_values(owner, names, keys, [arguments[name] for name in names])


def _encode_values(
    owner: str, names: Sequence[str], keys: Sequence[str | None], values: Sequence[Any]
) -> bytes:
    """:func:`_encode_arguments` of the ``values`` of ``names``, whose JSON texts are ``keys``
    (``None`` where the encoder must write one)."""
    parts = ['"A"']
    # The usual call: scalars written directly. (Same lengths by construction: zip's strict=
    # is a keyword call, on every execution.)
    for key, value in zip(keys, values):  # noqa: B905
        text = str(value) if type(value) is int else _scalar_json(value)
        if text is None or key is None:
            break
        parts.append(f"[{key},{text}]")
    else:
        return f"[{','.join(parts)}]".encode("utf-8", "surrogatepass")
    encoded = [
        [name, _encode(value, owner, name)] for name, value in zip(names, values, strict=True)
    ]
    # A lone surrogate ("\ud800", which JSON carries) has its own bytes, never an error.
    return _compact_json(["A", *encoded]).encode("utf-8", "surrogatepass")


#: Attribute set by ``@single_instance`` on the function it wraps, and by ``LockedTask`` on
#: each subclass: the validated :class:`~celery_redlock._celery.options.TaskLockOptions`.
OPTIONS_ATTR = "_redlock_options"

#: The wrappers ``@single_instance`` made (by identity: ``functools.wraps`` copies a
#: function's attributes to another decorator's wrapper, never its identity).
WRAPPERS: weakref.WeakSet[Callable[..., Any]] = weakref.WeakSet()


@dataclass(frozen=True)
class Spec:
    """A task's validated lock options plus the parameters its calls bind to."""

    options: TaskLockOptions
    params: list[inspect.Parameter]
    bound: bool
    #: ``"task <name>"``: how messages name the task.
    owner: str
    #: Whether the options are ``@single_instance``'s keywords (messages name them so).
    keywords: bool = False

    @functools.cached_property
    def names(self) -> tuple[str, ...]:
        """The parameters a call's identity encodes, in order: ``lock_by``'s, or all."""
        by = self.options.by
        if by is None or callable(by):
            return tuple(p.name for p in self.params)
        return tuple(by)

    @functools.cached_property
    def positional(self) -> tuple[str, ...] | None:
        """The parameters' names when every parameter is positional-or-keyword: then a call
        with one positional argument per parameter and no keywords binds them in order."""
        if all(p.kind is _POSITIONAL_OR_KEYWORD for p in self.params):
            return tuple(p.name for p in self.params)
        return None

    @functools.cached_property
    def name_keys(self) -> tuple[str | None, ...]:
        """The JSON text of each of :attr:`names` in the canonical encoding."""
        return tuple(_scalar_json(name) for name in self.names)

    @functools.cached_property
    def name_positions(self) -> tuple[int, ...] | None:
        """Where each of :attr:`names` is among :attr:`positional` (``None`` without it)."""
        positional = self.positional
        if positional is None or not set(self.names) <= set(positional):
            return None
        return tuple(positional.index(name) for name in self.names)

    @functools.cached_property
    def every_position(self) -> bool:
        """Whether :attr:`names` are all the parameters, in order (no ``lock_by`` list)."""
        return self.name_positions == tuple(range(len(self.params)))


def run_function(task: Any) -> tuple[Any, bool]:
    """The function behind ``task.run`` and whether it takes ``self`` (``bind=True``)."""
    run = inspect.getattr_static(type(task), "run")
    if isinstance(run, staticmethod):
        return run.__func__, False
    return run, True


def check_ignored_options(task: Any) -> None:
    """Raise :class:`~celery_redlock.LockConfigError` for a ``lock_*`` option nothing reads.

    ``@app.task(lock_by=[...])`` without ``base=LockedTask`` builds a plain task class with a
    ``lock_by`` attribute, and the task runs unlocked; under ``@single_instance``, which reads
    only its own keywords, ``@app.task(lock_on_contention="fail")`` is ignored the same way.
    So is one a ``task_annotations`` entry naming the task sets, unless a base class defines it
    too (then a WARNING, below). Left alone: every option of a
    ``LockedTask``, and one set by the ``"*"`` entry or an annotation object (they may reach
    every task: ``{"*": {"lock_ttl": 60}}``). An option a base class that is not a
    ``LockedTask`` defines is logged as a WARNING, not refused: it may be a lock base class of
    the user's own that reads a ``lock_ttl`` of its own, or a base that should have derived
    from ``LockedTask`` (``class Base(Task): lock_by = [...]``), whose tasks run unlocked.
    Checked once per task: at worker start, and at the first publish in a process
    (``celery_redlock._celery.routing``). A decorator between ``@app.task`` and
    ``@single_instance`` is refused there too.
    """
    if isinstance(task, Proxy):
        task = task._get_current_object()
    if task.__dict__.get("_redlock_read_options"):
        return
    _check_nothing_between(task, run_function(task)[0])
    cls = type(task)
    if getattr(cls, OPTIONS_ATTR, None) is not None:  # a LockedTask reads them all
        task.__dict__["_redlock_read_options"] = True
        return
    annotations = task.app.annotations
    annotated = {key for found in resolve_annotations(annotations, task) for key in found}
    # An entry naming this very task is meant for it: checked as an @app.task option is.
    named = {
        key
        for annotation in annotations
        if isinstance(annotation, MapAnnotation) and task.name in annotation
        for key in annotation[task.name]
    }
    keywords = getattr(run_function(task)[0], OPTIONS_ATTR, None) is not None
    inherited: dict[type, list[str]] = {}
    for option in OPTIONS.values():
        attr = option.attr
        defined = [k for k in cls.__mro__ if attr in vars(k)]
        if not defined or (attr in annotated and attr not in named):
            continue
        if defined[-1] is not cls:  # a base class defines it (a hand-rolled lock's, maybe)
            inherited.setdefault(defined[-1], []).append(attr)
            continue
        given = f"task {task.name}: option {attr}={getattr(cls, attr)!r}"
        source = f"task_annotations[{task.name!r}]" if attr in named else "@app.task"
        if keywords:
            raise LockConfigError(
                f"{given} is given to {source}, and @single_instance reads only its own "
                f"keywords; expected @single_instance({option.name}=...)"
            )
        if attr in named:
            given += f" (from {source})"
        raise LockConfigError(
            f"{given} is ignored: the task is not locked; expected "
            f"@app.task(base=LockedTask, {attr}=...), or @single_instance({option.name}=...) "
            "under @app.task"
        )
    for base, attrs in inherited.items():
        name = base.__name__
        logger.warning(
            "task %s: option %s of its base class %s is not read: %s",
            task.name,
            ", ".join(attrs),
            name,
            "@single_instance reads only its own keywords"
            if keywords
            else f"{name} is not a LockedTask, and the task takes no lock; if {name} is meant "
            f"to lock, expected class {name}(LockedTask)",
        )
    task.__dict__["_redlock_read_options"] = True


def spec_of(task: Any) -> Spec | None:
    """The lock spec of ``task``, or ``None`` if the task is not locked. Cached per task.

    Celery's own tasks are never locked, also when ``Celery(task_cls=LockedTask)`` makes
    them ``LockedTask`` instances: timeline without this, (1) a chord's callback polls
    through ``celery.chord_unlock``, a canvas runs ``celery.map`` or ``celery.chain``; (2)
    each took a lock on its arguments, so two identical ``add.map([...])`` calls at once ran
    one body and the other returned ``None``, and every poll cost a lock round trip.

    ``task`` may be the lazy proxy ``@app.task`` returns before the app is finalized. The
    first call also makes :class:`~celery_redlock.LockContended` and
    :class:`~celery_redlock.LockUnavailable` expected outcomes of the task (``task.throws``),
    so Celery logs such a failure at INFO without a traceback, under both APIs (the engine
    logs a WARNING naming ``redlock_url`` before failing for an outage). Under
    ``@single_instance`` it also keeps those outcomes from ``autoretry_for``
    (:func:`_outcomes_not_autoretried`).
    """
    if isinstance(task, Proxy):
        task = task._get_current_object()
    cached = task.__dict__.get("_redlock_spec", False)
    if cached is not False:
        return cached  # type: ignore[no-any-return]
    fun, bound = run_function(task)
    _check_nothing_between(task, fun)
    options = getattr(fun, OPTIONS_ATTR, None) or getattr(type(task), OPTIONS_ATTR, None)
    spec = None
    if options is not None and not _of_celery(fun):
        check_task_name(task.name, options)
        params = parameters_of(fun, bound)
        if bound:
            check_bound_by(f"task {task.name}", "by", fun, options.by, params)
        keywords = getattr(fun, OPTIONS_ATTR, None) is not None
        spec = Spec(options, params, bound, f"task {task.name}", keywords)
        expected = tuple(e for e in (LockContended, LockUnavailable) if e not in task.throws)
        if expected:
            task.throws = (*task.throws, *expected)
        if getattr(fun, OPTIONS_ATTR, None) is not None:
            _outcomes_not_autoretried(task)
    task.__dict__["_redlock_spec"] = spec
    return spec


def _of_celery(fun: Any) -> bool:
    """Whether ``fun`` is the function of one of Celery's own tasks: ``celery.app.builtins``
    (``celery.chord_unlock``, ``celery.map``...) or ``celery.contrib.testing.tasks``
    (``celery.ping``, which ``start_worker`` sends to see the worker answer). No package of
    yours can be named ``celery``."""
    return str(getattr(fun, "__module__", None) or "").partition(".")[0] == "celery"


def _check_nothing_between(task: Any, fun: Any) -> None:
    """Refuse a decorator between ``@app.task`` and ``@single_instance``: a function that the
    task's ``run`` reaches through ``__wrapped__``, or through the closure of a wrapper (how a
    decorator without ``functools.wraps`` keeps the function it wraps: :func:`_passes_on`), is
    a ``@single_instance`` wrapper, and ``run`` is not one. A task whose own function keeps a
    locked function in its closure and calls it (a task factory's ``fan(items)``) is left
    alone: that call is a plain call, unlocked as documented. One whose function takes the
    locked function's parameters, ``*args`` or ``**kwargs`` looks like a wrapper and is
    refused (the message says to reach the locked function through a module-level name):
    a refusal at start is better than a task that runs unlocked without a word.

    The lock's wrapper, not being the task's ``run``, took the call for a plain function call
    and ran it unlocked: two workers ran one key at once, without a word (and with
    ``functools.wraps``, which copies the options, ``hold_lock`` took the task for locked).
    Taking the lock there would be no better: under a transaction decorator it would be
    released before the commit, and the next holder would read the old rows. A decorator
    that keeps the function elsewhere (an attribute of an object) cannot be seen.
    """
    name = task.name
    if fun in WRAPPERS:
        _check_not_stacked(task, fun)
        return
    seen, todo = {id(fun)}, [fun]
    while todo and len(seen) < 100:  # a few decorators deep; a loop is no decorator of ours
        current = todo.pop()
        inner = [getattr(current, "__wrapped__", None)]
        for cell in getattr(current, "__closure__", None) or ():
            try:
                kept = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if _passes_on(current, kept):
                inner.append(kept)
        for found in inner:
            if found is None or id(found) in seen:
                continue
            if found in WRAPPERS:
                raise LockConfigError(
                    f"task {name}: a decorator sits between @app.task and @single_instance, "
                    "and the task would run unlocked; expected @single_instance directly "
                    "under @app.task, with other decorators below it (a task function that "
                    "calls a @single_instance function it keeps in a closure looks the same "
                    "when it takes that function's parameters, *args or **kwargs: call it "
                    "through a module-level name)"
                )
            seen.add(id(found))
            todo.append(found)


def check_not_stacked(task: Any) -> None:
    """:func:`_check_not_stacked` at a call: the inner of two stacked wrappers is calling."""
    run = run_function(task)[0]
    if run in WRAPPERS:
        _check_not_stacked(task, run, finalize=True)


def _check_not_stacked(task: Any, fun: Any, *, finalize: bool = False) -> None:
    """Refuse a ``@single_instance`` wrapper ``fun`` (the task's ``run``) over another, with or
    without decorators between them (``functools.wraps``), unless the inner one is the ``run``
    of a task of the app: a locked function locked again for a second task, under a lock name
    of its own, each task taking its own lock. Timeline of two stacked on one function: (1) the
    task runs the outer wrapper, which takes its lock; (2) it calls the inner one, which is no
    task's ``run``, as a plain function, unlocked; (3) two calls of the inner key ran at once,
    without a word. Judged when the app knows all its tasks: finalized (at worker start), or
    ``finalize`` (at a call, when the inner wrapper finds itself called plainly: never while
    the app finalizes, when some of its tasks are not made yet)."""
    inner = inspect.unwrap(getattr(fun, "__wrapped__", fun), stop=lambda f: f in WRAPPERS)
    if inner is fun or inner not in WRAPPERS or not (finalize or task.app.finalized):
        return
    if any(run_function(other)[0] is inner for other in list(task.app.tasks.values())):
        return
    raise LockConfigError(
        f"task {task.name}: @single_instance is applied twice; a task takes one lock: "
        "expected one @single_instance (by= naming every parameter of the key), or the "
        "second lock taken in the body with celery_redlock.Lock"
    )


def _passes_on(wrapper: Any, kept: Any) -> bool:
    """Whether ``wrapper`` looks like a decorator's wrapper of the function ``kept`` it closes
    over: it takes ``*args`` or ``**kwargs``, or the parameters ``kept`` takes. A task's own
    function calling a locked function it keeps (``fan(items)`` calling ``process(x)``) does
    not; nor does a closure over a task (no function)."""
    if not (inspect.isfunction(wrapper) and inspect.isfunction(kept)):
        return False
    params = inspect.signature(wrapper, follow_wrapped=False).parameters
    varying = {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD}
    if any(p.kind in varying for p in params.values()):
        return True
    try:
        taken = inspect.signature(kept).parameters
    except ValueError:  # it wraps what has no signature (a builtin, ``getattr``): its own
        taken = inspect.signature(kept, follow_wrapped=False).parameters
    return list(params) == list(taken)


#: Celery's builtin tasks that call a task's body as a plain function, item after item, in
#: one execution of their own: ``task.map()``, ``task.starmap()``, ``task.chunks()``.
MAPPERS = frozenset({"celery.map", "celery.starmap", "celery.chunks"})


def check_not_mapped(task: Any, mapper: Any) -> None:
    """Refuse a locked ``task`` mapped by ``mapper``, one of :data:`MAPPERS` (its name, in
    the caller; in a worker, the running task, whose call's ``task`` argument must name
    ``task``: a body of another mapped task may call ``task`` directly, as any body may): its
    items would run as direct calls, which take no lock. Timeline without this: (1)
    ``sync_account(42)`` runs, holding its key; (2) ``sync_account.chunks([(42,)], 1)`` is
    published; (3) its ``celery.starmap`` calls the body directly: the same account is synced
    twice at once, without a word. Raises :class:`LockConfigError` naming the fix."""
    name = mapper if isinstance(mapper, str) else getattr(mapper, "name", None)
    if name not in MAPPERS or spec_of(task) is None:
        return
    if not isinstance(mapper, str):
        mapped = (getattr(mapper.request, "kwargs", None) or {}).get("task")
        if not isinstance(mapped, Mapping) or mapped.get("task") != task.name:
            return
    short = task.name.rpartition(".")[2] or task.name
    raise LockConfigError(
        f"task {task.name}: map(), starmap() and chunks() run its body as a plain function "
        f"call inside one {name} task, which takes no lock for any item; expected "
        f"group({short}.s(*args) for args in items), whose calls each take the lock"
    )


#: What the lock makes a call end with (not the task's own failures): never autoretried.
_OUTCOMES = (LockContended, LockUnavailable, LockConfigError)


def _outcomes_not_autoretried(task: Any) -> None:
    """Keep the lock's outcomes out of a ``@single_instance`` task's ``autoretry_for``.

    ``LockedTask`` takes the lock in ``__call__``, outside the ``run`` that Celery's
    ``autoretry_for`` wraps; the decorator's wrapper *is* that ``run``. Timeline without this:
    (1) ``autoretry_for=(Exception,)``, ``on_contention="fail"``; (2) the key is held, and the
    engine raises ``LockContended``; (3) autoretry catches it and retries the call: a busy key
    uses up the retries the task keeps for its own errors, and the call does not fail. So
    Celery's wrapping (``add_autoretry_behaviour``, which keeps the plain ``run`` as
    ``_orig_run``) is redone with these outcomes added to ``dont_autoretry_for``; a task
    without ``autoretry_for`` has no wrapping, and is left alone. Done at the first
    :func:`spec_of`, which a worker runs for every task at start, before any call; a
    ``LockContended`` the body itself raises (a ``Lock`` of its own) is not autoretried
    either. Pinned on the lowest and newest Celery by ``test_call_overrides.py``.
    """
    plain = task.__dict__.get("_orig_run")
    if plain is None:
        return
    kept = tuple(getattr(task, "dont_autoretry_for", ()) or ())
    if all(issubclass(outcome, kept) for outcome in _OUTCOMES):
        return
    task.run = plain
    del task._orig_run
    add_autoretry_behaviour(task, dont_autoretry_for=(*kept, *_OUTCOMES))


def check_bound_by(
    owner: str, option: str, fun: Any, by: Any, params: list[inspect.Parameter]
) -> None:
    """Refuse ``by`` naming a bound task's first parameter, which is then the task itself:
    ``@single_instance`` checks its names before ``bind=True`` is known, and under
    ``base=LockedTask`` the name would be called unknown. A first parameter that is not
    ``self`` is most likely an argument the function meant to take, and ``bind=True`` the
    mistake: the message says both fixes."""
    first = next(iter(inspect.signature(fun).parameters), None)
    if not isinstance(by, (list, tuple)) or first not in by:
        return
    names = ", ".join(p.name for p in params)
    message = (
        f"{owner}: {option}={list(by)!r} names {first!r}, which is the task itself "
        "(bind=True), not an argument of the call; expected parameter names among: "
    )
    if first in ("self", "task"):
        raise LockConfigError(message + (names or "none (use by=())"))
    raise LockConfigError(
        f"{message}{names or 'none'}. If {first!r} is an argument of the call, give the task "
        f"a parameter of its own before it (def {fun.__name__}(self, {first}, ...)), or drop "
        "bind=True"
    )


def check_task_name(name: str | None, options: TaskLockOptions) -> None:
    """Refuse a task name that cannot name its lock: one with ``{`` or ``}`` (they delimit the
    key's Redis Cluster hash tag) or a control character (a line break splits the lines of
    every tool that lists the key), when no ``lock_name`` replaces it."""
    if options.name is None and name and (set(name) & set("{}") or not name.isprintable()):
        shown = name if name.isprintable() else repr(name)
        raise LockConfigError(
            f"task {shown}: its name contains '{{', '}}' or a non-printable character, which a "
            "lock name cannot (braces delimit the key's Redis Cluster hash tag); expected a task "
            "name without them, or a lock_name option (name= with @single_instance) without them"
        )


def lock_name_for(
    task: Any, spec: Spec, args: Any, kwargs: Any, settings: Settings | None = None
) -> str:
    """The lock name (``<lock_name>:<digest>``) of one call of ``task``; the digest is keyed
    with ``redlock_key_secret`` when the app sets one (``settings``: the app's, if known)."""
    args, kwargs, by = args or (), kwargs or {}, spec.options.by
    if callable(by):
        serializer = getattr(task, "serializer", None) or task.app.conf.task_serializer
        canonical = encode_call(spec.owner, spec.params, args, kwargs, by, serializer)
    else:
        names, positions = spec.names, spec.name_positions
        if not kwargs and positions is not None and len(args) == len(spec.params):
            values: Sequence[Any] = (  # bound in order: no dict
                args if spec.every_position else [args[i] for i in positions]
            )
        else:
            arguments = bind(spec.owner, spec.params, args, kwargs)
            values = [arguments[name] for name in names]
        canonical = _encode_values(spec.owner, names, spec.name_keys, values)
    secret = (settings if settings is not None else settings_for(task.app)).key_secret
    return _keys.task_lock_name(spec.options.name or task.name, canonical, secret)


#: The apps :func:`import_task_modules` imported the task modules of.
_modules_imported: weakref.WeakSet[Any] = weakref.WeakSet()
#: Held across an import: a second caller meanwhile waits for it (reentrant: an imported
#: module may look a task up).
_importing = Guard(reentrant=True)


def import_task_modules(app: Any, *, set_up: bool = False) -> None:
    """Import the modules a worker of ``app`` imports at start (``include``, ``imports``,
    ``autodiscover_tasks()``), once per app, for a process that looks tasks up by name (the
    command line, the standalone dashboard) and is no worker. Timeline without it, in the
    usual layout: (1) ``celery -A proj`` loads ``proj``, whose tasks live in ``proj.tasks``;
    (2) a worker holds ``redlock:{grp:...}`` for ``proj.tasks.sync`` (``lock_name="grp"``);
    (3) ``celery redlock inspect proj.tasks.sync`` did not know the task, looked for
    ``proj.tasks.sync:`` and said it was not held, as did the dashboard's task filter.

    Called at a command's or the dashboard's start: under Django, Celery's fixup runs
    ``django.setup()`` and the system checks on this import (its ``import_modules`` signal).
    ``set_up``: the process is set up already (the dashboard mounted in a Django site, at its
    first page): the modules are imported without that signal, since ``django.setup()`` again
    would re-run ``LOGGING`` (switching off the loggers made since) and reset the request's
    script prefix; Django's apps are searched for ``tasks`` modules directly. A second caller
    during the import waits for it (a threaded web server's first pages), so that none sees
    half the tasks. A module that fails to import is a WARNING: the tasks defined there are
    looked up by their own names."""
    current = getattr(app, "_get_current_object", None)
    if current is not None:  # a Proxy (current_app): the app it stands for now
        app = current()
    with _importing:
        if app in _modules_imported:
            return
        try:
            if set_up:
                for module in app.loader.default_modules:
                    app.loader.import_task_module(module)
                app.autodiscover_tasks(force=True)
            else:
                app.loader.import_default_modules()
        except Exception as exc:  # a worker-only dependency, a failing check: it goes on
            logger.warning(
                "could not import the task modules of app %s (%s: %s): a task defined there "
                "is looked up by its own name, not its lock_name",
                app.main,
                type(exc).__name__,
                exc,
            )
        _modules_imported.add(app)


def lock_name_of(app: Any, task_name: str) -> str:
    """The lock name of ``app``'s task ``task_name``: its ``lock_name``, else its own name
    (also for a name that is no locked task of ``app``). Only the tasks imported so far are
    known: see :func:`import_task_modules`."""
    task = app.tasks.get(task_name)
    spec = spec_of(task) if task is not None else None
    return (spec.options.name or task_name) if spec is not None else task_name


def locked_spec(task: Any, caller: str) -> Spec:
    """The lock spec of ``task`` given to the public helper ``caller``: :class:`TypeError`
    when it is no Celery task (a function, a task's ``.run``, a task name), :class:`ValueError`
    when it is a task that takes no lock."""
    if not isinstance(task, (Task, Proxy)):
        raise TypeError(
            f"{caller}() takes a Celery task (what @app.task returns), got "
            f"{type(task).__name__} {task!r}"
            + (": decorate it with @app.task too" if hasattr(task, OPTIONS_ATTR) else "")
        )
    spec = spec_of(task)
    if spec is None:
        raise ValueError(
            f"{task.name} is not a locked task (use base=LockedTask or @single_instance)"
        )
    return spec


def lock_key(task: Any, /, *args: Any, **kwargs: Any) -> str:
    """The Redis key that calling ``task(*args, **kwargs)`` would lock.

    Raises :class:`TypeError` when ``task`` is no Celery task or an argument has no canonical
    encoding, and :class:`ValueError` when ``task`` is not a locked task.
    """
    spec = locked_spec(task, "lock_key")
    settings = settings_for(task.app)
    return _keys.keys_for(settings.prefix, lock_name_for(task, spec, args, kwargs)).lock
