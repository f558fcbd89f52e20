"""The timeline ring in a real worker: off by default, bounded when on, and drawn."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest
import redis as redis_py
from celery import Celery

from celery_redlock import LockConfigError, LockedTask, lock_key
from celery_redlock._redis import timeline as ring
from celery_redlock._redis.keys import timeline_key
from celery_redlock._redis.owner import new_token
from celery_redlock.testing import RedisServer
from celery_redlock.web._core import Dashboard
from support.apps import make_app
from support.workers import running_worker


def _task(app: Celery) -> Any:
    @app.task(base=LockedTask, name="ring.job", lock_by=["n"])
    def job(n: int) -> int:
        return n

    return job


def test_no_ring_unless_asked(app: Celery, r: redis_py.Redis) -> None:
    job = _task(app)
    with running_worker(app):
        assert job.delay(1).get(timeout=10) == 1
    assert not r.exists(timeline_key("redlock"))


def test_the_ring_keeps_at_most_its_size(
    redis_server: RedisServer, redis_url: str, r: redis_py.Redis
) -> None:
    app = make_app(redis_server, redlock_timeline=5)
    job = _task(app)
    with running_worker(app):
        for n in range(8):  # 16 events: acquired and released each
            assert job.delay(n).get(timeout=10) == n
    entries = [json.loads(e) for e in r.lrange(timeline_key("redlock"), 0, -1)]
    assert len(entries) == 5
    assert {e["event"] for e in entries} <= {"acquired", "released"}
    assert all(
        e["task"] == "ring.job" and e["key"].startswith("redlock:{ring.job:") for e in entries
    )
    assert 0 < r.pttl(timeline_key("redlock")) <= 3600 * 1000
    status, body = Dashboard(app).timeline_page({"task": "ring.job", "minutes": "5"}, {})
    assert status == 200 and 'class="mark"' in body and 'data-event="released"' in body


@pytest.mark.parametrize("size", [1, 2])
def test_a_push_keeps_the_newest_entries_up_to_the_size(
    redis_url: str, r: redis_py.Redis, size: int
) -> None:
    """The push cuts before it pushes (``LTRIM 0 size-2``, and for a ring of one ``LTRIM 1 0``,
    which empties it: ``LTRIM 0 -1`` would keep everything)."""
    for t in range(4):
        ring.push(redis_url, "redlock", {"t": t}, size)
    kept = [json.loads(e)["t"] for e in r.lrange(timeline_key("redlock"), 0, -1)]
    assert kept == [3, 2][:size]


def test_a_bad_size_is_a_config_error_and_the_page_says_it(redis_server: RedisServer) -> None:
    """As every setting: the worker refuses it at start (``tests/e2e/test_first_hour.py``), a
    task fails with it, and the dashboard's timeline page shows it."""
    app = make_app(redis_server, redlock_timeline="many")
    job = _task(app)
    with pytest.raises(LockConfigError, match="redlock_timeline='many' is invalid"):
        job.apply((1,)).get()
    status, body = Dashboard(app).timeline_page({"task": "ring.job"}, {})
    assert status == 400 and "redlock_timeline=&#39;many&#39; is invalid" in body


def test_a_dashboard_release_ends_the_holders_bar(
    redis_server: RedisServer, r: redis_py.Redis
) -> None:
    """A dead worker never reports ``released``: its bar ran to "now" ("held by task ...")
    after the dashboard released its lock. The dashboard's release is on the timeline."""
    app = make_app(redis_server, redlock_timeline=50)
    job = _task(app)
    key = lock_key(job, 7)
    token = new_token("dead-call", "w9@gone", 7)
    r.set(key, token, px=9_000)  # a 30 s lease not renewed for 21 s
    acquired = {"t": int(time.time() * 1000) - 1000, "task": "ring.job", "id": "dead-call"}
    r.lpush(timeline_key("redlock"), json.dumps({**acquired, "event": "acquired", "key": key}))
    board = Dashboard(app, actions=True, ping_timeout=0.2)
    (lock,) = [lk for lk in board.inventory.view("0").locks if lk.key == key]
    done = board.act("release", {"key": key, "fingerprint": lock.fingerprint}, "ops")
    assert done.status == 200 and not r.exists(key)
    newest = json.loads(r.lindex(timeline_key("redlock"), 0) or "{}")
    assert (newest["event"], newest["key"], newest["id"]) == ("released", key, "dead-call")
    assert newest["task"] == "ring.job" and newest["by"] == "dashboard"
    status, body = board.timeline_page({"key": key, "minutes": "5"}, {})
    assert status == 200 and 'data-event="released"' in body
    assert "held by task dead-call" in body  # the bar, now closed by the release...
    assert body.count('class="bar"') == 1  # ...and not drawn again to the right edge


