"""The dashboard's inventory on a real Redis and a real 3-primary Cluster: cursor pages that
cover every primary, a bounded amount of work per page, markers beside the slots, owner-
checked actions, and a page view that writes nothing."""

from __future__ import annotations

import html
import logging
import os
import re
import signal
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator

import pytest
import redis as redis_py
from celery import Celery

from celery_redlock import Lock, LockedTask, lock_key
from celery_redlock._celery import timeline
from celery_redlock._celery.options import settings_for
from celery_redlock._redis.inventory import BUDGET, ROWS, HeldLock, Inventory
from celery_redlock._redis.keys import keys_for
from celery_redlock._redis.owner import new_token
from celery_redlock.cli._liveness import Verdict
from celery_redlock.testing import RedisServer, wait_until
from celery_redlock.web import _core
from celery_redlock.web._core import Dashboard
from celery_redlock.web._rows import Row, rows_of
from support import ROOT
from support.apps import DownBroker, brokerless_app, layout_app
from support.servers import ClusterNodes, dead_port


def fill(client: redis_py.Redis, names: list[str], ttl_ms: int = 60_000) -> None:
    pipe = client.pipeline(transaction=False)
    for i, name in enumerate(names):
        pipe.set(keys_for("redlock", name).lock, new_token(f"id-{i}", "w9@gone", 7), px=ttl_ms)
    pipe.execute()


def renewing(app: Celery, name: str = "job") -> None:
    """Give ``app`` a task named ``name`` that renews its lock (no ``lock_ttl``): the locks
    named ``<name>:<32 hex digits>`` are its, and a TTL within two thirds of the lease proves
    their holder alive (a lock no task of the app takes proves nothing)."""

    @app.task(base=LockedTask, name=name, lock_by=["k"], shared=False)
    def job(k: str) -> None: ...


def task_name(name: str, n: int) -> str:
    """The name of a lock of task ``name`` (one argument digest per ``n``)."""
    return f"{name}:{n:032x}"


def inventory_of(app: object) -> Inventory:
    settings = settings_for(app)
    return Inventory(settings.url, settings.prefix)


def rows(inventory: Inventory, name_prefix: str = "", cursor: str = "0") -> dict[str, Row]:
    """The rows of one page, by key."""
    return {r.key: r for r in rows_of(inventory.view(cursor, name_prefix=name_prefix))}


def walk(inventory: Inventory, name_prefix: str = "") -> tuple[list[str], int]:
    """Every key of every page, and the number of pages."""
    cursor = "0"
    keys: list[str] = []
    pages = 0
    while True:
        view = inventory.view(cursor, name_prefix=name_prefix)
        assert view.looked_at <= BUDGET
        keys += [r.key for r in rows_of(view)]
        cursor, pages = view.cursor, pages + 1
        if cursor == "0":
            return keys, pages


def test_pages_cover_every_lock_once_in_bounded_steps(redis_url: str, r: redis_py.Redis) -> None:
    names = [f"job:{i:05d}" for i in range(3000)]
    fill(r, names)
    r.set("unrelated", 1)
    app = layout_app("inv", redis_url.rsplit("/", 1)[0], set_as_current=False)
    inventory = inventory_of(app)
    first = inventory.view()
    assert ROWS <= len(first.locks) < 3000 and first.cursor != "0"
    keys, pages = walk(inventory)
    assert sorted(set(keys)) == sorted(keys_for("redlock", n).lock for n in names)
    assert pages > 1
    # A filter that matches one lock looks at BUDGET keys at most per page.
    keys, _ = walk(inventory, "job:01234")
    assert keys == [keys_for("redlock", "job:01234").lock]


def test_a_page_keeps_the_step_that_reaches_its_rows_whole_as_the_docs_say(
    redis_url: str, r: redis_py.Redis
) -> None:
    """The docs said a page runs "until it has 100 rows"; pages of 101 and 197 were seen (probe,
    round 4): steps that matched little grow four times, and the one that reaches 100 rows is
    kept whole, since the cursor resumes only between steps. One key in six matches here."""
    names = [f"{'job' if i % 6 == 0 else 'other'}:{i:05d}" for i in range(3600)]
    fill(r, names)
    inventory = inventory_of(layout_app("inv", redis_url.rsplit("/", 1)[0], set_as_current=False))
    cursor, sizes, keys = "0", [], []
    while True:
        view = inventory.view(cursor, name_prefix="job:")
        sizes.append(len(view.locks))
        keys += [lock.key for lock in view.locks]
        cursor = view.cursor
        if cursor == "0":
            break
    assert sorted(keys) == sorted(keys_for("redlock", n).lock for n in names if n[0] == "j")
    assert max(sizes) > ROWS, sizes  # no key lost or listed twice, and yet more than ROWS
    text = " ".join((ROOT / "docs" / "operations.md").read_text().split())
    assert "until it has 100 rows or more" in text
    assert "a page can hold more than 100 rows" in text


