"""The one private name the tracing hooks read: ``opentelemetry.trace._TRACER_PROVIDER``.

:func:`celery_redlock._celery.tracing._active` reads that global, not the public
``get_tracer_provider()`` (which looks for an environment variable through a ``KeyError`` on
every call), to learn whether a tracer provider is set. These tests run on the lowest and newest
``opentelemetry-api`` of the matrix (``nox -s lowest`` and the dev environment), each in a child
process, as a process sets its global provider at most once; the unit tier's twin, which only
reads, runs on every Python.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("opentelemetry.sdk.trace")

PROGRAM = textwrap.dedent(
    """
    import json
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from celery_redlock._celery import tracing

    seen = {"readable": tracing._GLOBAL_READABLE, "before": tracing._active()}
    provider = TracerProvider()
    trace.set_tracer_provider(provider)
    seen["global_is_provider"] = trace._TRACER_PROVIDER is provider
    seen["after"] = tracing._active()
    print(json.dumps(seen))
    """
)


def run(env: dict[str, str]) -> dict[str, bool]:
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_the_global_is_none_until_a_provider_is_set_then_holds_it() -> None:
    env = {k: v for k, v in os.environ.items() if k != "OTEL_PYTHON_TRACER_PROVIDER"}
    assert run(env) == {
        "readable": True,
        "before": False,
        "global_is_provider": True,
        "after": True,
    }


def test_a_provider_named_by_the_environment_makes_the_hooks_ask_the_public_call() -> None:
    """``OTEL_PYTHON_TRACER_PROVIDER`` is loaded by ``get_tracer_provider()`` only: with it set,
    the global is not read (here it names the SDK's provider, loaded at the module's import)."""
    env = {**os.environ, "OTEL_PYTHON_TRACER_PROVIDER": "sdk_tracer_provider"}
    seen = run(env)
    assert seen["readable"] is False
    assert seen["before"] is True


AFTER_IMPORT = textwrap.dedent(
    """
    import json, os
    from celery import signals
    from celery_redlock._celery import tracing

    seen = {"before": tracing._active()}
    os.environ["OTEL_PYTHON_TRACER_PROVIDER"] = "sdk_tracer_provider"
    signals.worker_process_init.send(sender=None)
    seen["after_start"] = tracing._active()
    print(json.dumps(seen))
    """
)


def test_a_provider_named_by_the_environment_after_import_is_seen_from_a_workers_start() -> None:
    """A settings module imported after the tasks may name the provider in the environment:
    a worker's start (and each pool process's) reads the environment again."""
    env = {k: v for k, v in os.environ.items() if k != "OTEL_PYTHON_TRACER_PROVIDER"}
    out = subprocess.run(
        [sys.executable, "-c", AFTER_IMPORT], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {
        "before": False,
        "after_start": True,
    }
