"""How ``celery redlock`` prints: escaped cells, aligned tables, ``ls --json`` rows.

Text output escapes control characters (``\\n`` in a lock name that a plain ``Lock`` user
chose, say), so each lock stays one row; ``--json`` escapes them as JSON does. Characters the
terminal's encoding cannot show are written as ``\\N`` escapes (:func:`tolerant_streams`), never
a ``UnicodeEncodeError``.
"""

from __future__ import annotations

import io
import json
import sys
import unicodedata
from collections.abc import Sequence
from json.encoder import encode_basestring_ascii as _json_str
from typing import Any

import click

from .._redis.inventory import HeldLock, iso


def tolerant_streams() -> None:
    """Make stdout and stderr write what their encoding cannot show as backslash escapes.

    Timeline of the crash this prevents: (1) stdout is Latin-1 (``LANG=de_DE.ISO-8859-1``) or
    a pipe with ``PYTHONIOENCODING=ascii:strict``; (2) a lock name holds ``☃``, or an argument
    was not UTF-8 (Python keeps its bytes as lone surrogates); (3) printing it raised
    ``UnicodeEncodeError`` in the middle of a listing.
    """
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")


def safe(value: Any) -> str:
    """``value`` as text with control characters escaped (``\\n``, ``\\x1b``): one row stays
    one line, and a terminal never interprets a lock name."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def _written(text: str) -> str:
    """``text`` as stdout writes it: what its encoding cannot show becomes escapes."""
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    return text.encode(encoding, "backslashreplace").decode(encoding)


def _columns(text: str) -> int:
    """How many terminal columns ``text`` takes: two for a wide character (``日``), none for a
    combining mark."""
    return sum(
        0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1
        for c in text
    )


def table(rows: Sequence[Sequence[str]]) -> str:
    """``rows`` (the first is the header) as left-aligned columns.

    Widths are counted on the text as the terminal shows it. Timeline of the misalignment this
    prevents: (1) stdout is Latin-1; (2) a lock name holds ``☃``, one character; (3) stdout
    writes it as the six characters ``\\u2603``, and every later cell of that row sat five
    columns right of its header. A wide character (``日``) shifted its row the same way.
    """
    rows = [[_written(safe(cell)) for cell in row] for row in rows]
    widths = [max(_columns(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(
            cell + " " * (w - _columns(cell)) for cell, w in zip(row, widths, strict=True)
        ).rstrip()
        for row in rows
    )


def ttl(seconds: float | None) -> str:
    return "no expiry" if seconds is None else f"{seconds:.1f}s"


def fence(lock: HeldLock) -> str:
    """The FENCE cell: ``-`` for a one-server lock, which stores no fencing counter."""
    return "-" if lock.fencing_token is None else str(lock.fencing_token)


def who(lock: HeldLock) -> str:
    h = lock.holder
    if h is None:
        return "a value that is not a celery-redlock token"
    ended = " (ended; kept by its lock_cooldown)" if h.cooling else ""
    return safe(f"task {h.task_id or '(none)'} on {h.host}, pid {h.pid}{ended}")


def dead_released(verb: str, released: int, kept: int, gone: int) -> str:
    """The summary of a release of dead workers' locks: a lock that expired or changed owner
    between the listing and its release is neither released nor kept, and said apart."""
    meanwhile = f"; {gone} expired or changed owner meanwhile" if gone else ""
    return f"{verb} {released} lock(s) of dead workers; kept {kept}{meanwhile}"


def shown_overrides(overrides: dict[str, Any] | None) -> str:
    if not overrides:
        return "none"
    return ", ".join(f"lock_{name}={value!r}" for name, value in sorted(overrides.items()))


def dump(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True))


#: An ``ls --json`` row: :meth:`HeldLock.as_dict` as ``json.dumps(..., sort_keys=True)`` lays
#: it out, its keys in sorted order.
_ROW = (
    '{"acquired_at": %s, "acquired_ms": %s, "cooldown": %s, "fencing_token": %s, "host": %s, '
    '"key": %s, '
    '"lock_name": %s, "name": %s, "overrides": %s, "pid": %s, "slot": %s, "task_id": %s, '
    '"token_prefix": %s, "ttl": %s}'
)


def json_row(lock: HeldLock) -> str:
    """``json.dumps(lock.as_dict(), sort_keys=True)``, written out: without a dict and a key
    sort per row, in half the time (a unit test pins the equality). ``%s`` of an int or a
    finite float is its JSON text."""
    h = lock.holder
    overrides = lock.overrides
    return _ROW % (
        _json_str(iso(h.acquired_ms)) if h else "null",
        h.acquired_ms if h else "null",
        "true" if h and h.cooling else "false",
        "null" if lock.fencing_token is None else lock.fencing_token,
        _json_str(h.host) if h else "null",
        _json_str(lock.key),
        _json_str(lock.lock_name),
        _json_str(lock.name),
        "null" if overrides is None else json.dumps(overrides, sort_keys=True),
        h.pid if h else "null",
        lock.slot,
        _json_str(h.task_id) if h else "null",
        _json_str(lock.value[:8]),
        "null" if lock.ttl is None else lock.ttl,
    )
