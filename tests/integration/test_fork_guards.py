"""A forked child never waits on a guard that a thread of its parent held at the fork.

Celery's prefork pool forks a child to replace a killed one while the main process's threads
(the counters' flush, a renewal, a give-back) may hold a module's guard to build a client: the
child's copy stayed held, and its first lock operation waited forever.
"""

from __future__ import annotations

import importlib
import os
import re
import signal
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import celery_redlock
from celery_redlock._redis.forks import Guard

#: Every module-level guard of the package (module, attribute).
GUARDS = [
    ("celery_redlock._redis.clients", "_guard"),
    ("celery_redlock._redis.nodes", "_single_guard"),
    ("celery_redlock._redis.subscriptions", "_subscribers_guard"),
    ("celery_redlock._redis.renewal", "_guard"),
    ("celery_redlock._redis.givebacks", "_sender_lock"),
    ("celery_redlock.metrics", "_guard"),
    ("celery_redlock._celery.identity", "_importing"),
]


def guard(module: str, name: str) -> Any:
    return getattr(importlib.import_module(module), name)


@contextmanager
def held(*guards: Any) -> Iterator[None]:
    """``guards`` held by another thread until the block ends."""
    taken, done = threading.Event(), threading.Event()

    def hold() -> None:
        for each in guards:
            each.acquire()
        taken.set()
        done.wait(30)
        for each in guards:
            each.release()

    thread = threading.Thread(target=hold)
    thread.start()
    assert taken.wait(10)
    try:
        yield
    finally:
        done.set()
        thread.join(10)


def in_child(work: Callable[[], bool]) -> int:
    """The exit code of a forked child running ``work`` (0 when it returned True; killed by
    an alarm after 10 s)."""
    with warnings.catch_warnings():  # Python 3.12+: forking a process that has threads
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # never back into pytest
        code = 2
        try:
            signal.alarm(10)
            code = 0 if work() else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.parametrize(("module", "name"), GUARDS)
def test_a_guard_held_at_the_fork_is_free_in_the_child(module: str, name: str) -> None:
    each = guard(module, name)
    with held(each):
        assert in_child(lambda: bool(each.acquire(timeout=5))) == 0


def test_a_child_forked_while_every_guard_was_held_locks_at_once(redis_url: str) -> None:
    """The timeline of the module doc: the child takes and gives back a lock on a URL the
    parent never used (so it builds its client, node and watchdog)."""

    def lock() -> bool:
        own = celery_redlock.Lock(redis_url.rsplit("/", 1)[0] + "/7", "forked", auto_renew=True)
        if not own.acquire(blocking=False):
            return False
        own.release()
        return True

    with held(*(guard(module, name) for module, name in GUARDS)):
        assert in_child(lock) == 0


def test_every_module_level_lock_of_the_package_is_a_guard() -> None:
    """A new module-level ``threading.Lock`` would bring the hang back."""
    package = Path(celery_redlock.__file__).parent
    plain = re.compile(r"^(\w+)(?:: [^=]+)? = threading\.R?Lock\(\)", re.MULTILINE)
    found = {
        f"{path.relative_to(package)}:{name}"
        for path in package.rglob("*.py")
        for name in plain.findall(path.read_text())
    }
    assert found == {"_redis/owner.py:_block_guard"}  # made anew by owner._forked
    assert all(isinstance(guard(module, name), Guard) for module, name in GUARDS)
