"""``lock_rate``: the rate script's contract on a real Redis, and the quorum rule.

The script decides on the Redis server's clock, so these tests read its replies and the keys it
writes, never a local clock. The end-to-end behaviour (real workers, both APIs, every call
eventually runs) is in ``tests/e2e/test_rate.py``.
"""

from __future__ import annotations

import pytest
import redis as redis_py
from celery import Celery

from celery_redlock import LockConfigError, LockedTask, single_instance
from celery_redlock._celery.options import RATE_PERIODS, Rate
from celery_redlock._celery.wiring import check_app
from celery_redlock._redis import companions
from celery_redlock._redis import keys as _keys
from celery_redlock._redis import scripts as _scripts
from celery_redlock.exceptions import LockContended, RateLimited
from celery_redlock.testing import RedisServer
from support.apps import make_app
from support.polling import max_in_window
from support.servers import dead_port


def admit(url: str, keys: _keys.LockKeys, count: int, period: float) -> _scripts.RateDecision:
    return companions.admit_rate(url, keys, count, period)


def test_n_starts_are_admitted_then_calls_are_promised_spread_out_slots(
    redis_url: str, r: redis_py.Redis
) -> None:
    keys = _keys.keys_for("redlock", "report:a")
    period_us = 10_000_000
    starts = [admit(redis_url, keys, 3, 10.0) for _ in range(3)]
    assert all(s.admitted for s in starts)
    first = starts[0].start_us
    assert first is not None
    assert [s.start_us for s in starts] == sorted(s.start_us for s in starts)  # type: ignore[type-var]

    refused = [admit(redis_url, keys, 3, 10.0) for _ in range(3)]
    assert not any(d.admitted for d in refused)
    assert 0 < refused[0].wait <= 10.0
    # The first refused call is promised the moment the oldest start leaves the window; each
    # later one a period / count further: a crowd of refused calls comes back spread out.
    assert int(r.get(keys.rate_next)) == first + period_us + 3 * (period_us // 3)
    assert refused[1].wait > refused[0].wait and refused[2].wait > refused[1].wait
    assert r.llen(keys.rate) == 3  # the log keeps the count newest starts, no more
    assert 0 < r.pttl(keys.rate) <= 10_000
    assert 0 < r.pttl(keys.rate_next) <= 10_000 + 3 * 3334


def test_no_window_of_the_period_ever_holds_more_than_count_starts(
    redis_url: str, r: redis_py.Redis
) -> None:
    """Thousands of back-to-back calls for a 0.05 s period: every sliding window is checked
    on the server times the script admitted."""
    keys = _keys.keys_for("redlock", "burst")
    admitted = []
    for _ in range(3000):
        decision = admit(redis_url, keys, 4, 0.05)
        if decision.admitted:
            assert decision.start_us is not None
            admitted.append(decision.start_us)
        else:
            assert decision.wait > 0
    assert len(admitted) > 4  # the window slid: later calls were admitted again
    assert max_in_window(admitted, 50_000) <= 4


def test_rate_keys_share_the_lock_hash_tag() -> None:
    keys = _keys.keys_for("app", "report:2024")
    for key in (keys.rate, keys.rate_next):
        assert key.startswith("app:{report:2024}:")
        assert not _keys.is_slot(key)  # `celery redlock ls` does not list them as locks


def test_rate_limited_is_a_contention_and_survives_the_result_backend() -> None:
    exc = RateLimited("over", key="k", retry_after=0.25)
    assert isinstance(exc, LockContended)
    assert (exc.key, exc.retry_after) == ("k", 0.25)
    assert RateLimited("over").retry_after is None
    assert str(Rate(10, RATE_PERIODS["m"])) == "10/m"


def quorum_app() -> Celery:
    app = Celery("q", set_as_current=False)
    app.conf.redlock_url = [f"redis://127.0.0.1:{dead_port()}/0" for _ in range(3)]
    return app


def test_lock_rate_over_a_quorum_is_refused_when_the_app_finalizes() -> None:
    app = quorum_app()

    @app.task(base=LockedTask, lock_rate="10/m")
    def rated() -> None: ...

    with pytest.raises(LockConfigError, match=r"option lock_rate='10/m' is invalid with a Redlock"):
        app.finalize()


def test_rate_over_a_quorum_stops_a_worker_of_single_instance() -> None:
    app = quorum_app()

    @app.task
    @single_instance(rate="5/s")
    def rated() -> None: ...

    app.finalize()  # @single_instance cannot check before the worker starts
    with pytest.raises(LockConfigError, match=r"keyword rate='5/s' is invalid with a Redlock"):
        check_app(app)


def test_a_bad_rate_is_refused_at_decoration() -> None:
    with pytest.raises(LockConfigError, match=r"rate='10/min' is invalid; expected a rate"):

        @single_instance(rate="10/min")
        def rated() -> None: ...


def test_promises_of_calls_that_never_came_back_are_capped(
    redis_url: str, r: redis_py.Redis
) -> None:
    """Issue 22 item 6. Thirty refused calls that never come back (revoked) leave their
    promised slots behind; a fresh call is promised at most one period past the moment the
    window frees, not thirty slots out."""
    keys = _keys.keys_for("redlock", "report:stale")
    assert admit(redis_url, keys, 1, 2.0).admitted
    stale = [admit(redis_url, keys, 1, 2.0) for _ in range(30)]
    assert not any(d.admitted for d in stale)
    fresh = admit(redis_url, keys, 1, 2.0)
    assert not fresh.admitted
    print(f"1/2s, 30 stale promises: a fresh call waits {fresh.wait:.3f}s")
    assert fresh.wait <= 2.0 + 2.0  # the window frees within 2 s, plus one period at most
    assert max(d.wait for d in stale) <= 4.0


def test_an_eager_call_over_its_rate_fails_without_a_promise(
    redis_server: RedisServer, redis_url: str, r: redis_py.Redis
) -> None:
    """Issue 22 item 6. An eager retry runs at once, ignoring its countdown: with
    ``max_retries=None`` it recursed until ``RecursionError`` and promised a slot each time.
    Over its rate, an eager call fails with :class:`RateLimited` and promises nothing."""
    app = make_app(redis_server, "eager-rate")

    @app.task(base=LockedTask, lock_rate="1/m", max_retries=None, shared=False)
    def report() -> str:
        return "ran"

    assert report.apply().get() == "ran"
    second = report.apply()
    assert second.state == "FAILURE"
    assert isinstance(second.result, RateLimited)
    assert 0 < second.result.retry_after <= 60.0
    assert not [k for k in r.keys("redlock:*") if k.endswith(b":rate:next")]
    app.close()
