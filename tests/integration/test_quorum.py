"""Redlock over five independent ``redis-server`` processes (the quorum of
:class:`celery_redlock._redis.nodes.Quorum`).

Nodes are stopped with SIGKILL and restarted empty (no persistence), as a crashed node would
be. Every check of what a node holds reads that node directly.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_redlock import Lock, LockedTask, LockUnavailable, current_lock, lock_key
from celery_redlock._redis import companions
from celery_redlock._redis.keys import keys_for
from celery_redlock._redis.lock import release_attempt
from celery_redlock._redis.nodes import Quorum
from celery_redlock.testing import RedisServer, wait_until
from support.apps import make_app
from support.servers import DelayProxy, client
from support.workers import running_worker

N = 5


@pytest.fixture
def nodes() -> Iterator[list[RedisServer]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(RedisServer()) for _ in range(N)]


def urls(servers: list[RedisServer]) -> list[str]:
    return [s.url for s in servers]


def name_of(server: RedisServer) -> str:
    return f"127.0.0.1:{server.port}"


def on_node(server: RedisServer, *command: Any) -> Any:
    c = client(server.port)
    try:
        return c.execute_command(*command)
    finally:
        c.close()


def values(servers: list[RedisServer], key: str) -> list[bytes | None]:
    """The value of ``key`` on each node (all must be running)."""
    return [on_node(s, "GET", key) for s in servers]


# -- the algorithm on healthy nodes -------------------------------------------------------------


def test_acquire_extend_release_reach_every_node(nodes: list[RedisServer]) -> None:
    lock = Lock(urls(nodes), "job", ttl=10)
    assert lock.acquire(blocking=False)
    assert lock.token is not None
    assert values(nodes, lock.key) == [lock.token.encode()] * N
    fences = values(nodes, keys_for("redlock", "job").fence)
    assert fences == [str(lock.fencing_token).encode()] * N  # the quorum agreed on one token
    assert lock.locked()
    assert 9.0 < (lock.remaining_ttl() or 0) <= 10.0

    lock.extend(60)
    assert all(50_000 < on_node(s, "PTTL", lock.key) <= 60_000 for s in nodes)
    assert 59.0 < (lock.remaining_ttl() or 0) <= 60.0

    lock.release()
    assert values(nodes, lock.key) == [None] * N
    assert not lock.locked()


def test_acquire_costs_one_round_trip_not_n(nodes: list[RedisServer]) -> None:
    """Each node sits behind a proxy adding 100 ms each way: one round trip is 200 ms, and a
    node-after-node acquire would take 5 x 200 ms. A release nobody waits for is one too: it
    wakes the waiters in a second round trip only when a node has them (``Quorum.release``)."""
    with contextlib.ExitStack() as stack:
        proxies = [stack.enter_context(DelayProxy(s.port, 0.0)) for s in nodes]
        targets = [p.url for p in proxies]
        warm = Lock(targets, "warm", ttl=10)  # connect and load the scripts without delay
        assert warm.acquire(blocking=False)
        warm.release()
        for proxy in proxies:
            proxy.delay = 0.1
        acquires, releases = [], []
        for _ in range(3):
            lock = Lock(targets, "job", ttl=10)
            start = time.monotonic()
            assert lock.acquire(blocking=False)
            acquires.append(time.monotonic() - start)
            start = time.monotonic()
            lock.release()
            releases.append(time.monotonic() - start)
    assert 0.2 <= min(acquires) < 0.35, acquires
    assert 0.2 <= min(releases) < 0.35, releases


def test_minority_is_released_everywhere_and_reports_contention(
    nodes: list[RedisServer],
) -> None:
    other = Lock(urls(nodes[:3]), "job", ttl=10, owner="task-A", host="w1")
    assert other.acquire(blocking=False)  # holds nodes 0, 1, 2 (a quorum of its own)

    lock = Lock(urls(nodes), "job", ttl=10, owner="task-B")
    assert not lock.acquire(blocking=False)  # wins 3 and 4 only
    assert lock.last_holder is not None
    assert (lock.last_holder.task_id, lock.last_holder.host) == ("task-A", "w1")
    assert lock.last_holder_ttl is not None and 9.0 < lock.last_holder_ttl <= 10.0
    assert other.token is not None
    assert values(nodes, lock.key) == [other.token.encode()] * 3 + [None, None]
    other.release()


def test_validity_time_spent_means_not_acquired_and_released_everywhere(
    nodes: list[RedisServer],
) -> None:
    """All nodes grant, but the injected clock says the round took the whole TTL."""
    ticks = iter([100.0, 130.0])
    clients = [client(s.port) for s in nodes]
    try:
        quorum = Quorum(clients, clock=lambda: next(ticks))
        result = quorum.acquire(keys_for("redlock", "job"), "token-1", 30_000)
    finally:
        for c in clients:
            c.close()
    assert not result.acquired
    assert result.holder is None  # nobody else holds it: the time ran out
    assert values(nodes, "redlock:{job}") == [None] * N


def test_an_error_reply_counts_as_one_failed_node(nodes: list[RedisServer]) -> None:
    """A node out of memory refuses the script: the other four still make a quorum, and every
    reply is read, so no connection is left behind with an unread reply."""
    warm = Lock(urls(nodes), "warm", ttl=10)
    assert warm.acquire(blocking=False)
    warm.release()
    on_node(nodes[1], "CONFIG", "SET", "maxmemory", "1")
    for _ in range(10):
        lock = Lock(urls(nodes), "job", ttl=10)
        assert lock.acquire(blocking=False)
        assert lock.token is not None
        held = values(nodes, lock.key)
        assert held[1] is None and held.count(lock.token.encode()) == N - 1
        lock.release()
    for server in nodes:  # the lock's pool plus this check's own connection
        assert int(on_node(server, "INFO", "clients")["connected_clients"]) <= 3


def test_fencing_tokens_increase_through_lagging_and_stopped_nodes(
    nodes: list[RedisServer],
) -> None:
    fence = keys_for("redlock", "job").fence
    tokens = []

    def take() -> int:
        lock = Lock(urls(nodes), "job", ttl=10)
        assert lock.acquire(blocking=False)
        token = lock.fencing_token
        lock.release()
        assert token is not None
        tokens.append(token)
        return token

    take()
    # Node 0 saw acquisitions the others did not: its counter is far ahead.
    on_node(nodes[0], "SET", fence, str(tokens[0] + 10**9))
    ahead = take()
    assert ahead == tokens[0] + 10**9 + 1
    # The quorum wrote the token back to the nodes that returned a smaller one...
    assert values(nodes, fence) == [str(ahead).encode()] * N
    # ...so with node 0 gone the next token is still larger,
    nodes[0].stop()
    take()
    # and with node 0 back empty and two others gone, too.
    nodes[0].start()
    nodes[1].stop()
    nodes[2].stop()
    take()
    assert tokens == sorted(set(tokens)), tokens


def test_fencing_tokens_increase_when_the_shared_node_of_two_majorities_restarted_empty(
    nodes: list[RedisServer],
) -> None:
    """Three nodes A, B, C, one down at a time, within one second of the servers' clock:
    (1) a token T0 is written on all three; (2) B misses three acquisitions (its key is held by
    another owner) that hand out T0+1..T0+3 on A and C; (3) C restarts empty; (4) with A down,
    the next acquisition is granted by B and C. C counted its token in whole seconds: B's T0+1
    won, below T0+3. A node with no mark in the slot counts in microseconds, past every
    token handed out earlier in that second. A run that crossed a second is done again (the
    whole-second token of the new second was larger anyway)."""
    a, b, c = nodes[:3]
    same_second = 0
    for attempt in range(5):
        name = f"shared-{attempt}"
        wait_until(lambda: on_node(b, "TIME")[1] < 300_000, 2, "the start of a second")
        first = Lock(urls([a, b, c]), name, ttl=30)
        assert first.acquire(blocking=False)
        t0 = first.fencing_token
        first.release()
        on_node(b, "SET", first.key, "another-owner", "PX", 30_000)
        later = []
        for _ in range(3):
            lock = Lock(urls([a, b, c]), name, ttl=30)
            assert lock.acquire(blocking=False)
            later.append(lock.fencing_token)
            lock.release()
        on_node(b, "DEL", first.key)
        c.restart()
        a.stop()
        try:
            last = Lock(urls([a, b, c]), name, ttl=30)
            assert last.acquire(blocking=False)
            token = last.fencing_token
            second = int(on_node(b, "TIME")[0])
            last.release()
        finally:
            a.start()
        assert t0 is not None and token is not None
        assert t0 < later[0] < later[1] < later[2] < token, (t0, later, token)
        same_second += second == t0 // 10**6
    assert same_second, "no attempt ran within one second of the servers' clock"


# -- failures -----------------------------------------------------------------------------------


def test_two_nodes_stopped_everything_works_without_overlap(nodes: list[RedisServer]) -> None:
    """Node 0 (where a blocking acquire subscribes first) and node 1 are down."""
    nodes[0].stop()
    nodes[1].stop()
    inside, overlaps, runs = [0], [], list[int]()
    guard = threading.Lock()

    def worker(n: int) -> None:
        for _ in range(5):
            with Lock(urls(nodes), "shared", ttl=10, timeout=10) as lock:
                with guard:
                    inside[0] += 1
                    if inside[0] > 1:
                        overlaps.append(n)
                    runs.append(lock.fencing_token or 0)
                lock.extend(10)  # 3 of 5 is a strict majority
                with guard:
                    inside[0] -= 1

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert overlaps == []
    assert len(runs) == 20
    assert runs == sorted(set(runs))  # taken one after the other, tokens increasing
    assert values(nodes[2:], "redlock:{shared}") == [None] * 3


def test_three_nodes_stopped_is_unavailable_naming_them_then_they_rejoin(
    nodes: list[RedisServer],
) -> None:
    held = Lock(urls(nodes), "held", ttl=10, owner="task-1", host="w1")
    assert held.acquire(blocking=False)
    down = nodes[:2] + nodes[3:4]
    for server in down:
        server.stop()
    names = [name_of(s) for s in down]

    with pytest.raises(LockUnavailable) as info:
        Lock(urls(nodes), "job", ttl=10).acquire(blocking=False)
    assert info.value.key == "redlock:{job}"
    assert sorted(info.value.nodes) == sorted(names)
    message = str(info.value)
    assert "3 of 5 nodes failed" in message and "3 needed" in message
    assert all(name in message for name in names)
    assert name_of(nodes[2]) not in message and name_of(nodes[4]) not in message

    with pytest.raises(LockUnavailable):
        held.extend()
    with pytest.raises(LockUnavailable):
        release_attempt(urls(nodes), "held", "redlock", "task-1", "w1", os.getpid())
    with pytest.raises(LockUnavailable):
        held.release()

    for server in down:
        server.start()  # back, empty
    lock = Lock(urls(nodes), "job", ttl=10)
    assert lock.acquire(blocking=False)
    assert lock.token is not None
    assert values(nodes, lock.key) == [lock.token.encode()] * N  # every node takes part again
    lock.release()
    assert values(nodes, lock.key) == [None] * N


def test_node_restarted_empty_does_not_let_a_second_holder_in(nodes: list[RedisServer]) -> None:
    holder = Lock(urls(nodes), "job", ttl=10)
    assert holder.acquire(blocking=False)
    nodes[2].restart()  # lost its copy of the lock
    assert values(nodes, holder.key).count(None) == 1

    second = Lock(urls(nodes), "job", ttl=10)
    assert not second.acquire(blocking=False)  # got the restarted node only
    assert not second.held
    assert values(nodes, holder.key)[2] is None  # and gave it back

    holder.extend()  # 4 of 5 still hold
    holder.release()
    assert second.acquire(blocking=False)
    second.release()


def renewals_seen(live: list[RedisServer], key: str, token: bytes, ttl_ms: int) -> None:
    """Watch ``key`` on every ``live`` node until each was renewed twice (its PTTL went up):
    the value stays ``token`` and the PTTL within ``ttl_ms`` all the while."""
    last: dict[int, int] = {}
    seen = dict.fromkeys(range(len(live)), 0)

    def renewed_twice() -> bool:
        assert values(live, key) == [token] * len(live)
        for i, server in enumerate(live):
            pttl = on_node(server, "PTTL", key)
            assert 0 < pttl <= ttl_ms
            if pttl > last.get(i, ttl_ms):
                seen[i] += 1
            last[i] = pttl
        return min(seen.values()) >= 2

    wait_until(renewed_twice, 10.0, f"two renewals of {key} on each of {len(live)} nodes")


def test_renewal_reaches_every_node_and_survives_two_stopped(nodes: list[RedisServer]) -> None:
    # A lease of 1 s, renewed every third: a renewal stalled 0.6 s by a loaded machine is
    # still in time. The watch counts renewals, not seconds.
    lock = Lock(urls(nodes), "renewed", ttl=1.0, auto_renew=True)
    assert lock.acquire(blocking=False)
    assert lock.token is not None
    token = lock.token.encode()
    try:
        renewals_seen(nodes, lock.key, token, 1000)
        nodes[0].stop()
        nodes[1].stop()
        renewals_seen(nodes[2:], lock.key, token, 1000)
        assert lock.held
        assert not lock.lost
    finally:
        lock.release()
    assert values(nodes[2:], lock.key) == [None] * 3


def test_release_attempt_reaches_every_node(nodes: list[RedisServer]) -> None:
    """The worker's main process releases for a dead child: owner-checked, on every node."""
    pid = os.getpid()
    lock = Lock(urls(nodes), "job", ttl=10, owner="task-1", host="w1")
    assert lock.acquire(blocking=False)
    assert not release_attempt(urls(nodes), "job", "redlock", "task-2", "w1", pid)
    assert values(nodes, lock.key).count(None) == 0
    assert release_attempt(urls(nodes), "job", "redlock", "task-1", "w1", pid)
    assert values(nodes, lock.key) == [None] * N

    nodes[0].stop()
    nodes[4].stop()
    lock = Lock(urls(nodes), "job", ttl=10, owner="task-1", host="w1")
    assert lock.acquire(blocking=False)
    assert release_attempt(urls(nodes), "job", "redlock", "task-1", "w1", pid, timeout=1.0)
    assert values(nodes[1:4], lock.key) == [None] * 3