def test_a_page_counts_rows_not_the_companion_keys_beside_them() -> None:
    """A quorum's lock has a fencing counter beside it, which the ``SCAN`` pattern matches too:
    pages counted those keys as rows and held about 60 locks, not 100 (probe, round 23), and
    the walk's last, empty page of a later node said "No lock held." while 150 were held."""
    with RedisServer() as a, RedisServer() as b, RedisServer() as c:
        urls = [a.url, b.url, c.url]
        locks = [Lock(urls, f"q:{i:03d}", ttl=60) for i in range(150)]
        for lock in locks:
            assert lock.acquire(blocking=False)
        app = layout_app("q", a.url.rsplit("/", 1)[0], set_as_current=False)
        app.conf.redlock_url = urls
        inventory = inventory_of(app)
        first = inventory.view()
        assert len(first.locks) >= ROWS, len(first.locks)
        keys, cursor, bodies = [], "0", []
        board = Dashboard(app, ping_timeout=0.2)
        while True:
            view = inventory.view(cursor)
            keys += [lock.key for lock in view.locks]
            status, body = board.locks_page({"cursor": cursor}, {"csrf_token": "x"})
            assert status == 200
            bodies.append(body)
            cursor = view.cursor
            if cursor == "0":
                break
        app.close()
    assert sorted(keys) == sorted(lock.key for lock in locks)
    assert "No lock held." not in bodies[-1] and len(bodies) > 1


def test_steps_of_fences_alone_grow_as_sparse_steps_do(redis_url: str, r: redis_py.Redis) -> None:
    """A fencing counter stays a day after its name's last lock: a prefix can hold thousands
    of them beside a few locks. Counting rows alone, steps of fences did not grow, and one page
    view ran a ``SCAN`` of 100 keys at a time up to the 50,000 keys' budget (review, round 23:
    399 steps, 0.87 s)."""
    pipe = r.pipeline(transaction=False)
    for n in range(5000):
        pipe.set(f"redlock:{{job:{n:05d}}}:fence", 5)
    pipe.execute()
    fill(r, ["job:held"])
    inventory = inventory_of(layout_app("inv", redis_url.rsplit("/", 1)[0], set_as_current=False))

    def scans() -> int:
        return int(r.info("commandstats").get("cmdstat_scan", {}).get("calls", 0))

    before = scans()
    view = inventory.view()
    assert [lock.key for lock in view.locks] == [keys_for("redlock", "job:held").lock]
    assert scans() - before <= 6


def test_the_filter_is_a_literal_prefix(redis_url: str, r: redis_py.Redis) -> None:
    fill(r, ["a*b", "a?b", "a[b]", "a\\b", "axb"])
    app = layout_app("inv", redis_url.rsplit("/", 1)[0], set_as_current=False)
    inventory = inventory_of(app)
    for literal in ("a*", "a?", "a[", "a\\"):
        keys, _ = walk(inventory, literal)
        assert [k.split("{")[1][:2] for k in keys] == [literal], literal
    with pytest.raises(ValueError, match="at most 200"):
        inventory.view(name_prefix="x" * 201)


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterNodes]:
    with ClusterNodes() as nodes:
        yield nodes


def test_pages_cover_every_primary_of_a_cluster(cluster: ClusterNodes) -> None:
    rc = redis_py.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    rc.flushall(target_nodes=redis_py.RedisCluster.PRIMARIES)
    names = [f"job:{i}" for i in range(600)]
    for i, name in enumerate(names):
        rc.set(keys_for("redlock", name).lock, new_token(f"id-{i}", "w9@gone", 7), px=60_000)
        rc.set(keys_for("redlock", name).queued, f"q-{i}", px=60_000)
    app = Celery_app(cluster.url)
    inventory = inventory_of(app)
    keys, pages = walk(inventory)
    slots = sorted(keys_for("redlock", n).lock for n in names)
    queued = sorted(keys_for("redlock", n).queued for n in names)
    assert sorted(set(keys)) == sorted(slots + queued)
    assert pages >= 3  # at least one per primary
    ports = {int(rc.get_node_from_key(k).port) for k in slots}
    assert ports == {n.port for n in cluster.nodes}
    assert rows(inventory, "job:7")[keys_for("redlock", "job:7").queued].mode == "enqueue marker"
    rc.close()


def Celery_app(url: str) -> object:
    from celery import Celery

    app = Celery("inv", set_as_current=False)
    app.conf.redlock_url = url
    return app


