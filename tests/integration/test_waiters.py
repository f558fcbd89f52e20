"""The queue of blocking waiters: a release hands the lock to the first live waiter only.

Against a real ``redis-server``. Waiters are :class:`~celery_redlock.Lock` objects blocking in
threads, ordered by waiting until each is queued; some tests stand in for a waiter with a bare
pub/sub subscription and a queue member, to reach orders of events that threads cannot be
made to produce on cue.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis as redis_py

from celery_redlock import Lock
from celery_redlock._redis import scripts
from celery_redlock._redis.keys import keys_for, waiter_channel
from celery_redlock._redis.nodes import SingleNode
from celery_redlock._redis.owner import SEPARATOR, new_token, parse
from celery_redlock.asyncio import Lock as AsyncLock
from celery_redlock.testing import RedisServer, wait_until
from support.clock import FakeClock


def blocked(lock: Lock, timeout: float | None = 30) -> queue.Queue[bool]:
    """Start ``lock.acquire(blocking=True)`` in a thread; its outcome arrives in the queue."""
    outcome: queue.Queue[bool] = queue.Queue()
    threading.Thread(target=lambda: outcome.put(lock.acquire(timeout=timeout)), daemon=True).start()
    return outcome


def queued(r: redis_py.Redis, lock: Lock) -> int:
    return int(r.zcard(lock.keys.waiters))


def keys_left(r: redis_py.Redis) -> list[bytes]:
    """Every key but the event counters (other tests' workers flush theirs at any time) and the
    deployment's high-water marks of fencing tokens (bounded, kept by design; on Redis 6.2 the
    acquire is a script that writes one)."""
    kept = (b"redlock:stats:", b"redlock:fence:{")
    return [k for k in r.scan_iter() if not k.startswith(kept)]


class StandIn:
    """A waiter's footprint without the waiter: its channel subscribed, its member queued."""

    def __init__(self, r: redis_py.Redis, name: str, score: float, ttl_ms: int = 10_000) -> None:
        keys = keys_for("redlock", name)
        self.channel = waiter_channel(keys, f"stand-in-{score}")
        self.token = new_token("stand-in")
        self.secret = self.token.partition(SEPARATOR)[0]
        self.member = scripts.queue_member(self.channel, self.token, ttl_ms)
        self.pubsub = r.pubsub()
        self.pubsub.subscribe(self.channel)
        assert self.pubsub.get_message(timeout=5)["type"] == "subscribe"  # type: ignore[index]
        r.zadd(keys.waiters, {self.member: score})

    def next_message(self, r: redis_py.Redis) -> Any:
        """The next message on the channel. A marker published now is read if nothing came
        before it: what a release sent is always in the socket before its reply arrived."""
        r.publish(self.channel, "marker")
        message = self.pubsub.get_message(ignore_subscribe_messages=True, timeout=5)
        assert message is not None
        return message["data"]

    def close(self) -> None:
        self.pubsub.close()


@pytest.fixture
def stand_ins(r: redis_py.Redis) -> Iterator[list[StandIn]]:
    made: list[StandIn] = []
    yield made
    for stand_in in made:
        stand_in.close()


def test_a_release_hands_the_lock_to_the_waiter_queued_first_and_no_other(
    r: redis_py.Redis,
) -> None:
    holder = Lock(r, "turns", ttl=30)
    assert holder.acquire(blocking=False)
    first, second = Lock(r, "turns", ttl=20), Lock(r, "turns", ttl=20)
    first_won = blocked(first)
    wait_until(lambda: queued(r, holder) == 1, 10, "the first waiter queued")
    second_won = blocked(second)
    wait_until(lambda: queued(r, holder) == 2, 10, "the second waiter queued")

    holder.release()
    assert first_won.get(timeout=10)
    assert r.get(first.key) == (first.token or "").encode()
    assert 19_000 < r.pttl(first.key) <= 20_000  # the waiter's own ttl
    assert queued(r, holder) == 1 and second_won.empty()

    first.release()
    assert second_won.get(timeout=10)
    second.release()
    assert keys_left(r) == []  # no key left: lock and queue are gone


