"""``celery redlock ls --json`` and :class:`~celery_redlock.cli.LockStore` over more locks than
one page (:data:`~celery_redlock.cli.PAGE`), on a real Redis.

Every lock is listed once, with its fencing counter and its per-call overrides where it has
them: a page reads those only when some of its locks have some, so here pages with and without
them are mixed, and single reads (a page of one) take each way. A Redis Cluster reads each key
with commands of its own slot.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import redis as redis_py
from celery import Celery
from click.testing import CliRunner

from celery_redlock import Lock
from celery_redlock._celery.options import settings_for
from celery_redlock._redis.keys import call_key
from celery_redlock._redis.owner import new_token
from celery_redlock.cli import PAGE, LockStore, redlock
from celery_redlock.web._core import Dashboard
from support.servers import ClusterNodes
from tests.integration.included_app import fresh_app


@pytest.fixture
def app(redis_url: str) -> Iterator[Celery]:
    app = Celery("listing", set_as_current=False)
    app.conf.redlock_url = redis_url
    yield app
    app.close()


def ls_json(app: Celery) -> str:
    done = CliRunner().invoke(redlock, ["ls", "--json"], obj=SimpleNamespace(app=app))
    assert done.exit_code == 0, done.output
    return done.output


def record(
    r: redis_py.Redis | redis_py.RedisCluster,
    lock: Lock,
    token: str | None,
    overrides: dict[str, Any],
) -> None:
    """A call record as the engine writes it beside the slot: the holder's token names it."""
    value = {"token": token, "task_id": lock.owner, "overrides": overrides}
    r.set(call_key(lock.key), json.dumps(value), px=60_000)


def test_every_lock_is_listed_once_with_its_counter_and_overrides(
    app: Celery, redis_url: str, r: redis_py.Redis
) -> None:
    assert ls_json(app) == "[]\n"
    plain = [
        Lock(redis_url, f"plain-{i}", ttl=60, owner=f"t-{i}", host="w1@h")
        for i in range(2 * PAGE + 10)
    ]
    for lock in plain:
        assert lock.acquire(blocking=False)
    # A semaphore's acquire script keeps a fencing counter; a plain single-node lock does not.
    slots = [Lock(redis_url, "sem", ttl=60, limit=2, owner=f"s-{i}") for i in range(2)]
    for lock in slots:
        assert lock.acquire(blocking=False)
    counter = int(r.get(slots[0].keys.fence) or 0)
    assert counter == slots[1].fencing_token
    overridden, foreign = plain[7], plain[8]
    record(r, overridden, overridden.token, {"wait_timeout": 5.0, "ttl": 60.0})
    record(r, foreign, "the token of a holder before", {"ttl": 1.0})

    store = LockStore(settings_for(app))
    held = store.all()
    by_key = {lock.key: lock for lock in held}
    assert len(held) == len(by_key) == len(plain) + len(slots)
    assert by_key[overridden.key].overrides == {"wait_timeout": 5.0, "ttl": 60.0}
    assert by_key[foreign.key].overrides is None  # not this holder's record
    assert [by_key[lock.key].fencing_token for lock in slots] == [counter, counter]
    assert {by_key[lock.key].fencing_token for lock in plain} == {None}
    task_ids = {lock.key: lock.holder.task_id for lock in held if lock.holder is not None}
    assert [task_ids[lock.key] for lock in plain] == [lock.owner for lock in plain]

    for lock, fence, overrides in [
        (plain[0], None, None),
        (overridden, None, {"wait_timeout": 5.0, "ttl": 60.0}),
        (slots[1], counter, None),
    ]:
        one = store.read(lock.key)
        assert one is not None and (one.fencing_token, one.overrides) == (fence, overrides)

    out = ls_json(app)
    lines = out.splitlines()
    assert (lines[0], lines[-1], len(lines)) == ("[", "]", len(held) + 2)  # one lock a line
    listed = sorted(json.loads(out), key=lambda item: item["key"])
    expected = [lock.as_dict() for lock in held]
    for item, want in zip(listed, expected, strict=True):
        # Nothing renews these: a TTL only falls between the two reads, however long apart.
        assert 0 < item["ttl"] <= want["ttl"]
        assert item == {**want, "ttl": item["ttl"]}


