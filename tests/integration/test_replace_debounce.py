"""Newest wins (``lock_enqueue="replace"``) and debounce (``lock_debounce``, ``lock_debounce_max``)
on an in-process worker, under both APIs (``api`` is ``"task"`` for ``base=LockedTask``,
``"decorator"`` for ``@single_instance``).

A superseded call ends like a skip: state SUCCESS, result ``None``, and an INFO line naming the
task id of the newer call. The debounce tests publish calls a set interval apart (the input
pattern under test) and report the delay they measure; they assert orders, not durations.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis as redis_py
from celery import Celery, Task
from celery import signals as celery_signals

from celery_redlock import LockedTask, lock_key, single_instance
from celery_redlock._redis import companions
from celery_redlock._redis.keys import keys_for
from celery_redlock.testing import RedisServer, record_lock_events, wait_until
from support.apps import make_app
from support.servers import dead_port
from support.workers import Holder, running_worker

APIS = ("task", "decorator")


def define(app: Celery, api: str, fun: Callable[..., Any], **options: Any) -> Any:
    """Register ``fun`` (which takes ``self``) as a bound locked task under ``api``."""
    if api == "task":
        lock_options = {f"lock_{name}": value for name, value in options.items()}
        return app.task(base=LockedTask, bind=True, shared=False, **lock_options)(fun)
    return app.task(bind=True, shared=False)(single_instance(**options)(fun))


def superseded_by(text: str, result: Any) -> str | None:
    """The task id the INFO line of a superseded ``result`` names, if there is one."""
    found = re.search(rf"\[{result.id}\] superseded by (\S+): ", text)
    return found.group(1) if found else None


def assert_superseded_by_newer(text: str, calls: list[Any]) -> None:
    """Every call but the last names a later call (the newest when it started)."""
    ids = [c.id for c in calls]
    for index, old in enumerate(calls[:-1]):
        newer = superseded_by(text, old)
        assert newer in ids[index + 1 :], f"call {index} is not superseded by a later call"
    assert superseded_by(text, calls[-1]) is None


def holding_reindex(h: Holder) -> tuple[list[int], Callable[..., int]]:
    """A task body that records each version it runs, holding the key through version 0
    until ``h``'s gate opens; and the list it records into."""
    ran: list[int] = []

    def reindex(self: Task, doc: str, version: int) -> int:
        ran.append(version)
        if version == 0:
            h.hold()
        return version

    return ran, reindex


def queued_behind(
    h: Holder, app: Celery, task: Any, versions: list[int], concurrency: int, waits: str
) -> tuple[list[Any], list[Any]]:
    """Run version 0 (it holds the key), then call each of ``versions`` once the one before
    found the key held (``waits``: what the wait is for); open the gate. Version 0's result
    checked; the calls, and their results (each read within 20 s)."""
    with record_lock_events() as events, running_worker(app, concurrency=concurrency):
        running = task.delay("d", 0)
        assert h.entered.wait(10)
        calls = []
        for version in versions:
            calls.append(task.delay("d", version))
            wait_until(lambda: events.contended(calls[-1]), 10, waits)
        h.gate.set()
        assert running.get(timeout=10) == 0
        return calls, [call.get(timeout=20) for call in calls]


