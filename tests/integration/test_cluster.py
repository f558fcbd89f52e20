"""Locks through ``redis+cluster://`` against a real 3-primary Redis Cluster.

Every key one script touches carries the lock's ``{hash tag}``, so each script runs in one slot;
a CROSSSLOT error would fail these tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import redis as redis_py
import redis.asyncio
from celery import Celery
from click.testing import CliRunner

from celery_redlock import Lock, LockedTask, LockUnavailable, current_lock, lock_key
from celery_redlock._celery.checks import run_startup_checks
from celery_redlock._redis.inventory import Inventory, Released
from celery_redlock._redis.keys import keys_for
from celery_redlock._redis.lock import release_attempt
from celery_redlock.asyncio import Lock as AsyncLock
from celery_redlock.cli import redlock
from celery_redlock.testing import RedisServer, wait_until
from celery_redlock.web._core import Dashboard
from support.apps import make_app
from support.servers import ClusterNodes, client
from support.workers import running_worker


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterNodes]:
    with ClusterNodes() as nodes:
        yield nodes


@pytest.fixture
def rc(cluster: ClusterNodes) -> Iterator[redis_py.RedisCluster]:
    """A cluster client of the test's own, emptied before the test."""
    c = redis_py.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    c.flushall(target_nodes=redis_py.RedisCluster.PRIMARIES)
    yield c
    c.close()


def owner_port(rc: redis_py.RedisCluster, key: str) -> int:
    node = rc.get_node_from_key(key)
    assert node is not None
    return int(node.port)


def test_every_script_runs_in_one_slot_on_the_nodes_owning_it(
    cluster: ClusterNodes, rc: redis_py.RedisCluster
) -> None:
    # Names chosen so that their slots spread over all three primaries.
    names = [f"job-{i}" for i in range(12)]
    ports = {owner_port(rc, keys_for("redlock", n).lock) for n in names}
    assert ports == {n.port for n in cluster.nodes}
    for name in names:
        keys = keys_for("redlock", name)
        slots = {
            rc.keyslot(k) for k in (keys.lock, keys.fence, keys.channel, keys.waiters, *keys.slots)
        }
        assert len(slots) == 1, (name, slots)

        lock = Lock(cluster.url, name, ttl=10, owner="task-1", host="w1")
        assert lock.acquire(blocking=False)
        assert lock.token is not None
        c = client(owner_port(rc, lock.key))
        try:
            assert c.get(lock.key) == lock.token.encode()
            assert lock.fencing_token and not c.exists(keys.fence)  # read, no counter kept
        finally:
            c.close()
        assert lock.locked()
        lock.extend(20)
        assert 19.0 < (lock.remaining_ttl() or 0) <= 20.0
        assert not Lock(cluster.url, name, ttl=10).acquire(blocking=False)
        lock.release()
        assert rc.exists(lock.key) == 0

    lock = Lock(cluster.url, "job-0", ttl=10, owner="task-1", host="w1")
    assert lock.acquire(blocking=False)
    assert release_attempt(cluster.url, "job-0", "redlock", "task-1", "w1", os.getpid())
    assert rc.exists(lock.key) == 0


def elsewhere(rc: redis_py.RedisCluster, port: int) -> str:
    """A lock name whose key lives on another node than the one on ``port``."""
    return next(
        f"moved-{i}"
        for i in range(100)
        if owner_port(rc, keys_for("redlock", f"moved-{i}").lock) != port
    )


def test_a_plain_url_naming_one_cluster_node_is_unavailable_naming_the_cluster_scheme(
    cluster: ClusterNodes, rc: redis_py.RedisCluster
) -> None:
    """``redlock_url="redis://node-1"`` of a Cluster: a key of another node's slot failed with
    a raw ``MovedError: 14035 127.0.0.1:7002`` (Celery: "raised unexpected"), outside the
    ``redlock_on_unavailable`` policy. It is a refusal, which says what to use."""
    first = cluster.nodes[0]
    name = elsewhere(rc, first.port)
    with pytest.raises(LockUnavailable) as info:
        Lock(f"redis://127.0.0.1:{first.port}/0", name, ttl=10).acquire(blocking=False)
    said = str(info.value)
    assert f"refused lock {keys_for('redlock', name).lock}: MOVED " in said
    assert "for a Cluster, use a redis+cluster:// URL" in said


