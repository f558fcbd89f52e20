"""Canonical encoding of call arguments, the input of a lock key's digest.

Two calls get the same encoding exactly when they bind to the same parameter values:
``f(1, b=2)``, ``f(a=1, b=2)`` and ``f(b=2, a=1)`` agree (arguments are bound to the signature,
defaults applied), while ``f(1)``, ``f("1")``, ``f(True)`` and ``f(1.0)`` all differ.

Values are encoded as they survive Celery's JSON serializer, so the key computed by the caller
(``lock_key``) equals the one the worker computes: tuples and lists are the same sequence, and
``datetime``, ``date``, ``time``, ``UUID``, ``Decimal`` and ``bytes`` (which kombu's JSON carries)
are tagged with their type. Every container is tagged too (``["L", ...]``, ``["D", ...]``), so
no user value can imitate another's encoding. Anything else raises :class:`TypeError` naming
the parameter: a silent ``repr()`` fallback would give keys that differ between processes.
"""

from __future__ import annotations

import datetime
import decimal
import functools
import inspect
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

_SCALARS = (str, int, float, type(None))


def _encode(value: Any, owner: str, param: str) -> Any:
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, (list, tuple)):
        return ["L", *(_encode(v, owner, param) for v in value)]
    if isinstance(value, Mapping):
        items = sorted((_key(k, owner, param), _encode(v, owner, param)) for k, v in value.items())
        return ["D", *([k, v] for k, v in items)]
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return ["T", type(value).__name__, value.isoformat()]
    if isinstance(value, (uuid.UUID, decimal.Decimal)):
        return ["T", type(value).__name__, str(value)]
    if isinstance(value, (bytes, bytearray)):
        return ["T", "bytes", bytes(value).hex()]
    raise TypeError(
        f"{owner}: argument {param!r} has type {type(value).__name__}, which has no canonical "
        "encoding for the lock key; pass JSON-compatible values, or choose the identity with "
        "lock_by (parameter names or a callable returning a string)"
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


def bind(
    owner: str, params: list[inspect.Parameter], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """Bind a call to ``params`` with defaults applied; TypeError if it does not fit."""
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
) -> bytes:
    """The canonical bytes identifying one call of the task called ``owner``.

    ``by`` selects the identity: ``None`` all parameters, a sequence some of them (in the given
    order), a callable a string computed from ``(args, kwargs)``.
    """
    if callable(by):
        ident = by(tuple(args), dict(kwargs))
        if not isinstance(ident, str):
            raise TypeError(
                f"{owner}: lock_by callable returned {type(ident).__name__}; expected str"
            )
        return json.dumps(["C", ident], ensure_ascii=False).encode()
    arguments = bind(owner, params, args, kwargs)
    names = [p.name for p in params] if by is None else list(by)
    encoded = [[name, _encode(arguments[name], owner, name)] for name in names]
    return json.dumps(["A", *encoded], ensure_ascii=False, separators=(",", ":")).encode()
