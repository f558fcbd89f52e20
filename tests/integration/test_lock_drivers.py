"""Every lock behaviour, pinned once for both drivers: the thread :class:`celery_redlock.Lock`
and the asyncio :class:`celery_redlock.asyncio.Lock` (and each over a ``valkey`` client, when
valkey is installed), against real ``redis-server`` processes.

A test receives a :class:`Driver`: ``d.lock(...)`` builds the driver's lock and ``d(x)`` runs
what the lock returned (a value for the thread lock, a coroutine on the test's own event loop
for the asyncio lock), so one test body pins both. Behaviours only one driver has
(cancellation, the thread watchdog) are tested there alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import gc
import importlib.util
import logging
import os
import pickle
import re
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py
import redis.asyncio as aioredis
from celery.local import Proxy

import celery_redlock
import celery_redlock.asyncio
from celery_redlock import LockContended, LockLost, LockNotOwned, LockUnavailable
from celery_redlock._redis import aionodes, clients, givebacks, subscriptions
from celery_redlock._redis.core import Extended
from celery_redlock._redis.inventory import Inventory
from celery_redlock._redis.keys import high_water_of
from celery_redlock._redis.lock import release_attempt
from celery_redlock._redis.nodes import Quorum, SingleNode
from celery_redlock._redis.owner import new_token, parse
from celery_redlock._redis.scripts.lock import RELEASE, release_call
from celery_redlock.testing import RedisServer
from support.apps import NotRedis, lock_keys
from support.clock import FakeClock

HAS_VALKEY = importlib.util.find_spec("valkey") is not None


class Driver:
    """One lock implementation, and how a test runs what it returns."""

    def __init__(self, kind: str, client: str) -> None:
        self.kind = kind
        self.client = client
        self.loop: asyncio.AbstractEventLoop | None = None
        self._made: list[Any] = []

    @property
    def is_async(self) -> bool:
        return self.kind == "asyncio"

    def target(self, url: str) -> Any:
        """What the lock is given for ``url``: the URL itself, or a client of the driver's."""
        if self.client == "url":
            return url
        if self.is_async:
            import valkey.asyncio

            client = valkey.asyncio.Valkey.from_url(url)
        else:
            import valkey

            client = valkey.Valkey.from_url(url)
        self._made.append(client)
        return client

    def lock(self, redis: Any, name: str, ttl: float = 30.0, **options: Any) -> Any:
        if isinstance(redis, str) or (
            isinstance(redis, list) and all(isinstance(r, str) for r in redis)
        ):
            redis = (
                [self.target(r) for r in redis] if isinstance(redis, list) else self.target(redis)
            )
        cls = celery_redlock.asyncio.Lock if self.is_async else celery_redlock.Lock
        return cls(redis, name, ttl, **options)

    def __call__(self, value: Any) -> Any:
        if not self.is_async:
            return value
        if self.loop is None:
            self.loop = asyncio.new_event_loop()
        return self.loop.run_until_complete(value)

    def close(self) -> None:
        """Close the clients made and the loop (once: a test may close before its fixture)."""
        made, self._made = self._made, []
        for client in made:
            with contextlib.suppress(Exception):
                self(client.aclose()) if self.is_async else client.close()
        if self.loop is not None:  # as asyncio.run ends: background give-backs are cancelled,
            for _ in range(3):  # and those their cancellation starts
                pending = asyncio.all_tasks(self.loop)
                if not pending:
                    break
                for task in pending:
                    task.cancel()
                self.loop.run_until_complete(asyncio.wait(pending))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()
            self.loop = None


DRIVERS = [
    pytest.param(("thread", "url"), id="thread"),
    pytest.param(("asyncio", "url"), id="asyncio"),
    pytest.param(
        ("thread", "valkey"),
        id="thread-valkey",
        marks=pytest.mark.skipif(not HAS_VALKEY, reason="valkey is not installed"),
    ),
    pytest.param(
        ("asyncio", "valkey"),
        id="asyncio-valkey",
        marks=pytest.mark.skipif(not HAS_VALKEY, reason="valkey is not installed"),
    ),
]


@pytest.fixture(params=DRIVERS)
def d(request: pytest.FixtureRequest) -> Iterator[Driver]:
    driver = Driver(*request.param)
    yield driver
    driver.close()


@pytest.fixture(params=DRIVERS[:2])
def d2(request: pytest.FixtureRequest) -> Iterator[Driver]:
    """The two drivers over URLs only (for tests where the client makes no difference)."""
    driver = Driver(*request.param)
    yield driver
    driver.close()


def wait_until(condition: Callable[[], Any], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(0.01)


@contextlib.contextmanager
def acl_user(r: redis_py.Redis, name: str, *rules: str) -> Iterator[str]:
    """An ACL user ``name`` with ``rules`` (on keys and channels ``redlock*``); its password."""
    r.execute_command(
        "ACL",
        "SETUSER",
        name,
        "reset",
        "on",
        ">pw",
        "~redlock*",
        "resetchannels",
        "&redlock*",
        *rules,
    )
    try:
        yield "pw"
    finally:
        r.execute_command("ACL", "DELUSER", name)


def user_url(server: RedisServer, user: str) -> str:
    return f"redis://{user}:pw@127.0.0.1:{server.port}/0"


#: The documented least-privilege rules (docs/guide.md), waiter queue included.
RULES = [
    "-@all",
    "+evalsha",
    "+script|load",
    "+get",
    "+set",
    "+del",
    "+pexpire",
    "+pttl",
    "+time",
    "+publish",
    "+subscribe",
    "+ping",
    "+zadd",
    "+zrem",
    "+zpopmin",
    "+exists",
    "+zrange",
]


# -- acquire / release / extend ------------------------------------------------------------------


def test_acquire_extend_release(d: Driver, redis_url: str, r: redis_py.Redis) -> None:
    lock = d.lock(redis_url, "basic", ttl=5, owner="task-1", host="w1")
    assert not lock.held
    assert d(lock.acquire(blocking=False)) and lock.held and not lock.lost
    assert r.get(lock.key) == lock.token.encode() and d(lock.locked())
    owner = parse(r.get(lock.key))
    assert owner is not None and (owner.task_id, owner.host, owner.pid) == (
        "task-1",
        "w1",
        os.getpid(),
    )
    assert 4.0 < (d(lock.remaining_ttl()) or 0) <= 5.0
    assert isinstance(lock.fencing_token, int)
    with pytest.raises(RuntimeError, match="already acquired"):
        d(lock.acquire(blocking=False))
    d(lock.extend(60))
    assert 50_000 < r.pttl(lock.key) <= 60_000
    d(lock.release())
    assert not lock.held and not lock.lost and lock.token is None
    assert lock_keys(r) == [] and d(lock.remaining_ttl()) is None and not d(lock.locked())
    with pytest.raises(LockNotOwned):
        d(lock.release())
    with pytest.raises(LockNotOwned):
        d(lock.extend())
    assert d(lock.acquire(blocking=False))  # free again, and reusable
    d(lock.release())


@pytest.mark.parametrize("keep", [None, "1", -1, True])
def test_a_release_with_a_bad_keep_is_refused_and_keeps_the_lock(
    d: Driver, redis_url: str, r: redis_py.Redis, keep: Any
) -> None:
    """``keep=None`` passed the check (only a truthy ``keep`` was checked): the object
    dropped its token, then the release failed with a ``TypeError``, leaving the key held
    for its TTL, unreleasable (a second ``release()`` said "not acquired")."""
    lock = d.lock(redis_url, "bad-keep", ttl=30)
    assert d(lock.acquire(blocking=False))
    with pytest.raises(ValueError, match=r"release keep must be seconds >= 0"):
        d(lock.release(keep=keep))
    assert lock.held
    d(lock.release())
    assert not r.exists(lock.key)


def test_the_blocks_exception_survives_a_release_redis_does_not_answer(
    d2: Driver, caplog: pytest.LogCaptureFixture
) -> None:
    """The body raised, then Redis was gone at the release: the caller got
    :class:`LockUnavailable` instead of the body's exception (and, for asyncio, a cancelled
    task ended not cancelled)."""
    with RedisServer() as server:
        lock = d2.lock(server.url, "exit-down", ttl=30)
        if d2.is_async:

            async def cancelled_inside() -> bool:
                entered = asyncio.Event()

                async def body() -> None:
                    async with lock:
                        server.stop()
                        entered.set()
                        await asyncio.sleep(60)

                task = asyncio.ensure_future(body())
                await entered.wait()
                task.cancel()
                await asyncio.wait([task])
                return task.cancelled()

            with caplog.at_level(logging.WARNING, logger="celery_redlock.lock"):
                assert d2(cancelled_inside())
        else:
            with (
                caplog.at_level(logging.WARNING, logger="celery_redlock.lock"),
                pytest.raises(KeyError, match="the body's"),
                lock,
            ):
                server.stop()
                raise KeyError("the body's")
    assert "not released on the way out of a block that raised" in caplog.text
    assert not lock.held


class SlowRelease(celery_redlock.Lock):
    """A thread lock whose first release waits, inside its call, until told to go on."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.inside, self.go = threading.Event(), threading.Event()

    def do_release(self, token: str, keep: float = 0) -> bool:
        if not self.inside.is_set():
            self.inside.set()
            assert self.go.wait(10)
        return super().do_release(token, keep)


class SlowAsyncRelease(celery_redlock.asyncio.Lock):
    """The asyncio twin of :class:`SlowRelease`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.inside, self.go = asyncio.Event(), asyncio.Event()

    async def do_release(self, token: str, keep: float = 0) -> bool:
        if not self.inside.is_set():
            self.inside.set()
            await asyncio.wait_for(self.go.wait(), 10)
        return await super().do_release(token, keep)


def test_a_release_while_another_is_under_way_is_not_owned_thread(
    redis_url: str, r: redis_py.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """One object released from two threads: the second release used to find the key gone
    and raise LockLost, with an ERROR "lost", though nothing expired or changed owner."""
    lock = SlowRelease(redis_url, "twice", ttl=10)
    assert lock.acquire(blocking=False)
    first = threading.Thread(target=lock.release)
    first.start()
    assert lock.inside.wait(10)
    with pytest.raises(LockNotOwned):
        lock.release()
    lock.go.set()
    first.join(10)
    assert not first.is_alive() and not lock.lost and not r.exists(lock.key)
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR]


def test_a_release_while_another_is_under_way_is_not_owned_asyncio(
    redis_url: str, r: redis_py.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        lock = SlowAsyncRelease(redis_url, "twice-async", ttl=10)
        assert await lock.acquire(blocking=False)
        first = asyncio.ensure_future(lock.release())
        await lock.inside.wait()
        with pytest.raises(LockNotOwned):
            await lock.release()
        lock.go.set()
        await first  # released, no LockLost
        assert not lock.lost and not r.exists(lock.key)

    asyncio.run(main())
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR]


def test_a_second_lock_cannot_acquire_and_sees_the_holder(
    d: Driver, redis_url: str, r: redis_py.Redis
) -> None:
    first = d.lock(redis_url, "seen", ttl=10, owner="task-1", host="w1")
    second = d.lock(redis_url, "seen", ttl=10, owner="task-2", host="w2")
    assert d(first.acquire(blocking=False))
    assert not d(second.acquire(blocking=False))
    assert not d(second.acquire(blocking=True, timeout=0))
    assert not second.held and second.token is None
    assert second.last_holder is not None and second.last_holder.task_id == "task-1"
    assert second.last_holder.host == "w1" and second.last_holder.token == first.token
    assert second.last_holder_ttl is not None and 9.0 < second.last_holder_ttl <= 10.0
    with pytest.raises(LockNotOwned) as info:
        d(second.release())
    assert info.value.key == second.key
    d(first.release())
    assert d(second.acquire(blocking=False))
    assert second.last_holder is None and second.last_holder_ttl is None
    d(second.release())


def test_release_of_a_lock_taken_over_is_lost_and_leaves_the_new_owner(
    d2: Driver, redis_url: str, r: redis_py.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    lock = d2.lock(redis_url, "taken", ttl=10, owner="task-7")
    assert d2(lock.acquire(blocking=False))
    token = lock.token
    assert token is not None
    r.set(lock.key, "someone-else", keepttl=True)
    with pytest.raises(LockLost) as info:
        d2(lock.release())
    assert info.value.key == lock.key
    assert f"lost (token {token[:8]}…" in caplog.text  # the ERROR names the token released
    assert ", task task-7): " in caplog.text  # and which call: several run one task
    assert lock.lost and not lock.held and r.get(lock.key) == b"someone-else"
    r.delete(lock.key)


def test_a_fencing_token_read_before_a_loss_is_none_after_it(
    d2: Driver, redis_url: str, r: redis_py.Redis
) -> None:
    """What ``current_fencing_token()`` promises: ``None`` once the lock was lost, also when
    the token was read (and cached) while it was held."""
    lock = d2.lock(redis_url, "fenced-then-lost", ttl=10)
    assert d2(lock.acquire(blocking=False))
    assert lock.fencing_token is not None
    r.set(lock.key, "someone-else", keepttl=True)
    with pytest.raises(LockLost):
        d2(lock.extend())
    assert lock.lost and lock.fencing_token is None
    r.delete(lock.key)


def test_a_loss_names_the_fencing_token_only_if_one_was_read(
    d2: Driver, redis_url: str, r: redis_py.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Helper probe, round 3, session 22: the loss's ERROR said "fencing token None" for a
    single node's lock whose token nobody read (the thread lock reads it on first use on
    Redis 7, where its acquire is a plain ``SET``; the asyncio lock, whose property cannot
    wait, and Redis 6.2's acquire script read it with the acquire)."""
    said, tokens = [], []
    for read in (False, True):
        lock = d2.lock(redis_url, f"lost-unread-{read}", ttl=10)
        assert d2(lock.acquire(blocking=False))
        tokens.append(lock.fencing_token if read else lock._fencing_token)  # no read: as known
        r.set(lock.key, "someone-else", keepttl=True)
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="celery_redlock.lock"), pytest.raises(LockLost):
            d2(lock.extend())
        said.append(" ".join(rec.getMessage() for rec in caplog.records))
        r.delete(lock.key)
    first = ", no fencing token read)" if tokens[0] is None else f", fencing token {tokens[0]})"
    assert first in said[0] and "None" not in said[0], said[0]
    assert f", fencing token {tokens[1]})" in said[1], said[1]


def test_a_fencing_token_read_while_held_is_none_after_release(
    d2: Driver, redis_url: str, r: redis_py.Redis
) -> None:
    """``None`` if not held: a token read (and cached) while held is not returned after the
    release, when a write fenced with it would pass as the holder's."""
    lock = d2.lock(redis_url, "fenced-then-released", ttl=10)
    assert d2(lock.acquire(blocking=False))
    assert lock.fencing_token is not None
    d2(lock.release())
    assert not lock.held and lock.fencing_token is None
    assert lock_keys(r) == []


# -- loss by clock (drift 2) ---------------------------------------------------------------------


def test_extend_is_capped_at_max_hold_and_checks_its_ttl(
    d2: Driver, redis_url: str, r: redis_py.Redis
) -> None:
    """``extend`` never takes the lock past acquisition + ``max_hold`` (as renewal does, and
    as a task's hard time limit caps it), and refuses a TTL ``Lock()`` would refuse."""
    lock = d2.lock(redis_url, "extend-capped", ttl=2, max_hold=3)
    assert d2(lock.acquire(blocking=False))
    d2(lock.extend(100))
    assert 2_000 < r.pttl(lock.key) <= 3_000
    for ttl in (10**12, float("inf"), float("nan"), "3", True, 0, -1, 1e-9):
        with pytest.raises(ValueError, match=r"extend ttl must be seconds >= 0.001"):
            d2(lock.extend(ttl))
    d2(lock.release())


def test_an_extend_past_max_hold_is_a_lost_lock(d2: Driver, redis_url: str) -> None:
    """Past acquisition + ``max_hold`` the key has expired (every TTL is capped there): an
    extend raised ``LockNotOwned``, where a release raises ``LockLost`` (helper probe)."""
    clock = FakeClock()
    lock = d2.lock(redis_url, "extend-past-cap", ttl=5, max_hold=1, clock=clock)
    assert d2(lock.acquire(blocking=False))
    clock.now += 1.2
    with pytest.raises(LockLost, match=r"it reached max_hold=1s"):
        d2(lock.extend())
    assert lock.lost
    with contextlib.suppress(LockLost):  # the fake clock ran ahead: the key is still there
        d2(lock.release())


def test_an_extend_overtaken_by_a_release_of_the_same_object_is_not_a_loss(
    d2: Driver, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Helper probe: one object, an extend in one thread (task) and a release in another: the
    extend found the key gone and raised ``LockLost``, though nothing expired or changed
    owner (37 to 42 times in 8 s of four threads)."""
    lock = d2.lock(redis_url, "extend-overtaken", ttl=30)
    extend = lock.do_extend
    if d2.is_async:

        async def overtaken(token: str, ttl: float) -> Extended:
            await lock.release()  # lands while the extend is on its way
            return await extend(token, ttl)  # type: ignore[no-any-return]

    else:

        def overtaken(token: str, ttl: float) -> Extended:  # type: ignore[misc]
            lock.release()
            return extend(token, ttl)  # type: ignore[no-any-return]

    lock.do_extend = overtaken
    assert d2(lock.acquire(blocking=False))
    with (
        caplog.at_level(logging.ERROR, logger="celery_redlock.lock"),
        pytest.raises(LockNotOwned, match="released while the extend was on its way"),
    ):
        d2(lock.extend())
    assert not lock.lost and caplog.records == []


def test_a_semaphore_is_locked_while_any_slot_is_held(
    d2: Driver, redis_url: str, r: redis_py.Redis
) -> None:
    """An observer (a semaphore object that holds nothing) sees every slot, not the first."""
    first = d2.lock(redis_url, "sem-observed", ttl=30, limit=2)
    second = d2.lock(redis_url, "sem-observed", ttl=10, limit=2)
    observer = d2.lock(redis_url, "sem-observed", ttl=30, limit=2)
    assert d2(first.acquire(blocking=False)) and d2(second.acquire(blocking=False))
    d2(first.release())  # slot 1 free, slot 2 held
    assert second.key != first.keys.lock
    assert d2(observer.locked())
    assert 9 < d2(observer.remaining_ttl()) <= 10
    assert 9 < d2(second.remaining_ttl()) <= 10
    d2(second.release())
    assert not d2(observer.locked()) and d2(observer.remaining_ttl()) is None


def test_one_object_acquired_from_two_threads_or_tasks_at_once_is_refused(
    d2: Driver, redis_url: str, r: redis_py.Redis
) -> None:
    """A second ``acquire()`` on an object that is acquiring is a RuntimeError: two slots of a
    semaphore taken through one object left one of them held until its TTL."""
    lock = d2.lock(redis_url, "sem-shared", ttl=30, limit=2)
    inside, go_on = threading.Event(), threading.Event()
    original = lock.do_acquire

    if d2.is_async:

        async def held_up(token: str, ttl: float) -> Any:
            inside.set()
            while not go_on.is_set():
                await asyncio.sleep(0.01)
            return await original(token, ttl)

        async def both() -> bool:
            first = asyncio.ensure_future(lock.acquire(blocking=False))
            while not inside.is_set():
                await asyncio.sleep(0.01)
            with pytest.raises(RuntimeError, match="being acquired by this object"):
                await lock.acquire(blocking=False)
            go_on.set()
            return await first

        lock.do_acquire = held_up
        assert d2(both())
    else:

        def blocked(token: str, ttl: float) -> Any:
            inside.set()
            assert go_on.wait(10)
            return original(token, ttl)

        lock.do_acquire = blocked
        results: list[bool] = []
        thread = threading.Thread(target=lambda: results.append(lock.acquire(blocking=False)))
        thread.start()
        assert inside.wait(10)
        with pytest.raises(RuntimeError, match="being acquired by this object"):
            lock.acquire(blocking=False)
        go_on.set()
        thread.join(10)
        assert results == [True]
    assert lock_keys(r) == [lock.key.encode()]  # one slot taken
    d2(lock.release())
    assert lock_keys(r) == []


def test_a_forked_child_leaves_its_parents_lock_alone(redis_url: str, r: redis_py.Redis) -> None:
    """A child forked inside ``with lock:`` inherits the object, not the lock: leaving the
    ``with`` block does nothing there, and ``release()`` is :class:`LockNotOwned`. There the
    object is not ``held`` and has no fencing token (the parent's would let the child's
    writes pass a fence as the parent's), and it may acquire as a holder of its own."""
    lock = celery_redlock.Lock(redis_url, "forked", ttl=30)
    with lock:
        assert lock.fencing_token is not None
        pid = os.fork()
        if pid == 0:  # the child: no assertion may raise here, only the exit code says
            code = 3
            try:
                lock.release()
            except LockNotOwned as exc:
                code = 0 if "is a fork of that one" in str(exc) else 2
            except BaseException:
                code = 4
            lock.__exit__(None, None, None)
            if lock.held or lock.fencing_token is not None:
                code = 5
            elif lock.acquire(blocking=False):  # the parent holds it: contended, no error
                code = 6
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert r.get(lock.key) == lock.token.encode()
    assert r.get(lock.keys.lock) is None


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"auto_renew": "no"}, "Lock auto_renew must be True or False, got 'no'"),
        ({"auto_renew": 1}, "Lock auto_renew must be True or False, got 1"),
        ({"prefix": None}, "Lock prefix must be a non-empty string without"),
        ({"prefix": ""}, "Lock prefix must be a non-empty string without"),
        ({"prefix": "a{b"}, "Lock prefix must be a non-empty string without"),
        ({"prefix": "a\n"}, "Lock prefix must be a non-empty string without"),
        ({"owner": None}, "Lock owner must be a string, got None"),
        ({"host": 5}, "Lock host must be a string or None, got 5"),
        ({"clock": None}, "Lock clock must be a function giving seconds, got None"),
        ({"name": "a\nb"}, "lock name 'a\\nb' must not contain control or other"),
        ({"name": "a\x00b"}, "must not contain control or other non-printable"),
        ({"name": "a{b"}, "must not contain '{' or '}'"),
        # Taken, 1e-9 made an acquire return True for a lock already lost.
        ({"ttl": 1e-9}, "Lock ttl must be seconds >= 0.001 (whole milliseconds)"),
        ({"ttl": 0.0009}, "Lock ttl must be seconds >= 0.001 (whole milliseconds)"),
        ({"max_hold": 1e-6}, "Lock max_hold must be seconds >= 0.001 (whole milliseconds)"),
    ],
)
def test_the_constructor_refuses_arguments_of_the_wrong_kind(
    d: Driver, redis_url: str, arguments: dict[str, Any], expected: str
) -> None:
    """Helper probe, round 3: ``auto_renew="no"`` renewed the lock, ``prefix=None`` made the key
    ``None:{n}``, ``owner=None`` was stored as ``|None``, ``Lock(name="a\\nb")`` was taken
    (a task's ``lock_name`` cannot be), and ``host=5`` or ``clock=None`` failed at the first
    ``acquire()`` naming no argument."""
    given = {"name": "kinds", **arguments}  # a copy: the parameters are shared by the drivers
    with pytest.raises(ValueError) as info:
        d.lock(redis_url, **given)
    assert expected in str(info.value)


