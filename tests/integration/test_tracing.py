"""OpenTelemetry spans of the lock (``celery_redlock._celery.tracing``), on a real worker.

The SDK's in-memory exporter collects the spans; ``opentelemetry-instrumentation-celery``
makes the ``apply_async/<task>`` and ``run/<task>`` spans ours must nest under.
"""

from __future__ import annotations

import datetime
import logging
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis as redis_py
from celery import Celery
from celery.exceptions import SoftTimeLimitExceeded, TaskRevokedError
from opentelemetry import trace
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk import trace as sdk_trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from celery_redlock import (
    LockConfigError,
    LockedTask,
    LockUnavailable,
    current_lock,
    lock_key,
    metrics,
    signals,
)
from celery_redlock._celery import tracing as tracing_module
from celery_redlock.metrics import read_stats
from celery_redlock.testing import RedisServer, hold_lock, wait_until
from support.apps import lock_keys, make_app
from support.servers import dead_port
from support.workers import Holder, running_worker
from tests.integration.test_task import _interrupt_at, _line_of


class Breakable(SimpleSpanProcessor):
    """Exports to memory; raises from every hook while ``broken`` is set."""

    broken = False

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if self.broken:
            raise RuntimeError("a broken span processor")
        super().on_start(span, parent_context)

    def on_end(self, span: Any) -> None:
        if self.broken:
            raise RuntimeError("a broken span processor")
        super().on_end(span)


@pytest.fixture(scope="module")
def processor() -> Iterator[Breakable]:
    exporter = InMemorySpanExporter()
    processor = Breakable(exporter)
    provider = trace.get_tracer_provider()
    if not isinstance(provider, sdk_trace.TracerProvider):  # the process's first provider
        provider = sdk_trace.TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(processor)
    instrumentor = CeleryInstrumentor()
    instrumentor.instrument()
    yield processor
    instrumentor.uninstrument()
    exporter.shutdown()  # the provider stays set for the process; nothing is kept any more


@pytest.fixture
def spans(processor: Breakable) -> Iterator[InMemorySpanExporter]:
    exporter: InMemorySpanExporter = processor.span_exporter
    exporter.clear()
    yield exporter
    processor.broken = False


@pytest.fixture
def app(redis_url: str, redis_server: RedisServer) -> Celery:
    return make_app(redis_server, task_send_sent_event=True)


def named(exporter: InMemorySpanExporter, name: str) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def one(exporter: InMemorySpanExporter, name: str, count: int = 1) -> Any:
    wait_until(lambda: len(named(exporter, name)) >= count, 10, f"{count} {name} span(s)")
    return named(exporter, name)[count - 1]


def parent_of(exporter: InMemorySpanExporter, span: Any) -> Any:
    assert span.parent is not None, f"{span.name} has no parent"
    parents = [s for s in exporter.get_finished_spans() if s.context.span_id == span.parent.span_id]
    assert parents, f"the parent of {span.name} was not exported"
    return parents[0]


def test_acquire_and_hold_spans_nest_under_the_run_span(
    app: Celery, spans: InMemorySpanExporter, r: redis_py.Redis
) -> None:
    @app.task(base=LockedTask, lock_by=["n"])
    def locked(n: int, secret: str) -> int:
        return n

    with running_worker(app):
        assert locked.delay(48151623, "hunter2").get(timeout=10) == 48151623
        acquire = one(spans, "redlock.acquire")
        hold = one(spans, "redlock.hold")
    run = parent_of(spans, acquire)
    assert run.name == f"run/{locked.name}"
    assert parent_of(spans, hold) is run
    assert acquire.kind is trace.SpanKind.INTERNAL
    assert acquire.context.trace_id == one(spans, f"apply_async/{locked.name}").context.trace_id
    prefix, _, rest = lock_key(locked, 48151623, "hunter2").partition(":{")
    name, _, digest = rest.rstrip("}").rpartition(":")
    assert dict(acquire.attributes) == {
        "redlock.mode": "run",
        "redlock.outcome": "acquired",
        "redlock.attempts": 1,
        "redlock.key.prefix": prefix,
        "redlock.key.name": name,
        "redlock.key.hash": digest,
    }
    assert hold.attributes["redlock.outcome"] == "released"
    assert hold.start_time >= acquire.end_time
    ours = [s for s in spans.get_finished_spans() if s.name.startswith("redlock.")]
    recorded = repr([(s.attributes, s.events) for s in ours])
    assert "hunter2" not in recorded and "48151623" not in recorded


