"""What a real ``celery worker`` logs about its lock Redis when it becomes ready.

The checks run on ``worker_ready``, before the worker logs ``ready.``: once
:meth:`WorkerProcess.start` has returned, their lines are in the log file.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from celery import Celery

from celery_redlock import LockedTask
from celery_redlock._celery.checks import run_startup_checks
from celery_redlock.testing import RedisServer
from support.apps import make_app
from support.servers import dead_port
from support.workers import WorkerProcess

pytestmark = pytest.mark.slow

APP = "tests.e2e.tooling_app"


def lines(worker: WorkerProcess, level: str) -> list[str]:
    """The ``celery_redlock`` messages of ``worker`` logged at ``level``."""
    return re.findall(rf"{level}/MainProcess\] (celery_redlock: .*)", worker.text())


def test_an_evicting_maxmemory_policy_is_a_warning_naming_it() -> None:
    with (
        RedisServer(args=["--maxmemory-policy", "allkeys-lru"]) as server,
        WorkerProcess(server.port, "w1", app=APP) as worker,
    ):
        (warning,) = lines(worker, "WARNING")
        info = lines(worker, "INFO")
    assert f"Redis at redis://127.0.0.1:{server.port}/0 has maxmemory-policy allkeys-lru" in warning
    assert "evict a held lock" in warning and "noeviction" in warning
    assert any(
        re.match(r"celery_redlock: locks on Redis \d+\.\d+\.\d+ at redis://", i) for i in info
    )
    assert not any("enforces no time limits" in i for i in info)  # prefork enforces them


def test_a_threads_pool_worker_says_which_ttl_rule_applies(
    redis_server: RedisServer, redis_url: str
) -> None:
    with WorkerProcess(redis_server.port, "w1", app=APP, pool="threads") as worker:
        info = lines(worker, "INFO")
        assert lines(worker, "WARNING") == []  # noeviction: nothing to warn about
    (rule,) = [i for i in info if "time limits" in i]
    assert rule.startswith("celery_redlock: the threads pool enforces no time limits")
    assert "redlock_lease=30s" in rule


def test_an_unreachable_lock_redis_is_one_error_and_the_worker_still_runs(
    redis_server: RedisServer, redis_url: str
) -> None:
    port = dead_port()
    url = f"redis://:hunter2@127.0.0.1:{port}/0"
    client: Celery = make_app(redis_server, name="tooling_app")
    with WorkerProcess(redis_server.port, "w1", app=APP, env={"REDLOCK_TEST_URL": url}) as worker:
        (error,) = lines(worker, "ERROR")
        # The worker keeps serving: a task that needs no lock still runs.
        assert client.control.ping(destination=[f"w1@{worker_host(worker)}"], timeout=5)
        text = worker.text()
    client.close()
    assert error.startswith(
        f"celery_redlock: cannot reach the lock Redis at redis://***@127.0.0.1:{port}/0"
    )
    assert "redlock_on_unavailable='retry'" in error
    assert "hunter2" not in text


@pytest.mark.parametrize(
    ("path", "fix"),
    [
        ("u:wrong-hunter2@{host}/0", "the user name or password is wrong"),
        ("{host}/99", "the database number is above the server's 'databases' setting"),
        ("u:hunter2@{host}/3", "the ACL user lacks +select"),
        # redis-py raises AuthenticationError here too; it was called a wrong password.
        ("{host}/0", "the server wants a password (or an ACL user) that the URL does not give"),
    ],
    ids=["password", "database", "select", "no-password"],
)
def test_a_lock_redis_that_refuses_the_login_is_an_error_naming_the_fix(
    caplog: pytest.LogCaptureFixture, path: str, fix: str
) -> None:
    """The server answered: "cannot reach" would send the user to the network."""
    with RedisServer() as server:
        admin = server.client()
        admin.execute_command(
            "ACL", "SETUSER", "u", "on", ">hunter2", "~*", "&*", "+@all", "-select"
        )
        if "does not give" in fix:  # the default user wants a password the URL does not give
            admin.execute_command("ACL", "SETUSER", "default", "resetpass", ">hunter2")
        url = "redis://" + path.format(host=f"127.0.0.1:{server.port}")
        app = make_app(server, name="refused", redlock_url=url)

        @app.task(base=LockedTask, shared=False)
        def work() -> None: ...

        with caplog.at_level(logging.INFO, logger="celery_redlock.worker"):
            run_startup_checks(app, pool_enforces_limits=True)
        app.close()
    (error,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert error.startswith("celery_redlock: the lock Redis at redis://")
    assert "refused the connection" in error and fix in error and "fix redlock_url" in error
    assert "cannot reach" not in error and "hunter2" not in caplog.text


def worker_host(worker: WorkerProcess) -> str:
    found = re.search(r"INFO/MainProcess\] w1@(\S+) ready\.", worker.text())
    assert found is not None
    return found.group(1)


def test_volatile_policies_warn_too_and_apps_without_locked_tasks_are_left_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with RedisServer(args=["--maxmemory-policy", "volatile-ttl"]) as server:
        plain = Celery("plain", set_as_current=False)  # no locked task, no redlock_url
        locked = make_app(server, name="locked")

        @locked.task(base=LockedTask, shared=False)
        def work() -> None: ...

        with caplog.at_level(logging.INFO, logger="celery_redlock.worker"):
            run_startup_checks(plain, pool_enforces_limits=False)
            assert caplog.messages == []
            run_startup_checks(locked, pool_enforces_limits=True)
        plain.close()
        locked.close()
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "maxmemory-policy volatile-ttl" in warning and "volatile-* evicts them too" in warning
    assert not any("time limits" in m for m in caplog.messages)


def test_a_quorum_with_a_minority_down_warns_and_without_a_majority_errs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with RedisServer() as a, RedisServer() as b:
        # two servers that are down: one server is one node
        dead, other_dead = (f"redis://127.0.0.1:{dead_port()}/0" for _ in range(2))
        tolerant = make_app(a, name="tolerant", redlock_url=[a.url, b.url, dead])
        broken = make_app(a, name="broken", redlock_url=[a.url, dead, other_dead])
        for app in (tolerant, broken):

            @app.task(base=LockedTask, shared=False)
            def work() -> None: ...

        with caplog.at_level(logging.INFO, logger="celery_redlock.worker"):
            run_startup_checks(tolerant, pool_enforces_limits=True)
            minority = [(r.levelno, r.getMessage()) for r in caplog.records]
            caplog.clear()
            run_startup_checks(broken, pool_enforces_limits=True)
            majority = [(r.levelno, r.getMessage()) for r in caplog.records]
        tolerant.close()
        broken.close()
    assert [lvl for lvl, _ in minority if lvl >= logging.WARNING] == [logging.WARNING]
    assert [lvl for lvl, m in majority if lvl == logging.ERROR and "no quorum" in m] == [
        logging.ERROR
    ]


def _guide_acl_rules() -> list[str]:
    """The least-privilege ACL line of docs/guide.md, as ``ACL SETUSER`` rules."""
    guide = (Path(__file__).parents[2] / "docs" / "guide.md").read_text()
    found = re.search(r"^user redlock (.*)$", guide, re.MULTILINE)
    assert found is not None
    return found.group(1).split()


def _guide_addition(feature: str) -> list[str]:
    guide = (Path(__file__).parents[2] / "docs" / "guide.md").read_text()
    found = re.search(rf"^\| {re.escape(feature)} \| `([^`]*)` \|", guide, re.MULTILINE)
    assert found is not None, feature
    return found.group(1).split()


def test_the_documented_acl_line_starts_a_worker_without_an_error(
    redis_server: RedisServer, redis_url: str
) -> None:
    """Issue 24 item 6. A real worker whose lock Redis user has exactly the guide's line:
    no ERROR for plain locked tasks; with replace/debounce tasks one ERROR naming what to
    grant, and none once the guide's addition for them is granted."""
    rules = _guide_acl_rules()
    replace = _guide_addition('`lock_enqueue="replace"`, `lock_debounce`')
    with RedisServer() as locks:
        admin = locks.client()
        admin.execute_command("ACL", "SETUSER", "redlock", *rules)
        admin.execute_command("ACL", "SETUSER", "redlock-replace", *rules, *replace)
        admin.close()

        def start(user: str, replace_tasks: bool) -> WorkerProcess:
            url = f"redis://{user}:secret@127.0.0.1:{locks.port}/0"
            knobs = {"REDLOCK_TEST_URL": url, "REDLOCK_TEST_REPLACE": "1" if replace_tasks else ""}
            return WorkerProcess(redis_server.port, "w1", app="tests.e2e.acl_app", env=knobs)

        with start("redlock", replace_tasks=False) as worker:
            assert lines(worker, "ERROR") == []
            assert any("only the `celery redlock` command line" in i for i in lines(worker, "INFO"))
        with start("redlock", replace_tasks=True) as worker:
            (error,) = lines(worker, "ERROR")
        assert "HGET, HSET, HDEL" in error and "+hget +hset +hdel" in error
        assert "acl_app.replaced" in error and "acl_app.debounced" in error
        assert "secret" not in error
        with start("redlock-replace", replace_tasks=True) as worker:
            assert lines(worker, "ERROR") == []