def test_a_quorum_naming_one_node_twice_is_refused(d: Driver, redis_url: str) -> None:
    """Its attempts would compete with themselves: it never acquired, and reported its own
    attempt as the holder. ``localhost`` and ``127.0.0.1`` are one node."""
    twice = [redis_url, redis_url.replace("127.0.0.1", "localhost"), "redis://127.0.0.1:1/0"]
    with pytest.raises(ValueError, match="lists the same node twice"):
        d.lock(twice, "twice", ttl=10)
    databases = [redis_url.rpartition("/")[0] + f"/{db}" for db in (0, 1, 2)]
    with pytest.raises(ValueError, match="lists the same node twice"):  # one server, one crash
        d.lock(databases, "twice", ttl=10)


@pytest.mark.parametrize("kind", ["thread", "asyncio"])
def test_a_quorum_of_clients_without_a_short_socket_timeout_is_refused_or_warned(
    three: list[RedisServer], kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Helper probe, round 3. Three clients without a socket timeout (redis-py 5's
    ``redis.Redis(port=...)``), one node frozen: the thread lock's second renewal reconnected
    to it and waited for its handshake forever (the lock lost with two of three nodes up,
    every acquire hung); the asyncio lock's ``locked()`` and blocking acquire hung likewise.
    Refused when the lock is built, naming the fix. A timeout longer than the quorum's 0.5 s
    (redis-py 8's default 5 s, retried) is a WARNING, once per client."""
    make: Callable[..., Any] = (
        aioredis.Redis.from_url if kind == "asyncio" else redis_py.Redis.from_url
    )
    cls: Any = celery_redlock.asyncio.Lock if kind == "asyncio" else celery_redlock.Lock
    urls = [s.url for s in three[:2]]  # URLs get the quorum's own timeout
    with pytest.raises(ValueError) as info:
        cls([*urls, make(three[2].url, socket_timeout=None)], "untimed", ttl=10)
    assert f"client of 127.0.0.1:{three[2].port} has no socket timeout" in str(info.value)
    assert "socket_timeout=0.5" in str(info.value)
    long = make(three[2].url, socket_timeout=5)
    with caplog.at_level(logging.WARNING, logger="celery_redlock.lock"):
        for _ in range(2):
            assert cls([*urls, long], "long", ttl=10).key == "redlock:{long}"
        short = [make(s.url, socket_timeout=0.5) for s in three]
        assert cls(short, "short", ttl=10).key == "redlock:{short}"
    (warning,) = [r.getMessage() for r in caplog.records if "socket timeout" in r.getMessage()]
    assert f"client of 127.0.0.1:{three[2].port} has a socket timeout of 5s" in warning


@pytest.mark.parametrize("how", ["pickle", "copy", "deepcopy"])
def test_a_lock_cannot_be_pickled_or_copied(
    d2: Driver, redis_url: str, r: redis_py.Redis, how: str
) -> None:
    """A copy would share the owner token: two objects each acting as the one holder."""
    lock = d2.lock(redis_url, "copied", ttl=30)
    assert d2(lock.acquire(blocking=False))
    make = {"pickle": pickle.dumps, "copy": copy.copy, "deepcopy": copy.deepcopy}[how]
    with pytest.raises(TypeError, match="'copied' cannot be pickled or copied: its owner token"):
        make(lock)
    d2(lock.release())
    assert lock_keys(r) == []


def test_a_fixed_ttl_lock_is_lost_by_its_clock_once_its_ttl_passed(
    d2: Driver, redis_url: str, r: redis_py.Redis
) -> None:
    """No renewal: from the TTL's end, by the lock's clock, it says lost and not held, like a
    lock whose renewal died with its event loop. (The asyncio lock said held on main.)"""
    clock = FakeClock()
    lock = d2.lock(redis_url, "by-clock", ttl=10, clock=clock)
    assert d2(lock.acquire(blocking=False))
    clock.now += 9.9
    assert lock.held and not lock.lost
    # A probe read "held fencing_token=None" as a held lock without a token (the thread
    # lock reads it on first use; the asyncio lock, which cannot, as it acquires).
    assert repr(lock).endswith((" held fencing_token=(not read)>", f"={lock._fencing_token}>"))
    assert "=None" not in repr(lock)
    assert lock.fencing_token is not None
    assert f" held fencing_token={lock.fencing_token}>" in repr(lock)
    clock.now += 0.2
    assert lock.lost and not lock.held
    assert lock.fencing_token is None  # another owner may exist: no token to write with
    assert repr(lock).endswith(" lost fencing_token=None>")  # its repr said held
    with pytest.raises(RuntimeError, match="lost while held by this object; release"):
        d2(lock.acquire(blocking=False))
    with contextlib.suppress(LockLost):
        d2(lock.release())
    assert lock_keys(r) == []


def test_an_asyncio_lock_whose_loop_ended_says_lost_after_its_lease(redis_url: str) -> None:
    clock = FakeClock()
    lock = celery_redlock.asyncio.Lock(redis_url, "loop-ended", ttl=5, auto_renew=True, clock=clock)
    assert asyncio.run(lock.acquire(blocking=False))  # the loop, and its renewal task, end here
    assert lock.held
    clock.now += 5
    assert lock.lost and not lock.held


def _take_in_two_loops(redis_url: str, r: redis_py.Redis) -> None:
    client = aioredis.Redis.from_url(redis_url)
    lock = celery_redlock.asyncio.Lock(client, "other-loop", ttl=30)

    async def take_and_release() -> None:
        assert await lock.acquire(blocking=False)
        await lock.release()

    async def take_in_another_loop() -> None:
        with pytest.raises(RuntimeError, match="Event loop is closed"):
            await lock.acquire(blocking=False)
        for _ in range(500):  # the give-back runs in this loop's background
            if not r.exists(lock.keys.lock):
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the lock taken by the failed acquire was not given back")

    asyncio.run(take_and_release())
    asyncio.run(take_in_another_loop())
    assert not lock.held


# The first loop's connection can only be dropped unclosed (its loop is closed): the misuse
# this test makes, which asyncio reports when the connection is collected.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_an_asyncio_acquire_that_raised_no_redis_error_gives_the_lock_back(
    redis_url: str, r: redis_py.Redis
) -> None:
    """A ``redis.asyncio`` client used in a second event loop sends the script, then fails
    with ``RuntimeError: Event loop is closed``: the lock was taken, ``held`` was False, and
    nobody could take it for its TTL. The thread lock gave such a lock back; so does this."""
    _take_in_two_loops(redis_url, r)
    gc.collect()  # the warnings of the dropped connection, here rather than in a later test


# -- refused replies (drift 1) -------------------------------------------------------------------


def test_a_user_without_set_gets_lock_unavailable(
    d: Driver, redis_server: RedisServer, r: redis_py.Redis
) -> None:
    rules = [rule for rule in RULES if rule != "+set"]
    with acl_user(r, "noset", *rules):
        lock = d.lock(user_url(redis_server, "noset"), "refused", ttl=10)
        with pytest.raises(LockUnavailable, match="refused") as raised:
            d(lock.acquire(blocking=False))
        assert raised.value.key == lock.key
    assert lock_keys(r) == []


def test_a_user_who_may_not_run_scripts_is_refused_at_acquire(
    d: Driver, redis_server: RedisServer, r: redis_py.Redis
) -> None:
    """Not at the release: the thread lock acquires with a plain ``SET``, but not before its
    connection ran a script, so the lock is never taken by a user who could not release it."""
    rules = [rule for rule in RULES if rule != "+evalsha"]
    with acl_user(r, "cannot-script", *rules):
        lock = d.lock(user_url(redis_server, "cannot-script"), "no-scripts", ttl=10)
        with pytest.raises(LockUnavailable, match="refused") as raised:
            d(lock.acquire(blocking=False))
        assert raised.value.key == lock.key and not lock.held
    assert lock_keys(r) == []


def test_a_user_who_may_not_subscribe_gets_lock_unavailable_from_a_blocking_acquire(
    d: Driver, redis_server: RedisServer, r: redis_py.Redis
) -> None:
    """The refused ``SUBSCRIBE`` of a blocking wait reached the caller as redis-py's
    ``NoPermissionError``, where every other refusal is :class:`LockUnavailable` (and a task's
    ``redlock_on_unavailable`` applies to it)."""
    holder = celery_redlock.Lock(r, "no-subscribe", ttl=30)
    assert holder.acquire(blocking=False)
    rules = [rule for rule in RULES if rule != "+subscribe"]
    with acl_user(r, "cannot-subscribe", *rules):
        lock = d.lock(user_url(redis_server, "cannot-subscribe"), "no-subscribe", ttl=10)
        with pytest.raises(LockUnavailable, match=r"refused .*subscribe") as raised:
            d(lock.acquire(timeout=5))
        assert raised.value.key == lock.key and not lock.held
    assert r.zcard(holder.keys.waiters) == 0
    holder.release()


def test_an_out_of_memory_server_gives_lock_unavailable(
    d: Driver, redis_url: str, r: redis_py.Redis
) -> None:
    lock = d.lock(redis_url, "oom", ttl=10)
    r.config_set("maxmemory-policy", "noeviction")
    r.config_set("maxmemory", 1)
    try:
        with pytest.raises(LockUnavailable, match=r"OOM|maxmemory"):
            d(lock.acquire(blocking=False))
    finally:
        r.config_set("maxmemory", 0)
    assert lock_keys(r) == []


def test_a_server_down_gives_lock_unavailable_naming_it(d: Driver) -> None:
    server = RedisServer()
    lock = d.lock(server.url, "down", ttl=10)
    with pytest.raises(LockUnavailable, match=f"127.0.0.1:{server.port}"):
        d(lock.acquire(blocking=False))
    assert lock.attempts == 1  # a try the server never answered is a try all the same


def test_a_service_that_is_not_redis_gives_lock_unavailable_naming_it(d: Driver) -> None:
    """The URL's port holds another service: redis-py's ``InvalidResponse`` ("Protocol
    Error") reached the caller raw, and a task failed at once, though the worker had said
    its locked tasks follow ``redlock_on_unavailable``. No Redis answers there: unavailable,
    naming the URL."""
    other = NotRedis()
    try:
        lock = d.lock(f"{other.url}/0", "not-redis", ttl=10)
        with pytest.raises(LockUnavailable, match=other.url.removeprefix("redis://")):
            d(lock.acquire(blocking=False))
    finally:
        other.close()


def test_a_port_that_resets_the_connection_names_tls_and_another_service(d: Driver) -> None:
    """A lock URL at RabbitMQ's port (a broker URL copied) is reset as a TLS-only port resets a
    plain connection: the hint named only TLS ("use the rediss scheme"), which misleads."""
    other = NotRedis(resets=True)
    try:
        lock = d.lock(f"{other.url}/0", "reset", ttl=10)
        with pytest.raises(LockUnavailable, match="Connection reset by peer") as raised:
            d(lock.acquire(blocking=False))
    finally:
        other.close()
    assert "use the rediss scheme" in str(raised.value)
    assert "a service that is not Redis (RabbitMQ, say) resets them too" in str(raised.value)


def test_a_url_without_the_password_the_server_wants_is_a_refusal_naming_it(d: Driver) -> None:
    """A client that did not log in may send short commands only: a script (the first acquire
    of either lock) is answered "Protocol error: unauthenticated multibulk length", and
    redis-py 6+'s handshake "HELLO must be called with the client already authenticated": a
    refusal for want of a password, which the message names, not a bare ``ResponseError``."""
    with RedisServer() as server:
        admin = server.client()
        admin.config_set("requirepass", "pw")  # after its start, which logs in without one
        admin.close()
        lock = d.lock(f"redis://127.0.0.1:{server.port}/0", "no-password", ttl=10)
        wanted = r"refused .*\(the server wants a password \(or an ACL user\) that the URL"
        with pytest.raises(LockUnavailable, match=wanted):  # on every redis-py: its handshake
            d(lock.acquire(blocking=False))  # (HELLO, 6+) or the first command is refused


def test_a_wrong_password_is_a_refusal_that_leaves_no_give_back(d: Driver) -> None:
    """Helper probe, round 3: redis-py raises a refused login as a ``ConnectionError``, taken
    for a lost reply: each failed acquire started a give-back that logged in again every
    second for ten minutes, and the asyncio lock warned at loop shutdown of a give-back left
    unanswered. The acquire sent nothing: nothing is given back."""
    with RedisServer() as server:
        admin = server.client()
        admin.config_set("requirepass", "right-password")
        admin.close()
        key = "redlock:{wrong-password}"
        before = _pending_give_backs(key)
        lock = d.lock(f"redis://:wrong-password@127.0.0.1:{server.port}/0", "wrong-password")
        with pytest.raises(LockUnavailable, match=r"refused lock .*invalid username-password"):
            d(lock.acquire(blocking=False))
        if d.is_async:
            assert d(celery_redlock.asyncio.wait_released(timeout=0))
        assert _pending_give_backs(key) == before == 0


def _pending_give_backs(key: str) -> int:
    """The thread locks' give-backs of ``key`` that wait in this process."""
    sender = givebacks._sender
    return 0 if sender is None else sum(entry[3].key == key for entry in sender._heap)


def test_a_database_the_server_lacks_is_a_refusal_naming_the_setting(
    d: Driver, redis_server: RedisServer, r: redis_py.Redis
) -> None:
    """A URL naming database 99 of a server with 16: the connection's ``SELECT`` is refused.
    That is :class:`LockUnavailable`, as every refusal is, not redis-py's bare ``ResponseError``."""
    lock = d.lock(redis_server.url.rsplit("/", 1)[0] + "/99", "no-such-db", ttl=10)
    with pytest.raises(LockUnavailable, match=r"refused .*database number .*`databases` setting"):
        d(lock.acquire(blocking=False))
    assert lock_keys(r) == []


def lost(key: str) -> LockUnavailable:
    """What a lock raises for an attempt whose reply never came."""
    error = LockUnavailable("no answer in time", key=key)
    error.__cause__ = redis_py.exceptions.TimeoutError("Timeout reading from socket")
    return error


class AsyncLostReply(celery_redlock.asyncio.Lock):
    """An asyncio lock whose acquisition runs on Redis, then loses its reply."""

    async def do_acquire(self, token: str, ttl: float) -> Any:
        assert (await super().do_acquire(token, ttl)).acquired
        raise lost(self.key)


class LosesItsFirstReply(redis_py.Redis):
    """A client whose first acquisition (``SET``; the script on Redis 6.2, which refuses
    ``SET NX GET``) runs on the server, then loses its reply."""

    lost = False

    def execute_command(self, *args: Any, **options: Any) -> Any:
        reply = super().execute_command(*args, **options)
        if args[0] in ("SET", "EVALSHA", "EVAL") and not self.lost:
            self.lost = True
            raise redis_py.exceptions.TimeoutError("Timeout reading from socket")
        return reply


def test_a_thread_acquisition_whose_reply_was_lost_is_given_back(
    redis_server: RedisServer, r: redis_py.Redis
) -> None:
    """The ``SET`` took the key, but its reply was lost: the caller gets
    :class:`LockUnavailable`, and the token is given back once Redis answers. Without the
    give-back the key stays, held by nobody, for its whole TTL (60 s here)."""
    client = LosesItsFirstReply(port=redis_server.port)
    lock = celery_redlock.Lock(client, "lost-reply", ttl=60)
    with pytest.raises(LockUnavailable, match="Timeout reading"):
        lock.acquire(blocking=False)
    assert client.lost and not lock.held
    wait_until(lambda: not r.exists(lock.key))


@pytest.mark.parametrize("nodes", [1, 3], ids=["one-node", "quorum"])
def test_an_asyncio_acquisition_whose_reply_was_lost_is_given_back(
    three: list[RedisServer], nodes: int
) -> None:
    urls = [s.url for s in three][:nodes]
    driver = Driver("asyncio", "url")
    try:
        lock = AsyncLostReply(urls if nodes > 1 else urls[0], "lost-reply", ttl=60)
        with pytest.raises(LockUnavailable, match="no answer in time"):
            driver(lock.acquire(blocking=False))
        assert not lock.held

        def given_back() -> bool:
            driver(asyncio.sleep(0.05))  # the give-back runs on the test's loop
            return all(s.client().get(lock.keys.lock) is None for s in three)

        wait_until(given_back)
    finally:
        driver.close()


def bytes_waiting_on(port: int) -> bool:
    """Whether a connection to the server on ``port`` holds bytes it has not read (it is
    frozen with a request in its socket buffer): ``/proc/net/tcp``'s receive queue."""
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            local, queues = fields[1], fields[4]
            if int(local.split(":")[1], 16) == port and int(queues.split(":")[1], 16) > 0:
                return True
    return False


def events_until_deleted(events: Any, turn: Callable[[], Any] | None = None) -> list[bytes]:
    """The keyspace events of a subscribed ``events`` until a ``del``, within 10 s; ``turn``
    is called between reads (an event loop to run meanwhile)."""
    seen: list[bytes] = []

    def deleted() -> bool:
        if turn is not None:
            turn()
        message = events.get_message(timeout=0.05)
        if message is not None:
            seen.append(message["data"])
        return b"del" in seen

    wait_until(deleted)
    return seen


class Interrupted(Exception):
    """Raised from a signal handler, as a time limit's exception is."""


def test_an_interrupted_acquire_a_frozen_server_runs_late_is_given_back(d2: Driver) -> None:
    """Helper probe, round 3. Timeline: (1) the server freezes; (2) an acquire is sent, and
    interrupted while it waits for the reply (an exception from a signal handler;
    ``task.cancel()``); (3) its one give-back fails, the server still frozen; (4) the server
    resumes and runs the acquire: the key was held by nobody for its whole TTL. The give-back
    now goes on until two releases in a row were answered."""
    with RedisServer() as server:
        assert server.process is not None
        admin = server.client()
        admin.config_set("notify-keyspace-events", "K$g")
        lock = d2.lock(f"{server.url}?socket_timeout=0.5", "interrupted", ttl=30)
        for _ in range(2):  # connected, scripts loaded: the next acquire is one request on
            assert d2(lock.acquire(blocking=False))  # that connection, one that Redis runs
            d2(lock.release())  # (6.2 refuses the thread lock's second, a SET NX with GET)
        events = admin.pubsub()
        events.subscribe(f"__keyspace@0__:{lock.key}")
        assert events.get_message(timeout=5) is not None  # subscribed
        server.process.send_signal(signal.SIGSTOP)
        try:
            if d2.is_async:

                async def cancelled() -> None:
                    task = asyncio.ensure_future(lock.acquire(blocking=False))
                    while not bytes_waiting_on(server.port):
                        await asyncio.sleep(0.005)
                    task.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await task
                    # The first give-back, sent in the background, outlives its socket timeout
                    # (the thread lock's is sent before the interruption goes on).
                    await asyncio.sleep(1.5)

                d2(cancelled())
            else:

                def interrupt(*_: Any) -> None:
                    raise Interrupted

                previous = signal.signal(signal.SIGUSR1, interrupt)
                main = threading.get_ident()

                def when_sent() -> None:
                    while not bytes_waiting_on(server.port):
                        time.sleep(0.005)
                    signal.pthread_kill(main, signal.SIGUSR1)

                threading.Thread(target=when_sent, daemon=True).start()
                try:
                    with pytest.raises(Interrupted):
                        lock.acquire(blocking=False)
                finally:
                    signal.signal(signal.SIGUSR1, previous)
        finally:
            server.process.send_signal(signal.SIGCONT)
        # The give-back runs on the asyncio driver's loop: turn it while waiting.
        seen = events_until_deleted(
            events, (lambda: d2(asyncio.sleep(0.05))) if d2.is_async else None
        )
        assert seen[0] == b"set", seen  # the acquire ran late, and was given back (TTL 30 s)
        events.close()
        admin.close()
        d2.close()


def test_a_quorum_release_a_frozen_node_missed_is_given_back_when_it_resumes(
    d2: Driver, three: list[RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    """Node C frozen (SIGSTOP) while a lock acquires on A and B and releases: C's acquire
    waits in its socket buffer (the asyncio client closes that connection when C misses its
    ``node_timeout``, but C still reads what was sent), and the release never reaches it. When
    C resumes it runs the acquire; the give-back then removes it. Without it, C holds the
    released lock for a whole TTL, and one more node down would stop every acquisition of it."""
    urls = [s.url for s in three]
    lock = d2.lock(urls, "q-frozen-release", ttl=60)
    warm = d2.lock(urls, "q-warm", ttl=5)
    assert d2(warm.acquire(blocking=False))  # connections open and scripts loaded on every node
    d2(warm.release())
    c = three[2].client()
    frozen = three[2].process
    assert frozen is not None
    frozen.send_signal(signal.SIGSTOP)
    try:
        assert d2(lock.acquire(blocking=False))
        d2(lock.release())
    finally:
        frozen.send_signal(signal.SIGCONT)

    def on_c(predicate: Callable[[], bool]) -> Callable[[], bool]:
        def check() -> bool:
            if d2.is_async:
                d2(asyncio.sleep(0.05))  # the give-back runs on the driver's loop
            return predicate()

        return check

    wait_until(on_c(lambda: bool(c.exists(lock.keys.high_water))))  # C ran the acquire
    wait_until(on_c(lambda: all(s.client().get(lock.keys.lock) is None for s in three)))
    d2.close()
    gc.collect()
    # The calls the asyncio quorum stopped waiting for were read: asyncio logged no "Task
    # exception was never retrieved" (redis-py ends a cancelled read with its own TimeoutError
    # on Python 3.10).
    assert not [r for r in caplog.records if r.name == "asyncio"], caplog.text


def test_a_frozen_server_that_runs_an_acquisition_late_gets_it_given_back() -> None:
    """The thread lock against a server frozen (SIGSTOP) past the socket timeout with the
    acquisition in its buffer: the server runs it when it resumes, and the give-back, whose
    second release is sent after the server answered the first, removes it. (The asyncio
    client aborts its connection on a timeout, and the server then drops the command.) It
    counted ``SET`` commands: alone in its process, the lock's first acquisition is a script,
    whose ``NOSCRIPT`` came after the timeout (nothing ran); keyspace events now."""
    with RedisServer() as server:
        assert server.process is not None
        admin = server.client()
        admin.config_set("notify-keyspace-events", "K$g")
        lock = celery_redlock.Lock(server.url + "?socket_timeout=0.3", "frozen-set", ttl=60)
        for _ in range(2):  # connected, scripts loaded: the next acquire is one request that
            assert lock.acquire(blocking=False)  # Redis runs (a process's first is a script,
            lock.release()  # a NOSCRIPT the first time; 6.2 refuses the second, a SET ... GET)
        events = admin.pubsub()
        events.subscribe(f"__keyspace@0__:{lock.key}")
        assert events.get_message(timeout=5) is not None  # subscribed
        server.process.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(LockUnavailable, match="did not answer"):
                lock.acquire(blocking=False)
        finally:
            server.process.send_signal(signal.SIGCONT)
        seen = events_until_deleted(events)
        assert seen[0] == b"set", seen  # the acquisition ran late, and was given back (TTL 60 s)
        assert not admin.exists(lock.key)
        events.close()
        admin.close()


def test_scripts_are_loaded_again_after_a_script_flush(
    d: Driver, redis_url: str, r: redis_py.Redis
) -> None:
    lock = d.lock(redis_url, "noscript", ttl=10, limit=2)  # a semaphore runs the acquire script
    r.script_flush()
    assert d(lock.acquire(blocking=False))
    r.script_flush()
    d(lock.extend(20))
    r.script_flush()
    d(lock.release())
    assert lock_keys(r) == []


# -- renewal (drift 3) ---------------------------------------------------------------------------


def failing(d: Driver, error: BaseException) -> type:
    base = celery_redlock.asyncio.Lock if d.is_async else celery_redlock.Lock
    if d.is_async:

        class AsyncFailing(base):  # type: ignore[misc, valid-type]
            async def do_extend(self, token: str, ttl: float) -> Extended:
                raise error

        return AsyncFailing

    class ThreadFailing(base):  # type: ignore[misc, valid-type]
        def do_extend(self, token: str, ttl: float) -> Extended:
            raise error

    return ThreadFailing


@pytest.mark.parametrize(
    "error",
    [
        LockUnavailable("Redis at x did not answer"),
        redis_py.exceptions.ResponseError("BUSY Redis is busy running a script"),
        RuntimeError("a bug in an override"),
    ],
    ids=["unavailable", "error-reply", "bug"],
)
def test_renewal_retries_every_failure_with_one_delay_formula(
    d2: Driver,
    redis_url: str,
    r: redis_py.Redis,
    caplog: pytest.LogCaptureFixture,
    error: Exception,
) -> None:
    """Half the time left, at most ttl/3 and 1 s; under 50 ms, at the lease's end; then lost."""
    clock = FakeClock()
    lock = failing(d2, error)(redis_url, "renew-policy", ttl=3, clock=clock)
    assert d2(lock.acquire(blocking=False))
    with caplog.at_level(logging.WARNING, logger="celery_redlock.lock"):
        assert d2(lock.renew_step()) == pytest.approx(1.0)  # min(ttl/3, 1 s, left/2 = 1.5)
        clock.now += 2.0
        assert d2(lock.renew_step()) == pytest.approx(0.5)  # left/2
        clock.now += 0.94
        assert d2(lock.renew_step()) == pytest.approx(0.06)  # left/2 = 0.03 < 50 ms: at the end
    assert [re.search(r"renewal failed.*s\)", rec.getMessage())[0] for rec in caplog.records] == [
        "renewal failed, retrying (lease ends in 3.0s)",
        "renewal failed, retrying (lease ends in 1.0s)",
        "renewal failed, retrying (lease ends in 0.1s)",
    ]
    clock.now += 0.06
    assert d2(lock.renew_step()) is None and lock.lost
    r.delete(lock.keys.lock)


def test_auto_renew_keeps_a_short_lease_alive(
    d2: Driver, redis_url: str, r: redis_py.Redis
) -> None:
    lock = d2.lock(redis_url, "renewed", ttl=0.6, auto_renew=True)
    assert d2(lock.acquire(blocking=False))
    first = lock.token

    async def later() -> None:
        await asyncio.sleep(1.5)

    d2(later()) if d2.is_async else time.sleep(1.5)
    assert lock.held and r.get(lock.key) == first.encode()
    d2(lock.release())


def test_a_holder_that_blocks_at_once_for_most_of_its_lease_keeps_it_renewed(
    d2: Driver, redis_url: str, r: redis_py.Redis
) -> None:
    """The first renewal is due ttl/3 after the acquisition. The asyncio lock counted it from
    its renewal task's first run: a body that blocked the loop at once for 2/3 of the lease
    (a synchronous call) had its renewal come after the lease, and lost the lock while it ran."""
    lock = d2.lock(redis_url, "busy-at-once", ttl=3, auto_renew=True)

    async def hold() -> None:
        assert await lock.acquire(blocking=False)
        time.sleep(2.2)  # the loop is blocked: the renewal task has not run yet
        await asyncio.sleep(1.5)

    if d2.is_async:
        d2(hold())
    else:
        assert lock.acquire(blocking=False)
        time.sleep(2.2 + 1.5)
    assert lock.held and not lock.lost and r.get(lock.key) == (lock.token or "").encode()
    d2(lock.release())


def test_a_renewal_confirmed_after_its_lease_ended_says_so_and_renews_sooner(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A starved process (the probe: 4 CPU hogs above a worker at nice 19) handles a
    renewal's reply after the lease it extended had ended: ``lost`` read True meanwhile, then
    False again, without a word; and the next renewal was due ``ttl / 3`` after the late reply
    instead of after the call, eating the new lease's margin. Here the clock jumps while the
    extend is on its way."""
    now = [100.0]

    class Starved(celery_redlock.Lock):
        def do_extend(self, token: str, ttl: float) -> Extended:
            extended = super().do_extend(token, ttl)
            now[0] += 2.5  # the reply is handled 2.5 s after the call was sent
            return extended

    lock = Starved(redis_url, "starved", ttl=3, clock=lambda: now[0])
    assert lock.acquire(blocking=False)  # the lease ends at 103
    now[0] += 1.0  # the renewal is due (ttl / 3), sent at 101
    with caplog.at_level(logging.WARNING, logger="celery_redlock.lock"):
        delay = lock.renew_step()
    assert "a renewal was confirmed 0.5s after the lease it extended had ended" in caplog.text
    assert "raise redlock_lease" in caplog.text
    assert delay == 0.0  # due 1 s after 101: already passed at 103.5
    assert lock.held and not lock.lost  # the new lease (101 + 3) runs to 104
    lock.release()


def test_a_frozen_server_delays_only_the_renewals_of_its_own_locks(d2: Driver) -> None:
    """Helper probe, round 3 (a Redis Cluster primary that hangs). Timeline when the thread
    lock's watchdog ran one renewal at a time: (1) server A freezes (SIGSTOP); (2) the renewal
    of A's lock waits until that lock's lease ends; (3) the lock on server B, due meanwhile,
    waits behind it and is renewed after its own lease ended: lost while its holder runs.
    Each renewal runs in a thread of its own now (the asyncio lock's in a task of its own)."""
    with RedisServer() as a, RedisServer() as b:
        assert a.process is not None
        frozen = d2.lock(a.url, "on-frozen", ttl=3, auto_renew=True)  # first renewal at 1 s
        kept = d2.lock(b.url, "on-live", ttl=1.5, auto_renew=True)  # at 0.5 s, 1 s, ...
        assert d2(frozen.acquire(blocking=False))
        assert d2(kept.acquire(blocking=False))
        a.process.send_signal(signal.SIGSTOP)
        try:
            live = b.client()
            renewals = 0
            last = live.pttl(kept.key)

            def renewed_twice_since_frozen_lost() -> bool:
                nonlocal renewals, last
                if d2.is_async:
                    d2(asyncio.sleep(0.01))  # the renewal tasks run on the driver's loop
                ttl = live.pttl(kept.key)
                if frozen.lost and ttl > last:
                    renewals += 1
                last = ttl
                return renewals >= 2

            wait_until(renewed_twice_since_frozen_lost)
            assert not kept.lost and kept.held
            assert live.get(kept.key) == (kept.token or "").encode()
            live.close()
        finally:
            a.process.send_signal(signal.SIGCONT)
        d2(kept.release())


def test_extend_of_a_lock_found_lost_raises_lock_lost_whoever_found_it(
    d2: Driver, redis_url: str, r: redis_py.Redis
) -> None:
    """Helper probe, round 3: an extend that found the key gone raised ``LockLost``, but one
    after the renewal had found it so raised ``LockNotOwned`` ("not held"), which the docs
    give for a lock never acquired."""
    lock = d2.lock(redis_url, "extend-lost", ttl=10)
    assert d2(lock.acquire(blocking=False))
    r.delete(lock.key)
    assert d2(lock.renew_step()) is None and lock.lost  # the renewal found it
    with pytest.raises(LockLost, match="was lost"):
        d2(lock.extend())
    never = d2.lock(redis_url, "extend-never", ttl=10)
    with pytest.raises(LockNotOwned, match="not held"):
        d2(never.extend())


def test_a_thread_waiter_reuses_no_subscription_cut_while_it_was_set_aside(
    redis_url: str, r: redis_py.Redis
) -> None:
    """CI, round 3: two waits end and set their subscriptions aside; the server cuts them
    while idle (here ``CLIENT KILL``; its ``timeout``, a proxy, a restart); the next wait
    subscribed on one, failed before the confirmation, then on the other: two failures in a
    row, and ``LockUnavailable`` with the server up. One idle longer than ``IDLE_REUSE`` is
    closed instead of reused."""
    holder = celery_redlock.Lock(redis_url, "cut-idle", ttl=30, owner="holder")
    assert holder.acquire(blocking=False)
    ended = threading.Barrier(3)

    def short_wait() -> None:
        assert not celery_redlock.Lock(redis_url, "cut-idle", ttl=30).acquire(timeout=0.3)
        ended.wait(10)

    for thread in [threading.Thread(target=short_wait) for _ in range(2)]:
        thread.start()
    ended.wait(10)  # both subscriptions set aside
    r.client_kill_filter(_type="pubsub")
    cut = time.monotonic()
    wait_until(lambda: time.monotonic() - cut > subscriptions.IDLE_REUSE)
    waiter = celery_redlock.Lock(redis_url, "cut-idle", ttl=30)
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=20)))
    thread.start()
    wait_until(lambda: r.zcard(holder.keys.waiters) == 1 or not thread.is_alive())
    holder.release()
    thread.join(10)
    assert got == [True]
    waiter.release()


def test_renewal_finding_the_key_gone_marks_lost(
    d2: Driver, redis_url: str, r: redis_py.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    lock = d2.lock(redis_url, "renew-gone", ttl=10)
    assert d2(lock.acquire(blocking=False))
    r.delete(lock.key)
    with caplog.at_level(logging.ERROR, logger="celery_redlock.lock"):
        assert d2(lock.renew_step()) is None
    assert lock.lost and "renewal found it expired" in caplog.text


# -- blocking waits ------------------------------------------------------------------------------


def test_a_blocking_acquire_times_out_and_leaves_the_queue(
    d2: Driver, redis_url: str, r: redis_py.Redis
) -> None:
    holder = celery_redlock.Lock(redis_url, "wait-timeout", ttl=30, owner="task-A")
    assert holder.acquire(blocking=False)
    lock = d2.lock(redis_url, "wait-timeout", ttl=10)
    start = time.monotonic()
    assert not d2(lock.acquire(timeout=0.3))
    assert 0.3 <= time.monotonic() - start < 3.0
    assert lock.last_holder is not None and lock.last_holder.task_id == "task-A"
    assert r.zcard(holder.keys.waiters) == 0
    holder.release()
    assert lock_keys(r) == []


def test_a_waiter_that_could_not_leave_a_stalled_queue_is_passed_over(d: Driver) -> None:
    """A queued waiter whose deadline passes while the server is frozen: its leave gets no
    reply and it raises. Its entry stays queued; the holder's release used to hand the lock
    to it (its subscription lived on), held by nobody for that waiter's 60 s, while the live
    waiter behind it timed out. Now the thread lock closes the subscription (the release
    passes the entry over) and the asyncio lock leaves in the background once Redis answers
    (giving back a lock handed over meanwhile): the live waiter gets the lock."""
    with RedisServer() as server:
        r, process = server.client(), server.process
        assert process is not None
        holder = celery_redlock.Lock(server.url, "stalled-leave", ttl=60)
        assert holder.acquire(blocking=False)
        waiters = holder.keys.waiters

        def freeze_once_queued() -> None:
            wait_until(lambda: r.zcard(waiters) == 1)
            process.send_signal(signal.SIGSTOP)

        freezer = threading.Thread(target=freeze_once_queued)
        gone = d.lock(server.url + "?socket_timeout=0.5", "stalled-leave", ttl=60)
        freezer.start()
        try:
            with pytest.raises(LockUnavailable):
                d(gone.acquire(timeout=2))
        finally:
            freezer.join()
            process.send_signal(signal.SIGCONT)
        stale = set(r.zrange(waiters, 0, -1))
        assert len(stale) == 1  # its entry is still queued

        def release_once_queued() -> None:
            wait_until(lambda: set(r.zrange(waiters, 0, -1)) - stale)
            holder.release()

        releaser = threading.Thread(target=release_once_queued)
        live = d.lock(server.url, "stalled-leave", ttl=60)
        releaser.start()
        try:
            assert d(live.acquire(timeout=20))
        finally:
            releaser.join()
        assert r.get(live.key) is not None and d(live.release()) is None
        # No UNSUBSCRIBE (the guide's ACL line has none).
        assert "cmdstat_unsubscribe" not in r.info("commandstats")


def test_the_lock_counts_its_tries(d2: Driver, redis_url: str) -> None:
    """One per non-blocking try, one per try of a blocking wait (what ``redlock.attempts``
    of the acquire span records)."""
    holder = celery_redlock.Lock(redis_url, "tries", ttl=30)
    assert holder.acquire(blocking=False)
    lock = d2.lock(redis_url, "tries", ttl=10)
    assert lock.attempts == 0
    assert not d2(lock.acquire(blocking=False))
    assert lock.attempts == 1
    assert not d2(lock.acquire(timeout=0.2))  # a try, then one more once subscribed
    assert lock.attempts >= 3
    holder.release()
    tried = lock.attempts
    assert d2(lock.acquire(blocking=False))
    assert lock.attempts == tried + 1
    d2(lock.release())


def test_a_blocking_acquire_gets_the_lock_of_a_dead_holder_at_its_ttl(
    d2: Driver, redis_url: str, r: redis_py.Redis
) -> None:
    dead = celery_redlock.Lock(redis_url, "dead-holder", ttl=0.3, owner="dead-task")
    assert dead.acquire(blocking=False)  # and never released
    lock = d2.lock(redis_url, "dead-holder", ttl=10)
    start = time.monotonic()
    assert d2(lock.acquire(timeout=10))
    assert time.monotonic() - start < 5.0  # woke when the TTL ran out, not at the timeout
    assert lock.last_holder is None and r.get(lock.key) == lock.token.encode()
    d2(lock.release())


def test_a_non_blocking_context_manager_says_the_lock_is_held(d2: Driver, redis_url: str) -> None:
    holder = celery_redlock.Lock(redis_url, "in-use", ttl=30)
    assert holder.acquire(blocking=False)
    lock = d2.lock(redis_url, "in-use", blocking=False)
    with pytest.raises(LockContended) as info:
        d2(lock.__aenter__()) if d2.is_async else lock.__enter__()
    assert str(info.value) == f"could not acquire {holder.key}: it is held (blocking=False)"
    holder.release()


def test_a_release_hands_a_non_ascii_lock_to_its_queued_waiter(
    d2: Driver, redis_url: str, r: redis_py.Redis
) -> None:
    """The queue member gives its channel's length in bytes, as the release script cuts it: a
    name with non-ASCII characters is handed over on release like any other, not left to the
    waiter's timeout (the holder's lease had 60 s left)."""
    holder = celery_redlock.Lock(redis_url, "rapport-été-报告", ttl=60)
    assert holder.acquire(blocking=False)

    def release_once_queued() -> None:
        wait_until(lambda: r.zcard(holder.keys.waiters))
        holder.release()

    releaser = threading.Thread(target=release_once_queued)
    releaser.start()
    lock = d2.lock(redis_url, "rapport-été-报告", ttl=10)
    start = time.monotonic()
    try:
        assert d2(lock.acquire(timeout=20))
    finally:
        releaser.join()
    assert time.monotonic() - start < 10.0  # handed over at the release, not at the timeout
    assert r.get(lock.key) == lock.token.encode()
    d2(lock.release())


def wakes_the_waiter_for_its_end(
    d2: Driver, redis_url: str, r: redis_py.Redis, limit: int, change: Callable[[Any], Any]
) -> None:
    """``limit`` holders with 60 s left; once a blocking waiter waits (queued, or on the release
    channel), ``change(holder)`` on each leaves the key(s) 0.3 s: the waiter must take the key
    when that ends, not at its timeout's last try (20 s)."""
    name = f"woken-{change.__name__}"
    holders = [celery_redlock.Lock(redis_url, name, ttl=60, limit=limit) for _ in range(limit)]
    assert all(holder.acquire(blocking=False) for holder in holders)
    keys = holders[0].keys

    def change_once_waiting() -> None:
        wait_until(lambda: r.zcard(keys.waiters) or r.pubsub_numsub(keys.channel)[0][1])
        for holder in holders:
            change(holder)

    changer = threading.Thread(target=change_once_waiting)
    changer.start()
    lock = d2.lock(redis_url, name, ttl=10, limit=limit)
    start = time.monotonic()
    try:
        assert d2(lock.acquire(timeout=20))
    finally:
        changer.join()
    assert time.monotonic() - start < 10.0  # woke for the key's new end, not at the timeout
    assert r.get(lock.key) == lock.token.encode()
    d2(lock.release())
    for holder in holders:  # lost by now, or (a semaphore's other slot) about to be
        with contextlib.suppress(LockLost, LockNotOwned):
            holder.release()


@pytest.mark.parametrize("limit", [1, 2], ids=["queued", "semaphore"])
def test_a_release_that_keeps_the_key_wakes_the_waiters_for_its_end(
    d2: Driver, redis_url: str, r: redis_py.Redis, limit: int
) -> None:
    """``release(keep=...)`` (a task's ``lock_cooldown``) wakes the blocking waiters, queued
    (one slot) or on the release channel (a semaphore): each reads the kept key's TTL and
    tries when it ends, not at its timeout's last try (the old lease had 60 s left)."""

    def keep(holder: Any) -> None:
        holder.release(keep=0.3)

    wakes_the_waiter_for_its_end(d2, redis_url, r, limit, keep)


@pytest.mark.parametrize("limit", [1, 2], ids=["queued", "semaphore"])
def test_an_extend_that_shortens_the_ttl_wakes_the_waiters_for_its_end(
    d2: Driver, redis_url: str, r: redis_py.Redis, limit: int
) -> None:
    """``extend(ttl)`` to less than the lock had left wakes the blocking waiters, queued (one
    slot) or on the release channel (a semaphore): each reads the new TTL and takes the key
    when it ends. Before, a waiter slept on the 60 s it had read, to its timeout's last try,
    while the holders here never release (as if they died after the extend)."""

    def shorten(holder: Any) -> None:
        holder.extend(0.3)

    wakes_the_waiter_for_its_end(d2, redis_url, r, limit, shorten)


def test_a_renewal_or_a_longer_extend_wakes_nobody(redis_url: str, r: redis_py.Redis) -> None:
    """Only an extend that shortens the TTL publishes: a renewal (the same TTL again) or an
    extend to more than is left sends nothing to the waiters' channel."""
    holder = celery_redlock.Lock(redis_url, "lengthened", ttl=5)
    assert holder.acquire(blocking=False)
    listener = r.pubsub()
    listener.subscribe(holder.keys.channel)
    assert listener.get_message(timeout=5)["type"] == "subscribe"
    holder.extend(5)
    holder.extend(30)
    holder.extend(1)
    r.publish(holder.keys.channel, "end")  # after whatever the extends published
    received = []
    while not received or received[-1] != b"end":
        message = listener.get_message(timeout=5)
        assert message is not None
        received.append(message["data"])
    assert received == [b"1", b"end"]  # the shortening extend's wake only
    listener.close()
    holder.release()


def test_a_renewal_capped_by_max_hold_wakes_nobody(redis_url: str, r: redis_py.Redis) -> None:
    """Capped by ``max_hold``, each renewal asks for the same end as the one before, which a
    faster round trip makes a few ms shorter: that is no shortening to wake the waiters for
    (before, about one capped renewal in three published a wake)."""
    holder = celery_redlock.Lock(redis_url, "capped", ttl=0.6, max_hold=2.0, auto_renew=True)
    listener = r.pubsub()
    listener.subscribe(holder.keys.channel)
    assert listener.get_message(timeout=5)["type"] == "subscribe"
    assert holder.acquire(blocking=False)
    wait_until(lambda: not r.exists(holder.key), 10)  # renewed up to its cap, then expired
    r.publish(holder.keys.channel, "end")
    received = []
    while not received or received[-1] != b"end":
        message = listener.get_message(timeout=5)
        assert message is not None
        received.append(message["data"])
    assert received == [b"end"]
    listener.close()
    with contextlib.suppress(LockLost):
        holder.release()


def test_a_release_that_keeps_the_key_marks_it_as_a_cooldown(
    d: Driver, redis_url: str, r: redis_py.Redis
) -> None:
    """A kept slot held its holder's token: tooling showed a finished task's cooldown as a
    running holder. Its secret's first 8 characters become ``cooldown``; the other fields
    stay, so the holder a contender reads is the same task, marked as ended."""
    holder = d.lock(redis_url, "cooled", ttl=30, owner="task-c", host="w1@h")
    assert d(holder.acquire(blocking=False))
    token = holder.token
    d(holder.release(keep=5))
    kept = r.get(holder.key)
    assert kept == ("cooldown" + token[8:]).encode() and 4000 < r.pttl(holder.key) <= 5000
    contender = d.lock(redis_url, "cooled", ttl=30)
    assert not d(contender.acquire(blocking=False))
    seen = contender.last_holder
    assert seen is not None and seen.cooling and seen.task_id == "task-c" and seen.host == "w1@h"
    r.delete(holder.key)


# -- quorum (drifts 4 and the empty "first error") -----------------------------------------------


@pytest.fixture
def three() -> Iterator[list[RedisServer]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(RedisServer()) for _ in range(3)]


@pytest.mark.parametrize("value", ["garbage", ""])
@pytest.mark.parametrize("limit", [1, 2], ids=["lock", "semaphore"])
def test_a_fencing_mark_that_is_not_a_number_counts_as_none(
    d2: Driver, redis_url: str, r: redis_py.Redis, value: str, limit: int
) -> None:
    """Helper probe, round 3, session 22: a high-water mark or a counter overwritten with text
    made every token read of a lock, and every acquire of a semaphore, in that Cluster slot
    fail with the script's raw ``ResponseError`` ("bad argument #2 to 'max'"). Such a value
    counts as none, as a deleted one does: the token comes from the server's clock, and the
    mark is set to it."""
    lock = d2.lock(redis_url, "corrupt-mark", ttl=10, limit=limit)
    mark = high_water_of(lock.keys.lock)
    r.set(mark, value)
    r.set(lock.keys.fence, value)
    seconds, _ = r.time()
    assert d2(lock.acquire(blocking=False))
    token = lock.fencing_token
    assert token is not None and token >= seconds * 1_000_000
    assert r.get(mark) == str(token).encode()
    d2(lock.release())
    r.delete(lock.keys.fence, mark)


@pytest.mark.parametrize("value", ["garbage", ""])
def test_quorum_counters_that_are_not_numbers_count_as_none(
    d2: Driver, three: list[RedisServer], value: str
) -> None:
    """The quorum's acquire reads each node's counter and mark: text there made that node's
    script fail, and with two such nodes of three the lock was unavailable."""
    lock = d2.lock([s.url for s in three], "corrupt-counters", ttl=10)
    admins = [s.client() for s in three]
    for admin in admins[:2]:
        admin.set(lock.keys.fence, value)
        admin.set(high_water_of(lock.keys.lock), value)
    assert d2(lock.acquire(blocking=False))
    token = lock.fencing_token
    assert token is not None
    assert [int(admin.get(lock.keys.fence) or 0) >= token for admin in admins] == [True] * 3
    d2(lock.release())
    for admin in admins:
        admin.close()


def test_a_failed_quorum_acquire_gives_back_only_where_its_token_may_be(
    d2: Driver, three: list[RedisServer]
) -> None:
    """Nodes that answered "held by another" hold none of a failed attempt's token, yet each
    was sent a release: a round trip more on every contended acquire, and with a node that
    hangs a second node timeout (1 s per failed acquire, not 0.5 s). Counted with ``INFO
    commandstats``: the attempt's one script call per node, and no give-back."""
    urls = [s.url for s in three]
    holder = d2.lock(urls, "contended-quorum", ttl=30)
    assert d2(holder.acquire(blocking=False))
    admins = [s.client() for s in three]
    for admin in admins:
        admin.config_resetstat()
    other = d2.lock(urls, "contended-quorum", ttl=30)
    assert not d2(other.acquire(blocking=False))
    assert [a.info("commandstats")["cmdstat_evalsha"]["calls"] for a in admins] == [1, 1, 1]
    d2(holder.release())
    for admin in admins:
        admin.close()


@contextlib.contextmanager
def held_without_publish(d2: Driver, three: list[RedisServer], name: str) -> Iterator[Any]:
    """A quorum lock ``name`` (TTL 10 s) held by an ACL user without ``+publish``."""
    rules = [rule for rule in RULES if rule != "+publish"]
    with contextlib.ExitStack() as stack:
        for server in three:
            stack.enter_context(acl_user(server.client(), "nopublish", *rules))
        lock = d2.lock([user_url(s, "nopublish") for s in three], name, ttl=10)
        assert d2(lock.acquire(blocking=False))
        yield lock


def test_a_quorum_waiter_that_lost_a_split_vote_tries_again_soon(
    three: list[RedisServer],
) -> None:
    """Helper review, round 3: after a split vote (no owner on a majority: contenders that each
    won a minority, and give it back at once) a waiter slept on the TTL of another's minority
    key. With 6 thread waiters on a 3-node quorum, one of them slept out its whole timeout in
    3 runs of 48, while the lock was free. Here the minority keys go away without a wake (the
    wake that such a waiter missed), once it lost its try after it subscribed (its second SET
    on the free node): it tries again within a second, where it slept 30 s. Counted on the
    thread lock, whose every try reaches the free node here; the asyncio lock decides when to
    try again through the same core step."""
    d2 = Driver("thread", "url")
    lock = d2.lock([s.url for s in three], "split", ttl=30)
    admins = [s.client() for s in three]
    for admin, owner in zip(admins[:2], ("x", "y"), strict=True):  # a minority each
        admin.set(lock.keys.lock, new_token(owner), px=30_000)
    admins[2].config_set("notify-keyspace-events", "K$")
    events = admins[2].pubsub()
    events.subscribe(f"__keyspace@0__:{lock.keys.lock}")

    retried: list[bool] = []

    def give_back() -> None:
        sets = 0
        while sets < 2:  # its first try, and its try once subscribed
            message = events.get_message(timeout=10)
            assert message is not None, "the waiter's tries"
            sets += message["data"] == b"set"
        for admin in admins[:2]:
            admin.delete(lock.keys.lock)  # no PUBLISH: the wake it may miss
        message = events.get_message(timeout=10)  # its next try, which takes the lock
        while message is not None and message["data"] != b"set":
            message = events.get_message(timeout=10)
        retried.append(message is not None)

    helper = threading.Thread(target=give_back)
    helper.start()
    try:
        # It slept on the minority key's 30 s TTL, up to its deadline, and tried only then.
        assert d2(lock.acquire(timeout=15))
        d2(lock.release())
    finally:
        helper.join()
        events.close()
        for admin in admins:
            admin.close()
    assert retried == [True]


def test_a_split_vote_reports_no_holder_ttl(d2: Driver, three: list[RedisServer]) -> None:
    """CI, round 3 (the test above, once in about ten runs): after losing a split vote, the
    thread waiter asked the nodes' ``PTTL``, which counts any owner's keys: the two minority
    keys read as a lock held for 30 s, and it slept that long, unless their owners had given
    them back before the read. A split vote's TTL is unknown, on both drivers, and nothing is
    asked afterwards (here the minority keys stay, so the read would find them)."""
    lock = d2.lock([s.url for s in three], "split-ttl", ttl=30, blocking=False)
    admins = [s.client() for s in three]
    try:
        for admin, owner in zip(admins[:2], ("x", "y"), strict=True):
            admin.set(lock.keys.lock, new_token(owner), px=30_000)
        assert not d2(lock.acquire())
        assert lock.last_holder is not None and lock.last_holder.task_id in ("x", "y")
        assert lock.last_holder_ttl is None
        with pytest.raises(LockContended) as caught:
            d2(lock.__aenter__()) if d2.is_async else lock.__enter__()
        assert caught.value.holder in ("x", "y") and caught.value.ttl is None
    finally:
        for admin in admins:
            admin.close()


def test_a_quorum_wait_refused_ping_says_so_and_names_the_lock(
    d2: Driver, three: list[RedisServer]
) -> None:
    """Helper probe, round 3: every node answered and refused the wait's ``PING`` (a user
    without ``+ping``), and the error said "no quorum for lock : no node answers"."""
    rules = [rule for rule in RULES if rule != "+ping"]
    with contextlib.ExitStack() as stack:
        for server in three:
            stack.enter_context(acl_user(server.client(), "noping", *rules))
        urls = [user_url(s, "noping") for s in three]
        holder = d2.lock(urls, "q-ping", ttl=10)
        assert d2(holder.acquire(blocking=False))
        waiter = d2.lock(urls, "q-ping", ttl=10)
        with pytest.raises(LockUnavailable) as info:
            d2(waiter.acquire(timeout=5))
        message = str(info.value)
        assert f"no quorum for lock {holder.keys.lock}: a node refused PING" in message
        assert "grant +ping" in message and "no node answers" not in message
        d2(holder.release())


def test_publish_refused_on_a_quorum_release_warns(
    d2: Driver, three: list[RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    admins = [s.client() for s in three]
    with held_without_publish(d2, three, "q-publish") as lock:
        warned = "waiters were not notified (PUBLISH, or ZPOPMIN for the queued ones, was refused"

        def said() -> bool:  # the wake runs in the background: a thread, or the driver's loop
            if d2.is_async:
                d2(asyncio.sleep(0.01))
            return warned in caplog.text

        with caplog.at_level(logging.WARNING, logger="celery_redlock.lock"):
            d2(lock.release())
            wait_until(said, 5)
    assert all(admin.get(lock.keys.lock) is None for admin in admins)


def test_publish_refused_on_a_quorum_extend_that_shortens_warns_it_shortened(
    d2: Driver, three: list[RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    """The quorum's wake after a shortening extend, refused its ``PUBLISH``, says the lock was
    shortened (not released: it is still held)."""
    with held_without_publish(d2, three, "q-shorten-publish") as lock:
        with caplog.at_level(logging.WARNING, logger="celery_redlock.lock"):
            d2(lock.extend(1))
        assert "shortened on" in caplog.text and "waiters were not notified" in caplog.text
        assert "released" not in caplog.text
        d2(lock.release())


def acquire_meanwhile(
    d2: Driver, waiter: Any, timeout: float, ready: Callable[[], Any], act: Callable[[], Any]
) -> bool:
    """A blocking ``waiter.acquire(timeout=timeout)``, during which ``act()`` runs once
    ``ready()`` is true (its coroutine awaited, under the asyncio driver); what it got."""
    if d2.is_async:

        async def wait_and_act() -> bool:
            waiting = asyncio.ensure_future(waiter.acquire(timeout=timeout))
            while not ready():
                await asyncio.sleep(0.01)
            acted = act()
            if asyncio.iscoroutine(acted):
                await acted
            return bool(await waiting)

        return bool(d2(wait_and_act()))
    results: list[bool] = []
    thread = threading.Thread(target=lambda: results.append(waiter.acquire(timeout=timeout)))
    thread.start()
    wait_until(ready, 5)
    act()
    thread.join(timeout + 5)
    return results[0]


def published(admins: list[redis_py.Redis]) -> list[int]:
    """How many ``PUBLISH`` each server has run."""
    stats = [a.info("commandstats").get("cmdstat_publish", {}) for a in admins]
    return [int(s.get("calls", 0)) for s in stats]


def holder_lacking_node_0(
    d2: Driver, three: list[RedisServer], name: str, ttl: float = 30
) -> tuple[Any, redis_py.Redis]:
    """A quorum lock held on nodes 1 and 2 only (node 0 held a foreign value when it was
    taken, gone since), and a client of node 0, where the waiters listen."""
    first = three[0].client()
    holder = d2.lock([s.url for s in three], name, ttl=ttl)
    first.set(holder.keys.lock, "foreign", px=60_000)
    assert d2(holder.acquire(blocking=False))
    first.delete(holder.keys.lock)
    return holder, first


@pytest.mark.parametrize("how", ["lacking", "flushed"])
def test_a_quorum_extend_that_shortens_wakes_the_waiters_once_every_node_has_it(
    d2: Driver, three: list[RedisServer], how: str
) -> None:
    """A shortening extend on a quorum wakes the waiters once every node answered it: on node
    0, where they listen, also when the holder lacked it (re-asserted there now: it published
    nothing), and only after the slowest node has the new TTL (after a ``SCRIPT FLUSH`` the
    script is loaded node by node; a waiter woken by the first read the old TTL from the
    others and slept on). The holder then dies; before, the waiter slept on to its timeout."""
    urls = [s.url for s in three]
    name = f"q-shortened-{how}"
    if how == "lacking":
        holder, first = holder_lacking_node_0(d2, three, name)
    else:
        first = three[0].client()
        holder = d2.lock(urls, name, ttl=30)
        assert d2(holder.acquire(blocking=False))
    waiter = d2.lock(urls, name, ttl=5)

    def listening() -> bool:  # subscribed, and tried once more since (now asleep)
        subscribers = first.pubsub_numsub(holder.keys.channel)
        return waiter.attempts >= 2 and subscribers[0][1] >= 1

    def before_extend() -> None:
        if how == "flushed":  # EXTEND not cached (a restart, an upgrade), the acquire cached
            for server in three:
                server.client().script_flush()
            warm = celery_redlock.Lock(urls, f"{name}-warm", ttl=5)
            assert warm.acquire(blocking=False)
            warm.release()

    def shorten() -> Any:
        before_extend()
        return holder.extend(0.3)

    start = time.monotonic()
    got = acquire_meanwhile(d2, waiter, 20, listening, shorten)
    assert got and time.monotonic() - start < 10  # woken for the new TTL, not at 20 s
    d2(waiter.release())


def acquire_all(d2: Driver, waiters: list[Any], timeout: float) -> list[bool]:
    """What each of ``waiters`` got from a blocking ``acquire(timeout)``, all at once."""
    if d2.is_async:

        async def wait_all() -> list[bool]:
            return list(await asyncio.gather(*(w.acquire(timeout=timeout) for w in waiters)))

        return list(d2(wait_all()))
    results: list[bool] = []
    threads = [
        threading.Thread(target=lambda w=w: results.append(w.acquire(timeout=timeout)))
        for w in waiters
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 10)
    return results


def test_quorum_waiters_sleep_while_the_holder_lacks_the_node_they_listen_on(
    d2: Driver, three: list[RedisServer]
) -> None:
    """Timeline: H acquires while node 0 holds a foreign value: H holds nodes 1 and 2. The
    waiters listen on node 0 (the first that answers). Each failed attempt won node 0, and its
    give-back published a release there: every other waiter woke, tried, failed and published
    in turn, hundreds of attempts a second each, on every node, until H released. A give-back
    while another owner holds a majority now wakes nobody: the waiters sleep on H's TTL."""
    holder, first = holder_lacking_node_0(d2, three, "q-storm")
    waiters = [d2.lock([s.url for s in three], "q-storm", ttl=5) for _ in range(4)]
    got = acquire_all(d2, waiters, timeout=1)
    assert got == [False] * 4
    assert max(w.attempts for w in waiters) <= 3, [w.attempts for w in waiters]
    assert first.get(holder.keys.lock) is None  # each give-back deleted what it won
    d2(holder.release())


def test_a_give_back_wakes_only_where_it_freed(d2: Driver, three: list[RedisServer]) -> None:
    """No owner holds a majority of the nodes that answer (H on node 0, another value on node
    2): a waiter's failed attempt wins node 1 and gives it back, waking the waiters. It woke
    them on every node that answered, node 0 too, where they all listen: each failed attempt
    woke the others, thousands of attempts until H's TTL. It wakes them where it freed."""
    urls = [s.url for s in three]
    holder = d2.lock(urls, "q-nomajority", ttl=30)
    assert d2(holder.acquire(blocking=False))
    three[1].client().delete(holder.keys.lock)  # node 1 lost it (restarted empty, say)
    three[2].client().set(holder.keys.lock, "another", px=30_000)
    waiters = [d2.lock(urls, "q-nomajority", ttl=5) for _ in range(3)]
    got = acquire_all(d2, waiters, timeout=1)
    assert got == [False] * 3
    assert max(w.attempts for w in waiters) <= 10, [w.attempts for w in waiters]


def test_a_quorum_release_wakes_the_waiters_on_the_node_the_holder_lacks(
    d2: Driver, three: list[RedisServer]
) -> None:
    """The waiters listen on node 0, which the holder lacks: its release published only where
    it held the lock, and a waiter slept on until its deadline (or the holder's TTL)."""
    holder, first = holder_lacking_node_0(d2, three, "q-lacks")
    waiter = d2.lock([s.url for s in three], "q-lacks", ttl=5)

    def listening() -> bool:
        subscribers = first.pubsub_numsub(holder.keys.channel)
        return waiter.attempts >= 1 and subscribers[0][1] >= 1

    start = time.monotonic()
    got = acquire_meanwhile(d2, waiter, 10, listening, holder.release)
    assert got and time.monotonic() - start < 5  # woken, not at its deadline (10 s)
    d2(waiter.release())


def test_a_quorum_waiter_woken_before_the_release_reached_a_majority_tries_again_soon(
    d2: Driver, three: list[RedisServer]
) -> None:
    """CI, round 3 (once, under TLS and a full suite's load): the release frees node 0, where
    the waiters listen, and publishes there; the releasing thread is then descheduled before
    its release reaches nodes 1 and 2. The woken waiter tries, finds the holder still on a
    majority, and slept on its TTL (here 30 s, to its deadline of 20 s) while the lock was
    free a moment later. Here the release reaches nodes 1 and 2 only after that try: a waiter
    woken by a release that still finds the releasing holder now tries again soon."""
    urls = [s.url for s in three]
    holder = d2.lock(urls, "q-late-release", ttl=30)
    assert d2(holder.acquire(blocking=False))
    waiter = d2.lock(urls, "q-late-release", ttl=30)
    admins = [s.client() for s in three]
    keys, argv = release_call(holder.keys, holder.token)
    released: list[float] = []

    def listening() -> bool:  # subscribed, and tried once more since (now asleep)
        subscribers = admins[0].pubsub_numsub(holder.keys.channel)
        return waiter.attempts >= 2 and subscribers[0][1] >= 1

    def release_on(admin: redis_py.Redis) -> None:
        assert admin.eval(RELEASE, len(keys), *keys, *argv) == 1

    def release_late() -> Any:
        release_on(admins[0])  # wakes the waiter, whose try then fails on nodes 1 and 2
        if d2.is_async:

            async def rest() -> None:
                while waiter.attempts < 3:
                    await asyncio.sleep(0.01)
                for admin in admins[1:]:
                    release_on(admin)
                released.append(time.monotonic())

            return rest()
        wait_until(lambda: waiter.attempts >= 3)
        for admin in admins[1:]:
            release_on(admin)
        released.append(time.monotonic())
        return None

    try:
        assert acquire_meanwhile(d2, waiter, 20, listening, release_late)
        assert time.monotonic() - released[0] < 10  # not at its deadline, 20 s from its start
        d2(waiter.release())
    finally:
        for admin in admins:
            admin.close()


def test_a_quorum_waiter_sleeps_on_the_majority_holders_ttl_not_a_leftovers(
    d2: Driver, three: list[RedisServer]
) -> None:
    """Timeline: H holds nodes 1 and 2 (3 s left); W1's failed attempt holds node 0 (15 s),
    where W2 listens; W2 tries, and slept on the first refusal's TTL, node 0's: W1's. W1
    gives node 0 back without waking anyone (H holds a majority); H dies: the lock was free
    from 3 s while W2 slept on to its deadline. It now sleeps on H's TTL."""
    urls = [s.url for s in three]
    holder, first = holder_lacking_node_0(d2, three, "q-leftover", ttl=3)
    first.set(holder.keys.lock, "w1-attempt", px=15_000)
    waiter = d2.lock(urls, "q-leftover", ttl=5)
    start = time.monotonic()
    got = acquire_meanwhile(
        d2,
        waiter,
        10,
        lambda: waiter.attempts >= 2,  # tried again once subscribed, and sleeps
        lambda: first.delete(holder.keys.lock),  # W1's silent give-back
    )
    assert got and time.monotonic() - start < 8  # at H's expiry (3 s), not its deadline (10 s)
    d2(waiter.release())


def test_a_quorum_release_wakes_the_waiters_once_every_node_freed_the_lock(
    d2: Driver, three: list[RedisServer]
) -> None:
    """Helper probe, round 3, session 24: a task's release woke the waiters from each node as
    it freed it. A waiter woken by node 0 won nodes 0 and 1 before the release reached node 2,
    and held the lock on a bare majority (15 of 100 handoffs to one waiter on 3 healthy nodes);
    one of the two crashing before its repair (0.1 s) lost it, and let a second holder in,
    with a majority up. Here node 2 runs writes 0.15 s late (``CLIENT PAUSE ... WRITE``,
    ended by the server's timer within the 0.5 s node timeout; a reply past it would be
    dropped with the command): the
    waiters are woken only once node 2 has freed the lock."""
    urls = [s.url for s in three]
    holder = d2.lock(urls, "q-wake-last", ttl=30)
    assert d2(holder.acquire(blocking=False))
    first, last = three[0].client(), three[2].client()
    listener = first.pubsub()
    listener.subscribe(holder.keys.channel)
    assert listener.get_message(timeout=5)["type"] == "subscribe"
    on_last_when_woken: list[Any] = []

    def listen() -> None:
        message = listener.get_message(timeout=10)
        if message is not None:  # read node 2 at once: reads are not paused
            on_last_when_woken.append(last.get(holder.keys.lock))

    thread = threading.Thread(target=listen)
    thread.start()
    try:
        assert last.execute_command("CLIENT", "PAUSE", 150, "WRITE")
        d2(holder.release())
        thread.join(15)
        assert on_last_when_woken == [None]
    finally:
        listener.close()
        first.close()
        last.close()


@pytest.mark.parametrize("user", ["default", "no-pubsub", "lacking"])
def test_a_quorum_release_nobody_waits_for_publishes_nothing_unless_it_cannot_tell(
    d2: Driver, three: list[RedisServer], user: str
) -> None:
    """The release's wake is a second round trip: sent only when a node's release found a
    subscriber on the release channel (``PUBSUB NUMSUB``), or could not tell (an ACL user
    without ``+pubsub|numsub``: a waiter woken for nothing tries once more), or the holder
    lacked a node. Review, round 3, session 24, on the last: (1) the holder lacks node 0,
    where the waiters listen, whose release script finds no subscriber; (2) a waiter
    subscribes there, and its try finds the holder still on nodes 1 and 2, as its try before
    did; (3) the release frees them, publishing nothing: the waiter slept to its deadline."""
    with contextlib.ExitStack() as stack:
        if user == "no-pubsub":
            for server in three:
                stack.enter_context(acl_user(server.client(), "nopubsub", *RULES))
            holder = d2.lock([user_url(s, "nopubsub") for s in three], "q-no-waiter", ttl=30)
            assert d2(holder.acquire(blocking=False))
        elif user == "lacking":
            holder, first = holder_lacking_node_0(d2, three, "q-no-waiter")
            first.close()
        else:
            holder = d2.lock([s.url for s in three], "q-no-waiter", ttl=30)
            assert d2(holder.acquire(blocking=False))
        admins = [stack.enter_context(contextlib.closing(s.client())) for s in three]

        before = published(admins)
        d2(holder.release())
        sent = [after - was for after, was in zip(published(admins), before, strict=True)]
        assert sent == ([0, 0, 0] if user == "default" else [1, 1, 1])
        assert [a.exists(holder.keys.lock) for a in admins] == [0, 0, 0]


def test_a_quorum_release_whose_reply_a_node_lost_wakes_its_waiters_after_the_give_back(
    d2: Driver, three: list[RedisServer]
) -> None:
    """Review, round 3, session 24: node 0, where the waiters listen, frozen past the node
    timeout during the release. Its release script, run once it resumed, freed it waking
    nobody, and its reply was lost; the other nodes had no subscriber: nothing was published,
    and the give-back then found nothing to free. The waiter slept to its deadline (6 s where
    it took 0.9 s). The give-back now wakes the waiters on its node once it is answered."""
    urls = [s.url for s in three]
    warm = d2.lock(urls, "q-warm", ttl=5)
    assert d2(warm.acquire(blocking=False))  # the scripts loaded on every node
    d2(warm.release())
    holder = d2.lock(urls, "q-lost-wake", ttl=30)
    assert d2(holder.acquire(blocking=False))
    waiter = d2.lock(urls, "q-lost-wake", ttl=30)
    first = three[0].client()
    frozen = three[0].process
    assert frozen is not None

    def listening() -> bool:
        return waiter.attempts >= 2 and first.pubsub_numsub(holder.keys.channel)[0][1] >= 1

    took: list[float] = []

    def release_frozen() -> Any:
        frozen.send_signal(signal.SIGSTOP)  # resumed past the 0.5 s node timeout
        threading.Timer(1.0, frozen.send_signal, (signal.SIGCONT,)).start()
        begun = time.monotonic()
        if d2.is_async:

            async def timed() -> None:
                await holder.release()
                took.append(time.monotonic() - begun)

            return timed()
        holder.release()
        took.append(time.monotonic() - begun)
        return None

    try:
        start = time.monotonic()
        assert acquire_meanwhile(d2, waiter, 8, listening, release_frozen)
        assert time.monotonic() - start < 5  # woken after the give-back, not at its deadline
        assert took[0] >= 0.45  # node 0's reply was awaited for the node timeout: lost
        d2(waiter.release())
    finally:
        frozen.send_signal(signal.SIGCONT)
        first.close()


@pytest.mark.parametrize("listening_on", [0, 1])
def test_a_quorum_extend_that_finds_the_lock_lost_wakes_only_where_it_freed_it(
    d2: Driver, three: list[RedisServer], listening_on: int
) -> None:
    """Review, round 3, session 24: H holds node 0, B nodes 1 and 2; H's extend finds the lock
    lost and gives node 0 back. It published on all three nodes, waking the waiters of B's
    nodes for nothing (each then tried, and found B). Now only node 0, and only when someone
    listens there."""
    urls = [s.url for s in three]
    holder = d2.lock(urls, "q-extend-lost", ttl=30)
    assert d2(holder.acquire(blocking=False))
    admins = [s.client() for s in three]
    listener = admins[listening_on].pubsub()
    try:
        for admin in admins[1:]:
            admin.delete(holder.keys.lock)
        other = d2.lock(urls, "q-extend-lost", ttl=30)
        assert d2(other.acquire(blocking=False))  # nodes 1 and 2
        listener.subscribe(holder.keys.channel)
        assert listener.get_message(timeout=5)["type"] == "subscribe"

        before = published(admins)
        with pytest.raises(LockLost):
            d2(holder.extend())
        sent = [after - was for after, was in zip(published(admins), before, strict=True)]
        assert sent == ([1, 0, 0] if listening_on == 0 else [0, 0, 0])
        assert admins[0].get(holder.keys.lock) is None
        d2(other.release())
    finally:
        listener.close()
        for admin in admins:
            admin.close()


def test_a_quorum_release_give_back_wakes_the_waiters_of_its_node_once(
    d2: Driver, three: list[RedisServer]
) -> None:
    """Review, round 3, session 24: a give-back runs until two of its releases are answered,
    and each run published: the second often came after the woken waiter had won, and woke
    every other waiter for nothing (each then tried again soon, about 12 tries for a 30 s
    TTL, while the new owner held the lock)."""
    holder = d2.lock([s.url for s in three], "q-give-back-once", ttl=30)
    assert d2(holder.acquire(blocking=False))
    first = three[0].client()
    listener = first.pubsub()
    try:
        listener.subscribe(holder.keys.channel)
        assert listener.get_message(timeout=5)["type"] == "subscribe"
        call = release_call(holder.keys, holder.token, wake=False)
        wake = [holder.keys]
        for _ in range(2):  # as the give-back runs it
            d2(holder.nodes._release_on(0, call, wake))
        assert d2(holder.nodes.pttl_ms(holder.key)) > 0  # nodes 1 and 2 still hold it
        messages = []
        while (message := listener.get_message(timeout=0.5)) is not None:
            messages.append(message)
        assert [m["type"] for m in messages] == ["message"]
        d2(holder.release())
    finally:
        listener.close()
        first.close()


def test_an_asyncio_quorum_release_cut_short_by_the_loop_shutdown_still_wakes_the_waiters(
    three: list[RedisServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review, round 3, session 24: ``asyncio.run`` ended while a release had freed every node
    and not yet sent its wake; the shutdown ran the release again, which found nothing to
    free and published nothing: other processes' waiters slept on the released holder's TTL.
    The wake is held back here (0.2 s) so that the shutdown lands between the two rounds."""
    wake = aionodes.Quorum._wake

    async def late_wake(self: aionodes.Quorum, *args: Any, **options: Any) -> None:
        await asyncio.sleep(0.2)
        await wake(self, *args, **options)

    monkeypatch.setattr(aionodes.Quorum, "_wake", late_wake)
    admins = [s.client() for s in three]
    listener = admins[0].pubsub()

    async def release_at_the_end() -> None:
        lock = celery_redlock.asyncio.Lock([s.url for s in three], "q-shutdown", ttl=30)
        assert await lock.acquire(blocking=False)
        listener.subscribe(lock.keys.channel)
        assert listener.get_message(timeout=5)["type"] == "subscribe"
        releasing = asyncio.ensure_future(lock.release())
        while any(admin.exists(lock.keys.lock) for admin in admins):  # the first round done
            await asyncio.sleep(0.01)
        assert not releasing.done()  # waiting on its wake

    try:
        asyncio.run(release_at_the_end())  # cancels the release, waiting on its wake
        message = listener.get_message(timeout=5)
        assert message is not None and message["type"] == "message"
    finally:
        listener.close()
        for admin in admins:
            admin.close()


def test_a_quorum_release_interrupted_between_its_round_trips_still_wakes_the_waiters(
    three: list[RedisServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review, round 3, session 24: a soft time limit (or any exception a signal raises)
    landing after the release's scripts ran and before its wake: the nodes were freed and
    nobody was woken, so the waiters slept on the released holder's TTL. The interruption is
    raised here as the release's round returns."""
    call_all = Quorum._call_all

    def interrupted(self: Quorum, source: str, *args: Any, **options: Any) -> Any:
        replies = call_all(self, source, *args, **options)
        if source == RELEASE:
            raise KeyboardInterrupt
        return replies

    holder = celery_redlock.Lock([s.url for s in three], "q-interrupted", ttl=30)
    assert holder.acquire(blocking=False)
    first = three[0].client()
    listener = first.pubsub()
    try:
        listener.subscribe(holder.keys.channel)
        assert listener.get_message(timeout=5)["type"] == "subscribe"
        monkeypatch.setattr(Quorum, "_call_all", interrupted)
        with pytest.raises(KeyboardInterrupt):
            holder.release()
        monkeypatch.undo()
        message = listener.get_message(timeout=5)
        assert message is not None and message["type"] == "message"
        assert first.get(holder.keys.lock) is None
    finally:
        listener.close()
        first.close()


class Watched(Inventory):
    """An inventory that counts, as each node's client is taken, the ``PUBLISH`` node 0 has
    run: what the waiters listening there were sent before the other nodes' deletes."""

    def __init__(self, urls: list[str], first: redis_py.Redis) -> None:
        super().__init__(urls, "redlock")
        self.first = first
        self.published: dict[int, int] = {}

    def _client(self, i: int) -> Any:
        stats = self.first.info("commandstats").get("cmdstat_publish", {"calls": 0})
        self.published.setdefault(i, int(stats["calls"]))  # the release's, not the wake's
        return super()._client(i)


def test_an_operators_quorum_release_wakes_the_waiters_once_every_node_freed_the_lock(
    three: list[RedisServer],
) -> None:
    """An operator's release freed node 0, where the waiter listens, first: node 0 woke the
    waiter at once, which found the lock still held on nodes 1 and 2, gave node 0 back without
    waking anyone, and slept to the released holder's TTL (3 runs in 5)."""
    urls = [s.url for s in three]
    first = three[0].client()
    holder = celery_redlock.Lock(urls, "q-order", ttl=20)
    assert holder.acquire(blocking=False)
    waiter = celery_redlock.Lock(urls, "q-order", ttl=5)
    results: list[bool] = []
    waiting = threading.Thread(target=lambda: results.append(waiter.acquire(timeout=10)))
    waiting.start()
    wait_until(
        lambda: waiter.attempts >= 1 and first.pubsub_numsub(holder.keys.channel)[0][1] >= 1, 5
    )
    inventory = Watched(urls, first)
    seen = inventory.read(holder.key)
    assert seen is not None
    inventory.published.clear()
    start = time.monotonic()
    assert inventory.release(seen)
    assert inventory.published[1] == inventory.published[0]  # nothing sent before node 1's
    waiting.join(15)
    assert results == [True] and time.monotonic() - start < 5  # not at its deadline (10 s)
    waiter.release()


@pytest.mark.parametrize("by", ["operator", "main-process"])
def test_a_release_by_another_process_wakes_the_waiters_on_the_node_the_holder_lacks(
    three: list[RedisServer], by: str
) -> None:
    """The command line's or dashboard's release (``RELEASE_UNRENEWED``) and the worker's
    main process's release of a dead child's lock (``RELEASE_ATTEMPT``) woke the waiters only
    where they deleted a key: a waiter on a node the holder lacked slept until the holder's
    TTL."""
    thread = Driver("thread", "url")
    holder, first = holder_lacking_node_0(thread, three, "q-other")
    urls = [s.url for s in three]
    waiter = celery_redlock.Lock(urls, "q-other", ttl=5)
    results: list[bool] = []
    waiting = threading.Thread(target=lambda: results.append(waiter.acquire(timeout=10)))
    start = time.monotonic()
    waiting.start()
    wait_until(
        lambda: waiter.attempts >= 1 and first.pubsub_numsub(holder.keys.channel)[0][1] >= 1, 5
    )
    if by == "operator":
        inventory = Inventory(urls, "redlock")
        seen = inventory.read(holder.key)
        assert seen is not None and inventory.release(seen)
    else:
        assert release_attempt(urls, "q-other", "redlock", holder.owner, holder.host, os.getpid())
    waiting.join(15)
    assert results == [True] and time.monotonic() - start < 5  # not at its deadline (10 s)
    waiter.release()


def test_a_quorum_without_a_majority_names_the_first_error(
    d2: Driver, three: list[RedisServer]
) -> None:
    """Two nodes paused: their replies never come within the node timeout."""
    lock = d2.lock([s.url for s in three], "q-paused", ttl=10)
    for server in three[1:]:
        server.client().execute_command("CLIENT", "PAUSE", 3000, "ALL")
    try:
        with pytest.raises(LockUnavailable) as raised:
            d2(lock.acquire(blocking=False))
    finally:
        for server in three[1:]:
            server.client().execute_command("CLIENT", "UNPAUSE")
    first = str(raised.value).partition("first error: ")[2]
    assert first.strip(), str(raised.value)


def test_a_quorum_without_a_majority_answering_does_not_say_the_lock_is_free(
    d2: Driver, three: list[RedisServer]
) -> None:
    """A lock held on three nodes, two of them paused: ``locked()`` said False and
    ``remaining_ttl()`` None (a silent node counted as "no key"), while ``acquire`` raised. A
    single node that does not answer raises; so does a quorum whose majority does not."""
    urls = [s.url for s in three]
    holder = d2.lock(urls, "q-silent", ttl=20)
    assert d2(holder.acquire(blocking=False))
    other = d2.lock(urls, "q-silent", ttl=20)
    for server in three[1:]:
        server.client().execute_command("CLIENT", "PAUSE", 3000, "ALL")
    try:
        with pytest.raises(LockUnavailable, match="PTTL failed"):
            d2(other.locked())
        with pytest.raises(LockUnavailable, match="PTTL failed"):
            d2(other.remaining_ttl())
    finally:
        for server in three[1:]:
            server.client().execute_command("CLIENT", "UNPAUSE")
    assert d2(other.locked()) and 0 < d2(other.remaining_ttl()) <= 20
    d2(holder.release())


def test_a_quorum_extend_that_finds_the_lock_lost_leaves_no_key_behind(
    d2: Driver, three: list[RedisServer]
) -> None:
    """Helper probe, round 3. The key vanished from two of three nodes; the holder's extend
    raised ``LockLost``, but its re-assert had written the key back there: every node held
    it for the new TTL, and another acquire was refused by an owner told it was lost."""
    urls = [s.url for s in three]
    holder = d2.lock(urls, "q-lost-extend", ttl=5)
    assert d2(holder.acquire(blocking=False))
    for server in three[:2]:
        server.client().delete(holder.keys.lock)
    with pytest.raises(LockLost):
        d2(holder.extend(10))
    assert [s.client().get(holder.keys.lock) for s in three] == [None] * 3
    other = d2.lock(urls, "q-lost-extend", ttl=5)
    assert d2(other.acquire(blocking=False))
    d2(other.release())


def test_a_quorum_acquires_extends_and_releases_on_every_node(
    d2: Driver, three: list[RedisServer]
) -> None:
    lock = d2.lock([s.url for s in three], "q-basic", ttl=10)
    assert d2(lock.acquire(blocking=False)) and lock.fencing_token is not None
    assert all(s.client().get(lock.key) == lock.token.encode() for s in three)
    d2(lock.extend(20))
    d2(lock.release())
    assert all(s.client().get(lock.keys.lock) is None for s in three)


def test_a_quorum_with_a_frozen_node_keeps_a_short_lease_alive(
    d2: Driver, three: list[RedisServer]
) -> None:
    """One node of three frozen (SIGSTOP): every round waits the 0.5 s node timeout for it.
    The acquisition then already knows a node lacks the lock, so the first renewal comes at
    lease/30 (0.1 s), as after a renewal a node lacked: at ``ttl / 3`` it would come at 1.0 s
    and have 0.5 s of a 1.5 s lease left for a 0.5 s round, and the lock would be lost."""
    lock = d2.lock([s.url for s in three], "q-frozen", ttl=1.5, auto_renew=True)
    frozen = three[2].process
    assert frozen is not None
    frozen.send_signal(signal.SIGSTOP)
    try:
        assert d2(lock.acquire(blocking=False))

        async def hold() -> None:
            await asyncio.sleep(3.0)  # two leases: several renewals, each 0.5 s long

        d2(hold()) if d2.is_async else time.sleep(3.0)
        assert lock.held and not lock.lost
        assert all(s.client().get(lock.key) == lock.token.encode() for s in three[:2])
        d2(lock.release())
    finally:
        frozen.send_signal(signal.SIGCONT)


@contextlib.contextmanager
def unanswered_port() -> Iterator[int]:
    """A port whose connects hang, as to a host that is off or behind a DROP rule: a listener
    that never accepts, its backlog filled, so the kernel drops further SYNs."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    filled: list[socket.socket] = []
    try:
        while True:  # until a connect hangs: the backlog is full
            probe = socket.socket()
            probe.settimeout(0.2)
            try:
                probe.connect(("127.0.0.1", port))
            except OSError:
                probe.close()
                break
            filled.append(probe)
        yield port
    finally:
        for sock in filled:
            sock.close()
        listener.close()


def test_a_node_that_hangs_before_healthy_ones_does_not_make_them_count_as_failed() -> None:
    """The middle node of three does not answer connects, in a process that has not seen it
    fail: connecting to it takes the round's whole 0.5 s. The node after it was then sent to
    past the round's deadline and read with no time left: a reply that took a moment (a busy
    machine; here the server is paused until 0.8 s) counted as failed, and two healthy nodes
    made "no quorum, 2 of 3 nodes failed". Each node now gets its 0.5 s from its own send.
    (The asyncio quorum sends to every node at once.)"""
    with RedisServer() as a, RedisServer() as c, unanswered_port() as port:
        lock = celery_redlock.Lock([a.url, f"redis://127.0.0.1:{port}/0", c.url], "q-hangs", 10)
        c.client().execute_command("CLIENT", "PAUSE", 800, "WRITE")
        assert lock.acquire(blocking=False)
        assert a.client().get(lock.key) == c.client().get(lock.key) == lock.token.encode()
        lock.release()


class HeldUpExtend(celery_redlock.Lock):
    """A thread lock whose renewal's extend is held up between the watchdog reading the token
    and the request leaving (a thread switch at that moment), and that notes its release."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.extending = threading.Event()
        self.proceed = threading.Event()
        self.releasing = threading.Event()

    def do_extend(self, token: str, ttl: float) -> Extended:
        self.extending.set()
        self.proceed.wait(10)
        return super().do_extend(token, ttl)

    def do_release(self, token: str, keep: float = 0) -> bool:
        self.releasing.set()
        return super().do_release(token, keep)


def test_a_release_waits_for_a_renewal_in_flight_which_would_put_the_lock_back(
    three: list[RedisServer],
) -> None:
    """A renewal that reads the token just before the release, and whose extend reaches the
    nodes just after it, found the key gone and re-asserted it (the quorum's repair): the
    released lock was held by nobody for a whole lease, and a task's next calls were
    skipped (seen on prefork workers with a node down). The release now waits for it."""
    lock = HeldUpExtend([s.url for s in three], "renewal-race", ttl=3, auto_renew=True)
    assert lock.acquire(blocking=False)
    assert lock.extending.wait(5)  # the first renewal, at ttl / 3, is held up
    releasing = threading.Thread(target=lock.release)
    releasing.start()
    assert not lock.releasing.wait(0.5)  # the release waits for the renewal; before, no
    lock.proceed.set()
    releasing.join(10)
    assert lock.releasing.is_set() and not lock.held
    assert [s.client().exists(lock.key) for s in three] == [0, 0, 0]


@pytest.mark.parametrize("nodes", [1, 3], ids=["one-node", "quorum"])
def test_a_client_of_the_other_kind_is_a_type_error_naming_the_right_lock(
    three: list[RedisServer], nodes: int
) -> None:
    """A blocking client given to the asyncio lock (it would block the loop, take the lock,
    then fail), or an asyncio client given to the thread lock, is refused when the lock is
    built, naming the lock to use."""

    def clients(make: Callable[[str], Any]) -> Any:
        made = [make(s.url) for s in three][:nodes]
        return made if nodes > 1 else made[0]

    with pytest.raises(TypeError, match=r"got redis\.client\.Redis: use celery_redlock\.Lock "):
        celery_redlock.asyncio.Lock(clients(redis_py.Redis.from_url), "kind")
    with pytest.raises(TypeError, match=r"use celery_redlock\.asyncio\.Lock with it"):
        celery_redlock.Lock(clients(aioredis.Redis.from_url), "kind")
    assert all(s.client().keys("*") == [] for s in three)


def test_a_pipeline_is_a_type_error_when_the_lock_is_built(redis_url: str) -> None:
    """Helper probe, round 3: ``Lock(r.pipeline(), ...)`` was taken, and the first acquire
    failed with ``int() argument must be ... not 'Pipeline'``: its commands are queued."""
    client, aclient = redis_py.Redis.from_url(redis_url), aioredis.Redis.from_url(redis_url)
    for lock, pipeline in (
        (celery_redlock.Lock, client.pipeline()),
        (celery_redlock.asyncio.Lock, aclient.pipeline()),
        (celery_redlock.Lock, aclient.pipeline()),
    ):
        with pytest.raises(TypeError, match=r"got a pipeline .* pass the client it came from"):
            lock(pipeline, "piped")
    client.close()


def test_a_client_class_is_a_type_error_when_the_lock_is_built() -> None:
    """Helper probe: ``Lock(redis.Redis, ...)`` (the class, not an instance) passed as a
    proxy of a client: the thread lock failed with ``'mappingproxy' object does not support
    item assignment``, the asyncio lock at its first acquire with an ``AttributeError`` and
    an ERROR with a traceback."""
    for lock, cls in (
        (celery_redlock.Lock, redis_py.Redis),
        (celery_redlock.asyncio.Lock, aioredis.Redis),
    ):
        with pytest.raises(TypeError, match=r"got the class .*Redis: pass an instance, Redis"):
            lock(cls, "classy")


@pytest.mark.parametrize("value", [5, None, object()], ids=["int", "None", "object"])
def test_a_redis_argument_that_is_no_client_is_a_type_error_when_the_lock_is_built(
    d2: Driver, three: list[RedisServer], value: Any
) -> None:
    """``Lock(5, ...)`` or ``Lock(None, ...)`` (a settings lookup that found nothing) is refused
    when the lock is built, naming what ``redis`` takes; alone or in a quorum's list. Before,
    it failed at the first command with an ``AttributeError`` about ``5``'s methods."""
    kind = r"celery_redlock\.asyncio\.Lock" if d2.is_async else r"celery_redlock\.Lock"
    wanted = rf"{kind} needs a Redis URL, a client \(redis\.(asyncio\.)?Redis\) or a list"
    with pytest.raises(
        TypeError, match=rf"{wanted} of them for a quorum, got {type(value).__name__}"
    ):
        d2.lock(value, "not-a-client")
    with pytest.raises(TypeError, match=wanted):
        d2.lock([three[0].url, three[1].url, value], "not-a-client")


def test_a_proxy_of_a_client_is_still_a_lock_connection(redis_url: str) -> None:
    """An object that only delegates to a client (``celery.local.Proxy``, a wrapt proxy, a
    ``__getattr__`` wrapper) has no ``execute_command`` of its own class; it is no client's
    type, but it answers commands, and worked before the check for non-clients."""
    client = redis_py.Redis.from_url(redis_url)
    try:
        lock = celery_redlock.Lock(Proxy(lambda: client), "proxied", ttl=10)
        assert lock.acquire(blocking=False)
        lock.release()
    finally:
        client.close()


def test_a_url_given_as_bytes_is_a_type_error_saying_to_decode_it(
    d2: Driver, three: list[RedisServer]
) -> None:
    """A URL read as bytes (from an environment or a file) was taken for a list of numbers:
    "a Redlock quorum lists the same node twice (int and int)"."""
    for value in (three[0].url.encode(), bytearray(three[0].url.encode())):
        with pytest.raises(TypeError, match=r"needs a Redis URL as a str, got \w+: decode it"):
            d2.lock(value, "bytes-url")
        with pytest.raises(TypeError, match=r"needs a Redis URL as a str"):
            d2.lock([three[1].url, three[2].url, value], "bytes-url")


def test_a_wait_that_cannot_subscribe_is_lock_unavailable_not_a_client_error(d2: Driver) -> None:
    """Redis at ``maxclients``: the lock's pooled connection still answers, but the waiter's
    subscription needs a connection of its own, which the server refuses. The thread lock
    raised redis-py's ``MaxClientsReachedError`` from the subscribe (outside the wait's error
    handling; a kept subscription whose connection died with a restarted server raised
    ``ConnectionError`` there too), which a task took for a bug: FAILURE, never retried. Both
    locks now raise ``LockUnavailable`` once a second subscription fails too (one failure is
    retried at once), so the task's ``redlock_on_unavailable`` policy applies."""
    with RedisServer() as own:
        holder = d2.lock(own.url, "maxclients", ttl=30)
        assert d2(holder.acquire(blocking=False))
        waiter = d2.lock(own.url, "maxclients", ttl=30)
        assert not d2(waiter.acquire(blocking=False))  # its connection is pooled now
        admin = own.client()
        try:
            admin.config_set("maxclients", admin.info("clients")["connected_clients"])
            with pytest.raises(LockUnavailable, match=r"did not answer for lock .*maxclients"):
                d2(waiter.acquire(blocking=True, timeout=5))
        finally:
            admin.config_set("maxclients", 10000)
        d2(holder.release())
        admin.close()


class InterruptedAfterTheScript(celery_redlock.Lock):
    """A thread lock interrupted (``interrupt``) after its acquire script ran on Redis, before
    it read the reply: Ctrl-C, or ``SystemExit`` from a time limit."""

    interrupt: type[BaseException] = KeyboardInterrupt

    def do_acquire(self, token: str, ttl: float) -> Any:
        super().do_acquire(token, ttl)
        raise self.interrupt


INTERRUPTS = [KeyboardInterrupt, SystemExit]


@pytest.mark.parametrize("interrupt", INTERRUPTS)
@pytest.mark.parametrize("nodes", [1, 3], ids=["one-node", "quorum"])
def test_an_interrupted_thread_acquire_gives_its_token_back(
    three: list[RedisServer], interrupt: type[BaseException], nodes: int
) -> None:
    """The asyncio lock's cancelled acquire gives back what it took; so does an interrupted
    thread lock, or the key would stay held by nobody for its TTL."""
    urls = [s.url for s in three][:nodes]
    lock = InterruptedAfterTheScript(urls if nodes > 1 else urls[0], "interrupted", ttl=60)
    lock.interrupt = interrupt
    with pytest.raises(interrupt):
        lock.acquire(blocking=False)
    assert not lock.held
    assert all(s.client().get(lock.keys.lock) is None for s in three)
    other = celery_redlock.Lock(urls if nodes > 1 else urls[0], "interrupted", ttl=5)
    assert other.acquire(blocking=False)
    other.release()


class InterruptedRelease(celery_redlock.Lock):
    """A thread lock whose first release is interrupted (``interrupt``) before it is sent."""

    interrupt: type[BaseException] = KeyboardInterrupt
    calls = 0

    def do_release(self, token: str, keep: float = 0) -> bool:
        self.calls += 1
        if self.calls == 1:
            raise self.interrupt
        return super().do_release(token, keep)


@pytest.mark.parametrize("interrupt", [*INTERRUPTS, RuntimeError])
@pytest.mark.parametrize("keep", [0, 30])
def test_an_interrupted_thread_release_is_sent_again(
    redis_url: str, r: redis_py.Redis, interrupt: type[BaseException], keep: float
) -> None:
    """Ctrl-C (or a soft time limit, an exception) lands in ``with lock:``'s release, after it
    forgot its token and stopped the renewal: the key stayed held by nobody until its TTL."""
    lock = InterruptedRelease(redis_url, "interrupted-release", ttl=60, auto_renew=True)
    lock.interrupt = interrupt
    assert lock.acquire(blocking=False)
    token = lock.token
    with pytest.raises(interrupt):
        lock.release(keep=keep)
    assert not lock.held and lock.calls == 2
    stored = r.get(lock.keys.lock)
    assert stored is None if keep == 0 else stored not in (None, token.encode())
    if keep:  # kept as a cooldown, as an uninterrupted release keeps it
        assert 29_000 < r.pttl(lock.keys.lock) <= 30_000


@pytest.mark.parametrize("interrupt", INTERRUPTS)
def test_an_interrupted_queued_try_gives_its_token_back(
    redis_url: str,
    r: redis_py.Redis,
    interrupt: type[BaseException],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A queued try that took the lock (the holder released just before it) and is interrupted
    before reading its reply gives it back, and leaves the queue."""
    holder = celery_redlock.Lock(redis_url, "queued-interrupt", ttl=60)
    assert holder.acquire(blocking=False)
    lock = celery_redlock.Lock(redis_url, "queued-interrupt", ttl=60)
    queue = lock.nodes
    assert isinstance(queue, SingleNode)
    original = queue.wait_attempt

    def released_then_interrupted(*args: Any) -> Any:
        holder.release()  # free: this try takes the lock with its own token
        original(*args)
        assert r.get(lock.keys.lock) is not None
        raise interrupt

    monkeypatch.setattr(queue, "wait_attempt", released_then_interrupted)  # nodes are shared
    with pytest.raises(interrupt):
        lock.acquire(timeout=30)
    assert not lock.held
    assert lock_keys(r) == [] and r.zcard(lock.keys.waiters) == 0


def test_the_asyncio_nodes_docstring_names_what_they_send() -> None:
    """They never send EVAL (the documented ACL user lacks it): SCRIPT LOAD, then EVALSHA."""
    doc = aionodes.__doc__ or ""
    assert "``EVAL``" not in doc.replace("never ``EVAL``", "")
    assert "SCRIPT LOAD" in doc


def test_a_release_ending_after_the_object_took_the_lock_again_leaves_the_new_holding(
    d2: Driver, redis_url: str, r: redis_py.Redis
) -> None:
    """One ``Lock`` object, two tasks (or threads): A's release takes the token, deletes the
    key, and is still on its way back when B acquires with the same object. A's release then
    forgot the token: B's acquire had returned True, but ``held`` was False, B's release raised
    ``LockNotOwned``, and the key stayed held, unrenewed, for its whole TTL. Here the release
    is held back after Redis answered (``do_release``, an override point), so the order is
    certain."""
    if d2.is_async:

        async def main() -> None:
            deleted, gate = asyncio.Event(), asyncio.Event()

            class Slow(celery_redlock.asyncio.Lock):
                async def do_release(self, token: str, keep: float = 0) -> bool:
                    done = await super().do_release(token, keep)
                    deleted.set()
                    await gate.wait()
                    return done

            lock = Slow(redis_url, "again", ttl=30)
            assert await lock.acquire(blocking=False)
            first = asyncio.create_task(lock.release())
            await deleted.wait()
            assert await lock.acquire(blocking=False)  # B, on the same object
            gate.set()
            await first
            assert lock.held and lock.fencing_token is not None
            assert r.get(lock.key) == (lock.token or "").encode()
            await lock.release()

        d2(main())
    else:
        deleted, gate = threading.Event(), threading.Event()

        class SlowThread(celery_redlock.Lock):
            def do_release(self, token: str, keep: float = 0) -> bool:
                done = super().do_release(token, keep)
                deleted.set()
                assert gate.wait(10)
                return done

        lock = SlowThread(redis_url, "again", ttl=30)
        assert lock.acquire(blocking=False)
        first = threading.Thread(target=lock.release)
        first.start()
        assert deleted.wait(10)
        assert lock.acquire(blocking=False)
        gate.set()
        first.join(10)
        assert lock.held and lock.fencing_token is not None
        assert r.get(lock.key) == (lock.token or "").encode()
        lock.release()
    assert lock_keys(r) == []


def test_a_late_token_read_or_extend_of_an_earlier_holding_leaves_the_new_one(
    d2: Driver, redis_url: str, r: redis_py.Redis
) -> None:
    """One ``Lock`` object, two tasks (or threads): A extends (on the thread lock, or reads
    ``fencing_token``: one round trip), B releases and acquires again with the same object, then
    A's request reaches Redis: the old token is not held. A's extend raises ``LockNotOwned``
    (its holding was released, by this object: nothing was lost). Before, the reply marked
    the new holding lost, stopped its renewal and left its key to expire while B ran on.
    Here A's request is held back until B has the lock again (``do_extend``, an override
    point, and the thread lock's token read), so the order is certain."""
    if d2.is_async:

        async def main() -> None:
            sent, gate = asyncio.Event(), asyncio.Event()

            class Slow(celery_redlock.asyncio.Lock):
                async def do_extend(self, token: str, ttl: float) -> Extended:
                    sent.set()
                    await gate.wait()
                    return await super().do_extend(token, ttl)

            lock = Slow(redis_url, "late", ttl=30)
            assert await lock.acquire(blocking=False)
            first = asyncio.create_task(lock.extend(60))
            await sent.wait()
            await lock.release()
            assert await lock.acquire(blocking=False)  # B, on the same object
            gate.set()
            with pytest.raises(LockNotOwned):
                await first
            assert lock.held and not lock.lost and lock.fencing_token is not None
            assert r.get(lock.key) == (lock.token or "").encode()
            await lock.release()

        d2(main())
        assert lock_keys(r) == []
        return
    sent, gate = threading.Event(), threading.Event()

    class SlowThread(celery_redlock.Lock):
        def do_extend(self, token: str, ttl: float) -> Extended:
            sent.set()
            assert gate.wait(10)
            return super().do_extend(token, ttl)

    lock = SlowThread(redis_url, "late", ttl=30)
    fence = lock.nodes.fence
    for late in ("extend", "fencing_token"):
        sent.clear()
        gate.clear()
        if late == "fencing_token" and not lock.nodes.set_get:
            continue  # Redis 6.2: the acquire script gives the token, no later read to hold back
        if late == "fencing_token":

            def held_back(*args: Any) -> Any:
                sent.set()
                assert gate.wait(10)
                return fence(*args)

            lock.nodes.fence = held_back  # type: ignore[method-assign]
        assert lock.acquire(blocking=False)
        errors: list[BaseException] = []

        def first(late: str = late, errors: list[BaseException] = errors) -> None:
            try:
                if late == "extend":
                    lock.extend(60)
                else:
                    assert lock.fencing_token is None  # its holding ended
            except BaseException as exc:  # handed to the test's thread
                errors.append(exc)

        thread = threading.Thread(target=first)
        thread.start()
        assert sent.wait(10)
        lock.release()
        lock.nodes.fence = fence  # type: ignore[method-assign]
        assert lock.acquire(blocking=False)
        gate.set()
        thread.join(10)
        if late == "extend":
            assert [type(e) for e in errors] == [LockNotOwned]
        else:
            assert errors == []
        assert lock.held and not lock.lost and lock.fencing_token is not None, late
        assert r.get(lock.key) == (lock.token or "").encode()
        lock.release()
    assert lock_keys(r) == []


@pytest.mark.parametrize("case", ["answered-after-the-lease", "in-time", "lost-before"])
def test_a_key_that_expired_while_the_release_was_on_its_way_is_no_loss(
    d2: Driver, redis_url: str, r: redis_py.Redis, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A release sent within the lease and answered after its end (Redis stalled: a fork,
    SIGSTOP, a VM pause) found the key expired: the holder was reported lost (ERROR, and a
    task's ``lock_lost``), though its work had ended within the lease. It is a WARNING now.
    A key found gone by a release answered within the lease was taken from the holder while
    it worked: still a loss. A holding already found lost (an extend, here) gets no WARNING
    saying its work ended within the lease. Here the stall is the clock moved on, and the
    expiry a ``DEL``, between the release's start and its script."""
    clock = FakeClock()

    def stall(key: str) -> None:
        if case != "in-time":
            clock.now += 6  # past the 5 s lease
        r.delete(key)

    if d2.is_async:

        class Stalled(celery_redlock.asyncio.Lock):
            async def do_release(self, token: str, keep: float = 0) -> bool:
                stall(self.key)
                return await super().do_release(token, keep)

        async def main() -> Stalled:
            lock = Stalled(redis_url, "on-the-way", ttl=5, auto_renew=False, clock=clock)
            assert await lock.acquire(blocking=False)
            if case == "lost-before":
                r.delete(lock.key)
                with pytest.raises(LockLost):
                    await lock.extend()
            with pytest.raises(LockLost):
                await lock.release()
            return lock

        lock: Any = d2(main())
    else:

        class StalledThread(celery_redlock.Lock):
            def do_release(self, token: str, keep: float = 0) -> bool:
                stall(self.key)
                return super().do_release(token, keep)

        lock = StalledThread(redis_url, "on-the-way", ttl=5, auto_renew=False, clock=clock)
        assert lock.acquire(blocking=False)
        if case == "lost-before":
            r.delete(lock.key)
            with pytest.raises(LockLost):
                lock.extend()
        with pytest.raises(LockLost):
            lock.release()
    said = [(record.levelname, record.getMessage()) for record in caplog.records]
    if case == "answered-after-the-lease":
        warning = f"lock {lock.key} expired while its release was on its way: Redis answered"
        assert [level for level, _ in said] == ["WARNING"] and said[0][1].startswith(warning)
        assert not lock.lost
    else:
        reason = "at release" if case == "in-time" else "extend found it"
        assert [level for level, _ in said] == ["ERROR"] and reason in said[0][1]
        assert lock.lost


def test_a_task_cancelled_once_can_still_take_a_free_lock_in_its_cleanup(redis_url: str) -> None:
    """From Python 3.11 a task counts the cancellations asked of it, and the count stays above
    0 for the rest of a task cancelled once. The acquire took any count above 0 for a
    cancellation dropped on the way: in a cleanup (``except CancelledError``, a ``finally``
    under an expired ``asyncio.timeout``, a ``TaskGroup`` child whose sibling failed) it took
    the free lock, gave it back and raised ``CancelledError``. Only a cancellation asked
    during the acquire counts now."""

    async def cleanup(lock: celery_redlock.asyncio.Lock, done: list[str]) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            assert await lock.acquire(blocking=False)
            await lock.release()
            assert await lock.acquire(timeout=5)
            await lock.release()
            async with lock:
                done.append("cleanup ran under the lock")
            raise

    async def main() -> None:
        done: list[str] = []
        lock = celery_redlock.asyncio.Lock(redis_url, "cleanup", ttl=30)
        task = asyncio.create_task(cleanup(lock, done))
        await asyncio.sleep(0)  # the task is in its sleep
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert done == ["cleanup ran under the lock"]

        async def sleeper() -> None:
            try:
                await asyncio.sleep(3600)
            finally:
                async with lock:
                    done.append("finally ran under the lock")

        with pytest.raises(asyncio.TimeoutError):  # wait_for cancels the sleeper
            await asyncio.wait_for(sleeper(), 0.05)
        assert done[-1] == "finally ran under the lock"

    asyncio.run(main())


def test_a_release_never_stops_the_renewal_of_a_slot_taken_meanwhile(
    redis_url: str, r: redis_py.Redis
) -> None:
    """A semaphore object renewed by its watchdog: thread A's release takes the token; before
    A stopped the renewal, thread B acquired with the same object (another slot, A's still
    held) and started its own; A then stopped B's, and B's slot expired while B held it. The
    release stops the renewal before it gives the token up. A is held right after that
    moment here (``_release_token``), so the order is certain."""
    taken, gate, renewed = threading.Event(), threading.Event(), threading.Event()
    second: list[str] = []

    class Paused(celery_redlock.Lock):
        def _release_token(self, keep: float) -> str:
            token = super()._release_token(keep)
            taken.set()
            assert gate.wait(10)
            return token

        def do_extend(self, token: str, ttl: float) -> Extended:
            extended = super().do_extend(token, ttl)
            if second and token == second[0] and extended.held:
                renewed.set()
            return extended

    lock = Paused(redis_url, "renewed-slots", ttl=0.9, auto_renew=True, limit=2)
    assert lock.acquire(blocking=False)
    first = threading.Thread(target=lock.release)
    first.start()
    assert taken.wait(10)
    assert lock.acquire(blocking=False)  # B: slot 2, slot 1 still A's
    assert lock._slot == lock.keys.slots[1] and lock.token is not None
    second.append(lock.token)
    gate.set()
    first.join(10)
    assert renewed.wait(5)  # B's slot renewed by the watchdog (every 0.3 s)
    assert lock.held
    lock.release()
    assert lock_keys(r) == []


def test_more_callers_at_once_than_the_url_pool_holds_wait_for_a_connection(d2: Driver) -> None:
    """Probe, round 23: with more than 100 commands in flight at once (here a paused server),
    the thread lock built from a URL failed 50 of 150 acquires with "pool exhausted" (redis-py
    8's plain pool stops at 100 connections), where the asyncio lock waited for a free
    connection. Both wait now, at most the socket timeout."""
    n = 150
    with RedisServer() as server:
        locks = [d2.lock(server.url, f"pool-{i}", ttl=10) for i in range(n)]
        server.client().execute_command("CLIENT", "PAUSE", 2000, "WRITE")
        outcomes: list[Any] = [None] * n
        if d2.is_async:

            async def everyone() -> list[Any]:
                tries = (lock.acquire(blocking=False) for lock in locks)
                return list(await asyncio.gather(*tries, return_exceptions=True))

            outcomes = d2(everyone())
        else:
            start = threading.Barrier(n)

            def one(i: int) -> None:
                start.wait()
                try:
                    outcomes[i] = locks[i].acquire(blocking=False)
                except Exception as exc:
                    outcomes[i] = exc

            threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
        assert [o for o in outcomes if o is not True] == []
        for lock in locks:
            d2(lock.release())


@pytest.mark.parametrize("query", ["", "?socket_timeout=0.2", "?socket_timeout=30"])
def test_the_url_pool_waits_for_a_connection_as_long_as_the_urls_socket_timeout(
    query: str,
) -> None:
    """The pool's wait is the socket timeout the docs name: a URL's own ``socket_timeout`` was
    not read, and the pool waited 5 s whatever it said (review, round 23)."""
    expected = float(query.rpartition("=")[2] or 5.0)
    url = f"redis://127.0.0.1:1/0{query}"
    assert clients.client_for(url).connection_pool.timeout == expected

    async def pooled() -> Any:
        return aionodes.client_for(url).connection_pool

    pool = asyncio.run(pooled())
    if hasattr(aioredis.ConnectionPool, "get_available_connection"):  # redis-py >= 5.1
        assert pool.timeout == expected
    else:  # the plain pool, unbounded (aionodes._pool_for)
        assert not isinstance(pool, aioredis.BlockingConnectionPool)


def test_a_tls_file_that_does_not_exist_is_named(
    d: Driver, redis_server: RedisServer, tmp_path: Path
) -> None:
    """Asgi probe, round 3: a missing CA file gave only redis-py's "Error 2 connecting to
    ... No such file or directory.", naming no file (the CLI and the worker's checks name it)."""
    missing = tmp_path / "ca.pem"
    url = f"rediss://127.0.0.1:{redis_server.port}/0?ssl_ca_certs={missing}"
    with pytest.raises(LockUnavailable) as raised:
        d(d.lock(url, "tls-files").acquire(blocking=False))
    assert f"a file the client was given does not exist: ssl_ca_certs={missing}" in str(
        raised.value
    )
