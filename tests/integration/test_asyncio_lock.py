"""The asyncio :class:`celery_redlock.asyncio.Lock` against real ``redis-server`` processes.

Each test drives its coroutine with ``asyncio.run`` (no pytest-asyncio). Waits are on Redis
state (``PUBSUB NUMSUB``, keys) or on the lock's own state, always with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
import redis as redis_py
import redis.asyncio as aioredis

import celery_redlock
from celery_redlock import LockContended, LockLost, LockUnavailable
from celery_redlock._redis import aiolock, aionodes, subscriptions
from celery_redlock._redis.aionodes import SingleNode
from celery_redlock._redis.keys import keys_for
from celery_redlock._redis.nodes import Extended
from celery_redlock._redis.scripts import AcquireResult
from celery_redlock.asyncio import Lock
from celery_redlock.testing import RedisServer, wait_until
from support.apps import lock_keys

NAME = "aio"
KEY = keys_for("redlock", NAME).lock
CHANNEL = keys_for("redlock", NAME).channel


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


async def until(condition: Callable[[], Any], timeout: float = 10.0) -> None:
    """Poll ``condition`` without blocking the loop; AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(0.01)


def background() -> list[asyncio.Future[Any]]:
    """The running loop's background clean-ups (give-backs, leaves) not ended yet; those of
    another test's loop, left by its failure, are not this test's."""
    state = aionodes._per_loop.get(asyncio.get_running_loop())
    return [] if state is None else [task for task in state.cleanups if not task.done()]


def subscribers(r: redis_py.Redis, channel: str = CHANNEL) -> int:
    return int(dict(r.pubsub_numsub(channel)).get(channel.encode(), 0))


def queued(r: redis_py.Redis, name: str = NAME) -> int:
    """How many blocking waiters are in the lock's waiter queue."""
    return int(r.zcard(keys_for("redlock", name).waiters))


