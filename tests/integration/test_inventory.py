"""The lock inventory (:mod:`celery_redlock._redis.inventory`) and ``celery redlock`` on a real
Redis: cursor pages over one server, a Cluster's primaries and a quorum's nodes; a quorum with
a node down; the release that never frees a renewed lease; prefixes with glob characters;
refused permissions.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis as redis_py
from celery import Celery
from click.testing import CliRunner, Result

from celery_redlock import Lock, LockedTask, LockLost, LockUnavailable, lock_key, metrics
from celery_redlock._redis import companions, probe
from celery_redlock._redis.inventory import (
    ROWS,
    HeldLock,
    Inventory,
    InventoryRefused,
    Marker,
    Released,
    ReleaseUnanswered,
    lease_age,
)
from celery_redlock._redis.keys import keys_for
from celery_redlock.cli import _commands as commands
from celery_redlock.cli import redlock
from celery_redlock.testing import RedisServer, wait_until
from celery_redlock.web._core import Dashboard
from support import ROOT
from support.apps import DownBroker, SilentBroker, brokerless_app, layout_app, make_app
from support.servers import ClusterNodes
from support.workers import running_worker
from tests.integration.test_web_inventory import renewing, task_name, warm_release_script


def run(app: Celery, *args: str) -> Result:
    return CliRunner().invoke(redlock, list(args), obj=SimpleNamespace(app=app))


def walk(inventory: Inventory, count: int, **filters: str) -> list[str]:
    """Every key the cursor lists, in order, ``count`` keys a step."""
    keys, cursor = [], "0"
    while True:
        page = inventory.page(cursor, count=count, **filters)
        keys += [lock.key for lock in page.locks]
        cursor = page.cursor
        if cursor == "0":
            return keys


def test_the_cursor_lists_every_lock_once_with_filters(redis_url: str) -> None:
    held = [Lock(redis_url, f"job-{i}", ttl=60, owner=f"t-{i % 3}") for i in range(40)]
    other = [Lock(redis_url, f"other-{i}", ttl=60, owner="t-0") for i in range(5)]
    for lock in held + other:
        assert lock.acquire(blocking=False)
    inventory = Inventory(redis_url, "redlock")
    listed = walk(inventory, 7)
    assert sorted(listed) == sorted(lock.key for lock in held + other)  # each once
    assert sorted(walk(inventory, 7, name_prefix="job-")) == sorted(lock.key for lock in held)
    mine = walk(inventory, 100, task_id="t-0")
    by_t0 = [lock.key for i, lock in enumerate(held) if i % 3 == 0] + [lk.key for lk in other]
    assert sorted(mine) == sorted(by_t0)
    assert inventory.of_lock_name("job-3")[0].key == held[3].key
    with pytest.raises(ValueError, match="not an inventory cursor"):
        inventory.page("9:0")


def test_the_cursor_walks_every_cluster_primary() -> None:
    with ClusterNodes() as cluster:
        locks = [Lock(cluster.url, f"job-{i}", ttl=60) for i in range(60)]
        for lock in locks:
            assert lock.acquire(blocking=False)
        inventory = Inventory(cluster.url, "redlock")
        listed = walk(inventory, 5)
        assert sorted(listed) == sorted(lock.key for lock in locks)
        cursors = set()
        page = inventory.page(count=5)
        while page.cursor != "0":
            cursors.add(page.cursor.partition(":")[0])
            page = inventory.page(page.cursor, count=5)
        assert cursors == {"0", "1", "2"}  # the three primaries in turn


def test_a_quorum_lock_is_listed_once_by_the_first_node_holding_it() -> None:
    with RedisServer() as a, RedisServer() as b, RedisServer() as c:
        urls = [a.url, b.url, c.url]
        locks = [Lock(urls, f"q-{i}", ttl=60) for i in range(10)]
        for lock in locks:
            assert lock.acquire(blocking=False)
        a.client().delete(locks[0].key)  # held by b and c: listed by b
        inventory = Inventory(urls, "redlock")
        assert sorted(walk(inventory, 3)) == sorted(lock.key for lock in locks)


def test_a_quorum_newest_call_marker_is_listed_once_and_cleared_on_every_node() -> None:
    """The newest-call marker is on every node of a quorum, each copy numbered by its node's
    clock: walked node by node, it was listed three times, and Clear, which compares the
    fingerprint of the copy shown, deleted one copy and left two to supersede calls."""
    with RedisServer() as a, RedisServer() as b, RedisServer() as c:
        urls = [a.url, b.url, c.url]
        keys = keys_for("redlock", "edits")
        for marked in ("old", "new"):
            seq = companions.mark_newest(urls, keys, 0, 0, 60_000).seq
            assert companions.confirm_newest(urls, keys, marked, seq)
        a.client().hset(keys.newest, "n", "1")  # copies differ, as skewed clocks make them
        locks = [Lock(urls, f"l-{i}", ttl=60) for i in range(ROWS + 20)]  # pages per node
        for lock in locks:
            assert lock.acquire(blocking=False)
        inventory = Inventory(urls, "redlock")

        def walk_all() -> tuple[list[Marker], list[HeldLock]]:
            markers: list[Marker] = []
            listed: list[HeldLock] = []
            cursor = "0"
            while True:
                view = inventory.view(cursor)
                markers += view.markers
                listed += view.locks
                cursor = view.cursor
                if cursor == "0":
                    return markers, listed

        markers, listed = walk_all()
        assert [(m.key, m.kind, m.task_id) for m in markers] == [(keys.newest, "newest", "new")]
        assert len(listed) == len(locks)
        assert not inventory.clear_marker(keys.newest, "0" * 16)  # a stale page: kept
        assert [s.client().exists(keys.newest) for s in (a, b, c)] == [1, 1, 1]
        a.stop()  # listed by node 1 alone, and cleared where it is
        markers, listed = walk_all()
        assert [(m.key, m.task_id) for m in markers] == [(keys.newest, "new")]
        assert len(listed) == len(locks)
        assert inventory.clear_marker(keys.newest, markers[0].fingerprint)
        assert [s.client().exists(keys.newest) for s in (b, c)] == [0, 0]


def test_a_quorum_newest_call_marker_of_a_call_never_confirmed_is_cleared() -> None:
    """Review, round 3: a call numbered on the nodes whose publish was never confirmed leaves
    a marker without a newest call (no ``id``). Its Clear answered "changed or is gone since
    it was shown" and kept it for its TTL (an hour)."""
    with RedisServer() as a, RedisServer() as b, RedisServer() as c:
        urls = [a.url, b.url, c.url]
        keys = keys_for("redlock", "unconfirmed")
        companions.mark_newest(urls, keys, 0, 0, 3_600_000)  # its publish never confirmed
        inventory = Inventory(urls, "redlock")
        (marker,) = inventory.view().markers
        assert (marker.key, marker.task_id) == (keys.newest, None)
        assert inventory.clear_marker(keys.newest, marker.fingerprint)
        assert [s.client().exists(keys.newest) for s in (a, b, c)] == [0, 0, 0]