def test_a_cluster_client_listed_as_a_quorum_node_is_refused(
    cluster: ClusterNodes, rc: redis_py.RedisCluster, redis_server: RedisServer
) -> None:
    """Refused as a ``redis+cluster://`` URL in the list is: every lock operation failed with
    an ``AttributeError`` of the Cluster client."""
    import redis.asyncio as aioredis

    import celery_redlock.asyncio

    ports = (redis_server.port, cluster.nodes[0].port)
    with pytest.raises(ValueError, match="a RedisCluster client is a Redis Cluster"):
        Lock([*(client(port) for port in ports), rc], "job")
    aio = aioredis.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    with pytest.raises(ValueError, match="a RedisCluster client is a Redis Cluster"):
        celery_redlock.asyncio.Lock([*(aioredis.Redis(port=port) for port in ports), aio], "job")


def test_fencing_tokens_increase(cluster: ClusterNodes, rc: redis_py.RedisCluster) -> None:
    tokens: list[int] = []
    for _ in range(5):
        with Lock(cluster.url, "job", ttl=10) as lock:
            assert lock.fencing_token is not None
            tokens.append(lock.fencing_token)
    assert tokens == sorted(set(tokens))


@contextlib.contextmanager
def migrating(cluster: ClusterNodes, rc: redis_py.RedisCluster, key: str) -> Iterator[int]:
    """``key``'s slot marked MIGRATING to another primary, no key moved (a reshard stopped
    part-way), then made stable again; yields the port that still holds it."""
    slot = rc.keyslot(key)
    source = owner_port(rc, key)
    target = next(node.port for node in cluster.nodes if node.port != source)
    ids = {port: client(port).cluster("myid") for port in (source, target)}
    try:
        client(target).cluster("setslot", slot, "importing", ids[source])
        client(source).cluster("setslot", slot, "migrating", ids[target])
        yield source
    finally:
        for port in (source, target):
            client(port).cluster("setslot", slot, "stable")


def test_a_lock_whose_slot_is_left_migrating_is_still_extended(
    cluster: ClusterNodes, rc: redis_py.RedisCluster
) -> None:
    """Cluster probe, session 30: a reshard that stopped part-way leaves the lock's slot
    MIGRATING, its key not moved. The extend named the waiter queue and the release channel
    among its keys; they do not exist, and Redis answered every renewal TRYAGAIN: the lease
    ran out and a contender took the lock beside its running holder (at 2.03 s of a 2 s
    lease). Now only the slot keys are its keys, and the extend goes through, in both
    drivers."""
    holder = Lock(cluster.url, "migrating", ttl=10)
    assert holder.acquire(blocking=False)
    with migrating(cluster, rc, holder.key) as port:
        holder.extend(20)
        assert 10_000 < client(port).pttl(holder.key) <= 20_000
        contender = Lock(cluster.url, "migrating", ttl=10)
        with contextlib.suppress(LockUnavailable):  # 6.2: an acquire is a script of 3 keys
            assert not contender.acquire(blocking=False)
        assert not contender.held
    holder.release()

    async def extend_in_asyncio() -> None:
        nodes = redis.asyncio.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
        try:
            lock = AsyncLock(nodes, "migrating", ttl=10)
            assert await lock.acquire(blocking=False)
            with migrating(cluster, rc, lock.key) as port:
                await lock.extend(20)
                assert 10_000 < client(port).pttl(lock.key) <= 20_000
            await lock.release()
        finally:
            await nodes.aclose()

    asyncio.run(extend_in_asyncio())