def test_a_body_that_releases_its_own_lock_early_is_reported_released(
    app: Celery, spans: InMemorySpanExporter, r: redis_py.Redis
) -> None:
    """``current_lock().release()`` in the body (to let the next call start during a tail of
    work that needs no lock): the hold span ends ``released``, and ``lock_released`` is sent
    (when the body ends). Before, the span said ``unreleased`` ("Redis did not answer") and no
    signal was sent."""
    released: list[dict[str, Any]] = []

    def receive(sender: Any = None, signal: Any = None, **event: Any) -> None:
        released.append(event)

    @app.task(base=LockedTask, lock_by=["n"])
    def early(n: int) -> bool:
        lock = current_lock()
        assert lock is not None
        lock.release()
        return not r.exists(lock.key)  # free while the body goes on

    signals.lock_released.connect(receive, weak=False)
    try:
        with running_worker(app):
            result = early.delay(5)
            assert result.get(timeout=10) is True
            hold = one(spans, "redlock.hold")
            wait_until(lambda: released, 10, "lock_released")
    finally:
        signals.lock_released.disconnect(receive)
    assert hold.attributes["redlock.outcome"] == "released"
    assert released == [{"task_id": result.id, "key": lock_key(early, 5), "by": "task"}]


def test_a_dropped_copy_of_an_ended_call_is_a_skipped_acquire(
    app: Celery, spans: InMemorySpanExporter
) -> None:
    """A requeued copy of a call that already succeeded is dropped (``Ignore``, under
    ``worker_deduplicate_successful_tasks``): its acquire span says ``skipped``, without an
    error, not ``failed``."""

    @app.task(base=LockedTask, lock_by=())
    def done() -> str:
        return "again"

    app.backend.store_result("ended", "once", "SUCCESS")
    app.conf.worker_deduplicate_successful_tasks = True
    with running_worker(app):
        done.apply_async(task_id="ended", headers={"redlock": {"redelivered": True}})
        acquire = one(spans, "redlock.acquire")
    assert acquire.attributes["redlock.outcome"] == "skipped"
    assert acquire.status.status_code is not trace.StatusCode.ERROR
    assert done.AsyncResult("ended").get(timeout=5) == "once"


def test_an_eager_apply_records_its_outcome_in_the_callers_trace(
    app: Celery, spans: InMemorySpanExporter
) -> None:
    @app.task(base=LockedTask, lock_limit=2)
    def limited() -> str:
        return "ran"

    with trace.get_tracer("test").start_as_current_span("caller") as caller:
        assert limited.apply().get() == "ran"
    acquire = one(spans, "redlock.acquire")
    run = parent_of(spans, acquire)  # eager runs send task_prerun too: the run span is there
    assert run.name == f"run/{limited.name}"
    assert run.parent.span_id == caller.get_span_context().span_id
    assert acquire.attributes["redlock.mode"] == "semaphore"
    assert acquire.attributes["redlock.outcome"] == "acquired"


def test_a_skip_and_a_wait_show_in_the_trace(
    app: Celery, spans: InMemorySpanExporter, h: Holder
) -> None:
    waiting = threading.Event()

    @app.task(base=LockedTask)
    def held() -> None:
        h.hold()

    @app.task(base=LockedTask, lock_name=held.name)  # the same key as held's
    def skipped() -> str:
        return "ran"

    @app.task(base=LockedTask, lock_name=held.name, lock_on_contention="wait")
    def waiter() -> str:
        return "waited"

    def on_contended(sender: Any = None, policy: str = "", **_: Any) -> None:
        if policy == "wait":
            waiting.set()

    signals.lock_contended.connect(on_contended, weak=False)
    try:
        with running_worker(app):
            first = held.delay()
            assert h.entered.wait(10)
            assert skipped.delay().get(timeout=10) is None
            late = waiter.delay()
            assert waiting.wait(10), "the waiter never started waiting"
            h.gate.set()
            assert late.get(timeout=10) == "waited"
            first.get(timeout=10)
    finally:
        signals.lock_contended.disconnect(on_contended)
    by_run = {parent_of(spans, s).name: s for s in named(spans, "redlock.acquire")}
    skip = by_run[f"run/{skipped.name}"]
    assert skip.attributes["redlock.outcome"] == "skipped"
    assert skip.attributes["redlock.policy"] == "skip"
    assert skip.attributes["redlock.attempts"] == 1
    wait = by_run[f"run/{waiter.name}"]
    assert wait.attributes["redlock.outcome"] == "waited"
    assert wait.attributes["redlock.policy"] == "wait"
    assert 0 < wait.attributes["redlock.wait_time"] < 10
    assert wait.attributes["redlock.attempts"] >= 2  # the first try, and at least one waiting
    assert by_run[f"run/{held.name}"].attributes["redlock.outcome"] == "acquired"
    # Only the two that got the lock held it.
    assert sorted(parent_of(spans, s).name for s in named(spans, "redlock.hold")) == sorted(
        [f"run/{held.name}", f"run/{waiter.name}"]
    )


