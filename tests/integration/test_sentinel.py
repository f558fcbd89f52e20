"""Locks through ``redis+sentinel://`` against a real Sentinel, primary and replica.

The failover is the Sentinel's own (``SENTINEL FAILOVER``), with the old primary still running.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator

import pytest

from celery_redlock import Lock, LockUnavailable
from celery_redlock._redis.inventory import Inventory
from celery_redlock.testing import RedisServer, wait_until
from support.servers import SERVICE, SentinelGroup, client, dead_port


@pytest.fixture
def group() -> Iterator[SentinelGroup]:
    with SentinelGroup() as g:
        yield g


def get(server: RedisServer, key: str) -> bytes | None:
    c = client(server.port)
    try:
        value = c.get(key)
    finally:
        c.close()
    assert value is None or isinstance(value, bytes)
    return value


def test_lock_through_sentinel_and_across_a_failover(group: SentinelGroup) -> None:
    url = group.url
    assert url == f"redis+sentinel://127.0.0.1:{group.port}/{SERVICE}/0"
    held = Lock(url, "held", ttl=30, owner="task-1", host="w1")
    assert held.acquire(blocking=False)
    assert held.token is not None
    token = held.token.encode()
    assert get(group.primary, held.key) == token
    wait_until(lambda: get(group.replica, held.key) == token, 5, "the lock to reach the replica")

    # Every operation, including a blocking acquire woken by a release notification.
    lock = Lock(url, "job", ttl=10)
    assert lock.acquire(blocking=False)
    lock.extend(20)
    assert 19.0 < (lock.remaining_ttl() or 0) <= 20.0
    waiter = Lock(url, "job", ttl=10)
    releaser = threading.Timer(0.2, lock.release)
    releaser.start()
    start = time.monotonic()
    assert waiter.acquire(timeout=5)
    assert time.monotonic() - start < 2.0  # woken by the release, not by the 20 s TTL
    releaser.join()
    waiter.release()

    new, old = group.failover()
    assert (new.port, old.port) == (group.replica.port, group.primary.port)

    # The lock taken before the failover was replicated: the new primary still refuses it...
    contender = Lock(url, "held", ttl=30)
    assert not contender.acquire(blocking=False)
    assert contender.last_holder is not None
    assert contender.last_holder.task_id == "task-1"
    # ...and its holder extends and releases it there.
    held.extend()
    held.release()
    assert get(new, held.key) is None

    # New locks live on the new primary, blocking acquire included.
    lock = Lock(url, "after", ttl=10)
    assert lock.acquire(blocking=False)
    assert lock.token is not None
    assert get(new, lock.key) == lock.token.encode()
    waiter = Lock(url, "after", ttl=10)
    releaser = threading.Timer(0.2, lock.release)
    releaser.start()
    assert waiter.acquire(timeout=5)
    releaser.join()
    assert waiter.token is not None
    assert get(new, waiter.key) == waiter.token.encode()
    waiter.release()
    assert get(new, waiter.key) is None


def test_no_sentinel_answering_is_unavailable_naming_the_service() -> None:
    url = f"redis+sentinel://127.0.0.1:{dead_port()},127.0.0.1:{dead_port()}/{SERVICE}/0"
    with pytest.raises(LockUnavailable) as info:
        Lock(url, "job", ttl=10).acquire(blocking=False)
    assert info.value.nodes == (f"sentinel service {SERVICE}",)
    assert f"sentinel service {SERVICE}" in str(info.value)


def test_a_sentinel_named_by_its_ipv6_address_is_reached() -> None:
    # ``[::1]`` without a port is the Sentinel's default port, which a test cannot take: the
    # unit tests pin that parse; this one pins that the brackets are not sent to the socket.
    with SentinelGroup(sentinel_bind="127.0.0.1 ::1") as group:
        lock = Lock(f"redis+sentinel://[::1]:{group.port}/{SERVICE}", "v6", ttl=10)
        assert lock.acquire(blocking=False)
        assert lock.token is not None
        assert get(group.primary, lock.key) == lock.token.encode()
        lock.release()
        assert get(group.primary, lock.key) is None


def test_a_url_of_the_wrong_kind_for_a_sentinel_names_the_url_to_use(group: SentinelGroup) -> None:
    """Probe: ``redis://<a Sentinel's port>`` gave "unknown command 'SCAN'" (the lock: a raw
    ``ResponseError`` for EVALSHA), and ``redis+sentinel://<the Redis server's port>`` gave
    "No master found ... unknown command 'SENTINEL'", neither saying which URL to use."""
    # A URL no other test builds a client for: clients are shared per URL in a process, and a
    # port a Redis server of an earlier test had (its client learned SET works) was seen taken
    # by this Sentinel.
    plain = f"redis://127.0.0.1:{group.port}/0?socket_connect_timeout=2.01"
    with pytest.raises(LockUnavailable) as info:
        Inventory(plain, "redlock").all()
    assert f"the lock Redis at {plain} is a Redis Sentinel" in str(info.value), info.value
    assert "redis+sentinel://host:port/<service> URL" in str(info.value), info.value
    with pytest.raises(LockUnavailable) as info:  # the lock classifies the command's refusal
        Lock(plain, "job", ttl=10).acquire(blocking=False)
    assert re.search("unknown command ['`]EVALSHA['`]", str(info.value)), info.value
    assert "if that port is a Redis Sentinel's (26379 by default), name the Sentinels in a " in (
        str(info.value)
    )

    data_port = f"redis+sentinel://127.0.0.1:{group.primary_port()}/{SERVICE}/0"
    for failing in (
        lambda: Inventory(data_port, "redlock").all(),
        lambda: Lock(data_port, "job", ttl=10).acquire(blocking=False),
    ):
        with pytest.raises(LockUnavailable) as info:
            failing()
        assert "that port is not a Redis Sentinel's (it does not know the SENTINEL command)" in (
            str(info.value)
        ), info.value
