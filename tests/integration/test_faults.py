"""Redis faults end in the documented policy, never in a silent overlap (issue 14).

Each test makes a real redis-server misbehave: a Lua script that keeps it busy (``BUSY``
replies), ``CLIENT PAUSE`` (no replies at all), ``maxmemory`` reached under ``noeviction``
(``OOM``), ACL users missing a command (``NOPERM``), and Cluster nodes that are stopped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py

from celery_redlock import (
    Lock,
    LockedTask,
    LockLost,
    LockUnavailable,
    current_lock,
    lock_key,
    metrics,
    signals,
)
from celery_redlock._celery.checks import run_startup_checks
from celery_redlock._celery.options import reset_settings
from celery_redlock._redis import owner as _owner
from celery_redlock._redis.lock import release_attempt
from celery_redlock.metrics import read_stats
from celery_redlock.testing import RedisServer, wait_until
from support.apps import lock_keys, make_app
from support.servers import ClusterNodes, cluster_ok
from support.workers import Holder, running_worker

#: Keeps the server busy for ARGV[1] ms (it answers BUSY to everyone else meanwhile).
BUSY_LOOP = """
local t = redis.call('TIME')
local start = tonumber(t[1]) * 1000000 + tonumber(t[2])
while true do
  t = redis.call('TIME')
  if tonumber(t[1]) * 1000000 + tonumber(t[2]) - start >= tonumber(ARGV[1]) * 1000 then
    return 1
  end
end
"""


@pytest.fixture
def busy_server() -> Iterator[RedisServer]:
    """A lock server that answers BUSY 50 ms into a long script."""
    with RedisServer(args=["--lua-time-limit", "50"]) as server:
        yield server


@contextlib.contextmanager
def busy(server: RedisServer, ms: int) -> Iterator[threading.Thread]:
    """Run :data:`BUSY_LOOP` for ``ms`` from another client; wait for it to end on exit."""
    client = redis_py.Redis(port=server.port, socket_timeout=ms / 1000 + 30)
    client.ping()
    thread = threading.Thread(target=client.eval, args=(BUSY_LOOP, 0, ms), daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        thread.join(ms / 1000 + 30)
        client.close()


class RecordingLock(Lock):
    """Records each confirmed renewal and each loss (through the override points)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.renewals: list[bool] = []
        self.losses: list[str] = []

    def do_extend(self, token: str, ttl: float) -> Any:
        extended = super().do_extend(token, ttl)
        self.renewals.append(extended.held)
        return extended

    def on_lost(self, reason: str) -> None:
        super().on_lost(reason)
        self.losses.append(reason)


