"""How ``celery redlock`` judges a holder from a ping's answer and the lock's TTL (no Redis, no
worker: the decision alone; the real cases run in tests/e2e/cli)."""

from __future__ import annotations

import pytest

from celery_redlock._redis import owner as _owner
from celery_redlock._redis.inventory import HeldLock
from celery_redlock.cli._liveness import ALIVE, DEAD, UNKNOWN, verdict

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