class Counting(Lock):
    """Counts completed do_acquire calls and renewals through the override points."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.acquires = 0
        self.extends = 0

    async def do_acquire(self, token: str, ttl: float) -> AcquireResult:
        result = await super().do_acquire(token, ttl)
        self.acquires += 1
        return result

    async def do_extend(self, token: str, ttl: float) -> Extended:
        self.extends += 1
        return await super().do_extend(token, ttl)


# -- acquire / release / extend ------------------------------------------------------------------


def test_limit_above_one_needs_a_single_deployment() -> None:
    with pytest.raises(ValueError, match="limit > 1"):
        Lock(["redis://127.0.0.1:1", "redis://127.0.0.1:2", "redis://127.0.0.1:3"], "x", limit=2)


def test_semaphore_slots_shared_with_the_sync_lock(redis_url: str) -> None:
    async def main() -> None:
        first = Lock(redis_url, NAME, limit=2)
        assert await first.acquire(blocking=False)
        sync = celery_redlock.Lock(redis_url, NAME, limit=2)
        assert sync.acquire(blocking=False)
        third = Lock(redis_url, NAME, limit=2)
        assert not await third.acquire(blocking=False)
        assert {first.key, sync.key} == set(keys_for("redlock", NAME, 2).slots)
        await first.release()
        sync.release()

    run(main())


# -- one lock for asyncio, threads and tasks -----------------------------------------------------


def test_async_holder_excludes_a_sync_lock(redis_url: str) -> None:
    async def main() -> None:
        async with Lock(redis_url, NAME, ttl=30, owner="async-holder") as held:
            sync = celery_redlock.Lock(redis_url, NAME)
            assert not sync.acquire(blocking=False)
            assert sync.last_holder is not None
            assert sync.last_holder.token == held.token
            assert sync.last_holder.task_id == "async-holder"
        assert sync.acquire(blocking=False)
        sync.release()

    run(main())


def test_sync_holder_excludes_an_async_lock(redis_url: str) -> None:
    sync = celery_redlock.Lock(redis_url, NAME, ttl=30, owner="sync-holder")
    assert sync.acquire(blocking=False)

    async def main() -> None:
        lock = Lock(redis_url, NAME, timeout=0)
        assert not await lock.acquire()
        assert lock.last_holder is not None and lock.last_holder.task_id == "sync-holder"
        assert lock.last_holder_ttl is not None and 0 < lock.last_holder_ttl <= 30
        with pytest.raises(LockContended) as caught:
            async with lock:
                raise AssertionError("entered a held lock")
        assert caught.value.holder == "sync-holder" and caught.value.key == KEY
        sync.release()
        assert await lock.acquire(blocking=False)
        await lock.release()

    run(main())


def test_fencing_tokens_increase_across_sync_and_async_acquisitions(redis_url: str) -> None:
    async def main() -> list[int | None]:
        tokens: list[int | None] = []
        for i in range(6):
            if i % 2:
                sync = celery_redlock.Lock(redis_url, NAME)
                assert sync.acquire(blocking=False)
                tokens.append(sync.fencing_token)
                sync.release()
            else:
                async with Lock(redis_url, NAME) as lock:
                    tokens.append(lock.fencing_token)
        return tokens

    tokens = run(main())
    assert all(isinstance(t, int) for t in tokens)
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


def test_a_released_name_leaves_no_key_and_its_tokens_still_increase(
    redis_url: str, r: redis_py.Redis
) -> None:
    """One slot on one deployment: the token comes from the server clock at acquire, and no
    fencing counter is written (a semaphore keeps one)."""

    async def main() -> list[int | None]:
        tokens: list[int | None] = []
        for i in range(20):
            async with Lock(redis_url, f"leaves-nothing:{i % 2}") as lock:
                tokens.append(lock.fencing_token)
        return tokens

    tokens = run(main())
    assert all(isinstance(t, int) for t in tokens)
    for name in (0, 1):  # per name, strictly increasing
        mine = tokens[name::2]
        assert mine == sorted(mine) and len(set(mine)) == len(mine)
    assert [k for k in r.scan_iter("redlock:{leaves-nothing:*") if b":stats:" not in k] == []


# -- blocking acquire ----------------------------------------------------------------------------


def test_blocking_acquire_is_woken_by_a_sync_release(redis_url: str, r: redis_py.Redis) -> None:
    holder = celery_redlock.Lock(redis_url, NAME, ttl=60)
    assert holder.acquire(blocking=False)

    async def main() -> None:
        waiter = Counting(redis_url, NAME, ttl=10)
        task = asyncio.create_task(waiter.acquire(timeout=None))
        # One failed attempt, then the waiter subscribes to its own channel and queues.
        await until(lambda: queued(r) == 1)
        holder.release()
        # The holder's TTL has ~60 s left: only the handoff can give the waiter the lock.
        assert await asyncio.wait_for(task, 30)
        assert waiter.acquires == 1 and waiter.held  # handed over: no try of its own
        assert waiter.fencing_token is not None
        assert r.get(KEY) == waiter.token.encode()  # type: ignore[union-attr]
        await waiter.release()

    run(main())


class MyRedis(aioredis.Redis):
    """A client subclass of yours: defined outside redis-py."""


@pytest.mark.parametrize("client", ["redis", "valkey", "subclass"])
def test_a_resp3_wait_writes_no_push_response_lines(
    redis_url: str, r: redis_py.Redis, caplog: pytest.LogCaptureFixture, client: str
) -> None:
    """The asyncio twin of the sync test (tests/integration/test_waiters.py): its subscription
    had no push handler of its own, so redis-py 5.0 and valkey-py 6.0 wrote ``Push response:
    [...]`` to stderr at INFO for each message, the whole token of the waiter handed the lock
    among them (helper probe on the lowest versions); redis-py's later releases log at DEBUG.
    Run on both by ``nox -s lowest`` and the dev venv."""
    url = f"{redis_url}?protocol=3"

    async def main() -> None:
        if client == "valkey":
            valkey = pytest.importorskip("valkey.asyncio")
            target: Any = valkey.Valkey.from_url(url)
        elif client == "subclass":
            target = MyRedis.from_url(url)
        else:
            target = url
        holder, waiter = Lock(target, NAME, ttl=30), Lock(target, NAME, ttl=20)
        assert await holder.acquire(blocking=False)
        task = asyncio.create_task(waiter.acquire(timeout=None))
        await until(lambda: queued(r) == 1)
        await holder.release()
        assert await asyncio.wait_for(task, 30)  # handed over: a message on its channel
        await waiter.release()
        if client != "redis":
            await target.aclose()

    with caplog.at_level(logging.DEBUG, logger="push_response"):
        run(main())
    assert [r.getMessage() for r in caplog.records if r.name == "push_response"] == []


def test_several_waiters_one_winner_per_release(redis_url: str, r: redis_py.Redis) -> None:
    async def main() -> None:
        holder = Lock(redis_url, NAME, ttl=60)
        assert await holder.acquire(blocking=False)
        inside = 0
        most = 0
        wins: list[int] = []

        async def waiter() -> None:
            nonlocal inside, most
            async with Lock(redis_url, NAME, ttl=60) as lock:
                inside += 1
                most = max(most, inside)
                assert lock.fencing_token is not None
                wins.append(lock.fencing_token)
                await asyncio.sleep(0)  # let the others run while we hold
                assert r.get(KEY) == lock.token.encode()  # type: ignore[union-attr]
                inside -= 1

        tasks = [asyncio.create_task(waiter()) for _ in range(5)]
        await until(lambda: queued(r) == 5)
        await holder.release()
        # Each winner's release wakes the next; TTLs are 60 s, so a missed wake-up would hang.
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        assert most == 1 and len(wins) == 5 and wins == sorted(wins)
        assert lock_keys(r) == []

    run(main())


# -- cancellation --------------------------------------------------------------------------------


def test_cancelled_waiter_gives_up_cleanly(redis_url: str, r: redis_py.Redis) -> None:
    holder = celery_redlock.Lock(redis_url, NAME, ttl=60)
    assert holder.acquire(blocking=False)

    async def main() -> None:
        waiter = Lock(redis_url, NAME)
        task = asyncio.create_task(waiter.acquire())
        await until(lambda: queued(r) == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not waiter.held and waiter.token is None
        assert r.get(KEY) == holder.token.encode()  # type: ignore[union-attr]
        await until(lambda: queued(r) == 0)  # it left the queue (in the background)
        holder.release()
        assert lock_keys(r) == []

    run(main())


class ReplyInFlight(Lock):
    """The acquire script runs on Redis, then the reply "stays in flight" until ``reply`` is
    set (or the loop's shutdown cancels it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent, self.reply = asyncio.Event(), asyncio.Event()

    async def do_acquire(self, token: str, ttl: float) -> AcquireResult:
        result = await super().do_acquire(token, ttl)
        self.sent.set()
        await self.reply.wait()
        return result


def test_cancel_while_the_acquire_reply_is_in_flight_releases(
    redis_url: str, r: redis_py.Redis
) -> None:
    async def main() -> None:
        lock = ReplyInFlight(redis_url, NAME, ttl=60)
        task = asyncio.create_task(lock.acquire())
        await lock.sent.wait()
        assert r.exists(KEY)  # the script won on the server
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not lock.held
        lock.reply.set()  # the reply arrives: it says the lock was taken
        await until(lambda: lock_keys(r) == [])  # given back in the background

    run(main())


def test_a_give_back_cancelled_by_the_loop_s_shutdown_still_goes_out(
    redis_url: str, r: redis_py.Redis
) -> None:
    """Ctrl-C under ``asyncio.run``: (1) the main task is cancelled while its acquire's reply
    is on its way (the script ran: the key is taken); (2) the main task ends, its give-back
    started in the background; (3) ``asyncio.run`` cancels every task left, the give-back
    among them, before it sent its release. The key stayed held by nobody for its 60 s TTL."""
    lock = ReplyInFlight(redis_url, NAME, ttl=60)
    cancelled_in_flight(lock, sent=lambda: r.exists(KEY))  # step 1
    assert lock_keys(r) == [] and not lock.held


def cancelled_in_flight(lock: ReplyInFlight, sent: Callable[[], Any] = lambda: True) -> None:
    """``asyncio.run`` of ``lock.acquire()`` whose main task is cancelled once the script ran
    on Redis (``sent()`` must then be true), its reply on its way: Ctrl-C under it."""

    async def main() -> None:
        me = asyncio.current_task()
        assert me is not None

        async def cancel_main() -> None:
            await lock.sent.wait()
            assert sent()
            me.cancel()

        canceller = asyncio.ensure_future(cancel_main())
        try:
            await lock.acquire()
        finally:
            await canceller

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(main())


def test_the_shutdown_waits_a_bounded_time_for_give_backs_redis_does_not_answer(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client of the user's without a socket timeout (``redis.asyncio.Redis()``'s default)
    and a frozen server: the give-back run again at the shutdown waited for the server, and
    ``asyncio.run`` did not return until it resumed."""
    monkeypatch.setattr(aionodes, "SHUTDOWN_WAIT", 0.5)
    with RedisServer() as server:
        assert server.process is not None
        pid = server.process.pid
        resumed = threading.Event()

        def resume() -> None:
            resumed.set()
            os.kill(pid, signal.SIGCONT)

        async def main() -> None:
            client = aioredis.Redis.from_url(server.url)  # no socket timeout
            lock = Lock(client, "frozen-at-exit", ttl=30)
            sent = when_started(lock, "do_acquire")
            os.kill(pid, signal.SIGSTOP)
            task = asyncio.ensure_future(lock.acquire(blocking=False))
            await sent.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        timer = threading.Timer(30, resume)
        timer.start()
        try:
            with caplog.at_level(logging.WARNING, logger="celery_redlock.lock"):
                asyncio.run(main())
            assert not resumed.is_set()  # returned while the server was still frozen
            assert "the event loop shut down with 1 lock give-back(s) unanswered" in caplog.text
        finally:
            timer.cancel()
            if not resumed.is_set():
                resume()


def test_a_give_back_refused_at_the_shutdown_is_an_answer_not_a_silence(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Run again at the shutdown, a give-back that Redis refused (here an ACL user without
    ``DEL``) was reported as "the event loop shut down before Redis answered", and its second
    release was not sent: a refusal is an answer, as everywhere else."""
    with RedisServer() as server:
        admin = server.client()
        rules = "-@all +evalsha +script|load +get +set +pexpire +pttl +time +publish +ping"
        admin.execute_command("ACL", "SETUSER", "nodel", "on", ">pw", "~*", "&*", *rules.split())
        url = f"redis://nodel:pw@127.0.0.1:{server.port}/0"
        lock = ReplyInFlight(url, "refused-at-exit", ttl=60)
        with caplog.at_level(logging.WARNING, logger="celery_redlock.lock"):
            cancelled_in_flight(lock)
        assert "before Redis answered" not in caplog.text
        assert admin.exists(keys_for("redlock", "refused-at-exit").lock)  # DEL was refused
        admin.close()


@pytest.mark.parametrize("turns", [0, 1], ids=["at-once", "one-turn-later"])
def test_a_holder_cancelled_as_asyncio_run_ends_still_releases(
    redis_url: str, r: redis_py.Redis, caplog: pytest.LogCaptureFixture, turns: int
) -> None:
    """Helper probe, round 3, session 22 (uvicorn's ``--timeout-graceful-shutdown`` does
    this): (1) a holder inside ``async with lock:`` is cancelled; (2) the main task returns
    at once, or one loop turn later, with its release under way; (3) ``asyncio.run``
    cancels every task left, the release's among them, before it went out. The key stayed
    held until its TTL, with nothing logged."""
    held = asyncio.Event()

    async def holder() -> None:
        async with Lock(redis_url, NAME, ttl=60):
            held.set()
            await asyncio.sleep(60)

    async def main() -> None:
        task = asyncio.ensure_future(holder())
        await held.wait()
        task.cancel()
        for _ in range(turns):
            await asyncio.sleep(0)

    with caplog.at_level(logging.WARNING):
        asyncio.run(main())
    assert lock_keys(r) == []
    assert [rec.getMessage() for rec in caplog.records if rec.name == "asyncio"] == []


def test_waiters_still_waiting_as_asyncio_run_ends_leave_the_queue(
    redis_url: str, r: redis_py.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """``asyncio.run`` cancels the waiters its main task left; each leaves the queue in the
    background, but the shutdown had already listed the tasks it waits for: each leave was
    destroyed pending (an ERROR each) and its entry stayed in the queue."""
    holder = celery_redlock.Lock(redis_url, NAME, ttl=30)
    assert holder.acquire(blocking=False)
    waiters: list[asyncio.Future[bool]] = []

    async def main() -> None:
        for _ in range(3):
            waiters.append(asyncio.ensure_future(Lock(redis_url, NAME, ttl=30).acquire()))
        await until(lambda: queued(r) == 3)

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        asyncio.run(main())
        gc.collect()
    assert all(waiter.cancelled() for waiter in waiters)
    assert queued(r) == 0
    assert [rec.getMessage() for rec in caplog.records if rec.name == "asyncio"] == []
    holder.release()


def when_done(obj: Any, name: str, times: int = 1) -> asyncio.Event:
    """Wrap the coroutine method ``obj.name``; the event is set once ``times`` calls ended."""
    done, original = asyncio.Event(), getattr(obj, name)
    ended = 0

    async def wrapped(*args: Any) -> Any:
        nonlocal ended
        try:
            return await original(*args)
        finally:
            ended += 1
            if ended >= times:
                done.set()

    setattr(obj, name, wrapped)
    return done


def when_started(obj: Any, name: str) -> asyncio.Event:
    """Wrap the coroutine method ``obj.name``; the event is set when a call begins."""
    started, original = asyncio.Event(), getattr(obj, name)

    async def wrapped(*args: Any) -> Any:
        started.set()
        return await original(*args)

    setattr(obj, name, wrapped)
    return started


class SentLate:
    """Wraps a lock's command so it is on its way when the caller is cancelled, and reaches
    Redis only once ``gate`` opens: a buffer flushed after the caller gave up. ``seen`` holds
    ``probe()`` right after the command ran, before anyone gets its reply."""

    def __init__(self, send: Callable[..., Any], probe: Callable[[], Any]) -> None:
        self.send, self.probe = send, probe
        self.entered, self.gate, self.ran = asyncio.Event(), asyncio.Event(), asyncio.Event()
        self.seen: list[Any] = []

    async def __call__(self, *args: Any) -> Any:
        self.entered.set()
        return await asyncio.shield(self._sent(*args))  # a cancel cannot unsend it

    async def _sent(self, *args: Any) -> Any:
        await self.gate.wait()
        try:
            reply = await self.send(*args)
            self.seen.append(self.probe())
            return reply
        finally:
            self.ran.set()


async def cancelled_on_its_way(late: SentLate, acquire: Coroutine[Any, Any, bool]) -> None:
    """Run ``acquire``, cancel it while ``late``'s command is on its way, then let the command
    reach Redis, and return once it ran there."""
    task = asyncio.ensure_future(acquire)
    await late.entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    late.gate.set()
    await late.ran.wait()


@pytest.mark.usefixtures("cancel_path")
def test_an_acquire_reaching_redis_after_its_cancel_is_given_back(
    redis_url: str, r: redis_py.Redis
) -> None:
    """1. the acquire is on its way, and the caller is cancelled; 2. a give-back sent at once
    would find nothing held (and none is sent); 3. the acquire reaches Redis and wins. The lock
    is given back once its reply arrives, not left held by nobody for its 10 s TTL."""

    async def main() -> None:
        lock = Lock(redis_url, NAME, ttl=10)
        late = SentLate(lock.do_acquire, lambda: r.get(KEY) is not None)
        lock.do_acquire = late  # type: ignore[method-assign,assignment]
        task = asyncio.create_task(lock.acquire(blocking=False))
        await late.entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert r.get(KEY) is None and not lock.held  # step 1: nothing ran yet
        late.gate.set()
        await late.ran.wait()
        assert late.seen == [True]  # step 3: the script ran on the server, and took the key
        await until(lambda: r.get(KEY) is None, 3)
        assert not lock.held

    run(main())


@pytest.mark.usefixtures("cancel_path")
def test_a_queued_try_reaching_redis_after_its_cancel_leaves_the_queue(
    redis_url: str, r: redis_py.Redis
) -> None:
    """The same for a queued waiter's try: 1. its try (which joins the queue) is on its way,
    and the waiter is cancelled; 2. it leaves a queue it is not in yet; 3. the try reaches
    Redis and queues it. Its place is given up once the reply arrives, so the holder's release
    frees the key instead of handing it to a waiter that is gone."""
    holder = celery_redlock.Lock(redis_url, NAME, ttl=60)
    assert holder.acquire(blocking=False)

    async def main() -> None:
        waiter = Lock(redis_url, NAME, ttl=10)
        queue = waiter.nodes
        assert isinstance(queue, SingleNode)  # one node: its waiters queue
        late = SentLate(queue.wait_attempt, lambda: queued(r))
        queue.wait_attempt = late  # type: ignore[method-assign,assignment]
        left = when_done(queue, "leave", times=2)  # until Redis answered twice in a row
        task = asyncio.create_task(waiter.acquire(timeout=30))
        await late.entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await left.wait()  # step 2, in the background (both leaves, before the try)
        assert queued(r) == 0  # steps 1 and 2: not queued yet
        late.gate.set()
        await late.ran.wait()
        assert late.seen == [1]  # step 3: the try queued it
        await until(lambda: queued(r) == 0, 3)  # and once the reply came, it left

    run(main())
    holder.release()
    assert r.get(KEY) is None and lock_keys(r) == []


@pytest.mark.usefixtures("cancel_path")
def test_a_queued_try_reaching_a_free_key_after_its_cancel_gives_it_back(
    redis_url: str, r: redis_py.Redis
) -> None:
    """Helper probe, round 3 (5 of about 300 fresh processes, the try re-sent after a
    ``NOSCRIPT``): 1. a waiter's try is on its way, and the waiter is cancelled; 2. its
    give-backs and leaves are answered while the holder still holds the key; 3. the holder
    releases; 4. the try reaches Redis, finds the key free and takes it. Its reply went to a
    leave only, which does not know the try's token: the key was held by nobody for its whole
    TTL, and the next waiter waited that long. The try's lock is given back once its reply
    arrives."""
    holder = celery_redlock.Lock(redis_url, NAME, ttl=60)
    assert holder.acquire(blocking=False)

    async def main() -> None:
        waiter = Lock(redis_url, NAME, ttl=10)
        queue = waiter.nodes
        assert isinstance(queue, SingleNode)
        late = SentLate(queue.wait_attempt, lambda: r.get(KEY))
        queue.wait_attempt = late  # type: ignore[method-assign,assignment]
        left = when_done(queue, "leave", times=2)
        task = asyncio.create_task(waiter.acquire(timeout=30))
        await late.entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await left.wait()  # step 2: the leaves, answered (no give-back goes before the reply)
        holder.release()  # step 3
        late.gate.set()
        await late.ran.wait()
        assert late.seen[0] not in (None, holder_token)  # step 4: the try took the key
        await until(lambda: r.get(KEY) is None, 8)  # its TTL is 10 s
        await until(lambda: lock_keys(r) == [], 8)  # and it left the queue (in the background)

    holder_token = (holder.token or "").encode()
    run(main())


class WonThenCancelled(Lock):
    """A blocking acquire that wins, then is cancelled before returning (closing pub/sub)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.won = asyncio.Event()

    async def do_wait(self, timeout: float | None) -> bool:
        assert await super().do_wait(timeout)
        self.won.set()
        await asyncio.Event().wait()
        return True


def test_cancel_after_winning_before_returning_releases(redis_url: str, r: redis_py.Redis) -> None:
    async def main() -> None:
        lock = WonThenCancelled(redis_url, NAME, ttl=60)
        task = asyncio.create_task(lock.acquire())
        await lock.won.wait()
        assert r.get(KEY) == lock.token.encode()  # type: ignore[union-attr]
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not lock.held
        await until(lambda: lock_keys(r) == [])  # given back in the background

    run(main())


@pytest.mark.parametrize("blocking", [True, False], ids=["queued-waiter", "attempt"])
def test_a_cancel_is_raised_at_once_while_redis_is_frozen(
    redis_server: RedisServer, redis_url: str, r: redis_py.Redis, blocking: bool
) -> None:
    """Cancelled while the server does not answer (SIGSTOP), an acquire raises at once, not
    after the client's socket timeout; what it may have taken is given back in the background
    once the server answers again."""
    holder = celery_redlock.Lock(redis_url, NAME, ttl=60)
    if blocking:
        assert holder.acquire(blocking=False)
    process = redis_server.process
    assert process is not None

    async def main() -> None:
        lock = Lock(redis_url, NAME, ttl=30)
        assert (await lock.locked()) is blocking  # the lock's connection is made
        if blocking:
            task = asyncio.create_task(lock.acquire(timeout=30))
            await until(lambda: queued(r) == 1)
            process.send_signal(signal.SIGSTOP)
        else:
            process.send_signal(signal.SIGSTOP)
            sending = when_started(lock, "do_acquire")
            task = asyncio.create_task(lock.acquire(blocking=False))
            await sending.wait()
        try:
            task.cancel()
            done, _ = await asyncio.wait((task,), timeout=2.0)
            assert done, "the cancellation waited for the frozen server"
        finally:
            process.send_signal(signal.SIGCONT)
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not lock.held
        await until(lambda: not background())  # the give-backs ran to their end
        assert queued(r) == 0

    run(main())
    if blocking:
        holder.release()
    assert lock_keys(r) == []


def test_cancelled_holder_releases(redis_url: str, r: redis_py.Redis) -> None:
    async def main() -> None:
        lock = Lock(redis_url, NAME, ttl=60, auto_renew=True)
        entered = asyncio.Event()

        async def work() -> None:
            async with lock:
                entered.set()
                await asyncio.Event().wait()

        task = asyncio.create_task(work())
        await entered.wait()
        assert r.exists(KEY)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not lock.held and lock_keys(r) == []
        assert lock._renewer is None

    run(main())


# -- renewal -------------------------------------------------------------------------------------


def test_renewal_ends_with_its_loop_and_the_lease_expires(
    redis_url: str, r: redis_py.Redis
) -> None:
    lock = Counting(redis_url, NAME, ttl=0.6, auto_renew=True)

    async def main() -> None:
        assert await lock.acquire(blocking=False)
        await until(lambda: lock.extends >= 1)  # renewal was running

    run(main())  # the loop ends with the lock still held
    extends = lock.extends
    deadline = time.monotonic() + 10
    while r.exists(KEY):
        assert time.monotonic() < deadline, "the lease never expired"
        time.sleep(0.01)
    assert lock.extends == extends


def test_a_lock_whose_renewal_loop_was_closed_is_released_from_another_loop(
    redis_url: str, r: redis_py.Redis
) -> None:
    """Acquired with renewal on a loop that was then closed (``loop.close()``, its renewal task
    still pending): the release in another loop raised ``RuntimeError: Event loop is closed``
    from the renewal's cancellation, after the token was dropped, so the key stayed for its
    TTL and a retry said "not owned". The release now goes through."""
    lock = Lock(redis_url, NAME, ttl=5, auto_renew=True)
    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(lock.acquire(blocking=False))
    finally:
        loop.close()
    asyncio.run(lock.release())
    assert not r.exists(KEY) and not lock.held


def test_a_lock_renewed_by_a_loop_in_another_thread_is_released_from_this_one(
    redis_url: str, r: redis_py.Redis
) -> None:
    """Acquired with renewal on a loop that runs on in its own thread (in debug mode), released
    in another: the renewal's cancellation was a ``call_soon`` from the wrong thread, which
    raised ``RuntimeError``; the release was never sent and the renewal kept the key."""
    lock = Lock(redis_url, NAME, ttl=5, auto_renew=True)
    loop = asyncio.new_event_loop()
    loop.set_debug(True)
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    try:
        assert asyncio.run_coroutine_threadsafe(lock.acquire(blocking=False), loop).result(10)
        renewer = lock._renewer
        assert renewer is not None
        asyncio.run(lock.release())
        assert not r.exists(KEY) and not lock.held
        asyncio.run_coroutine_threadsafe(asyncio.wait((renewer,)), loop).result(10)
        assert renewer.cancelled()
    finally:  # the loop's clients are closed as asyncio.run would close them
        asyncio.run_coroutine_threadsafe(loop.shutdown_asyncgens(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_a_lock_renewed_by_a_stopped_loop_is_released_from_another_at_once(
    redis_url: str, r: redis_py.Redis
) -> None:
    """Review, round 3: acquired through ``loop.run_until_complete`` (the loop stopped after,
    not closed), a release in ``asyncio.run`` waited for that loop to end its renewal, which
    it never ran: the whole TTL, then ``LockLost``."""
    lock = Lock(redis_url, NAME, ttl=5, auto_renew=True)
    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(lock.acquire(blocking=False))
        asyncio.run(lock.release())  # raised LockLost after 5 s
        assert not r.exists(KEY) and not lock.held
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def test_a_release_from_another_loop_waits_for_that_loop_s_renewal_to_end(
    redis_url: str, r: redis_py.Redis
) -> None:
    """Asgi probe, round 3: on a quorum, loop A's renewal, due as loop B released, re-asserted
    the key after B's deletes (5 of 240 tries): held by nobody for a lease. B's release now
    waits until A's renewal has ended; here A is blocked (the injected fault) until B's
    release has asked it to end that renewal, so a release that did not wait returned with
    the renewal still pending."""
    lock = Lock(redis_url, NAME, ttl=5, auto_renew=True)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    blocked = threading.Event()

    def block() -> None:  # the fault: loop A does not run until B's release has begun
        blocked.set()
        wait_until(lambda: not lock.held, 10, "the release to begin")  # it took the token

    try:
        assert asyncio.run_coroutine_threadsafe(lock.acquire(blocking=False), loop).result(10)
        renewer = lock._renewer
        assert renewer is not None
        loop.call_soon_threadsafe(block)
        assert blocked.wait(10)
        asyncio.run(lock.release())
        assert renewer.done()  # ended in loop A before the release was sent
        assert not r.exists(KEY) and not lock.held
    finally:
        asyncio.run_coroutine_threadsafe(loop.shutdown_asyncgens(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_renewal_detects_a_key_deleted_by_someone_else(
    redis_url: str, r: redis_py.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="celery_redlock.lock")

    async def main() -> None:
        lock = Lock(redis_url, NAME, ttl=0.6, auto_renew=True)
        assert await lock.acquire(blocking=False)
        r.delete(KEY)
        await until(lambda: lock.lost)
        assert not lock.held
        with pytest.raises(LockLost):
            await lock.release()

    run(main())
    lost = [rec for rec in caplog.records if rec.name == "celery_redlock.lock"]
    assert len(lost) == 1 and lost[0].levelno == logging.ERROR
    assert "lost" in lost[0].getMessage() and KEY in lost[0].getMessage()


def test_renewal_marks_the_lock_lost_once_redis_stays_down_past_the_lease(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="celery_redlock.lock")
    server = RedisServer().start()
    try:

        async def main() -> None:
            lock = Counting(server.url, NAME, ttl=1.0, auto_renew=True)
            assert await lock.acquire(blocking=False)
            await until(lambda: lock.extends >= 1)
            server.stop()
            # Lost by the clock at the lease's end; the renewal reports it (ERROR) then too.
            await until(lambda: any("lease ran out" in r.getMessage() for r in caplog.records))
            assert lock.lost and not lock.held

        run(main())
    finally:
        server.stop()
    errors = [rec.getMessage() for rec in caplog.records if rec.name == "celery_redlock.lock"]
    assert len(errors) == 1 and "lease ran out" in errors[0]


# -- quorum --------------------------------------------------------------------------------------


@pytest.fixture
def nodes() -> Iterator[list[RedisServer]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(RedisServer()) for _ in range(3)]


def test_quorum_of_three_acquire_release(nodes: list[RedisServer]) -> None:
    urls = [s.url for s in nodes]
    direct = [s.client() for s in nodes]

    async def main() -> None:
        clients = [aioredis.Redis.from_url(url, socket_timeout=5) for url in urls]
        try:
            lock = Lock(clients, NAME, ttl=30)
            assert await lock.acquire(blocking=False)
            assert [c.get(KEY) for c in direct] == [lock.token.encode()] * 3  # type: ignore[union-attr]
            sync = celery_redlock.Lock(urls, NAME)
            assert not sync.acquire(blocking=False)
            await lock.release()
            assert [c.get(KEY) for c in direct] == [None] * 3
            assert sync.acquire(blocking=False)
            earlier = sync.fencing_token
            other = Lock(urls, NAME)  # URLs: clients of this loop
            assert not await other.acquire(blocking=False)
            sync.release()
            nodes[2].stop()  # a minority down: still a majority
            async with other:
                assert [c.get(KEY) for c in direct[:2]] == [other.token.encode()] * 2  # type: ignore[union-attr]
                assert other.fencing_token is not None
                assert earlier is not None
                assert other.fencing_token > earlier
            assert [c.get(KEY) for c in direct[:2]] == [None] * 2
        finally:
            for client in clients:
                await client.aclose()

    try:
        run(main())
    finally:
        for c in direct:
            c.close()


# -- layers --------------------------------------------------------------------------------------


def test_importing_the_asyncio_lock_loads_no_celery() -> None:
    code = textwrap.dedent(
        """
        import json, sys
        from celery_redlock.asyncio import Lock
        assert Lock.__module__ == "celery_redlock._redis.aiolock"
        import celery_redlock.asyncio as public
        assert public.__all__ == ["Lock", "wait_released"]
        print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("celery", "kombu"))))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