def test_a_page_view_writes_nothing() -> None:
    """On servers of its own: every command counted is the page's (on the shared one, a result
    consumer of an earlier test may unsubscribe meanwhile)."""
    lock = keys_for("redlock", "job:1")
    # The ping's broker traffic on one server, the locks on the other: only locks counted.
    with RedisServer() as broker, RedisServer() as locks:
        r = locks.client()
        fill(r, [f"job:{i}" for i in range(50)])
        r.set(lock.queued, "q", px=60_000)
        r.rpush(lock.rate, 1, 2)
        app = layout_app(
            "inv", f"redis://127.0.0.1:{broker.port}", set_as_current=False, redlock_url=locks.url
        )
        board = Dashboard(app, actions=True, ping_timeout=0.2)
        board.locks_page({}, {"csrf_token": "x"})  # connects (HELLO): not the view's commands
        before = r.info("commandstats")
        status, body = board.locks_page({}, {"csrf_token": "x"})
        after = r.info("commandstats")
        r.close()
    assert status == 200 and lock.lock in body
    used = {k for k in after if after[k]["calls"] != before.get(k, {}).get("calls")}
    # "script": Redis 6.2 counts SCRIPT LOAD under its command (7.0: "script|load").
    reads = {"scan", "mget", "script|load", "script", "evalsha", "exists", "zcard", "pttl"}
    reads |= {"dump", "get"}
    assert used <= {f"cmdstat_{c}" for c in (*reads, "llen", "hget", "info")}, used


def test_actions_compare_what_the_page_showed(redis_url: str, r: redis_py.Redis) -> None:
    fill(r, ["job:1"])
    lock = keys_for("redlock", "job:1")
    r.set(lock.queued, "q-1", px=60_000)
    app = layout_app("inv", redis_url.rsplit("/", 1)[0], set_as_current=False)
    board = Dashboard(app, actions=True, ping_timeout=0.2)
    shown = rows(board.inventory)
    # The queued call changed since the page was drawn: not cleared.
    r.set(lock.queued, "q-2", px=60_000)
    stale = board.act(
        "clear-marker", {"key": lock.queued, "fingerprint": shown[lock.queued].fingerprint}, "t"
    )
    assert stale.status == 409 and r.get(lock.queued) == b"q-2"
    # The slot changed holder: not released, even forced.
    old = shown[lock.lock].fingerprint
    r.set(lock.lock, new_token("id-new", "w9@gone", 8), px=60_000)
    moved = board.act("release", {"key": lock.lock, "fingerprint": old, "force": "1"}, "t")
    assert moved.status == 409 and "changed holder" in moved.message and r.exists(lock.lock)
    # A worker that does not answer a ping is dead: released without force.
    fresh = rows(board.inventory)[lock.lock].fingerprint
    done = board.act("release", {"key": lock.lock, "fingerprint": fresh}, "t")
    assert done.status == 200 and not r.exists(lock.lock)
    # Read-only: refused, nothing touched.
    fill(r, ["job:2"])
    readonly = Dashboard(app, actions=False)
    key2 = keys_for("redlock", "job:2").lock
    assert readonly.act("release", {"key": key2, "force": "1"}, "t").status == 403
    assert r.exists(key2)
    # No key, or an empty one: 400 naming the field (it was 409 "not released:  is not held").
    for action in ("release", "clear-marker", "reset-rate"):
        for form in ({}, {"key": ""}, {"key": " ", "force": "1"}):
            done = board.act(action, form, "t")
            assert done.status == 400, (action, form, done)
            assert "the form field 'key' is missing or empty" in done.message
    assert r.exists(key2)


def test_rows_count_the_waiters(redis_url: str, r: redis_py.Redis) -> None:
    fill(r, ["job:1", "job:2"])
    r.zadd(keys_for("redlock", "job:2").waiters, {"w-a": 1, "w-b": 2})
    app = layout_app("inv", redis_url.rsplit("/", 1)[0], set_as_current=False)
    by_name = {row.name: row for row in rows(inventory_of(app)).values() if row.lock}
    assert (by_name["job:1"].waiters, by_name["job:2"].waiters) == (0, 2)


def test_an_unreachable_redis_is_said_on_the_page() -> None:
    from celery import Celery

    app = Celery("down", set_as_current=False)
    app.conf.redlock_url = f"redis://127.0.0.1:{dead_port()}/0"
    board = Dashboard(app)
    status, body = board.locks_page({}, {})
    assert status == 503 and "cannot reach the lock Redis" in body
    status, body = board.stats_page({}, "")
    assert status == 503 and "cannot reach the lock Redis" in body


