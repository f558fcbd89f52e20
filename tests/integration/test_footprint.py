"""What a lock leaves in Redis and what it sends there: pinned as behaviours, never timed.

Commands are counted with ``INFO commandstats`` (``CONFIG RESETSTAT`` first). Redis counts the
commands a script runs on their own lines too, so each test says which commands are sent by
the client (round trips) and which run inside the release script.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Iterator

import pytest
import redis as redis_py
from celery import Celery

from celery_redlock import Lock, LockedTask, lock_key
from celery_redlock._redis.keys import high_water_of, keys_for
from celery_redlock.metrics import flush
from celery_redlock.testing import RedisServer, wait_until
from support.apps import make_app

#: The benchmark's and the counters' own commands, and a new connection's handshake.
NOT_COUNTED = ("info", "config|resetstat", "hincrby", "hello", "client|setinfo", "select", "ping")


def commands(r: redis_py.Redis) -> dict[str, int]:
    """Calls per command since the last ``CONFIG RESETSTAT``."""
    return {
        name.removeprefix("cmdstat_"): int(fields["calls"])
        for name, fields in r.info("commandstats").items()
        if name.removeprefix("cmdstat_") not in NOT_COUNTED
    }


def keys_left(r: redis_py.Redis) -> list[bytes]:
    """Every key of the lock database but the event counters (one hash per task name) and the
    high-water marks of fencing tokens (one per Cluster slot a token was handed out in)."""
    return [
        k
        for k in r.scan_iter()
        if not k.startswith(b"redlock:stats:") and not k.startswith(b"redlock:fence:{")
    ]


def marks_left(r: redis_py.Redis) -> set[str]:
    """The high-water marks of fencing tokens: bounded by the slots, not by the names."""
    return {k.decode() for k in r.scan_iter(match="redlock:fence:{*}")}


def assert_nobody_polls(r: redis_py.Redis) -> None:
    """Some of the server's time passes (50 round trips of ours): no other command arrives."""
    before = commands(r)
    for _ in range(50):
        r.echo("tick")
    after = commands(r)
    assert after.pop("echo") == before.pop("echo", 0) + 50
    assert after == before


def test_a_released_lock_leaves_no_key_even_after_its_fencing_token_was_read(
    r: redis_py.Redis,
) -> None:
    for i in range(20):
        lock = Lock(r, f"user:{i}", ttl=10)
        assert lock.acquire(blocking=False)
        assert lock.fencing_token is not None
        lock.release()
    assert keys_left(r) == []
    assert marks_left(r) == {
        high_water_of(keys_for("redlock", f"user:{i}").lock) for i in range(20)
    }


def test_a_locked_task_leaves_no_key_after_release_and_after_its_cooldown(
    app: Celery, r: redis_py.Redis
) -> None:
    @app.task(base=LockedTask)
    def sync_account(user_id: int) -> int:
        return user_id

    @app.task(base=LockedTask, lock_cooldown=0.2)
    def cooled(user_id: int) -> int:
        return user_id

    for user_id in range(10):
        assert sync_account.apply(args=(user_id,)).get() == user_id
    assert keys_left(r) == []
    assert cooled.apply(args=(1,)).get() == 1
    assert r.exists(lock_key(cooled, 1))  # kept for the cooldown
    wait_until(lambda: keys_left(r) == [], 10, "the cooldown key expired, nothing else left")


def test_fencing_tokens_strictly_increase_across_holders_without_a_counter(
    r: redis_py.Redis,
) -> None:
    tokens = []
    for i in range(30):
        lock = Lock(r, "fenced", ttl=10, owner=f"task-{i}")
        assert lock.acquire(blocking=False)
        tokens.append(lock.fencing_token)
        assert lock.fencing_token == tokens[-1]  # read once, then cached
        lock.release()
    assert all(isinstance(t, int) for t in tokens)
    assert all(a < b for a, b in itertools.pairwise(tokens))  # type: ignore[operator]
    assert keys_left(r) == []
    assert marks_left(r) == {high_water_of(keys_for("redlock", "fenced").lock)}  # one key


def test_a_fencing_token_is_never_read_for_a_lock_that_was_lost(r: redis_py.Redis) -> None:
    lock = Lock(r, "fenced", ttl=10)
    assert lock.acquire(blocking=False)
    r.delete(lock.key)  # expired, say
    assert lock.fencing_token is None
    assert lock.lost