def test_holders_from_before_the_window_and_events_past_ten_thousand_entries_are_drawn(
    redis_server: RedisServer, r: redis_py.Redis
) -> None:
    """The view dropped the ring's entries older than its window before it paired them: a
    holder that took its lock 20 minutes ago drew nothing in the 5-minute view while it held
    it, and only a release mark once it released. It read the newest 10,000 entries whatever
    ``redlock_timeline`` was: a busy task pushed a quiet one off the view. Now: bars from the
    left edge, one for a lock held now that the ring has no event of, and the ring read back
    to the window's start."""
    app = make_app(redis_server, redlock_timeline=30_000)
    job = _task(app)
    now = int(time.time() * 1000)
    held, released, quiet, ringless = (lock_key(job, n) for n in (1, 2, 3, 4))

    def entry(minutes_ago: float, event: str, key: str, task_id: str, task: str) -> str:
        t = now - int(minutes_ago * 60_000)
        return json.dumps({"t": t, "event": event, "key": key, "id": task_id, "task": task})

    ring_key = timeline_key("redlock")
    r.lpush(ring_key, entry(20, "acquired", held, "long-call", "ring.job"))
    r.lpush(ring_key, entry(20, "acquired", released, "done-call", "ring.job"))
    r.lpush(ring_key, entry(3, "skipped", quiet, "quiet-call", "ring.job"))
    r.lpush(ring_key, entry(1, "released", released, "done-call", "ring.job"))
    noise = [entry(0.5, "skipped", "redlock:{ring.noise:x}", "n", "ring.noise")] * 12_000
    r.lpush(ring_key, *noise)
    r.set(held, new_token("long-call", "w1@host", 1), px=60_000)
    r.set(ringless, new_token("ringless-call", "w1@host", 1), px=60_000)
    status, body = Dashboard(app).timeline_page({"task": "ring.job", "minutes": "5"}, {})
    assert status == 200
    assert body.count('class="bar"') == 3
    for task_id in ("long-call", "done-call", "ringless-call"):
        assert f'class="bar" data-id="{task_id}"' in body
    assert 'data-event="skipped" data-id="quiet-call"' in body
    assert 'data-event="released" data-id="done-call"' in body
    status, body = Dashboard(app).timeline_page({"key": held, "minutes": "5"}, {})
    assert status == 200 and body.count('class="bar"') == 1 and 'data-id="long-call"' in body


def test_a_holder_whose_key_is_gone_is_not_drawn_to_now(
    redis_server: RedisServer, r: redis_py.Redis
) -> None:
    """A worker killed whole writes no ``released``, and its key expires by TTL, which writes
    no event either. Once the view read the ring past the window's start, such an
    ``acquired`` of 20 minutes ago was a bar "held" to now; the locks held now say it is
    not: not drawn. One inside the window ends at its lane's last event."""
    app = make_app(redis_server, redlock_timeline=100)
    job = _task(app)
    now = int(time.time() * 1000)
    gone, died = lock_key(job, 1), lock_key(job, 2)

    def entry(minutes_ago: float, event: str, key: str, task_id: str) -> str:
        t = now - int(minutes_ago * 60_000)
        return json.dumps({"t": t, "event": event, "key": key, "id": task_id, "task": "ring.job"})

    ring_key = timeline_key("redlock")
    r.lpush(ring_key, entry(20, "acquired", gone, "expired-call"))
    r.lpush(ring_key, entry(3, "acquired", died, "died-call"))
    r.lpush(ring_key, entry(2, "skipped", died, "skipped-call"))
    status, body = Dashboard(app).timeline_page({"task": "ring.job", "minutes": "5"}, {})
    assert status == 200
    assert 'data-id="expired-call"' not in body
    (bar,) = re.findall(
        r'<rect class="bar" data-id="died-call" x="([\d.]+)" y="\d+" '
        r'width="([\d.]+)"',
        body,
    )
    skipped = re.search(r'data-id="skipped-call" cx="([\d.]+)"', body)
    assert skipped is not None
    assert abs(float(bar[0]) + float(bar[1]) - float(skipped.group(1))) < 1  # ends at the skip


def test_entries_pushed_between_two_pages_are_read_once(
    redis_url: str, r: redis_py.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ring is read in pages of ``LRANGE``; each ``LPUSH`` between two pages shifts the
    list, and the next page began with entries read already: a ``released`` read twice drew a
    second bar from the window's left edge. Here 3 entries are pushed after the first page."""
    monkeypatch.setattr(ring, "PAGE", 4)
    ring_key = timeline_key("redlock")
    r.lpush(ring_key, *(json.dumps({"t": t}) for t in range(10)))  # newest first: 9..0

    class PushedBetween(redis_py.Redis):
        pages = 0

        def lrange(self, *args: Any) -> Any:
            page = super().lrange(*args)
            PushedBetween.pages += 1
            if PushedBetween.pages == 1:
                r.lpush(ring_key, *(json.dumps({"t": t}) for t in (10, 11, 12)))
            return page

    monkeypatch.setattr(ring, "client_for", lambda url: PushedBetween.from_url(url))
    read = [e["t"] for e in ring.read(redis_url, "redlock", 100)]
    assert read == list(range(10))  # each once, oldest first; the 3 pushed later not read