def test_the_page_links_the_next_page_and_shows_the_counters(
    redis_url: str, r: redis_py.Redis
) -> None:
    import html
    import re
    import urllib.parse

    names = [f"job:{i:04d}" for i in range(400)]
    fill(r, names)
    r.hset("redlock:stats:proj.job", mapping={"acquired": 7, "skipped": 3})
    app = layout_app("inv", redis_url.rsplit("/", 1)[0], set_as_current=False)
    board = Dashboard(app, ping_timeout=0.2)
    seen: set[str] = set()
    query: dict[str, str] = {}
    for _ in range(50):
        status, body = board.locks_page(query, {}, "/locks")
        assert status == 200
        seen |= set(re.findall(r'<tr data-key="([^"]+)"', body))
        link = re.search(r'id="next" href="([^"]+)"', body)
        if link is None:
            break
        url = urllib.parse.urlsplit(html.unescape(link.group(1)))
        assert url.path == "/locks/"
        query = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
    assert seen == {html.escape(keys_for("redlock", n).lock) for n in names}
    status, body = board.stats_page({}, "/locks")
    assert status == 200
    row = re.search(r"<tr><td>proj.job</td>(.*?)</tr>", body)
    assert row is not None
    cells = re.findall(r"<td>(\d+)</td>", row.group(1))
    assert cells[:2] == ["7", "3"]  # acquired, skipped: the order of celery redlock stats


def test_a_holder_that_renewed_within_two_thirds_of_the_lease_is_alive(
    redis_url: str, r: redis_py.Redis
) -> None:
    # A worker in warm shutdown stops answering pings while its task still renews: its lock,
    # renewed to the full lease (30 s) a moment ago, has more than 20 s left; one renewed
    # 21 s ago (two thirds of the lease and more) is no proof any more.
    fill(r, [task_name("job", 1)], ttl_ms=29_000)
    fill(r, [task_name("job", 2)], ttl_ms=9_000)
    app = layout_app("inv", redis_url.rsplit("/", 1)[0], set_as_current=False)
    renewing(app)
    board = Dashboard(app, actions=True, ping_timeout=0.2)
    renewed = keys_for("redlock", task_name("job", 1)).lock
    stale = keys_for("redlock", task_name("job", 2)).lock
    _, body = board.locks_page({}, {})
    cells = {k: body.split(f'<tr data-key="{k}">')[1].split("</tr>")[0] for k in (renewed, stale)}
    assert '<td class="alive">alive</td>' in cells[renewed]
    assert '<td class="dead">dead</td>' in cells[stale]
    shown = rows(board.inventory)
    refused = board.act("release", {"key": renewed, "fingerprint": shown[renewed].fingerprint}, "t")
    assert refused.status == 409 and "within two thirds of redlock_lease" in refused.message
    done = board.act("release-dead", {"prefix": "job:"}, "t")
    assert done.message == "released 1 lock(s) of dead workers; kept 1"
    assert r.exists(renewed) and not r.exists(stale)


class MeanwhileDashboard(Dashboard):
    """A dashboard that runs ``meanwhile()`` during an action's ping, between its read and its
    release: a live holder in warm shutdown renewing its lock, or a lock expiring."""

    def __init__(self, app: object, meanwhile: Callable[[], object]) -> None:
        super().__init__(app, actions=True, ping_timeout=0.2)
        self.meanwhile = meanwhile

    def verdicts(self, locks: Iterable[HeldLock], fresh: bool = False) -> dict[str, Verdict]:
        judged = super().verdicts(locks, fresh)
        if fresh:
            self.meanwhile()
        return judged


def test_a_renewal_during_the_action_keeps_the_lock_unless_forced(
    redis_url: str, r: redis_py.Redis
) -> None:
    """Unforced, the release is the CLI's: it deletes nothing renewed since it was read.
    Forced, it deletes the value read whatever its TTL, as ``release --force`` does."""
    fill(r, ["job:1"], ttl_ms=9_000)  # a dead worker's lock, under a third of its lease left
    key = keys_for("redlock", "job:1").lock
    app = layout_app("inv", redis_url.rsplit("/", 1)[0], set_as_current=False)
    board = MeanwhileDashboard(app, lambda: r.pexpire(key, 30_000))  # renewed to a full lease
    shown = rows(board.inventory)[key].fingerprint
    kept = board.act("release", {"key": key, "fingerprint": shown}, "t")
    assert kept.status == 409 and "was renewed by its holder" in kept.message
    assert r.exists(key)
    r.pexpire(key, 9_000)
    forced = board.act("release", {"key": key, "fingerprint": shown, "force": "1"}, "t")
    assert forced.status == 200 and not r.exists(key)


def test_release_dead_says_apart_a_lock_that_expired_meanwhile(
    redis_url: str, r: redis_py.Redis
) -> None:
    """Probe, round 23: a dead worker's lock that expired between the listing and its release
    was counted as "kept", so the summary named locks that no longer existed."""
    fill(r, ["job:1", "job:2"], ttl_ms=9_000)
    app = layout_app("inv", redis_url.rsplit("/", 1)[0], set_as_current=False)
    board = MeanwhileDashboard(app, lambda: r.delete(keys_for("redlock", "job:2").lock))
    done = board.act("release-dead", {"prefix": "job:"}, "t")
    assert done.message == (
        "released 1 lock(s) of dead workers; kept 0; 1 expired or changed owner meanwhile"
    )
    app.close()


