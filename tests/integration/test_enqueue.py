"""Enqueue-time de-duplication (``lock_enqueue=True``) on an in-process worker.

A worker started after the calls leaves them waiting in the broker queue (db 1, list
``celery``), which is how these tests hold a call "queued".
"""

from __future__ import annotations

import asyncio
import datetime
import inspect
import logging
import signal
import threading
import time
import zoneinfo
from collections.abc import Iterator
from typing import Any

import celery
import celery.worker.control
import pytest
import redis as redis_py
from celery import Celery, Task, chain, chord, group
from celery.backends.redis import RedisBackend
from celery.exceptions import TimeLimitExceeded
from celery.signals import before_task_publish
from django.utils.asyncio import async_unsafe
from kombu.exceptions import EncodeError

from celery_redlock import LockedTask, lock_key
from celery_redlock._celery import engine, results
from celery_redlock._celery.engine import WAIT_FOR_PUBLISH_S
from celery_redlock.testing import RedisServer, wait_until
from support.apps import lock_keys, make_app
from support.servers import dead_port
from support.workers import Holder, control_ready, running_worker
from tests.integration.test_script_keys import Monitor


@pytest.fixture
def broker(redis_server: RedisServer, redis_url: str) -> Iterator[redis_py.Redis]:
    client = redis_py.Redis(port=redis_server.port, db=1)
    yield client
    client.close()


def queued_key(task: Any, *args: Any) -> str:
    return lock_key(task, *args) + ":queued"