@pytest.fixture
def alone() -> Iterator[tuple[Celery, redis_py.Redis]]:
    """An app and a client on a Redis server of their own: every command counted is theirs
    (on the shared one, a result consumer of an earlier test may unsubscribe meanwhile)."""
    with RedisServer() as server:
        r = server.client()
        yield make_app(server), r
        r.close()


def test_a_locked_execution_costs_two_round_trips_and_a_skipped_one_one(
    alone: tuple[Celery, redis_py.Redis],
) -> None:
    app, r = alone

    @app.task(base=LockedTask)
    def sync_account(user_id: int) -> int:
        return user_id

    sync_account.apply(args=(-1,))  # loads the release script, opens the connection
    flush()
    n = 25
    r.config_resetstat()
    for user_id in range(n):
        sync_account.apply(args=(user_id,))
    # Sent: SET NX PX GET (acquire) and EVALSHA (release); GET, DEL, PUBLISH and EXISTS (the
    # queue of blocking waiters, absent here) run inside it.
    assert commands(r) == {"set": n, "evalsha": n, "get": n, "del": n, "publish": n, "exists": n}

    r.set(lock_key(sync_account, 7), "someone else", px=60_000)
    r.config_resetstat()
    for _ in range(n):
        assert sync_account.apply(args=(7,)).get() is None  # skipped
    assert commands(r) == {"set": n}  # the failed SET NX GET names the holder: nothing else


def test_a_release_hands_the_lock_to_one_waiter_wakes_the_next_and_nobody_polls(
    alone: tuple[Celery, redis_py.Redis],
) -> None:
    r = alone[1]
    holder = Lock(r, "queue", ttl=30)
    assert holder.acquire(blocking=False)
    waiters = 3
    won: queue.Queue[Lock] = queue.Queue()

    def wait() -> None:
        lock = Lock(r, "queue", ttl=30)
        if lock.acquire(blocking=True, timeout=30):
            won.put(lock)

    r.config_resetstat()
    threads = [threading.Thread(target=wait, daemon=True) for _ in range(waiters)]
    for thread in threads:
        thread.start()

    def scripts_run() -> int:
        """Scripts run (queued tries, releases): each NOSCRIPT reply was followed by a load."""
        sent = commands(r)
        return sent.get("evalsha", 0) - sent.get("script|load", 0)

    def settled(queued: int, scripts: int) -> bool:
        """``queued`` waiters in the queue, ``scripts`` scripts run so far."""
        return r.zcard(holder.keys.waiters) == queued and scripts_run() == scripts

    # Each waiter: a SET; SUBSCRIBE to its own channel, confirmed; one queued try (EVALSHA:
    # SET NX, then ZADD into the queue and the holder's PTTL in the same script); a read.
    wait_until(lambda: settled(waiters, waiters), 10, "every waiter queued and blocked")
    assert_nobody_polls(r)

    holder.release()
    winner = won.get(timeout=10)
    # The release handed the lock to the first waiter (no round trip of its own) and woke the
    # next one, which tried once more (one EVALSHA) to read the new holder's TTL; the last
    # was not woken.
    wait_until(lambda: settled(waiters - 1, waiters + 2), 10, "the others still queued")
    assert won.empty()  # exactly one winner
    assert_nobody_polls(r)
    assert winner.held and r.get(winner.key) == (winner.token or "").encode()

    scripts = waiters + 2
    for queued in range(waiters - 2, -1, -1):  # hand it on, one at a time, to the last waiter
        winner.release()
        winner = won.get(timeout=10)
        scripts += 2 if queued else 1  # the release, and the try of the waiter it woke
        wait_until(lambda q=queued, n=scripts: settled(q, n), 10, "the woken waiter's try")
    winner.release()
    for thread in threads:
        thread.join(10)
    assert won.empty()
    # Every waiter tried once, to queue, and was handed the lock in its turn; each handoff
    # woke the waiter queued next once (read with ZRANGE, not popped: the woken waiter's try,
    # whose ZADD NX keeps its place): a waiter woken by a release it then lost would have
    # tried again.
    nudged = waiters - 1
    assert scripts_run() == waiters + (waiters + 1) + nudged
    assert commands(r)["zadd"] == waiters + nudged
    assert commands(r)["zrange"] == nudged + 1  # the last handoff found nobody left
    assert keys_left(r) == []