@pytest.mark.parametrize("api", APIS)
def test_replace_runs_only_the_newest_queued_call(
    h: Holder, app: Celery, r: redis_py.Redis, api: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Five calls queued while the key is held (the one pool thread runs the holder, so they
    wait in the worker): the running call finishes untouched, the first four end as superseded
    by the fifth, and only the fifth runs."""
    ran, reindex = holding_reindex(h)

    task = define(app, api, reindex, by=["doc"], enqueue="replace")
    with (
        caplog.at_level(logging.INFO, logger="celery_redlock.task"),
        running_worker(app, concurrency=1),
    ):
        running = task.delay("d", 0)
        assert h.entered.wait(10)
        calls = [task.delay("d", v) for v in range(1, 6)]
        newest = calls[-1]
        marker = lock_key(task, "d", 0) + ":newest"
        assert r.hget(marker, "id") == newest.id.encode()  # under the lock's hash tag
        h.gate.set()
        assert running.get(timeout=10) == 0  # the running call is never affected
        assert [c.get(timeout=10) for c in calls] == [None, None, None, None, 5]
    assert [c.state for c in calls] == ["SUCCESS"] * 5
    assert [superseded_by(caplog.text, c) for c in calls] == [newest.id] * 4 + [None]
    assert ran == [0, 5]


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("option", [{"enqueue": "replace"}, {"debounce": 0.1}])
@pytest.mark.parametrize("policy", ["wait", "retry", "skip", "fail"])
def test_a_retry_of_a_started_call_is_superseded_where_the_newer_call_runs_in_its_turn(
    app: Celery, r: redis_py.Redis, api: str, option: dict[str, Any], policy: str
) -> None:
    """A newer call published while the first runs supersedes the first's retry under
    ``wait`` and ``retry``, where the newer call runs in its turn: the retry used to run after
    it, with the older arguments. Under ``skip`` and ``fail`` the newer call may have ended
    unrun while the first held the lock, so the retry runs. (The newer call is due in an hour:
    it stays the newest, and never contends with the retry.)"""
    attempts: list[tuple[str, int]] = []

    def reindex(self: Task, doc: str, role: str) -> int:
        attempts.append((role, self.request.retries))
        if role == "first" and self.request.retries == 0:
            newer = task.apply_async((doc, "newer"), countdown=3600)
            assert r.hget(lock_key(task, doc, role) + ":newest", "id") == newer.id.encode()
            raise self.retry(countdown=0, max_retries=3)
        return int(self.request.retries)

    task = define(app, api, reindex, by=["doc"], on_contention=policy, **option)
    with running_worker(app, concurrency=2):
        first = task.delay("d", "first")
        if policy in ("wait", "retry"):
            assert first.get(timeout=10) is None  # superseded by "newer"
            assert attempts == [("first", 0)]
        else:
            assert first.get(timeout=10) == 1  # the retry ran, although "newer" is the newest
            assert attempts == [("first", 0), ("first", 1)]


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize(
    "policy",
    [
        {"on_contention": "wait", "wait_timeout": 0.3},
        {"on_contention": "retry", "retry_countdown": 0.1, "retry_for": 0.3},
    ],
    ids=["wait", "retry"],
)
def test_a_retry_runs_when_the_newer_call_ended_without_running(
    app: Celery, api: str, policy: dict[str, Any]
) -> None:
    """The newer call gave up on the key the first still held (``lock_wait_timeout``,
    ``lock_retry_for``) and failed: superseded by it, the first's retry would leave neither
    call's work done. It runs."""
    attempts: list[tuple[str, int]] = []

    def reindex(self: Task, doc: str, role: str) -> int:
        attempts.append((role, self.request.retries))
        if role == "first" and self.request.retries == 0:
            newer = task.delay(doc, "newer")
            wait_until(lambda: newer.state == "FAILURE", 20, "the newer call to give up")
            raise self.retry(countdown=0, max_retries=3)
        return int(self.request.retries)

    task = define(app, api, reindex, by=["doc"], enqueue="replace", **policy)
    with running_worker(app, concurrency=2):
        first = task.delay("d", "first")
        assert first.get(timeout=30) == 1  # the retry ran
    assert attempts == [("first", 0), ("first", 1)]


@pytest.mark.parametrize("api", APIS)
def test_a_retry_is_superseded_by_a_newer_call_whose_body_ran_and_failed(
    app: Celery, api: str
) -> None:
    """The newer call ran (a second slot of ``lock_limit=2``) and failed in its body: it did
    run its newer arguments, so the first's retry is superseded (only a failure to take the
    lock counts as not run)."""
    attempts: list[tuple[str, int]] = []

    def reindex(self: Task, doc: str, role: str) -> int:
        attempts.append((role, self.request.retries))
        if role == "newer":
            raise ValueError("the newer call's body failed")
        if self.request.retries == 0:
            newer = task.delay(doc, "newer")
            wait_until(lambda: newer.state == "FAILURE", 20, "the newer call to fail")
            raise self.retry(countdown=0, max_retries=3)
        return int(self.request.retries)

    task = define(app, api, reindex, by=["doc"], enqueue="replace", on_contention="wait", limit=2)
    with running_worker(app, concurrency=2):
        first = task.delay("d", "first")
        assert first.get(timeout=20) is None  # superseded
    assert attempts == [("first", 0), ("newer", 0)]


@pytest.mark.parametrize("api", APIS)
def test_a_call_superseded_while_it_waited_for_the_lock_does_not_run(
    h: Holder, app: Celery, api: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Calls 1 and 2 arrive while call 0 runs, each the newest then, and wait for the lock
    (``on_contention="wait"``). The check before the lock alone let call 1 run once call 0
    ended, and call 2 after it; call 1 is checked again once it has the lock, gives it back
    and ends as superseded, and only call 2 runs."""
    ran, reindex = holding_reindex(h)

    task = define(app, api, reindex, by=["doc"], enqueue="replace", on_contention="wait")
    with caplog.at_level(logging.INFO, logger="celery_redlock.task"):
        calls, results = queued_behind(h, app, task, [1, 2], 3, "the call to wait")
    assert results == [None, 2]
    assert ran == [0, 2]
    assert superseded_by(caplog.text, calls[0]) == calls[1].id


@pytest.mark.parametrize("api", APIS)
def test_debounce_collapses_a_burst_into_one_run_with_the_last_arguments(
    app: Celery, r: redis_py.Redis, api: str, caplog: pytest.LogCaptureFixture
) -> None:
    runs: list[tuple[int, float, Any]] = []

    def save(self: Task, doc: str, version: int) -> int:
        runs.append((version, time.monotonic(), self.request.eta))
        return version

    task = define(app, api, save, by=["doc"], debounce=0.5)
    with caplog.at_level(logging.INFO, logger="celery_redlock.task"), running_worker(app):
        calls = []
        for version in range(1, 6):
            calls.append(task.delay("d", version))
            last_call = time.monotonic()
            if version < 5:
                time.sleep(0.1)  # the input under test: calls 0.1 s apart
        results = [c.get(timeout=10) for c in calls]
    assert results == [None, None, None, None, 5]
    assert [c.state for c in calls] == ["SUCCESS"] * 5
    assert_superseded_by_newer(caplog.text, calls)
    assert len(runs) == 1
    version, started, eta = runs[0]
    assert version == 5 and eta is not None  # the last call's arguments, held until its ETA
    delay = started - last_call
    print(f"debounce 0.5 s: the run started {delay:.3f} s after the last call")
    assert started > last_call


@pytest.mark.parametrize("api", APIS)
def test_debounce_max_runs_a_steady_stream_at_least_every_max(app: Celery, api: str) -> None:
    """Calls every 0.1 s for 3 x debounce_max: each window is capped, so the key runs during
    the stream (at least twice), always with the newest arguments of its window."""
    runs: list[tuple[int, float]] = []

    def save(self: Task, doc: str, version: int) -> int:
        runs.append((version, time.monotonic()))
        return version

    task = define(app, api, save, by=["doc"], debounce=0.3, debounce_max=0.6)
    with running_worker(app):
        calls = []
        stream_end = time.monotonic() + 3 * 0.6
        while time.monotonic() < stream_end:
            calls.append(task.delay("d", len(calls)))
            last_call = time.monotonic()
            time.sleep(0.1)  # the input under test: a steady stream, closer than the debounce
        results = [c.get(timeout=10) for c in calls]
    during = [t for _, t in runs if t < last_call]
    print(
        f"debounce 0.3 s, max 0.6 s, {len(calls)} calls over 1.8 s: {len(runs)} runs, "
        f"{len(during)} during the stream"
    )
    assert len(during) >= 2
    versions = [v for v, _ in runs]
    assert versions == sorted(versions) and versions[-1] == len(calls) - 1
    assert [v for v, res in enumerate(results) if res is not None] == versions


@pytest.mark.parametrize("api", APIS)
def test_a_collapsed_run_never_overlaps_a_running_one(h: Holder, app: Celery, api: str) -> None:
    """The collapsed execution goes through the run-time lock: it waits for the running call
    of its key (``on_contention="wait"``) and starts after it ends."""
    spans: dict[int, list[float]] = {}

    def save(self: Task, doc: str, version: int) -> int:
        spans[version] = [time.monotonic()]
        if version == 1:
            h.hold()
        spans[version].append(time.monotonic())
        return version

    task = define(app, api, save, by=["doc"], debounce=0.2, on_contention="wait", wait_timeout=20)
    with record_lock_events() as events, running_worker(app, concurrency=2):
        first = task.delay("d", 1)
        assert h.entered.wait(10)  # ran after its debounce, and holds the key
        later = [task.delay("d", v) for v in (2, 3, 4)]
        wait_until(lambda: events.contended(later[-1]), 10, "the collapsed run to wait")
        assert 4 not in spans  # waiting for the lock, not running
        h.gate.set()
        assert first.get(timeout=10) == 1
        assert [c.get(timeout=10) for c in later] == [None, None, 4]
    assert sorted(spans) == [1, 4]
    assert spans[1][1] <= spans[4][0]  # no overlap: the collapsed run began after the first


def test_redis_unavailable_at_publish_never_drops_a_call(
    redis_server: RedisServer, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Without Redis the calls are published unstamped (they will run, never superseded), a
    debounced one still with its delay."""
    app = make_app(redis_server, redlock_url=f"redis://127.0.0.1:{dead_port()}/0")

    @app.task(base=LockedTask, lock_enqueue="replace", lock_by=(), shared=False)
    def replaced() -> None: ...

    @app.task(shared=False)
    @single_instance(debounce=30, by=())
    def debounced() -> None: ...

    with caplog.at_level(logging.WARNING, logger="celery_redlock.task"):
        ids = {replaced.delay().id for _ in range(2)} | {debounced.delay().id}
    assert len(ids) == 3
    queued = redis_py.Redis(port=redis_server.port, db=1)
    messages = [json.loads(m)["headers"] for m in queued.lrange("celery", 0, -1)]
    queued.close()
    assert len(messages) == 3  # all published
    assert [m["redlock_newest"] for m in messages] == [False] * 3
    assert [m["eta"] is not None for m in messages] == [True, False, False]  # LPUSH: newest first
    assert caplog.text.count("published without the newest-call marker") == 3
    app.close()


def test_calls_published_concurrently_keep_exactly_one_newest(
    app: Celery, r: redis_py.Redis
) -> None:
    """Eight threads publish at once: exactly one call runs, whichever the marker names."""
    ran: list[str] = []

    @app.task(base=LockedTask, bind=True, lock_enqueue="replace", lock_by=(), shared=False)
    def job(self: Task, n: int) -> int:
        ran.append(self.request.id)
        return n

    # A task of an app not yet finalized is built on first use, by Celery's PromiseProxy,
    # which is not thread-safe (two threads evaluating it at once raise AttributeError in
    # celery/local.py): build it here, before the threads race on its first delay().
    assert job.name.endswith(".job")
    results: list[Any] = []
    barrier = threading.Barrier(8)

    def publish(n: int) -> None:
        barrier.wait(5)
        results.append(job.delay(n))

    threads = [threading.Thread(target=publish, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    newest = r.hget(lock_key(job, 0) + ":newest", "id")  # lock_by=(): one key
    assert newest is not None and len(results) == 8
    with running_worker(app):
        outcomes = {res.id: res.get(timeout=10) for res in results}
    assert ran == [newest.decode()]
    assert sum(value is not None for value in outcomes.values()) == 1


@pytest.mark.parametrize("api", APIS)
def test_a_failed_publish_supersedes_nothing(
    h: Holder, app: Celery, redis_server: RedisServer, api: str
) -> None:
    """Issue 22 item 2. A call whose publish fails (its producer's broker does not answer)
    never becomes the newest: the queued call of its key still runs, with its arguments."""
    ran, reindex = holding_reindex(h)

    name = f"replace.failed.{api}"  # one lock name in both apps
    task = define(app, api, reindex, by=["doc"], enqueue="replace", name=name)
    dead = make_app(redis_server, "dead-broker", broker_url=f"redis://127.0.0.1:{dead_port()}/1")
    dead.conf.redlock_url = app.conf.redlock_url
    lost = define(dead, api, reindex, by=["doc"], enqueue="replace", name=name)
    with running_worker(app, concurrency=1):
        running = task.delay("d", 0)
        assert h.entered.wait(10)
        queued = task.delay("d", 1)
        with pytest.raises(Exception, match=r"(?i)connect|refused"):
            lost.apply_async(("d", 2), retry=False)  # a publish that really fails
        h.gate.set()
        assert running.get(timeout=10) == 0
        assert queued.get(timeout=10) == 1  # not superseded by the call that never existed
    assert ran == [0, 1]
    dead.close()


@pytest.mark.parametrize("via", ["another-task", "the-task-itself"])
@pytest.mark.parametrize("mode", ["replace", "debounce"])
@pytest.mark.parametrize("api", APIS)
def test_a_call_published_by_task_replace_is_numbered_as_any_call(
    app: Celery, r: redis_py.Redis, api: str, mode: str, via: str
) -> None:
    """``self.replace()`` gives the running task's id to its replacement, a new call of the
    locked task (here of key ``d``, replacing a call of another task, or of the same task on
    key ``e``): it is numbered and becomes the newest (with a debounce, it is delayed too).
    It used to pass for a requeue of the running call: unnumbered and run at once, so an older
    queued call of the key still ran after it, with older arguments."""
    ran: list[int] = []
    etas: dict[str, list[Any]] = {}

    def reindex(self: Task, doc: str, version: int, to: str | None = None) -> int | None:
        if to is not None:
            raise self.replace(task.si(to, version))
        ran.append(version)
        return version

    options: dict[str, Any] = {"enqueue": "replace"} if mode == "replace" else {"debounce": 3600}
    task = define(app, api, reindex, by=["doc"], **options)

    @app.task(bind=True, shared=False)
    def other(self: Task, doc: str, version: int) -> None:
        raise self.replace(task.si(doc, version))

    def replacer_delay(doc: str, version: int) -> Any:
        if via == "another-task":
            return other.delay(doc, version)
        # A bypass call is neither delayed by the debounce nor numbered: it runs at once.
        return task.apply_async(("e", version), {"to": doc}, lock_bypass=True)

    def record(headers: Any = None, **_: Any) -> None:
        etas.setdefault(headers["id"], []).append(headers.get("eta"))

    marker = lock_key(task, "d", 0) + ":newest"
    older = task.apply_async(("d", 1), countdown=3600)  # queued: due in an hour
    assert r.hget(marker, "id") == older.id.encode()
    celery_signals.after_task_publish.connect(record)
    try:
        with running_worker(app):
            newer = replacer_delay("d", 2)
            wait_until(lambda: r.hget(marker, "id") == newer.id.encode(), 10, "the newest call")
            if mode == "replace":
                assert newer.get(timeout=10) == 2
            else:  # two publishes of one id: the replaced call's, then its replacement's
                wait_until(lambda: len(etas.get(newer.id, [])) == 2, 10, "the replacement")
                assert etas[newer.id][1] is not None  # the replacement waits for its debounce
            older.revoke()
            newer.revoke()
    finally:
        celery_signals.after_task_publish.disconnect(record)
    assert ran == ([2] if mode == "replace" else [])


@pytest.mark.parametrize("trial", range(3))
def test_replace_with_retry_runs_the_newest_arguments_last(
    h: Holder, app: Celery, trial: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 22 item 4. Each call passes the newest check on arrival, finds the key held and
    is requeued (``on_contention="retry"``, with jitter); a requeue by the lock keeps its
    number, so when it comes back it is checked again: the older ones end as superseded (by
    the newest call published by then) and the last run has the newest arguments."""
    ran, reindex = holding_reindex(h)

    task = define(
        app,
        "task",
        reindex,
        by=["doc"],
        enqueue="replace",
        on_contention="retry",
        retry_countdown=0.2,
    )
    with caplog.at_level(logging.INFO, logger="celery_redlock.task"):
        calls, results = queued_behind(h, app, task, [1, 2, 3], 4, "the call to be requeued")
    assert results == [None, None, 3]
    assert ran == [0, 3]
    # The first call's requeue may come back before the third is published: then the second
    # supersedes it.
    assert_superseded_by_newer(caplog.text, calls)


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("option", ["replace", "debounce"])
def test_a_call_published_after_the_marker_expired_runs_and_supersedes_the_older_ones(
    app: Celery, r: redis_py.Redis, api: str, option: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Helper probe, round 3. Five calls wait in the broker (no worker yet); the marker
    expires (``lock_enqueue_ttl=1``), as it is lost when a Redis without persistence restarts;
    then a sixth call is published. Numbers started again at 1 in the new marker, so the
    fifth call's 5 passed for the newest and superseded the sixth: the newest call was lost.
    Numbers now follow the server's clock across markers: the sixth runs, and supersedes the
    five."""
    ran: list[int] = []

    def save(self: Task, doc: str, version: int) -> int:
        ran.append(version)
        return version

    supersede: dict[str, Any] = {"enqueue": "replace"} if option == "replace" else {"debounce": 0.2}
    task = define(app, api, save, by=["doc"], enqueue_ttl=1, **supersede)
    marker = lock_key(task, "d", 0) + ":newest"
    older = [task.delay("d", version) for version in range(1, 6)]
    wait_until(lambda: not r.exists(marker), 10, "the marker to expire")
    newest = task.delay("d", 6)
    with caplog.at_level(logging.INFO, logger="celery_redlock.task"), running_worker(app):
        assert newest.get(timeout=10) == 6
        assert [c.get(timeout=10) for c in older] == [None] * 5
    assert ran == [6]
    assert [superseded_by(caplog.text, c) for c in older] == [newest.id] * 5


@pytest.mark.parametrize("option", ["replace", "debounce"])
def test_calls_that_lost_their_marker_never_run_an_older_one_after_a_newer(
    app: Celery, r: redis_py.Redis, redis_server: RedisServer, option: str
) -> None:
    """Helper probe, round 3. Five calls wait in the broker; their marker is lost (a restart
    of the lock Redis without persistence; here deleted; an expiry alike); they reach the worker
    newest first (retries after an outage come back in any order; here the queue is
    reversed). Each found no marker and ran: the oldest ran last, its arguments undoing the
    newest. The first to start now records itself as the newest, so the older ones that
    start after it are superseded."""
    ran: list[int] = []

    def save(self: Task, doc: str, version: int) -> int:
        ran.append(version)
        return version

    supersede: dict[str, Any] = (
        {"enqueue": "replace"} if option == "replace" else {"debounce": 0.01}
    )
    task = define(app, "task", save, by=["doc"], **supersede)
    marker = lock_key(task, "d", 0) + ":newest"
    calls = [task.delay("d", version) for version in range(1, 6)]
    assert r.delete(marker) == 1
    broker = redis_py.Redis(port=redis_server.port, db=1)
    try:
        queued = broker.lrange("celery", 0, -1)  # newest first: the worker pops the right end
        assert len(queued) == 5
        with broker.pipeline() as pipe:
            pipe.delete("celery").rpush("celery", *reversed(queued)).execute()
    finally:
        broker.close()
    with running_worker(app, concurrency=1):
        assert [c.get(timeout=10) for c in calls] == [None, None, None, None, 5]
    assert ran == [5]
    assert r.hget(marker, "id") == calls[-1].id.encode()
    assert 0 < r.pttl(marker) <= 3600 * 1000  # lock_enqueue_ttl, by default an hour


def test_a_marker_written_at_a_start_lives_lock_enqueue_ttl(
    redis_url: str, r: redis_py.Redis
) -> None:
    """The marker a numbered call writes when it finds none carries that call and a TTL (never
    a key for good); an older call is then superseded by it, a newer one runs."""
    keys = keys_for("redlock", "doc")
    assert companions.check_newest(redis_url, keys, "call-2", 2_000, 60_000) is None
    assert r.hgetall(keys.newest) == {b"n": b"2000", b"id": b"call-2", b"seq": b"2000"}
    assert 0 < r.pttl(keys.newest) <= 60_000
    assert companions.check_newest(redis_url, keys, "call-1", 1_000, 60_000) == "call-2"
    assert companions.check_newest(redis_url, keys, "call-3", 3_000, 60_000) is None


@pytest.mark.parametrize("option", ["replace", "debounce"])
def test_an_older_call_requeued_for_an_outage_is_still_superseded(
    redis_server: RedisServer, option: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Helper probe, round 3. OLD is numbered while the lock Redis answers; at the worker the
    lock Redis is down, so ``redlock_on_unavailable="retry"`` requeues it, before its body
    ran. The requeue was unnumbered, as if the body had started: after the lock Redis came
    back and NEW was published, OLD's requeue ran after NEW, its old arguments undoing the
    newest. The requeue keeps its number, as a requeue by the lock does, and is superseded.
    Its WARNING said "so the call runs" when the marker could not be read, though the lock's
    ``redlock_on_unavailable`` decides (here: requeued)."""
    ran: list[str] = []
    supersede: dict[str, Any] = (
        {"lock_enqueue": "replace"} if option == "replace" else {"lock_debounce": 0.2}
    )
    with RedisServer() as lock_server:
        app = make_app(redis_server, redlock_url=lock_server.url, redlock_on_unavailable="retry")

        @app.task(base=LockedTask, bind=True, shared=False, lock_by=["doc"], **supersede)
        def save(self: Task, doc: str, version: str) -> str:
            ran.append(version)
            return version

        old = save.delay("d", "OLD")  # numbered; no worker yet
        lock_server.stop()
        with caplog.at_level(logging.WARNING, logger="celery_redlock.task"), running_worker(app):
            wait_until(lambda: old.state == "RETRY", 20, "OLD to be requeued for the outage")
            (unread, *_) = [m for m in caplog.messages if "newest-call marker" in m]
            assert "so it is not skipped as superseded, and goes on to the lock" in unread
            assert "redlock_on_unavailable" in unread, unread
            lock_server.start()  # empty: the marker is gone too
            new = save.delay("d", "NEW")
            assert new.get(timeout=20) == "NEW"
            assert old.get(timeout=30) is None  # superseded when its requeue came back
        app.close()
    assert ran == ["NEW"]


def test_a_newer_call_never_shortens_the_marker_below_an_older_eta(
    app: Celery, r: redis_py.Redis
) -> None:
    """Issue 22 item 9. An older call due in 3 s, then a newer one due now, with
    ``lock_enqueue_ttl=1``: the marker keeps the older call's TTL, so when the older call
    comes due it is still superseded (old arguments never run after new ones)."""
    ran: list[int] = []

    def save(self: Task, doc: str, version: int) -> int:
        ran.append(version)
        return version

    task = define(app, "task", save, by=["doc"], enqueue="replace", enqueue_ttl=1)
    marker = lock_key(task, "d", 0) + ":newest"
    with running_worker(app):
        older = task.apply_async(("d", 1), countdown=3)
        kept = r.pttl(marker)
        newer = task.delay("d", 2)
        assert r.pttl(marker) > kept - 500  # not shortened to lock_enqueue_ttl
        assert newer.get(timeout=10) == 2
        assert older.get(timeout=20) is None  # superseded at its ETA
    assert ran == [2]


def test_a_debounce_window_whose_newest_call_never_started_is_replaced(
    app: Celery, r: redis_py.Redis
) -> None:
    """Issue 22 item 10. The newest call of a window expires, so the window never closes;
    once its cap (and one debounce) has passed, the next call opens a new window: the next
    burst is collapsed into one run again."""
    ran: list[int] = []

    def save(self: Task, doc: str, version: int) -> int:
        ran.append(version)
        return version

    task = define(app, "task", save, by=["doc"], debounce=0.4, debounce_max=0.8)
    marker = lock_key(task, "d", 0) + ":newest"
    with running_worker(app):
        stuck = task.apply_async(("d", 0), expires=0.1)  # expired before its debounce ETA
        wait_until(lambda: stuck.state == "REVOKED", 10, "the expired call to be discarded")
        opened = int(r.hget(marker, "first") or 0)
        server_ms = lambda: int(r.time()[0]) * 1000 + r.time()[1] // 1000  # noqa: E731
        wait_until(lambda: server_ms() > opened + 1200, 10, "the stuck window's cap to pass")
        burst = []
        for version in (1, 2, 3):
            burst.append(task.delay("d", version))
            if version < 3:
                time.sleep(0.1)  # the input under test: a burst closer than the debounce
        assert [c.get(timeout=10) for c in burst] == [None, None, 3]
    assert ran == [3]


def test_a_bypass_call_writes_no_marker(app: Celery, r: redis_py.Redis) -> None:
    """Issue 22 item 10. ``lock_bypass=True`` runs without the lock: it neither becomes the
    newest nor opens a debounce window, and runs at once."""
    ran: list[int] = []

    def save(self: Task, doc: str, version: int) -> int:
        ran.append(version)
        return version

    task = define(app, "task", save, by=["doc"], debounce=5)
    with running_worker(app):
        assert task.apply_async(("d", 1), lock_bypass=True).get(timeout=10) == 1
    assert not r.exists(lock_key(task, "d", 0) + ":newest")
    assert ran == [1]


@pytest.mark.parametrize("api", ["class", "decorator"])
def test_a_retry_is_not_dropped_when_lock_by_fails_as_it_is_published(
    app: Celery, api: str
) -> None:
    """Review, round 3: the caller's router built the lock name of every publish of a
    ``replace`` task, its ``self.retry()`` too. A ``lock_by`` that reads a database and
    failed as the retry was published made Celery reject the retry (``Reject(requeue=False)``):
    the call was dropped. A publish from inside the task is left to the receiver, which
    numbers no retry. The first publish calls ``lock_by`` once, not once per layer."""
    blip = threading.Event()
    called: list[bool] = []

    def by(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        called.append(blip.is_set())
        if blip.is_set():
            raise ConnectionError("the database blipped")
        return str(args[0])

    runs: list[int] = []

    def work(self: Task, n: int) -> int:
        runs.append(self.request.retries)
        if self.request.retries == 0:
            blip.set()  # cleared once the retry is published (after_task_publish)
            raise self.retry(countdown=0.1)
        return n

    if api == "class":
        task = app.task(base=LockedTask, bind=True, lock_by=by, lock_enqueue="replace")(work)
    else:
        task = app.task(bind=True)(single_instance(by=by, enqueue="replace")(work))

    def clear(**_: Any) -> None:
        blip.clear()

    celery_signals.after_task_publish.connect(clear)
    try:
        first = task.delay(7)  # before a worker runs it, which calls lock_by too
        assert called == [False]  # once: the router's name is the receiver's too
        with running_worker(app):
            assert first.get(timeout=10) == 7
    finally:
        celery_signals.after_task_publish.disconnect(clear)
    assert runs == [0, 1]


@pytest.mark.parametrize(
    ("refused", "needs"),
    [
        (["-evalsha", "-eval"], "+evalsha (refused before the mark_newest script ran)"),
        (["-hset"], "+hget +hset"),  # inside the script: the feature's commands
    ],
)
def test_a_refused_call_names_what_the_acl_user_needs(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture, refused: list[str], needs: str
) -> None:
    """Helper probe, round 3. An ACL user refused ``EVALSHA`` itself was told to grant the
    script's commands (``+hget +hset +hdel``), which would not help; the refusal names the
    command it refused, and that is what the warning names now."""
    with RedisServer() as locks:
        admin = locks.client()
        admin.acl_setuser(
            "u",
            enabled=True,
            passwords=["+p"],
            keys=["*"],
            channels=["*"],
            commands=["+@all", *refused],
        )
        app = make_app(redis_server, redlock_url=f"redis://u:p@127.0.0.1:{locks.port}/0")

        @app.task(base=LockedTask, lock_enqueue="replace", lock_by=(), shared=False)
        def replaced() -> None: ...

        with caplog.at_level(logging.WARNING, logger="celery_redlock.task"):
            replaced.delay()
        warning = next(r.message for r in caplog.records if "newest-call marker" in r.message)
        assert f"the ACL user needs {needs}" in warning, warning
        admin.close()
        app.close()


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("option", [{"enqueue": "replace"}, {"debounce": 0.1}])
def test_unset_the_policy_retries_so_the_newest_call_runs_after_the_running_one(
    h: Holder, app: Celery, api: str, option: dict[str, Any]
) -> None:
    """Features probe, round 3: under the default ``skip``, the newest call, finding an
    older run of its key in progress, ended unrun; the last arguments never ran."""
    ran, reindex = holding_reindex(h)
    task = define(app, api, reindex, by=["doc"], retry_countdown=0.2, **option)
    _, results = queued_behind(h, app, task, [1], 2, "the newest call to find the key held")
    assert results == [1]
    assert ran == [0, 1]
