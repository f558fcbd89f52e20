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
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py

import celery_redlock
from celery_redlock._redis.forks import Guard
from celery_redlock.testing import wait_until

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
    # Each made anew by its module's at-fork handler (owner._forked, forks._forked).
    assert found == {"_redis/owner.py:_block_guard", "_redis/forks.py:_renewing"}
    assert all(isinstance(guard(module, name), Guard) for module, name in GUARDS)


def test_a_child_forked_while_a_renewal_was_in_flight_holds_renews_and_releases(
    redis_url: str,
) -> None:
    """Helper probe: a lock's own renewal guard (and state guard) were plain locks, copied
    held into a child forked while the parent's renewal of that lock was in flight. The
    child, taking the lock as a holder of its own (docs/guide.md), never renewed it (its
    key expired under it, without a word) and waited forever in its ``release()``."""
    client = redis_py.Redis.from_url(redis_url)
    parent = os.getpid()
    in_flight, go_on = threading.Event(), threading.Event()

    class SlowRenewal(celery_redlock.Lock):
        def do_extend(self, token: str, ttl: float) -> Any:
            if os.getpid() == parent and not go_on.is_set():
                in_flight.set()
                go_on.wait(10)
            return super().do_extend(token, ttl)

    lock = SlowRenewal(redis_url, "forked-renewal", ttl=1.0, auto_renew=True)
    assert lock.acquire(blocking=False)
    assert in_flight.wait(10)  # the parent's renewal holds the lock's guards

    def release_when_the_child_waits() -> None:
        wait_until(lambda: client.exists("child-waits"), 10, "the child to wait")
        go_on.set()
        lock.release()

    def child() -> bool:
        client.set("child-waits", 1)
        if not lock.acquire(timeout=8):
            return False
        taken = time.monotonic()
        while time.monotonic() - taken < 1.5:  # past its TTL: held only if renewed
            time.sleep(0.05)
        renewed = lock.held and bool(client.exists(lock.key))
        lock.release()
        return renewed

    releaser = threading.Thread(target=release_when_the_child_waits)
    releaser.start()
    try:
        assert in_child(child) == 0
    finally:
        go_on.set()
        releaser.join(10)
    client.delete("child-waits")