# -- the newest-call marker (lock_enqueue="replace", lock_debounce) -----------------------------


@contextlib.contextmanager
def stalled(server: RedisServer) -> Iterator[None]:
    """``server`` frozen (SIGSTOP) inside the block: a node that stalls for a moment."""
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.process.pid, signal.SIGCONT)


def test_a_call_numbered_while_the_first_node_stalled_is_still_the_newest(
    nodes: list[RedisServer],
) -> None:
    """Helper probe, round 3: the marker lived on the first node that answered. Node 0
    stalled while B was published, so B was numbered and marked on node 1; once node 0
    answered again its marker named A. A ran too, and with node 1's clock behind node 0's
    (here: node 0's marker numbered by a clock 10 s ahead) B was superseded by A: the newest
    call dropped. The marker is on every node now, B is numbered above A on any majority,
    and A is superseded."""
    three, ttl = nodes[:3], 60_000
    keys = keys_for("redlock", "newest-stall")
    ahead = (time.time() + 10) * 1_000_000
    on_node(three[0], "HSET", keys.newest, "n", f"{ahead:.0f}")
    on_node(three[0], "PEXPIRE", keys.newest, ttl)
    a = companions.mark_newest(urls(three), keys, 0, 0, ttl)
    assert companions.confirm_newest(urls(three), keys, "A", a.seq)
    with stalled(three[0]):
        b = companions.mark_newest(urls(three), keys, 0, 0, ttl)
        assert companions.confirm_newest(urls(three), keys, "B", b.seq)
    assert b.seq > a.seq
    assert companions.check_newest(urls(three), keys, "B", b.seq, ttl) is None
    assert companions.check_newest(urls(three), keys, "A", a.seq, ttl) == "B"
    assert [on_node(s, "HGET", keys.newest, "id") for s in three] == [b"B"] * 3


