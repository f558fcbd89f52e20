"""The pool of the clients built from a URL (:class:`celery_redlock._redis.pools.WaitingPool`),
against a real ``redis-server``: a caller waits for a connection when all are out, is woken by
the first one given back, fails naming the pool after its timeout, and a forked child starts
with a pool of its own."""

from __future__ import annotations

import os
import signal
import threading
import warnings
from typing import Any

import pytest
import redis as redis_py

from celery_redlock import Lock, LockUnavailable
from celery_redlock._redis import clients, subscriptions
from celery_redlock._redis.commands import connection_of
from celery_redlock._redis.pools import WaitingPool
from celery_redlock.testing import RedisServer, wait_until


def pool_of(server: RedisServer, connections: int, timeout: float = 5.0) -> WaitingPool:
    """A pool of ``connections`` (taken with :func:`connection_of`, which names a command to a
    redis-py older than 5.3, as redis-py's own commands do)."""
    pool = WaitingPool.from_url(server.url, max_connections=connections)
    pool.timeout = timeout
    return pool


def test_a_url_client_uses_the_waiting_pool_and_its_subscriptions_a_plain_copy(
    redis_server: RedisServer,
) -> None:
    """The waiters' subscriptions run on a copy of the lock's pool: a subscription kept for a
    whole wait must not take one of the lock's connections (subscriptions.subscriber_of)."""
    client = clients.client_for(f"{redis_server.url}?socket_timeout=3")
    assert type(client.connection_pool) is WaitingPool
    assert client.connection_pool.timeout == 3.0
    subscriber = subscriptions.subscriber_of(client)
    assert subscriber is not client
    assert type(subscriber.connection_pool) is redis_py.ConnectionPool


def test_a_caller_waits_for_the_connection_given_back(redis_server: RedisServer) -> None:
    pool = pool_of(redis_server, 1)
    held = connection_of(pool)
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(connection_of(pool)))
    waiter.start()
    wait_until(lambda: pool._waiting == 1, 5, "the second caller to wait")
    assert got == []
    pool.release(held)
    waiter.join(5)
    assert got == [held]
    pool.release(held)
    pool.disconnect()


def test_no_connection_back_within_the_timeout_fails_naming_the_pool(
    redis_server: RedisServer,
) -> None:
    pool = pool_of(redis_server, 1, timeout=0.2)
    held = connection_of(pool)
    with pytest.raises(redis_py.ConnectionError, match="No connection available"):
        connection_of(pool)
    assert pool._waiting == 0
    pool.release(held)
    pool.disconnect()
    url = f"{redis_server.url}?max_connections=1&socket_timeout=0.2"
    busy = connection_of(clients.client_for(url).connection_pool)
    try:
        with pytest.raises(LockUnavailable, match="had no free connection for lock"):
            Lock(url, "pool-timeout").acquire(blocking=False)
    finally:
        clients.client_for(url).connection_pool.release(busy)


def test_many_threads_share_two_connections_without_a_lost_wake_up(
    redis_server: RedisServer,
) -> None:
    """Every connection given back while someone waits wakes a waiter: with 20 threads on 2
    connections, a wake-up lost between a waiter's try and its wait would leave it asleep for
    its whole timeout (here 30 s: the join's limit fails first)."""
    pool = pool_of(redis_server, 2, timeout=30)
    client = redis_py.Redis(connection_pool=pool)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(100):
                client.ping()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    assert pool._created_connections == 2
    pool.disconnect()


def test_a_forked_child_gets_a_pool_of_its_own(redis_server: RedisServer) -> None:
    """A child forked while its parent holds the only connection and a thread waits for it
    starts with no connection out and no one waiting (the pool resets on first use)."""
    pool = pool_of(redis_server, 1, timeout=30)
    held = connection_of(pool)
    waiter = threading.Thread(target=lambda: pool.release(connection_of(pool)))
    waiter.start()
    wait_until(lambda: pool._waiting == 1, 5, "a thread to wait")
    with warnings.catch_warnings():  # Python 3.12+: forking a process that has threads
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: only its exit code speaks, never back into pytest
        code = 2
        try:
            signal.alarm(10)
            connection = connection_of(pool)
            connection.send_command("PING")
            code = 0 if connection.read_response() == b"PONG" and pool._waiting == 0 else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    pool.release(held)
    waiter.join(5)
    assert not waiter.is_alive()
    pool.disconnect()
