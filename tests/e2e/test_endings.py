"""Every way a locked task can end, on real prefork workers: who releases, and how fast.

Each test drives ``tests.e2e.proj.ending`` (or a task sharing its lock) into one ending and
checks that the lock key is released by the right process, that no code of the ending attempt
runs after its lock is gone, and that the next execution of the same key then runs.

Every ending is proved under both APIs: ``api`` is ``"task"`` (``LockedTask``) or
``"decorator"`` (``@single_instance``), and picks the tasks by role
(:data:`tests.e2e.conftest.API_TASKS`). The two variants of a test run one after the other
against the same worker subprocesses (:meth:`Env.worker`); the endings that stop the worker
(shutdowns, the whole worker killed) run both APIs side by side in one worker instead.

Latencies are measured against the moment of the kill (or revoke, or signal) with a 2 ms poll
of the lock key, and printed (run with ``-s`` to see them).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import celery
import kombu
import pytest
import redis as redis_py
from celery import Celery, chord, group
from celery.result import AsyncResult

from celery_redlock.testing import RedisServer, wait_until
from support.apps import API_TASKS, lock_keys, make_app
from support.polling import wait_for_change, watch_events
from support.procfs import pid_alive
from support.workers import WorkerProcess

pytestmark = pytest.mark.slow

APIS = tuple(API_TASKS)
#: The outermost parametrize: pytest varies it fastest, so a test's API variants run in a row.
over_apis = pytest.mark.parametrize("api", APIS)

PARENT_RELEASE = "released the lock of dead child"
COOLDOWN = 6.0  # tests.e2e.proj.COOLDOWN (that module is the workers' app: not imported here)
ACKS_LATE = {"REDLOCK_TEST_ACKS_LATE": "1"}
CELERY_VERSION = tuple(map(int, celery.__version__.split(".")[:2]))
CELERY_57 = CELERY_VERSION >= (5, 7)
#: kombu < 5.7 has no ``unacked_restore_interval``: it sweeps for unacked messages every 10 s
#: and scans on one sweep in 10, so a redelivery comes only minutes after the visibility timeout.
KOMBU_57 = tuple(map(int, kombu.__version__.split(".")[:2])) >= (5, 7)
#: Celery's periodic maintain_pool: the latest a worker notices a dead child. Measured: ~20 ms,
#: or this tick, in about half the runs: the child's sentinel pipe becomes readable before the
#: child can be reaped, asynpool's _event_process_exit then finds no exited process and stops
#: watching that sentinel.
MAINTAIN_POOL = 5.0
#: The main process releases this soon after it noticed (log timestamps have 1 ms resolution).
MS_AFTER_NOTICE = 0.5


#: Worker subprocesses kept between the two API variants of one test, by (test, worker).
_shared: dict[tuple[Any, ...], WorkerProcess] = {}


@dataclass
class Env:
    port: int
    client: Celery
    locks: redis_py.Redis  # db 0
    records: redis_py.Redis  # db 3
    #: The test's parameters but the API: the variants sharing a worker.
    variant: tuple[Any, ...] = ()
    api: str = APIS[0]
    #: Whether another API variant of the test follows (it reuses the workers).
    followed: bool = False

    def send(self, role: str = "ending", api: str | None = None, **kwargs: Any) -> AsyncResult:
        """Call the task playing ``role`` under ``api`` (default: the test's)."""
        options = {k: kwargs.pop(k) for k in ("time_limit", "soft_time_limit") if k in kwargs}
        name = API_TASKS[api or self.api][role]
        return self.client.send_task(f"tests.e2e.proj.{name}", kwargs=kwargs, **options)

    @contextlib.contextmanager
    def worker(self, name: str = "w1", **options: Any) -> Iterator[WorkerProcess]:
        """A running worker; the test's next API variant gets the same one (same options).

        Killed at the end of the last variant, or at once if a variant fails, so that the next
        variant starts clean.
        """
        shared = (self.variant, name, repr(sorted(options.items())))
        worker = _shared.pop(shared, None)
        if worker is None or worker.process is None or worker.process.poll() is not None:
            worker = WorkerProcess(self.port, name, app="tests.e2e.proj", **options).start()
        keep = False
        try:
            yield worker
            keep = self.followed
        finally:
            if keep:
                _shared[shared] = worker
            else:
                worker.kill()

    def starts(self, key: str) -> list[dict[str, Any]]:
        return [json.loads(e) for e in self.records.lrange(f"starts:{key}", 0, -1)]

    def exits(self, key: str) -> list[dict[str, Any]]:
        return [json.loads(e) for e in self.records.lrange(f"exits:{key}", 0, -1)]

    def hooks(self, task_id: str) -> list[str]:
        return [h.decode() for h in self.records.lrange(f"hooks:{task_id}", 0, -1)]

    def started(self, key: str, count: int = 1, timeout: float = 15.0) -> dict[str, Any]:
        """Wait until the key's ``count``-th execution has started; return its record."""
        wait_until(
            lambda: self.records.llen(f"starts:{key}") >= count,
            timeout,
            f"execution #{count} of {key} to start",
        )
        return self.starts(key)[count - 1]

    def lock_key(self, task_id: str) -> str:
        return self.records.get(f"lockkey:{task_id}").decode()  # type: ignore[union-attr]

    def holds(self, lock_key: str, token: str) -> bool:
        return self.locks.get(lock_key) == token.encode()

    def waiting(self, lock_key: str) -> bool:
        """Whether some execution is blocked waiting for ``lock_key`` (subscribed, queued)."""
        return bool(self.locks.zcard(f"{lock_key}:waiters"))

    def postrun_seen(self, task_id: str, state: str) -> bool:
        return any(h.startswith(f"postrun:{state}:") for h in self.hooks(task_id))

    def finished(self, result: AsyncResult, state: str = "SUCCESS", timeout: float = 15.0) -> Any:
        """Wait for ``result`` and for its attempt's task_postrun (which runs after the release:
        the package's receivers are connected before the recording ones); return the value."""
        value = result.get(timeout=timeout, propagate=False)
        wait_until(lambda: self.postrun_seen(result.id, state), 5.0, f"postrun of {result.id}")
        return value


@pytest.fixture(scope="module", autouse=True)
def _kill_shared_workers() -> Iterator[None]:
    yield
    while _shared:
        _shared.popitem()[1].kill()


@pytest.fixture
def env(request: pytest.FixtureRequest, redis_server: RedisServer) -> Iterator[Env]:
    """The test's clients; Redis is emptied unless the previous API variant left its workers.

    Emptying it under a running worker would delete the broker's bindings (revoke would reach
    no one), so a following variant keeps the data and uses keys of its own (``k-...-<api>``).
    """
    callspec = getattr(request.node, "callspec", None)
    params = dict(callspec.params) if callspec is not None else {}
    followed = "api" in params and params["api"] != APIS[-1]
    api = params.pop("api", APIS[0])
    variant = (request.node.originalname, repr(sorted(params.items())))
    for shared in [s for s in _shared if s[0] != variant]:
        _shared.pop(shared).kill()
    if not _shared:
        redis_server.client().flushall()
    client = make_app(redis_server, name="proj")
    locks = redis_py.Redis(port=redis_server.port, db=0)
    records = redis_py.Redis(port=redis_server.port, db=3)
    yield Env(redis_server.port, client, locks, records, variant, api, followed)
    records.close()
    locks.close()
    client.close()


def report(ending: str, **latencies: float) -> None:
    shown = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in latencies.items())
    print(f"\n[latency] {ending}: {shown}")