def test_a_queued_call_is_returned_instead_of_queued_again(
    app: Celery, r: redis_py.Redis, broker: redis_py.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[int] = []

    @app.task(base=LockedTask, lock_enqueue=True, lock_by=["account_id"])
    def sync(account_id: int, full: bool = False) -> int:
        ran.append(account_id)
        return account_id

    first = sync.delay(1)
    with caplog.at_level(logging.INFO, logger="celery_redlock.task"):
        again = sync.delay(1)
        also = sync.apply_async((1,), {"full": True})  # lock_by: only account_id counts
    assert again.id == also.id == first.id
    assert f"the same call is queued as {first.id}" in caplog.text
    other = sync.delay(2)  # another key is queued on its own
    assert other.id != first.id
    assert broker.llen("celery") == 2
    marker = queued_key(sync, 1)
    assert r.get(marker) == first.id.encode()
    assert 0 < r.pttl(marker) <= 3600 * 1000  # lock_enqueue_ttl, by default an hour
    with running_worker(app):
        assert again.get(timeout=10) == 1  # the queued call's result
        assert other.get(timeout=10) == 2
        wait_until(lambda: lock_keys(r) == [], 5, "the locks to be released")
    assert sorted(ran) == [1, 2]
    assert not r.exists(marker)  # cleared when that execution started


def test_a_de_duplicated_call_under_the_rpc_backend_warns_that_its_result_cannot_be_fetched(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Under ``rpc://`` a result goes only to the process that published the call: the
    ``AsyncResult`` of another call, returned by a de-duplicated ``delay()``, can never be
    fetched, and its ``get()`` waited forever without a word."""
    app = make_app(redis_server, "rpc", result_backend="rpc://")

    @app.task(base=LockedTask, lock_enqueue=True, name="rpc.sync")
    def sync(account_id: int) -> int:
        return account_id

    first = sync.delay(1)
    with caplog.at_level(logging.WARNING, logger="celery_redlock.task"):
        assert sync.delay(1).id == sync.delay(1).id == first.id
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "rpc.sync: lock_enqueue returned the queued call's" in warned[0]
    assert "the rpc:// result backend sends only to the process that published" in warned[0]
    app.close()


@pytest.mark.parametrize("mode", [True, "until_executed"])
def test_a_failed_publish_leaves_no_marker(
    app: Celery, r: redis_py.Redis, broker: redis_py.Redis, mode: object
) -> None:
    """A call whose publish raises (here an argument outside ``lock_by`` that JSON cannot
    encode; a broker outage alike) is not queued: its marker is cleared as the error
    propagates. Left behind, every later call of the key returned the never-published id
    for ``lock_enqueue_ttl``, and none ran."""

    @app.task(base=LockedTask, lock_enqueue=mode, lock_by=["account_id"])
    def sync(account_id: int, extra: object = None) -> int:
        return account_id

    with pytest.raises(Exception, match="not JSON serializable"):
        sync.delay(1, object())
    assert not r.exists(queued_key(sync, 1))
    assert broker.llen("celery") == 0
    later = sync.delay(1)
    assert r.get(queued_key(sync, 1)) == later.id.encode()
    with running_worker(app):
        assert later.get(timeout=10) == 1


def test_one_running_and_one_queued(
    h: Holder, app: Celery, r: redis_py.Redis, broker: redis_py.Redis
) -> None:
    """The marker clears when its execution starts: one call runs while one more waits."""
    ran: list[str] = []

    @app.task(base=LockedTask, bind=True, lock_enqueue=True)
    def report(self: Task, key: str) -> str:
        ran.append(self.request.id)
        if len(ran) == 1:
            h.hold()
        return self.request.id

    running = report.delay("daily")
    with running_worker(app, concurrency=1):
        assert h.entered.wait(10)
        assert not r.exists(queued_key(report, "daily"))  # cleared at start
        waiting = report.delay("daily")
        assert waiting.id != running.id  # one more may wait while one runs
        assert report.delay("daily").id == waiting.id  # but only one
        assert report.delay("daily").id == waiting.id
        assert r.get(queued_key(report, "daily")) == waiting.id.encode()
        h.gate.set()
        assert running.get(timeout=10) == running.id
        assert waiting.get(timeout=10) == waiting.id  # ran, not skipped: the holder was done
        assert not r.exists(queued_key(report, "daily"))
        assert report.delay("daily").get(timeout=10) is not None  # queued again once started
    assert len(ran) == 3


@pytest.mark.parametrize("policy", ["skip", "retry", "wait"])
def test_a_call_held_back_by_the_lock_keeps_its_marker_and_a_skipped_one_clears_it(
    h: Holder, app: Celery, r: redis_py.Redis, policy: str
) -> None:
    """A queued call that reaches a worker while the key is held, and is requeued by the lock
    (``retry``) or waits for it (``wait``), is still the one call that waits: later calls of
    the key return it. Its marker used to be cleared on arrival, so every call made while the
    key was held was published and ran (13 runs for 12 calls under ``retry``). One skipped
    (``skip``) has ended: its marker is cleared, and the next call is published."""
    ran: list[str] = []

    @app.task(
        base=LockedTask,
        bind=True,
        lock_enqueue=True,
        lock_by=(),  # one key for every call
        lock_on_contention=policy,
        lock_retry_countdown=0.2,
        max_retries=None,
    )
    def report(self: Task, role: str) -> str:
        ran.append(role)
        if role == "holder":
            h.hold()
        return role

    marker = queued_key(report, "x")
    with running_worker(app, concurrency=2):
        holder = report.delay("holder")
        assert h.entered.wait(10)
        assert not r.exists(marker)  # cleared when the holder started
        waiting = report.delay("waiting")
        if policy == "skip":
            assert waiting.get(timeout=10) is None  # found the lock held, skipped
            assert not r.exists(marker)
            assert report.delay("third").id != waiting.id
            h.gate.set()
            assert holder.get(timeout=10) == "holder"
            return
        # It reaches the worker and is held back (requeued, or waiting): still marked.
        waiters = lock_key(report, "x") + ":waiters"
        wait_until(lambda: waiting.state == "RETRY" or r.zcard(waiters) == 1, 10, "held back")
        assert r.get(marker) == waiting.id.encode()
        assert [report.delay("again").id for _ in range(3)] == [waiting.id] * 3
        h.gate.set()
        assert holder.get(timeout=10) == "holder"
        assert waiting.get(timeout=10) == "waiting"
    assert sorted(ran) == ["holder", "waiting"]


def test_a_lock_by_callable_sees_the_values_the_worker_sees(app: Celery, r: redis_py.Redis) -> None:
    """A callable got the caller's tuple and the worker's list (JSON has no tuples): the two
    computed different keys, the worker never cleared the caller's marker, and every later call
    of the value returned the finished call's result and never ran. Both now see a list, and
    mapping keys as strings."""
    seen: list[Any] = []

    def by(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        seen.append((args, kwargs))
        return repr(kwargs.get("y"))

    @app.task(base=LockedTask, lock_enqueue=True, lock_by=by)
    def pair(x: int, y: Any = None) -> int:
        return x

    with running_worker(app):
        first = pair.delay(1, y=(1, {2: "b"}))
        assert first.get(timeout=10) == 1
        wait_until(lambda: lock_keys(r) == [], 5, "the lock and the marker to be gone")
        second = pair.delay(2, y=(1, {2: "b"}))
        assert second.id != first.id and second.get(timeout=10) == 2
    assert lock_key(pair, 3, y=(1, {2: "b"})) == lock_key(pair, 3, y=[1, {"2": "b"}])
    assert {repr(kwargs["y"]) for _, kwargs in seen} == {"[1, {'2': 'b'}]"}


def by_repr(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    return repr((args, kwargs))


class _Stamp(datetime.datetime):
    """A ``datetime`` subclass, as pendulum's ``DateTime`` or freezegun's ``FakeDatetime``."""


def test_the_worker_clears_the_marker_of_values_its_serializer_changes(
    app: Celery, r: redis_py.Redis
) -> None:
    """The caller keyed a value by what it was, the worker by what it received: a
    ``datetime`` subclass (pendulum, freezegun) arrives as a ``datetime`` under JSON; under
    YAML a tuple arrives as a list and a mapping with its keys sorted. The worker never cleared
    the caller's marker, and every later call of the value returned the finished call's
    result, never ran, for the marker's hour (no result backend said the call had ended).
    So did a ``lock_by`` callable under JSON given an aware ``datetime`` (its ``ZoneInfo``
    arrives as a fixed offset) or a subclass: it saw the caller's object."""
    app.conf.accept_content = ["json", "yaml"]
    ran: list[str] = []

    @app.task(base=LockedTask, lock_enqueue=True, ignore_result=True)
    def stamped(at: datetime.datetime) -> None:
        ran.append("stamped")

    @app.task(
        base=LockedTask,
        lock_enqueue=True,
        ignore_result=True,
        serializer="yaml",
        lock_by=lambda args, kwargs: repr((args, kwargs)),
    )
    def listed(pair: Any, names: Any) -> None:
        ran.append("listed")

    @app.task(base=LockedTask, lock_enqueue=True, ignore_result=True, lock_by=by_repr)
    def zoned(at: datetime.datetime) -> None:
        ran.append("zoned")

    when = _Stamp(2026, 12, 6, 5, 0, tzinfo=datetime.timezone.utc)
    paris = datetime.datetime(2026, 12, 6, 6, 0, tzinfo=zoneinfo.ZoneInfo("Europe/Paris"))
    calls = [(stamped, (when,)), (listed, ((1, 2), {"b": 1, "a": 2})), (zoned, (paris,))]
    with running_worker(app):
        for number in (1, 2):
            for task, args in calls:
                task.delay(*args)
            wait_until(lambda n=number: len(ran) == 3 * n, 10, f"round {number} to run")
            wait_until(lambda: lock_keys(r) == [], 5, "the locks and the markers to be gone")
    assert sorted(ran) == ["listed"] * 2 + ["stamped"] * 2 + ["zoned"] * 2
    naive = datetime.datetime(2026, 12, 6, 5, 0, tzinfo=datetime.timezone.utc)
    assert lock_key(stamped, when) == lock_key(stamped, naive)
    assert lock_key(listed, (1, 2), {"b": 1, "a": 2}) == lock_key(listed, [1, 2], {"a": 2, "b": 1})


def test_the_marker_expires_after_lock_enqueue_ttl_and_is_cleared_owner_checked(
    h: Holder, app: Celery, r: redis_py.Redis, broker: redis_py.Redis
) -> None:
    @app.task(base=LockedTask, lock_enqueue=True, lock_enqueue_ttl=0.3, lock_by=())
    def job(n: int) -> int:
        if n == 1:
            h.hold()
        return n

    first = job.delay(1)
    marker = queued_key(job, 1)
    assert r.get(marker) == first.id.encode()
    wait_until(lambda: not r.exists(marker), 5, "the marker to expire")
    second = job.delay(2)  # the first never started, but its marker is gone: queued again
    assert second.id != first.id
    assert broker.llen("celery") == 2
    with running_worker(app, concurrency=1):
        assert h.entered.wait(10)
        # The first started; it cleared nothing, because the marker now names the second.
        assert r.get(marker) == second.id.encode()
        assert job.delay(3).id == second.id
        h.gate.set()
        assert first.get(timeout=10) == 1
        assert second.get(timeout=10) == 2


def test_a_retry_is_never_rejected_by_a_marker(h: Holder, app: Celery, r: redis_py.Redis) -> None:
    """Retries publish whatever marker is set: another call's, or the execution's own."""
    attempts: list[tuple[str, int]] = []

    @app.task(base=LockedTask, bind=True, lock_enqueue=True, lock_by=["key"], max_retries=3)
    def job(self: Task, key: str, role: str) -> int:
        attempts.append((role, self.request.retries))
        if self.request.retries == 0 and role == "first":
            h.hold()
            raise self.retry(countdown=0)
        if self.request.retries == 0 and role == "own":
            # As if the clear at start had been missed: the marker names this execution.
            r.set(queued_key(job, key, role), self.request.id)
            raise self.retry(countdown=0)
        return self.request.retries

    with running_worker(app, concurrency=1):
        first = job.delay("k", "first")
        assert h.entered.wait(10)
        newcomer = job.delay("k", "newcomer")  # queued while the first runs: the marker is its
        assert r.get(queued_key(job, "k", "newcomer")) == newcomer.id.encode()
        h.gate.set()
        assert first.get(timeout=10) == 1  # the retry was published, not replaced by newcomer
        assert newcomer.get(timeout=10) == 0
        own = job.delay("k", "own")
        assert own.get(timeout=10) == 1  # its own marker did not stop its retry
    assert ("first", 1) in attempts and ("own", 1) in attempts


def test_a_contended_retry_is_never_rejected_by_a_marker(
    h: Holder, app: Celery, r: redis_py.Redis
) -> None:
    @app.task(
        base=LockedTask,
        bind=True,
        lock_enqueue=True,
        lock_by=(),
        lock_on_contention="retry",
        lock_retry_countdown=0.05,
        max_retries=100,
    )
    def job(self: Task, role: str) -> int:
        if role == "holder":
            h.hold()
        return self.request.retries

    with running_worker(app, concurrency=2):
        holder = job.delay("holder")
        assert h.entered.wait(10)
        contender = job.delay("contender")  # starts, finds the lock held, retries
        wait_until(lambda: contender.state == "RETRY", 10, "the contender to retry")
        late = job.delay("late")  # marks the key while the contender's retries are due
        wait_until(lambda: late.state == "RETRY", 10, "the late call to retry too")
        h.gate.set()
        assert holder.get(timeout=10) == 0
        # Both ran after lock retries, which leave request.retries unchanged.
        assert contender.get(timeout=10) == 0
        assert late.get(timeout=10) == 0


def recorded_job(app: Celery, mode: Any, ran: list[int]) -> Any:
    """A task de-duplicated under ``mode`` (waiting for its key), recording each run in ``ran``."""

    @app.task(base=LockedTask, lock_enqueue=mode, lock_by=["n"], lock_on_contention="wait")
    def job(n: int) -> int:
        ran.append(n)
        return n

    return job


@pytest.mark.parametrize("mode", [True, "until_executed"])
def test_bypass_and_canvas_calls_are_never_deduplicated(
    app: Celery, r: redis_py.Redis, broker: redis_py.Redis, mode: Any
) -> None:
    """A ``lock_bypass`` call and a call with callbacks or in a canvas publish even while the
    same call is queued: returning the queued call's result instead would drop the bypass, the
    callbacks and the rest of the chain, and leave the group or chord waiting forever."""
    ran: list[int] = []
    job = recorded_job(app, mode, ran)

    @app.task
    def then(value: Any) -> list[Any]:
        return ["then", value]

    queued = {n: job.delay(n) for n in (7, 8, 9, 10, 11)}
    bypass = job.apply_async((7,), lock_bypass=True)
    members = group(job.s(8), job.s(8)).apply_async()
    body = chord([job.s(9), job.s(9)], then.s()).apply_async()
    chained = chain(job.s(10), then.s()).apply_async()
    linked = job.apply_async((11,), link=then.s())
    assert bypass.id != queued[7].id and linked.id != queued[11].id
    assert broker.llen("celery") == 12  # every call published
    with running_worker(app):
        assert bypass.get(timeout=10) == 7
        assert members.get(timeout=10) == [8, 8]
        assert body.get(timeout=10) == ["then", [9, 9]]
        assert chained.get(timeout=10) == ["then", 10]
        assert linked.get(timeout=10) == 11
        assert linked.children and linked.children[0].get(timeout=10) == ["then", 11]
        assert all(result.get(timeout=10) == n for n, result in queued.items())
        wait_until(lambda: lock_keys(r) == [], 5, "the locks to be released")
    assert sorted(ran) == [7, 7, 8, 8, 8, 9, 9, 9, 10, 10, 11, 11]


@pytest.mark.parametrize("mode", [True, "until_executed"])
def test_steps_a_worker_publishes_are_never_deduplicated(
    app: Celery, r: redis_py.Redis, mode: Any
) -> None:
    """A chain's last step, a ``link`` callback and a replacement are published by the worker
    (the last step with an empty ``chain``, the others with a parent): de-duplicated to a
    queued call, the chain's result stayed PENDING and the callback never ran."""
    ran: list[int] = []
    job = recorded_job(app, mode, ran)

    @app.task
    def first() -> str:
        return "first"

    @app.task(bind=True)
    def replaced(self: Task) -> None:
        raise self.replace(job.si(14))

    queued = {n: job.apply_async((n,), countdown=3600) for n in (12, 13, 14)}  # due in an hour
    with running_worker(app):
        assert chain(first.si(), job.si(12)).apply_async().get(timeout=10) == 12
        linked = first.apply_async(link=job.si(13))
        assert linked.get(timeout=10) == "first"
        assert linked.children and linked.children[0].get(timeout=10) == 13
        assert replaced.delay().get(timeout=10) == 14
        for result in queued.values():
            result.revoke()
    assert sorted(ran) == [12, 13, 14]


def test_send_task_bypasses_markers(app: Celery, r: redis_py.Redis, broker: redis_py.Redis) -> None:
    @app.task(base=LockedTask, lock_enqueue=True, lock_by=())
    def job() -> None: ...

    first = job.delay()
    by_name = app.send_task(job.name)
    assert by_name.id != first.id
    assert broker.llen("celery") == 2
    assert r.get(queued_key(job)) == first.id.encode()  # left as it was


def test_eager_calls_bypass_markers(app: Celery, r: redis_py.Redis) -> None:
    app.conf.task_always_eager = True

    @app.task(base=LockedTask, lock_enqueue=True, lock_by=())
    def job(n: int) -> int:
        return n

    assert [job.delay(n).get() for n in (1, 2)] == [1, 2]
    assert r.keys("*queued*") == []


def test_an_unreachable_redis_never_drops_a_call(
    redis_server: RedisServer,
    redis_url: str,
    broker: redis_py.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = make_app(redis_server, redlock_url=f"redis://127.0.0.1:{dead_port()}/0")

    @app.task(base=LockedTask, lock_enqueue=True, lock_by=())
    def job() -> None: ...

    with caplog.at_level(logging.WARNING, logger="celery_redlock.task"):
        ids = {job.delay().id for _ in range(2)}
    assert len(ids) == 2
    assert broker.llen("celery") == 2  # both published
    assert "enqueue de-duplication skipped: Redis at" in caplog.text
    app.close()


def test_a_call_made_while_the_queued_call_is_published_is_not_lost(
    app: Celery, r: redis_py.Redis, redis_server: RedisServer
) -> None:
    """Timeline: A marks its key and publishes; B, a call of the same key, finds A's marker
    and was given A's id; A's publish then fails (here an argument that does not serialize;
    a broker outage alike) and A's marker is cleared. B's caller held the id of a call that
    was never queued, and B never ran. B now waits for A's publish, and is queued itself."""

    @app.task(base=LockedTask, lock_enqueue=True, lock_by=["n"])
    def keep(n: int, extra: Any = None) -> int:
        return n

    monitor = Monitor(redis_server)
    joined: list[Any] = []

    def b_during_a_publish(headers: dict[str, Any] | None = None, **_: Any) -> None:
        if (headers or {}).get("id") != "task-A":
            return
        # The marker holds the bare task id while A is published (its publishing key says
        # the rest), as every reader, an older release's too, takes it.
        assert r.get(queued_key(keep, 7)) == b"task-A"
        call = threading.Thread(
            target=lambda: joined.append(keep.apply_async((7,), task_id="task-B")), daemon=True
        )
        call.start()
        wait_until(
            lambda: any("task-B" in line["command"] for line in monitor.lines),
            5,
            "B to find A's marker",
        )

    before_task_publish.connect(b_during_a_publish, weak=False)
    try:
        with pytest.raises(EncodeError):
            keep.apply_async((7,), {"extra": object()}, task_id="task-A")
        wait_until(lambda: joined, 5, "B's apply_async to return")
    finally:
        before_task_publish.disconnect(b_during_a_publish)
        monitor.close()
    assert joined[0].id == "task-B"
    assert r.get(queued_key(keep, 7)) == b"task-B"
    with running_worker(app):
        assert joined[0].get(timeout=10) == 7


def test_the_calls_after_a_caller_that_died_while_publishing_are_queued_once(
    app: Celery, r: redis_py.Redis, broker: redis_py.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller died between marking its call and publishing it: every call of the key in
    the next 30 s waited 10 s, then was published unmarked, one message each. The first now
    takes the marker over once its wait is past, and the next ones are de-duplicated to it."""
    monkeypatch.setattr(engine, "WAIT_FOR_PUBLISH_S", 0.3)

    @app.task(base=LockedTask, lock_enqueue=True, lock_by=["n"])
    def keep(n: int) -> int:
        return n

    marker = queued_key(keep, 1)
    r.set(marker, "dead-caller", px=30_000)  # what the dead caller left: marked, publishing
    r.set(marker.removesuffix(":queued") + ":publishing", "dead-caller", px=30_000)
    first = keep.delay(1)
    again = keep.delay(1)
    assert first.id != "dead-caller" and again.id == first.id
    assert r.get(marker) == first.id.encode() and broker.llen("celery") == 1


def test_callers_waiting_on_a_dead_publisher_wait_anew_for_the_one_that_took_it_over(
    app: Celery, r: redis_py.Redis, broker: redis_py.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Timeline: two calls of a key wait for a caller that died while publishing; past the
    wait the first takes the marker over and publishes. The second, its own wait on the dead
    caller long past, took the first's marker over at once and published too: two messages.
    It now waits anew for the call that took the marker over, and is given its id."""
    monkeypatch.setattr(engine, "WAIT_FOR_PUBLISH_S", 2.0)
    seen: dict[str, list[Any]] = {"call-1": [], "call-2": []}
    mark_queued = engine.companions.mark_queued

    def spy(target: Any, keys: Any, task_id: str, *rest: Any) -> Any:
        queued = mark_queued(target, keys, task_id, *rest)
        seen[task_id].append(queued)
        return queued

    monkeypatch.setattr(engine.companions, "mark_queued", spy)

    @app.task(base=LockedTask, lock_enqueue=True, lock_by=["n"])
    def keep(n: int) -> int:
        return n

    marker = queued_key(keep, 1)
    r.set(marker, "dead-caller", px=30_000)
    r.set(marker.removesuffix(":queued") + ":publishing", "dead-caller", px=30_000)
    returned: dict[str, str] = {}
    published: list[str] = []

    def hold_the_first_publish(headers: dict[str, Any] | None = None, **_: Any) -> None:
        taker = str((headers or {}).get("id"))
        published.append(taker)
        if len(published) > 1:
            return
        other = "call-2" if taker == "call-1" else "call-1"
        wait_until(
            lambda: other in returned or sum(1 for q in seen[other] if q == (taker, True)) >= 2,
            10,
            "the other call to see this one being published",
        )

    def call(task_id: str) -> None:
        returned[task_id] = keep.apply_async((1,), task_id=task_id).id

    before_task_publish.connect(hold_the_first_publish, weak=False)
    try:
        threads = [threading.Thread(target=call, args=(i,)) for i in ("call-1", "call-2")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(15)
    finally:
        before_task_publish.disconnect(hold_the_first_publish)
    assert len(published) == 1 and broker.llen("celery") == 1
    assert returned == {"call-1": published[0], "call-2": published[0]}
    assert r.get(marker) == published[0].encode()


def test_a_task_id_of_any_form_is_taken_as_it_is(app: Celery, r: redis_py.Redis) -> None:
    """A marker naming "?weekly-report" was taken for one still being published: every later
    call of the key waited, then was published beside the queued one."""

    @app.task(base=LockedTask, lock_enqueue=True)
    def report() -> str:
        return "done"

    first = report.apply_async(task_id="?weekly-report")
    started = time.monotonic()
    again = report.delay()
    assert again.id == first.id == "?weekly-report"
    assert time.monotonic() - started < WAIT_FOR_PUBLISH_S  # returned, not waited out
    assert r.get(queued_key(report)) == b"?weekly-report"


@pytest.mark.parametrize("mode", [True, "until_executed"])
def test_a_call_reusing_the_queued_calls_task_id_is_that_call(
    app: Celery, r: redis_py.Redis, broker: redis_py.Redis, mode: bool | str
) -> None:
    """Helper probe, round 3: a second ``apply_async(task_id="report-42")`` while that call
    was queued found its own id in the marker and was published again; the first execution
    cleared the marker and the second message ran the body a second time. It is the queued
    call now. An ended call's marker under that id is still replaced, and its call published."""
    ran: list[str] = []

    @app.task(base=LockedTask, lock_enqueue=mode, lock_by=["n"])
    def report(n: int) -> int:
        ran.append(report.request.id)
        return n

    first = report.apply_async((42,), task_id="report-42")
    again = report.apply_async((42,), task_id="report-42")
    assert again.id == first.id == "report-42"
    assert broker.llen("celery") == 1
    with running_worker(app):
        assert first.get(timeout=10) == 42
        wait_until(lambda: r.get(queued_key(report, 42)) is None, 5, "the marker to be cleared")
        assert ran == ["report-42"]
        r.set(queued_key(report, 42), "report-42", px=3_600_000)  # as a failed clear leaves it
        after = report.apply_async((42,), task_id="report-42")  # its call ended: published
        assert after.get(timeout=10) == 42
        wait_until(lambda: len(ran) == 2, 5, "the reused id's call to run")
    assert ran == ["report-42", "report-42"]


@pytest.mark.parametrize("form", ["aware", "naive-utc", "iso"])
def test_the_marker_ends_with_an_expires_of_any_form(
    app: Celery, r: redis_py.Redis, form: str
) -> None:
    @app.task(base=LockedTask, lock_enqueue=True)
    def report(day: str) -> str:
        return day

    at = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=5)
    expires = {"aware": at, "naive-utc": at.replace(tzinfo=None), "iso": at.isoformat()}[form]
    report.apply_async(("monday",), expires=expires)
    assert 0 < r.pttl(queued_key(report, "monday")) <= 5_000


def test_a_call_after_the_queued_calls_expiry_is_queued(app: Celery, r: redis_py.Redis) -> None:
    """A call made after the queued call's ``expires`` passed, and before a worker discarded
    it, was given its id: the worker then discarded both as one, and nothing ran (an hourly
    beat entry with ``expires`` lost a run after a backlog). The marker now lives no longer
    than the call can run."""

    @app.task(base=LockedTask, lock_enqueue=True)
    def report(day: str) -> str:
        return day

    first = report.apply_async(("monday",), expires=0.5)
    marker = queued_key(report, "monday")
    assert r.get(marker) == first.id.encode() and 0 < r.pttl(marker) <= 500
    wait_until(lambda: not r.exists(marker), 5, "the marker to end with the call's expiry")
    second = report.delay("monday")  # no worker yet: the expired call is still in the queue
    assert second.id != first.id
    with running_worker(app):
        assert second.get(timeout=10) == "monday"
        wait_until(lambda: first.state == "REVOKED", 10, "the worker to discard the expired call")


def test_the_marker_ends_with_the_task_s_own_expires(app: Celery, r: redis_py.Redis) -> None:
    """ETA probe, session 30: ``@app.task(..., expires=3)`` (Celery adds the task's
    ``expires`` to the options after ours were read) kept the marker for the hour of
    ``lock_enqueue_ttl``: a call made after the expiry got the expired call's id, which the
    worker discarded, and nothing ran. A per-call ``expires`` still wins, as in Celery."""

    @app.task(base=LockedTask, lock_enqueue=True, expires=0.5)
    def report(day: str) -> str:
        return day

    first = report.delay("monday")
    marker = queued_key(report, "monday")
    assert r.get(marker) == first.id.encode() and 0 < r.pttl(marker) <= 500
    wait_until(lambda: not r.exists(marker), 5, "the marker to end with the task's expires")
    second = report.delay("monday")  # no worker yet: the expired call is still in the queue
    assert second.id != first.id
    report.apply_async(("tuesday",), expires=60)
    assert 500 < r.pttl(queued_key(report, "tuesday")) <= 60_000
    with running_worker(app):
        assert second.get(timeout=10) == "monday"
        wait_until(lambda: first.state == "REVOKED", 10, "the worker to discard the expired call")


@pytest.mark.skipif(
    "mark_as_revoked" not in inspect.getsource(celery.worker.control._revoke),
    reason="this Celery marks a revoked call REVOKED only when it discards its message",
)
def test_a_call_after_a_revoke_is_not_swallowed_by_the_revoked_calls_marker(
    app: Celery, r: redis_py.Redis
) -> None:
    """A queued call with a countdown is revoked: the worker discards its message only at its
    ETA, and until then every call of the key got the revoked call's id and never ran. The
    result backend says REVOKED at once: the next call replaces the marker and runs."""

    @app.task(base=LockedTask, lock_enqueue=True, lock_by=["n"])
    def keep(n: int, v: str = "old") -> str:
        return v

    with running_worker(app) as worker:
        control_ready(app, worker)  # else the revoke may be broadcast before it listens
        first = keep.apply_async((11,), countdown=3600)
        marker = queued_key(keep, 11)
        assert r.get(marker) == first.id.encode()
        first.revoke()
        wait_until(lambda: first.state == "REVOKED", 10, "the revoke to reach the backend")
        second = keep.delay(11, v="new")
        assert second.id != first.id
        assert second.get(timeout=10) == "new"
        third = keep.apply_async((12,), countdown=3600)  # a live queued call still de-dups
        assert keep.delay(12).id == third.id
        third.revoke()


@pytest.mark.parametrize(
    ("option", "acks"),
    [
        ("acks_on_failure_or_timeout", False),
        ("acks_on_timeout", False),  # Celery 5.7's spelling
        ("acks_on_failure_or_timeout", True),
    ],
)
def test_a_hard_limit_failure_that_celery_requeues_keeps_its_marker(
    app: Celery, r: redis_py.Redis, option: str, acks: bool
) -> None:
    """Celery 5.7 stores FAILURE (``TimeLimitExceeded``) for a call that hit its hard time
    limit, then queues it again when it runs under ``acks_late`` with ``acks_on_timeout`` off
    (or the older ``acks_on_failure_or_timeout``). A ``delay()`` took that call for ended,
    replaced its marker and published a second call beside it. It is still the queued call.
    A timed-out call that is acknowledged (and every one before Celery 5.7) has ended."""

    @app.task(
        base=LockedTask,
        lock_enqueue="until_executed",
        acks_late=True,
        name=f"enq.limited_{option}_{acks}",
        **{option: acks},
    )
    def limited(n: int) -> int:
        return n

    requeues = not acks and celery.VERSION >= (5, 7)
    first = limited.delay(1)  # no worker: it stays queued, and its marker names it
    app.backend.mark_as_failure(first.id, TimeLimitExceeded(1.5))  # as the worker stores it
    again = limited.delay(1)
    assert (again.id == first.id) is requeues
    assert r.get(queued_key(limited, 1)) == (first.id if requeues else again.id).encode()


def test_a_body_that_exits_in_a_thread_pool_clears_its_marker(
    app: Celery, r: redis_py.Redis
) -> None:
    """A ``sys.exit()`` in a body (argparse, click) on a threads (or solo) pool: the marker
    was left for the worker's main process, as for a prefork child stopped by SIGTERM, but no
    main process settles it there, and every later ``delay()`` of the key was given the
    ended call's id for an hour."""
    ran = threading.Event()

    @app.task(base=LockedTask, lock_enqueue="until_executed", acks_late=True, name="enq.exits")
    def exits(n: int) -> None:
        ran.set()
        raise SystemExit(3)

    with running_worker(app):
        exits.delay(1)
        assert ran.wait(10)
        wait_until(lambda: not r.exists(queued_key(exits, 1)), 10, "the marker cleared")


@pytest.mark.parametrize("onto", ["itself", "other task", "other key"])
def test_a_call_replaced_on_its_key_keeps_its_marker_while_its_replacement_runs(
    app: Celery, r: redis_py.Redis, onto: str
) -> None:
    """``self.replace()`` publishes the replacement, which finishes the call under its task
    id, then raises ``Ignore``. Under ``until_executed`` that ``Ignore`` cleared the marker: a
    ``delay()`` while a replacement of the same task and key ran published a second call
    instead of returning the running one. That replacement clears the marker when it ends.
    Any other replacement clears it at once, as before: nothing would clear it at its end,
    and without a result backend every later call would be refused for ``lock_enqueue_ttl``."""
    gate, started = threading.Event(), threading.Event()

    @app.task
    def other(n: int) -> str:
        started.set()
        assert gate.wait(10)
        return "other"

    @app.task(base=LockedTask, bind=True, lock_enqueue="until_executed", lock_by=["n"])
    def job(self: Task, n: int, stage: str = "first") -> str:
        if stage == "first":
            replacement = {
                "itself": job.si(n, "second"),
                "other task": other.si(n),
                "other key": job.si(n + 1, "second"),
            }[onto]
            raise self.replace(replacement)
        started.set()
        assert gate.wait(10)
        return stage

    with running_worker(app):
        first = job.delay(5)
        assert started.wait(10)
        if onto != "itself":  # cleared once the Ignore of replace() reaches the lock code
            wait_until(lambda: r.get(queued_key(job, 5)) is None, 5, "the marker to be cleared")
        again = job.delay(5)
        if onto == "itself":
            assert r.get(queued_key(job, 5)) == first.id.encode()
        gate.set()
        assert (again.id == first.id) == (onto == "itself")
        ended = "other" if onto == "other task" else "second"
        assert first.get(timeout=10) == ended
        assert again.get(timeout=10) == ended  # the same call, or one of its own after it
        wait_until(lambda: r.get(queued_key(job, 5)) is None, 5, "the marker to be cleared")
        after = job.delay(5, stage="after")
        assert after.id not in (first.id, again.id)
        assert after.get(timeout=10) == "after"
    assert r.get(queued_key(job, 5)) is None


def test_a_marker_left_by_an_ended_call_is_replaced(app: Celery, r: redis_py.Redis) -> None:
    """The worker could not clear the marker (the lock Redis did not answer then: it logs a
    WARNING) and the call ended: every later call of the key got the ended call's id for
    ``lock_enqueue_ttl`` and never ran. The result backend says the call ended (SUCCESS or
    FAILURE): the next call replaces the marker and runs."""

    @app.task(base=LockedTask, lock_enqueue="until_executed", lock_by=["n"])
    def keep(n: int, v: str = "old") -> str:
        if v == "boom":
            raise ValueError("failed")
        return v

    with running_worker(app):
        for ended in ("old", "boom"):
            first = keep.delay(21, v=ended)
            first.get(timeout=10, propagate=False)
            assert first.state in ("SUCCESS", "FAILURE")
            marker = queued_key(keep, 21)
            r.set(marker, first.id, px=3600 * 1000)  # as a clear that failed leaves it
            second = keep.delay(21, v="new")
            assert second.id != first.id
            assert second.get(timeout=10) == "new"
            assert r.get(marker) is None


def test_a_discarded_calls_marker_is_cleared_within_the_main_process_timeout(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Helper probe, round 3. The worker's main process clears the queued marker of each
    revoked or expired message it discards (Celery's ``task_revoked``, sent from there). With
    the lock Redis frozen it waited the 5 s socket timeout per message, and started no task
    meanwhile; it waits the main process's 1 s now, and says it could not clear."""
    with RedisServer() as locks:
        assert locks.process is not None
        app = make_app(redis_server, "discarded", redlock_url=locks.url)

        @app.task(base=LockedTask, lock_enqueue="keep", shared=False)
        def kept(n: int) -> int:
            return n

        request = celery.app.task.Context(id="revoked-1", args=(1,), kwargs={})
        locks.process.send_signal(signal.SIGSTOP)
        try:
            with caplog.at_level(logging.WARNING, logger="celery_redlock.task"):
                start = time.monotonic()
                celery.signals.task_revoked.send(
                    sender=kept, request=request, terminated=False, signum=None, expired=True
                )
                elapsed = time.monotonic() - start
        finally:
            locks.process.send_signal(signal.SIGCONT)
        assert "could not clear the queued marker" in caplog.text
        assert elapsed < 3.0, f"the main process waited {elapsed:.1f}s for a frozen Redis"
        app.close()


class DjangoLikeBackend(RedisBackend):
    """A Redis result backend whose reads refuse a thread running an event loop, with Django's
    own guard: as ``django-db`` (django-celery-results) does through the ORM."""

    get_task_meta = async_unsafe(RedisBackend.get_task_meta)


def test_a_marker_of_an_ended_call_is_replaced_from_async_code_too(
    app: Celery, redis_server: RedisServer, r: redis_py.Redis
) -> None:
    """Django probe: from an ``async def`` view, the ``django-db`` backend raised
    ``SynchronousOnlyOperation``, the ended call behind a leftover marker was taken for still
    queued, and ``delay()`` returned its id: the new call never ran. Sync code published it."""

    @app.task(base=LockedTask, lock_enqueue=True, lock_by=["n"])
    def reindex(n: int) -> int:
        return n

    reindex.backend = DjangoLikeBackend(app=app, url=f"{redis_server.url.rsplit('/', 1)[0]}/2")
    ended = reindex.delay(13)  # no worker: it stays queued, and marks the key
    assert r.get(queued_key(reindex, 13)) == ended.id.encode()
    reindex.backend.mark_as_done(ended.id, 13)  # it ended; the worker did not clear the marker

    async def view() -> Any:
        return reindex.delay(13)

    again = asyncio.run(view())
    assert again.id != ended.id
    assert r.get(queued_key(reindex, 13)) == again.id.encode()


class SilentBackend(RedisBackend):
    """A result backend that does not answer reads."""

    def get_task_meta(self, task_id: str, cache: bool = True) -> Any:
        raise ConnectionError("the backend is down")


def test_a_result_backend_that_cannot_be_read_is_a_warning(
    app: Celery,
    redis_server: RedisServer,
    r: redis_py.Redis,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Django probe: the read's failure was dropped without a word, and ``delay()`` returned
    an ended call's id, logging only the INFO "the same call is queued"."""
    monkeypatch.setattr(results, "_warned", [-60.0])  # this process may have warned already

    @app.task(base=LockedTask, lock_enqueue=True, lock_by=["n"])
    def reindex(n: int) -> int:
        return n

    queued = reindex.delay(14)
    reindex.backend = SilentBackend(app=app, url=f"{redis_server.url.rsplit('/', 1)[0]}/2")
    with caplog.at_level(logging.WARNING, logger="celery_redlock.task"):
        assert reindex.delay(14).id == queued.id
        assert reindex.delay(14).id == queued.id
    said = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
    assert said == [
        f"{reindex.name}[{queued.id}]: could not read the result backend (ConnectionError: the "
        "backend is down); the lock goes on as without a result backend (a queued marker of "
        "the call is kept, a redelivered copy runs)"
    ]
