"""What the OpenTelemetry spans cost a locked call (``python -m benchmarks.bench_tracing``).

Eager ``apply()`` of a no-op locked task against a private redis-server, in three fresh
interpreters, interleaved round by round (A B C C B A ...), medians of the rounds:

* ``no-otel``: ``opentelemetry`` hidden (``sys.modules`` entry ``None``): nothing is wrapped;
* ``otel, no provider``: ``opentelemetry-api`` importable, no tracer provider set: the
  wrappers run and find a non-recording span;
* ``otel + SDK``: a ``TracerProvider`` with a ``SimpleSpanProcessor`` into an in-memory
  exporter (cleared every round): ``redlock.acquire`` and ``redlock.hold`` recorded per call.

Prints calls per second and the cost per call relative to ``no-otel``. A figure, not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap

from benchmarks._common import environment
from celery_redlock.testing import RedisServer

CHILD = """
import json, sys, time
MODE, PORT, CALLS, ROUNDS = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
if MODE == "no-otel":
    sys.modules["opentelemetry"] = None
exporter = None
if MODE == "otel + SDK":
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
from celery import Celery
from celery_redlock import LockedTask
app = Celery("bench", broker="memory://", set_as_current=False)
app.conf.redlock_url = f"redis://127.0.0.1:{PORT}/0"
@app.task(base=LockedTask)
def noop():
    return None
for _ in range(50):
    noop.apply()
print("ready", flush=True)
for _ in range(ROUNDS):
    sys.stdin.readline()
    start = time.perf_counter()
    for _ in range(CALLS):
        noop.apply()
    elapsed = time.perf_counter() - start
    if exporter is not None:
        exporter.clear()
    print(json.dumps(CALLS / elapsed), flush=True)
"""

MODES = ("no-otel", "otel, no provider", "otel + SDK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=6, help="rounds per mode (even)")
    args = parser.parse_args()
    with RedisServer() as server:
        print(json.dumps(environment(server)))
        children = {
            mode: subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    textwrap.dedent(CHILD),
                    mode,
                    str(server.port),
                    str(args.calls),
                    str(args.rounds),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for mode in MODES
        }
        for child in children.values():
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        rates: dict[str, list[float]] = {mode: [] for mode in MODES}
        for i in range(args.rounds):
            order = MODES if i % 2 == 0 else tuple(reversed(MODES))
            for mode in order:
                child = children[mode]
                assert child.stdin is not None and child.stdout is not None
                child.stdin.write("go\n")
                child.stdin.flush()
                rates[mode].append(float(child.stdout.readline()))
        for child in children.values():
            child.wait(30)
    base = statistics.median(rates["no-otel"])
    print(f"{'mode':<20} {'calls/s':>9} {'µs/call':>8} {'+µs vs no-otel':>15}")
    for mode in MODES:
        rate = statistics.median(rates[mode])
        print(f"{mode:<20} {rate:>9.0f} {1e6 / rate:>8.1f} {1e6 / rate - 1e6 / base:>+15.1f}")


if __name__ == "__main__":
    main()
