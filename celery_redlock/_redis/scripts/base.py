"""How a script is declared: its source, the commands it runs, and its ``EVALSHA`` digest
(:func:`celery_redlock._redis.commands.run_script` runs it).

Each script opens with its contract (``KEYS[]``, ``ARGV[]``, what it returns) and is declared
once as a :class:`Script`, with the Redis commands it runs. Those declarations are what the
worker's startup check probes for an ACL user (:mod:`celery_redlock._redis.probe`), and a test
pins each against the ``redis.call``/``redis.pcall`` of its source, so the check and the
scripts cannot disagree.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Script:
    """One script: a name for messages, its Lua source, and the commands it runs."""

    name: str
    source: str
    #: The commands it runs with ``redis.call``: a refusal of any of them stops the script.
    commands: tuple[str, ...]
    #: The commands it runs only with ``redis.pcall``: it works on (in part) without them.
    tolerated: tuple[str, ...] = ()


@functools.cache
def sha1(source: str) -> str:
    """The SHA1 under which Redis caches ``source`` (what ``EVALSHA`` takes); computed once
    per script."""
    return hashlib.sha1(source.encode()).hexdigest()
