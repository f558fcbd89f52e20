"""``celery redlock release`` never frees the lock of a task still running in a worker in warm
shutdown (issue 22, item 1), on a real prefork worker.

A worker in warm shutdown finishes its running tasks but stops answering control pings at
once, so the ping alone calls it dead. Its watchdog still renews the lease: a renewal within two
thirds of the lease proves a live holder. (The lock of a worker that is truly gone is still
released: ``test_commands.py::test_release_dead_releases_only_the_locks_of_workers_that_are_gone``.)
"""

from __future__ import annotations

import json
import signal

import pytest
import redis as redis_py
from celery import Celery

from celery_redlock.testing import RedisServer, wait_until
from support.workers import WorkerProcess
from tests.e2e.cli.tooling import APP, HOLD, HOST, cli, started

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("worker_lease", "cli_lease", "says"),
    [
        (None, None, ("renewed lease: ", "warm shutdown", "two thirds of redlock_lease")),
        (None, "10", ("renewed lease: ", "two thirds of its holder's own lease (20.0s)")),
        ("6", "60", ("renewed lease: ", "two thirds of its holder's own lease (4.0s)")),
    ],
    ids=["same-lease", "a-deploy-s-shorter-lease", "a-deploy-s-longer-lease"],
)
def test_a_task_running_in_a_worker_in_warm_shutdown_keeps_its_lock(
    server: RedisServer,
    client: Celery,
    records: redis_py.Redis,
    worker_lease: str | None,
    cli_lease: str | None,
    says: tuple[str, ...],
) -> None:
    """Deploy probe, session 30: the command run with a deploy's shorter ``redlock_lease``
    (10 s) than the draining worker's (30 s) read its TTL as no renewed lease's, called it
    dead and released it; the next call of the key ran beside the running task. With a
    longer one (60 s against the worker's 6 s), it read a TTL of 4 to 6 s as a lease not
    renewed for 54 s or more, with the same end. The holder's token records its own lease,
    which the command judges it by."""
    locks = redis_py.Redis(port=server.port)
    env = {} if cli_lease is None else {"REDLOCK_TEST_LEASE": cli_lease}
    node = f"drain@{HOST}"
    own = {} if worker_lease is None else {"REDLOCK_TEST_LEASE": worker_lease}
    with WorkerProcess(server.port, "drain", app=APP, args=["-Q", "drain"], env=own) as worker:
        result = client.send_task(HOLD, args=("drain", 120.0), queue="drain")
        started(records, "drain")
        (lock,) = [
            item
            for item in json.loads(cli(server.port, "ls", "--json").stdout)
            if item["task_id"] == result.id
        ]
        worker.send(signal.SIGTERM)  # warm shutdown: the task runs on
        wait_until(
            lambda: client.control.ping(destination=[node], timeout=0.5) == [],
            15,
            "the draining worker to stop answering pings",
        )
        assert worker.alive and not result.ready()

        dead = cli(server.port, "release", "--dead", env=env)
        assert dead.returncode == 0, dead.stderr
        assert f"kept {lock['key']}" in dead.stdout, dead.stdout
        assert all(words in dead.stdout for words in says), dead.stdout
        assert "released 0 lock(s)" in dead.stdout
        assert locks.exists(lock["key"])

        one = cli(server.port, "release", lock["key"], env=env)
        assert one.returncode == 1, one.stdout
        assert "refused" in one.stderr, one.stderr
        assert locks.exists(lock["key"])

        records.rpush("go:drain", 1)
        assert result.get(timeout=20) == "drain"
        assert worker.join(30)
    assert not locks.exists(lock["key"])  # released by its holder, at the end of its run


def test_a_lease_renewed_during_the_warm_shutdown_keeps_the_lock_at_any_moment(
    server: RedisServer, client: Celery, records: redis_py.Redis
) -> None:
    """A 6 s lease renews every 2 s: the command reads it at any point of that cycle. Read just
    before a renewal, the TTL no longer proves a live holder, but the renewal lands during the
    ping and the release script sees the TTL grow: either way, nothing is released."""
    locks = redis_py.Redis(port=server.port)
    env = {"REDLOCK_TEST_LEASE": "6"}
    node = f"drain6@{HOST}"
    with WorkerProcess(server.port, "drain6", app=APP, args=["-Q", "drain6"], env=env) as worker:
        result = client.send_task(HOLD, args=("drain6", 120.0), queue="drain6")
        started(records, "drain6")
        (lock,) = [
            item
            for item in json.loads(cli(server.port, "ls", "--json", env=env).stdout)
            if item["task_id"] == result.id
        ]
        worker.send(signal.SIGTERM)
        wait_until(
            lambda: client.control.ping(destination=[node], timeout=0.5) == [],
            15,
            "the draining worker to stop answering pings",
        )
        # A renewal shows as a TTL that grew since the previous read, 20 ms before. (Compared
        # with one read made just after a renewal, the next renewals' TTLs, each read a few ms
        # after it was set, could all be lower, and no renewal was seen.)
        last = [locks.pttl(lock["key"])]

        def renewed() -> bool:
            now = locks.pttl(lock["key"])
            grew, last[0] = now > last[0], now
            return grew

        wait_until(renewed, 10, "a renewal during the shutdown")
        for _ in range(2):  # at different moments of the renewal cycle
            dead = cli(server.port, "release", "--dead", "--timeout", "2", env=env)
            assert dead.returncode == 0, dead.stderr
            assert "released 0 lock(s)" in dead.stdout, dead.stdout
            one = cli(server.port, "release", lock["key"], "--timeout", "2", env=env)
            assert one.returncode == 1, one.stdout
            assert locks.exists(lock["key"])
        records.rpush("go:drain6", 1)
        assert result.get(timeout=20) == "drain6"
        assert worker.join(30)