def test_a_waiter_that_expired_is_traced_and_counted_as_expired(
    app: Celery, spans: InMemorySpanExporter, h: Holder, r: redis_py.Redis
) -> None:
    """Helper probe, round 3: a call whose ``expires`` passed while it waited for the lock
    ended its acquire span as ``skipped`` with no reason, and no counter said why."""

    @app.task(
        base=LockedTask, shared=False, lock_by=(), lock_on_contention="wait", lock_wait_timeout=20
    )
    def job(role: str) -> None:
        if role == "holder":
            h.hold()

    with running_worker(app, concurrency=2):
        first = job.delay("holder")
        assert h.entered.wait(10)
        expires = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(
            seconds=3
        )  # time to reach the worker
        late = job.apply_async(("late",), expires=expires)
        wait_until(
            lambda: r.zcard(lock_key(job, "late") + ":waiters") == 1, 10, "the late call to wait"
        )
        wait_until(lambda: datetime.datetime.now(datetime.timezone.utc) > expires, 5, "expiry")
        h.gate.set()
        first.get(timeout=10)
        with pytest.raises(TaskRevokedError):
            late.get(timeout=10)

        def counted() -> bool:
            metrics.flush()
            return read_stats(app).get(job.name, {}).get("expired") == 1

        wait_until(counted, 10, "the expired count")
    expired = [s for s in named(spans, "redlock.acquire") if s.attributes.get("redlock.reason")]
    assert [s.attributes["redlock.reason"] for s in expired] == ["expired"]
    assert expired[0].attributes["redlock.outcome"] == "skipped"


@pytest.mark.parametrize("ending", [SoftTimeLimitExceeded, SystemExit])
def test_a_wait_a_time_limit_or_revoke_ends_is_interrupted_not_failed(
    app: Celery, spans: InMemorySpanExporter, r: redis_py.Redis, ending: type[BaseException]
) -> None:
    """Helper probe, round 3: a wait ended by a soft time limit, or by a revoke (``SystemExit``
    in the pool child), was a ``failed`` acquire (the outcome of contention refused), though
    the counters count no failure for it. Here the signal a pool child gets ends the wait of
    an eager call once it is queued behind the holder."""

    @app.task(base=LockedTask, shared=False, lock_on_contention="wait", lock_wait_timeout=30)
    def job() -> str:
        return "ran"

    def interrupt(signum: int, frame: Any) -> None:
        raise ending("the wait was ended")

    previous = signal.signal(signal.SIGUSR1, interrupt)
    main = threading.get_ident()
    try:
        with hold_lock(job):
            waiters = lock_key(job) + ":waiters"

            def end_the_wait() -> None:
                wait_until(lambda: r.zcard(waiters) == 1, 10, "the call to wait")
                signal.pthread_kill(main, signal.SIGUSR1)

            ender = threading.Thread(target=end_the_wait)
            ender.start()
            try:
                with pytest.raises(ending):
                    job.apply(throw=True)
            finally:
                ender.join()
            assert r.zcard(waiters) == 0  # the interrupted wait left the queue
    finally:
        signal.signal(signal.SIGUSR1, previous)
    acquire = one(spans, "redlock.acquire")
    assert acquire.attributes["redlock.outcome"] == "interrupted"
    assert acquire.attributes["redlock.policy"] == "wait"


