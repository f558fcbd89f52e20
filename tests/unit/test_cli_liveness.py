"""How ``celery redlock`` judges a holder from a ping's answer and the lock's TTL (no Redis, no
worker: the decision alone; the real cases run in tests/e2e/cli)."""

from __future__ import annotations

import time

import pytest
from celery import Celery

from celery_redlock import LockedTask
from celery_redlock._redis import owner as _owner
from celery_redlock._redis.core import ms
from celery_redlock._redis.inventory import HeldLock
from celery_redlock.cli._liveness import (
    ALIVE,
    DEAD,
    FIXED,
    NOT_KNOWN,
    RENEWED,
    UNKNOWN,
    UNSURE,
    Heard,
    Renewal,
    _processes,
    checked_wait,
    renewals,
    unpinged,
    verdict,
)
from celery_redlock.web._core import Dashboard

LEASE = 30.0


def held(ttl: float | None, host: str = "w1@web-1") -> HeldLock:
    value = _owner.new_token("t-1", host=host, pid=7)
    return HeldLock("redlock:{job}", "job", 1, value, _owner.parse(value), ttl, None)


RENEWS = Renewal(RENEWED)
FIXED_25 = Renewal(FIXED, "the lock_ttl of its tasks (lock name job) is a fixed 25s")


@pytest.mark.parametrize(
    ("ttl", "ping", "state", "renewed", "says"),
    [
        (29.0, ALIVE, ALIVE, False, "answers a control ping"),
        (29.0, DEAD, ALIVE, True, "set 1.0s ago (acquired or renewed), within two thirds of"),
        (20.5, DEAD, ALIVE, True, "warm shutdown"),
        # A renewal due at 10 s that runs late (a body holding the GIL): still alive.
        (19.5, DEAD, ALIVE, True, "set 10.5s ago"),
        (10.5, DEAD, ALIVE, True, "set 19.5s ago"),  # 19.5 s < 20 s
        (9.5, DEAD, DEAD, False, "its TTL shows no renewal for 20.5s"),
        # A TTL longer than the lease of a task that renews: another deploy's longer lease
        # (a deploy probe released such a live lock), or a lost per-call lock_ttl record.
        (3000.0, DEAD, UNKNOWN, False, "is longer than redlock_lease=30s, which its task renews"),
        (None, DEAD, DEAD, False, "its TTL is not a renewed lease's"),  # no expiry
        (29.0, UNKNOWN, UNKNOWN, False, "a similar one"),
    ],
)
def test_a_holder_is_alive_by_its_ping_or_its_renewal(
    ttl: float | None, ping: str, state: str, renewed: bool, says: str
) -> None:
    said = verdict(held(ttl), {"w1@web-1": ping}, 1.0, LEASE, RENEWS)
    assert (said.state, said.renewed) == (state, renewed)
    assert says in said.reason


def recorded(ttl: float, lease_s: int) -> HeldLock:
    """A lock whose holder's token records the lease it renews to (``lease_s``)."""
    value = _owner.new_token("t-1", host="w1@web-1", pid=7, lease_ms=lease_s * 1000)
    return HeldLock("redlock:{job}", "job", 1, value, _owner.parse(value), ttl, None)


@pytest.mark.parametrize(
    ("ttl", "lease_s", "state", "says"),
    [
        # A deploy lengthened redlock_lease from 10 to 30 s: the draining worker renews to 10.
        (8.0, 10, ALIVE, "set 2.0s ago (acquired or renewed), within two thirds of its holder"),
        (3.0, 10, DEAD, "no renewal for 7.0s, two thirds of its holder's own lease or more"),
        # ... or shortened it from 60 to 30 s: renewed to 60.
        (58.0, 60, ALIVE, "set 2.0s ago"),
        (15.0, 60, DEAD, "no renewal for 45.0s"),
        # Extended past its own lease by its holder (whose renewal brings it back).
        (45.0, 10, UNKNOWN, "longer than its holder's own lease (10s): extended past it"),
        (45.0, 30, UNKNOWN, "longer than redlock_lease (30s): extended past it by its holder"),
        (29.0, 30, ALIVE, "within two thirds of redlock_lease (20.0s)"),
    ],
)
@pytest.mark.parametrize(
    "renewal", [RENEWS, FIXED_25, NOT_KNOWN], ids=["renews", "fixed", "unsure"]
)
def test_a_renewed_lock_is_judged_by_the_lease_its_token_records(
    ttl: float, lease_s: int, state: str, says: str, renewal: Renewal
) -> None:
    """Deploy probe, session 30, left open then: ``release --dead`` run with a deploy's longer
    ``redlock_lease`` (30 s) read a draining worker's 10 s lease, renewed 2 s ago (TTL 8 s), as
    one not renewed for 22 s, and released its running task's lock. The token's lease also
    says the lock is renewed, whatever the app says of its tasks."""
    said = verdict(recorded(ttl, lease_s), {"w1@web-1": DEAD}, 1.0, LEASE, renewal)
    assert (said.state, said.renewed) == (state, state == ALIVE), said.reason
    assert says in said.reason, said.reason
    quiet = unpinged(recorded(ttl, lease_s), LEASE, "the broker does not answer", renewal)
    assert quiet.state == (ALIVE if state == ALIVE else UNKNOWN), quiet.reason


