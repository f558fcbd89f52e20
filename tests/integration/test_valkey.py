"""The ``valkey`` client's Sentinel and Cluster clients, thread and asyncio, as lock connections.

The lock suite of ``tests/integration/test_lock_drivers.py`` runs every lock behaviour over
``valkey.Valkey`` and ``valkey.asyncio.Valkey`` clients; this file adds what a plain client
does not reach: a primary found through Sentinel, and a Cluster client (no hand-over on
release there: a Cluster's PUBLISH counts one node's subscribers). The servers are our
redis-servers: valkey speaks the same protocol. Errors of valkey's own classes are told apart
by :func:`celery_redlock._redis.core.classify`, by meaning.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
import redis as redis_py
import valkey
import valkey.asyncio
from valkey.asyncio.cluster import ValkeyCluster as AsyncValkeyCluster
from valkey.asyncio.sentinel import Sentinel as AsyncSentinel
from valkey.cluster import ValkeyCluster
from valkey.sentinel import Sentinel

import celery_redlock.asyncio
from celery_redlock import Lock, LockUnavailable
from celery_redlock._redis.subscriptions import subscriber_of
from celery_redlock.testing import RedisServer, wait_until
from support.servers import SERVICE, ClusterNodes, SentinelGroup


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterNodes]:
    with ClusterNodes() as nodes:
        yield nodes


@pytest.fixture(scope="module")
def sentinel() -> Iterator[SentinelGroup]:
    with SentinelGroup() as group:
        yield group


def exercise(client: object, name: str) -> None:
    """Acquire, contend, extend, wait for a release, release: on one sync client."""
    first = Lock(client, name, 10, owner="first")
    assert first.acquire(blocking=False)
    second = Lock(client, name, 10, owner="second", timeout=10)
    assert not second.acquire(blocking=False)
    assert second.last_holder is not None and second.last_holder.task_id == "first"
    first.extend(20)
    won: list[bool] = []
    waiter = threading.Thread(target=lambda: won.append(second.acquire(blocking=True)))
    waiter.start()  # a release before it queues is seen too: it then finds the key free
    first.release()
    waiter.join(15)
    assert won == [True]
    assert second.held
    second.release()
    assert Lock(client, name, 10).acquire(blocking=False)


def test_a_valkey_sentinel_primary_is_a_lock_connection(sentinel: SentinelGroup) -> None:
    watcher = Sentinel([("127.0.0.1", sentinel.port)])
    primary = watcher.master_for(SERVICE)
    try:
        exercise(primary, "valkey-sentinel")
        primary.script_flush()  # NOSCRIPT (valkey's own NoScriptError): loaded again
        lock = Lock(primary, "valkey-sentinel-flushed", 10)
        assert lock.acquire(blocking=False)
        lock.release()
    finally:
        primary.close()
        for client in watcher.sentinels:
            client.close()


def test_a_valkey_cluster_client_is_a_lock_connection(cluster: ClusterNodes) -> None:
    client = ValkeyCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    try:
        for i in range(6):  # names spread over the three primaries
            exercise(client, f"valkey-cluster-{i}")
        for node in cluster.nodes:  # NOSCRIPT on every primary: loaded again
            valkey.Valkey(port=node.port).script_flush()
        lock = Lock(client, "valkey-cluster-flushed", 10, limit=2)
        assert lock.acquire(blocking=False)
        lock.release()
    finally:
        client.close()


def test_a_refused_command_on_a_valkey_client_is_lock_unavailable(
    redis_server: RedisServer, redis_url: str
) -> None:
    with RedisServer() as own:
        admin = valkey.Valkey(port=own.port)
        admin.acl_setuser("locker", enabled=True, nopass=True, commands=["+@all", "-set"])
        admin.acl_setuser("locker", enabled=True, keys=["*"], channels=["*"])
        client = valkey.Valkey(port=own.port, username="locker")
        try:
            with pytest.raises(LockUnavailable, match="refused"):
                Lock(client, "valkey-noperm", 10).acquire(blocking=False)
        finally:
            client.close()
            admin.close()


def test_a_valkey_cluster_client_is_named_by_its_nodes_in_errors(cluster: ClusterNodes) -> None:
    """An error names the Cluster's nodes (``host:port,...``) for a ``ValkeyCluster`` as for
    redis-py's ``RedisCluster``; before, it said "Redis at ?:?"."""
    ports = [node.port for node in cluster.nodes]
    admins = [valkey.Valkey(port=port) for port in ports]
    for admin in admins:  # a user who may not take a lock
        admin.acl_setuser(
            "nolock", enabled=True, nopass=True, commands=["+@all", "-set", "-eval", "-evalsha"]
        )
        admin.acl_setuser("nolock", enabled=True, keys=["*"], channels=["*"])
    client = ValkeyCluster(host="127.0.0.1", port=ports[0], username="nolock")
    try:
        with pytest.raises(LockUnavailable) as info:
            Lock(client, "valkey-cluster-named", 10).acquire(blocking=False)
        assert str(info.value).startswith("Redis at 127.0.0.1:"), info.value
        assert {f"127.0.0.1:{port}" for port in ports} <= set(info.value.nodes[0].split(","))
    finally:
        client.close()
        for admin in admins:
            admin.acl_deluser("nolock")
            admin.close()