def assert_no_unlocked_code(env: Env, key: str) -> None:
    """Every body exit happened while its lock was still held, and no two bodies overlapped."""
    for entry in env.exits(key):
        assert entry["held"], f"{entry['id']} ran code after its lock was released: {entry}"
    starts = env.starts(key)
    for previous, following in itertools.pairwise(starts):
        # The previous execution's body had exited, or its process was dead, at this start.
        assert following["prev_pid_alive"] in (None, False) or any(
            (e["id"], e["pid"]) == (previous["id"], previous["pid"]) and e["t"] <= following["t"]
            for e in env.exits(key)
        ), f"{following['id']} started while {previous['id']} was still running"


# -- ordinary endings: the child releases -------------------------------------------------------


@over_apis
@pytest.mark.parametrize(
    ("how", "state", "options"),
    [
        ("return", "SUCCESS", {}),
        ("raise", "FAILURE", {}),
        ("soft", "FAILURE", {"soft_time_limit": 0.5, "duration": 10.0}),
    ],
)
def test_return_exception_soft_limit_release_in_the_child(
    env: Env, api: str, how: str, state: str, options: dict[str, Any]
) -> None:
    key = f"k-{how}-{api}"
    with env.worker("w1", concurrency=1) as worker:
        first = env.send(key=key, how=how, **options)
        first.get(timeout=15, propagate=False)
        ready = time.time()
        lock = env.lock_key(first.id)
        # Released before the result was stored: already gone when the caller sees it.
        held_at_result = bool(env.locks.exists(lock))
        gone = wait_for_change(lambda: not env.locks.exists(lock), 2.0, f"{lock} released")
        wait_until(lambda: env.postrun_seen(first.id, state), 5.0, "postrun")
        second = env.send(key=key)
        assert env.finished(second) == key  # ran, not skipped
        text = worker.text()
    report(f"{how} ({api})", result_to_key_gone=max(gone - ready, 0.0))
    assert not held_at_result, "the lock was still held when the result was stored"
    assert first.state == state
    child = env.starts(key)[0]["pid"]
    # Celery behaviour relied on: after_return and postrun run in the child for these endings.
    assert env.hooks(first.id)[-2:] == [f"after_return:{state}:{child}", f"postrun:{state}:{child}"]
    assert PARENT_RELEASE not in text
    assert_no_unlocked_code(env, key)
    assert lock_keys(env.locks) == []


# -- retries: released before the retry message is published ------------------------------------


