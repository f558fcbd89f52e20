"""``celery -A tests.e2e.tooling_app redlock ...`` run against real prefork workers.

One redis-server and one worker (``w1``) serve the whole module (each test uses its own keys
and lets its tasks finish); a test that needs a dead worker starts and SIGKILLs its own.
"""

from __future__ import annotations

import json
import os
import time

import pytest
import redis as redis_py
from celery import Celery

from celery_redlock import Lock
from celery_redlock._celery.options import settings_for
from celery_redlock._redis.inventory import Released
from celery_redlock.cli import LockStore
from celery_redlock.metrics import EVENTS, read_stats
from celery_redlock.testing import RedisServer, wait_until
from support.servers import dead_port
from support.workers import WorkerProcess
from tests.e2e.cli.tooling import APP, COUNTED, HOLD, HOST, cli, started

pytestmark = pytest.mark.slow


def test_the_entry_point_adds_the_redlock_group(server: RedisServer) -> None:
    done = cli(server.port, "--help")
    assert done.returncode == 0, done.stderr
    for command in ("ls", "inspect", "release", "stats"):
        assert command in done.stdout


def test_ls_and_inspect_show_the_holder(
    server: RedisServer, w1: WorkerProcess, client: Celery, records: redis_py.Redis
) -> None:
    before_ms = time.time() * 1000
    result = client.send_task(HOLD, args=("ls",))
    holder = started(records, "ls")
    done = cli(server.port, "ls", "--json")
    assert done.returncode == 0, done.stderr
    (lock,) = [item for item in json.loads(done.stdout) if item["task_id"] == result.id]
    assert lock["key"] == f"redlock:{{{lock['name']}}}"
    assert lock["lock_name"] == HOLD
    assert (lock["host"], lock["pid"]) == (f"w1@{HOST}", holder["pid"])  # the pool child
    assert before_ms <= lock["acquired_ms"] <= time.time() * 1000
    assert 0 < lock["ttl"] <= 30
    # A single-node lock keeps no fencing counter: its holder reads the token on first use.
    assert lock["fencing_token"] is None
    assert not redis_py.Redis(port=server.port).exists(lock["key"] + ":fence")
    assert len(lock["token_prefix"]) == 8

    text = cli(server.port, "ls").stdout
    assert lock["key"] in text and result.id in text and f"w1@{HOST}" in text

    by_key = cli(server.port, "inspect", lock["key"], "--json")
    assert by_key.returncode == 0, by_key.stderr
    inspected = json.loads(by_key.stdout)
    assert 0 < inspected["ttl"] <= 30  # renewed meanwhile, perhaps: no closer bound
    assert inspected == {**lock, "alive": "alive", "ttl": inspected["ttl"]}
    by_task = cli(server.port, "inspect", "--task-id", result.id)
    assert by_task.returncode == 0, by_task.stderr
    assert lock["key"] in by_task.stdout and "alive" in by_task.stdout
    assert f"pid {holder['pid']}" in by_task.stdout

    records.rpush("go:ls", 1)
    assert result.get(timeout=10) == "ls"
    gone = cli(server.port, "inspect", lock["key"])
    assert gone.returncode == 1 and "is not held" in gone.stderr


def test_release_refuses_a_live_holder_unless_forced(
    server: RedisServer, w1: WorkerProcess, client: Celery, records: redis_py.Redis
) -> None:
    result = client.send_task(HOLD, args=("live",))
    started(records, "live")
    (lock,) = [
        i for i in json.loads(cli(server.port, "ls", "--json").stdout) if i["task_id"] == result.id
    ]
    locks = redis_py.Redis(port=server.port)

    refused = cli(server.port, "release", lock["key"])
    assert refused.returncode == 1
    assert "refused" in refused.stderr and "answers a control ping" in refused.stderr
    assert locks.exists(lock["key"])

    forced = cli(server.port, "release", lock["name"], "--force")  # the bare name works too
    assert forced.returncode == 0, forced.stderr
    assert f"released {lock['key']} (forced)" in forced.stdout
    assert result.id in forced.stdout
    assert not locks.exists(lock["key"])
    records.rpush("go:live", 1)
    assert result.get(timeout=10) == "live"


