"""The test support code has one of each thing, read from the source tree.

One ``celery worker`` subprocess class (:class:`support.workers.WorkerProcess`), one
``redis-server`` wrapper (:class:`celery_redlock.testing.RedisServer`, which
``support/servers.py`` subclasses), one environment convention (``REDLOCK_TEST_*``, see
:mod:`support.apps`), no ``sys.path`` patches, and tests that import helpers from ``support``,
never from a ``conftest.py`` or from another tier.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import ROOT

#: The trees of Python code beside the package: tests, their support, benchmarks, checkers.
TREES = ("support", "tests", "benchmarks", "chaos", "example_project")
TIERS = ("unit", "integration", "e2e")


def sources(*trees: str) -> Iterator[tuple[Path, ast.Module]]:
    for tree in trees:
        for path in sorted((ROOT / tree).rglob("*.py")):
            yield path.relative_to(ROOT), ast.parse(path.read_text(), str(path))


def dotted(node: ast.AST) -> str:
    """``os.environ.get`` for the expression ``os.environ.get`` (``""`` for anything else)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else ""
    return ""


def imported(tree: ast.Module) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_no_sys_path_patches() -> None:
    patched = [
        f"{path}:{node.lineno}"
        for path, tree in sources(*TREES)
        for node in ast.walk(tree)
        if (isinstance(node, ast.Call) and dotted(node.func).startswith("sys.path."))
        or (isinstance(node, ast.Assign) and any(dotted(t) == "sys.path" for t in node.targets))
    ]
    assert not patched, "run scripts as modules (python -m ...) instead: " + ", ".join(patched)


@pytest.mark.parametrize("tier", TIERS)
def test_tests_import_helpers_from_support_not_conftest_or_other_tiers(tier: str) -> None:
    bad = {}
    for path, tree in sources(f"tests/{tier}"):
        wrong = {
            name
            for name in imported(tree)
            if name.startswith("tests.") and (name.split(".")[1] != tier or ".conftest" in name)
        }
        if wrong:
            bad[str(path)] = sorted(wrong)
    assert not bad, bad


def test_one_worker_subprocess_class() -> None:
    """Only :mod:`support.workers` spells a ``celery ... worker`` command line (the example
    project's demo aside: it stands alone, as a user would copy it)."""
    spelled = []
    for path, tree in sources("support", "tests", "benchmarks", "chaos"):
        for node in ast.walk(tree):
            if isinstance(node, ast.List):
                words = {e.value for e in node.elts if isinstance(e, ast.Constant)}
                if "worker" in words and "celery" in words:
                    spelled.append(f"{path}:{node.lineno}")
    assert len(spelled) == 1, spelled
    assert spelled[0].startswith(str(Path("support/workers.py")) + ":"), spelled


def test_one_redis_server_wrapper() -> None:
    """Every redis-server of the suite is a ``RedisServer``: outside the package, the binary is
    looked up only by subclasses' ``command()`` and the TLS probe of ``support/servers.py``."""
    callers = set()
    for path, tree in sources(*TREES):
        for cls_or_fn in ast.walk(tree):
            if not isinstance(cls_or_fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(cls_or_fn):
                if isinstance(node, ast.Call) and dotted(node.func) == "redis_server_binary":
                    callers.add((str(path), cls_or_fn.name))
    assert {fn for path, fn in callers} <= {"command", "tls_supported"}, callers
    assert {path for path, fn in callers} <= {str(Path("support/servers.py"))}, callers


#: Calls whose first argument is an environment variable's name.
ENV_CALLS = {
    "os.environ.get",
    "os.getenv",
    "os.environ.setdefault",
    "os.environ.pop",
    "monkeypatch.setenv",
    "monkeypatch.delenv",
    "env",  # support.apps.env("PORT") reads REDLOCK_TEST_PORT
}


def environment_names(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """The environment variables a module reads or sets, by name (constants only)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and dotted(node.value) == "os.environ":
            if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                yield node.lineno, node.slice.value
        elif isinstance(node, ast.Call) and dotted(node.func) in ENV_CALLS and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                prefix = "REDLOCK_TEST_" if dotted(node.func) == "env" else ""
                yield node.lineno, prefix + first.value
        elif isinstance(node, ast.Dict) and any(
            k is None and dotted(v) == "os.environ"
            for k, v in zip(node.keys, node.values, strict=True)
        ):
            for key in node.keys:
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    yield node.lineno, key.value
        elif (
            isinstance(node, ast.keyword) and node.arg == "env" and isinstance(node.value, ast.Dict)
        ):
            for key in node.value.keys:
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    yield node.value.lineno, key.value


def test_one_environment_convention() -> None:
    """Every variable of ours is ``REDLOCK_TEST_*``: in the code, the Makefile, nox and CI."""
    ours = re.compile(r"REDLOCK|BENCH|SOAK|DEMO")
    wrong = [
        f"{path}:{line} {name}"
        for path, tree in sources("support", "tests", "benchmarks", "chaos")
        for line, name in environment_names(tree)
        if ours.search(name) and not name.startswith("REDLOCK_TEST_")
    ]
    for name in ("Makefile", "noxfile.py", ".ci/run", "pyproject.toml"):
        text = (ROOT / name).read_text()
        wrong += [f"{name} {m}" for m in re.findall(r"\bREDLOCK_\w+(?==)", text)]
        wrong = [w for w in wrong if "REDLOCK_TEST_" not in w]
    assert not wrong, wrong