def test_a_quorum_lock_is_released_on_every_node() -> None:
    with RedisServer() as a, RedisServer() as b, RedisServer() as c:
        urls = [a.url, b.url, c.url]
        lock = Lock(urls, "q", ttl=30)
        assert lock.acquire()
        inventory = Inventory(urls, "redlock")
        seen = inventory.read(lock.key)
        assert seen is not None and seen.fencing_token == lock.fencing_token
        assert inventory.release(seen, unless_renewed=True) is Released.RELEASED
        assert [s.client().exists(lock.key) for s in (a, b, c)] == [0, 0, 0]


@pytest.mark.parametrize("args", [["release", "--dead"], ["release", "KEY", "--force"]])
def test_a_release_by_the_command_line_that_got_no_answer_may_have_happened(
    args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Timeline: the release is sent, the lock Redis hangs before it answers, and runs it
    once resumed. The command line said "cannot reach the lock Redis", as if nothing was
    released (and ``--dead`` printed no count of what it had released before)."""
    with RedisServer() as server:
        holder = Lock(server.url, "job", ttl=60, owner="t-gone", host="w9@gone")
        assert holder.acquire(blocking=False)
        base = f"redis://127.0.0.1:{server.port}"
        app = layout_app("inv", base, set_as_current=False, redlock_lease=600)
        app.conf.redlock_url = f"{server.url}?socket_timeout=0.5"
        warm_release_script(server.url)
        pinged = commands.verdicts

        def hang_after_the_ping(*a: Any, **kw: Any) -> Any:
            judged = pinged(*a, **kw)
            os.kill(server.process.pid, signal.SIGSTOP)
            return judged

        monkeypatch.setattr(commands, "verdicts", hang_after_the_ping)
        try:
            done = run(
                app, *[holder.key if arg == "KEY" else arg for arg in args], "--timeout", "0.2"
            )
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        assert done.exit_code == 1, done.output
        assert f"no answer to the release of {holder.key}, which may have happened or not" in (
            done.stderr
        )
        if "--dead" in args:
            assert "released 0 lock(s) of dead workers; kept 0; then:" in done.stdout
        wait_until(lambda: not server.client().exists(holder.key), 5, "the release to run")
        app.close()


def test_release_dead_says_apart_a_lock_that_expired_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Probe, round 23: ``release --dead`` counted a dead worker's lock that expired between
    the listing and its release as "kept", so its summary named locks gone by then."""
    with RedisServer() as server:
        gone, dead = (Lock(server.url, n, ttl=60, owner="t", host="w9@gone") for n in "ab")
        assert gone.acquire(blocking=False) and dead.acquire(blocking=False)
        base = f"redis://127.0.0.1:{server.port}"
        app = layout_app("inv", base, set_as_current=False, redlock_lease=600)
        app.conf.redlock_url = server.url
        pinged = commands.verdicts

        def expire_during_the_ping(*a: Any, **kw: Any) -> Any:
            judged = pinged(*a, **kw)
            server.client().delete(gone.key)
            return judged

        monkeypatch.setattr(commands, "verdicts", expire_during_the_ping)
        done = run(app, "release", "--dead", "--timeout", "0.2")
        app.close()
    assert done.exit_code == 0, done.output
    assert f"skipped {gone.key}: it expired or changed owner since it was read" in done.stdout
    assert done.stdout.endswith(
        "released 1 lock(s) of dead workers; kept 0; 1 expired or changed owner meanwhile\n"
    )


def test_a_release_the_server_refused_is_not_reported_as_unknown() -> None:
    """A refusal (``READONLY``: the node became a replica in a failover) is an answer: the
    release did not run. It was reported "no answer ..., which may have happened or not"."""
    with RedisServer() as server:
        holder = Lock(server.url, "job", ttl=60, owner="t-gone", host="w9@gone")
        assert holder.acquire(blocking=False)
        inventory = Inventory(server.url, "redlock")
        seen = inventory.read(holder.key)
        assert seen is not None
        admin = server.client()
        with socket.socket() as gone:  # a primary that is not there: no sync, data kept
            gone.bind(("127.0.0.1", 0))
            admin.execute_command("REPLICAOF", "127.0.0.1", gone.getsockname()[1])
        try:
            with pytest.raises(LockUnavailable, match=r"READONLY|read only") as raised:
                inventory.release(seen)
        finally:
            admin.execute_command("REPLICAOF", "NO", "ONE")
        assert not isinstance(raised.value, ReleaseUnanswered)
        assert admin.exists(holder.key)


def test_a_quorum_release_warns_of_the_node_that_refused_to_notify_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The "waiters were not notified" WARNING named every node of the quorum when one node's
    user lacked ``+publish``: the operator could not tell which ACL to fix."""
    with RedisServer() as a, RedisServer() as b, RedisServer() as c:
        rules = [r for r in _guide_acl_rules() + _guide_cli_rules() if r != "+publish"]
        b.client().execute_command("ACL", "SETUSER", "redlock", "reset", *rules)
        refusing = b.url.replace("redis://", "redis://redlock:secret@")
        lock = Lock([a.url, b.url, c.url], "q-unnotified", ttl=30)
        assert lock.acquire(blocking=False)
        inventory = Inventory([a.url, refusing, c.url], "redlock")
        seen = inventory.read(lock.key)
        assert seen is not None
        with caplog.at_level(logging.WARNING, logger="celery_redlock.lock"):
            assert inventory.release(seen) is Released.RELEASED
        warning = next(r.getMessage() for r in caplog.records if "not notified" in r.message)
        assert f":{b.port}/" in warning
        assert f":{a.port}/" not in warning and f":{c.port}/" not in warning
        assert "secret" not in warning


class Reporting(Inventory):
    """An inventory that records the nodes it went on without (:meth:`on_unanswered`)."""

    def __init__(self, urls: list[str]) -> None:
        super().__init__(urls, "redlock")
        self.unanswered: list[str] = []

    def on_unanswered(self, node: str, error: LockUnavailable) -> None:
        assert f"cannot reach the lock Redis: {node}" in str(error)
        self.unanswered.append(node)


def test_a_cursor_past_64_bits_is_refused_and_leaves_every_node_in() -> None:
    """A cursor of 20 digits past 2^64 went to the node, which refused it ("invalid cursor"):
    that read as a node that did not answer, so one crafted ``?cursor=`` of the dashboard left
    a healthy node out of every view, and of a release, for 30 s."""
    with RedisServer() as a, RedisServer() as b, RedisServer() as c:
        urls = [a.url, b.url, c.url]
        lock = Lock(urls, "q", ttl=60)
        assert lock.acquire(blocking=False)
        inventory = Reporting(urls)
        with pytest.raises(ValueError, match="not an inventory cursor"):
            inventory.view(f"0:{1 << 64}")
        seen = inventory.read(lock.key)
        assert seen is not None
        assert inventory.release(seen, unless_renewed=False) is Released.RELEASED
        assert [s.client().exists(lock.key) for s in (a, b, c)] == [0, 0, 0]
        assert inventory.unanswered == []


@pytest.mark.parametrize("down", [0, 2], ids=["first-node-down", "last-node-down"])
def test_a_quorum_with_one_node_down_lists_and_releases_what_the_majority_holds(
    down: int,
) -> None:
    with RedisServer() as a, RedisServer() as b, RedisServer() as c:
        servers = [a, b, c]
        urls = [s.url for s in servers]
        locks = [Lock(urls, f"q-{i}", ttl=60, owner=f"t-{i}") for i in range(5)]
        for lock in locks:
            assert lock.acquire(blocking=False)
        keys = sorted(lock.key for lock in locks)
        servers[down].stop()
        inventory = Reporting(urls)
        assert [lk.key for lk in inventory.all()] == keys
        assert set(inventory.unanswered) == {urls[down]}
        assert [lk.key for lk in inventory.of_task_id("t-3")] == [locks[3].key]
        view = inventory.view()
        assert [lk.key for lk in view.locks] == keys
        assert list(view.unanswered) == [urls[down]]
        assert view.unanswered[urls[down]].startswith(f"cannot reach the lock Redis: {urls[down]}")
        seen = inventory.read(locks[0].key)
        assert seen is not None
        assert inventory.release(seen, unless_renewed=True) is Released.RELEASED
        assert inventory.read(locks[0].key) is None

        servers[(down + 1) % 3].stop()  # two of three down: no majority answers
        for read in (inventory.all, inventory.view):
            with pytest.raises(LockUnavailable, match="fewer than 2 of the 3 lock Redis nodes"):
                read()


class Counting(Inventory):
    """An inventory that counts the failed calls to one node (each :meth:`_failure` is one)."""

    def __init__(self, urls: list[str], hung: str) -> None:
        super().__init__(urls, "redlock")
        self.hung, self.failures = hung, 0

    def _failure(self, url: str, exc: BaseException) -> LockUnavailable:
        self.failures += url == self.hung
        return super()._failure(url, exc)


def test_a_quorum_node_that_hangs_costs_one_timeout_not_one_per_call() -> None:
    """A paused node (or a link dropping packets) answers nothing until the socket timeout:
    asked again for every page and every release, it made a listing and a ``release --dead``
    of many locks take minutes. It is left out once it did not answer."""
    with RedisServer() as a, RedisServer() as b, RedisServer() as c:
        urls = [f"{s.url}?socket_timeout=0.5&socket_connect_timeout=0.5" for s in (a, b, c)]
        locks = [Lock(urls, f"hang-{i}", ttl=60) for i in range(4)]
        for lock in locks:
            assert lock.acquire(blocking=False)
        assert b.process is not None
        os.kill(b.process.pid, signal.SIGSTOP)
        try:
            inventory = Counting(urls, urls[1])
            held = inventory.all()
            assert sorted(lk.key for lk in held) == sorted(lk.key for lk in locks)
            for seen in held:
                assert inventory.release(seen, unless_renewed=True) is Released.RELEASED
            assert inventory.all() == []
            assert inventory.failures == 1
        finally:
            os.kill(b.process.pid, signal.SIGCONT)


def test_nodes_left_out_with_no_majority_left_are_asked_again_at_once() -> None:
    """Two nodes of three freeze, and the listing fails naming them; once they resume, the
    next listing works. Left out for 30 s after they did not answer, they were not asked
    again: the dashboard said "fewer than 2 of the 3 lock Redis nodes answer" for 30 s while
    ``celery redlock ls`` (a new inventory) listed the locks."""
    with RedisServer() as a, RedisServer() as b, RedisServer() as c:
        urls = [f"{s.url}?socket_timeout=0.5&socket_connect_timeout=0.5" for s in (a, b, c)]
        lock = Lock(urls, "resumed", ttl=60)
        assert lock.acquire(blocking=False)
        inventory = Inventory(urls, "redlock")
        assert [lk.key for lk in inventory.all()] == [lock.key]
        frozen = [b.process, c.process]
        for process in frozen:
            assert process is not None
            os.kill(process.pid, signal.SIGSTOP)
        try:
            for read in (inventory.all, inventory.view):
                with pytest.raises(LockUnavailable, match="fewer than 2 of the 3"):
                    read()
        finally:
            for process in frozen:
                assert process is not None
                os.kill(process.pid, signal.SIGCONT)
        assert [lk.key for lk in inventory.all()] == [lock.key]
        assert [lk.key for lk in inventory.view().locks] == [lock.key]
        assert inventory.view().unanswered == {}


def test_a_quorum_release_on_a_majority_is_released_though_one_node_saw_a_renewal() -> None:
    """Deleted on two nodes of three, kept on the third, where the holder's renewal landed
    between the read and the delete: no majority holds the lock, so it is released (the
    holder's next renewal finds it lost), not "renewed: the holder is alive"."""
    with RedisServer() as a, RedisServer() as b, RedisServer() as c:
        urls = [a.url, b.url, c.url]
        lock = Lock(urls, "partly-renewed", ttl=30)
        assert lock.acquire(blocking=False)
        inventory = Inventory(urls, "redlock")
        seen = inventory.read(lock.key)
        assert seen is not None
        b.client().pexpire(lock.key, 60_000)  # a renewal, on one node so far
        assert inventory.release(seen, unless_renewed=True) is Released.RELEASED
        assert [s.client().exists(lock.key) for s in (a, b, c)] == [0, 1, 0]


def test_inspect_with_the_broker_down_judges_liveness_by_renewal_alone(redis_url: str) -> None:
    """The ping needs the broker, the lock does not: ``inspect`` shows it, with a warning,
    where it used to fail and show nothing. A lease just set (TTL 30 s of the 30 s lease)
    proves a live holder whatever the ping says; one set 21 s ago (TTL 9 s) is unknown, never
    dead. One ping, on one connection: kombu's retries (three connections, 6 s) are not
    waited for."""
    fresh = Lock(redis_url, task_name("brokerless", 1), ttl=30, owner="t-1", host="w1@host")
    old = Lock(redis_url, "brokerless-old", ttl=9, owner="t-2", host="w2@host")
    assert fresh.acquire(blocking=False) and old.acquire(blocking=False)
    broker = DownBroker()
    app = brokerless_app(redis_url, broker.url)
    renewing(app, "brokerless")  # its task renews it: a TTL just set proves a live holder
    try:
        result = run(app, "inspect", "brokerless", "--timeout", "0.2")
        older = run(app, "inspect", "brokerless-old", "--timeout", "0.2")
    finally:
        fresh.release()
        with contextlib.suppress(LockLost):  # its TTL is short
            old.release()
        app.close()
        broker.close()
    assert result.exit_code == 0, result.output
    assert fresh.key in result.stdout and "alive     alive (the workers could not" in result.stdout
    assert "its lease was set " in result.stdout and "ago (acquired or renewed)" in result.stdout
    assert "WARNING: cannot ping workers through the broker" in result.stderr
    assert "alive     unknown (the workers could not be pinged" in older.stdout, older.stdout
    assert broker.connections == 2  # one per command: no retry


def test_release_force_needs_no_broker(redis_url: str) -> None:
    """With the broker down, ``release KEY --force`` is the way out (docs/operations.md): it
    failed too ("cannot ping workers ...; nothing was released"), and the key stayed. Without
    ``--force`` nothing is released, as before."""
    lock = Lock(redis_url, "brokerless", ttl=9, owner="t-1", host="w1@host")
    assert lock.acquire(blocking=False)
    broker = DownBroker()
    app = brokerless_app(redis_url, broker.url)
    try:
        refused = run(app, "release", lock.key, "--timeout", "0.2")
        held = redis_py.Redis.from_url(redis_url).exists(lock.key)
        forced = run(app, "release", lock.key, "--force", "--timeout", "0.2")
    finally:
        app.close()
        broker.close()
    assert refused.exit_code == 1 and held, refused.output
    assert "cannot ping workers through the broker" in refused.stderr
    assert "nothing was released (--force releases it without asking the workers" in (
        refused.stderr
    )
    assert forced.exit_code == 0, forced.output
    assert "WARNING: cannot ping workers through the broker" in forced.stderr
    assert f"released {lock.key} (forced): it was held by" in forced.stdout
    assert "the workers could not be pinged (the broker does not answer)" in forced.stdout
    assert not redis_py.Redis.from_url(redis_url).exists(lock.key)


def test_without_a_broker_url_no_holder_is_judged_dead(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Helper probe, round 3: ``celery --config cfg redlock release --dead``, with a cfg that
    set ``redlock_url`` alone, pinged Celery's default broker (amqp://localhost), where a
    RabbitMQ answered and no worker did: a live worker's lock was released, exit 0. Without a
    broker set, the workers are not pinged, and nothing is released."""
    for name in ("CELERY_BROKER_URL", "CELERY_BROKER_WRITE_URL"):
        monkeypatch.delenv(name, raising=False)
    lock = Lock(redis_url, "no-broker", ttl=30, owner="t-n", host="w1@host")
    assert lock.acquire(blocking=False)
    app = Celery("cfg", set_as_current=False)
    app.conf.redlock_url = redis_url
    try:
        dead = run(app, "release", "--dead", "--timeout", "0.2")
        one = run(app, "release", lock.key, "--timeout", "0.2")
        shown = run(app, "inspect", lock.key, "--timeout", "0.2")
    finally:
        app.close()
    for result in (dead, one):
        assert result.exit_code == 1, result.output
        assert "no broker_url is set" in result.stderr
        assert "nothing was released" in result.stderr
    assert "run it with the workers' app (-A) or broker (-b)" in dead.stderr
    assert shown.exit_code == 0 and "WARNING: cannot ping workers" in shown.stderr
    assert "the workers could not be pinged (no broker_url is set)" in shown.stdout
    assert redis_py.Redis.from_url(redis_url).exists(lock.key)
    lock.release()


def test_a_broker_that_drops_connections_fails_the_ping_in_its_connect_timeout(
    redis_url: str,
) -> None:
    """A Redis broker whose host drops packets: the ping's connect had no timeout and hung
    forever (and every dashboard view waited behind it). It is bounded by
    ``broker_connection_timeout``, and the lock is judged by its renewal."""
    lock = Lock(redis_url, task_name("silent", 1), ttl=30, owner="t-s", host="w1@host")
    assert lock.acquire(blocking=False)
    silent = SilentBroker()
    app = brokerless_app(redis_url, silent.url)
    renewing(app, "silent")
    app.conf.broker_connection_timeout = 0.5
    try:
        shown = run(app, "inspect", "silent", "--timeout", "0.2")
    finally:
        lock.release()
        app.close()
        silent.close()
    assert shown.exit_code == 0, shown.output
    assert "cannot ping workers through the broker" in shown.stderr
    assert "alive     alive (the workers could not be pinged" in shown.stdout


def test_a_broker_that_never_answers_fails_release_dead_in_time(redis_url: str) -> None:
    """A Redis broker that accepts connections and never answers (its process stopped, or
    hung): ``release --dead`` waited for its first reply forever. The ping's reads are
    bounded: nothing is released, exit 1."""
    lock = Lock(redis_url, "frozen-broker", ttl=30, owner="t-f", host="w1@host")
    assert lock.acquire(blocking=False)
    with RedisServer() as broker:
        app = brokerless_app(redis_url, broker.url.rsplit("/", 1)[0])
        app.conf.broker_connection_timeout = 0.5
        assert broker.process is not None
        os.kill(broker.process.pid, signal.SIGSTOP)
        try:
            result = run(app, "release", "--dead", "--timeout", "0.2")
        finally:
            os.kill(broker.process.pid, signal.SIGCONT)
            app.close()
    assert result.exit_code == 1, result.output
    assert "cannot ping workers through the broker" in result.stderr
    assert "nothing was released" in result.stderr and "Timeout reading" in result.stderr
    assert redis_py.Redis.from_url(redis_url).exists(lock.key)
    lock.release()


def test_the_ping_goes_on_to_the_next_broker_of_a_failover_list(
    redis_server: RedisServer, redis_url: str
) -> None:
    """A ping that does not retry must still try each broker of ``broker_url="a;b"`` once: with
    ``max_retries=0`` kombu gave up on the first, and a live holder behind the second was
    judged by renewal alone."""
    app = make_app(redis_server, "failover")
    down = DownBroker()
    listed = make_app(redis_server, "failover")
    listed.conf.broker_url = f"{down.url}/1;redis://127.0.0.1:{redis_server.port}/1"
    try:
        with running_worker(app) as worker:
            lock = Lock(redis_url, "failover", ttl=5, owner="t-f", host=worker.hostname)
            assert lock.acquire(blocking=False)
            shown = run(listed, "inspect", "failover", "--timeout", "5")
            lock.release()
    finally:
        listed.close()
        app.close()
        down.close()
    assert shown.exit_code == 0 and "WARNING" not in shown.stderr, shown.output
    assert "alive     alive (its worker" in shown.stdout, shown.stdout
    assert down.connections >= 1  # the first broker was tried


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("redis://:wrong-password@127.0.0.1:{port}/0", "refused the URL's credentials"),
        ("redis://127.0.0.1:{port}/0?password=wrong-password", "refused the URL's credentials"),
        ("redis://127.0.0.1:{port}/0", "wants a password (or an ACL user) that the URL does not"),
    ],
    ids=["wrong", "wrong-in-query", "missing"],
)
def test_a_password_refused_is_named_as_such_not_as_a_redis_that_cannot_be_reached(
    url: str, said: str
) -> None:
    """The server answered, and refused the URL's credentials: ``ls`` said "cannot reach the
    lock Redis", which sends an operator after a network outage. A URL without a password
    was told its "credentials (a wrong password ...)" were refused, which it does not have
    (a password in the query string is one it has)."""
    with RedisServer() as server:
        admin = server.client()
        admin.config_set("requirepass", "right-password")
        admin.close()
        app = layout_app("pw", server.url.rsplit("/", 1)[0], set_as_current=False)
        app.conf.redlock_url = url.format(port=server.port)
        listed = run(app, "ls")
        app.close()
    assert listed.exit_code == 1
    assert "the lock Redis at redis://" in listed.output and f":{server.port}/0" in listed.output
    assert said in listed.output, listed.output
    assert "cannot reach" not in listed.output and "wrong-password" not in listed.output


def test_a_lock_capped_by_a_hard_time_limit_is_not_released_as_dead(
    redis_server: RedisServer, r: redis_py.Redis
) -> None:
    """A task with ``time_limit=4`` holds a lock whose TTL is cut to its cap (4 s + the 5 s
    margin), which renewal never raises back to the 30 s lease. Its worker in warm shutdown
    (a deploy) answers no ping while the task finishes: ``release --dead`` read "renewed 21 s
    ago", released it, and a second run of the key started beside the first. The token now
    carries the cap: liveness unknown, and kept. A lock of the same TTL without a cap (an
    older version's token) is released as before."""
    app = make_app(redis_server, "cap", broker_transport_options={"max_retries": 0})
    capped = Lock(redis_server.url, "cap.run:a", ttl=30, max_hold=9, owner="t-1", host="w1@gone")
    plain = Lock(redis_server.url, "cap.run:b", ttl=30, owner="t-2", host="w2@gone")
    assert capped.acquire(blocking=False) and plain.acquire(blocking=False)
    r.pexpire(plain.key, 9_000)  # as a lease last renewed 21 s ago
    dead = run(app, "release", "--dead", "--timeout", "0.2")
    status, body = Dashboard(app, ping_timeout=0.2).locks_page({}, {"csrf_token": "x"})
    app.close()
    assert dead.exit_code == 0, dead.output
    assert f"kept {capped.key}" in dead.stdout, dead.stdout
    # Why, and when the key goes by itself: the operator's choice of release --force.
    kept = re.search(
        r"\(liveness unknown: its worker w1@gone does not answer .*, and its TTL is cut to its "
        r"task's hard time limit \(max_hold\).*; its key expires in (\d+\.\d)s unless its holder "
        r"renews it\)",
        dead.stdout,
    )
    assert kept is not None and 0 < float(kept.group(1)) <= 9, dead.stdout
    assert f"released {plain.key}" in dead.stdout
    assert r.exists(capped.key) and not r.exists(plain.key)
    assert status == 200 and '<td class="unknown">unknown</td>' in body
    shown = run(make_app(redis_server, "cap"), "inspect", capped.key, "--timeout", "0.2")
    assert "its TTL is cut to its task's hard time limit (max_hold)" in shown.stdout


def test_a_fixed_lock_ttl_of_a_silent_worker_is_never_said_renewed(
    redis_server: RedisServer, r: redis_py.Redis
) -> None:
    """Probe: a SIGKILLed worker's lock of a task with ``lock_ttl=25`` (``redlock_lease=15``)
    was judged alive once its TTL fell below the lease, "renewed 2.0s ago", though it is never
    renewed. Its TTL is also that of a lease set 2 s ago, which the workers' older code or a
    call whose per-call ``lock_ttl`` record was lost would renew (review: releasing it could
    start a second run beside a live one): unknown, and kept, never "renewed"; dead once two
    thirds of the lease have passed. A renewing task's lock with the same TTL is alive."""
    app = make_app(redis_server, "fx", redlock_lease=15.0)

    @app.task(base=LockedTask, name="fx.fixed", lock_by=["k"], lock_ttl=25)
    def fixed(k: str) -> None: ...

    @app.task(base=LockedTask, name="fx.leased", lock_by=["k"])
    def leased(k: str) -> None: ...

    # Taken by a worker that no longer answers: 12 s ago with 13 s left (the fixed one counting
    # down from 25 s, the leased one renewed 2 s ago), and a fixed one 21 s ago, 4 s left.
    now = int(time.time() * 1000)
    recent_key, old_key, live_key = (
        lock_key(fixed, "a"),
        lock_key(fixed, "b"),
        lock_key(leased, "a"),
    )
    for i, (key, age, left) in enumerate(
        ((recent_key, 12_000, 13_000), (old_key, 21_000, 4_000), (live_key, 12_000, 13_000))
    ):
        r.set(key, f"{'a' * 32}|7|{now - age}|fx@gone|t-{i}", px=left)

    shown = run(app, "inspect", "fx.fixed", "--json", "--timeout", "0.2")
    assert shown.exit_code == 0, shown.output
    states = {lock["key"]: lock["alive"] for lock in json.loads(shown.stdout)}
    assert states == {recent_key: "unknown", old_key: "dead"}
    said = run(app, "inspect", recent_key, "--timeout", "0.2").stdout
    assert (
        "lock_ttl of its tasks (lock name fx.fixed) is a fixed 25s, which this app never renews"
        in said
    )
    assert "its task renews it" not in said

    dry = run(app, "release", "--dead", "--dry-run", "--timeout", "0.2")
    assert dry.exit_code == 0, dry.output
    assert f"would release {old_key}" in dry.stdout
    assert f"kept {recent_key}" in dry.stdout and "liveness unknown" in dry.stdout
    assert f"kept {live_key}" in dry.stdout and "renewed lease: " in dry.stdout
    assert "its task renews it, so its holder is alive" in dry.stdout

    board = Dashboard(app, actions=True, ping_timeout=0.2)
    _, body = board.locks_page({}, {})
    cell = body.split(f'<tr data-key="{old_key}">')[1].split("</tr>")[0]
    assert '<td class="dead">dead</td>' in cell
    done = board.act("release-dead", {"prefix": "fx."}, "t")
    app.close()
    assert done.message == "released 1 lock(s) of dead workers; kept 2"
    assert r.exists(live_key) and r.exists(recent_key) and not r.exists(old_key)


def test_a_finished_tasks_cooldown_is_shown_as_one_and_kept_by_release_dead(
    redis_server: RedisServer, r: redis_py.Redis
) -> None:
    """A slot kept by ``lock_cooldown`` showed its finished task as the running holder, its
    worker "alive", and an unforced release said the worker answers a ping. It shows as a
    cooldown, is kept by ``release --dead`` (no dead worker left it), and only ``--force``
    releases it."""
    app = make_app(redis_server, "cool", broker_transport_options={"max_retries": 0})

    @app.task(base=LockedTask, name="cool.report", lock_cooldown=60)
    def report() -> str:
        return "done"

    assert report.apply().get() == "done"
    (key,) = [k.decode() for k in r.scan_iter("redlock:{cool.report*")]
    shown = run(app, "inspect", key)
    assert "(ended; kept by its lock_cooldown)" in shown.stdout, shown.output
    assert "alive     cooldown (its task ended" in shown.stdout
    listed = run(app, "ls", "--json").stdout
    assert [lock["cooldown"] for lock in json.loads(listed)] == [True], listed
    assert "cool.report (cooldown)" in run(app, "ls").stdout
    dead = run(app, "release", "--dead")
    kept = "(ended; kept by its lock_cooldown) (it frees itself when the cooldown ends)"
    assert kept in dead.stdout and dead.stdout.count("cooldown") == 2 and r.exists(key)
    refused = run(app, "release", key)
    assert refused.exit_code == 1 and "its lock_cooldown keeps the key" in refused.stderr
    status, body = Dashboard(app, ping_timeout=0.2).locks_page({}, {"csrf_token": "x"})
    assert status == 200 and '<td class="mode">cooldown<br>' in body
    assert '<td class="cooldown">cooldown</td>' in body
    forced = run(app, "release", key, "--force")
    assert forced.exit_code == 0 and not r.exists(key), forced.output
    app.close()


def test_the_command_line_and_the_dashboard_go_on_with_a_quorum_node_down() -> None:
    with RedisServer() as a, RedisServer() as b, RedisServer() as c:
        urls = [a.url, b.url, c.url]
        app = layout_app("q", a.url.rsplit("/", 1)[0], set_as_current=False)  # broker on a
        app.conf.redlock_url = urls
        gone = Lock(urls, "q-gone", ttl=60, owner="t-gone", host="w-gone@nowhere")
        assert gone.acquire(blocking=False)
        c.stop()
        warning = f"WARNING: cannot reach the lock Redis: {c.url}"
        try:
            for args in (
                ["ls"],
                ["ls", "--json"],
                ["inspect", "--task-id", "t-gone"],
                ["inspect", "q-gone"],
                ["release", "--dead", "--dry-run"],
            ):
                done = run(app, *args)
                assert done.exit_code == 0, (args, done.output)
                assert gone.key in done.stdout, (args, done.stdout)
                assert done.stderr.count("WARNING") == 1 and warning in done.stderr, done.stderr
            status, body = Dashboard(app).locks_page({}, {"csrf_token": "x"})
            assert status == 200 and gone.key in body
            released = run(app, "release", "--dead")
            assert released.exit_code == 0, released.output
            assert "released 1 lock(s) of dead workers" in released.stdout
            assert not a.client().exists(gone.key) and not b.client().exists(gone.key)

            b.stop()
            refused = run(app, "ls")
            assert refused.exit_code == 1, refused.output
            assert "Error: fewer than 2 of the 3 lock Redis nodes answer" in refused.stderr
        finally:
            app.close()


def test_a_release_never_frees_a_lease_renewed_since_it_was_read(redis_url: str) -> None:
    inventory = Inventory(redis_url, "redlock")
    holder = Lock(redis_url, "renewed", ttl=30, owner="t")
    assert holder.acquire()
    seen = inventory.read(holder.key)
    assert seen is not None and seen.pttl_ms is not None
    age = lease_age(seen, 30.0)
    assert age is not None and 0 <= age < 10  # acquired just now: a third of the lease
    assert lease_age(seen, 10.0) is None  # a TTL above that lease: not renewed with it
    holder.ttl = 40  # the holder's renewal sets its lease again: the TTL grows
    holder.extend()
    assert inventory.release(seen, unless_renewed=True) is Released.RENEWED
    assert holder.locked()
    assert inventory.release(seen) is Released.RELEASED  # forced: the owner check only
    assert not holder.locked()
    assert inventory.release(seen) is Released.CHANGED


def test_an_operator_release_hands_the_lock_to_the_queued_waiter(
    redis_url: str, r: redis_py.Redis
) -> None:
    holder = Lock(redis_url, "handed", ttl=30, owner="dead-holder")
    assert holder.acquire()
    waiter = Lock(redis_url, "handed", ttl=30, owner="waiter")
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=20)))
    thread.start()
    wait_until(lambda: r.zcard(holder.keys.waiters) == 1, 10, "the waiter to queue")
    seen = Inventory(redis_url, "redlock").read(holder.key)
    assert seen is not None
    assert Inventory(redis_url, "redlock").release(seen, unless_renewed=True)
    thread.join(10)
    assert got == [True] and waiter.locked()  # at once, not at the old lease's end (30 s)
    waiter.release()


def test_a_prefix_with_glob_characters_hides_no_lock(redis_url: str) -> None:
    app = Celery("glob", set_as_current=False)
    app.conf.redlock_url = redis_url
    app.conf.redlock_prefix = "red[lock"
    decoy = Lock(redis_url, "decoy", ttl=60, prefix="redl")  # would match `red?lock` loosely
    lock = Lock(redis_url, "job", ttl=60, prefix="red[lock", owner="t-1")
    assert lock.acquire() and decoy.acquire()
    metrics.count(app, "proj.t", "acquired")
    metrics.flush()
    try:
        listed = run(app, "ls", "--json")
        assert listed.exit_code == 0, listed.output
        assert [item["key"] for item in json.loads(listed.output)] == ["red[lock:{job}"]
        assert "red[lock:{job}" in run(app, "ls").output
        stats = run(app, "stats", "--json")
        assert stats.exit_code == 0, stats.output
        assert json.loads(stats.output)["proj.t"]["acquired"] == 1
    finally:
        app.close()


def _guide_acl_rules() -> list[str]:
    """The least-privilege ACL line of docs/guide.md, as ACL SETUSER arguments."""
    text = Path(ROOT, "docs", "guide.md").read_text()
    line = re.search(r"^user redlock (.+)$", text, re.MULTILINE)
    assert line is not None, "the guide has no ACL line"
    return line.group(1).split()


@pytest.fixture
def acl_app(redis_url: str, r: redis_py.Redis) -> Iterator[Celery]:
    """An app whose lock Redis user is the guide's least-privilege one."""
    r.execute_command("ACL", "SETUSER", "redlock", "reset", *_guide_acl_rules())
    app = Celery("acl", set_as_current=False)
    app.conf.redlock_url = redis_url.replace("redis://", "redis://redlock:secret@")
    yield app
    app.close()
    r.execute_command("ACL", "DELUSER", "redlock")


def _guide_cli_rules() -> list[str]:
    """What the guide's table adds to the ACL line for the command line."""
    text = Path(ROOT, "docs", "guide.md").read_text()
    row = re.search(r"^\| the `celery redlock` command line \| `([^`]+)` \|", text, re.MULTILINE)
    assert row is not None, "the guide's table has no command line row"
    return row.group(1).split()


@pytest.mark.parametrize("granted", [True, False], ids=["documented", "without-zpopmin"])
def test_a_release_by_the_command_line_user_reaches_the_queued_waiter(
    redis_url: str, r: redis_py.Redis, granted: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The command line's documented grants lacked ``+zpopmin``: its release (``release
    --dead``, ``--force``, the dashboard's) deleted the key and told only the shared release
    channel, so a queued waiter (a ``wait`` task) slept on for the holder's whole TTL while
    any new call could take the free key, and nothing said so. With the documented grants
    the waiter is handed the lock; without ``+zpopmin`` the release warns."""
    rules = [rule for rule in _guide_cli_rules() if granted or rule != "+zpopmin"]
    r.execute_command("ACL", "SETUSER", "redlock", "reset", *_guide_acl_rules(), *rules)
    holder = Lock(redis_url, f"cli-queued-{granted}", ttl=120, owner="t-h", host="w1@host")
    assert holder.acquire(blocking=False)
    waiter = Lock(redis_url, f"cli-queued-{granted}", ttl=30)
    won: list[bool] = []
    thread = threading.Thread(target=lambda: won.append(waiter.acquire(timeout=60)), daemon=True)
    thread.start()
    wait_until(lambda: r.zcard(holder.keys.waiters) == 1, 10, "the waiter queued")
    inventory = Inventory(redis_url.replace("redis://", "redis://redlock:secret@"), "redlock")
    seen = inventory.read(holder.key)
    assert seen is not None
    with caplog.at_level(logging.WARNING, logger="celery_redlock.lock"):
        assert inventory.release(seen) is Released.RELEASED
    if granted:
        assert "not notified" not in caplog.text
    else:
        assert "waiters were not notified (PUBLISH, or ZPOPMIN for the queued ones" in caplog.text
        assert r.zcard(holder.keys.waiters) == 1 and not won  # still asleep: warned
        again = Lock(redis_url, f"cli-queued-{granted}", ttl=10)
        assert again.acquire(blocking=False)
        again.release()  # a release that may pop the queue hands it over
    thread.join(10)
    assert won == [True]
    waiter.release()
    r.execute_command("ACL", "DELUSER", "redlock")


def test_ls_as_the_documented_acl_user_names_the_refused_permission(acl_app: Celery) -> None:
    done = run(acl_app, "ls")
    assert done.exit_code == 1 and isinstance(done.exception, SystemExit), done.output
    assert "permission denied" in done.output and "'scan'" in done.output
    assert "cannot reach" not in done.output and "secret" not in done.output
    assert "Traceback" not in done.output


def test_stats_without_hgetall_is_one_error_line(
    redis_url: str, r: redis_py.Redis, acl_app: Celery
) -> None:
    r.execute_command("ACL", "SETUSER", "redlock", "+scan")  # but no +hgetall
    r.hincrby("redlock:stats:proj.t", "acquired", 1)
    done = run(acl_app, "stats")
    assert done.exit_code == 1 and isinstance(done.exception, SystemExit), done.output
    (line,) = done.output.splitlines()
    assert line.startswith("Error: permission denied") and "'hgetall'" in line
    with pytest.raises(InventoryRefused, match="hgetall"):
        metrics.read_stats(acl_app)


def test_stats_during_an_outage_names_the_url() -> None:
    with RedisServer() as gone:
        url = gone.url.replace("redis://", "redis://:hunter2@")
    app = Celery("outage", set_as_current=False)
    app.conf.redlock_url = url
    done = run(app, "stats")
    app.close()
    assert done.exit_code == 1 and isinstance(done.exception, SystemExit), done.output
    assert f"cannot reach the lock Redis: redis://***@127.0.0.1:{gone.port}/0" in done.output
    assert "hunter2" not in done.output


def test_stats_on_a_quorum_whose_first_node_is_down_says_only_the_counters_need_it() -> None:
    """Helper probe, round 3: "cannot reach the lock Redis" read as an outage of every lock,
    while ``ls`` and the locks worked on the majority."""
    with RedisServer() as gone:
        pass
    with RedisServer() as second, RedisServer() as third:
        app = Celery("quorum-stats", set_as_current=False)
        app.conf.redlock_url = [gone.url, second.url, third.url]
        done = run(app, "stats")
        listed = run(app, "ls")
        app.close()
    assert done.exit_code == 1, done.output
    assert f"cannot reach the lock Redis: redis://127.0.0.1:{gone.port}/0" in done.output
    assert "the counters live on the quorum's first node only" in done.output
    assert listed.exit_code == 0, listed.output


def test_an_unreachable_sentinel_is_named_by_its_address_not_its_client_repr() -> None:
    with RedisServer() as gone:
        url = f"redis+sentinel://:hunter2@127.0.0.1:{gone.port}/mymaster/0"
    app = Celery("sentinel-outage", set_as_current=False)
    app.conf.redlock_url = url
    done = run(app, "ls")
    app.close()
    assert done.exit_code == 1, done.output
    (line,) = done.output.splitlines()
    assert f"No master found for 'mymaster' : 127.0.0.1:{gone.port} - " in line
    assert "redis.client" not in line and len(line) < 300, line
    assert "hunter2" not in line


def test_a_missing_tls_file_is_named(redis_url: str, tmp_path: Path) -> None:
    missing = tmp_path / "ca.pem"
    app = Celery("tls-file", set_as_current=False)
    app.conf.redlock_url = redis_url.replace("redis://", "rediss://") + f"?ssl_ca_certs={missing}"
    done = run(app, "ls")
    app.close()
    assert done.exit_code == 1, done.output
    assert f"The URL names a file that does not exist: ssl_ca_certs={missing}." in done.output


def test_counters_leave_out_what_is_no_counter(redis_url: str, r: redis_py.Redis) -> None:
    """A key of another type, or a field that is no whole number, under ``<prefix>:stats:``
    made every count unreadable (WRONGTYPE named as an outage, or a ``ValueError``); the
    startup check's throwaway counter showed as a task."""
    r.hset("redlock:stats:proj.good", mapping={"acquired": 3, "released": 3})
    r.set("redlock:stats:bogus", "x")
    r.hset("redlock:stats:proj.odd", mapping={"acquired": "1.5", "skipped": 2})
    r.hset("redlock:stats:celery-redlock-check:4242", "check", 0)
    assert Inventory(redis_url, "redlock").counters() == {
        "proj.good": {"acquired": 3, "released": 3},
        "proj.odd": {"skipped": 2},
    }


class TimingOut(redis_py.Redis):
    """A client whose ``RPUSH`` times out: the startup check's dry run stops there."""

    def rpush(self, *args: Any, **kwargs: Any) -> Any:
        raise redis_py.TimeoutError("no reply")


def test_the_startup_check_leaves_no_key_for_good_when_a_command_times_out(
    redis_server: RedisServer, r: redis_py.Redis
) -> None:
    client = TimingOut(port=redis_server.port)
    with pytest.raises(redis_py.TimeoutError):
        probe.dry_run(client, "redlock")
    client.close()
    left = [k for k in r.scan_iter(match="redlock:*") if r.pttl(k) == -1]
    assert left == []  # every throwaway key expires (it lives a second at most)


@pytest.mark.parametrize("value", ["abc|²|1796502400000|w@h|t", "abc|1|99999999999999999999|w@h|t"])
def test_a_foreign_value_with_odd_numbers_is_listed_as_foreign(
    redis_server: RedisServer, redis_url: str, r: redis_py.Redis, value: str
) -> None:
    """``str.isdigit()`` took ``'²'`` for a pid, and a time past year 9999 for one: ``ls``,
    ``ls --json``, ``inspect`` and ``release --dead`` ended in a traceback, and the dashboard
    showed no lock at all."""
    with Lock(redis_url, "ok", ttl=600):
        r.set("redlock:{stray}", value, px=600_000)
        app = make_app(redis_server)
        listed = run(app, "ls")
        as_json = run(app, "ls", "--json")
        inspected = run(app, "inspect", "stray")
        dead = run(app, "release", "--dead")
        app.close()
        page = Inventory(redis_url, "redlock").view()
    assert listed.exit_code == 0, listed.output
    assert re.search(r"^redlock:\{stray\} +stray +- +- +- +- +600", listed.output, re.M)
    rows = {row["key"]: row for row in json.loads(as_json.output)}
    assert rows["redlock:{stray}"]["task_id"] is None and rows["redlock:{ok}"]["pid"]
    assert inspected.exit_code == 0, inspected.output
    assert "a value that is not a celery-redlock token" in inspected.output
    assert dead.exit_code == 0, dead.output
    assert r.get("redlock:{stray}") == value.encode()  # not a holder to judge dead
    assert [(lock.key, lock.holder is None) for lock in page.locks] == [
        ("redlock:{ok}", False),
        ("redlock:{stray}", True),
    ]
    # Refused and forced releases say it once (probe, round 4: "...held by a value that is not
    # a celery-redlock token, and its value is not a celery-redlock token; use --force").
    app = make_app(redis_server)
    refused = run(app, "release", "redlock:{stray}", "--timeout", "0.2")
    forced = run(app, "release", "redlock:{stray}", "--force", "--timeout", "0.2")
    app.close()
    assert refused.exit_code == 1 and refused.stderr.count("not a celery-redlock token") == 1
    assert "it names no worker, so its liveness is unknown; use --force" in refused.stderr
    assert forced.exit_code == 0 and forced.stdout.count("not a celery-redlock token") == 1
    assert not r.exists("redlock:{stray}")


def test_a_marker_name_holding_a_key_of_another_type_is_left_out(
    redis_url: str, r: redis_py.Redis
) -> None:
    """A string where ``lock_rate`` keeps a list, a hash where ``lock_enqueue`` keeps a string,
    a string where a lock's waiters queue: the dashboard's page failed, named as an outage."""
    r.set(keys_for("redlock", "x").rate, "x")
    r.hset(keys_for("redlock", "y").queued, "id", "z")
    r.set(keys_for("redlock", "ok").waiters, "x")
    r.rpush(keys_for("redlock", "w").rate, "1")
    with Lock(redis_url, "ok", ttl=600):
        view = Inventory(redis_url, "redlock").view()
    assert [lock.key for lock in view.locks] == ["redlock:{ok}"]
    assert view.waiters == {"redlock:{ok}": 0}
    assert [(m.name, m.kind) for m in view.markers] == [("w", "rate")]