def test_release_dead_releases_only_the_locks_of_workers_that_are_gone(
    server: RedisServer, w1: WorkerProcess, client: Celery, records: redis_py.Redis
) -> None:
    locks = redis_py.Redis(port=server.port)
    # The dead worker renews with a 120 s lease (the CLI told the same): once 80 s have passed
    # since its last renewal (two thirds of the lease), nothing proves a live holder any more.
    # Its lock is aged to that point below (a TTL of 40 s: what 80 s without a renewal leave),
    # which leaves the commands 40 s before it expires (20 s ran out under a load of 12 on 2
    # cores). w1's holder answers the ping.
    env = {"REDLOCK_TEST_LEASE": "120"}
    with WorkerProcess(server.port, "gone", app=APP, args=["-Q", "gone"], env=env) as gone:
        lost = client.send_task(HOLD, args=("dead",), queue="gone")
        started(records, "dead")
        gone.kill()  # SIGKILL, whole group: nobody releases; the lock stays until its lease ends
    alive = client.send_task(HOLD, args=("alive",))
    started(records, "alive")
    settings = settings_for(client)
    outside = Lock(settings.url, "outside-any-worker", ttl=120)  # host without "@": unknown
    assert outside.acquire()
    by_id = {i["task_id"]: i for i in json.loads(cli(server.port, "ls", "--json").stdout)}
    dead_key, alive_key = by_id[lost.id]["key"], by_id[alive.id]["key"]
    assert locks.pexpire(dead_key, 40_000)

    dry = cli(server.port, "release", "--dead", "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    assert f"would release {dead_key}" in dry.stdout and locks.exists(dead_key)

    done = cli(server.port, "release", "--dead", env=env)
    assert done.returncode == 0, done.stderr
    assert f"released {dead_key}: task {lost.id} on gone@{HOST}" in done.stdout
    assert f"kept {alive_key}" in done.stdout and "worker alive" in done.stdout
    assert f"kept {outside.key}" in done.stdout and "liveness unknown" in done.stdout
    assert "released 1 lock(s) of dead workers; kept 2" in done.stdout
    assert not locks.exists(dead_key)
    assert locks.exists(alive_key) and outside.locked()

    outside.release()
    records.rpush("go:alive", 1)
    assert alive.get(timeout=10) == "alive"


def test_stats_counts_every_worker_process(
    server: RedisServer, w1: WorkerProcess, client: Celery, records: redis_py.Redis
) -> None:
    first = client.send_task(COUNTED, args=("s",), kwargs={"wait": True})
    wait_until(lambda: records.get("started:counted:s"), 10, "counted('s') to start")
    assert client.send_task(COUNTED, args=("s",)).get(timeout=10) is None  # skipped
    records.rpush("go:counted:s", 1)
    assert first.get(timeout=10) == "s"
    assert client.send_task(COUNTED, args=("t",)).get(timeout=10) == "t"
    expected = {"acquired": 2, "skipped": 1, "released": 2}

    def flushed() -> bool:  # the children flush their counts once a second
        counts = read_stats(client).get(COUNTED, {})
        return all(counts.get(k) == v for k, v in expected.items())

    wait_until(flushed, 10, "the counters to reach Redis")
    done = cli(server.port, "stats", "--json")
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout)[COUNTED]
    assert row == {event: expected.get(event, 0) for event in EVENTS}  # every event, zeros too
    text = cli(server.port, "stats").stdout.splitlines()
    assert text[0].split() == ["TASK", *EVENTS]
    assert [COUNTED, *(str(row[e]) for e in EVENTS)] in [line.split() for line in text]


def test_an_unreachable_redis_is_a_clear_error_without_the_password(server: RedisServer) -> None:
    port = dead_port()
    done = cli(server.port, "ls", env={"REDLOCK_TEST_URL": f"redis://:hunter2@127.0.0.1:{port}/0"})
    assert done.returncode == 1
    assert f"cannot reach the lock Redis: redis://***@127.0.0.1:{port}/0" in done.stderr
    assert "hunter2" not in done.stderr + done.stdout
    assert "Traceback" not in done.stderr


def test_release_never_deletes_a_lock_that_changed_owner(redis_url: str) -> None:
    app = Celery("cli", set_as_current=False)
    app.conf.redlock_url = redis_url
    store = LockStore(settings_for(app))
    first = Lock(redis_url, "job", ttl=30, owner="first")
    assert first.acquire()
    seen = store.read("job")
    assert seen is not None and seen.holder is not None and seen.holder.task_id == "first"
    first.release()
    second = Lock(redis_url, "job", ttl=30, owner="second")
    assert second.acquire()
    assert store.release(seen) is Released.CHANGED  # compare-and-delete: the value changed
    assert second.locked()
    now = store.read(seen.key)
    assert now is not None and now.holder is not None and now.holder.task_id == "second"
    assert store.release(now) is Released.RELEASED
    assert not second.locked()
    app.close()