def test_a_soft_time_limit_while_a_retry_s_span_ends_leaves_the_retry(
    app: Celery, spans: InMemorySpanExporter
) -> None:
    """Review, round 3: a soft time limit landing while the acquire span of a call requeued by
    the lock ended (its retry already published) was passed on to the task: the call was
    stored FAILURE, and under ``until_executed`` its marker was cleared, so a call published
    meanwhile ran beside the retry. The call's outcome is decided there: it stays RETRY."""

    @app.task(base=LockedTask, shared=False, lock_on_contention="retry", lock_retry_countdown=60)
    def job() -> str:
        return "ran"

    def retried(frame: Any) -> bool:
        return frame.f_locals.get("outcome") == "retried"

    code = tracing_module._finish.__code__
    trace, fired = _interrupt_at(code, _line_of(code, "op.span.end()"), retried)
    with hold_lock(job):
        threading.settrace(trace)  # the worker's threads, started below
        try:
            with running_worker(app, pool="solo"):
                result = job.delay()
                wait_until(lambda: result.state != "PENDING", 10, "the first attempt's end")
        finally:
            threading.settrace(None)
    assert fired and result.state == "RETRY"


def test_a_loss_found_by_the_renewal_thread_is_an_event_of_the_hold_span(
    redis_server: RedisServer, redis_url: str, spans: InMemorySpanExporter, h: Holder
) -> None:
    app = make_app(redis_server, redlock_lease=0.6)
    lost = threading.Event()

    @app.task(base=LockedTask)
    def renewed() -> None:
        h.hold()

    def on_lost(sender: Any = None, **_: Any) -> None:
        lost.set()

    signals.lock_lost.connect(on_lost, weak=False)
    client = redis_server.client()
    try:
        with running_worker(app):
            result = renewed.delay()
            assert h.entered.wait(10)
            client.delete(*lock_keys(client))  # someone else's mistake: the key is gone
            assert lost.wait(10), "the renewal never found the lock lost"
            h.gate.set()
            result.get(timeout=10)
            hold = one(spans, "redlock.hold")
    finally:
        signals.lock_lost.disconnect(on_lost)
        client.close()
    assert hold.attributes["redlock.outcome"] == "lost"
    assert [e.name for e in hold.events] == ["redlock.lost"]
    assert "renewal found it expired" in hold.events[0].attributes["redlock.reason"]
    assert parent_of(spans, hold).name == f"run/{renewed.name}"


def test_a_loss_found_at_release_is_an_event_of_the_hold_span(
    redis_server: RedisServer, app: Celery, spans: InMemorySpanExporter
) -> None:
    """The body deletes its own key (an eviction, an operator's mistake): the release finds
    the lock gone, and the hold span says so, as the ``lock_lost`` signal does."""
    client = redis_server.client()

    @app.task(base=LockedTask)
    def evicted() -> None:
        client.delete(*lock_keys(client))

    try:
        with running_worker(app):
            evicted.delay().get(timeout=10)
            hold = one(spans, "redlock.hold")
    finally:
        client.close()
    assert hold.attributes["redlock.outcome"] == "lost"
    assert [e.name for e in hold.events] == ["redlock.lost"]
    assert "no longer held by this owner at release" in hold.events[0].attributes["redlock.reason"]


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_a_failed_renewal_is_an_event_of_the_hold_span(
    redis_server: RedisServer, redis_url: str, spans: InMemorySpanExporter, h: Holder
) -> None:
    # Locks on a server of their own: the test takes EVALSHA away from its user for a while.
    with RedisServer() as server:
        app = make_app(redis_server, redlock_url=server.url, redlock_lease=3.0)

        @app.task(base=LockedTask)
        def renewed() -> None:
            h.hold()

        lines = Lines()
        logging.getLogger("celery_redlock.lock").addHandler(lines)
        client = server.client()
        try:
            with running_worker(app):
                result = renewed.delay()
                assert h.entered.wait(10)
                client.acl_setuser("default", enabled=True, commands=["-evalsha"])
                wait_until(
                    lambda: any("renewal failed, retrying" in line for line in lines.lines),
                    10,
                    "a refused renewal",
                )
                client.acl_setuser("default", enabled=True, commands=["+evalsha"])
                h.gate.set()
                result.get(timeout=10)
                hold = one(spans, "redlock.hold")
        finally:
            logging.getLogger("celery_redlock.lock").removeHandler(lines)
            client.close()
    assert hold.attributes["redlock.outcome"] == "released"
    failures = [e for e in hold.events if e.name == "redlock.renewal_failed"]
    assert failures, hold.events
    assert (
        "no permissions to run the 'evalsha' command"
        in (failures[0].attributes["exception.message"])
    )