def test_a_resp3_wait_writes_no_push_response_lines(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """redis-py 5.0's ``PubSub`` without a push handler of its own, on a RESP3 connection
    (``?protocol=3``), logged each subscription and release message (``Push response: [...]``)
    at INFO through a stderr handler it added to the ``push_response`` logger; later releases
    log them at DEBUG. Run on both by ``nox -s lowest`` and the dev venv."""
    url = f"{redis_url}?protocol=3"
    holder, waiter = Lock(url, "resp3", ttl=30), Lock(url, "resp3", ttl=20)
    with caplog.at_level(logging.DEBUG, logger="push_response"):
        assert holder.acquire(blocking=False)
        won = blocked(waiter)
        wait_until(lambda: queued(waiter.nodes.client, holder) == 1, 10, "the waiter queued")
        holder.release()
        assert won.get(timeout=10)
        waiter.release()
    assert [r.getMessage() for r in caplog.records if r.name == "push_response"] == []


@pytest.mark.parametrize(
    ("max_hold", "auto_renew"),
    [(None, False), (12.5, False), (None, True), (12.5, True)],
    ids=["fixed", "capped", "lease", "capped-lease"],
)
def test_a_handed_over_token_carries_the_handoff_time_and_reads_its_fencing_token(
    r: redis_py.Redis, max_hold: float | None, auto_renew: bool
) -> None:
    """The handoff writes the waiter's token with the server's time as its acquisition time,
    and keeps its ``max_hold`` and its renewed lease (which tooling reads to tell a capped TTL
    from a lease that was not renewed, and to judge a renewal by the holder's own lease)."""
    holder = Lock(r, "handed", ttl=30)
    assert holder.acquire(blocking=False)
    waiter = Lock(r, "handed", ttl=30, owner="task-w", max_hold=max_hold, auto_renew=auto_renew)
    won = blocked(waiter)
    wait_until(lambda: queued(r, holder) == 1, 10, "the waiter queued")
    released_ms = int(r.time()[0]) * 1000
    holder.release()
    assert won.get(timeout=10)
    owner = parse(r.get(waiter.key))
    assert owner is not None and owner.task_id == "task-w"
    assert owner.acquired_ms >= released_ms  # acquired at the handoff, not when it queued
    assert owner.max_hold_ms == (None if max_hold is None else 12_500)
    assert owner.lease_ms == (30_000 if auto_renew else None)
    token = waiter.fencing_token
    assert token is not None and token > 0
    waiter.release()


def test_a_gone_waiter_is_skipped_and_the_next_live_one_gets_the_lock(
    r: redis_py.Redis, stand_ins: list[StandIn]
) -> None:
    holder = Lock(r, "gone", ttl=30)
    assert holder.acquire(blocking=False)
    gone = StandIn(r, "gone", score=0)
    gone.close()  # the waiter's process died: its member stays queued, nobody listens
    waiter = Lock(r, "gone", ttl=30)
    won = blocked(waiter)
    wait_until(lambda: queued(r, holder) == 2, 10, "the live waiter queued behind")
    holder.release()
    assert won.get(timeout=10)
    assert queued(r, holder) == 0  # the dead entry was dropped on the way
    waiter.release()


def test_a_handoff_wakes_the_waiter_queued_next_which_keeps_its_place(
    r: redis_py.Redis, stand_ins: list[StandIn]
) -> None:
    """The next waiter slept on the old holder's TTL; woken ('1'), it reads the new one's."""
    holder = Lock(r, "next", ttl=30)
    assert holder.acquire(blocking=False)
    first, second, third = (StandIn(r, "next", score=n) for n in range(3))
    stand_ins.extend((first, second, third))
    holder.release()
    assert r.get(holder.keys.lock) == first.next_message(r)  # handed over
    assert second.next_message(r) == b"1"  # woken, and still queued in its place
    assert r.zrange(holder.keys.waiters, 0, -1, withscores=True) == [
        (second.member.encode(), 1.0),
        (third.member.encode(), 2.0),
    ]
    assert third.next_message(r) == b"marker"  # not woken


def test_the_wake_of_the_next_waiter_keeps_the_queue_s_expiry_and_drops_the_gone(
    r: redis_py.Redis, stand_ins: list[StandIn]
) -> None:
    """The next waiter is read, not popped and put back: popped as the last member, the queue
    key was deleted, and put back it had no expiry (kept for good once that waiter died); and
    a releasing user who could pop but not ``ZADD`` moved it to the back. A waiter that is
    gone is dropped, and the one behind it woken."""
    holder = Lock(r, "expiry", ttl=30)
    assert holder.acquire(blocking=False)
    first, gone, second = (StandIn(r, "expiry", score=n) for n in range(3))
    stand_ins.extend((first, second))
    gone.close()
    r.pexpire(holder.keys.waiters, 60_000)
    holder.release()
    assert r.get(holder.keys.lock) == first.next_message(r)  # handed over
    assert second.next_message(r) == b"1"  # the gone one dropped, the next one woken
    assert r.zrange(holder.keys.waiters, 0, -1, withscores=True) == [(second.member.encode(), 2.0)]
    assert 0 < r.pttl(holder.keys.waiters) <= 60_000


def test_a_waiter_that_leaves_wakes_the_waiter_queued_next(
    r: redis_py.Redis, stand_ins: list[StandIn]
) -> None:
    holder = Lock(r, "leaves", ttl=30)
    assert holder.acquire(blocking=False)
    first, second = StandIn(r, "leaves", score=0), StandIn(r, "leaves", score=1)
    stand_ins.extend((first, second))
    assert SingleNode(r).leave(holder.keys, first.member, first.secret) is None
    assert second.next_message(r) == b"1"
    assert r.zrange(holder.keys.waiters, 0, -1) == [second.member.encode()]


def test_a_waiter_gets_the_lock_when_the_short_lease_of_one_handed_it_before_ends(
    r: redis_py.Redis,
) -> None:
    """1. H holds for an hour; W1 (a 2 s lease) and W2 are queued, sleeping on H's TTL;
    2. H releases: the lock is handed to W1, which never releases it (its process stopped);
    3. W1's lease ends after 2 s. W2 slept on until H's TTL would have ended, the key free
    meanwhile; woken at the handoff, it now sleeps on W1's and gets the lock."""
    holder = Lock(r, "short-lease", ttl=3600)
    assert holder.acquire(blocking=False)
    first, second = Lock(r, "short-lease", ttl=2), Lock(r, "short-lease", ttl=10)
    first_won = blocked(first)
    wait_until(lambda: queued(r, holder) == 1, 10, "the first waiter queued")
    second_won = blocked(second, timeout=None)
    wait_until(lambda: queued(r, holder) == 2, 10, "the second waiter queued")
    holder.release()
    assert first_won.get(timeout=10)  # and never released
    assert second_won.get(timeout=30)  # at W1's expiry, not H's (an hour)
    second.release()


def test_a_waiter_that_gives_up_after_the_handoff_holds_the_lock(
    r: redis_py.Redis, stand_ins: list[StandIn]
) -> None:
    """1. W is queued; 2. a release hands W the lock; 3. W's deadline passes before it reads
    the message; 4. W leaves, and learns that it holds the lock."""
    holder = Lock(r, "late", ttl=30)
    assert holder.acquire(blocking=False)
    stand_in = StandIn(r, "late", score=0)
    stand_ins.append(stand_in)
    holder.release()
    assert r.get(holder.keys.lock) == stand_in.next_message(r)  # handed over, told so
    node = SingleNode(r)
    held = node.leave(holder.keys, stand_in.member, stand_in.secret)
    assert held is not None and held == r.get(holder.keys.lock).decode()  # type: ignore[union-attr]


def test_a_waiter_popped_without_handoff_that_gives_up_passes_the_turn_on(
    r: redis_py.Redis, stand_ins: list[StandIn]
) -> None:
    """Without handoff (a Cluster) a release only wakes the first waiter. If it gives up before
    trying, leaving the queue wakes the next one: the lock is free and nobody else knows."""
    holder = Lock(r, "turn", ttl=30)
    assert holder.acquire(blocking=False)
    first, second = StandIn(r, "turn", score=0), StandIn(r, "turn", score=1)
    stand_ins.extend((first, second))
    node = SingleNode(r)
    node.handoff = False
    assert node.release(holder.keys, holder.token or "")
    assert r.get(holder.keys.lock) is None  # freed, not handed over
    assert first.next_message(r) == b"1"
    assert second.next_message(r) == b"marker"  # not woken by the release
    assert node.leave(holder.keys, first.member, first.secret) is None
    assert second.next_message(r) == b"1"  # woken when the first gave up


def test_a_queued_waiter_that_leaves_in_time_is_removed(r: redis_py.Redis) -> None:
    holder = Lock(r, "timeout", ttl=30)
    assert holder.acquire(blocking=False)
    clock = FakeClock()
    waiter = Lock(r, "timeout", ttl=30, clock=clock)
    won = blocked(waiter, timeout=0.5)
    wait_until(lambda: queued(r, holder) == 1, 10, "the waiter queued")
    clock.now += 1  # the deadline passes; the waiter looks at its clock every 0.5 s
    assert won.get(timeout=10) is False
    assert queued(r, holder) == 0 and r.exists(holder.keys.waiters) == 0
    holder.release()
    assert keys_left(r) == []


def test_a_waiter_handed_the_lock_after_a_long_wait_extends_it_before_counting_on_it() -> None:
    """Its lease counts from its last try; after more than half a lease it extends first, so a
    wait longer than the lease does not leave it holding a lock it believes lost. (On a server
    of its own: a lock of an earlier test renewed meanwhile would add an EVALSHA.)"""
    with RedisServer() as server:
        r = server.client()
        holder = Lock(r, "long", ttl=30)
        assert holder.acquire(blocking=False)
        clock = FakeClock()
        waiter = Lock(r, "long", ttl=10, clock=clock)
        won = blocked(waiter, timeout=None)
        wait_until(lambda: queued(r, holder) == 1, 10, "the waiter queued")
        clock.now += 12  # longer than the waiter's lease
        r.config_resetstat()
        holder.release()
        assert won.get(timeout=10)
        assert waiter.held and not waiter.lost
        stats = r.info("commandstats")
        # Each after a NOSCRIPT; Redis 6.2 counts SCRIPT LOAD under "script" (7.0: "script|load").
        load = stats.get("cmdstat_script|load") or stats.get("cmdstat_script") or {}
        loads = load.get("calls", 0)
        assert stats["cmdstat_evalsha"]["calls"] - loads == 2  # the release, the waiter's extend
        waiter.release()
        r.close()


def test_without_the_queue_commands_a_waiter_falls_back_to_the_release_channel(
    redis_server: RedisServer, r: redis_py.Redis
) -> None:
    """An ACL user written before the queue existed (no ZADD): waiters still wake on release."""
    r.execute_command(
        "ACL", "SETUSER", "noqueue", "on", ">pw", "~*", "+@all", "allchannels", "-zadd"
    )
    try:
        url = f"redis://noqueue:pw@127.0.0.1:{redis_server.port}/0"
        holder, waiter = Lock(url, "old-acl", ttl=30), Lock(url, "old-acl", ttl=30)
        assert holder.acquire(blocking=False)
        won = blocked(waiter)
        channel = holder.keys.channel
        wait_until(
            lambda: dict(r.pubsub_numsub(channel)).get(channel.encode(), 0) == 1,
            10,
            "the waiter subscribed to the release channel",
        )
        holder.release()
        assert won.get(timeout=10)
        waiter.release()
    finally:
        r.execute_command("ACL", "DELUSER", "noqueue")


def test_an_asyncio_holder_hands_the_lock_to_a_queued_waiter(
    redis_url: str, r: redis_py.Redis
) -> None:
    waiter = Lock(r, "mixed", ttl=30)

    async def hold_then_release() -> queue.Queue[bool]:
        holder = AsyncLock(redis_url, "mixed", ttl=30)
        assert await holder.acquire(blocking=False)
        won = blocked(waiter)
        await asyncio.to_thread(wait_until, lambda: queued(r, waiter) == 1, 10, "queued")
        await holder.release()
        assert r.get(waiter.keys.lock) is not None  # handed over: never free
        return won

    won = asyncio.run(hold_then_release())
    assert won.get(timeout=10)
    assert r.get(waiter.key) == (waiter.token or "").encode()
    waiter.release()


class InterruptedOnExtend(Lock):
    """A waiter interrupted (as by SIGTERM's SystemExit) right after a release handed it the
    lock: its extend, the first call after the handoff, raises."""

    def do_extend(self, token: str, ttl: float) -> Any:
        raise SystemExit(143)


def test_a_waiter_interrupted_after_the_handoff_gives_the_lock_back(r: redis_py.Redis) -> None:
    holder = Lock(r, "interrupted", ttl=30)
    assert holder.acquire(blocking=False)
    clock = FakeClock()
    waiter = InterruptedOnExtend(r, "interrupted", ttl=10, clock=clock)
    raised: queue.Queue[BaseException] = queue.Queue()

    def wait() -> None:
        try:
            waiter.acquire(timeout=None)
        except BaseException as exc:  # reported to the test
            raised.put(exc)

    threading.Thread(target=wait, daemon=True).start()
    wait_until(lambda: queued(r, holder) == 1, 10, "the waiter queued")
    clock.now += 6  # more than half its lease: it extends on the handoff, and is interrupted
    holder.release()
    assert isinstance(raised.get(timeout=10), SystemExit)
    assert not waiter.held
    assert r.get(holder.keys.lock) is None  # given back, not left to its 10 s lease


class Interrupted(Exception):
    """What a signal handler raises, as Celery's ``SoftTimeLimitExceeded`` does."""


def test_a_wait_interrupted_by_an_exception_leaves_the_queue(r: redis_py.Redis) -> None:
    """A blocking wait ended by an ordinary exception (a soft time limit, SIGUSR1 of a revoke,
    any signal handler that raises) leaves the queue. Before, only a ``BaseException`` did:
    the entry stayed, the next release handed the lock to it, and the live waiter behind it
    waited for that lock's whole lease."""
    holder = Lock(r, "interrupted-wait", ttl=30)
    assert holder.acquire(blocking=False)
    waiter = Lock(r, "interrupted-wait", ttl=30)

    def interrupt(*_: Any) -> None:
        raise Interrupted

    def send_when_queued() -> None:
        wait_until(lambda: queued(r, holder) == 1, 10, "the waiter queued")
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGALRM)

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        threading.Thread(target=send_when_queued, daemon=True).start()
        with pytest.raises(Interrupted):
            waiter.acquire(timeout=30)  # in the main thread, where signal handlers run
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert not waiter.held
    assert queued(r, holder) == 0
    live = Lock(r, "interrupted-wait", ttl=30)
    won = blocked(live)
    wait_until(lambda: queued(r, holder) == 1, 10, "the live waiter queued")
    holder.release()
    assert won.get(timeout=10)  # handed the lock by the release, not after a 30 s lease
    assert r.get(live.key) == (live.token or "").encode()
    live.release()


