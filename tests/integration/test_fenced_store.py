"""The fault runs' fenced PostgreSQL store (chaos.fenced_store) on the real local PostgreSQL."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator

import pytest
import redis as redis_py

from celery_redlock import Lock
from chaos.fenced_store import FencedStore
from chaos.history import check


@pytest.fixture
def store() -> Iterator[FencedStore]:
    s = FencedStore(f"t{secrets.token_hex(6)}")
    s.create()
    yield s
    s.drop()


def test_a_stale_holder_s_write_is_refused_after_a_newer_holder_wrote(
    store: FencedStore, r: redis_py.Redis
) -> None:
    old = Lock(r, "account", ttl=10)
    assert old.acquire(blocking=False)
    stale = old.fencing_token
    assert stale is not None
    r.delete(old.key)  # its lease ran out while it was paused, say
    new = Lock(r, "account", ttl=10)
    assert new.acquire(blocking=False) and new.fencing_token is not None
    assert store.write("account", new.fencing_token, "new")
    assert not store.write("account", stale, "old")  # arrives last, refused
    assert store.write("account", new.fencing_token, "new")  # the holder writes again
    new.release()
    writes = store.writes()
    expected = [(new.fencing_token, True), (stale, False), (new.fencing_token, True)]
    assert [(w.token, w.accepted) for w in writes] == expected


def test_racing_writers_never_get_a_lower_token_accepted_after_a_higher_one(
    store: FencedStore,
) -> None:
    def writer(n: int, tokens: list[int]) -> None:
        mine = FencedStore(run, store.dsn)  # a connection of its own, as a worker has
        try:
            for token in tokens:
                mine.write("k", token, f"w{n}")
        finally:
            mine.close()

    run = store.log.removeprefix("faults_").removesuffix("_log")
    threads = [
        threading.Thread(target=writer, args=(n, list(range(200 - n, 0, -4)))) for n in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writes = store.writes()
    assert len(writes) == 200
    verdict = check([], writes)
    assert verdict.ok and not verdict.stale_accepted
    assert max(w.token for w in writes if w.accepted) == 200
    assert verdict.rejected > 0