def test_the_newest_call_marker_needs_a_majority(nodes: list[RedisServer]) -> None:
    """With two of three nodes down the call is not numbered: it is published unmarked (the
    caller's outage path), never numbered by one node alone; the error names the nodes."""
    three = nodes[:3]
    keys = keys_for("redlock", "newest-minority")
    three[1].stop()
    three[2].stop()
    with pytest.raises(LockUnavailable, match="2 of 3 nodes failed") as info:
        companions.mark_newest(urls(three), keys, 0, 0, 60_000)
    assert name_of(three[1]) in str(info.value) and name_of(three[2]) in str(info.value)


def test_newest_wins_through_a_stalled_first_node(
    nodes: list[RedisServer], redis_server: RedisServer
) -> None:
    """The probe's case through a worker: A queued, node 0 stalls while B is published, B's
    arguments run and A's do not."""
    three = nodes[:3]
    app: Celery = make_app(redis_server, "newest-quorum", redlock_url=urls(three))
    ran: list[str] = []

    @app.task(base=LockedTask, lock_enqueue="replace", lock_by=["account"], shared=False)
    def edit(account: int, value: str) -> str:
        ran.append(value)
        return value

    older = edit.delay(7, "older")
    with stalled(three[0]):
        newer = edit.delay(7, "newer")
    with running_worker(app):
        assert newer.get(timeout=20) == "newer"
        assert older.get(timeout=20) is None  # superseded: ends like a skip
    assert ran == ["newer"]