# -- cancellation that redis-py's asyncio.wait_for would drop (gh-86296) ------------------------


@pytest.fixture(params=["cancelling", "own-task"])
def cancel_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both ways :func:`~celery_redlock._redis.aiolock.settle` sees a dropped cancellation:
    ``Task.cancelling()`` (Python >= 3.11), and each call in a task of its own (before)."""
    if request.param == "cancelling" and sys.version_info < (3, 11):
        pytest.skip("Task.cancelling() needs Python 3.11")
    monkeypatch.setattr(aiolock, "_COUNTS_CANCELS", request.param == "cancelling")


@pytest.mark.usefixtures("cancel_path")
def test_a_blocking_acquire_cancelled_at_once_raises_cancelled_promptly(
    redis_url: str, r: redis_py.Redis
) -> None:
    """Cancelled straight away, inside its first command: CancelledError, not False after the
    timeout, and nothing held or queued."""
    holder = celery_redlock.Lock(redis_url, NAME, ttl=60)
    assert holder.acquire(blocking=False)

    async def main() -> None:
        for _ in range(20):
            waiter = Lock(redis_url, NAME, ttl=10)
            task = asyncio.create_task(waiter.acquire(timeout=30))
            await asyncio.sleep(0)  # the task is in its first Redis call now
            task.cancel()
            started = time.monotonic()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert time.monotonic() - started < 5  # not after the 30 s timeout
            assert not waiter.held
        # A place the cancelled join took is given back when its reply arrives (in the
        # background): within a round trip, long before the place would lapse.
        await until(lambda: queued(r) == 0, 3)
        await until(lambda: not background(), 3)  # before the loop ends (hazard 5)

    run(main())
    assert r.get(KEY) == holder.token.encode()  # type: ignore[union-attr]
    holder.release()


@pytest.mark.usefixtures("cancel_path")
def test_a_cancelled_non_blocking_acquire_never_returns_true(
    redis_url: str, r: redis_py.Redis
) -> None:
    """150 tries cancelled as their acquire is in flight: each raises CancelledError (none
    returns, True or False, to a cancelled task), and nothing stays held past the script's
    reply."""

    async def main() -> None:
        for _ in range(150):
            lock = Lock(redis_url, NAME, ttl=10)
            task = asyncio.create_task(lock.acquire(blocking=False))
            await asyncio.sleep(0)
            task.cancel()
            try:
                result = await task
            except asyncio.CancelledError:
                assert not lock.held
            else:
                raise AssertionError(f"a cancelled acquire returned {result}")
            # A lock the cancelled script won is given back once its reply arrives (in the
            # background): within a round trip, where a stale holder would keep it 10 s.
            await until(lambda: r.get(KEY) is None, 3)
        await until(lambda: not background(), 3)  # before the loop ends (hazard 5)

    run(main())


# -- many waiters on one URL ---------------------------------------------------------------------


def test_two_hundred_waiters_on_one_url_all_get_the_lock_first_come_first_served(
    redis_url: str, r: redis_py.Redis
) -> None:
    """One subscription per loop carries every waiter's channel and the URL's pool waits for
    a free connection: no "Too many connections", and the queue order is kept."""
    holder = celery_redlock.Lock(redis_url, "many", ttl=60)
    assert holder.acquire(blocking=False)
    order: list[int] = []

    async def waiter(i: int) -> None:
        async with Lock(redis_url, "many", ttl=30, timeout=60):
            order.append(i)

    async def main() -> None:
        # Other tests of this process may keep connections to the shared server: count ours.
        before = {c["id"] for c in r.client_list()}
        tasks = []
        for i in range(200):
            tasks.append(asyncio.create_task(waiter(i)))
            await until(lambda n=i + 1: queued(r, "many") == n)  # type: ignore[misc]
        opened = [c for c in r.client_list() if c["id"] not in before]
        assert len(opened) < 50, len(opened)  # one subscription, not one per waiter
        holder.release()
        await asyncio.wait_for(asyncio.gather(*tasks), 60)

    run(main())
    assert order == list(range(200))
    assert lock_keys(r) == []


def test_a_cancelled_waiter_leaves_the_others_their_places_and_subscriptions(
    redis_url: str, r: redis_py.Redis
) -> None:
    """One of ten queued waiters of a loop is cancelled: it leaves the queue, and the others
    keep their places and their subscription (a version that closed the loop's connection
    for it sent them all to the back of the queue, in any order, with a SUBSCRIBE each)."""
    holder = celery_redlock.Lock(redis_url, "cancel-one", ttl=60)
    assert holder.acquire(blocking=False)
    order: list[int] = []
    r.config_resetstat()

    async def waiter(i: int) -> None:
        async with Lock(redis_url, "cancel-one", ttl=30, timeout=60):
            order.append(i)

    async def main() -> None:
        tasks = []
        for i in range(10):
            tasks.append(asyncio.create_task(waiter(i)))
            await until(lambda n=i + 1: queued(r, "cancel-one") == n)  # type: ignore[misc]
        tasks[5].cancel()
        await until(lambda: queued(r, "cancel-one") == 9)
        holder.release()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)

    run(main())
    assert order == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    assert r.info("commandstats")["cmdstat_subscribe"]["calls"] == 10


async def give_up_in_turn(
    redis_url: str, name: str, count: int, meanwhile: Callable[[Any], object] = lambda _: None
) -> Any:
    """With one waiter of ``name`` subscribed and queued, hold the turn of its subscription
    connection while ``count`` more waiters queue for it, cancel them, run
    ``meanwhile(connection)``, and give the turn back; the connection."""
    r = redis_py.Redis.from_url(redis_url)
    await until(lambda: queued(r, name) == 1)
    connection = aionodes.loop_hubs().of(aionodes.client_for(redis_url)).current
    assert connection is not None
    async with connection.sending:  # their SUBSCRIBEs wait for this turn
        waiters = [
            asyncio.create_task(Lock(redis_url, name, ttl=30, timeout=60).acquire())
            for _ in range(count)
        ]
        await until(lambda: len(connection.pending) == count)
        for waiter in waiters:
            waiter.cancel()
        await asyncio.wait(waiters)
        meanwhile(connection)
    return connection


def test_a_waiter_cancelled_before_its_subscribe_was_sent_sends_none(
    redis_url: str, r: redis_py.Redis
) -> None:
    """Storm probe, session 30: a wait cancelled while its ``SUBSCRIBE`` waited its turn (one
    is sent at a time per connection) still sent it, and such sends queued up ahead of live
    waiters' (900 to 2,900 after 8 to 10 s of 40 tasks under ``asyncio.timeout(0.05)``). Here
    the connection's turn is held while twenty waiters queue for it, and all are cancelled."""
    holder = celery_redlock.Lock(redis_url, "unsent", ttl=60)
    assert holder.acquire(blocking=False)
    r.config_resetstat()

    def subscribes() -> int:
        return int(r.info("commandstats").get("cmdstat_subscribe", {}).get("calls", 0))

    async def main() -> None:
        lock = Lock(redis_url, "unsent", ttl=30, timeout=60)
        first = asyncio.create_task(lock.acquire())
        connection = await give_up_in_turn(redis_url, "unsent", 20)
        await until(lambda: not connection.pending and queued(r, "unsent") == 1)
        assert subscribes() == 1  # the first waiter's only
        holder.release()
        assert await first
        await lock.release()

    run(main())