def test_a_cluster_lists_every_lock_with_its_counter_and_overrides() -> None:
    with ClusterNodes() as cluster:
        app = Celery("listing", set_as_current=False)
        app.conf.redlock_url = cluster.url
        plain = [Lock(cluster.url, f"job-{i}", ttl=60, owner=f"t-{i}") for i in range(30)]
        slots = [Lock(cluster.url, "sem", ttl=60, limit=2, owner=f"s-{i}") for i in range(2)]
        for lock in plain + slots:
            assert lock.acquire(blocking=False)
        rc = redis_py.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
        try:
            record(rc, plain[3], plain[3].token, {"ttl": 60.0})
            counter = int(rc.get(slots[0].keys.fence) or 0)
        finally:
            rc.close()

        held = {lock.key: lock for lock in LockStore(settings_for(app)).all()}
        assert set(held) == {lock.key for lock in plain + slots}
        assert held[plain[3].key].overrides == {"ttl": 60.0}
        assert [held[lock.key].fencing_token for lock in slots] == [counter, counter]
        assert all(0 < (held[lock.key].ttl or 0) <= 60 for lock in plain + slots)
        app.close()


def inspect_of(app: Celery, *args: str) -> Any:
    done = CliRunner().invoke(redlock, ["inspect", *args], obj=SimpleNamespace(app=app))
    return done


def test_inspect_of_a_semaphore_name_shows_every_held_slot(app: Celery, redis_url: str) -> None:
    """A semaphore's bare name (or full key) shows each of its held slots: a list in JSON, even
    with one slot held, since the name names them all. Before, only slot 1 was read: with slot 1
    free and slot 2 held, ``inspect`` said the semaphore was not held."""
    slots = [Lock(redis_url, "sem", ttl=60, limit=3, owner=f"s-{i}") for i in range(3)]
    for lock in slots:
        assert lock.acquire(blocking=False)
    assert [
        lk.slot for lk in (LockStore(settings_for(app)).read(lock.key) for lock in slots) if lk
    ] == [1, 2, 3]
    slots[0].release()
    for name in ("sem", slots[0].key):
        done = inspect_of(app, name, "--json")
        assert done.exit_code == 0, done.output
        shown = json.loads(done.output)
        assert [(s["slot"], s["task_id"]) for s in shown] == [(2, "s-1"), (3, "s-2")]
        text = inspect_of(app, name)
        assert text.exit_code == 0 and "(slot 2)" in text.output and "(slot 3)" in text.output
    plain = Lock(redis_url, "one", ttl=60, owner="p")
    assert plain.acquire(blocking=False)
    assert json.loads(inspect_of(app, "one", "--json").output)["task_id"] == "p"
    assert json.loads(inspect_of(app, plain.key, "--json").output)["task_id"] == "p"
    slots[2].release()
    free = inspect_of(app, slots[2].key, "--json")  # a later slot's key: that slot alone
    assert (free.exit_code, free.output) == (1, "null\n")
    slots[1].release()
    done = inspect_of(app, "sem", "--json")
    assert (done.exit_code, done.output) == (1, "null\n")


def test_release_of_a_semaphore_name_says_how_many_other_slots_are_held(
    app: Celery, redis_url: str
) -> None:
    """A bare name's key is slot 1: ``release sem`` released it alone and said nothing of slots
    2 and 3, still held (probe, round 4)."""
    slots = [Lock(redis_url, "sem", ttl=60, limit=3, owner=f"s-{i}") for i in range(3)]
    for lock in slots:
        assert lock.acquire(blocking=False)
    cli, obj = CliRunner(), SimpleNamespace(app=app)
    done = cli.invoke(redlock, ["release", "sem", "--force", "--timeout", "0.2"], obj=obj)
    assert done.exit_code == 0, done.output
    assert f"released {slots[0].key} (forced)" in done.output
    assert "2 other slot(s) of semaphore sem still held" in done.output
    assert "redlock inspect sem` lists them" in done.output
    plain = Lock(redis_url, "one", ttl=60, owner="p")
    assert plain.acquire(blocking=False)
    done = cli.invoke(redlock, ["release", "one", "--force", "--timeout", "0.2"], obj=obj)
    assert done.exit_code == 0 and "other slot" not in done.output, done.output


def test_inspect_shows_a_foreign_value_escaped(app: Celery, r: redis_py.Redis) -> None:
    """A value that is not one of our tokens, set by anyone who can write the key: its first
    characters reached the terminal raw, an escape sequence included (the window title here)."""
    key = "redlock:{foreign}"
    r.set(key, "\x1b]0;pwned\x07 and more")
    done = inspect_of(app, key)
    assert done.exit_code == 0, done.output
    assert "\x1b" not in done.output and "\x07" not in done.output
    assert "token     \\x1b]0;pwne..." in done.output


@pytest.fixture
def included(redis_url: str) -> Iterator[Celery]:
    """A fresh ``tests.integration.included_app`` whose task module is not imported yet."""
    with fresh_app(redis_url) as app:
        yield app


@pytest.fixture
def grp(redis_url: str) -> Iterator[Lock]:
    """A lock held under the lock name of ``included.sync`` (``lock_name="grp"``)."""
    held = Lock(redis_url, "grp:0123456789abcdef0123456789abcdef", ttl=60, owner="t-grp")
    assert held.acquire(blocking=False)
    yield held
    held.release()