@over_apis
@pytest.mark.parametrize(("how", "exc"), [("retry", "NoneType"), ("autoretry", "KeyError")])
def test_retry_is_released_before_publish_and_never_skips_itself(
    env: Env, api: str, how: str, exc: str
) -> None:
    key = f"k-{how}-{api}"
    with env.worker("w1", concurrency=2):
        result = env.send(key=key, how=how)
        assert env.finished(result, timeout=20) == key
        wait_until(lambda: env.postrun_seen(result.id, "RETRY"), 5.0, "postrun of attempt 1")
    first, second = env.starts(key)
    report(f"{how} ({api})", first_start_to_retry_start=second["t"] - first["t"])
    assert (first["id"], first["retries"]) == (result.id, 0)
    assert (second["id"], second["retries"]) == (result.id, 1)
    assert first["pid"] != second["pid"]  # the retry ran in the other child ...
    # ... while the first attempt was still inside its on_retry hook, waiting for it:
    assert env.records.get(f"retry_seen:{result.id}") == b"1"
    # and the lock was already free when the retry message was published.
    assert env.records.get(f"lock_at_publish:{result.id}") == b"0"
    hooks = env.hooks(result.id)
    p1, p2 = first["pid"], second["pid"]
    # Celery behaviour relied on: a retried attempt runs on_retry and postrun(RETRY), and no
    # after_return; the retry attempt ends normally.
    assert [h for h in hooks if h.endswith(f":{p1}")] == [
        f"on_retry:{exc}:{p1}",
        f"postrun:RETRY:{p1}",
    ]
    assert [h for h in hooks if h.endswith(f":{p2}")] == [
        f"after_return:SUCCESS:{p2}",
        f"postrun:SUCCESS:{p2}",
    ]
    assert env.records.get("overlaps") is None
    assert lock_keys(env.locks) == []


@over_apis
def test_replace_is_released_before_publish_and_the_replacement_runs_at_once(
    env: Env, api: str
) -> None:
    """``self.replace()`` publishes the replacement (same task id) before its ``Ignore``
    leaves the body: released at that publish, as for a retry, the replacement never finds
    the replaced attempt's lock (it was requeued for the lease, as a "redelivered" duplicate)."""
    key = f"k-replace-{api}"
    with env.worker("w1", concurrency=2) as worker:
        result = env.send(key=key, how="replace")
        assert env.finished(result) == key
        replaced, replacement = env.starts(key)
        # Celery behaviour relied on: the replaced attempt ends IGNORED (postrun only). The
        # replacement may finish before that attempt's postrun has run: wait for its record.
        ended = f"postrun:IGNORED:{replaced['pid']}"
        wait_until(lambda: ended in env.hooks(result.id), 10, "the replaced attempt's postrun")
        text = worker.text()
    report(f"replace ({api})", replaced_start_to_replacement_start=replacement["t"] - replaced["t"])
    assert replaced["id"] == replacement["id"] == result.id
    assert env.records.get(f"lock_at_publish:{result.id}") == b"0"
    assert "own task id holding" not in text and "redelivered while" not in text
    assert env.records.get("overlaps") is None
    assert lock_keys(env.locks) == []


# -- Ignore and Reject: released by the postrun backstop ----------------------------------------


@over_apis
@pytest.mark.parametrize(("how", "state"), [("ignore", "IGNORED"), ("reject", "REJECTED")])
def test_ignore_and_reject_release(env: Env, api: str, how: str, state: str) -> None:
    key = f"k-{how}-{api}"
    with env.worker("w1", concurrency=1) as worker:
        first = env.send(key=key, how=how)
        wait_until(lambda: env.postrun_seen(first.id, state), 15.0, f"postrun({state})")
        seen = time.time()
        lock = env.lock_key(first.id)
        gone = wait_for_change(lambda: not env.locks.exists(lock), 1.0, f"{lock} released")
        second = env.send(key=key)
        assert env.finished(second) == key
        text = worker.text()
    report(f"{how} ({api})", postrun_to_key_gone=max(gone - seen, 0.0))
    child = env.starts(key)[0]["pid"]
    # Celery behaviour relied on: no after_return for IGNORED / REJECTED, postrun runs.
    assert env.hooks(first.id) == [f"postrun:{state}:{child}"]
    # Celery 5.7 stores FAILURE for Reject(requeue=False); earlier versions store nothing.
    assert first.state == ("FAILURE" if how == "reject" and CELERY_57 else "PENDING")
    assert PARENT_RELEASE not in text
    assert_no_unlocked_code(env, key)
    assert lock_keys(env.locks) == []


# -- the child dies: the worker's main process releases -----------------------------------------


def hold_with_waiter(
    env: Env, key: str, how: str = "sleep", **options: Any
) -> tuple[AsyncResult, dict[str, Any], str, AsyncResult]:
    """Start a long holder of ``key``, then a waiter blocked on the same lock in the other
    child: the waiter starts the moment the lock is released. Returns (holder result, its start
    record, lock key, waiter result)."""
    holder = env.send(key=key, how=how, duration=30.0, **options)
    start = env.started(key)
    lock = env.lock_key(holder.id)
    waiter = env.send("waiter", key=key)
    wait_until(lambda: env.waiting(lock), 10.0, "the waiter to block on the lock")
    return holder, start, lock, waiter