def test_a_recorded_lease_equal_to_the_command_s_is_named_as_the_setting() -> None:
    """``ms(2.01)`` is 2009: the token's lease equals the command's ``redlock_lease=2.01`` as
    the lock records it, and the reason names the setting, not another lease."""
    value = _owner.new_token("t-1", host="w1@web-1", pid=7, lease_ms=ms(2.01))
    lock = HeldLock("redlock:{job}", "job", 1, value, _owner.parse(value), 1.9, None)
    said = verdict(lock, {"w1@web-1": DEAD}, 1.0, 2.01)
    assert said.state == ALIVE and "within two thirds of redlock_lease" in said.reason


@pytest.mark.parametrize(
    ("ttl", "state"), [(29.0, UNKNOWN), (24.0, UNKNOWN), (12.0, UNKNOWN), (9.5, DEAD), (1.0, DEAD)]
)
def test_a_fixed_lock_ttl_of_a_silent_worker_is_never_said_renewed(ttl: float, state: str) -> None:
    """Probe: a SIGKILLed worker's ``lock_ttl=25`` lock (lease 15) was "alive (lease renewed
    ... 4.7s ago)" once its TTL fell below the lease; it never was renewed. Review: nor is it
    dead by the app's word while its TTL is also that of a lease set lately: a renewing lock
    of the workers' older code (a rolling deploy), or of a call whose per-call ``lock_ttl``
    record was lost, reads the same and would be released while its holder runs. Unknown,
    and kept, until two thirds of the lease; dead after, as any silent holder's."""
    said = verdict(held(ttl), {"w1@web-1": DEAD}, 1.0, LEASE, FIXED_25)
    assert (said.state, said.renewed) == (state, False)
    if state == UNKNOWN:
        assert "is a fixed 25s, which this app never renews, but its TTL is also" in said.reason
    else:
        assert "is a fixed 25s, never renewed, and its TTL is no lease's set lately" in said.reason
    assert "its task renews it" not in said.reason
    # The ping still counts: a fixed lock of a worker that answers is alive.
    assert verdict(held(ttl), {"w1@web-1": ALIVE}, 1.0, LEASE, FIXED_25).state == ALIVE
    # Without a ping, a fixed TTL shows nothing either way.
    assert unpinged(held(ttl), LEASE, "the broker does not answer", FIXED_25).state == UNKNOWN


@pytest.mark.parametrize(("ttl", "state"), [(29.0, UNKNOWN), (10.5, UNKNOWN), (9.5, DEAD)])
def test_a_lock_not_known_to_be_renewed_is_unknown_while_its_ttl_looks_recent(
    ttl: float, state: str
) -> None:
    """Without the app's word, a TTL within two thirds of the lease is no proof of a renewal:
    unknown (kept), never "renewed"; past two thirds a renewing holder would have renewed, and
    a fixed one proves nothing: dead."""
    said = verdict(held(ttl), {"w1@web-1": DEAD}, 1.0, LEASE)
    assert (said.state, said.renewed) == (state, False)
    if state == UNKNOWN:
        assert "whether it was renewed, and its holder alive, is unknown" in said.reason
        assert "no task of the app is known to take it" in said.reason


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
    said = verdict(lock, {"w1@web-1": DEAD}, 1.0, LEASE, RENEWS)
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


def renewal_app() -> Celery:
    app = Celery("renewals", set_as_current=False)

    @app.task(base=LockedTask, lock_by=["k"], lock_ttl=25, shared=False, name="renewals.fixed")
    def fixed(k: str) -> None: ...

    @app.task(base=LockedTask, lock_by=["k"], shared=False, name="renewals.leased")
    def leased(k: str) -> None: ...

    @app.task(
        base=LockedTask,
        lock_by=["k"],
        lock_name="grp",
        lock_ttl=60,
        shared=False,
        name="renewals.grouped_fixed",
    )
    def grouped_fixed(k: str) -> None: ...

    @app.task(
        base=LockedTask,
        lock_by=["k"],
        lock_name="grp",
        shared=False,
        name="renewals.grouped_leased",
    )
    def grouped_leased(k: str) -> None: ...

    return app