def test_waiters_given_up_before_their_subscribe_see_a_cut_connection_quietly(
    redis_url: str,
) -> None:
    """Review, session 30: waiters cancelled while their ``SUBSCRIBE`` waited its turn, and
    the connection cut meanwhile (its confirmations failed, its pending list emptied): the
    check for an unsent one raised ``KeyError``, and asyncio logged "Future exception was
    never retrieved" for each failed confirmation."""
    holder = celery_redlock.Lock(redis_url, "cut", ttl=60)
    assert holder.acquire(blocking=False)
    errors: list[str] = []

    def cut(connection: Any) -> None:
        connection._break(redis_py.ConnectionError("cut"))  # as the reader does

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: errors.append(str(context["message"])))
        lock = Lock(redis_url, "cut", ttl=30, timeout=60)
        first = asyncio.create_task(lock.acquire())
        await give_up_in_turn(redis_url, "cut", 5, cut)
        holder.release()
        assert await first  # it subscribed again on a new connection
        await lock.release()
        gc.collect()

    run(main())
    assert errors == []


def test_an_exhausted_client_pool_is_named_as_such(redis_url: str) -> None:
    """A given client's pool that runs out is no Redis outage: the error says so."""

    async def main() -> None:
        client = aioredis.Redis.from_url(redis_url, max_connections=1)
        try:
            locks = [Lock(client, f"pool-{i}", ttl=10) for i in range(5)]
            outcomes = await asyncio.gather(
                *(lock.acquire(blocking=False) for lock in locks), return_exceptions=True
            )
            errors = [str(o) for o in outcomes if isinstance(o, BaseException)]
            assert errors and all("connection pool" in e and "exhausted" in e for e in errors)
            for lock in locks:
                if lock.held:
                    await lock.release()
        finally:
            await client.aclose()

    run(main())