def test_a_lock_whose_slot_is_left_migrating_is_released(
    cluster: ClusterNodes, rc: redis_py.RedisCluster
) -> None:
    """Cluster probe, session 30, left open then: the release scripts (the holder's, the
    worker's release of a dead child's attempt, ``celery redlock release``) named the release
    channel and the waiter queue among their keys; Redis answered TRYAGAIN while the lock's
    slot was left MIGRATING, and the key stayed until its TTL ended. Now each is released at
    once, in both drivers."""
    holder = Lock(cluster.url, "migrating-release", ttl=30)
    child = Lock(cluster.url, "migrating-attempt", ttl=30, owner="t-9", host="w9@host")
    held = Lock(cluster.url, "migrating-operator", ttl=30)
    assert holder.acquire(blocking=False) and child.acquire(blocking=False)
    assert held.acquire(blocking=False)
    # Each key has 30 s to live: gone once its slot is stable again, it was released. (Read
    # while the slot migrates, a key that is not there is answered ASK.)
    with migrating(cluster, rc, holder.key):
        holder.release()
    assert not rc.exists(holder.key)
    with migrating(cluster, rc, child.key):
        pid = os.getpid()
        assert release_attempt(cluster.url, "migrating-attempt", "redlock", "t-9", "w9@host", pid)
    assert not rc.exists(child.key)
    inventory = Inventory(cluster.url, "redlock")
    found = inventory.read(held.key)
    assert found is not None
    with migrating(cluster, rc, held.key):
        assert inventory.release(found, unless_renewed=True) is Released.RELEASED
    assert not rc.exists(held.key)

    async def release_in_asyncio() -> None:
        nodes = redis.asyncio.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
        try:
            lock = AsyncLock(nodes, "migrating-release", ttl=30)
            assert await lock.acquire(blocking=False)
            with migrating(cluster, rc, lock.key):
                await lock.release()
            assert not rc.exists(lock.key)
        finally:
            await nodes.aclose()

    asyncio.run(release_in_asyncio())


def test_blocking_acquire_is_woken_by_the_release(
    cluster: ClusterNodes, rc: redis_py.RedisCluster
) -> None:
    """The release publishes from the node owning the slot; the waiter is subscribed through
    whichever node the cluster client picked (Redis Cluster broadcasts PUBLISH)."""
    for name in ("job-1", "job-2", "job-3"):
        holder = Lock(cluster.url, name, ttl=30)
        assert holder.acquire(blocking=False)
        waiter = Lock(cluster.url, name, ttl=10)
        releaser = threading.Timer(0.2, holder.release)
        releaser.start()
        start = time.monotonic()
        assert waiter.acquire(timeout=5)
        assert time.monotonic() - start < 2.0  # the notification, not the 30 s TTL
        releaser.join()
        waiter.release()