@over_apis
@pytest.mark.parametrize("how", ["sleep", "sleep_noterm"])
def test_hard_time_limit_released_by_the_main_process(env: Env, api: str, how: str) -> None:
    key, limit = f"k-hard-{how}-{api}", 3.0
    with env.worker("w1", concurrency=2) as worker:
        holder, start, lock, waiter = hold_with_waiter(env, key, how, time_limit=limit)
        seen = watch_events(
            {
                "released": lambda: not env.holds(lock, start["token"]),
                "child_dead": lambda: not pid_alive(start["pid"]),
            },
            timeout=limit + 5.0,
        )
        assert env.finished(waiter) == key
        logged = worker.log_time(rf"Hard time limit \(.*\) exceeded for .*\[{holder.id}\]")
        if how == "sleep_noterm":  # the child cannot release: the main process does, and
            # logs it after the script's reply, which the waiter may outrun: waited for here,
            # before the worker stops (a line read once was missing in one CI run)
            worker.wait_for_log(rf"{PARENT_RELEASE} {start['pid']}\b", 5.0)
    nxt = env.starts(key)[1]
    report(
        f"hard limit ({how}, {api})",
        limit_to_release=seen["released"] - (start["t"] + limit),
        log_to_release=seen["released"] - logged,
        child_death_to_release=seen["released"] - seen["child_dead"],
        release_to_next_start=nxt["t"] - seen["released"],
    )
    main, child = worker.pid, start["pid"]
    # Celery 5.7 behaviour relied on: the main process runs on_failure and after_return (with an
    # empty request: nothing to release there); a child that can unwind on SIGTERM runs postrun.
    expected = [f"on_failure:TimeLimitExceeded:{main}", f"after_return:FAILURE:{main}"]
    if not CELERY_57:  # before 5.7 the main process runs no hook: the reaper releases
        expected = []
    if how == "sleep":
        expected.append(f"postrun:None:{child}")
    assert sorted(env.hooks(holder.id)) == sorted(expected)
    assert holder.state == "FAILURE"
    assert seen["released"] - (start["t"] + limit) < 1.0
    if how == "sleep_noterm":  # freed by the main process, once the child is dead
        assert seen["released"] >= seen["child_dead"], seen
    assert_no_unlocked_code(env, key)


@pytest.mark.parametrize("ending", ["hard-limit", "child-sigkill"])
def test_the_main_process_release_keeps_the_cooldown(env: Env, ending: str) -> None:
    """A child that cannot release (SIGTERM blocked, then killed) leaves its key to the main
    process, which applies the task's ``lock_cooldown`` as the child would have: it used to
    delete the key, so the next run started at once, inside the cooldown window. The whole
    cooldown (6 s), past the 2 s lease the dead child's key had left at most: it used to be
    cut to what was left of the lease."""
    key = f"k-cool-{ending}"
    options = {"time_limit": 1.0} if ending == "hard-limit" else {}
    with env.worker("w1", concurrency=2, env={"REDLOCK_TEST_LEASE": "2"}) as worker:
        name = "tests.e2e.proj.cooled"
        holder = env.client.send_task(
            name, kwargs={"key": key, "how": "sleep_noterm", "duration": 30.0}, **options
        )
        start = env.started(key)
        lock = env.lock_key(holder.id)
        if ending == "child-sigkill":
            os.kill(start["pid"], signal.SIGKILL)
        wait_until(lambda: f"{PARENT_RELEASE} {start['pid']}" in worker.text(), 15.0, "the release")
        left = env.locks.pttl(lock)
        holder.get(timeout=10, propagate=False)
    assert 2000 < left <= COOLDOWN * 1000, left  # held for the whole cooldown, not deleted
    assert holder.state == "FAILURE"


@pytest.mark.parametrize("acks", ["0", "1", "retry"], ids=["acked", "acks-late", "retry-on-lost"])
def test_a_child_killed_while_its_queued_call_waits_leaves_no_marker(env: Env, acks: str) -> None:
    """``lock_enqueue=True`` with ``wait``: the call's marker is kept while it waits for the
    lock. Its child SIGKILLed then (the OOM killer), the worker's main process clears the
    marker: it stayed for ``lock_enqueue_ttl``, and every later call of the key (without a
    result backend to tell it ended) was given the dead call's id. Under ``acks_late`` with
    ``reject_on_worker_lost`` the call is queued again, and its marker stays: it is still the
    one queued (it waits again, in another child). So it does under Celery 5.7's
    ``task_retry_on_worker_lost``, which sends the call again with the same id (a retry in
    ``default_retry_delay``): the marker used to be cleared under it."""
    if acks == "retry" and not CELERY_57:
        pytest.skip("task_retry_on_worker_lost is Celery 5.7's")
    key = f"k-queued-kill-{acks}"
    acks_late = acks == "1"
    with env.worker("w1", concurrency=2, env={"REDLOCK_TEST_ACKS_LATE": acks}) as worker:
        holder = env.send(key=key, how="sleep", duration=30.0)
        env.started(key)
        lock = env.lock_key(holder.id)
        marker, waiters = f"{lock}:queued", f"{lock}:waiters"
        waiter = env.client.send_task("tests.e2e.proj.queued_waiter", kwargs={"key": key})
        env.locks.set(marker, waiter.id, px=3_600_000)  # as its delay() set it
        wait_until(lambda: env.waiting(lock), 10.0, "the waiter to block on the lock")
        (member,) = env.locks.zrange(waiters, 0, -1)
        pid = int(member.decode().split("|")[1])  # secret|pid|...
        os.kill(pid, signal.SIGKILL)
        # It held no lock: the main process says so, rather than nothing.
        worker.wait_for_log(rf"child {pid} died holding no lock of this call", 15.0)
        if acks_late:  # redelivered to the other child, which waits again
            again = env.locks.zrange
            wait_until(lambda: again(waiters, 0, -1) not in ([], [member]), 15.0, "the requeue")
            assert env.locks.get(marker) == waiter.id.encode()
        elif acks == "retry":  # sent again, to run in 180 s: still the queued call
            worker.wait_for_log(rf"Task .*\[{waiter.id}\] retry: Retry in 180s", 15.0)
            assert env.locks.get(marker) == waiter.id.encode()
            return
        else:
            wait_until(lambda: not env.locks.exists(marker), 15.0, "the marker cleared")
        env.client.control.revoke(holder.id, terminate=True, signal="SIGKILL")  # not requeued
        holder.get(timeout=10, propagate=False)
        ended = waiter.get(timeout=10, propagate=False)  # run once redelivered, or lost
        assert ended == key if acks_late else type(ended).__name__ == "WorkerLostError"


