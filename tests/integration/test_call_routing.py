"""A bad per-call ``lock_*`` option raises in the caller and publishes nothing, for both APIs.

``LockedTask.apply_async`` checks its options itself; every other publish (``@single_instance``,
``app.send_task``, canvas) is checked by the router that :mod:`celery_redlock._celery.routing`
puts first in each app's router, finalized or not. Real Redis broker (db 1, one list per
queue): "nothing published" is an empty broker database. A publish that does not ask the app's
router is still checked by the ``before_task_publish`` receiver, which can only log, and by the
worker, which fails the call.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest
import redis as redis_py
from celery import Celery, chord
from celery.app.amqp import AMQP
from celery.app.routes import Router

from celery_redlock import LockConfigError, LockedTask, single_instance
from celery_redlock.testing import RedisServer
from support.apps import make_app
from support.workers import running_worker

APIS = ("task", "decorator")

#: Bad per-call options, and what the error says about each.
BAD: list[tuple[dict[str, Any], str]] = [
    ({"lock_ttl": -1}, "option lock_ttl=-1 is invalid; expected a number of seconds > 0"),
    ({"lock_on_contention": "bogus"}, "lock_on_contention='bogus' is invalid; expected one of"),
    ({"lock_wait_timeout": "x"}, "lock_wait_timeout='x' is invalid; expected a number"),
    ({"lock_tll": 5}, "unknown per-call option 'lock_tll'; did you mean 'lock_ttl'?"),
    ({"lock_bypass": "yes"}, "option lock_bypass='yes' is invalid; expected True or False"),
    ({"lock_limit": 2}, "option lock_limit cannot be given per call"),
]


@pytest.fixture
def broker(redis_server: RedisServer, redis_url: str) -> Iterator[redis_py.Redis]:
    client = redis_py.Redis(port=redis_server.port, db=1)
    yield client
    client.close()


def define(app: Celery, api: str, name: str, **task_options: Any) -> Any:
    """A task ``name`` on ``app`` locked under ``api`` (``by=()``)."""

    def work() -> str:
        return "ran"

    options = {"name": name, "shared": False, **task_options}
    if api == "task":
        return app.task(base=LockedTask, lock_by=(), **options)(work)
    return app.task(**options)(single_instance(by=())(work))


def published(broker: redis_py.Redis, queue: str = "celery") -> list[dict[str, Any]]:
    """The messages waiting in ``queue``, oldest first (kombu's JSON envelope)."""
    return [json.loads(raw) for raw in reversed(broker.lrange(queue, 0, -1))]


def assert_rejected(publish: Callable[..., Any], owner: str, message: str, **options: Any) -> None:
    """``publish(**options)`` raises the error of task ``owner`` that says ``message``."""
    with pytest.raises(LockConfigError) as raised:
        publish(**options)
    assert str(raised.value).startswith(f"task {owner}: "), raised.value
    assert re.search(re.escape(message), str(raised.value)), raised.value


@pytest.mark.parametrize("finalized", ["before", "after", "never"])
@pytest.mark.parametrize("api", APIS)
def test_a_bad_override_raises_in_the_caller_and_publishes_nothing(
    app: Celery, broker: redis_py.Redis, api: str, finalized: str
) -> None:
    """``apply_async``, a signature's ``apply_async``/``delay`` and ``send_task`` raise, on an
    app finalized before the task is defined (``@app.task`` builds it at once), after, or never
    (a client or a shell: ``@app.task`` and ``delay()`` do not finalize it)."""
    if finalized == "before":
        app.finalize()
    task = define(app, api, "proj.work")
    if finalized == "after":
        app.finalize()
    for options, message in BAD:
        assert_rejected(task.apply_async, "proj.work", message, **options)
        assert_rejected(task.signature(**options).delay, "proj.work", message)
        assert_rejected(partial(app.send_task, "proj.work"), "proj.work", message, **options)
    # A name this process does not know is checked too.
    assert_rejected(partial(app.send_task, "remote.job"), "remote.job", "-1", lock_ttl=-1)
    assert broker.keys("*") == []
    assert app.finalized == (finalized != "never")


@pytest.mark.parametrize("api", APIS)
def test_valid_overrides_travel_in_the_header(
    app: Celery, broker: redis_py.Redis, api: str
) -> None:
    """The check moves nothing: the receiver still puts the options into the ``redlock``
    header, and none is left among the message's properties."""
    task = define(app, api, "proj.work")
    app.finalize()
    task.apply_async(lock_on_contention="wait", lock_wait_timeout=2, lock_ttl=5)
    app.send_task("proj.work", lock_bypass=True)
    task.apply_async()
    first, second, plain = published(broker)
    assert first["headers"]["redlock"] == {
        "overrides": {"on_contention": "wait", "wait_timeout": 2.0, "ttl": 5.0}
    }
    assert second["headers"]["redlock"] == {"bypass": True}
    assert "redlock" not in plain["headers"]
    for message in (first, second, plain):
        assert not [n for n in message["properties"] if n.startswith("lock_")]


@pytest.mark.parametrize("api", APIS)
def test_routing_is_unchanged(app: Celery, broker: redis_py.Redis, api: str) -> None:
    """With the user's ``task_routes``, every call goes where it went without the check, with
    or without per-call options, and ``app.conf.update(task_routes=...)`` after the app
    finalized still changes the routes without losing the check."""
    app.conf.task_routes = {"proj.routed": {"queue": "special"}}
    routed = define(app, api, "proj.routed")
    other = define(app, api, "proj.other")
    app.finalize()
    routed.apply_async()
    routed.apply_async(lock_ttl=5)
    app.send_task("proj.routed", lock_on_contention="wait")
    other.apply_async(lock_ttl=5)
    assert len(published(broker, "special")) == 3
    assert len(published(broker, "celery")) == 1
    assert_rejected(routed.apply_async, "proj.routed", "lock_ttl=-1", lock_ttl=-1)

    app.conf.update(task_routes={"proj.other": {"queue": "elsewhere"}})
    other.apply_async(lock_ttl=5)
    routed.apply_async()
    assert len(published(broker, "elsewhere")) == 1
    assert len(published(broker, "celery")) == 2
    assert_rejected(other.apply_async, "proj.other", "lock_ttl=-1", lock_ttl=-1)
    assert_rejected(partial(app.send_task, "proj.routed"), "proj.routed", "'lock_ttl'", lock_tll=5)
    assert len(published(broker, "special")) == 3


def test_another_app_is_routed_by_its_own_settings(
    redis_server: RedisServer, broker: redis_py.Redis
) -> None:
    """Each app gets its own check: updating one app's routes (which on Celery 5.3 rebuilds
    every app's router) leaves the other app's routes and check in place."""
    first = make_app(redis_server, "first", task_routes={"proj.work": {"queue": "one"}})
    second = make_app(redis_server, "second")
    task = define(first, "decorator", "proj.work")
    first.finalize()
    second.finalize()
    second.conf.update(task_routes={"proj.work": {"queue": "two"}})
    task.apply_async()
    second.send_task("proj.work")
    assert [len(published(broker, q)) for q in ("one", "two")] == [1, 1]
    for app in (first, second):
        assert_rejected(partial(app.send_task, "proj.work"), "proj.work", "-1", lock_ttl=-1)


class OwnAMQP(AMQP):  # type: ignore[misc]
    """An app's own ``amqp_cls``: its routers are its own business."""


@pytest.mark.parametrize("past", ["a router of its own", "an amqp_cls of its own"])
def test_a_publish_past_the_app_router_is_failed_by_the_worker(
    app: Celery, caplog: pytest.LogCaptureFixture, past: str
) -> None:
    """A publish that does not ask our router (``router=`` given to ``apply_async``, or an app
    with an ``amqp_cls`` of its own that never finalized in the caller) goes ahead: the caller
    logs an ERROR, and the worker fails the call with ``LockConfigError`` before the body
    runs."""
    if past == "an amqp_cls of its own":
        app.amqp_cls = OwnAMQP
    runs: list[int] = []

    @app.task(name="proj.work", shared=False)
    @single_instance(by=())
    def work() -> None:
        runs.append(1)

    with caplog.at_level(logging.INFO):
        if past == "a router of its own":
            app.finalize()
            own = Router(queues=app.amqp.queues, app=app)
            result = work.apply_async(lock_on_contention="wiat", router=own)
        else:
            result = work.apply_async(lock_on_contention="wiat")
            assert not app.finalized
        with running_worker(app), pytest.raises(LockConfigError, match="did you mean 'wait'"):
            result.get(timeout=10)
    assert runs == []
    logged = [rec for rec in caplog.records if rec.levelno == logging.ERROR]
    assert any(result.id in rec.getMessage() and "wiat" in rec.getMessage() for rec in logged)


def test_an_app_created_after_the_import_refuses_an_unlocked_task_at_its_first_delay(
    redis_server: RedisServer, broker: redis_py.Redis
) -> None:
    """The README's layout: ``celery_redlock`` imported, then ``app = Celery(...)``, then the
    tasks, bound lazily. ``@app.task(lock_by=...)`` without ``base=LockedTask`` was published
    by ``delay()`` (the app, created after the import and not finalized, had Celery's own
    router), and ran unlocked until a worker refused to start. Every app created after the
    import gets the checking router."""
    app = Celery("late", broker=f"redis://127.0.0.1:{redis_server.port}/1", set_as_current=False)
    app.conf.redlock_url = f"redis://127.0.0.1:{redis_server.port}/0"

    @app.task(lock_by=["account_id"], name="late.sync")
    def sync(account_id: int) -> int:
        return account_id

    message = r"task late\.sync: option lock_by=\['account_id'\] is ignored: the task is not"
    with pytest.raises(LockConfigError, match=message):
        sync.delay(42)
    assert not app.finalized and published(broker) == []
    app.close()


@pytest.mark.parametrize("api", APIS)
def test_a_chord_with_lock_options_and_an_unlocked_body_completes(app: Celery, api: str) -> None:
    """Celery copies a chord's options into its body: a refusal of ``lock_*`` options on the
    unlocked body, at its publish by the worker, failed the chord after its header ran."""
    locked = define(app, api, "routing.locked_part")

    @app.task(shared=False, name="routing.plain_body")
    def plain_body(results: list[str]) -> int:
        return len(results)

    with running_worker(app, concurrency=2):
        done = chord([locked.s(), locked.s()], plain_body.s()).apply_async(lock_wait_timeout=5)
        assert done.get(timeout=20) == 2


def test_an_unlocked_task_s_lock_options_are_warnings_not_an_error_per_call(
    app: Celery, broker: redis_py.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Beat probe, round 3: a beat entry's ``lock_ttl='abc'`` on a task that takes no lock
    gave the WARNING that it is ignored, then at every tick an ERROR saying the worker would
    fail the call, which the worker ran. The options still travel in the header (a producer
    may have a plain stub of a task that the workers lock: review, round 3)."""

    @app.task(shared=False, name="routing.heartbeat")
    def heartbeat() -> int:
        return 1

    with caplog.at_level(logging.WARNING, logger="celery_redlock"):
        heartbeat.apply_async(lock_ttl="abc")
        heartbeat.apply_async(lock_ttl="abc")
        heartbeat.apply_async(lock_wait_timeout=5)
    said = [(rec.levelname, rec.getMessage()) for rec in caplog.records]
    assert said == [
        (
            "WARNING",
            "task routing.heartbeat takes no lock, so the per-call option lock_ttl is ignored (a "
            "task with base=LockedTask or @single_instance reads it; a group or chord passes its "
            "options to every part, a published chain to its first step)",
        ),
        (
            "WARNING",
            "routing.heartbeat: task routing.heartbeat: option lock_ttl='abc' is invalid; expected "
            "a number of seconds > 0 (at least 0.001: whole milliseconds) and <= 315360000 or "
            "None; a worker where the task takes no lock ignores it, one where it takes a lock "
            "fails the call",
        ),
    ]
    first, _, valid = published(broker)
    assert first["headers"]["redlock"] == {"invalid": {"ttl": "abc"}}
    assert valid["headers"]["redlock"] == {"overrides": {"wait_timeout": 5.0}}
    with running_worker(app):
        assert heartbeat.apply_async(lock_ttl="abc").get(timeout=10) == 1