def test_a_quorum_lock_is_listed_while_a_majority_holds_it() -> None:
    with RedisServer() as a, RedisServer() as b, RedisServer() as c:
        urls = [a.url, b.url, c.url]
        app = Celery("cli", set_as_current=False)
        app.conf.redlock_url = urls
        store = LockStore(settings_for(app))
        lock = Lock(urls, "q", ttl=30)
        assert lock.acquire()
        (held,) = store.all()
        assert held.key == lock.key and held.fencing_token == lock.fencing_token
        a.client().delete(lock.key)
        assert store.read(lock.key) is not None  # 2 of 3
        b.client().delete(lock.key)
        assert store.read(lock.key) is None  # 1 of 3: not held
        app.close()


def test_a_lock_of_a_process_its_live_worker_no_longer_has_is_dead(
    server: RedisServer, w1: WorkerProcess, client: Celery, records: redis_py.Redis
) -> None:
    """Restarts probe, round 3: a worker restarted under its name (or a pool child that died
    while its worker lives) answers the ping, so the dead process's ``lock_ttl=120`` lock was
    "alive" and kept by ``release --dead`` for its whole TTL. The holder here is this test's
    process, stored as w1's: w1 answers, but that pid is none of its processes."""
    alive = client.send_task(HOLD, args=("pids",))
    started(records, "pids")
    settings = settings_for(client)
    stale = Lock(settings.url, "restarted-holder", ttl=120, host=f"w1@{HOST}")
    assert stale.acquire()
    by_id = {i["task_id"]: i for i in json.loads(cli(server.port, "ls", "--json").stdout)}
    alive_key = by_id[alive.id]["key"]

    shown = cli(server.port, "inspect", stale.key)
    assert shown.returncode == 0, shown.stderr
    assert f"its worker w1@{HOST} answers, but its process {os.getpid()} is none" in shown.stdout

    done = cli(server.port, "release", "--dead")
    assert done.returncode == 0, done.stderr
    assert f"released {stale.key}" in done.stdout
    assert f"kept {alive_key}" in done.stdout and "worker alive" in done.stdout
    assert not stale.locked() and redis_py.Redis(port=server.port).exists(alive_key)
    records.rpush("go:pids", 1)
    assert alive.get(timeout=10) == "pids"


def test_two_workers_under_one_name_keep_each_other_s_holders_alive(
    server: RedisServer, w1: WorkerProcess, client: Celery, records: redis_py.Redis
) -> None:
    """Review, round 3: ``release --dead`` heard one ``stats`` answer under a name, so with
    two workers started as ``w1`` (they share the name's control queue: one answers) a
    holder in the other one's pool child was none of the answering one's processes, and its
    live lock was released. Each worker here holds one lock, so whichever answers, the
    other's holder was judged dead."""
    env = {"REDLOCK_TEST_LEASE": "120"}  # both locks' TTLs then show no renewal (aged below)
    locks = redis_py.Redis(port=server.port)
    with WorkerProcess(server.port, "w1", app=APP, args=["-Q", "twin"], env=env):
        here = client.send_task(HOLD, args=("here",))
        twin = client.send_task(HOLD, args=("twin",), queue="twin")
        started(records, "here")
        started(records, "twin")
        by_id = {i["task_id"]: i for i in json.loads(cli(server.port, "ls", "--json").stdout)}
        keys = [by_id[here.id]["key"], by_id[twin.id]["key"]]
        assert by_id[here.id]["pid"] != by_id[twin.id]["pid"]
        assert locks.pexpire(keys[1], 40_000)  # 80 s of a 120 s lease without a renewal
        done = cli(server.port, "release", "--dead", env=env)
        assert done.returncode == 0, done.stderr
        assert "released 0 lock(s)" in done.stdout, done.stdout
        assert all(locks.exists(key) for key in keys)
        records.rpush("go:here", 1)
        records.rpush("go:twin", 1)
        assert here.get(timeout=10) == "here" and twin.get(timeout=10) == "twin"