def task_lock(
    lock_name: str, ttl: float | None, acquired_ago: float, overrides: dict[str, object] | None
) -> HeldLock:
    acquired = int((NOW - acquired_ago) * 1000)
    value = f"{'a' * 32}|7|{acquired}|w1@web-1|t-1"
    name = f"{lock_name}:{'0' * 32}"
    return HeldLock(
        f"redlock:{{{name}}}", name, 1, value, _owner.parse(value), ttl, None, overrides
    )


NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("lock_name", "ttl", "ago", "overrides", "kind", "says"),
    [
        ("renewals.fixed", 13.0, 12.0, None, FIXED, "lock name renewals.fixed) is a fixed 25s"),
        ("renewals.leased", 13.0, 100.0, None, RENEWED, ""),
        ("grp", 13.0, 47.0, None, UNSURE, "renew it or not"),  # a fixed task and a renewed one
        ("elsewhere.task", 13.0, 12.0, None, UNSURE, "no task of the app takes the lock name"),
        # The holder's per-call lock_ttl decides, whatever its task's option says.
        ("renewals.leased", 13.0, 27.0, {"ttl": 40.0}, FIXED, "its call's per-call lock_ttl"),
        ("renewals.fixed", 13.0, 12.0, {"ttl": None}, RENEWED, ""),
        ("renewals.fixed", 13.0, 12.0, {"on_contention": "wait"}, FIXED, "fixed 25s"),
        ("renewals.fixed", 13.0, 12.0, {"ttl": "x"}, UNSURE, "is no number of seconds"),
    ],
)
def test_the_app_s_tasks_say_whether_a_lock_is_renewed(
    lock_name: str,
    ttl: float | None,
    ago: float,
    overrides: dict[str, object] | None,
    kind: str,
    says: str,
) -> None:
    lock = task_lock(lock_name, ttl, ago, overrides)
    found = renewals(renewal_app(), [lock])[lock.key]
    assert found.kind == kind and says in found.why


def test_a_lock_without_an_argument_digest_is_no_task_s() -> None:
    value = f"{'a' * 32}|7|{int(NOW * 1000)}|w1@web-1|t-1"
    plain = HeldLock(
        "redlock:{renewals.fixed}", "renewals.fixed", 1, value, _owner.parse(value), 25.0, None
    )
    assert renewals(renewal_app(), [plain])[plain.key] == NOT_KNOWN


def test_an_app_whose_tasks_cannot_be_read_leaves_every_lock_unsure() -> None:
    """A task option the app refuses stops its finalization: no lock is known to be fixed
    (never dead by its task's ``lock_ttl``), and the judgment does not fail."""
    app = renewal_app()

    @app.task(base=LockedTask, lock_by=["k"], shared=False, name="renewals.bad{x}")
    def bad(k: str) -> None: ...

    lock = task_lock("renewals.fixed", 13.0, 12.0, None)
    found = renewals(app, [lock])[lock.key]
    assert found.kind == UNSURE and "the app's tasks cannot be read (LockConfigError)" in found.why


@pytest.mark.parametrize(
    ("stats", "pids"),
    [
        ({"pid": 10, "pool": {"processes": [11, 12]}}, {10, 11, 12}),  # prefork
        ({"pid": 10, "pool": {"implementation": "celery.concurrency.thread:TaskPool"}}, {10}),
        ({"pid": 10, "pool": {"implementation": "celery.concurrency.solo:TaskPool"}}, {10}),
        ({"pid": 10, "pool": {"implementation": "their.pool:Pool"}}, None),  # not listed
        ({"pid": True, "pool": {"processes": []}}, None),
        ({"pool": {"processes": [11]}}, None),
        ({"pid": 10, "pool": {"processes": [11, "12"]}}, None),
        ("not stats", None),
    ],
)
def test_a_worker_s_processes_are_read_from_its_stats_reply_or_left_unknown(
    stats: object, pids: set[int] | None
) -> None:
    """Restarts probe, round 3: a pid judged against a pool whose processes are not listed
    would call a live holder dead, and ``release --dead`` would free its lock."""
    found = _processes(stats)
    assert (None if found is None else set(found)) == pids


def test_a_holder_whose_pid_its_answering_worker_lacks_is_judged_as_unanswered() -> None:
    lock = held(120.0)  # a TTL above the lease: no renewed lease's
    assert lock.holder is not None
    host = lock.holder.host
    mine = Heard(ALIVE, frozenset({lock.holder.pid}))
    assert verdict(lock, {host: mine}, 1.0, LEASE).state == ALIVE
    assert verdict(lock, {host: Heard(ALIVE)}, 1.0, LEASE).state == ALIVE  # pids unknown
    gone = verdict(lock, {host: Heard(ALIVE, frozenset({1}))}, 1.0, LEASE)
    assert gone.state == DEAD and "is none of that worker's" in gone.reason