def test_the_lock_reconnects_after_the_server_closed_its_connections() -> None:
    """A server restart closes the pooled connections; the loop runs meanwhile and sees it.
    The next acquire reconnects, as the thread lock does. On redis-py older than 5.0.8 the
    asyncio pool took a closed connection for a live one (it read the end of the stream as
    "no data"), and the acquire failed with ``LockUnavailable``: "Connection closed by
    server"; so redis-py 5.0.8 is the oldest accepted."""

    async def main(server: RedisServer) -> None:
        lock = Lock(server.url, "reconnect", ttl=10)
        assert await lock.acquire(blocking=False)
        await lock.release()
        await asyncio.to_thread(server.restart)  # the loop waits in select(): it reads the close
        assert await lock.acquire(blocking=False)
        await lock.release()

    with RedisServer() as server:
        asyncio.run(main(server))


def test_a_wait_after_an_earlier_wait_s_connection_was_cut_subscribes_at_once(
    redis_url: str, r: redis_py.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wait that ended leaves the loop's subscription connection open, idle; cut then (a
    proxy's idle timeout, ``CLIENT KILL``), redis-py reconnected it while the next wait
    subscribed on it. That wait's ``SUBSCRIBE`` was lost (it queued only after
    ``SUBSCRIBE_TIMEOUT``, set to 60 s here) or failed with a ``RuntimeError``. A connection
    idle for longer than ``IDLE_REUSE`` (0 here) now serves no new wait. Three rounds: a lost
    subscribe happened in most rounds, not all."""
    monkeypatch.setattr(subscriptions, "SUBSCRIBE_TIMEOUT", 60.0)
    monkeypatch.setattr(subscriptions, "IDLE_REUSE", 0.0)

    async def main() -> None:
        for round_ in range(3):
            name = f"cut-{round_}"
            holder = Lock(redis_url, name, ttl=60)
            assert await holder.acquire(blocking=False)
            assert not await Lock(redis_url, name, ttl=60).acquire(timeout=0.2)
            r.client_kill_filter(_type="pubsub")
            waiter = Lock(redis_url, name, ttl=60)
            task = asyncio.create_task(waiter.acquire(timeout=30))
            await until(lambda: queued(r, name) == 1 or task.done())  # noqa: B023
            await holder.release()
            assert await task  # handed over: the holder's TTL has ~60 s left
            await waiter.release()

    run(main())


def test_semaphore_waiters_on_one_loop_all_get_a_slot_and_send_no_unsubscribe(
    redis_url: str, r: redis_py.Redis
) -> None:
    """Waiters of a semaphore listen on its shared release channel, through one connection of
    the loop: a waiter that got its slot leaves the channel to the others still waiting (no
    ``UNSUBSCRIBE``, which the guide's ACL line does not grant and which raced the next
    ``SUBSCRIBE`` of the same channel), and each release wakes them."""
    r.config_resetstat()

    async def main() -> None:
        holders = [Lock(redis_url, "sem-loop", ttl=60, limit=2) for _ in range(2)]
        for holder in holders:
            assert await holder.acquire(blocking=False)
        # A waiter of another lock keeps the loop's connection open throughout.
        other_holder = Lock(redis_url, "sem-other", ttl=60)
        assert await other_holder.acquire(blocking=False)
        other = Lock(redis_url, "sem-other", ttl=60)
        other_wait = asyncio.create_task(other.acquire(timeout=30))
        await until(lambda: queued(r, "sem-other") == 1)
        waiters = [Lock(redis_url, "sem-loop", ttl=60, limit=2) for _ in range(4)]
        tasks = [asyncio.create_task(w.acquire(timeout=30)) for w in waiters]
        channel = keys_for("redlock", "sem-loop").channel
        await until(lambda: subscribers(r, channel) == 1)  # one connection for the loop
        for holder in holders:
            await holder.release()
        pending = set(tasks)
        while pending:  # each slot taken is handed on when its holder releases
            finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in finished:
                assert task.result() is True
                await waiters[tasks.index(task)].release()
        await other_holder.release()
        assert await other_wait
        await other.release()

    run(main())
    assert "cmdstat_unsubscribe" not in r.info("commandstats")


def test_waiters_on_a_shared_channel_are_woken_longest_waiting_first(redis_url: str) -> None:
    """Helper probe, round 3: a release on a shared channel (a semaphore, a quorum) wakes every
    waiter of the loop, and the first woken tries first and wins. They were woken in the order
    of a ``set`` of inboxes, by memory address: on a 3-node quorum with 16 waiters, some won
    111 times and others twice in 415 handoffs, and some timed out after 20 s while the lock
    changed hands every 50 ms. They are woken in the order they began waiting now. Each
    release here waits for the reply to every try its wake caused (each failed try reads the
    holder): a try still on its way when the slot frees takes it, whatever the order."""

    async def main() -> list[int]:
        holders = [Lock(redis_url, "sem-fifo", ttl=60, limit=2) for _ in range(2)]
        for holder in holders:
            assert await holder.acquire(blocking=False)
        waiters = [Lock(redis_url, "sem-fifo", ttl=60, limit=2) for _ in range(12)]
        tasks = []
        for waiter in waiters:  # each asleep on the channel before the next begins
            tasks.append(asyncio.create_task(waiter.acquire(timeout=30)))
            await until(lambda w=waiter: w.attempts >= 2)
        order: list[int] = []
        releasing: Any = holders[0]
        pending = set(tasks)
        while pending:  # one slot goes round; the other stays held
            for waiter in waiters:
                waiter.last_holder = None
            await releasing.release()
            finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            losers = [waiters[tasks.index(task)] for task in pending]
            await until(lambda losers=losers: all(w.last_holder for w in losers))
            assert len(finished) == 1
            task = finished.pop()
            assert task.result() is True
            order.append(tasks.index(task))
            releasing = waiters[order[-1]]
        await releasing.release()
        await holders[1].release()
        return order

    assert run(main()) == list(range(12))


class _FirstSubscribeFails(aioredis.client.PubSub):
    """A real ``PubSub`` whose first ``SUBSCRIBE`` fails as valkey-py's does after its
    connection was cut (it writes to the socket it dropped): an error no classifier knows."""

    failed = 0
    error: Exception = AttributeError("'NoneType' object has no attribute 'writelines'")

    async def subscribe(self, *args: Any, **kwargs: Any) -> Any:
        if not _FirstSubscribeFails.failed:
            _FirstSubscribeFails.failed += 1
            raise _FirstSubscribeFails.error
        return await super().subscribe(*args, **kwargs)


class _CutClient(aioredis.Redis):
    def pubsub(self, **kwargs: Any) -> Any:
        return _FirstSubscribeFails(self.connection_pool, **kwargs)


@pytest.mark.parametrize(
    "error",
    [
        AttributeError("'NoneType' object has no attribute 'writelines'"),
        RuntimeError("readuntil() called while another coroutine is already waiting"),
        redis_py.ConnectionError("Connection closed by server."),
    ],
    ids=["unknown", "two-reads", "connection"],
)
def test_a_subscribe_that_raises_is_tried_again_and_leaves_no_future(
    redis_url: str, r: redis_py.Redis, error: Exception
) -> None:
    """A ``SUBSCRIBE`` that raised an error other than ``RuntimeError`` (valkey-py's
    ``AttributeError`` on a cut connection) reached the waiter raw; after any error, its
    confirmation was failed later by nobody's await: asyncio logged "Future exception was
    never retrieved". The connection is broken, the waiter subscribes again and gets the
    lock."""
    unhandled: list[dict[str, Any]] = []
    futures: list[asyncio.Future[Any]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, ctx: unhandled.append(ctx))
        create_future = loop.create_future

        def recorded() -> asyncio.Future[Any]:
            futures.append(create_future())
            return futures[-1]

        loop.create_future = recorded  # type: ignore[method-assign]
        client = _CutClient.from_url(redis_url)
        try:
            holder = Lock(redis_url, NAME, ttl=60)
            assert await holder.acquire(blocking=False)
            waiter = Lock(client, NAME, ttl=60)
            task = asyncio.create_task(waiter.acquire(timeout=30))
            await until(lambda: queued(r) == 1 or task.done())
            await holder.release()
            assert await task
            await waiter.release()
        finally:
            await client.aclose()
        gc.collect()  # a future failed and never awaited says so when it is collected

    _FirstSubscribeFails.failed, _FirstSubscribeFails.error = 0, error
    run(main())
    assert _FirstSubscribeFails.failed == 1
    assert unhandled == []
    # A future failed and never awaited logs "exception was never retrieved" when collected,
    # which a reference from its exception's traceback may put off past the test.
    assert not [f for f in futures if getattr(f, "_log_traceback", False)]


def test_the_give_back_of_a_quorum_nodes_release_is_named_a_release(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Probe, round 23: a quorum node frozen through a release got its release again in the
    background, and a loop that shut down before it answered said "the give-back of an
    acquisition" for it."""
    with RedisServer() as a, RedisServer() as b, RedisServer() as c:

        async def main() -> None:
            lock = Lock([a.url, b.url, c.url], "frozen-release", ttl=30)
            assert await lock.acquire(blocking=False)
            os.kill(c.process.pid, signal.SIGSTOP)
            await lock.release()

        try:
            with caplog.at_level(logging.WARNING, logger="celery_redlock.lock"):
                asyncio.run(main())
        finally:
            os.kill(c.process.pid, signal.SIGCONT)
    said = [r.getMessage() for r in caplog.records if "give-back of" in r.getMessage()]
    assert said and all("the give-back of a release;" in m for m in said), said


