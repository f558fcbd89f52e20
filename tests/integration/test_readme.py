"""Every Python block of the README and of ``docs/`` runs, against a private server.

The blocks of one file run in order in one namespace, as a reader meets them (a page's first
block defines the app the others use), with ``__name__`` ``"proj"`` so task names read as in
the docs, and every ``redis://localhost`` URL pointed at the session's private server. After a
block, the checks below keyed by a name it binds assert that it does what its text says.

The README and the guide then run the way a project runs them: each app's tasks in an
in-process worker, where the blocks' ``if __name__ == "__main__":`` parts (the producer's calls)
run, and every task is called through the worker and directly (``sync_account(42)``, as a unit
test calls it), with the arguments of :data:`CALLS`.

A block may be left out only when it needs something unavailable here, with an HTML comment
right before it: ``<!-- not run: needs Docker -->``. The blocks of ``docs/testing.md`` that are
test files also run as tests, under pytester (``test_pytest_plugin.py``, ``test_recipes.py``).
"""

from __future__ import annotations

import ast
import re
import secrets
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis as redis_py
from celery import Celery, _state
from celery.app.task import Task

from celery_redlock import Lock, lock_key
from celery_redlock._celery.options import settings_for
from celery_redlock.metrics import flush
from celery_redlock.signals import lock_contended
from celery_redlock.testing import RedisServer, wait_until
from support.apps import lock_keys
from support.workers import running_worker
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


#: The PostgreSQL the guide's fenced store uses: this machine's, database ``test``.
PG_DSN = "host=127.0.0.1 dbname=test user=postgres"


def point_at(code: str, server: RedisServer, schema: str) -> str:
    """``code`` on the private Redis server, and its PostgreSQL tables in ``schema``."""
    code = code.replace("redis://localhost:6379", f"redis://127.0.0.1:{server.port}")
    return code.replace(f'"{PG_DSN}"', f'"{PG_DSN} options=-csearch_path={schema}"')


@pytest.fixture
def pg_schema(postgres: str) -> Iterator[str]:
    """A PostgreSQL schema of this test's own: the guide's table lives there, dropped after."""
    psycopg = pytest.importorskip("psycopg")
    name = f"readme_{secrets.token_hex(6)}"
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    yield name
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {name} CASCADE")


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
    result, direct = task.apply(args=(42,)).get(), task(42)
    if result != 42:  # the first quickstart returns its fencing token: None on a direct call
        assert isinstance(result, int) and result > 0 and direct is None, (result, direct)
    else:
        assert direct == 42
    assert lock_key(task, 42).startswith("redlock:{proj.sync_account:")
    assert lock_keys(locks) == []  # released
    flush()  # the event counters, written once a second: now
    assert locks.hget("redlock:stats:proj.sync_account", "acquired")  # it did take a lock
    locks.close()


def check_homepage(ns: dict[str, Any], server: RedisServer) -> None:
    """One rebuild for a stampede: the waiters read the cache again under the lock."""

    class Cache:
        def __init__(self) -> None:
            self.page: str | None = None
            self.rebuilds = 0
            self.guard = threading.Lock()

        def get(self) -> str | None:
            return self.page

        def rebuild(self) -> str:
            with self.guard:
                self.rebuilds += 1
            if self.rebuilds == 1:  # the stampede: the other requests now wait for the lock
                wait_until(lambda: waiting.zcard(WAITERS) == REQUESTS - 1, 10, "the waiters")
            self.page = "fresh"
            return self.page

        def stale(self) -> str:
            return "stale"

    REQUESTS, WAITERS = 6, "redlock:{rebuild:homepage}:waiters"
    waiting = redis_py.Redis(port=server.port)
    cache = Cache()
    start = threading.Barrier(REQUESTS)

    def request(_: int) -> str:
        start.wait(10)  # every request misses the cache, then meets the lock
        return str(ns["homepage"](cache, server.url))

    with ThreadPoolExecutor(REQUESTS) as pool:
        pages = list(pool.map(request, range(REQUESTS)))
    waiting.close()
    assert pages == ["fresh"] * REQUESTS
    assert cache.rebuilds == 1
    empty = Cache()
    with Lock(server.url, "rebuild:homepage", ttl=30):
        assert ns["homepage"](empty, server.url) == "stale"  # after its 2 s timeout
    assert empty.rebuilds == 0


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
    """Undo what blocks registered globally: signal receivers, collectors; close the apps and
    connections (a program's end with its process: the guide's PostgreSQL one), pass or fail."""
    if "on_contended" in ns:
        lock_contended.disconnect(ns["on_contended"])
    if "collector" in ns:
        from prometheus_client import REGISTRY

        REGISTRY.unregister(ns["collector"])
    for value in [*ns.values(), *ns.get("connections", {}).values()]:
        if isinstance(value, Celery | sqlite3.Connection) or type(value).__module__.startswith(
            "psycopg"
        ):
            value.close()