def test_the_startup_check_names_each_primary_it_read(
    cluster: ClusterNodes, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """It logged "locks on Redis 7.0.15 at redis+cluster://..." once per primary, word for
    word: three identical lines naming no node."""
    app = make_app(redis_server, "cluster-check", redlock_url=cluster.url)

    @app.task(base=LockedTask, shared=False)
    def checked() -> None:
        """A locked task, so that the checks run."""

    with caplog.at_level(logging.INFO, logger="celery_redlock.worker"):
        run_startup_checks(app, True)
    lines = [
        r.getMessage() for r in caplog.records if "celery_redlock: locks on Redis" in r.getMessage()
    ]
    assert len(lines) == len(set(lines)) == len(cluster.nodes)
    for node in cluster.nodes:
        assert sum(f"(primary 127.0.0.1:{node.port})" in line for line in lines) == 1


def test_the_startup_check_of_a_plain_url_naming_a_cluster_node_says_so(
    cluster: ClusterNodes, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Once MOVED was a refusal, the dry run took each redirected command for the ACL's
    doing: "refuses commands this package needs: SET, GET, ...; grant them to the ACL user".
    A WARNING, not an ERROR: a Cluster of one primary serves every slot."""
    url = f"redis://127.0.0.1:{cluster.nodes[0].port}/0"
    app = make_app(redis_server, "cluster-plain", redlock_url=url)

    @app.task(base=LockedTask, shared=False)
    def checked() -> None:
        """A locked task, so that the checks run."""

    with caplog.at_level(logging.INFO, logger="celery_redlock.worker"):
        run_startup_checks(app, True)
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    said = [r.getMessage() for r in caplog.records if "node of a Redis Cluster" in r.getMessage()]
    assert len(said) == 1 and f"the lock Redis at {url} is a node of a Redis Cluster" in said[0]
    assert "that serves 5461 of its 16384 slots" in said[0], said
    assert "use a redis+cluster:// URL" in said[0]
    assert "grant" not in caplog.text


def _cli(app: Celery, *args: str) -> Any:
    return CliRunner().invoke(redlock, list(args), obj=SimpleNamespace(app=app))


def test_the_command_line_refuses_a_plain_url_naming_one_cluster_node(
    cluster: ClusterNodes, rc: redis_py.RedisCluster
) -> None:
    """Probe: with locks on every primary, ``ls``, ``stats`` and ``release --dead`` through
    ``redis://<one node>`` listed (and judged) that node's locks only, and exited 0; ``inspect``
    of a key on another node said "caused error: 15169 127.0.0.1:7002". Each now fails,
    naming the Cluster and the URL to use, as the worker's startup check does (one check)."""
    locks = [Lock(cluster.url, f"spread-{i}", ttl=60) for i in range(12)]
    assert len({owner_port(rc, lock.key) for lock in locks}) == len(cluster.nodes)
    for lock in locks:
        assert lock.acquire(blocking=False)
    first = cluster.nodes[0]
    elsewhere = next(lock.key for lock in locks if owner_port(rc, lock.key) != first.port)
    app = Celery("plain-node", set_as_current=False)
    app.conf.redlock_url = f"redis://127.0.0.1:{first.port}/0"
    try:
        for args in (
            ["ls"],
            ["ls", "--json"],
            ["stats"],
            ["release", "--dead"],
            ["inspect", elsewhere],
        ):
            done = _cli(app, *args)
            assert done.exit_code == 1, (args, done.output)
            assert (
                f"the lock Redis at redis://127.0.0.1:{first.port}/0 is a node of a Redis "
                "Cluster that serves 5461 of its 16384 slots" in done.output
            ), (args, done.output)
            assert "for a Cluster, use a redis+cluster:// URL" in done.output, (args, done.output)
        whole = Celery("whole-cluster", set_as_current=False)
        whole.conf.redlock_url = cluster.url  # the Cluster's own URL lists them all
        listed = json.loads(_cli(whole, "ls", "--json").output)
        assert sorted(row["key"] for row in listed) == sorted(lock.key for lock in locks)
        whole.close()
    finally:
        app.close()
        for lock in locks:
            lock.release()


def test_one_inventory_of_a_plain_url_naming_a_cluster_node_refuses_every_time(
    cluster: ClusterNodes,
) -> None:
    """Review, round 3: the dashboard keeps one inventory for its life; its first page view
    was refused, and each later one listed the node's own locks only, as before the check."""
    inventory = Inventory(f"redis://127.0.0.1:{cluster.nodes[0].port}/0", "redlock")
    for _ in range(3):
        with pytest.raises(LockUnavailable, match="is a node of a Redis Cluster that serves"):
            inventory.all()


def test_a_plain_url_whose_slots_cannot_be_counted_is_refused_too(cluster: ClusterNodes) -> None:
    """Review, round 3: ``CLUSTER NODES`` refused (an ACL without ``+cluster``): whatever part
    of the slots the node serves, a listing through it leaves out other nodes' locks or is
    refused (``CROSSSLOT``, even on a Cluster of one primary); refused, every time."""
    for node in cluster.nodes:
        node.client().execute_command(
            "ACL", "SETUSER", "nocluster", "on", ">pw", "~*", "&*", "+@all", "-cluster"
        )
    inventory = Inventory(f"redis://nocluster:pw@127.0.0.1:{cluster.nodes[0].port}/0", "redlock")
    for _ in range(2):
        with pytest.raises(LockUnavailable, match="serves an unknown part of its 16384 slots"):
            inventory.all()


def test_a_pipelined_read_moved_away_says_moved_and_what_to_use(
    cluster: ClusterNodes, rc: redis_py.RedisCluster
) -> None:
    """An ACL user without ``+info`` skips the check by ``INFO``: a read of a key on another
    node is refused with MOVED. redis-py's pipeline wraps the reply as "Command # 1 (MGET ...)
    of pipeline caused error: 15169 127.0.0.1:7002", which named neither MOVED nor the fix."""
    for node in cluster.nodes:
        node.client().execute_command(
            "ACL", "SETUSER", "noinfo", "on", ">pw", "~*", "&*", "+@all", "-info"
        )
    first = cluster.nodes[0]
    name = elsewhere(rc, first.port)
    with pytest.raises(LockUnavailable) as info:
        Inventory(f"redis://noinfo:pw@127.0.0.1:{first.port}/0", "redlock").read(name)
    said = str(info.value)
    assert "of pipeline caused error: MOVED " in said, said
    assert said.endswith(
        "(a Redis Cluster node serves its own slots only: for a Cluster, use a "
        "redis+cluster:// URL)"
    ), said
    assert "pw@" not in said


def test_locked_task_with_the_cluster_as_redlock_url(
    cluster: ClusterNodes, rc: redis_py.RedisCluster, redis_server: RedisServer
) -> None:
    """Broker and results on a plain server, locks in the cluster."""
    redis_server.client().flushall()
    app = make_app(redis_server, "cluster", redlock_url=cluster.url)
    entered, gate = threading.Event(), threading.Event()

    @app.task(base=LockedTask, lock_by=["key"], lock_on_contention="skip")
    def work(key: str, hold: bool = False) -> dict[str, object] | None:
        lock = current_lock()
        assert lock is not None
        if hold:
            entered.set()
            assert gate.wait(10)
        return {"key": lock.key, "token": lock.fencing_token, "value": rc.get(lock.key)}

    with running_worker(app, concurrency=2):
        first = work.delay("a", hold=True)
        assert entered.wait(10)
        assert rc.exists(lock_key(work, "a")) == 1
        assert work.delay("a").get(timeout=10) is None  # skipped: held in the cluster
        other = work.delay("b").get(timeout=10)  # another key, maybe another node
        assert other["key"] == lock_key(work, "b")
        gate.set()
        result = first.get(timeout=10)
        assert result["key"] == lock_key(work, "a")
        assert result["value"] is not None
        again = work.delay("a").get(timeout=10)
        assert again["token"] > result["token"]
    assert rc.exists(lock_key(work, "a"), lock_key(work, "b")) == 0


def test_a_cluster_that_stops_answering_is_unavailable() -> None:
    """A primary down (its slots: no answer; soon CLUSTERDOWN everywhere, as the cluster requires
    full coverage by default), then every node down: LockUnavailable, never a bare redis-py
    cluster error, for acquire, extend and release."""
    with ClusterNodes() as nodes:
        rc = redis_py.RedisCluster(host="127.0.0.1", port=nodes.nodes[0].port)
        try:
            by_port: dict[int, str] = {}
            for name in (f"job-{i}" for i in range(12)):
                by_port.setdefault(owner_port(rc, keys_for("redlock", name).lock), name)
        finally:
            rc.close()
        first, second, third = nodes.nodes
        held = Lock(nodes.url, by_port[second.port], ttl=10)
        assert held.acquire(blocking=False)

        first.stop()
        with pytest.raises(LockUnavailable) as info:
            Lock(nodes.url, by_port[first.port], ttl=10).acquire(blocking=False)
        assert f"127.0.0.1:{first.port}" in str(info.value)

        second.stop()
        third.stop()
        with pytest.raises(LockUnavailable):
            Lock(nodes.url, by_port[third.port], ttl=10).acquire(blocking=False)
        with pytest.raises(LockUnavailable):
            held.extend()
        with pytest.raises(LockUnavailable):
            held.release()


def test_a_node_whose_port_was_taken_meanwhile_starts_on_a_new_pair() -> None:
    """The timeline of a parallel run: this cluster's node checks its port pair free, another
    test's server binds that port, then the node starts. The node gets a new pair and the
    cluster forms, on ports no ``bind(0)`` or outgoing connection is given."""
    nodes = ClusterNodes()
    taken = nodes.nodes[1].port
    with RedisServer(port=taken) as other, nodes:
        assert nodes.nodes[1].port != taken
        assert all(node.port + 10000 < 32768 for node in nodes.nodes)
        rc = redis_py.RedisCluster(host="127.0.0.1", port=nodes.nodes[1].port)
        try:
            assert rc.set("{x}k", "v") and rc.get("{x}k") == b"v"
        finally:
            rc.close()
        assert other.client().dbsize() == 0


class _Counted(Lock):
    """A lock that counts its renewals (the watchdog's ``renew_step``)."""

    renewals = 0

    def renew_step(self) -> float | None:
        delay = super().renew_step()
        self.renewals += 1
        return delay


def test_locks_on_live_primaries_keep_their_lease_while_another_primary_is_dead() -> None:
    """Full coverage off: with one primary dead, the others serve their slots. The process's
    renewal thread renewed its locks one at a time; each renewal of a key on the dead node
    blocked about 4.5 s in the Cluster client's retries (redis-py's default), so with three
    such locks the locks on the live primaries went unrenewed past their 3 s lease. Now a
    renewal on the dead node fails at once, and the others are renewed on time."""
    with ClusterNodes(extra=["--cluster-require-full-coverage", "no"]) as nodes:
        rc = redis_py.RedisCluster(host="127.0.0.1", port=nodes.nodes[0].port)
        try:
            by_port: dict[int, list[str]] = {}
            for name in (f"live-{i}" for i in range(60)):
                by_port.setdefault(owner_port(rc, keys_for("redlock", name).lock), []).append(name)
            dead, *live = nodes.nodes
            # A task's lock (its name and an argument digest) in the dead primary's slots,
            # while its bare name's key is in a live one's: ``inspect`` reads that, then lists.
            task = next(
                f"gone.task{i}"
                for i in range(100)
                if owner_port(rc, keys_for("redlock", f"gone.task{i}").lock) != dead.port
            )
            digest = next(
                f"{i:032x}"
                for i in range(1000)
                if owner_port(rc, keys_for("redlock", f"{task}:{i:032x}").lock) == dead.port
            )
        finally:
            rc.close()
        gone = Lock(nodes.url, f"{task}:{digest}", ttl=60)
        assert gone.acquire(blocking=False)
        doomed = [_Counted(nodes.url, n, ttl=3, auto_renew=True) for n in by_port[dead.port][:3]]
        kept = [
            _Counted(nodes.url, n, ttl=3, auto_renew=True)
            for node in live
            for n in by_port[node.port][:2]
        ]
        for lock in doomed + kept:
            assert lock.acquire(blocking=False)
        dead.stop()
        since = [lock.renewals for lock in kept]
        wait_until(lambda: all(lock.lost for lock in doomed), 15, "the dead node's locks lost")
        wait_until(
            lambda: all(lk.renewals >= n + 4 for lk, n in zip(kept, since, strict=True)),
            15,
            "four renewals of every lock on a live primary",
        )
        assert not any(lock.lost for lock in kept)
        # The command line lists the live primaries' locks, naming the dead one on stderr
        # (it failed as a whole: "cannot reach the lock Redis").
        app = Celery("partial", set_as_current=False)
        app.conf.redlock_url = nodes.url
        done = CliRunner().invoke(redlock, ["ls", "--json"], obj=SimpleNamespace(app=app))
        assert done.exit_code == 0, done.output
        warned = re.findall(r"WARNING: [^\n]*\n", done.output)  # stderr, within a line
        listed = json.loads(re.sub(r"WARNING: [^\n]*\n", "", done.output))
        assert sorted(row["key"] for row in listed) == sorted(lock.key for lock in kept)
        assert len(warned) == 1 and f"Cluster primary 127.0.0.1:{dead.port}" in warned[0]
        status, body = Dashboard(app).locks_page({}, {"csrf_token": "x"})  # and the dashboard
        assert status == 200 and all(lock.key in body for lock in kept)
        assert f"Cluster primary 127.0.0.1:{dead.port} did not answer" in body
        # Probe: "gone.task is not held (no lock has that key, lock name or task name)", as
        # certain, of a lock that lived in the dead primary's slots.
        for args, said in (
            ([task], f"{task} is not held on the Cluster primaries that answer (no lock has"),
            (["--task-id", "t-x"], "task t-x holds no lock on the Cluster primaries that answer"),
        ):
            done = CliRunner().invoke(redlock, ["inspect", *args], obj=SimpleNamespace(app=app))
            assert done.exit_code == 1, done.output
            assert said in done.output, done.output
            assert done.output.endswith(
                f"; 127.0.0.1:{dead.port} did not answer: the locks in its slots are not seen\n"
            ), done.output
        # The counters live on every primary: `stats` needs them all (docs/operations.md).
        done = CliRunner().invoke(redlock, ["stats"], obj=SimpleNamespace(app=app))
        assert done.exit_code == 1 and "cannot reach the lock Redis" in done.output, done.output
        assert f"127.0.0.1:{dead.port}. Connection refused" in done.output, done.output
        app.close()
        for lock in kept:
            assert lock.locked()
            lock.release()