@pytest.mark.parametrize(
    ("pool", "warned"), [("gevent", True), ("eventlet", True), ("threads", False)]
)
def test_a_green_pool_is_a_warning_that_cpu_bound_tasks_outlive_their_lease(
    caplog: pytest.LogCaptureFixture, redis_server: RedisServer, pool: str, warned: bool
) -> None:
    app = make_app(redis_server, name="green")

    @app.task(base=LockedTask, shared=False)
    def work() -> None: ...

    with caplog.at_level(logging.INFO, logger="celery_redlock.worker"):
        run_startup_checks(app, pool_enforces_limits=pool == "gevent", pool=pool)
    app.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if not warned:
        assert warnings == []
        return
    (warning,) = warnings
    assert warning.startswith(f"celery_redlock: the {pool} pool renews locks in a greenlet")
    assert "redlock_lease=30s" in warning and "lock_ttl" in warning
    # Helper probe, round 3, session 22: under a hard time limit T the lock ends at T + the
    # margin, which can be far shorter than the lease (8 s against 30 s), and the warning
    # named only the lease. A pools probe, session 30: eventlet enforces no time limit, and
    # its warning spoke of one.
    assert ("past T + redlock_ttl_margin=5s" in warning) == (pool == "gevent")
    assert "lease=30s loses its lock" in warning or "(the pool stops" in warning


def test_the_broker_url_fallback_is_said_in_the_worker_log(
    caplog: pytest.LogCaptureFixture, redis_server: RedisServer
) -> None:
    """The settings read that first notices the fallback runs before Celery sets up logging
    (its INFO line goes nowhere in a worker); the startup checks say it again."""
    app = Celery(
        "fallback", broker=f"redis://:pw@127.0.0.1:{redis_server.port}/3", set_as_current=False
    )

    @app.task(base=LockedTask, shared=False)
    def work() -> None: ...

    with caplog.at_level(logging.INFO, logger="celery_redlock.worker"):
        run_startup_checks(app, pool_enforces_limits=True)
    app.close()
    said = [
        r.getMessage()
        for r in caplog.records
        if r.name == "celery_redlock.worker" and "redlock_url is not set" in r.getMessage()
    ]
    assert said == [
        "celery_redlock: redlock_url is not set; locks live on the Redis broker at "
        f"redis://***@127.0.0.1:{redis_server.port}/3"
    ]
