"""The package's architecture, read from the source tree: the Redis layer stands without Celery,
the public surface is pinned, and every exception fits the one hierarchy (and survives Celery's
result backend). The same layers checked in a fresh interpreter: ``tests/integration/
test_fresh_imports.py``."""

from __future__ import annotations

import ast
import json
import pickle

import celery
import pytest
from celery.backends.base import Backend

import celery_redlock
from celery_redlock import exceptions
from support.layers import CELERY_LAYER, MODULES, REDIS_LAYER


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(name: str) -> set[str]:
    """The modules ``name`` imports, anywhere in its body (``TYPE_CHECKING`` blocks aside)."""
    tree = ast.parse(MODULES[name].read_text())
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    skip = {id(n) for node in ast.walk(tree) if _is_type_checking(node) for n in ast.walk(node)}
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES)
    return out


def test_the_tree_shows_the_layers() -> None:
    assert REDIS_LAYER and CELERY_LAYER
    public = {m for m in MODULES if not any(p.startswith("_") for p in m.split(".")[1:])}
    assert "celery_redlock._redis.lock" in REDIS_LAYER
    assert {"celery_redlock.task", "celery_redlock.decorators", "celery_redlock.cli"} <= public


@pytest.mark.parametrize("name", REDIS_LAYER)
def test_redis_layer_imports_only_the_redis_layer(name: str) -> None:
    ours = {m for m in _imports(name) if m.startswith("celery_redlock")}
    assert ours <= {*REDIS_LAYER, "celery_redlock", "celery_redlock._redis"}, name
    assert not {m for m in _imports(name) if m.split(".")[0] in ("celery", "kombu")}, name


@pytest.mark.parametrize("name", CELERY_LAYER)
def test_celery_layer_internals_never_import_the_public_adapters(name: str) -> None:
    adapters = {"celery_redlock.task", "celery_redlock.decorators", "celery_redlock.cli"}
    assert not _imports(name) & adapters
    assert not {m for m in _imports(name) if m.startswith("celery_redlock.testing")}


def test_no_import_cycle_inside_the_package() -> None:
    graph = {m: {i for i in _imports(m) if i in MODULES and i != m} for m in MODULES}
    # Depth-first search for a back edge; report the cycle it closes.
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycle = [*path[path.index(target) :], target]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


PUBLIC = {
    "Lock",
    "LockConfigError",
    "LockContended",
    "LockLost",
    "LockNotOwned",
    "LockUnavailable",
    "LockedTask",
    "RateLimited",
    "RedlockError",
    "current_fencing_token",
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
    exceptions.RateLimited,
)


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


#: What only the Redis layer may touch: a client, a node set, a script runner.
REDIS_ONLY_NAMES = {"client_for", "nodes_for", "Quorum", "SingleNode", "run", "subscribe"}
#: Client methods that send a command (or open a connection that does).
COMMAND_METHODS = {"execute_command", "evalsha", "eval", "script_load", "pipeline", "pubsub"}


def _redis_uses(name: str) -> list[str]:
    """Where ``name`` imports a Redis client or the Redis layer's runners, or sends a command."""
    tree = ast.parse(MODULES[name].read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name.split(".")[0] == "redis"]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if module.split(".")[0] == "redis" and not node.level:
                found.append(f"from {module} import ...")
            if module.endswith("_redis.scripts") or module.startswith("_redis.scripts"):
                found.append(f"from {module} import ...")
            for alias in node.names:
                if alias.name in REDIS_ONLY_NAMES or alias.name == "scripts":
                    found.append(f"from {module} import {alias.name}")
        elif isinstance(node, ast.Attribute) and node.attr in COMMAND_METHODS:
            found.append(f"line {node.lineno}: .{node.attr}")
    return found


#: The one module outside the Redis layer that holds a client: the test server wrapper, which
#: pings the ``redis-server`` it started until it answers.
SERVER_WRAPPER = "celery_redlock.testing._server"
#: Every other module: the Celery layer, the public adapters (task, decorators, metrics), the
#: command line and the dashboard.
OUTSIDE = sorted(m for m in MODULES if m not in REDIS_LAYER and m != SERVER_WRAPPER)


def test_the_outside_covers_every_layer() -> None:
    outside = set(OUTSIDE)
    assert {"celery_redlock.metrics", "celery_redlock.task", "celery_redlock.cli._group"} <= outside
    assert set(CELERY_LAYER) <= outside
    assert any(m.startswith("celery_redlock.web") for m in outside)


@pytest.mark.parametrize("name", OUTSIDE)
def test_only_the_redis_layer_sends_redis_commands(name: str) -> None:
    """The Celery layer decides, the command line and the dashboard read and change locks
    through the inventory, the counters flush through it: the Redis layer (``_redis``) sends."""
    assert _redis_uses(name) == [], name