def test_a_task_of_an_included_module_is_inspected_by_its_lock_name(
    included: Celery, grp: Lock
) -> None:
    """The usual layout: ``celery -A proj`` loads ``proj``, its tasks live in a module of
    ``include`` (or ``autodiscover_tasks()``), which a worker imports at start and the command
    line did not. A task there that sets ``lock_name`` held ``redlock:{grp:...}``, and
    ``inspect <task name>`` said it was not held (exit 1)."""
    done = inspect_of(included, "included.sync", "--json")
    assert done.exit_code == 0, done.output
    assert [lock["key"] for lock in json.loads(done.output)] == [grp.key]


def test_the_dashboard_filters_a_task_of_an_included_module_by_its_lock_name(
    included: Celery, grp: Lock
) -> None:
    """``create_app()`` (``celery redlock web``, a FastAPI or Flask mount) imports the task
    modules at start: its task filter listed ``included.sync:`` and showed nothing."""
    from celery_redlock.web import create_app

    create_app(included)
    status, body = Dashboard(included).locks_page({"task": "included.sync"}, {"csrf_token": "x"})
    assert status == 200 and grp.key in body


def test_a_task_module_that_fails_to_import_is_a_warning(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker-only dependency missing where the command runs: the command goes on, the name
    is looked up as given, and one WARNING says why (once per app)."""
    app = Celery("broken", set_as_current=False, include=["tests.integration.no_such_module"])
    app.conf.redlock_url = redis_url
    for _ in range(2):
        done = inspect_of(app, "broken.task")
        assert done.exit_code == 1 and "is not held" in done.output
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "could not import the task modules of app broken" in warned[0]
    app.close()


def test_inspect_of_a_marker_or_of_slot_one_as_colon_one_says_what_it_is(
    app: Celery, redis_url: str, r: redis_py.Redis
) -> None:
    """Helper probe, round 3: ``inspect`` of a ``lock_enqueue`` marker's key said only "not
    held (no lock has that key...)" while the marker de-duplicated every ``delay()``; so did
    slot 1 of a held semaphore given as ``<key>:1`` (slot 1's key has no suffix)."""
    r.set("redlock:{proj.enq:abc}:queued", "task-1", px=60_000)
    marker = inspect_of(app, "redlock:{proj.enq:abc}:queued")
    assert marker.exit_code == 1
    assert "it is the lock_enqueue marker of a queued call, not a lock" in marker.output
    held = Lock(redis_url, "sem", ttl=60, limit=2, owner="s-1")
    assert held.acquire(blocking=False)
    slot = inspect_of(app, held.key + ":1")
    assert slot.exit_code == 1
    assert f"slot 1 of a semaphore is its name's key, without ':1': {held.key}" in slot.output
    plain = inspect_of(app, "proj.nothing")
    assert plain.output.endswith("(no lock has that key, lock name or task name)\n")


def test_release_of_a_marker_says_what_it_is_as_inspect_does(
    app: Celery, r: redis_py.Redis
) -> None:
    """Probe: ``release`` of the newest-call marker's key said only "is not held: nothing
    released", where ``inspect`` of it said what it is and where to see it."""
    key = "redlock:{proj.newest:abc}:newest"
    r.hset(key, mapping={"id": "task-1"})
    said = "it is the newest-call marker of lock_enqueue='replace' or lock_debounce, not a lock"
    for command in ("inspect", "release"):
        done = CliRunner().invoke(redlock, [command, key], obj=SimpleNamespace(app=app))
        assert done.exit_code == 1, done.output
        assert f"{said}: `celery redlock web` shows those" in done.output, (command, done.output)
    assert r.exists(key)


def test_a_key_copied_from_ls_with_its_line_break_escaped_is_explained(
    app: Celery, r: redis_py.Redis
) -> None:
    """Probe: ``ls`` shows a name's line break as ``\\n``; ``release`` and ``inspect`` of that
    form said "is not held" of a held lock, with nothing to say why. (``Lock`` refuses such a
    name: another program wrote it.)"""
    key = "redlock:{bad\nname:00}"
    r.set(key, new_token("id-1", "w9@gone", 7), px=60_000)
    listed = CliRunner().invoke(redlock, ["ls"], obj=SimpleNamespace(app=app))
    shown = "redlock:{bad\\nname:00}"
    assert shown in listed.output, listed.output
    said = "`ls` shows the control characters of a name escaped (\\n, \\u202e)"
    for command in ("inspect", "release"):
        done = CliRunner().invoke(redlock, [command, shown], obj=SimpleNamespace(app=app))
        assert done.exit_code == 1, done.output
        assert said in done.output, (command, done.output)
    assert r.exists(key)