@pytest.mark.parametrize("how", ["sleep_noterm", "sleep"], ids=["killed", "unwinds"])
@pytest.mark.parametrize("acks", ["1", "timeout"], ids=["reject-on-lost", "requeue-timeout"])
def test_the_marker_of_a_call_killed_at_its_hard_limit_follows_celerys_decision(
    env: Env, acks: str, how: str
) -> None:
    """``lock_enqueue="until_executed"``: a run that cannot unwind on SIGTERM is killed at its
    hard time limit, and the worker's main process settles its marker as Celery settled the
    call. It used to guess from the task's flags. Under ``acks_late`` with
    ``reject_on_worker_lost`` it kept the marker of a call Celery acknowledged (a time limit is
    not a lost worker): a later call was given the dead call's id for an hour. Under
    ``acks_late`` with ``task_acks_on_failure_or_timeout`` off, Celery 5.7 queues the call
    again, and the marker was cleared under it: a second call could be published while it
    was queued. The queued copy waits for the dead run's lock, so it starts only after the main
    process acted; it records the marker it found. A body that unwinds on billiard's SIGTERM
    (``how="sleep"``) cleared the marker in the child, whatever Celery did next: the child
    leaves it to the main process."""
    key = f"k-marker-hard-{acks}-{how}"
    requeued = acks == "timeout" and CELERY_57
    with env.worker("w1", concurrency=2, env={"REDLOCK_TEST_ACKS_LATE": acks}) as worker:
        name = "tests.e2e.proj.executed_waiter"
        call = env.client.send_task(
            name, kwargs={"key": key, "how": how, "duration": 30.0}, time_limit=1.5
        )
        start = env.started(key)
        marker = f"{env.lock_key(call.id)}:queued"
        env.locks.set(marker, call.id, px=3_600_000)  # as its delay() set it
        worker.wait_for_log(rf"Hard time limit \(.*\) exceeded for .*\[{call.id}\]")
        if requeued:
            again = env.started(key, 2)
            assert again["id"] == call.id
            assert again["queued"] == call.id  # still the queued call's marker
            # The dead run's FAILURE stays stored until the copy's SUCCESS replaces it: read
            # before that, get() raised the time limit (seen once, under CI load).
            wait_until(
                lambda: call.backend.get_task_meta(call.id, cache=False)["status"] == "SUCCESS",
                10.0,
                "the requeued copy's SUCCESS",
            )
            assert call.get(timeout=10) == key
        else:
            wait_until(lambda: not env.locks.exists(marker), 15.0, "the marker cleared")
            assert call.get(timeout=10, propagate=False).__class__.__name__ == "TimeLimitExceeded"
            assert env.starts(key) == [start]


@over_apis
def test_child_sigkill_released_by_the_main_process(env: Env, api: str) -> None:
    key = f"k-kill-{api}"
    with env.worker("w1", concurrency=2) as worker:
        holder, start, lock, waiter = hold_with_waiter(env, key)
        killed = time.time()
        os.kill(start["pid"], signal.SIGKILL)
        seen = watch_events({"released": lambda: not env.holds(lock, start["token"])}, 15.0)
        assert env.finished(waiter) == key
        holder.get(timeout=10, propagate=False)
        noticed = worker.log_time(rf"pid:{start['pid']} exited")
        worker.wait_for_log(rf"{PARENT_RELEASE} {start['pid']}\b", 5.0)  # after the reply
    nxt = env.starts(key)[1]
    report(
        f"child SIGKILL ({api})",
        kill_to_worker_notices=noticed - killed,
        notice_to_release=seen["released"] - noticed,
        kill_to_release=seen["released"] - killed,
        kill_to_next_start=nxt["t"] - killed,
    )
    # The worker notices a dead child at once, or at its next 5 s maintain_pool tick (Celery);
    # the lock is released as soon as it does.
    assert seen["released"] - noticed < MS_AFTER_NOTICE
    assert seen["released"] - killed < 1.0  # the main process looks every 0.1 s
    assert holder.state == "FAILURE"
    assert type(holder.result).__name__ == "WorkerLostError"
    assert nxt["prev_pid_alive"] is False
    assert_no_unlocked_code(env, key)