async def exercise_async(client: object, name: str, *, wait: bool = True) -> None:
    first = celery_redlock.asyncio.Lock(client, name, 10, owner="first")
    assert await first.acquire(blocking=False)
    second = celery_redlock.asyncio.Lock(client, name, 10, owner="second", timeout=10)
    assert not await second.acquire(blocking=False)
    await first.extend(20)
    if not wait:  # an asyncio Cluster client has no pub/sub to wait with (redis-py's neither)
        named = r"lock on 127\.0\.0\.1:\d+(,127\.0\.0\.1:\d+)*: .* asyncio Cluster client has"
        with pytest.raises(ValueError, match=named):  # its nodes, not "?:?"
            await second.acquire(blocking=True)  # a clear error, not AttributeError: 'pubsub'
        await first.release()
        with pytest.raises(ValueError, match="an asyncio Cluster client has no pub/sub"):
            await second.acquire(blocking=True)  # also when the key is free
        assert await second.acquire(blocking=False)
        await second.release()
        return
    waiting = asyncio.ensure_future(second.acquire(blocking=True))
    await asyncio.sleep(0)  # the waiter starts; a release before it queues is seen too
    await first.release()
    assert await asyncio.wait_for(waiting, 15)
    await second.release()


def test_valkey_asyncio_sentinel_and_cluster_clients_are_lock_connections(
    sentinel: SentinelGroup, cluster: ClusterNodes
) -> None:
    async def main() -> None:
        watcher = AsyncSentinel([("127.0.0.1", sentinel.port)])
        primary = watcher.master_for(SERVICE)
        nodes = AsyncValkeyCluster(host="127.0.0.1", port=cluster.nodes[0].port)
        try:
            await exercise_async(primary, "valkey-async-sentinel")
            await primary.script_flush()
            await exercise_async(primary, "valkey-async-sentinel-flushed")
            for i in range(3):
                await exercise_async(nodes, f"valkey-async-cluster-{i}", wait=False)
        finally:
            await primary.aclose()
            await nodes.aclose()
            for client in watcher.sentinels:
                await client.aclose()

    asyncio.run(main())


WAITERS = 4


@pytest.mark.parametrize("kind", ["valkey", "valkey-blocking", "redis-blocking"])
def test_waiters_on_a_bounded_pool_do_not_use_it_up(redis_server: RedisServer, kind: str) -> None:
    """Helper probe, round 3: thread waiters subscribe on a pool of their own only when the
    client's was redis-py's plain ``ConnectionPool``. On a valkey client, or a blocking pool,
    each waiter held one of the lock client's connections for its whole wait: with
    ``max_connections`` as many as the waiters, some failed at once ("the client's connection
    pool ... is exhausted") on a healthy server, or after the pool's timeout."""
    port = redis_server.port
    if kind == "valkey":
        client = valkey.Valkey(port=port, max_connections=WAITERS)
    else:
        library = valkey if kind == "valkey-blocking" else redis_py
        pool = library.BlockingConnectionPool(port=port, max_connections=WAITERS, timeout=10)
        client = (valkey.Valkey if library is valkey else redis_py.Redis)(connection_pool=pool)
    admin = redis_server.client()
    holder = Lock(redis_server.url, "bounded", ttl=30)
    assert holder.acquire(blocking=False)
    outcomes: list[object] = []

    def wait() -> None:
        lock = Lock(client, "bounded", ttl=30)
        try:
            outcomes.append(lock.acquire(timeout=20))
            lock.release()
        except LockUnavailable as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=wait) for _ in range(WAITERS)]
    for t in threads:
        t.start()
    wait_until(
        lambda: admin.zcard(holder.keys.waiters) == WAITERS or len(outcomes) > 0,
        20,
        "every waiter to queue",
    )
    holder.release()
    for t in threads:
        t.join()
    admin.close()
    client.close()
    assert outcomes == [True] * WAITERS


def test_a_quorum_waiter_holds_no_connection_of_the_nodes_clients_while_it_waits() -> None:
    """Review, round 3: a quorum's waiters subscribed on the first answering node's own client,
    each holding one of its pool's connections for its whole wait: with blocking pools of 4
    connections, 5 of 6 waiters found "no quorum ... No connection available" on healthy
    nodes. They now subscribe on a pool of their own, unbounded (redis-py 8 bounds a plain pool
    at 100 by default, and the 101st waiter of a process failed). One waiter: what several
    waiters of one quorum lock do among themselves is not this test's."""
    with RedisServer() as a, RedisServer() as b, RedisServer() as c:
        nodes = (a, b, c)
        pools = [redis_py.ConnectionPool(port=s.port, socket_timeout=5) for s in nodes]
        clients = [redis_py.Redis(connection_pool=p) for p in pools]
        holder = Lock([s.url for s in nodes], "held-q", ttl=30)
        assert holder.acquire(blocking=False)
        outcomes: list[bool] = []

        def wait() -> None:
            lock = Lock(clients, "held-q", ttl=30)
            outcomes.append(lock.acquire(timeout=20))
            lock.release()

        waiter = threading.Thread(target=wait)
        waiter.start()
        admin = a.client()  # the first node that answers PING carries the subscription
        wait_until(
            lambda: admin.pubsub_numsub(holder.keys.channel)[0][1] == 1,
            20,
            "the waiter to subscribe",
        )
        # It tries once more after it subscribed; then it holds nothing of the pool. (Before,
        # it held a connection of it for its subscription, for its whole wait.)
        wait_until(
            lambda: not pools[0]._in_use_connections,
            10,
            "the waiter to hold no connection of the node's client",
        )
        holder.release()
        waiter.join()
        admin.close()
        subscriber = subscriber_of(clients[0]).connection_pool
        for client in clients:
            client.close()
    assert outcomes == [True]
    assert subscriber is not pools[0] and subscriber.max_connections >= 2**31
