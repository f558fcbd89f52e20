"""What ``celery redlock`` makes of one lock without asking Redis: an ``ls --json`` row, and
which key names are slots of a lock.

``ls --json`` writes its rows itself (:func:`celery_redlock.cli._format.json_row`, faster
than a dict and ``json.dumps`` per lock): each must be the text ``json.dumps(lock.as_dict(),
sort_keys=True)`` gives, for every type a field can have.
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_redlock._celery.options import settings_for
from celery_redlock._redis import owner as _owner
from celery_redlock.cli import HeldLock, LockStore
from celery_redlock.cli._format import json_row as _json_row
from celery_redlock.cli._format import table

DIGEST = "0123456789abcdef0123456789abcdef"


def held(
    name: str,
    value: str,
    slot: int = 1,
    ttl: float | None = 29.997,
    fencing_token: int | None = None,
    overrides: dict[str, Any] | None = None,
) -> HeldLock:
    key = f"redlock:{{{name}}}" + (f":{slot}" if slot > 1 else "")
    holder = _owner.parse(value)
    return HeldLock(key, name, slot, value, holder, ttl, fencing_token, overrides)


LOCKS = {
    "a task's lock": held(
        f"proj.sync:{DIGEST}", _owner.new_token("1ea26372-71fa", host="w1@web-1", pid=3023)
    ),
    "a value that is not a token, no expiry": held(
        "plain", "not|a token", ttl=None, fencing_token=1_795_982_683_000_001
    ),
    "a semaphore slot": held("sem", _owner.new_token("t"), slot=3, ttl=0.001, fencing_token=7),
    "control and non-ASCII characters": held(
        'evil\n"name"\x1b[31m\\é☃\U0001f512',
        _owner.new_token('task "ü"\t\U0001f512', host="w|x%@hôst"),
        ttl=1e-05,
    ),
    "overrides, nested and unsorted": held(
        f"proj.o:{DIGEST}",
        _owner.new_token("t-2"),
        ttl=3600.0,
        overrides={"wait_timeout": 5.0, "ttl": 40, "by": ["a", 1, None], "z": {"b": 1, "a": "é"}},
    ),
    "empty task id and overrides": held("e", _owner.new_token(""), overrides={}),
}


@pytest.mark.parametrize("lock", LOCKS.values(), ids=LOCKS)
def test_a_row_is_what_json_dumps_writes(lock: HeldLock) -> None:
    assert _json_row(lock) == json.dumps(lock.as_dict(), sort_keys=True)


@pytest.fixture
def store() -> Iterator[LockStore]:
    app = Celery("rows", set_as_current=False)
    app.conf.redlock_url = "redis://127.0.0.1:1/0"  # never connected to
    yield LockStore(settings_for(app))
    app.close()


@pytest.mark.parametrize(
    ("key", "parsed"),
    [
        ("redlock:{job}", ("redlock:{job}", "job", 1)),
        ("redlock:{a:b}:2", ("redlock:{a:b}:2", "a:b", 2)),
        ("job", ("redlock:{job}", "job", 1)),  # a bare name: its first slot
        ("redlock:{}", None),  # an empty name
        ("redlock:{a}b}", None),  # a brace in the name
        ("redlock:{a}:1", None),  # the first slot has no suffix
        ("redlock:{a}:02", None),
        ("redlock:{a}:0", None),
        ("redlock:{a}:fence", None),
        ("redlock:{a}:\u00b2", None),  # a digit int() refuses: was a ValueError
        ("redlock:{a}:\u0663", None),  # a digit int() reads, not written by keys_for
        ("redlock:{a}:10000000000", ("redlock:{a}:10000000000", "a", 10**10)),  # builds no slots
        ("proj.t:x", ("redlock:{proj.t:x}", "proj.t:x", 1)),
        ("other:{a}", None),  # a bare name cannot have braces
    ],
)
def test_which_keys_are_slots(store: LockStore, key: str, parsed: object) -> None:
    assert store.parse(key) == parsed


@pytest.mark.parametrize(
    ("encoding", "name", "written", "width"),
    [
        ("latin-1", "snow-\u2603", "snow-\\u2603", 11),
        ("utf-8", "\u65e5\u672c-sync", "\u65e5\u672c-sync", 9),
        ("utf-8", "cafe\u0301s", "cafe\u0301s", 5),
    ],
)
def test_a_tables_columns_line_up_as_the_terminal_shows_them(
    encoding: str, name: str, written: str, width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name stdout writes as an escape (Latin-1), or with wide characters (two columns each)
    or a combining mark (none), leaves the next column where the header put it."""
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BytesIO(), encoding=encoding))
    header, row, plain = table([["NAME", "TTL"], [name, "1.0s"], ["plain", "2.0s"]]).splitlines()
    at = width + 2  # the widest name, then two spaces
    assert header == "NAME" + " " * (at - 4) + "TTL"
    assert row == written + " " * (at - width) + "1.0s"
    assert plain == "plain" + " " * (at - 5) + "2.0s"