def test_a_waiter_releases_over_an_open_connection_after_the_handoff(
    redis_server: RedisServer, redis_url: str
) -> None:
    """Its subscription lived on a pool of its own: closing it leaves the lock's client
    connected, so the release after the body does not connect again. The client's connections
    are told apart by its name (other clients of this process share the server)."""
    name = f"release-{new_token('t')[:12]}"
    r = redis_py.Redis.from_url(redis_url, client_name=name)
    admin = redis_server.client()

    def connections() -> set[str]:
        return {c["id"] for c in admin.client_list() if c["name"] == name}

    try:
        holder, waiter = Lock(r, "reuse", ttl=30), Lock(r, "reuse", ttl=30)
        assert holder.acquire(blocking=False)
        won = blocked(waiter)
        wait_until(lambda: queued(r, holder) == 1, 10, "the waiter queued")
        holder.release()
        assert won.get(timeout=10)
        before = connections()
        waiter.release()
        assert connections() <= before  # no new connection
    finally:
        r.close()
        admin.close()


def test_a_queued_try_of_a_free_lock_takes_it_without_the_queue_commands(
    redis_server: RedisServer, r: redis_py.Redis
) -> None:
    """The script never stops half-way leaving the lock set to a token nobody knows."""
    r.execute_command(
        "ACL", "SETUSER", "noqueue2", "on", ">pw", "~*", "+@all", "allchannels", "-zadd", "-zrem"
    )
    client = redis_py.Redis.from_url(f"redis://noqueue2:pw@127.0.0.1:{redis_server.port}/0")
    try:
        keys = keys_for("redlock", "free")
        token = new_token("w")
        member = scripts.queue_member(waiter_channel(keys, "w"), token, 10_000)
        secret = token.partition(SEPARATOR)[0]
        reply = SingleNode(client).wait_attempt(keys, token, 10_000, member, secret)
        assert reply is not None and reply.held == token
        assert r.get(keys.lock) == token.encode()
    finally:
        client.close()
        r.execute_command("ACL", "DELUSER", "noqueue2")