# -- through Celery -----------------------------------------------------------------------------


def test_locked_task_on_five_nodes(nodes: list[RedisServer], redis_server: RedisServer) -> None:
    """Broker and results on the session server; locks on the five nodes, two then three of
    them stopped, then all back."""
    redis_server.client().flushall()
    app: Celery = make_app(
        redis_server, "quorum", redlock_url=urls(nodes), redlock_on_unavailable="fail"
    )
    inside, overlaps = [0], []
    guard = threading.Lock()

    @app.task(base=LockedTask, lock_by=[], lock_on_contention="wait", lock_wait_timeout=20)
    def work(n: int) -> list[bool]:
        with guard:
            inside[0] += 1
            if inside[0] > 1:
                overlaps.append(n)
        key = lock_key(work, n)
        held = [bool(on_node(s, "EXISTS", key)) for s in nodes if s.process is not None]
        with guard:
            inside[0] -= 1
        return held

    with running_worker(app, concurrency=4):
        nodes[0].stop()
        nodes[3].stop()
        results = [work.delay(n) for n in range(8)]
        assert [r.get(timeout=30) for r in results] == [[True] * 3] * 8  # on every live node
        assert overlaps == []

        nodes[1].stop()
        with pytest.raises(LockUnavailable) as info:
            work.delay(99).get(timeout=30)
        assert "3 of 5 nodes failed" in str(info.value)
        for server in (nodes[0], nodes[1], nodes[3]):
            assert name_of(server) in str(info.value)

        for server in (nodes[0], nodes[1], nodes[3]):
            server.start()  # back, empty
        assert work.delay(100).get(timeout=30) == [True] * N