@over_apis
def test_child_sigkill_with_acks_late_released_before_the_requeue(env: Env, api: str) -> None:
    key = f"k-kill-acks-late-{api}"
    with env.worker("w1", concurrency=1, env=ACKS_LATE) as worker:
        holder = env.send(key=key, how="sleep", duration=30.0)
        start = env.started(key)
        lock = env.lock_key(holder.id)
        killed = time.time()
        os.kill(start["pid"], signal.SIGKILL)
        seen = watch_events(
            {
                "released": lambda: not env.holds(lock, start["token"]),
                "requeued_run": lambda: env.records.llen(f"starts:{key}") >= 2,
            },
            15.0,
        )
        assert env.finished(holder) == key  # the requeued message ran to completion
        noticed = worker.log_time(rf"pid:{start['pid']} exited")
        worker.wait_for_log(rf"{PARENT_RELEASE} {start['pid']}\b", 5.0)  # after the reply
    again = env.starts(key)[1]
    report(
        f"child SIGKILL (acks_late, {api})",
        kill_to_worker_notices=noticed - killed,
        notice_to_release=seen["released"] - noticed,
        kill_to_release=seen["released"] - killed,
        release_to_requeued_start=again["t"] - seen["released"],
    )
    assert seen["released"] - noticed < MS_AFTER_NOTICE
    assert seen["released"] - killed < 1.0  # the main process looks every 0.1 s
    assert (again["id"], again["redelivered"]) == (holder.id, True)
    assert again["token"] is not None  # it acquired the lock: it did not find its dead self
    assert again["t"] >= seen["released"] - 0.005
    assert_no_unlocked_code(env, key)
    assert lock_keys(env.locks) == []


@over_apis
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_revoke_terminate_releases_within_a_second(env: Env, api: str, sig: str) -> None:
    key = f"k-revoke-{sig}-{api}"
    with env.worker("w1", concurrency=2) as worker:
        holder, start, lock, waiter = hold_with_waiter(env, key)
        revoked = time.time()
        env.client.control.revoke(holder.id, terminate=True, signal=sig)
        seen = watch_events(
            {
                "released": lambda: not env.holds(lock, start["token"]),
                "child_dead": lambda: not pid_alive(start["pid"]),
            },
            10.0,
        )
        assert env.finished(waiter) == key
        if sig == "SIGKILL":  # the main process releases, and logs it after the reply
            worker.wait_for_log(rf"{PARENT_RELEASE} {start['pid']}\b", 5.0)
    nxt = env.starts(key)[1]
    report(
        f"revoke(terminate, {sig}, {api})",
        revoke_to_release=seen["released"] - revoked,
        revoke_to_child_dead=seen["child_dead"] - revoked,
        revoke_to_next_start=nxt["t"] - revoked,
    )
    # Celery behaviour relied on: SIGTERM unwinds the child through postrun; SIGKILL runs nothing.
    assert env.hooks(holder.id) == ([f"postrun:None:{start['pid']}"] if sig == "SIGTERM" else [])
    assert seen["released"] - revoked < 1.0
    assert holder.state == "REVOKED"
    assert_no_unlocked_code(env, key)


# -- the worker shuts down or dies: both APIs side by side in one worker ------------------------


def hold_both(
    env: Env, key: str, duration: float, **options: Any
) -> dict[str, tuple[AsyncResult, dict[str, Any], str]]:
    """One holder per API, each of its own key ``<key>-<api>``, running at once; by API:
    (result, start record, lock key)."""
    held = {}
    for api in APIS:
        holder = env.send(api=api, key=f"{key}-{api}", how="sleep", duration=duration, **options)
        start = env.started(f"{key}-{api}")
        held[api] = (holder, start, env.lock_key(holder.id))
    return held


def assert_each(apis: Iterable[str], check: Any) -> None:
    """Run ``check(api)`` for every API, naming the API that fails."""
    for api in apis:
        try:
            check(api)
        except AssertionError as exc:
            raise AssertionError(f"[{api}] {exc}") from exc


def test_warm_shutdown_lets_the_task_finish_and_release(env: Env) -> None:
    key = "k-warm"
    with env.worker("w1", concurrency=2) as worker:
        held = hold_both(env, key, duration=1.0)
        worker.send(signal.SIGTERM)
        wait_until(lambda: env.records.llen("shutdowns"), 10.0, "the warm shutdown to begin")
        worker.send(signal.SIGTERM)  # Celery 5.7: a second SIGTERM is ignored (still warm)
        assert worker.process is not None
        assert worker.process.wait(20.0) == 0
    assert env.records.lrange("shutdowns", 0, -1) == [b"Warm:SIGTERM", b"Warm:SIGTERM"]

    def check(api: str) -> None:
        holder, start, _ = held[api]
        assert holder.get(timeout=5) == f"{key}-{api}"
        child = start["pid"]
        assert env.hooks(holder.id) == [
            f"after_return:SUCCESS:{child}",
            f"postrun:SUCCESS:{child}",
        ]
        assert_no_unlocked_code(env, f"{key}-{api}")

    assert_each(APIS, check)
    assert lock_keys(env.locks) == []


