"""How ``celery redlock`` judges a holder from a ping's answer and the lock's TTL (no Redis, no
worker: the decision alone; the real cases run in tests/e2e/cli)."""

from __future__ import annotations

import time

import pytest
from celery import Celery

from celery_redlock._redis import owner as _owner
from celery_redlock._redis.inventory import HeldLock
from celery_redlock.cli._liveness import ALIVE, DEAD, UNKNOWN, checked_wait, verdict
from celery_redlock.web._core import Dashboard

LEASE = 30.0


def held(ttl: float | None, host: str = "w1@web-1") -> HeldLock:
    value = _owner.new_token("t-1", host=host, pid=7)
    return HeldLock("redlock:{job}", "job", 1, value, _owner.parse(value), ttl, None)


@pytest.mark.parametrize(
    ("ttl", "ping", "state", "renewed", "says"),
    [
        (29.0, ALIVE, ALIVE, False, "answers a control ping"),
        (29.0, DEAD, ALIVE, True, "renewed 1.0s ago, within two thirds of redlock_lease"),
        (20.5, DEAD, ALIVE, True, "warm shutdown"),
        # A renewal due at 10 s that runs late (a body holding the GIL): still alive.
        (19.5, DEAD, ALIVE, True, "renewed 10.5s ago"),
        (10.5, DEAD, ALIVE, True, "renewed 19.5s ago"),  # 19.5 s < 20 s
        (9.5, DEAD, DEAD, False, "last renewed 20.5s ago"),
        (3000.0, DEAD, DEAD, False, "its TTL is not a renewed lease's"),  # a fixed lock_ttl
        (None, DEAD, DEAD, False, "its TTL is not a renewed lease's"),  # no expiry
        (29.0, UNKNOWN, UNKNOWN, False, "a similar one"),
    ],
)
def test_a_holder_is_alive_by_its_ping_or_its_renewal(
    ttl: float | None, ping: str, state: str, renewed: bool, says: str
) -> None:
    said = verdict(held(ttl), {"w1@web-1": ping}, 1.0, LEASE)
    assert (said.state, said.renewed) == (state, renewed)
    assert says in said.reason


def test_a_lock_taken_outside_a_worker_is_unknown() -> None:
    said = verdict(held(29.0, host="laptop"), {"laptop": UNKNOWN}, 1.0, LEASE)
    assert said.state == UNKNOWN and "not taken in a worker" in said.reason
    foreign = HeldLock("redlock:{x}", "x", 1, "not a token", None, 29.0, None)
    assert verdict(foreign, {}, 1.0, LEASE).state == UNKNOWN


@pytest.mark.parametrize(
    ("max_hold_s", "ago", "ttl", "state"),
    [
        (9, 0, 8.0, UNKNOWN),  # a 4 s hard limit: its TTL never was a lease
        (120, 0, 29.0, ALIVE),  # the cap 2 minutes off: the TTL is a renewed lease
        (120, 0, 9.0, DEAD),  # ... and one not renewed for 21 s
        (120, 100, 9.0, UNKNOWN),  # 100 s into it, the cap is 20 s off: no renewal shows
    ],
)
def test_a_ttl_cut_to_a_hard_time_limit_shows_no_renewal(
    max_hold_s: int, ago: int, ttl: float, state: str
) -> None:
    """The token carries the lock's ``max_hold``: while the cap is closer than a lease, a live
    holder's TTL is what is left of the cap, not a renewed lease, and a silent worker's lock
    is unknown, never dead (``release --dead`` released a running task's lock)."""
    acquired = int(time.time() * 1000) - ago * 1000
    value = f"{'a' * 32}|7|{acquired}+{max_hold_s * 1000}|w1@web-1|t-1"
    lock = HeldLock("redlock:{job}", "job", 1, value, _owner.parse(value), ttl, None)
    said = verdict(lock, {"w1@web-1": DEAD}, 1.0, LEASE)
    assert said.state == state, said.reason
    if state == UNKNOWN:
        assert "cut to its task's hard time limit (max_hold)" in said.reason


@pytest.mark.parametrize(
    ("field", "max_hold_ms"),
    [("1796451764627", None), ("1796451764627+9000", 9000), ("1796451764627+", "bad")],
)
def test_a_token_s_acquisition_field_may_carry_the_cap(field: str, max_hold_ms: object) -> None:
    owner = _owner.parse(f"{'a' * 32}|7|{field}|w1@web-1|t-1")
    if max_hold_ms == "bad":
        assert owner is None
    else:
        assert owner is not None and owner.acquired_ms == 1796451764627
        assert owner.max_hold_ms == max_hold_ms and owner.task_id == "t-1"


@pytest.mark.parametrize("wait", [0, 1e-300, 0.05, 3601, 3e6, float("nan"), float("inf"), "1"])
def test_a_ping_wait_outside_a_tenth_of_a_second_to_an_hour_is_refused_everywhere(
    wait: object,
) -> None:
    """Helper probe and review, round 3: ``--timeout 1e-300`` was as good as 0 (a live
    worker's lock "would release"), above about 25 days the ping said the broker did not
    answer; the dashboard's ``ping_timeout`` (``create_app``, the Django mount) took any value."""
    with pytest.raises(ValueError, match=r"expected a number of seconds from 0\.1 to 3600"):
        checked_wait(wait)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^ping_timeout: "):
        Dashboard(Celery("waits", set_as_current=False), ping_timeout=wait)  # type: ignore[arg-type]
    assert checked_wait(0.1) == 0.1 and checked_wait(3600) == 3600.0