@pytest.fixture
def namespace() -> Iterator[dict[str, Any]]:
    ns: dict[str, Any] = {"__name__": "proj"}
    yield ns
    cleanup(ns)


@dataclass(frozen=True)
class Call:
    """How a documented task is called, and what a direct call does."""

    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    #: The exception a direct call raises on purpose (a clear refusal), or None: it returns.
    direct_raises: type[Exception] | None = None


#: Every task of the README and the guide, by name: a new example needs a line here.
CALLS: dict[str, Call] = {
    "sync_account": Call((42,)),
    "push_invoices": Call((5,)),
    "refresh_report": Call(),
    "reindex": Call((7,)),
    "reindex_doc": Call((7,), {"version": 3}),
    "save_draft": Call((7, "Hi")),
    "export_report": Call(),
    "call_partner_api": Call((2,)),
    "call_search_api": Call(("redis",)),
    "send_digest": Call((1,)),
    "export_account": Call((3,)),
    "rebuild_index": Call((42,)),
    "set_balance": Call((42, 300), direct_raises=RuntimeError),
    "post_balance": Call((8, 50), direct_raises=RuntimeError),
}
#: The pages whose examples run in a worker and on a direct call.
RUN_BOTH_WAYS = {"README.md", "guide.md"}


def is_main_guard(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"


def split_main(code: str, where: str) -> tuple[Any, list[Any]]:
    """The block as a module imports it, and its ``if __name__ == "__main__":`` bodies."""
    tree = ast.parse(code, where)
    module = ast.Module([n for n in tree.body if not is_main_guard(n)], type_ignores=[])
    mains = [ast.Module(n.body, type_ignores=[]) for n in tree.body if is_main_guard(n)]
    return compile(module, where, "exec"), [compile(m, where, "exec") for m in mains]


@dataclass
class Ran:
    """A block after it ran: what it defined, and what its producer part will do."""

    block: Block
    namespace: dict[str, Any]
    mains: list[Any]
    tasks: dict[str, Task]


def tasks_bound(namespace: dict[str, Any], before: dict[str, Any]) -> dict[str, Task]:
    return {
        name: value
        for name, value in namespace.items()
        if value is not before.get(name) and isinstance(value, Task)
    }


def run_both_ways(runs: list[Ran]) -> None:
    """Each app's tasks in a worker (with the producer parts) and called directly."""
    for ran in runs:
        for name, task in ran.tasks.items():
            assert name in CALLS, f"{ran.block.where}: {name} needs a line in CALLS"
            call = CALLS[name]
            if call.direct_raises is None:
                task(*call.args, **call.kwargs)
            else:
                with pytest.raises(call.direct_raises):
                    task(*call.args, **call.kwargs)
    apps: list[Celery] = []
    for ran in runs:
        for task in ran.tasks.values():
            if task.app not in apps:
                apps.append(task.app)
    producers = [ran for ran in runs if ran.mains]
    unserved = [r.block.where for r in producers if r.namespace.get("app") not in apps]
    assert not unserved, f"producer parts whose app defines no task here: {unserved}"
    for app in apps:
        with running_worker(app):
            for ran in producers:
                if ran.namespace.get("app") is app:
                    for main in ran.mains:
                        exec(main, dict(ran.namespace))
            for ran in runs:
                for name, task in ran.tasks.items():
                    if task.app is app:
                        call = CALLS[name]
                        task.delay(*call.args, **call.kwargs).get(timeout=20)


def starts_a_program(code: str) -> bool:
    """Whether a block makes its own ``app = Celery(...)``: a new project (the README's two
    quickstarts are alternatives), which runs apart from the blocks before it."""
    return any(
        isinstance(node, ast.Assign) and any(ast.unparse(t) == "app" for t in node.targets)
        for node in ast.parse(code).body
    )


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_python_block_runs(
    doc: Path,
    namespace: dict[str, Any],
    redis_server: RedisServer,
    redis_url: str,
    request: pytest.FixtureRequest,
) -> None:
    # Only a doc with the fenced-store recipe needs PostgreSQL (else skipped without one).
    pg_schema = request.getfixturevalue("pg_schema") if PG_DSN in doc.read_text() else ""
    shared_before = set(_state._on_app_finalizers)
    runs: list[Ran] = []

    def end_program() -> None:
        if doc.name in RUN_BOTH_WAYS:
            run_both_ways(runs)
        else:
            assert not [r.mains for r in runs if r.mains], f"{doc.name}: a producer not run"
        runs.clear()
        # Its shared tasks stay out of the next project's app (as separate processes would).
        _state._on_app_finalizers.intersection_update(shared_before)

    for block in python_blocks(doc):
        if block.not_run is not None:
            continue
        if runs and starts_a_program(block.code):
            end_program()
        before = dict(namespace)
        module, mains = split_main(point_at(block.code, redis_server, pg_schema), block.where)
        exec(module, namespace)
        for name, check in CHECKS.items():
            bound = name in namespace and namespace[name] is not before.get(name)
            if bound and doc.name in ONLY_IN.get(name, {doc.name}):
                check(namespace, redis_server)
        runs.append(Ran(block, dict(namespace), mains, tasks_bound(namespace, before)))
    end_program()


FORKED = """
import os, sys
ns = {}
exec(sys.stdin.read(), ns)
parent = ns["pg"]().info.backend_pid
read, write = os.pipe()
child = os.fork()
if child == 0:
    os.write(write, str(ns["pg"]().info.backend_pid).encode())
    os._exit(0)
os.waitpid(child, 0)
print(parent, int(os.read(read, 64)), ns["pg"]().info.backend_pid)
"""


def recipe_setup(server: RedisServer, schema: str, *, with_table: bool) -> str:
    """The guide's fenced-store recipe cut to its imports, ``connections`` and ``pg()`` (and,
    ``with_table``, the block that creates its table), on ``server`` and in ``schema``."""
    block = next(
        b for b in python_blocks(ROOT / "docs" / "guide.md") if "def fenced_write" in b.code
    )
    tree = ast.parse(point_at(block.code, server, schema))
    kept = [
        node
        for node in tree.body
        if isinstance(node, ast.Import | ast.ImportFrom)
        or (with_table and isinstance(node, ast.With))
        or (isinstance(node, ast.FunctionDef) and node.name == "pg")
        or (isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "connections")
    ]
    return ast.unparse(ast.Module(kept, type_ignores=[]))


def test_the_fenced_store_recipe_gives_each_process_its_own_connection(
    redis_server: RedisServer, pg_schema: str
) -> None:
    """A prefork worker forks its children after importing the tasks' module: a connection
    opened there and shared by the children mixes their statements and replies. The recipe's
    ``pg()``, run in a fresh interpreter that then forks, gives the child a session of its own
    and leaves the parent's working."""
    code = recipe_setup(redis_server, pg_schema, with_table=False)
    done = subprocess.run(
        [sys.executable, "-c", FORKED], input=code, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    parent, child, after = map(int, done.stdout.split())
    assert child != parent and after == parent


def test_the_fenced_store_recipe_opens_a_new_connection_once_the_server_ended_one(
    redis_server: RedisServer, pg_schema: str
) -> None:
    """Helper probe: once PostgreSQL ended a process's connection (a restart, a failover, an
    idle timeout), every later write of that process failed with "the connection is closed"
    (10 of 10 calls on a prefork worker) until the process was recycled."""
    psycopg = pytest.importorskip("psycopg")
    recipe: dict[str, Any] = {}
    exec(recipe_setup(redis_server, pg_schema, with_table=False), recipe)
    first = recipe["pg"]()
    with psycopg.connect(PG_DSN, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (first.info.backend_pid,))
    with pytest.raises(psycopg.OperationalError):  # the write under way fails
        recipe["pg"]().execute("SELECT 1")
    again = recipe["pg"]()
    assert again is not first and again.execute("SELECT 1").fetchone() == (1,)
    again.close()


#: Runs the recipe's set-up (stdin) in 3 forked processes at once, on a fresh table, 8 times;
#: prints what each process got.
AT_ONCE = """
import multiprocessing, sys
code = sys.stdin.read()

def start(barrier, results):
    ns = {}
    barrier.wait()
    try:
        exec(code, ns)
        results.put("ok")
    except Exception as exc:
        results.put(type(exc).__name__)

context = multiprocessing.get_context("fork")
got = []
for _ in range(8):
    ns = {}
    exec(code, ns)
    ns["pg"]().execute("DROP TABLE ledger")
    barrier, results = context.Barrier(3), context.Queue()
    workers = [context.Process(target=start, args=(barrier, results)) for _ in range(3)]
    for w in workers:
        w.start()
    got += [results.get(timeout=30) for _ in workers]
    for w in workers:
        w.join()
print(" ".join(got))
"""


def test_the_fenced_store_recipe_sets_up_in_workers_that_start_at_once(
    redis_server: RedisServer, pg_schema: str
) -> None:
    """Three processes import the recipe's module at one moment (workers started together):
    its table is created once and no process fails (the plain ``CREATE TABLE IF NOT EXISTS``
    failed in two of three with a unique violation on ``pg_type``)."""
    code = recipe_setup(redis_server, pg_schema, with_table=True)
    assert "CREATE TABLE" in code
    done = subprocess.run(
        [sys.executable, "-c", AT_ONCE], input=code, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok"] * 24, done.stdout


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
    assert all(len(b.code.strip().splitlines()) <= 16 for b in blocks)
    for block in blocks:  # a result backend, and a call to show, away from the import path
        code = block.code
        assert "backend=" in code and ".delay(" in code.split('if __name__ == "__main__":')[1]


def test_the_guide_gives_the_acl_line_the_suite_checks() -> None:
    assert ACL_LINE in (ROOT / "docs" / "guide.md").read_text()


def test_the_readme_quickstarts_pass_mypy_strict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``mypy --strict`` on each quickstart, as a typed project would check it. Celery ships no
    type hints, so its import is ``Any`` (``--ignore-missing-imports``) and ``@app.task`` an
    untyped decorator (``--allow-untyped-decorators``); everything of ours is checked."""
    api = pytest.importorskip("mypy.api", reason="mypy comes with the dev extra")
    paths = []
    for number, block in enumerate(python_blocks(ROOT / "README.md"), start=1):
        path = tmp_path / f"quickstart{number}.py"
        path.write_text(block.code)
        paths.append(str(path))
    config = tmp_path / "mypy.ini"
    # The checkout's package, read as an installed one is (its own errors are not the user's).
    config.write_text("[mypy]\n[mypy-celery_redlock.*]\nfollow_imports = silent\n")
    monkeypatch.setenv("MYPYPATH", str(ROOT))
    out, err, status = api.run(
        [
            "--config-file",
            str(config),
            "--strict",
            "--ignore-missing-imports",
            "--allow-untyped-decorators",
            "--python-version",
            "3.10",
            "--cache-dir",
            str(tmp_path / "cache"),
            *paths,
        ]
    )
    assert status == 0, out + err
    assert "Success: no issues found in 2 source files" in out
