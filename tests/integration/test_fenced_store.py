"""The fault runs' fenced PostgreSQL store (chaos.fenced_store) on the real local PostgreSQL."""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Iterator

import pytest
import redis as redis_py

from celery_redlock import Lock
from chaos.fenced_store import FencedStore
from chaos.history import check


@pytest.fixture
def store(postgres: str) -> Iterator[FencedStore]:
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
    assert new.acquire(blocking=False)
    token = new.fencing_token  # read while held: it is None once released
    assert token is not None
    assert store.write("account", token, "new")
    assert not store.write("account", stale, "old")  # arrives last, refused
    assert store.write("account", token, "new")  # the holder writes again
    new.release()
    writes = store.writes()
    expected = [(token, True, "new"), (stale, False, "old"), (token, True, "new")]
    assert [(w.token, w.accepted, w.writer) for w in writes] == expected


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
    verdict = check([], writes)  # the store's log alone: no history of holders
    assert not verdict.stale_accepted and not verdict.wrong_rejections
    assert max(w.token for w in writes if w.accepted) == 200
    assert verdict.rejected > 0


def test_a_forked_child_writes_on_a_connection_of_its_own(store: FencedStore) -> None:
    """A prefork pool child inherits the store with its parent's connection: it makes its own,
    and closing it leaves the parent's open."""
    assert store.write("k", 10, "parent")  # the parent's connection is made
    parent = store.connection().info.backend_pid
    pid = os.fork()
    if pid == 0:  # the child: no assertion may raise here, only the exit code says
        code = 3
        try:
            if store.connection().info.backend_pid == parent:
                code = 2  # the parent's session
            elif store.write("k", 11, "child"):
                code = 0
            store.close()
        except BaseException:
            code = 4
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert store.connection().info.backend_pid == parent  # still open, still its own
    assert store.write("k", 12, "parent")
    store.close()
    writes = [(w.token, w.accepted, w.writer) for w in store.writes()]
    assert writes == [(10, True, "parent"), (11, True, "child"), (12, True, "parent")]


def test_a_read_and_threads_sharing_one_store_leave_every_write_committed(
    store: FencedStore,
) -> None:
    """Helper probe, round 3: a read through ``connection()`` left a transaction open, so every
    later write was a savepoint inside it (``True``, never committed) holding the row lock;
    threads sharing one store nested their transactions out of order."""
    assert store.connection().execute(f"SELECT count(*) FROM {store.state}").fetchone() == (0,)
    assert store.write("k", 1, "reader")
    assert [(w.token, w.writer) for w in store.writes()] == [(1, "reader")]  # committed

    def writer(n: int) -> None:
        for token in range(2 + n, 202, 4):
            store.write("k", token, f"w{n}")

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store.close()
    writes = store.writes()
    assert len(writes) == 201
    verdict = check([], writes)
    assert not verdict.stale_accepted and not verdict.wrong_rejections


@pytest.mark.parametrize("token", [10.6, "10", True, None])
def test_a_token_that_is_no_int_is_refused_before_the_store_sees_it(
    store: FencedStore, token: object
) -> None:
    """Helper probe, round 4: PostgreSQL rounded ``10.6`` to 11 for the ``bigint`` column, so
    an older holder's write passed the guard of the holder with 11; ``"10"`` was cast."""
    assert store.write("k", 11, "new")
    with pytest.raises(TypeError, match=r"a fencing token is an int, got .* \("):
        store.write("k", token, "old")  # type: ignore[arg-type]
    assert [(w.token, w.writer) for w in store.writes()] == [(11, "new")]


def test_each_logged_write_carries_the_time_the_store_applied_it(store: FencedStore) -> None:
    """The checker counts a stale write the store accepted after a newer holder's admission
    (``stale_writes_before_newer``) by this time: this machine's clock, as the events'."""
    began = time.time()
    store.write("k", 10, "a")
    store.write("k", 9, "b")
    ended = time.time()
    times = [w.at for w in store.writes() if w.at is not None]
    assert len(times) == 2 and all(began - 0.05 <= t <= ended + 0.05 for t in times), times
    assert times == sorted(times)