def warned(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return any(text in record.getMessage() for record in caplog.records)


# -- row 1: renewal on error replies and without replies ------------------------------------------


def test_renewal_retries_through_busy_replies_and_keeps_the_lock(
    busy_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    lock = RecordingLock(busy_server.url, "busy", ttl=1.5, auto_renew=True)
    assert lock.acquire(blocking=False)
    try:
        wait_until(lambda: lock.renewals, 5, "a first renewal")
        with caplog.at_level(logging.WARNING, logger="celery_redlock.lock"), busy(busy_server, 700):
            wait_until(lambda: warned(caplog, "renewal failed, retrying"), 5, "a BUSY renewal")
        renewed = len(lock.renewals)
        wait_until(lambda: len(lock.renewals) > renewed, 5, "a renewal after the busy script")
        assert all(lock.renewals) and not lock.lost and not lock.losses
        assert "BUSY" in caplog.text
        assert redis_py.Redis(port=busy_server.port).get(lock.key) == (lock.token or "").encode()
        assert not Lock(busy_server.url, "busy", ttl=1).acquire(blocking=False)
    finally:
        lock.release()


def test_renewal_refused_until_the_lease_ends_marks_the_lock_lost(
    busy_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    lock = RecordingLock(busy_server.url, "busy-lost", ttl=1, auto_renew=True)
    assert lock.acquire(blocking=False)
    with caplog.at_level(logging.WARNING, logger="celery_redlock.lock"), busy(busy_server, 3000):
        wait_until(lambda: lock.losses, 10, "the loss to be reported")
        assert lock.lost and not lock.held
        assert "lease ran out" in lock.losses[0]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and lock.key in errors[0].getMessage()
    with contextlib.suppress(LockLost, LockUnavailable):
        lock.release()


def test_a_holder_marks_itself_lost_at_the_lease_end_while_redis_is_paused() -> None:
    # A socket timeout longer than the pause: without its own deadline the holder would learn
    # of the loss only when the pause or the socket timeout ends.
    with RedisServer() as server:
        url = f"{server.url}?socket_timeout=60"
        lock = RecordingLock(url, "paused", ttl=1, auto_renew=True)
        assert lock.acquire(blocking=False)
        admin = redis_py.Redis(port=server.port, socket_timeout=5)
        admin.execute_command("CLIENT", "PAUSE", 60_000, "ALL")
        wait_until(lambda: lock.lost, 15, "lost while the server is paused")
        wait_until(lambda: lock.losses, 15, "the loss reported while the server is paused")
        assert not lock.held
        admin.close()


def test_lost_is_decided_by_the_injected_clock(redis_url: str) -> None:
    now = [1000.0]
    lock = Lock(redis_url, "clocked", ttl=10, clock=lambda: now[0])
    assert lock.acquire(blocking=False)
    now[0] += 9.9
    assert lock.held and not lock.lost
    now[0] += 0.1  # the lease's end by our clock: another owner may exist from now on
    assert lock.lost and not lock.held
    lock.release()  # Redis still had it (its clock did not move): released, not an error
    assert not lock.lost


def test_a_task_whose_renewal_is_refused_is_told_it_lost_the_lock(
    busy_server: RedisServer, redis_server: RedisServer, redis_url: str, h: Holder
) -> None:
    app = make_app(redis_server, "busy", redlock_url=busy_server.url, redlock_lease=1.0)
    lost: list[dict[str, Any]] = []

    def on_lost(sender: Any, **fields: Any) -> None:
        lost.append(fields)

    @app.task(base=LockedTask, lock_by=())
    def victim() -> list[Any]:
        h.hold()
        lock = current_lock()
        assert lock is not None
        return [lock.key, lock.lost]

    signals.lock_lost.connect(on_lost, weak=False)
    try:
        with running_worker(app):
            result = victim.delay()
            assert h.entered.wait(10)
            with busy(busy_server, 3000):
                wait_until(lambda: lost, 10, "lock_lost")
                h.gate.set()
                key, was_lost = result.get(timeout=20)
    finally:
        signals.lock_lost.disconnect(on_lost)
    assert was_lost is True
    assert lost[0]["key"] == key == lock_key(victim)
    assert lost[0]["task_id"] == result.id


# -- row 2: a host name with the token's separator ------------------------------------------------


def test_a_host_with_a_pipe_or_percent_is_stored_recoverably(r: redis_py.Redis) -> None:
    host = "w|x%7C@host"
    lock = Lock(r, "piped", ttl=10, owner="task-1", host=host)
    assert lock.acquire(blocking=False)
    stored = _owner.parse(r.get(lock.key))
    assert stored is not None and stored.host == host and stored.task_id == "task-1"
    pid = os.getpid()
    assert not release_attempt(r, "piped", "redlock", "task-1", "w_x%7C@host", pid)
    assert release_attempt(r, "piped", "redlock", "task-1", host, pid)  # the Lua side agrees
    assert not lock.locked()


# -- rows 10 and 11: permissions and a full Redis -------------------------------------------------

ACL_USERS = {
    "noevalsha": "~* +@all allchannels -evalsha",
    "nopublish": "~* +@all allchannels -publish",
    "noqueue": "~* +@all allchannels -zadd -zrem -zpopmin",
    "nozpopmin": "~* +@all allchannels -zpopmin",
    "nozrange": "~* +@all allchannels -zrange",
    "admin2": "~* +@all allchannels",
}
PASSWORD = "s3cr3t-acl-pw"


@pytest.fixture
def acl_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        admin = server.client()
        for user, rules in ACL_USERS.items():
            admin.execute_command("ACL", "SETUSER", user, "on", f">{PASSWORD}", *rules.split())
        admin.close()
        yield server


def user_url(server: RedisServer, user: str) -> str:
    return f"redis://{user}:{PASSWORD}@127.0.0.1:{server.port}/0"


def startup_errors(app: Any, caplog: pytest.LogCaptureFixture, **options: Any) -> list[str]:
    @app.task(base=LockedTask, name=f"{app.main}.checked", shared=False, **options)
    def checked() -> None:
        """A locked task, so that the checks run."""

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="celery_redlock.worker"):
        run_startup_checks(app, True)
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_the_startup_check_names_a_tls_file_that_does_not_exist(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """redis-py says "Error 2 connecting to ... No such file or directory." and no more: the
    worker's ERROR named no file, and the calls retried it as an outage."""
    missing = tmp_path / "ca.pem"
    url = f"rediss://127.0.0.1:{redis_server.port}/0?ssl_ca_certs={missing}"
    app = make_app(redis_server, "tls-missing", redlock_url=url)
    (error,) = startup_errors(app, caplog)
    assert "cannot reach the lock Redis" in error
    assert f"the URL names a file that does not exist: ssl_ca_certs={missing}" in error


@pytest.mark.parametrize(
    ("user", "named", "says"),
    [
        ("noevalsha", "EVALSHA", "refuses commands this package needs"),
        # The locks work without PUBLISH (the probe: acquire, extend and release did): it said
        # "until then lock operations fail".
        ("nopublish", "PUBLISH", "refuses the release notifications"),
    ],
)
def test_the_startup_check_names_a_command_the_acl_user_lacks(
    acl_server: RedisServer,
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
    user: str,
    named: str,
    says: str,
) -> None:
    app = make_app(redis_server, "acl", redlock_url=user_url(acl_server, user))
    (error,) = startup_errors(app, caplog)
    assert says in error and named in error and PASSWORD not in error
    if user == "nopublish":
        assert "until then a release does not wake the blocking waiters" in error
        assert "lock operations fail" not in error
    else:
        assert "until then lock operations fail" in error and "redlock_on_unavailable" in error
    assert lock_keys(acl_server.client()) == []  # the dry run holds nothing

    app = make_app(redis_server, "acl-ok", redlock_url=user_url(acl_server, "admin2"))
    assert startup_errors(app, caplog) == []


@pytest.mark.parametrize(
    ("user", "named", "consequence"),
    [
        ("noqueue", "ZADD", "a release then wakes every waiter of a lock, and each tries"),
        ("nozpopmin", "ZPOPMIN", "waiters queue, but a release does not reach them"),
        ("nozrange", "ZRANGE", "the waiter queued next is not woken to read the new holder's"),
    ],
)
def test_an_acl_user_without_the_waiter_queue_is_warned_about_not_refused(
    acl_server: RedisServer,
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
    user: str,
    named: str,
    consequence: str,
) -> None:
    """Each missing command of the queue is told what it does: without ``+zrange`` alone the
    lock is still handed over (the WARNING said every waiter is woken instead). A WARNING when
    a registered task waits; else INFO: the guide's ACL line, which leaves the queue out, is
    all that tasks with the default options need."""
    app = make_app(redis_server, f"acl-{user}", redlock_url=user_url(acl_server, user))
    assert startup_errors(app, caplog, lock_on_contention="wait") == []
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "queue of blocking waiters" in warning and named in warning
    assert consequence in warning, warning
    assert f"tasks that wait: {app.main}.checked" in warning
    assert PASSWORD not in warning

    skipping = make_app(redis_server, f"acl-{user}-skip", redlock_url=user_url(acl_server, user))
    assert startup_errors(skipping, caplog) == []
    assert [r for r in caplog.records if r.levelno == logging.WARNING] == []
    (info,) = [r.getMessage() for r in caplog.records if "queue of blocking" in r.getMessage()]
    assert "no registered task waits" in info and consequence in info

    by_default = make_app(
        redis_server,
        f"acl-{user}-default",
        redlock_url=user_url(acl_server, user),
        redlock_on_contention="wait",  # the tasks without a policy of their own wait
    )
    assert startup_errors(by_default, caplog) == []
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"tasks that wait: {by_default.main}.checked" in warning

    # A task's own policy wins over the setting's, and an unset one under lock_rate is retry.
    mixed = make_app(
        redis_server,
        f"acl-{user}-mixed",
        redlock_url=user_url(acl_server, user),
        redlock_on_contention="wait",
    )

    @mixed.task(base=LockedTask, name="mixed.skips", shared=False, lock_on_contention="skip")
    def skips() -> None:
        """Skips, whatever the setting says."""

    @mixed.task(base=LockedTask, name="mixed.rated", shared=False, lock_rate="10/m")
    def rated() -> None:
        """Retried under its rate."""

    assert startup_errors(mixed, caplog) == []
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.endswith(f"tasks that wait: {mixed.main}.checked")


def test_a_release_without_publish_says_exactly_what_happened(
    acl_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    lock = Lock(user_url(acl_server, "nopublish"), "unannounced", ttl=10)
    assert lock.acquire(blocking=False)
    with caplog.at_level(logging.WARNING, logger="celery_redlock.lock"):
        lock.release()  # no error: the lock was released
    assert not lock.locked()
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "released" in warning and "waiters were not notified" in warning
    assert lock.key in warning


def test_a_full_redis_is_unavailability_at_startup_and_for_tasks(
    redis_server: RedisServer, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with RedisServer(args=["--maxmemory-policy", "noeviction"]) as full:
        full.client().config_set("maxmemory", 1)  # every write is refused with OOM
        app = make_app(redis_server, "oom", redlock_url=full.url, redlock_on_unavailable="fail")
        (error,) = startup_errors(app, caplog)
        assert "out of memory" in error and "redlock_on_unavailable='fail'" in error

        @app.task(base=LockedTask)
        def stored(key: str) -> str:
            return key

        with running_worker(app):
            with pytest.raises(LockUnavailable, match=r"refused .*maxmemory"):
                stored.delay("k").get(timeout=10)
            app.conf.redlock_on_unavailable = "run"
            reset_settings(app)
            with caplog.at_level(logging.WARNING, logger="celery_redlock.task"):
                assert stored.delay("k").get(timeout=10) == "k"  # ran unlocked, as it says
    # It answered, with a refusal: the warning said it "does not answer" (helper probe, round 3).
    (unlocked,) = [r.getMessage() for r in caplog.records if "WITHOUT a lock" in r.getMessage()]
    assert "is unavailable (redlock_on_unavailable='run')" in unlocked
    assert "refused" in unlocked and "does not answer" not in unlocked


# -- row 12: the counter thread survives any failure ----------------------------------------------


def test_the_counter_thread_survives_a_cluster_outage_and_delivers_later(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    with ClusterNodes() as cluster:
        app = make_app(redis_server, "counted", redlock_url=cluster.url)
        for node in cluster.nodes:
            node.stop()
        with caplog.at_level(logging.WARNING, logger="celery_redlock.metrics"):
            for _ in range(3):
                metrics.count(app, "faults.counted", "acquired")
            wait_until(
                lambda: warned(caplog, "could not flush lock counters"), 10, "a failed flush"
            )
        thread = metrics._current().thread
        assert thread.is_alive()
        for node in cluster.nodes:
            node.start()
        for node in cluster.nodes:
            wait_until(lambda port=node.port: cluster_ok(port), 20, "the cluster to recover")

        def delivered() -> bool:  # by the thread itself: no flush() here
            with contextlib.suppress(redis_py.RedisError, LockUnavailable):
                return read_stats(app).get("faults.counted", {}).get("acquired") == 3
            return False

        wait_until(delivered, 20, "the kept counts to reach the cluster")
        assert thread.is_alive() and metrics._current().thread is thread


# -- row 14: a keyed digest, the same in the caller and in the worker -----------------------------


def test_lock_key_and_the_worker_agree_under_a_key_secret(
    redis_server: RedisServer, redis_url: str
) -> None:
    app = make_app(redis_server, "keyed", redlock_key_secret="s3cret")

    @app.task(base=LockedTask)
    def keyed(account_id: int) -> str:
        lock = current_lock()
        assert lock is not None
        return lock.key

    plain = make_app(redis_server, "plain")

    @plain.task(base=LockedTask, name=keyed.name, shared=False)
    def unkeyed(account_id: int) -> None:
        """The same task without a secret."""

    with running_worker(app):
        assert keyed.delay(48213).get(timeout=10) == lock_key(keyed, 48213)
    assert lock_key(keyed, 48213) != lock_key(unkeyed, 48213)


def test_a_release_that_fails_after_the_lease_ended_does_not_say_the_key_will_expire(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Helper probe, round 3, session 22: a lock lost when its lease ran out (the lock Redis
    down), whose release then failed, was reported as "it will expire within 9s", 11 s after
    the key had expired."""
    with RedisServer() as locks:
        app = make_app(redis_server, "lost-release", redlock_url=locks.url, redlock_lease=0.5)

        @app.task(base=LockedTask, lock_by=(), shared=False, name="faults.outlives")
        def outlives() -> bool:
            locks.stop()
            wait_until(lambda: current_lock().lost, 10, "the lease to run out")
            return True

        with caplog.at_level(logging.WARNING, logger="celery_redlock"):
            assert outlives.apply().get() is True
    said = [r.getMessage() for r in caplog.records if "could not release" in r.getMessage()]
    assert len(said) == 1, said
    assert "expires within" not in said[0]
    assert "its lease had already ended" in said[0]