def test_an_enqueue_duplicate_records_its_span_in_the_caller(
    app: Celery, spans: InMemorySpanExporter
) -> None:
    @app.task(base=LockedTask, lock_enqueue=True)
    def once() -> None:
        pass

    with trace.get_tracer("test").start_as_current_span("caller") as caller:
        first = once.delay()
        again = once.delay()
        same = once.apply_async(task_id=first.id)  # its own id: that queued call, not published
    assert again.id == same.id == first.id
    enqueues = named(spans, "redlock.enqueue")
    outcomes = [s.attributes["redlock.outcome"] for s in enqueues]
    assert outcomes == ["acquired", "skipped", "skipped"]
    assert enqueues[1].attributes["redlock.queued_task_id"] == first.id
    assert enqueues[2].attributes["redlock.queued_task_id"] == first.id
    key = lock_key(once)  # the dropped duplicate names its key, as an acquire span does
    for span in enqueues:
        assert f"{span.attributes['redlock.key.prefix']}:{{" in key
        assert span.attributes["redlock.key.name"] == once.name
        assert span.attributes["redlock.key.hash"] in key
    assert {s.parent.span_id for s in enqueues} == {caller.get_span_context().span_id}
    assert len(named(spans, f"apply_async/{once.name}")) == 1  # the duplicate publishes nothing


def test_outcomes_without_a_lock_event_carry_the_key_too(
    redis_server: RedisServer, spans: InMemorySpanExporter
) -> None:
    """A call superseded before it takes the lock, and one that finds the lock Redis down,
    report no lock event with a key; their acquire spans name it all the same."""
    with RedisServer() as lock_server:
        app = make_app(redis_server, redlock_url=lock_server.url, redlock_on_unavailable="fail")

        @app.task(base=LockedTask, shared=False, lock_enqueue="replace", lock_by=["doc"])
        def save(doc: str, version: int) -> int:
            return version

        older, newer = save.delay("d", 1), save.delay("d", 2)
        with running_worker(app):
            assert older.get(timeout=10) is None and newer.get(timeout=10) == 2
            lock_server.stop()
            down = save.delay("e", 3)  # published unmarked; the worker cannot lock
            with pytest.raises(LockUnavailable):
                down.get(timeout=10)
        app.close()
    acquires = [one(spans, "redlock.acquire", count) for count in (1, 2, 3)]
    outcomes = {s.attributes["redlock.outcome"]: s for s in acquires}
    assert set(outcomes) == {"skipped", "acquired", "unavailable"}
    assert outcomes["skipped"].attributes["redlock.reason"] == "superseded"
    assert lock_key(save, "d", 0).endswith(outcomes["skipped"].attributes["redlock.key.hash"] + "}")
    assert lock_key(save, "e", 0).endswith(
        outcomes["unavailable"].attributes["redlock.key.hash"] + "}"
    )
    assert outcomes["unavailable"].attributes["redlock.attempts"] == 1


def test_an_outage_retried_records_the_outage_not_the_retry(
    redis_server: RedisServer, spans: InMemorySpanExporter
) -> None:
    """Helper probe, round 3: under ``redlock_on_unavailable="retry"`` the acquire span of a
    call retried for an outage recorded Celery's ``Retry`` as its error ("Retry"), the
    ``LockUnavailable`` only inside its message. The outage is recorded."""
    app = make_app(redis_server, redlock_url=f"redis://127.0.0.1:{dead_port()}/0")

    @app.task(base=LockedTask, shared=False, max_retries=1, lock_retry_countdown=0.1)
    def down() -> None: ...

    with running_worker(app), pytest.raises(LockUnavailable):
        down.delay().get(timeout=20)
    app.close()
    first = one(spans, "redlock.acquire")
    assert first.attributes["redlock.outcome"] == "unavailable"
    (event,) = [e for e in first.events if e.name == "exception"]
    assert event.attributes["exception.type"].endswith("LockUnavailable")
    assert first.status.description == "LockUnavailable"