def test_a_cancellation_landing_in_an_extend_is_raised(redis_url: str) -> None:
    """Helper probe, round 3 (about 180 of 300 tries): ``task.cancel()`` while ``extend()``
    awaited Redis returned True, and the task ran on after the ``await`` as if never
    cancelled: the client call dropped the ``CancelledError``. The cancellation lands at
    each of the first turns of the loop the extend takes."""

    async def main() -> list[str]:
        outcomes = []
        for turns in range(40):
            lock = Lock(redis_url, f"{NAME}-extend", ttl=10)
            assert await lock.acquire(blocking=False)
            ran_on: list[bool] = []

            async def extend(lock: Lock = lock, ran_on: list[bool] = ran_on) -> None:
                await lock.extend()
                ran_on.append(True)

            task = asyncio.create_task(extend())
            for _ in range(turns % 5):
                await asyncio.sleep(0)
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                outcomes.append("ran on" if ran_on else "cancelled")
            await lock.release()
        return outcomes

    outcomes = run(main())
    assert outcomes and set(outcomes) == {"cancelled"}, outcomes


@pytest.mark.usefixtures("cancel_path")
def test_a_cancelled_try_of_a_held_lock_sends_no_give_back(
    redis_url: str, r: redis_py.Redis
) -> None:
    """Helper probe, round 3: each acquire cancelled on its way sent three releases of a lock
    it had not taken (one at once, one once Redis answered it, and one after the reply, which
    said it took nothing), each in a task of its own. Under ``asyncio.timeout(0.005)`` retried
    by 60 callers, thousands of them queued for the connection pool, and the holder's waiter
    got the lock two seconds after its release. A try's reply decides: it took nothing here,
    so it gives nothing back."""
    holder = celery_redlock.Lock(redis_url, NAME, ttl=60)
    assert holder.acquire(blocking=False)

    async def main() -> int:
        lock = Lock(redis_url, NAME, ttl=10)
        late = SentLate(lock.do_acquire, lambda: None)
        lock.do_acquire = late  # type: ignore[method-assign,assignment]
        releases = 0
        release = lock.do_release

        async def counted(*args: Any) -> Any:
            nonlocal releases
            releases += 1
            return await release(*args)

        lock.do_release = counted  # type: ignore[method-assign]
        await cancelled_on_its_way(late, lock.acquire(blocking=False))
        assert await aionodes.wait_released(5)  # every clean-up of this loop has ended
        return releases

    try:
        assert run(main()) == 0
        assert r.get(KEY) == (holder.token or "").encode()
    finally:
        holder.release()


