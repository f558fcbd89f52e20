"""The private global the tracing hooks read agrees with the public call, on every Python.

The integration tier's twin sets a provider (in a child process); this one only reads.
"""

from __future__ import annotations

import pytest

from celery_redlock._celery import tracing

trace = pytest.importorskip("opentelemetry.trace")


def test_the_global_and_get_tracer_provider_agree() -> None:
    provider = trace.get_tracer_provider()
    if trace._TRACER_PROVIDER is None:
        assert isinstance(provider, trace.ProxyTracerProvider)
        assert tracing._active() is False
    else:
        assert provider is trace._TRACER_PROVIDER