def warm_release_script(url: str) -> None:
    """Release a lock once, so that the server knows the release script: a release sent to a
    server that does not (``NOSCRIPT``) is answered by loading it, which a hung server does
    not do, so it would never run."""
    warm, inventory = Lock(url, "warm", ttl=60), Inventory(url, "redlock")
    assert warm.acquire(blocking=False)
    seen = inventory.read(warm.key)
    assert seen is not None and inventory.release(seen)


class HangingDashboard(Dashboard):
    """A dashboard whose lock Redis hangs (``SIGSTOP``) after the action's read and ping:
    the release is sent, and answered only once the server resumes."""

    def __init__(self, app: object, server: RedisServer) -> None:
        super().__init__(app, actions=True, ping_timeout=0.2)
        self.server = server

    def verdicts(self, locks: Iterable[HeldLock], fresh: bool = False) -> dict[str, Verdict]:
        judged = super().verdicts(locks, fresh)
        if fresh:
            os.kill(self.server.process.pid, signal.SIGSTOP)
        return judged


@pytest.mark.parametrize("action", ["release", "release-dead"])
def test_a_release_that_got_no_answer_is_unknown_not_failed(
    action: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The release was reported "failed" (page, log, signal) while the script, sent before
    the server hung, ran when it resumed and deleted the key."""
    with RedisServer() as server:
        r = server.client()
        fill(r, ["job:1"], ttl_ms=60_000)  # a dead worker's lock, held for 60 s more
        key = keys_for("redlock", "job:1").lock
        base = f"redis://127.0.0.1:{server.port}"
        app = layout_app("inv", base, set_as_current=False, redlock_lease=600)
        app.conf.redlock_url = f"{base}/0?socket_timeout=0.5"
        board = HangingDashboard(app, server)
        warm_release_script(server.url)
        form = {"key": key, "fingerprint": rows(board.inventory)[key].fingerprint, "prefix": ""}
        try:
            with caplog.at_level(logging.INFO, logger="celery_redlock.web"):
                done = board.act(action, form, "t")
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        assert done.status == 503 and done.message.startswith("unknown: "), done.message
        assert f"no answer to the release of {key}, which may have happened or not" in (
            done.message
        )
        if action == "release-dead":
            assert "released 0 lock(s) of dead workers; kept 0; then no answer" in done.message
        assert f"dashboard: {action} of {key} unknown: " in caplog.text
        assert "failed" not in caplog.text
        wait_until(lambda: not r.exists(key), 5, "the release sent before the hang to run")
        app.close()


def test_a_quorum_lock_missing_from_the_first_node_is_listed() -> None:
    with RedisServer() as a, RedisServer() as b, RedisServer() as c:
        app = layout_app("q", a.url.rsplit("/", 1)[0], set_as_current=False)
        app.conf.redlock_url = [a.url, b.url, c.url]
        locks = [Lock([a.url, b.url, c.url], f"q-{i}", ttl=60) for i in range(3)]
        for lock in locks:
            assert lock.acquire(blocking=False)
        a.client().delete(locks[0].key)  # held by b and c: a majority
        b.client().set(keys_for("redlock", "q-1").queued, "t-1", px=60_000)
        keys, _ = walk(inventory_of(app))
        assert sorted(keys) == sorted(
            [*(lk.key for lk in locks), keys_for("redlock", "q-1").queued]
        )
        for lock in locks:
            lock.release()


def test_many_page_views_at_once_ping_one_at_a_time(redis_url: str, r: redis_py.Redis) -> None:
    """A holder whose worker never answers: no answer is reused, and 60 views at once each
    pinged, each holding one connection of Celery's broker pool (10) while waiting for
    another; every ping, and every later page, waited forever. The views now wait for the
    ping under way and use its answer."""
    fill(r, ["job:ghost"])
    app = layout_app("inv", redis_url.rsplit("/", 1)[0], set_as_current=False)
    board = Dashboard(app, ping_timeout=0.5)
    locks = [
        lock
        for lock in board.inventory.view("0").locks
        if lock.key == keys_for("redlock", "job:ghost").lock
    ]
    done: list[str] = []

    def view() -> None:
        done.append(next(iter(board.verdicts(locks))))

    threads = [threading.Thread(target=view, daemon=True) for _ in range(60)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)  # a deadlock never ends: the count below says how many did
    assert len(done) == 60
    assert board.verdicts(locks)[locks[0].key].state == "dead"  # the ghost's worker is gone
    app.close()


def test_a_quorum_node_that_does_not_answer_is_named_on_the_page() -> None:
    """As ``ls`` names it on stderr: the page shows what the majority holds, and says which
    node it could not ask."""
    with RedisServer() as a, RedisServer() as b, RedisServer() as c:
        app = layout_app("q", a.url.rsplit("/", 1)[0], set_as_current=False)
        app.conf.redlock_url = [a.url, b.url, c.url]
        lock = Lock([a.url, b.url, c.url], "q-down", ttl=60)
        assert lock.acquire(blocking=False)
        c.stop()
        status, body = Dashboard(app, ping_timeout=0.2).locks_page({}, {"csrf_token": "x"})
        app.close()
    assert status == 200 and lock.key in body
    assert f"Quorum node redis://127.0.0.1:{c.port}/0 did not answer" in body


def test_a_long_key_links_a_timeline_that_opens(redis_url: str, r: redis_py.Redis) -> None:
    """A lock name can be as long as a task's name: the row's timeline link used to answer 400
    ("at most 200") for a key over 200 characters."""
    name = "proj.tasks." + "very_long_module." * 30 + "sync"
    fill(r, [name])
    key = keys_for("redlock", name).lock
    app = layout_app("inv", redis_url.rsplit("/", 1)[0], set_as_current=False)
    board = Dashboard(app, ping_timeout=0.2)
    status, body = board.locks_page({"prefix": "proj.tasks."}, {"csrf_token": "x"})
    assert status == 200 and len(key) > 500
    assert f"/timeline?key={urllib.parse.quote(key, safe='/')}" in body
    assert board.timeline_page({"key": key}, {"csrf_token": "x"})[0] == 200
    app.close()


def test_a_task_with_a_lock_name_is_found_by_its_task_name(
    redis_url: str, r: redis_py.Redis
) -> None:
    """A task that sets ``lock_name`` holds ``<lock_name>:<digest>``: the task filter looked
    for ``<task name>:`` and said "No lock held" while it held one (and its "release the locks
    of dead workers" matched nothing), and its timeline left out the dashboard's release
    mark, written under the lock name, so the dead holder's bar stayed open."""
    app = layout_app("inv", redis_url.rsplit("/", 1)[0], set_as_current=False, redlock_timeline=100)

    @app.task(base=LockedTask, name="proj.named", lock_name="ln", lock_by=["x"], shared=False)
    def named(x: int) -> int:
        return x

    key = lock_key(named, 1)
    timeline.record_for(app, "proj.named", "id-dead", "acquired", {"key": key})
    r.set(key, new_token("id-dead", "w9@gone", 7), px=9_000)  # its worker died
    board = Dashboard(app, actions=True, ping_timeout=0.2)
    status, body = board.locks_page({"task": "proj.named"}, {"csrf_token": "x"})
    assert status == 200 and f'name="key" value="{key}"' in body
    released = board.act("release-dead", {"prefix": "ln:"}, "t")
    assert released.message == "released 1 lock(s) of dead workers; kept 0" and not r.exists(key)
    svg = str(board.timeline_svg("proj.named", "", 10))
    assert svg.count('data-event="released"') == 1 and 'data-id="id-dead"' in svg
    assert "held by task id-dead" in svg  # the bar, ended by the mark
    app.close()


def test_a_task_whose_lock_name_no_filter_can_select_is_not_suggested(redis_url: str) -> None:
    """A ``lock_name`` of 250 characters: the task was suggested, and choosing it answered
    "the filter is 251 characters; at most 200" for a filter of 11 the user typed."""
    app = layout_app("inv", redis_url.rsplit("/", 1)[0], set_as_current=False)

    @app.task(base=LockedTask, name="proj.report", lock_name="r" * 250, shared=False)
    def report() -> None: ...

    board = Dashboard(app, ping_timeout=0.2)
    status, body = board.locks_page({}, {"csrf_token": "x"})
    assert status == 200 and '<option value="proj.report">' not in body
    status, body = board.locks_page({"task": "proj.report"}, {"csrf_token": "x"})
    assert status == 400 and "locks of the task &#39;proj.report&#39;, under the name" in body
    assert "the filter is 251 characters; at most 200; filter by a name prefix of it" in body
    # The reason given is the filter's own: a brace, a control character, the length.
    status, body = board.locks_page({"task": "a{b"}, {"csrf_token": "x"})
    assert status == 400 and "no &#39;{&#39; or &#39;}&#39;" in body and "characters" not in body
    status, body = board.locks_page({"task": "p" * 200}, {"csrf_token": "x"})
    assert status == 400 and "the filter is 201 characters; at most 200" in body
    status, body = board.timeline_page({"task": "proj.report", "minutes": "\u00b2"}, {})
    assert status == 400 and "minutes must be one of 5, 10, 30, 60" in body
    app.close()


def test_a_semaphores_slots_show_their_shared_counter_as_a_bound(redis_url: str) -> None:
    """The slots of a semaphore share one fencing counter: slot 1 showed the token slot 2
    took later, as if it were its own. Each slot shows it as the bound it is, one kept by a
    cooldown too."""
    first = Lock(redis_url, "sema", ttl=30, limit=2)
    second = Lock(redis_url, "sema", ttl=30, limit=2)
    assert first.acquire(blocking=False) and second.acquire(blocking=False)
    latest = second.fencing_token
    assert first.fencing_token is not None and latest is not None
    assert first.fencing_token < latest
    first.release(keep=30)
    app = layout_app("inv", redis_url.rsplit("/", 1)[0], set_as_current=False)
    try:
        status, body = Dashboard(app, ping_timeout=0.2).locks_page({}, {"csrf_token": "x"})
    finally:
        second.release()
        app.close()
    assert status == 200 and body.count(f"<td>≤ {latest}</td>") == 2, body
    assert "<small>semaphore slot 1; its task ended</small>" in body


def test_invisible_and_bidi_characters_are_shown_escaped(redis_url: str, r: redis_py.Redis) -> None:
    """A name holding U+202E (right-to-left override) rendered reversed: the key read
    ``...exe.txt{...``, the task name hid its true end. The page shows what the command line
    shows (``\\u202e``); the hidden fields an action posts keep the exact key."""
    name = "papp.report\u202etxt.exe\u200b"
    fill(r, [name])
    r.hset(f"redlock:stats:{name}", mapping={"acquired": 1})
    key = keys_for("redlock", name).lock
    app = layout_app("inv", redis_url.rsplit("/", 1)[0], set_as_current=False)
    board = Dashboard(app, actions=True, ping_timeout=0.2)
    status, body = board.locks_page({}, {"csrf_token": "x"})
    assert status == 200 and "papp.report\\u202etxt.exe\\u200b" in body
    shown = body.replace(f'name="key" value="{key}"', "").replace(f'data-key="{key}"', "")
    assert "\u202e" not in shown and "\u200b" not in shown
    assert f'name="key" value="{key}"' in body  # what the action posts: the key itself
    status, stats = board.stats_page({}, "")
    assert status == 200 and "\u202e" not in stats and "papp.report\\u202e" in stats
    # A task so named: the filter's suggestions carried it raw, and choosing it gave "the
    # filter must be printable". A name no filter accepts is not suggested; the filter box
    # shows it escaped.

    def report() -> None: ...

    app.task(name=name, shared=False)(report)
    for page in (board.locks_page, board.timeline_page):
        status, body = page({}, {"csrf_token": "x"})
        assert status == 200 and '<option value="papp.report' not in body, body
        body = page({"task": name}, {"csrf_token": "x"})[1]
        assert 'list="tasks" value="papp.report\\u202etxt.exe\\u200b"' in body
    app.close()


def test_a_key_a_browser_cannot_post_offers_the_command_line(
    redis_url: str, r: redis_py.Redis
) -> None:
    """A browser posts a line break in a form field as CR LF, and a NUL as U+FFFD: the Release
    button of such a key posted another key, and the page said "not held" while the lock
    stayed. Its row names the command line instead, as a row of a key too long to post does."""
    names = ["job\nlf", "job\rcr", "job\x00nul", "job\r\ncrlf", "job plain"]
    fill(r, names)
    app = layout_app("inv", redis_url.rsplit("/", 1)[0], set_as_current=False)
    board = Dashboard(app, actions=True, ping_timeout=0.2)
    status, body = board.locks_page({}, {"csrf_token": "x"})
    app.close()
    assert status == 200
    found = dict(re.findall(r'<tr data-key="([^"]*)">(.*?)</tr>', body, re.S))
    assert len(found) == len(names), body
    for name in names:
        row = found[html.escape(keys_for("redlock", name).lock)]
        if name == "job plain":
            assert "<form" in row
            continue
        assert "<form" not in row, name
        said = "a browser cannot post a key with a line break or NUL: <code>celery redlock release"
        assert said in row, row


def test_a_broker_that_does_not_answer_leaves_the_locks_shown(r: redis_py.Redis) -> None:
    """The ping needs the broker, the rows do not: the page shows the locks, says that
    liveness is judged by renewal alone, and is no error (it used to be a 503 worded as a
    release). A lease set 21 s ago is unknown; one just set is alive. The failed ping is
    shared as an answer is: three views make one ping, on one connection (no kombu retries:
    each view waited 6 s behind the one before it)."""
    fill(r, ["job:1"], ttl_ms=9_000)  # set 21 s ago, as a 30 s lease
    fill(r, [task_name("job", 2)], ttl_ms=30_000)  # a renewing task's, just set
    url = r.connection_pool.connection_kwargs
    lock_url = f"redis://127.0.0.1:{url['port']}/{url.get('db', 0)}"
    broker = DownBroker()
    app = brokerless_app(lock_url, broker.url)
    renewing(app)
    board = Dashboard(app, ping_timeout=0.2)
    try:
        views = [board.locks_page({}, {"csrf_token": "x"}) for _ in range(3)]
    finally:
        app.close()
        broker.close()
    for status, body in views:
        assert status == 200 and keys_for("redlock", "job:1").lock in body
        assert "cannot ping workers through the broker" in body
        assert "liveness is judged by renewal alone" in body
        assert "nothing was released" not in body
    body = views[0][1]
    assert body.count('<td class="unknown">unknown</td>') == 1, body
    assert body.count('<td class="alive">alive</td>') == 1
    assert broker.connections == 1


class SilentBroker(DownBroker):
    """A broker's port that accepts connections and never answers (a frozen server)."""

    def _answer(self, connection: socket.socket) -> None:
        while connection.recv(4096):  # until the client gives up and closes
            pass


def test_a_failed_ping_is_reused_from_when_it_failed(
    r: redis_py.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Helper probe, round 3: with the broker frozen a ping fails at its socket timeout (5 s
    by default), and the failure was dated from when the ping began: already older than the
    5 s for which it is reused, so every view pinged again and took 5 s. Here the ping takes
    over 1 s and failures are reused for 0.5 s."""
    monkeypatch.setattr(_core, "LIVENESS_TTL", 0.5)
    fill(r, ["job:1"], ttl_ms=9_000)  # set 21 s ago, as a 30 s lease: it needs a ping
    url = r.connection_pool.connection_kwargs
    broker = SilentBroker()
    app = brokerless_app(f"redis://127.0.0.1:{url['port']}/{url.get('db', 0)}", broker.url)
    app.conf.broker_connection_timeout = 1.0
    board = Dashboard(app, ping_timeout=0.2)
    try:
        began = time.monotonic()
        first = board.locks_page({}, {"csrf_token": "x"})
        assert time.monotonic() - began > _core.LIVENESS_TTL  # the ping outlasted it
        pinged = broker.connections
        second = board.locks_page({}, {"csrf_token": "x"})
    finally:
        app.close()
        broker.close()
    for status, body in (first, second):
        assert status == 200 and "cannot ping workers through the broker" in body
    assert pinged >= 1 and broker.connections == pinged  # the second view did not ping


def test_a_forced_release_needs_no_broker(r: redis_py.Redis) -> None:
    """With the broker down no worker can be pinged, and a forced release is the way out, as
    the operations guide says: it used to fail too ("cannot ping workers"), and the key
    stayed. A release without force still refuses, and says why."""
    fill(r, ["job:1"], ttl_ms=9_000)  # set 21 s ago, as a 30 s lease: liveness unknown
    lock = keys_for("redlock", "job:1").lock
    url = r.connection_pool.connection_kwargs
    broker = DownBroker()
    app = brokerless_app(f"redis://127.0.0.1:{url['port']}/{url.get('db', 0)}", broker.url)
    board = Dashboard(app, actions=True, ping_timeout=0.2)
    try:
        shown = rows(board.inventory)[lock].fingerprint
        refused = board.act("release", {"key": lock, "fingerprint": shown}, "t")
        forced = board.act("release", {"key": lock, "fingerprint": shown, "force": "1"}, "t")
    finally:
        app.close()
        broker.close()
    assert refused.status == 503 and "cannot ping workers" in refused.message
    assert forced.status == 200 and forced.message == f"released {lock} (holder unknown)"
    assert not r.exists(lock)


@pytest.mark.parametrize(
    ("action", "denied", "grant"),
    [
        ("release", "-del", "the commands of the guide's ACL line"),
        ("clear-marker", "-del", "(the clear_marker script runs DUMP, DEL)"),
    ],
)
def test_an_action_the_acl_refuses_names_what_to_grant(
    redis_server: RedisServer, r: redis_py.Redis, action: str, denied: str, grant: str
) -> None:
    """Inside a script Redis does not name the refused command: the page says what to grant,
    with 403 (an answer), where it said 503 and the script's raw refusal."""
    user = f"web{denied[1:]}"
    r.execute_command("ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all", denied)
    fill(r, ["job:acl"])
    key = keys_for("redlock", "job:acl")
    r.set(key.queued, "q-1", px=60_000)
    app = layout_app(
        "inv",
        f"redis://127.0.0.1:{redis_server.port}",
        set_as_current=False,
        redlock_url=f"redis://{user}:pw@127.0.0.1:{redis_server.port}/0",
    )
    board = Dashboard(app, actions=True, ping_timeout=0.2)
    target = key.lock if action == "release" else key.queued
    shown = rows(board.inventory)[target]
    done = board.act(action, {"key": target, "fingerprint": shown.fingerprint, "force": "1"}, "t")
    app.close()
    assert done.status == 403 and "refused by the lock Redis: its ACL user may not" in done.message
    assert grant in done.message and r.exists(target)