def test_waits_of_one_process_reuse_a_subscription_and_each_is_handed_the_lock(
    redis_server: RedisServer, redis_url: str
) -> None:
    """A waiter handed the lock keeps its subscription open for the next wait (closing it
    would sit on the way back to the caller): every later wait listens on the same connection,
    and the dead channels of earlier waits never hand a lock to anyone.

    The subscription is told apart by the client's own name: the server's count of connections
    received also counts other tests' clients of this process, and this pool's second plain
    connection when the holder's release overlaps the waiter's thread."""
    name = f"reuse-{new_token('t')[:12]}"
    r = redis_py.Redis.from_url(redis_url, client_name=name)
    admin = redis_server.client()

    def subscribed() -> list[tuple[str, int]]:
        """(client id, channel count) of this client's connections that are subscribed."""
        return [
            (c["id"], int(c["sub"]))
            for c in admin.client_list()
            if c["name"] == name and int(c["sub"]) > 0
        ]

    try:
        listening: list[str] = []
        for turn in range(4):
            holder, waiter = Lock(r, f"again:{turn}", ttl=30), Lock(r, f"again:{turn}", ttl=30)
            assert holder.acquire(blocking=False)
            won = blocked(waiter)
            wait_until(lambda h=holder: queued(r, h) == 1, 10, "the waiter queued")
            wait_until(lambda t=turn: [n for _, n in subscribed()] == [t + 1], 10, "subscribed")
            listening.extend(client_id for client_id, _ in subscribed())
            holder.release()
            assert won.get(timeout=10)
            assert r.get(waiter.key) == (waiter.token or "").encode()
            waiter.release()
        assert len(set(listening)) == 1, listening  # one connection listened for all four
        assert len(admin.pubsub_channels("redlock:{again:*")) == 4  # dead, still subscribed
        assert keys_left(r) == []
    finally:
        r.close()
        admin.close()