def test_outside_an_asyncio_loop_the_lock_says_trio_is_not_supported(redis_url: str) -> None:
    """Helper probe, round 3: under ``trio.run`` the acquire failed with a bare "no running
    event loop", and left the object acquiring (its next acquire was refused)."""
    trio = pytest.importorskip("trio")
    lock = Lock(redis_url, f"{NAME}-trio", ttl=10)

    async def main() -> None:
        await lock.acquire(blocking=False)

    for _ in range(2):  # the second try is refused the same way, not as "acquiring"
        with pytest.raises(RuntimeError, match=r"trio.*not supported.*to_thread"):
            trio.run(main)


@pytest.mark.usefixtures("cancel_path")
def test_a_cancelled_acquire_that_took_the_lock_gives_it_back_until_redis_answers(
    redis_url: str, r: redis_py.Redis
) -> None:
    """Review, round 3: once a cancelled try's reply said it took the lock, one release was
    sent, its error ignored: (1) the try is cancelled on its way; (2) it reaches Redis and
    takes the key; (3) the give-back's connection fails (a pool with no free connection, a
    blip); (4) the key stayed held by nobody for its TTL. The give-back is sent until Redis
    answers, as for a lost reply."""

    async def main() -> list[str]:
        lock = Lock(redis_url, NAME, ttl=30)
        late = SentLate(lock.do_acquire, lambda: r.get(KEY) is not None)
        lock.do_acquire = late  # type: ignore[method-assign,assignment]
        release, sent = lock.do_release, []

        async def failing_once(*args: Any) -> Any:
            sent.append("failed" if not sent else "sent")
            if len(sent) == 1:
                error = LockUnavailable("injected: the connection dropped", key=KEY)
                error.__cause__ = redis_py.ConnectionError("injected")
                raise error
            return await release(*args)

        lock.do_release = failing_once  # type: ignore[method-assign]
        await cancelled_on_its_way(late, lock.acquire(blocking=False))
        assert late.seen == [True]  # the try took the key
        await until(lambda: r.get(KEY) is None, 5)
        return sent

    assert run(main())[:2] == ["failed", "sent"]