@pytest.mark.parametrize("policy", ["fail", "retry", "run"])
def test_three_stopped_follows_redlock_on_unavailable(
    nodes: list[RedisServer],
    redis_server: RedisServer,
    policy: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Through ``apply()`` (no worker): the engine's decision, not the transport, is tested."""
    app: Celery = make_app(
        redis_server,
        f"unavailable-{policy}",
        redlock_url=urls(nodes),
        redlock_on_unavailable=policy,
    )
    runs: list[bool] = []

    @app.task(base=LockedTask, max_retries=2, lock_retry_countdown=0)
    def work(key: str) -> str:
        runs.append(current_lock() is None)
        return "ran"

    for server in nodes[1:4]:
        server.stop()
    result = work.apply(("k",))
    if policy == "run":
        assert result.get() == "ran"
        assert runs == [True]  # ran, without a lock
    else:
        with pytest.raises(LockUnavailable) as info:
            result.get()
        assert all(name_of(s) in str(info.value) for s in nodes[1:4])
        assert runs == []  # never ran unlocked
        retried = [
            r
            for r in caplog.records
            if r.name == "celery_redlock.task" and "retrying" in r.getMessage()
        ]
        assert retried == []  # `fail`; and `retry` through apply(), which is never requeued
        shown = ", ".join(urls(nodes))  # not a Python tuple (helper probe, round 3)
        assert f"the lock Redis quorum at {shown} (redlock_url)" in caplog.text
        if policy == "retry":
            assert "an eager call is not retried" in caplog.text


def test_frozen_nodes_cost_one_node_timeout_per_round_not_one_each(
    nodes: list[RedisServer],
) -> None:
    """Two of five nodes frozen (SIGSTOP): a round times out on them and drops their
    connections, and each later round connected to them in turn, a node timeout (0.5 s)
    apiece, before its own deadline began: 1 s a round, so a 0.9 s lock, valid for 0.9 s
    less the round, was never acquired. They are now asked last, and not once the round's
    deadline has passed."""
    frozen = nodes[:2]
    lock = Lock(urls(nodes), "frozen-two", ttl=0.9)
    for server in frozen:
        assert server.process is not None
        os.kill(server.process.pid, signal.SIGSTOP)
    try:
        if lock.acquire(blocking=False):  # the first round finds out which nodes hang
            lock.release()
        for _ in range(2):
            assert lock.acquire(blocking=False)
            lock.release()
    finally:
        for server in frozen:
            assert server.process is not None
            os.kill(server.process.pid, signal.SIGCONT)


def test_a_node_that_failed_lately_is_still_asked_when_the_others_leave_no_majority(
    nodes: list[RedisServer],
) -> None:
    """Three nodes: node 0 froze during a lock and answers again (it failed lately); node 1's
    connections were dropped, then it froze. The round sent to node 1 first, whose connect
    hung the round's deadline away, and then did not ask node 0, healthy: 1 of 3 answered,
    and the lock was refused with a majority up. A node that failed lately is now asked
    past the deadline when the others sent to are no majority."""
    three = nodes[:3]
    lock = Lock(urls(three), "failed-lately", ttl=5)
    pids = [server.process.pid for server in three if server.process is not None]
    os.kill(pids[0], signal.SIGSTOP)
    try:
        assert lock.acquire(blocking=False)  # nodes 1 and 2; node 0 times out: failed lately
        lock.release()
    finally:
        os.kill(pids[0], signal.SIGCONT)
    on_node(three[1], "CLIENT", "KILL", "TYPE", "normal")
    os.kill(pids[1], signal.SIGSTOP)
    try:
        assert lock.acquire(blocking=False)  # nodes 0 and 2
        assert values([three[0], three[2]], lock.key) == [str(lock.token).encode()] * 2
        lock.release()
    finally:
        os.kill(pids[1], signal.SIGCONT)
