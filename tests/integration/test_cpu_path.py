"""Issue 19, item 5: what an execution does not do when tracing and the timeline are off.

Figures are in ``benchmarks/bench_cpu.py``; these tests pin the off paths, by counting the
calls of the functions the off paths must not reach, in a fresh interpreter (a tracer
provider, once set, stays set for the process: another test's must not be seen here).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from celery_redlock.testing import RedisServer

pytest.importorskip("opentelemetry.sdk.trace")

PROGRAM = textwrap.dedent(
    """
    import json, queue, sys
    from celery import Celery
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from celery_redlock import LockedTask
    from celery_redlock._celery import engine, timeline, tracing
    from celery_redlock._redis import keys

    app = Celery("cpu_path", broker="memory://", set_as_current=False)
    app.conf.update(redlock_url=sys.argv[1], task_store_eager_result=False)

    @app.task(base=LockedTask, shared=False)
    def work(n):
        return n

    watched = {
        tracing._start.__code__: "span started",
        timeline._target.__code__: "ring read",
        trace.get_tracer_provider.__code__: "provider asked",
        engine.leave.__code__: "leave",
        queue.Queue.get.__code__: "connection from a queue",
        queue.Queue.put.__code__: "connection back to a queue",
        keys.stats_key.__code__: "counter key built",
    }
    calls = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code in watched:
            calls.append(watched[frame.f_code])

    def run(ns):
        sys.setprofile(profile)
        try:
            return [work.apply((n,)).get() for n in ns]
        finally:
            sys.setprofile(None)

    results = run(range(3))
    off = list(calls)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)  # after the first executions, as a worker's start does
    results += run(range(3, 5))
    names = sorted(span.name for span in exporter.get_finished_spans())
    print(json.dumps({"results": results, "off": off, "spans": names}))
    """
)


def test_without_a_tracer_provider_or_a_timeline_an_execution_builds_no_span_and_reads_no_ring(
    redis_server: RedisServer,
) -> None:
    """Without a tracer provider no span object is started and ``get_tracer_provider()`` is
    not called (the wrappers read one global), with ``redlock_timeline`` unset the ring's
    target is never looked up, and the ``task_postrun`` backstop does not look for a lock
    once the execution released it; a provider set later, as a worker sets it at start, is
    seen by the next execution. The URL client's connections are not taken through a
    ``queue.Queue`` (redis-py's ``BlockingConnectionPool`` does), and counting an event does
    not build its counter hash's key again (docs/benchmarks.md: where the CPU goes)."""
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM, redis_server.url],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["results"] == [0, 1, 2, 3, 4]
    # One leave per execution (the body's end): the task_postrun backstop does not look.
    assert [call for call in seen["off"] if call != "counter key built"] == ["leave"] * 3
    # The counters' key is built once per task and event (acquired, released), not per count.
    assert seen["off"].count("counter key built") == 2
    assert seen["spans"] == ["redlock.acquire"] * 2 + ["redlock.hold"] * 2
