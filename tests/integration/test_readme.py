"""Every Python block of the README and of ``docs/`` runs, against a private server.

The blocks of one file run in order in one namespace, as a reader meets them (a page's first
block defines the app the others use), with ``__name__`` ``"proj"`` so task names read as in
the docs, and every ``redis://localhost:6379`` pointed at the session's private server. After a
block, the checks below keyed by a name it binds assert that it does what its text says.

A block may be left out only when it needs something unavailable here, with an HTML comment
right before it: ``<!-- not run: needs Docker -->``. The blocks of ``docs/testing.md`` that are
test files also run as tests, under pytester (``test_pytest_plugin.py``, ``test_recipes.py``).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis as redis_py
from celery import Celery

from celery_redlock import Lock, lock_key
from celery_redlock._celery.options import settings_for
from celery_redlock.metrics import flush
from celery_redlock.signals import lock_contended
from celery_redlock.testing import RedisServer
from support.apps import lock_keys
from tests.integration.test_tls_acl import ACL_LINE

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", flags=re.S | re.M)
NOT_RUN = re.compile(r"<!--\s*not run\b:?\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    code: str
    #: Why it is not run (the HTML comment right before it), or None: it runs.
    not_run: str | None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def python_blocks(path: Path) -> list[Block]:
    text = path.read_text()
    blocks = []
    for match in FENCE.finditer(text):
        if match.group(1) != "python":
            continue
        before = text[: match.start()].rstrip("\n").rpartition("\n")[2]
        reason = NOT_RUN.search(before)
        line = text.count("\n", 0, match.start()) + 1
        blocks.append(Block(path, line, match.group(2), reason.group(1) if reason else None))
    return blocks


def point_at(code: str, server: RedisServer) -> str:
    return code.replace("redis://localhost:6379", f"redis://127.0.0.1:{server.port}")


# -- what a block must do, keyed by a name it binds ----------------------------------------------

Check = Callable[[dict[str, Any], RedisServer], None]


def _locks_db(server: RedisServer) -> redis_py.Redis:
    return redis_py.Redis(port=server.port, db=1)


def check_quickstart(ns: dict[str, Any], server: RedisServer) -> None:
    """Both quickstarts: the call runs locked (it is counted as acquired) and releases."""
    app, task = ns["app"], ns["sync_account"]
    assert "localhost:6379" not in app.conf.redlock_url
    locks = _locks_db(server)
    locks.flushdb()
    assert task.apply(args=(42,)).get() == 42
    assert lock_key(task, 42).startswith("redlock:{proj.sync_account:")
    assert lock_keys(locks) == []  # released
    flush()  # the event counters, written once a second: now
    assert locks.hget("redlock:stats:proj.sync_account", "acquired")  # it did take a lock
    locks.close()


def check_homepage(ns: dict[str, Any], server: RedisServer) -> None:
    class Cache:
        def rebuild(self) -> str:
            return "fresh"

        def stale(self) -> str:
            return "stale"

    assert ns["homepage"](Cache(), server.url) == "fresh"
    with Lock(server.url, "rebuild:homepage", ttl=30):
        assert ns["homepage"](Cache(), server.url) == "stale"  # after its 2 s timeout


def check_cooldown(ns: dict[str, Any], server: RedisServer) -> None:
    task = ns["refresh_report"]
    assert task.apply().get() == "refreshed"
    assert task.apply().get() is None  # the key stays held for lock_cooldown: skipped
    assert ns["app"].conf.beat_schedule["refresh-report"]["task"] == task.name


def check_decorator(ns: dict[str, Any], server: RedisServer) -> None:
    assert ns["push_invoices"].apply(args=(5,)).get() == 5


def check_limit(ns: dict[str, Any], server: RedisServer) -> None:
    assert ns["export_report"].apply().get().startswith("redlock:{proj.export_report:")


def check_quorum(ns: dict[str, Any], server: RedisServer) -> None:
    url = settings_for(ns["quorum_app"]).url
    assert isinstance(url, tuple) and len(url) == 3


def check_django(ns: dict[str, Any], server: RedisServer) -> None:
    settings = SimpleNamespace(**{k: v for k, v in ns.items() if k.startswith("CELERY_")})
    app = Celery("django_proj", set_as_current=False)
    app.config_from_object(settings, namespace="CELERY")
    resolved = settings_for(app)
    assert (resolved.url, resolved.lease, resolved.on_contention) == (
        f"redis://127.0.0.1:{server.port}/1",
        60.0,
        "retry",
    )
    app.close()


CHECKS: dict[str, Check] = {
    "sync_account": check_quickstart,
    "homepage": check_homepage,
    "refresh_report": check_cooldown,
    "push_invoices": check_decorator,
    "export_report": check_limit,
    "quorum_app": check_quorum,
    "CELERY_REDLOCK_URL": check_django,
}

#: Checks that apply to one file only (the name means something else elsewhere).
ONLY_IN = {"sync_account": {"README.md"}}


def cleanup(ns: dict[str, Any]) -> None:
    """Undo what blocks registered globally: signal receivers, collectors; close the apps."""
    if "on_contended" in ns:
        lock_contended.disconnect(ns["on_contended"])
    if "collector" in ns:
        from prometheus_client import REGISTRY

        REGISTRY.unregister(ns["collector"])
    for value in ns.values():
        if isinstance(value, Celery | sqlite3.Connection):
            value.close()


@pytest.fixture
def namespace() -> Iterator[dict[str, Any]]:
    ns: dict[str, Any] = {"__name__": "proj"}
    yield ns
    cleanup(ns)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_python_block_runs(
    doc: Path, namespace: dict[str, Any], redis_server: RedisServer, redis_url: str
) -> None:
    for block in python_blocks(doc):
        if block.not_run is not None:
            continue
        before = dict(namespace)
        code = compile(point_at(block.code, redis_server), block.where, "exec")
        exec(code, namespace)
        for name, check in CHECKS.items():
            bound = name in namespace and namespace[name] is not before.get(name)
            if bound and doc.name in ONLY_IN.get(name, {doc.name}):
                check(namespace, redis_server)


def test_blocks_that_do_not_run_say_why() -> None:
    for doc in DOCS:
        for block in python_blocks(doc):
            assert block.not_run != "", f"{block.where}: `<!-- not run: ... -->` needs a reason"
        text = doc.read_text()
        for match in re.finditer(r"<!--\s*not run\b.*?-->\s*\n", text):
            assert text[match.end() :].startswith("```python\n"), (
                f"{doc.name}: {match.group(0).strip()} must come right before a python block"
            )


def test_the_readme_has_both_quickstarts_and_they_run() -> None:
    blocks = python_blocks(ROOT / "README.md")
    assert [b.not_run for b in blocks] == [None, None]
    assert "base=LockedTask" in blocks[0].code and "@single_instance" in blocks[1].code
    assert all(len(b.code.strip().splitlines()) <= 15 for b in blocks)


def test_the_guide_gives_the_acl_line_the_suite_checks() -> None:
    assert ACL_LINE in (ROOT / "docs" / "guide.md").read_text()
