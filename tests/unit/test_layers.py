"""The package's architecture: the Redis layer stands without Celery, the public surface is
pinned, and every exception fits the one hierarchy (and survives Celery's result backend)."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap

import celery
import pytest
from celery.backends.base import Backend

import celery_redlock
from celery_redlock import exceptions

REDIS_LAYER = (
    "celery_redlock.lock",
    "celery_redlock._scripts",
    "celery_redlock._keys",
    "celery_redlock._owner",
    "celery_redlock._renewal",
    "celery_redlock._clients",
    "celery_redlock._nodes",
    "celery_redlock.exceptions",
    "celery_redlock.testing",
)

PUBLIC = {
    "Lock",
    "LockConfigError",
    "LockContended",
    "LockLost",
    "LockNotOwned",
    "LockUnavailable",
    "LockedTask",
    "RedlockError",
    "current_lock",
    "lock_key",
    "single_instance",
}

ALL_EXCEPTIONS = (
    exceptions.LockConfigError,
    exceptions.LockContended,
    exceptions.LockLost,
    exceptions.LockNotOwned,
    exceptions.LockUnavailable,
)


def _celery_modules_after(code: str) -> list[str]:
    """Run ``code`` in a fresh interpreter; return the ``celery*`` modules it left loaded."""
    probe = code + textwrap.dedent(
        """
        import json, sys
        print(json.dumps(sorted(
            m for m in sys.modules if m == "celery" or m.startswith("celery.")
        )))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def test_redis_layer_modules_do_not_import_celery() -> None:
    # The modules themselves, with the package __init__ (the public surface, which includes
    # the Celery layer) bypassed: none of them may reach for celery, directly or indirectly.
    code = textwrap.dedent(
        f"""
        import importlib, importlib.util, sys, types
        spec = importlib.util.find_spec("celery_redlock")
        package = types.ModuleType("celery_redlock")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["celery_redlock"] = package
        for name in {REDIS_LAYER!r}:
            importlib.import_module(name)
        """
    )
    assert _celery_modules_after(code) == []


def test_importing_redis_layer_does_not_import_celery() -> None:
    code = "".join(f"import {name}\n" for name in REDIS_LAYER)
    assert _celery_modules_after(code) == []


def test_public_surface_is_pinned() -> None:
    assert sorted(celery_redlock.__all__) == sorted(PUBLIC)
    assert len(celery_redlock.__all__) == len(PUBLIC)  # no duplicates


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_public_name_is_importable(name: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from celery_redlock import {name}", namespace)
    assert namespace[name] is getattr(celery_redlock, name)
    assert namespace[name] is not None


@pytest.mark.parametrize("cls", ALL_EXCEPTIONS, ids=lambda c: c.__name__)
def test_exceptions_derive_from_redlock_error(cls: type[Exception]) -> None:
    assert issubclass(cls, exceptions.RedlockError)
    assert issubclass(exceptions.RedlockError, Exception)


def test_config_error_is_value_error_and_type_error() -> None:
    assert issubclass(exceptions.LockConfigError, ValueError)
    assert issubclass(exceptions.LockConfigError, TypeError)
    with pytest.raises(ValueError, match="bad option"):
        raise exceptions.LockConfigError("bad option")
    with pytest.raises(TypeError, match="bad option"):
        raise exceptions.LockConfigError("bad option")


def _with_context(cls: type[exceptions.RedlockError]) -> exceptions.RedlockError:
    if cls is exceptions.LockContended:
        return cls("held by t1", key="redlock:{k}", holder="t1", ttl=2.5)
    if cls is exceptions.LockUnavailable:
        return cls("no answer", key="redlock:{k}", nodes=("127.0.0.1:1",))
    return cls("it happened", key="redlock:{k}")


@pytest.mark.parametrize(
    "cls", (exceptions.RedlockError, *ALL_EXCEPTIONS), ids=lambda c: c.__name__
)
def test_exception_rebuilt_from_message_alone(cls: type[exceptions.RedlockError]) -> None:
    original = _with_context(cls)
    assert original.args == (str(original),)  # context is not in args, only the message

    rebuilt = cls(*original.args)
    assert type(rebuilt) is cls
    assert str(rebuilt) == str(original)
    assert rebuilt.key is None

    # What Celery's result backend does with the JSON serializer: (message,) -> cls(*args).
    # A constructor that failed there would silently turn the error into a plain Exception.
    app = celery.Celery("layers", set_as_current=False)
    try:
        backend = Backend(app, serializer="json")
        stored = json.loads(json.dumps(backend.prepare_exception(original)))
        from_backend = backend.exception_to_python(stored)
    finally:
        app.close()
    assert type(from_backend) is cls
    assert str(from_backend) == str(original)


@pytest.mark.parametrize(
    "cls", (exceptions.RedlockError, *ALL_EXCEPTIONS), ids=lambda c: c.__name__
)
def test_exception_pickles_with_its_context(cls: type[exceptions.RedlockError]) -> None:
    original = _with_context(cls)
    copy = pickle.loads(pickle.dumps(original))
    assert type(copy) is cls
    assert str(copy) == str(original)
    assert vars(copy) == vars(original)