#: Celery before 5.5 reads a SIGQUIT only in its consumer loop, which a warm shutdown has left:
#: a SIGQUIT after the SIGTERM cold-stops the worker only if it lands before the loop's next
#: turn, else the tasks run to their end (and release there, as the warm shutdown test shows).
#: There, the acks_late case is a SIGQUIT alone.
COLD_AFTER_WARM = CELERY_VERSION >= (5, 5)


@pytest.mark.parametrize(
    ("how", "acks_late"),
    [
        ("SIGQUIT", False),
        pytest.param(
            "SIGTERM, SIGQUIT",
            True,
            marks=pytest.mark.skipif(
                not COLD_AFTER_WARM, reason="Celery < 5.5: see COLD_AFTER_WARM"
            ),
        ),
        pytest.param(
            "SIGQUIT",
            True,
            marks=pytest.mark.skipif(COLD_AFTER_WARM, reason="the SIGTERM, SIGQUIT case covers it"),
        ),
    ],
)
def test_cold_shutdown_releases(env: Env, how: str, acks_late: bool) -> None:
    key = f"k-cold-{acks_late}"
    knobs = ACKS_LATE if acks_late else {}
    with env.worker("w1", concurrency=2, env=knobs) as worker:
        held = hold_both(env, key, duration=30.0)
        if how.startswith("SIGTERM"):  # warm first, then cold
            worker.send(signal.SIGTERM)
            wait_until(lambda: env.records.llen("shutdowns"), 10.0, "the warm shutdown")
        signalled = time.time()
        worker.send(signal.SIGQUIT)
        events = {}
        for api, (_, start, lock) in held.items():
            token = start["token"]
            events[f"released {api}"] = lambda lock=lock, token=token: not env.holds(lock, token)
            events[f"child_dead {api}"] = lambda pid=start["pid"]: not pid_alive(pid)
        seen = watch_events(events, 10.0)
        assert worker.process is not None
        worker.process.wait(20.0)
    for api in APIS:
        report(
            f"cold shutdown ({how}, {api})",
            signal_to_release=seen[f"released {api}"] - signalled,
            signal_to_child_dead=seen[f"child_dead {api}"] - signalled,
        )
    assert env.records.lrange("shutdowns", -1, -1) == [b"Cold:SIGQUIT"]

    def check(api: str) -> None:
        holder, start, _ = held[api]
        # Celery behaviour relied on: cold shutdown SIGTERMs the child, which unwinds through
        # postrun (and releases there); without acks_late the main process then runs on_retry
        # (task lost).
        expected = [f"postrun:None:{start['pid']}"]
        if not acks_late and CELERY_57:  # Celery < 5.7 runs no hook in the main process
            expected.append(f"on_retry:Retry:{worker.pid}")
        assert sorted(env.hooks(holder.id)) == sorted(expected)
        assert seen[f"released {api}"] - signalled < 1.0
        assert_no_unlocked_code(env, f"{key}-{api}")

    assert_each(APIS, check)
    assert lock_keys(env.locks) == []
    if acks_late:  # the messages went back to the queue: the next worker runs them
        with env.worker("w2", concurrency=2, env=knobs):
            for api in APIS:
                assert env.finished(held[api][0]) == f"{key}-{api}"

        def check_again(api: str) -> None:
            again = env.starts(f"{key}-{api}")[1]
            assert (again["id"], again["token"] is not None) == (held[api][0].id, True)

        assert_each(APIS, check_again)