def test_a_failed_acquire_records_no_argument_value_from_a_chained_cause(
    app: Celery, spans: InMemorySpanExporter
) -> None:
    """A ``lock_by`` callable whose own error quotes the argument: the ``LockConfigError`` it
    causes is recorded on the acquire span, its cause (the quote) is not."""
    secret = "IBAN-DE89370400440532013000"

    def by_account(args: Any, kwargs: Any) -> str:
        return str(int(kwargs["account"]))

    @app.task(base=LockedTask, shared=False, lock_by=by_account)
    def pay(account: str) -> None:
        """Never runs: its identity cannot be computed."""

    with running_worker(app):
        result = pay.apply_async(kwargs={"account": secret}, ignore_result=False)
        with pytest.raises(LockConfigError, match="lock_by callable raised ValueError"):
            result.get(timeout=10)
    acquire = one(spans, "redlock.acquire")
    assert acquire.attributes["redlock.outcome"] == "failed"
    (event,) = [e for e in acquire.events if e.name == "exception"]
    assert event.attributes["exception.type"].endswith("LockConfigError")
    assert "LockConfigError" in event.attributes["exception.stacktrace"]
    recorded = repr([(e.name, dict(e.attributes)) for e in acquire.events])
    assert secret not in recorded and secret not in repr(dict(acquire.attributes)), recorded


def test_a_broken_tracer_never_breaks_locking(
    app: Celery, processor: Breakable, spans: InMemorySpanExporter, r: redis_py.Redis
) -> None:
    @app.task(base=LockedTask)
    def locked() -> str:
        return "ran"

    processor.broken = True
    assert locked.apply().get() == "ran"
    assert locked.apply().get() == "ran"  # the first released its lock
    assert lock_keys(r) == []


def run_fresh(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_without_opentelemetry_nothing_is_wrapped_and_locking_works(
    redis_server: RedisServer, redis_url: str
) -> None:
    done = run_fresh(
        f"""
        import sys
        sys.modules["opentelemetry"] = None  # as if the otel extra were not installed
        from celery import Celery
        from celery_redlock import LockedTask
        from celery_redlock._celery import engine, tracing
        app = Celery("t", broker="memory://", set_as_current=False)
        app.conf.redlock_url = "redis://127.0.0.1:{redis_server.port}/0"
        @app.task(base=LockedTask)
        def locked():
            return "ran"
        assert not tracing.enabled()
        assert not hasattr(engine.enter, "__wrapped__")
        assert locked.apply().get() == "ran"
        assert "opentelemetry.trace" not in sys.modules
        print("ok")
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


@pytest.mark.parametrize("when", ["before import", "after import"])
def test_a_provider_the_environment_names_and_cannot_load_leaves_locking_alone(
    redis_server: RedisServer, when: str
) -> None:
    """Helper probe, round 3: ``OTEL_PYTHON_TRACER_PROVIDER`` naming a provider no installed
    package gives (``sdk_tracer_provider`` without the SDK) made ``get_tracer_provider()``
    raise ``StopIteration``: from the package's import (the worker did not start), or, named
    after it, from every locked call, while plain tasks ran. No spans, with a WARNING, until a
    provider is set in code: helper probe, round 3, session 22: that one was then ignored for
    good (OpenTelemetry's own spans recorded, ours did not). A worker logs the WARNING again
    when it is ready, for its log file (a detached worker's stderr goes nowhere)."""
    done = run_fresh(
        f"""
        import logging, os
        if {when == "before import"}:
            os.environ["OTEL_PYTHON_TRACER_PROVIDER"] = "no_such_provider"
        logging.basicConfig(level=logging.WARNING)
        from celery import Celery, signals
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from celery_redlock import LockedTask
        app = Celery("t", broker="memory://", set_as_current=False)
        app.conf.redlock_url = "redis://127.0.0.1:{redis_server.port}/0"
        @app.task(base=LockedTask)
        def locked():
            return "ran"
        os.environ["OTEL_PYTHON_TRACER_PROVIDER"] = "no_such_provider"
        signals.worker_process_init.send(sender=None)  # reads the environment again
        assert locked.apply().get() == "ran"
        assert locked.apply().get() == "ran"
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        assert locked.apply().get() == "ran"
        print(sorted(span.name for span in exporter.get_finished_spans()))
        signals.worker_ready.send(sender=None)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['redlock.acquire', 'redlock.hold']"
    warnings = [line for line in done.stderr.splitlines() if "cannot be loaded" in line]
    assert len(warnings) == 2, done.stderr
    assert all("OTEL_PYTHON_TRACER_PROVIDER='no_such_provider'" in line for line in warnings)
