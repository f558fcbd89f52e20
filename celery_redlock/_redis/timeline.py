"""The opt-in ring of recent lock events, in Redis: push one entry, read the newest ones.

One list, ``<prefix>:timeline`` (:func:`~celery_redlock._redis.keys.timeline_key`), newest
first. :func:`push` runs one script (:data:`~celery_redlock._redis.scripts.RING_PUSH`:
``LTRIM``, ``LPUSH``, ``PEXPIRE``, atomically), so the list never holds more than ``size``
entries whatever the traffic, and expires :data:`TTL_MS` after the last push. It cuts before
it pushes: an ACL user allowed ``LPUSH`` but not ``LTRIM`` is refused before the list grows.
Entries are compact JSON objects; :func:`read` skips what is not one with a whole ``t`` (ms).

What goes in an entry, and when to push, is the Celery layer's decision
(:mod:`celery_redlock._celery.timeline`); this module only runs the script, which the
``timeline`` feature of :data:`celery_redlock._redis.probe.FEATURES` declares.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import redis as redis_py

from ..exceptions import LockUnavailable
from .clients import UNAVAILABLE_ERRORS, client_for, redact
from .commands import run_script
from .keys import timeline_key
from .scripts import RING_PUSH

__all__ = ["TTL_MS", "push", "read"]

#: The ring expires this long after its last event.
TTL_MS = 3600 * 1000

_ERRORS: tuple[type[BaseException], ...] = (*UNAVAILABLE_ERRORS, redis_py.RedisError)


def push(url: str, prefix: str, entry: Mapping[str, Any], size: int) -> None:
    """Push ``entry`` to the ring under ``prefix`` on ``url`` and cut it to ``size`` entries.

    Raises what the client raises (a node that does not answer, a refused command).
    """
    data = json.dumps(dict(entry), separators=(",", ":"))
    run_script(client_for(url), RING_PUSH, [timeline_key(prefix)], [data, size, TTL_MS])


#: Entries :func:`read` asks for in one ``LRANGE``.
PAGE = 10_000


def read(url: str, prefix: str, limit: int, since_ms: int | None = None) -> list[dict[str, Any]]:
    """The ring's newest ``limit`` entries, oldest first (entries that are not JSON skipped);
    with ``since_ms``, only as far back as needed to hold every entry from then on: pages of
    :data:`PAGE` entries are read, newest first, until one reaches back past ``since_ms``
    (entries pushed meanwhile shift the list: what a page reads again is skipped).

    :raises ~celery_redlock.LockUnavailable: naming the node (credentials hidden) when it does
        not answer or refuses.
    """
    out: list[dict[str, Any]] = []
    client, key = client_for(url), timeline_key(prefix)
    limit = max(limit, 1)
    previous: list[Any] = []
    for first in range(0, limit, PAGE):
        try:
            raw_entries = client.lrange(key, first, min(first + PAGE, limit) - 1)
        except _ERRORS as exc:
            shown = redact(url)
            raise LockUnavailable(
                f"cannot read the lock Redis: {shown} ({redact(exc)})", nodes=(shown,)
            ) from exc
        fresh = raw_entries[_overlap(previous, raw_entries) :]
        previous = raw_entries
        for raw in fresh:
            try:
                entry = json.loads(raw)
            except ValueError:
                continue
            if isinstance(entry, dict) and isinstance(entry.get("t"), int):
                out.append(entry)
        done = since_ms is not None and bool(out) and out[-1]["t"] < since_ms
        if done or len(raw_entries) < PAGE:
            break
    out.reverse()
    return out


def _overlap(previous: list[Any], page: list[Any]) -> int:
    """How many entries at the start of ``page`` were read already, at the end of the page
    before it (``previous``): each push between the two reads shifts the list by one. Timeline
    without this: (1) a page ends with a ``released``; (2) a worker pushes an event; (3) the
    next page starts with that ``released`` again, which, its ``acquired`` paired already,
    draws a second bar from the window's left edge."""
    if not previous or not page:
        return 0
    last = previous[-1]
    for i, raw in enumerate(page[: len(previous)]):
        if raw == last and previous[len(previous) - 1 - i :] == page[: i + 1]:
            return i + 1
    return 0
