"""The :class:`~celery_redlock.Lock` primitive against a real ``redis-server``.

Expiry and renewal decisions are driven by an injected fake clock wherever possible; where
Redis' own TTL must run out, the TTL is short and the test polls with a deadline.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis as redis_py
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_redlock import Lock, LockContended, LockLost, LockUnavailable
from celery_redlock._redis.keys import high_water_of
from celery_redlock._redis.lock import release_attempt
from celery_redlock._redis.scripts import RELEASE, sha1
from celery_redlock.testing import RedisServer
from support.apps import lock_keys
from support.clock import FakeClock

POLL = 0.01  # poll interval while waiting on Redis state; every poll loop has a deadline


class RecordingLock(Lock):
    """Records the TTLs renewals ask Redis for (through the ``do_extend`` override point)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.extended: list[tuple[float, float]] = []

    def do_extend(self, token: str, ttl: float) -> bool:
        self.extended.append((self.clock(), ttl))
        return super().do_extend(token, ttl)


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(POLL)


def no_retry_client(url: str) -> redis_py.Redis:
    """A client that fails at once when the server is down (redis-py retries by default)."""
    return redis_py.Redis.from_url(
        url, socket_timeout=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def down_server() -> Iterator[RedisServer]:
    """A private server the test stops (and that is cleaned up whatever happens)."""
    with RedisServer() as server:
        yield server


# -- acquire / release --------------------------------------------------------------------------


# -- fencing tokens -----------------------------------------------------------------------------


def test_fencing_tokens_strictly_increase(r: redis_py.Redis) -> None:
    lock = Lock(r, "fenced", ttl=5)
    tokens: list[int] = []
    for _ in range(50):
        assert lock.acquire(blocking=False)
        assert lock.fencing_token is not None
        tokens.append(lock.fencing_token)
        lock.release()
    assert all(a < b for a, b in itertools.pairwise(tokens))

    # The counter expires 24 h after the last acquisition; the next token then starts from
    # the server clock in whole seconds * 10^6, above every token handed out in earlier
    # seconds. Simulate tokens handed out ten seconds ago, then the counter's expiry.
    seconds, _ = r.time()
    earlier = (seconds - 10) * 1_000_000 + 999
    r.set(lock.keys.fence, earlier)
    assert lock.acquire(blocking=False)
    assert lock.fencing_token == seconds * 1_000_000 or lock.fencing_token > earlier
    lock.release()
    assert r.delete(lock.keys.fence) == 1
    assert lock.acquire(blocking=False)
    assert lock.fencing_token is not None
    assert lock.fencing_token >= seconds * 1_000_000 > earlier
    lock.release()
    assert not r.exists(lock.keys.fence)  # a single-node lock reads the clock, writes no counter


def test_fencing_token_is_above_a_counter_ahead_of_the_clock(r: redis_py.Redis) -> None:
    lock = Lock(r, "fenced", ttl=5)
    assert lock.acquire(blocking=False)  # the connection's first acquire: its script
    lock.release()
    seconds, micros = r.time()
    ahead = seconds * 1_000_000 + micros + 10**9  # 1000 s ahead (exact in Lua's doubles)
    r.set(lock.keys.fence, ahead)
    assert lock.acquire(blocking=False)
    assert lock.fencing_token == ahead + 1
    lock.release()


@pytest.mark.parametrize("mark", [2**53 - 3, 2**63 - 3, 2**64], ids=["2^53", "2^63", "2^64"])
@pytest.mark.parametrize("limit", [1, 2], ids=["lock", "semaphore"])
def test_fencing_tokens_stay_at_2_to_the_53_past_it(
    r: redis_py.Redis, mark: int, limit: int
) -> None:
    """Lua numbers are exact to 2^53, and tokens stay there past it, equal (docs/guide.md). A
    mark past 2^63 (a clock far ahead, a mark set by hand) made the next token negative, and
    the ones after it went back to the clock's: below the stores' fences (helper probe)."""
    lock = Lock(r, "far-ahead", ttl=5, limit=limit)
    r.set(high_water_of(lock.keys.lock), mark)
    tokens = []
    for _ in range(4):  # by the acquire script, then (a plain lock) SET NX and FENCE
        assert lock.acquire(blocking=False)
        tokens.append(lock.fencing_token)
        lock.release()
    top = 2**53
    assert tokens == sorted(tokens) and tokens[-1] == top, tokens
    assert tokens[0] > mark if mark < top else tokens == [top] * 4, tokens


# -- extend -------------------------------------------------------------------------------------


def test_extend_resets_the_remaining_ttl(r: redis_py.Redis) -> None:
    lock = Lock(r, "job", ttl=10)
    assert lock.acquire(blocking=False)
    r.pexpire(lock.key, 500)
    lock.extend()
    assert 9000 < r.pttl(lock.key) <= 10000
    lock.extend(20)
    assert 19000 < r.pttl(lock.key) <= 20000
    with pytest.raises(ValueError, match=r"seconds >= 0\.001"):
        lock.extend(0)
    lock.release()


def test_extend_after_the_key_was_stolen_is_lost(r: redis_py.Redis) -> None:
    lock = Lock(r, "job", ttl=10)
    assert lock.acquire(blocking=False)
    r.set(lock.key, "thief")  # no TTL: an extend that touched it would give it one

    with pytest.raises(LockLost) as info:
        lock.extend()
    assert info.value.key == lock.key
    assert lock.lost
    assert not lock.held
    assert r.get(lock.key) == b"thief"
    assert r.pttl(lock.key) == -1
    with pytest.raises(LockLost, match="was lost"):
        lock.extend()  # a lost lock cannot be extended any more


# -- context manager ----------------------------------------------------------------------------


def test_context_manager_acquires_and_releases(r: redis_py.Redis) -> None:
    with Lock(r, "cm", ttl=10) as lock:
        assert lock.held
        assert r.get(lock.key) == lock.token.encode()
    assert not lock.held
    assert r.exists(lock.key) == 0


def test_context_manager_raises_contended_with_key_and_holder(r: redis_py.Redis) -> None:
    holder = Lock(r, "cm", ttl=30, owner="task-A")
    assert holder.acquire(blocking=False)
    entered = False
    with pytest.raises(LockContended) as info, Lock(r, "cm", ttl=10, timeout=0):
        entered = True
    assert not entered
    assert info.value.key == holder.key
    assert info.value.holder == "task-A"
    assert info.value.ttl is not None
    assert 29.0 < info.value.ttl <= 30.0
    assert r.get(holder.key) == holder.token.encode()  # the holder is untouched
    holder.release()


class Interrupted(Lock):
    """A lock whose acquire is interrupted after it took the key (a signal handler's exception
    landing in the last steps of the acquire: here, the start of its renewal)."""

    def _start_renewal(self, delay: float) -> None:
        raise KeyboardInterrupt


@pytest.mark.parametrize("blocking", [False, True])
def test_an_acquire_interrupted_after_taking_the_key_gives_it_back(
    r: redis_py.Redis, blocking: bool
) -> None:
    """``with Lock(...)`` never reaches ``__exit__`` when ``__enter__`` raises: the key, taken
    just before, stayed held by nobody until its TTL."""
    lock = Interrupted(r, "interrupted", ttl=30, auto_renew=True)
    with pytest.raises(KeyboardInterrupt), lock:
        pytest.fail("the body ran")
    assert not r.exists(lock.key) and not lock.held
    with pytest.raises(KeyboardInterrupt):
        lock.acquire(blocking=blocking, timeout=1)
    assert not r.exists(lock.key) and lock.token is None


def test_context_manager_exit_after_loss_does_not_raise(r: redis_py.Redis) -> None:
    with Lock(r, "cm", ttl=10) as lock:
        r.set(lock.key, "thief")
    assert lock.lost
    assert r.get(lock.key) == b"thief"


# -- blocking acquire ---------------------------------------------------------------------------


def test_blocking_acquire_wakes_on_release_notification(r: redis_py.Redis) -> None:
    holder = Lock(r, "wake", ttl=30)
    waiter = Lock(r, "wake", ttl=30)
    assert holder.acquire(blocking=False)
    errors: list[BaseException] = []

    def release_once_subscribed() -> None:
        try:
            wait_until(lambda: r.zcard(holder.keys.waiters) == 1)  # subscribed and queued
            holder.release()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    releaser = threading.Thread(target=release_once_subscribed)
    releaser.start()
    start = time.monotonic()
    try:
        acquired = waiter.acquire(blocking=True, timeout=5)
    finally:
        releaser.join(10)
    elapsed = time.monotonic() - start
    assert not errors, errors
    assert acquired
    assert waiter.held
    assert r.get(waiter.key) == waiter.token.encode()
    # Woken by the notification: far below the holder's 30 s TTL and the 5 s timeout.
    assert elapsed < 3.0
    waiter.release()
    # The waiter unsubscribed (its pub/sub connection was closed).
    channel = holder.keys.channel
    wait_until(lambda: dict(r.pubsub_numsub(channel)).get(channel.encode(), 0) == 0)


# -- renewal ------------------------------------------------------------------------------------


def test_renewal_stops_at_the_max_hold_cap(
    r: redis_py.Redis, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    lock = RecordingLock(r, "capped", ttl=10, max_hold=15, clock=clock)
    acquired_at = clock.now
    assert lock.acquire(blocking=False)
    assert 9000 < r.pttl(lock.key) <= 10000

    delays = []
    for offset in (3.0, 8.0, 12.0, 14.5):
        clock.now = acquired_at + offset
        delays.append(lock.renew_step())
    assert all(d is not None and d > 0 for d in delays)
    assert [ttl for _, ttl in lock.extended] == pytest.approx([10.0, 7.0, 3.0, 0.5])
    for at, ttl in lock.extended:
        assert at + ttl <= acquired_at + 15 + 1e-9  # never past acquisition + max_hold
    assert 0 < r.pttl(lock.key) <= 500  # Redis got the capped TTL too

    clock.now = acquired_at + 14.9
    assert lock.held
    clock.now = acquired_at + 15
    with caplog.at_level(logging.ERROR, logger="celery_redlock.lock"):
        assert lock.renew_step() is None
    assert not caplog.records  # the cap is planned: no "lost" ERROR
    assert len(lock.extended) == 4  # no extend sent at the cap
    assert lock.lost  # the key expires on its own at the cap: from then on, not ours
    lock.release()


def test_max_hold_below_ttl_caps_the_initial_ttl(r: redis_py.Redis, clock: FakeClock) -> None:
    lock = Lock(r, "capped", ttl=30, max_hold=2, clock=clock)
    assert lock.acquire(blocking=False)
    assert 1000 < r.pttl(lock.key) <= 2000
    lock.release()


def test_renewal_finding_the_key_stolen_marks_lost_and_logs(
    r: redis_py.Redis, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    lock = Lock(r, "stolen", ttl=10, clock=clock)
    assert lock.acquire(blocking=False)
    token_prefix = lock.token[:8]
    r.set(lock.key, "thief")
    clock.now += 3
    with caplog.at_level(logging.ERROR, logger="celery_redlock.lock"):
        assert lock.renew_step() is None
        assert lock.renew_step() is None  # stays stopped, logs once
    assert lock.lost
    assert not lock.held
    assert r.get(lock.key) == b"thief"
    errors = [
        rec
        for rec in caplog.records
        if rec.name == "celery_redlock.lock" and rec.levelno == logging.ERROR
    ]
    assert len(errors) == 1
    message = errors[0].getMessage()
    assert lock.key in message
    assert token_prefix in message
    assert "lost" in message
    with pytest.raises(LockLost):
        lock.release()
    assert r.get(lock.key) == b"thief"


# -- Redis unavailable --------------------------------------------------------------------------


def test_acquire_with_redis_down_raises_unavailable_naming_the_node(
    down_server: RedisServer,
) -> None:
    lock = Lock(no_retry_client(down_server.url), "job", ttl=10)
    down_server.stop()
    with pytest.raises(LockUnavailable) as info:
        lock.acquire(blocking=False)
    node = f"127.0.0.1:{down_server.port}"
    assert node in str(info.value)
    assert info.value.nodes == (node,)
    assert info.value.key == lock.key
    assert not lock.held
    with pytest.raises(LockUnavailable):
        lock.acquire(blocking=True, timeout=1)
    with pytest.raises(LockUnavailable):
        lock.locked()


def test_renewal_with_redis_down_retries_then_marks_lost_at_expiry(
    down_server: RedisServer, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    lock = Lock(no_retry_client(down_server.url), "job", ttl=10, clock=clock)
    acquired_at = clock.now
    assert lock.acquire(blocking=False)
    down_server.stop()

    with caplog.at_level(logging.WARNING, logger="celery_redlock.lock"):
        clock.now = acquired_at + 3
        delay = lock.renew_step()
        assert delay is not None
        assert 0 < delay <= 10 / 3
        assert not lock.lost
        assert lock.held

        clock.now = acquired_at + 9.9
        delay = lock.renew_step()
        assert delay is not None
        assert 0 < delay <= 0.05 + 1e-9  # at most half the time left before expiry
        assert not lock.lost

        clock.now = acquired_at + 10  # the last confirmed expiry: another owner may exist
        assert lock.renew_step() is None
    assert lock.lost
    assert not lock.held
    records = [r for r in caplog.records if r.name == "celery_redlock.lock"]
    assert [r.levelno for r in records] == [logging.WARNING, logging.WARNING, logging.ERROR]
    assert lock.key in records[-1].getMessage()


# -- construction -------------------------------------------------------------------------------


def test_lock_from_a_url_string(redis_url: str, r: redis_py.Redis) -> None:
    lock = Lock(redis_url, "by-url", ttl=5)
    assert lock.acquire(blocking=False)
    assert r.get(lock.key) == lock.token.encode()
    lock.release()
    assert r.exists(lock.key) == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        *({"ttl": bad} for bad in (-1, 0, True, float("nan"), float("inf"), 1e17)),
        pytest.param({"ttl": 10**400}, id="ttl-10**400"),
        {"max_hold": 0},
        {"max_hold": float("inf")},
        {"max_hold": "5"},
        {"max_hold": True},
        {"timeout": -1},
        {"timeout": "5"},
        {"timeout": True},
        {"timeout": float("nan")},
        {"blocking": "no"},
        {"limit": 10**6},
    ],
    ids=repr,
)
def test_invalid_arguments_are_value_errors(redis_url: str, kwargs: dict[str, Any]) -> None:
    """Each names the argument: a string, a bool or a NaN was a raw ``TypeError``, taken as
    1 s, or waited forever; a million slots took 2 s and 342 MB per acquisition."""
    with pytest.raises(ValueError, match=f"Lock {next(iter(kwargs))} must be"):
        Lock(redis_url, "x", **kwargs)


@pytest.mark.parametrize(
    ("call", "kwargs"),
    [
        ("acquire", {"timeout": float("nan")}),
        ("acquire", {"timeout": "5"}),
        ("acquire", {"blocking": "no"}),
        ("release", {"keep": float("nan")}),
        ("release", {"keep": "1"}),
    ],
    ids=repr,
)
def test_invalid_call_arguments_are_value_errors_naming_them(
    redis_url: str, r: redis_py.Redis, call: str, kwargs: dict[str, Any]
) -> None:
    lock = Lock(redis_url, "x", ttl=5)
    if call == "release":
        assert lock.acquire(blocking=False)
    with pytest.raises(ValueError, match=f"{call} {next(iter(kwargs))} must be"):
        getattr(lock, call)(**kwargs)
    if call == "release":
        lock.release()
    assert lock_keys(r) == []


@pytest.mark.parametrize("name", ["a{b", "a}b", ""], ids=repr)
def test_invalid_name_is_a_value_error(r: redis_py.Redis, name: str) -> None:
    with pytest.raises(ValueError, match="lock name"):
        Lock(r, name)


# -- parent-side release ------------------------------------------------------------------------


@pytest.mark.parametrize("task_id", ["task-1", "task|with|pipes"])
def test_release_attempt_needs_task_host_and_pid_to_match(r: redis_py.Redis, task_id: str) -> None:
    lock = Lock(r, "child", ttl=30, owner=task_id, host="worker-a")
    assert lock.acquire(blocking=False)
    pid = os.getpid()
    stored = r.get(lock.key)

    assert not release_attempt(r, "child", "redlock", "task-2", "worker-a", pid)
    assert not release_attempt(r, "child", "redlock", task_id, "worker-b", pid)
    assert not release_attempt(r, "child", "redlock", task_id, "worker-a", pid + 1)
    assert not release_attempt(r, "child", "other-prefix", task_id, "worker-a", pid)
    assert r.get(lock.key) == stored

    assert release_attempt(r, "child", "redlock", task_id, "worker-a", pid)
    assert r.exists(lock.key) == 0
    assert not release_attempt(r, "child", "redlock", task_id, "worker-a", pid)  # missing


def test_release_attempt_applies_the_whole_cooldown_once(r: redis_py.Redis) -> None:
    """The main process releasing for a dead child applies the task's cooldown, as the child's
    own release does: a hard time limit used to delete the key, ending the cooldown window at
    once. The whole cooldown, also past the dead holder's lease (it was capped at the lease's
    remaining TTL: a 10 s cooldown lasted 3 s). A slot already marked as a cooldown (the
    child released before it died, or a second release for the same death) is released
    already: left as it is, and not reported (nor counted) again."""
    pid = os.getpid()
    lock = Lock(r, "cooled", ttl=2, owner="task-1", host="worker-a")
    assert lock.acquire(blocking=False)
    assert release_attempt(r, "cooled", "redlock", "task-1", "worker-a", pid, keep=5.0)
    assert 4000 < r.pttl(lock.key) <= 5000
    marked = ("cooldown" + lock.token[8:]).encode()  # marked as a cooldown, as the child's
    assert r.get(lock.key) == marked
    r.pexpire(lock.key, 1500)  # as the child's own release with a shorter cooldown leaves it
    assert not release_attempt(r, "cooled", "redlock", "task-1", "worker-a", pid, keep=5.0)
    assert 0 < r.pttl(lock.key) <= 1500 and r.get(lock.key) == marked
    r.delete(lock.key)


class SendsItsReleaseTwice(redis_py.Redis):
    """A client that sends the release script again after it ran, as redis-py's retry does
    when the first reply is lost (``retry_on_timeout``)."""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        reply = super().execute_command(*args, **options)
        if args[:2] == ("EVALSHA", sha1(RELEASE)):
            reply = super().execute_command(*args, **options)
        return reply


def test_a_release_with_keep_sent_again_is_answered_as_the_first(
    redis_server: RedisServer, r: redis_py.Redis
) -> None:
    """A kept slot is marked as a cooldown: the release sent again no longer found the token,
    answered 0, and the holder got :class:`LockLost` (and an ERROR) for a release that
    worked."""
    client = SendsItsReleaseTwice(port=redis_server.port)
    lock = Lock(client, "twice", ttl=30)
    assert lock.acquire(blocking=False)
    token = lock.token
    lock.release(keep=5)  # no LockLost
    assert r.get(lock.key) == ("cooldown" + token[8:]).encode()
    assert 4000 < r.pttl(lock.key) <= 5000
    client.close()
    r.delete(lock.key)


def test_release_attempt_ignores_a_foreign_value(r: redis_py.Redis) -> None:
    lock = Lock(r, "child", ttl=30, owner="task-1", host="worker-a")
    r.set(lock.key, "not-a-token")
    assert not release_attempt(r, "child", "redlock", "task-1", "worker-a", os.getpid())
    assert r.get(lock.key) == b"not-a-token"