@pytest.mark.parametrize("bound_by", ["lease", "time limit"])
def test_whole_worker_sigkill_key_expires_by_ttl(env: Env, bound_by: str) -> None:
    key = f"k-worker-kill-{bound_by}"
    if bound_by == "lease":  # lease 2 s, renewed every 2/3 s; no time limit
        knobs, options = {"REDLOCK_TEST_LEASE": "2"}, {}
    else:  # default 30 s lease, but hard limit 1.5 s + margin 0.5 s
        knobs, options = {"REDLOCK_TEST_TTL_MARGIN": "0.5"}, {"time_limit": 1.5}
    bound = 2.0
    with env.worker("w1", concurrency=2, env=knobs):
        held = hold_both(env, key, duration=30.0, **options)
        if bound_by == "lease":  # kill after a renewal, to show the lease was being extended
            for _, _, lock in held.values():
                first, read = env.locks.pttl(lock), time.monotonic()

                def renewed(lock: str = lock, first: int = first, read: float = read) -> bool:
                    # The TTL went up instead of running down.
                    return env.locks.pttl(lock) > first - (time.monotonic() - read) * 1000 + 100

                wait_until(renewed, 5.0, "a lease renewal")
        killed = time.time()
    # Watched before the next worker starts: its start-up must not delay what is seen.
    seen = watch_events(
        {api: lambda lock=lock: not env.locks.exists(lock) for api, (_, _, lock) in held.items()},
        bound + 5.0,
    )
    with env.worker("w2", concurrency=2, env=knobs):
        for api in APIS:
            assert env.finished(env.send(api=api, key=f"{key}-{api}")) == f"{key}-{api}"

    def check(api: str) -> None:
        start = held[api][1]
        released = seen[api]
        again = env.starts(f"{key}-{api}")[1]
        report(
            f"whole worker SIGKILL ({bound_by}, {api})",
            kill_to_release=released - killed,
            acquired_to_release=released - start["t"],
            kill_to_next_start=again["t"] - killed,
        )
        if bound_by == "lease":  # within one lease of the kill, but later than a fixed 2 s TTL
            assert bound * 2 / 3 - 0.1 <= released - killed <= bound + 0.3
            assert released - start["t"] > bound
        else:  # T + margin after acquisition, long before the 30 s lease
            assert bound - 0.1 <= released - start["t"] <= bound + 0.3
        assert again["prev_pid_alive"] is False

    assert_each(APIS, check)
    assert lock_keys(env.locks) == []


# -- duplicates of the same task id -------------------------------------------------------------


@over_apis
@pytest.mark.skipif(not KOMBU_57, reason="kombu < 5.7 cannot redeliver within seconds")
def test_redelivered_message_finding_the_key_held_is_retried_not_skipped(
    env: Env, api: str
) -> None:
    key = f"k-redelivered-{api}"
    # The broker redelivers a message unacked for 4 s to the other worker; the lease is 3 s,
    # renewed every second (a 1.5 s lease was lost under load on 2 cores: a stall of 1.5 s).
    knobs = {**ACKS_LATE, "REDLOCK_TEST_VISIBILITY": "4", "REDLOCK_TEST_LEASE": "3"}
    with (
        env.worker("w1", concurrency=1, env=knobs) as w1,
        env.worker("w2", concurrency=1, env=knobs) as w2,
    ):
        holder = env.send(key=key, how="sleep", duration=8.0)
        env.started(key)
        mine = rf"\[{holder.id}\] redelivered while .* retrying in ([\d.]+)s"
        wait_until(lambda: re.search(mine, w1.text() + w2.text()), 10.0, "the duplicate")
        assert env.finished(holder, timeout=30) == key
        logs = w1.text() + w2.text()
    countdowns = [float(c) for c in re.findall(mine, logs)]
    report(f"redelivered duplicate ({api})", countdown=countdowns[0])
    assert all(1.0 <= c <= 3.0 for c in countdowns), countdowns  # ~ the holder's remaining TTL
    starts = env.starts(key)
    assert {s["id"] for s in starts} == {holder.id}
    assert starts[0]["redelivered"] is False
    assert env.records.get("overlaps") is None
    assert_no_unlocked_code(env, key)
    assert "skipped" not in logs


# -- skipped members of a group or chord --------------------------------------------------------


def test_group_and_chord_complete_when_members_are_skipped(env: Env) -> None:
    key = "k-chord"
    with env.worker("w1", concurrency=2):
        env.send(key=key, how="sleep", duration=30.0)
        env.started(key)

        def member(api: str, member_key: str) -> Any:
            name = API_TASKS[api]["ending"]
            return env.client.signature(f"tests.e2e.proj.{name}", kwargs={"key": member_key})

        # A member of each API is skipped (the key is held), another runs.
        members = [member("task", key), member("decorator", key), member("task", "k-free")]
        members.append(member("decorator", "k-free-2"))
        expected = [None, None, "k-free", "k-free-2"]
        assert group(members).apply_async().get(timeout=15) == expected
        result = chord(members)(env.client.signature("tests.e2e.proj.collect"))
        assert result.get(timeout=15) == expected


# -- the TTL rule ------------------------------------------------------------------------------


@over_apis
@pytest.mark.parametrize(("pool", "bounded"), [("prefork", True), ("threads", False)])
def test_worker_time_limit_caps_the_lock_only_where_the_pool_enforces_it(
    env: Env, api: str, pool: str, bounded: bool
) -> None:
    """The worker's ``--time-limit`` is invisible in a pool child: it is captured in the main
    process before the fork. With T = 3 s and margin 1 s the lock can never outlive 4 s after
    acquisition on prefork; the threads pool enforces no limit, so the 30 s lease applies."""
    key = f"k-ttl-{pool}-{api}"
    knobs = {"REDLOCK_TEST_LEASE": "30", "REDLOCK_TEST_TTL_MARGIN": "1"}
    with env.worker("w1", pool=pool, concurrency=1, env=knobs, args=["--time-limit", "3"]):
        holder = env.send(key=key, how="sleep", duration=1.0)
        started = env.started(key)
        pttl = env.locks.pttl(env.lock_key(started["id"]))
        if bounded:
            assert 2_500 < pttl <= 4_000
        else:
            assert 25_000 < pttl <= 30_000
        assert env.finished(holder) == key
    assert lock_keys(env.locks) == []
