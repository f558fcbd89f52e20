"""The fault run's history checker on crafted histories (chaos.history)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from chaos import history
from chaos.history import Event, Holding, StoreWrite, Verdict, Window, holdings, takeover_times
from chaos.history import check as judge


def check(events: list[Event], writes: Sequence[StoreWrite], *rest: Any, **kw: Any) -> Verdict:
    """:func:`chaos.history.check`; with no store log given (``[]``), the store accepted one
    write of each holder with a token, in the order of admission (a run that wrote nothing
    is untested: ``test_a_run_that_tested_nothing_fails``)."""
    if not writes:
        admitted = sorted((e for e in events if e.kind == "admitted"), key=lambda e: e.at)
        writes = [
            StoreWrite(i, e.key, e.token, True, e.call)
            for i, e in enumerate(admitted)
            if e.token is not None
        ]
    return judge(events, writes, *rest, **kw)


def call(
    name: str, key: str, token: int, start: float, end: float, state: str = "SUCCESS"
) -> list[Event]:
    return [
        Event(start - 0.5, name, "submitted", key),
        Event(start, name, "admitted", key, token=token),
        Event(start + 0.01, name, "body_start", key),
        Event(end, name, "body_end", key),
        Event(end + 0.01, name, "released", key),
        Event(end + 0.5, name, "final", key, state=state),
    ]


def test_a_clean_history_passes() -> None:
    events = call("a", "k", 10, 1, 2) + call("b", "k", 11, 3, 4) + call("c", "j", 5, 1, 4)
    writes = [StoreWrite(1, "k", 10, True, "a"), StoreWrite(2, "k", 11, True, "b")]
    verdict = check(events, writes)
    assert verdict.ok, verdict.summary()
    assert verdict.summary()["writes_accepted"] == 2


def test_an_overlap_outside_every_window_is_a_violation() -> None:
    verdict = check(call("a", "k", 10, 1, 3) + call("b", "k", 11, 2, 4), [])
    assert not verdict.ok
    assert verdict.overlaps_unexplained == [("k", "a", "b")]


def test_an_overlap_inside_a_documented_limit_s_window_is_counted_not_failed() -> None:
    events = call("a", "k", 10, 1, 3) + call("b", "k", 11, 2, 4)
    windows = [Window("pause-holder", 1.5, 2.5, limit="holder paused past its lease")]
    verdict = check(events, [], windows)
    assert verdict.ok
    assert verdict.overlaps_explained == {"holder paused past its lease": 1}
    assert verdict.overlap_max_s == {"holder paused past its lease": 1.0}  # from 2 to 3
    no_limit = check(events, [], [Window("partition", 1.5, 2.5)])
    assert not no_limit.ok  # a window without a documented limit explains nothing


def test_a_stale_write_accepted_is_a_violation_and_rejections_are_counted() -> None:
    events = call("a", "k", 10, 1, 2) + call("b", "k", 11, 3, 4)
    writes = [StoreWrite(1, "k", 11, True, "b"), StoreWrite(2, "k", 10, False, "a")]
    verdict = check(events, writes)
    assert verdict.ok and verdict.rejected == 1
    stale = check(events, [StoreWrite(1, "k", 11, True, "b"), StoreWrite(2, "k", 10, True, "a")])
    assert not stale.ok and [w.seq for w in stale.stale_accepted] == [2]
    again = check(events, [StoreWrite(1, "k", 11, True, "b"), StoreWrite(2, "k", 11, True, "b")])
    assert again.ok  # the same holder writing twice


def test_tokens_must_increase_from_one_holder_to_the_next() -> None:
    verdict = check(call("a", "k", 12, 1, 2) + call("b", "k", 11, 3, 4), [])
    assert verdict.token_inversions == [("k", "a", "b")] and not verdict.ok
    same = check(call("a", "k", 12, 1, 2) + call("b", "k", 12, 3, 4), [])
    assert not same.ok
    other_keys = check(call("a", "k", 12, 1, 2) + call("b", "j", 11, 3, 4), [])
    assert other_keys.ok  # tokens are per key


def test_a_call_admitted_with_its_lock_already_lost_is_counted_not_judged() -> None:
    # Admitted after a late acquire reply, its lease over by the worker's clock before its
    # body read the token (None once lost): the body stops before its first write.
    late = [
        Event(2.5, "b", "submitted", "k"),
        Event(3, "b", "admitted", "k", token=None),
        Event(3.01, "b", "lost", "k"),
        Event(3.02, "b", "body_end", "k"),
        Event(3.5, "b", "final", "k", state="LOST"),
    ]
    verdict = check(call("a", "k", 10, 1, 2) + late + call("c", "k", 11, 4, 5), [])
    assert verdict.ok, verdict.summary()
    assert verdict.summary()["admitted_lost"] == 1
    wrote = [*late, Event(3.015, "b", "write", "k", accepted=False)]
    judged = check(call("a", "k", 10, 1, 2) + wrote + call("c", "k", 11, 4, 5), [])
    assert judged.token_inversions == [("k", "a", "b"), ("k", "b", "c")]
    assert judged.admitted_lost == 0 and not judged.ok


def test_a_call_without_a_documented_final_state_is_lost() -> None:
    events = [*call("a", "k", 10, 1, 2, state="SKIPPED"), Event(0, "b", "submitted", "k")]
    verdict = check(events, [])
    assert verdict.lost_calls == ["b"] and not verdict.ok
    odd = check(call("a", "k", 10, 1, 2, state="PENDING"), [])
    assert odd.lost_calls == ["a"]


def test_a_holder_that_never_recorded_its_end_holds_until_its_last_event() -> None:
    a = [Event(1, "a", "admitted", "k", token=1), Event(5, "a", "write", "k", 1, True)]
    verdict = check(a + call("b", "k", 2, 3, 4), [])
    assert verdict.overlaps_unexplained == [("k", "a", "b")]


def test_leftover_keys_fail_the_run() -> None:
    verdict = check([], [], leftover_keys=["redlock:{x}"])
    assert not verdict.ok and verdict.summary()["leftover_keys"] == 1


def test_takeover_time_is_from_the_fault_to_the_next_holder() -> None:
    events = call("a", "k", 10, 1, 9) + call("b", "k", 11, 4.5, 6)
    assert takeover_times(events, [Window("pause", 2.0, 8.0)]) == [2.5]


def test_an_overlap_that_began_before_a_fault_window_is_not_explained_by_it() -> None:
    # A real exclusion failure of the warm-up that lasts into the fault: not the fault's doing.
    clock = [Window("clock-forward", 5, 9, limit="clock stepped forward")]
    early = check(call("c", "k", 10, 1.0, 5.2) + call("d", "k", 11, 2.0, 5.3), [], clock)
    assert early.overlaps_unexplained == [("k", "c", "d")] and not early.overlaps_explained
    pause = [Window("pause-holder", 19.5, 30, limit="holder paused past its lease")]
    long = check(call("a", "k", 10, 1, 20) + call("b", "k", 11, 2, 21), [], pause)
    assert long.overlaps_unexplained == [("k", "a", "b")]
    # One that begins inside the window may outlast it: the paused holder runs on.
    late = check(call("a", "k", 10, 1, 8) + call("b", "k", 11, 6, 9), [], clock)
    assert late.ok and late.overlaps_explained == {"clock stepped forward": 1}


def test_each_admission_of_a_call_is_a_holding_of_its_own() -> None:
    def twice(first: int, second: int) -> list[Event]:
        return [
            Event(0.5, "a", "submitted", "k"),
            Event(1, "a", "admitted", "k", token=first),
            Event(1.01, "a", "body_start", "k"),
            Event(3, "a", "body_end", "k"),
            Event(5, "a", "admitted", "k", token=second),  # redelivered
            Event(5.01, "a", "body_start", "k"),
            Event(6, "a", "body_end", "k"),
            Event(7, "a", "final", "k", state="SUCCESS"),
        ]

    runs = [(h.call, h.admitted, h.ended) for h in holdings(twice(10, 12))]
    assert runs == [("a", 1, 3), ("a", 5, 6)]
    verdict = check(twice(10, 12) + call("b", "k", 11, 2, 4), [])
    assert verdict.overlaps_unexplained == [("k", "a", "b")]  # the first run overlaps b
    inverted = check(twice(12, 13) + call("b", "k", 11, 3.5, 4), [])
    assert inverted.token_inversions == [("k", "a", "b")] and not inverted.overlaps_unexplained


def test_two_executions_of_one_call_at_once_overlap() -> None:
    """A redelivery while the first execution still runs: each records its own ``run``."""
    events = [
        Event(0.5, "a", "submitted", "k"),
        Event(1, "a", "admitted", "k", token=10, run="r1"),
        Event(2, "a", "admitted", "k", token=11, run="r2"),  # redelivered while r1 runs
        Event(2.5, "a", "write", "k", token=10, accepted=True, run="r1"),
        Event(3, "a", "body_end", "k", run="r2"),
        Event(4, "a", "body_end", "k", run="r1"),
        Event(5, "a", "final", "k", state="SUCCESS"),
    ]
    runs = [(h.token, h.admitted, h.ended) for h in holdings(events)]
    assert runs == [(10, 1, 4), (11, 2, 3)]
    assert check(events, []).overlaps_unexplained == [("k", "a", "a")]


def test_a_holder_without_its_end_holds_until_its_last_body_event_not_its_final() -> None:
    # The harness stamps ``final`` when it collects the results, long after the run.
    a = [
        Event(0.5, "a", "submitted", "k"),
        Event(1.0, "a", "admitted", "k", token=10),
        Event(1.01, "a", "body_start", "k"),
        Event(1.5, "a", "write", "k", token=10, accepted=True),
        Event(1.6, "a", "released", "k"),
        Event(30.0, "a", "final", state="SUCCESS"),
    ]
    verdict = check(a + call("b", "k", 11, 12, 13), [])
    assert verdict.ok, verdict.summary()
    assert [(h.call, h.ended) for h in holdings(a)] == [("a", 1.5)]


def test_an_unknown_event_kind_is_an_error_not_ignored() -> None:
    with pytest.raises(ValueError, match=r"unknown event kind 'admited' .*admitted, body_end"):
        Event(1, "a", "admited", "k", token=10)
    with pytest.raises(ValueError, match="'admited'"):
        Event.from_dict({"at": 1, "call": "a", "kind": "admited", "key": "k"})


def test_an_empty_history_proves_nothing() -> None:
    verdict = check([], [])
    assert not verdict.ok and verdict.empty and verdict.summary()["empty"] is True
    assert not check(call("a", "k", 10, 1, 2), []).empty


def test_of_two_final_events_the_later_one_counts() -> None:
    ran = [e for e in call("a", "k", 10, 1, 2) if e.kind != "final"]
    later_bad = [
        Event(9, "a", "final", "k", state="BOGUS"),
        Event(3, "a", "final", "k", state="SUCCESS"),
    ]
    assert check(ran + later_bad, []).lost_calls == ["a"]
    later_good = [
        Event(9, "a", "final", "k", state="SUCCESS"),
        Event(3, "a", "final", "k", state="BOGUS"),
    ]
    assert check(ran + later_good, []).ok


def test_a_final_state_is_judged_even_without_its_submission() -> None:
    unsubmitted = [e for e in call("a", "k", 10, 1, 2, state="WEIRD") if e.kind != "submitted"]
    verdict = check(call("b", "k", 11, 3, 4) + unsubmitted, [])
    assert verdict.lost_calls == ["a"] and not verdict.ok


def test_two_admissions_of_a_key_at_one_instant_overlap_even_with_an_empty_body() -> None:
    # Holdings are half-open, [admitted, ended), but each holds its admission instant.
    verdict = check(call("a", "k", 10, 2, 2) + call("b", "k", 11, 2, 3), [])
    assert verdict.overlaps_unexplained == [("k", "a", "b")]
    handover = check(call("a", "k", 10, 1, 2) + call("b", "k", 11, 2, 3), [])
    assert handover.ok  # admitted at the instant the other ended: it follows it


def test_a_rejected_write_of_the_newest_token_is_a_violation() -> None:
    events = call("a", "k", 10, 1, 2) + call("b", "k", 11, 3, 4)
    wrong = check(events, [StoreWrite(1, "k", 10, True, "a"), StoreWrite(2, "k", 11, False, "b")])
    assert [w.seq for w in wrong.wrong_rejections] == [2] and wrong.rejected == 0
    assert not wrong.ok and wrong.summary()["wrong_rejections"] == 1
    first = check(events, [StoreWrite(1, "k", 10, False, "a")])
    assert [w.seq for w in first.wrong_rejections] == [1] and not first.ok


def test_a_write_outside_every_admission_of_its_call_is_a_violation() -> None:
    stranger = [
        Event(0.5, "x", "submitted", "k"),
        Event(3, "x", "write", "k", token=11, accepted=True),
        Event(5, "x", "final", "k", state="SUCCESS"),
    ]
    events = call("b", "k", 11, 2, 4) + stranger
    verdict = check(events, [])
    assert verdict.unadmitted_writes == [("k", "x")] and not verdict.ok
    after_end = [*call("a", "k", 10, 1, 2), Event(2.2, "a", "write", "k", token=10)]
    assert check(after_end, []).unadmitted_writes == [("k", "a")]
    store = check(call("b", "k", 11, 2, 4), [StoreWrite(1, "k", 11, True, "y")])
    assert store.unadmitted_writes == [("k", "y")] and not store.ok


def test_two_holders_sharing_a_token_are_a_violation_even_inside_a_limit_s_window() -> None:
    events = call("a", "k", 10, 1, 3) + call("b", "k", 10, 2, 4)
    window = [Window("pause-holder", 1.5, 3.5, limit="holder paused")]
    verdict = check(events, [], window)
    assert verdict.overlaps_explained == {"holder paused": 1}
    assert verdict.shared_tokens == [("k", "a", "b")] and not verdict.ok
    # Seen by the store alone (the holders' tokens were not recorded): the fence let both in.
    writes = [StoreWrite(1, "k", 10, True, "a"), StoreWrite(2, "k", 10, True, "b")]
    untold = [e if e.kind != "admitted" else Event(e.at, e.call, e.kind, e.key) for e in events]
    by_store = check(untold, writes, window)
    assert by_store.shared_tokens == [("k", "a", "b")] and not by_store.stale_accepted
    assert not by_store.ok


def test_a_run_that_tested_nothing_fails() -> None:
    """Calls submitted, but none admitted with a token, or no write accepted: every call
    unavailable or skipped, records lost, workers pointed at the wrong lock server."""
    skipped = [Event(1, "a", "submitted", "k"), Event(2, "a", "final", "k", state="SKIPPED")]
    verdict = judge(skipped, [])
    assert verdict.untested and not verdict.ok
    unwritten = judge(call("a", "k", 10, 1, 2), [])
    assert unwritten.untested and not unwritten.ok
    assert not judge(call("a", "k", 10, 1, 2), [StoreWrite(1, "k", 10, True, "a")]).untested


def test_an_inversion_between_overlapping_holders_is_caught() -> None:
    """The newer of two overlapping holders with the smaller token: the fence refuses it and
    lets the stale one write. Inside a documented limit's window it is counted there."""
    events = call("a", "k", 12, 1, 3) + call("b", "k", 11, 2, 4)
    window = [Window("pause-holder", 1.5, 2.5, limit="holder paused past its lease")]
    writes = [StoreWrite(1, "k", 12, True, "a"), StoreWrite(2, "k", 11, False, "b")]
    unexplained = judge(events, writes)
    assert ("k", "a", "b") in unexplained.token_inversions and not unexplained.ok
    explained = judge(events, writes, window)
    assert explained.token_inversions == []
    assert explained.inversions_explained == {"holder paused past its lease": 1}


def test_an_inversion_is_explained_only_when_the_records_cannot_order_the_acquires() -> None:
    """Inside a limit's window an inversion is explained while the newer holder's acquire
    began before the older one was admitted (its admission may be recorded late); one that
    began after it was granted after it, and its smaller token is a violation."""
    window = [Window("pause-holder", 1.5, 2.5, limit="holder paused past its lease")]
    writes = [StoreWrite(1, "k", 12, True, "a"), StoreWrite(2, "k", 11, False, "b")]

    def events(since: float) -> list[Event]:
        b = [
            e if e.kind != "admitted" else Event(e.at, "b", e.kind, "k", 11, since=since)
            for e in call("b", "k", 11, 2, 4)
        ]
        return call("a", "k", 12, 1, 3) + b

    late_record = judge(events(since=0.5), writes, window)
    assert late_record.token_inversions == [] and late_record.ok, late_record.summary()
    granted_later = judge(events(since=1.2), writes, window)
    assert granted_later.token_inversions == [("k", "a", "b")] and not granted_later.ok


def test_a_store_write_must_carry_a_token_its_writer_was_admitted_with() -> None:
    """The store's log against the admissions: a write with another token than its writer's,
    and a write by a call admitted without a token, are violations."""
    events = call("a", "k", 5, 1, 2) + call("b", "k", 6, 3, 4)
    forged = [StoreWrite(1, "k", 99, True, "a"), StoreWrite(2, "k", 6, False, "b")]
    verdict = judge(events, forged)
    assert verdict.mistokened_writes == [forged[0]] and not verdict.ok
    assert judge(events, [StoreWrite(1, "k", 5, True, "a"), StoreWrite(2, "k", 6, True, "b")]).ok
    lost = [
        Event(2.5, "c", "submitted", "k"),
        Event(2.6, "c", "admitted", "k", token=None),
        Event(2.9, "c", "body_end", "k"),
        Event(3.5, "c", "final", "k", state="LOST"),
    ]
    wrote = [StoreWrite(1, "k", 5, True, "a"), StoreWrite(2, "k", 7, True, "c")]
    unjudged = judge(call("a", "k", 5, 1, 2) + lost, wrote)
    assert unjudged.mistokened_writes == [wrote[1]] and not unjudged.ok


def test_a_limit_that_loses_the_tokens_explains_any_inversion_in_its_window() -> None:
    """Quorum nodes rejoining early restart their counters from their clocks: inside that
    window even a newer holder whose acquire began after the older was admitted may get a
    smaller token (docs/guide.md, "Fencing tokens")."""
    writes = [StoreWrite(1, "k", 12, True, "a"), StoreWrite(2, "k", 11, False, "b")]
    b = [
        e if e.kind != "admitted" else Event(e.at, "b", e.kind, "k", 11, since=1.2)
        for e in call("b", "k", 11, 2, 4)
    ]
    events = call("a", "k", 12, 1, 3) + b
    early = [Window("quorum-early-rejoin", 1.5, 2.5, limit="rejoined early", tokens_go_back=True)]
    verdict = judge(events, writes, early)
    assert verdict.token_inversions == [] and verdict.ok, verdict.summary()
    assert verdict.inversions_explained == {"rejoined early": 1}


@pytest.mark.parametrize(("second_token", "shared"), [(11, False), (12, True)])
def test_a_limit_that_loses_the_tokens_explains_a_later_holder_s_smaller_or_equal_token(
    second_token: int, shared: bool
) -> None:
    """Helper probe, round 3: after nodes restarted empty, a holder that followed the older
    one (no overlap) with a smaller or equal token failed the run, while the same two
    overlapping passed. Outside such a window it is still a violation."""
    # The fence refuses a smaller token and lets an equal one through.
    writes = [StoreWrite(1, "k", 12, True, "a"), StoreWrite(2, "k", second_token, shared, "b")]
    events = call("a", "k", 12, 1, 2) + call("b", "k", second_token, 3, 4)
    lost = [Window("restart-empty", 2.5, 3.5, limit="restarted empty", tokens_go_back=True)]
    verdict = judge(events, writes, lost)
    assert verdict.ok, verdict.summary()
    assert verdict.inversions_explained == {"restarted empty": 1}
    kept = [Window("pause-holder", 2.5, 3.5, limit="holder paused")]  # keeps the tokens
    verdict = judge(events, writes, kept)
    assert not verdict.ok
    if shared:
        assert verdict.shared_tokens == [("k", "a", "b")]
    else:
        assert verdict.token_inversions == [("k", "a", "b")]


@pytest.mark.parametrize(
    ("record", "says"),
    [
        ({"at": 1.0, "call": "a", "kind": "admitted", "key": "k", "token": 1}, "run id"),
        ({"at": float("nan"), "call": "a", "kind": "submitted"}, "at=nan is no finite number"),
        ({"at": "1", "call": "a", "kind": "submitted"}, "at='1' is no finite number"),
        ({"at": 1.0, "call": "a", "kind": "write", "token": 1.9}, "token=1.9 is no whole"),
        ({"at": 1.0, "call": "a", "kind": "write", "token": True}, "token=True is no whole"),
        ({"call": "a", "kind": "submitted"}, "lacks at"),
        ({"at": 1.0, "call": "a", "kind": "write", "accepted": "yes"}, "accepted='yes' is neither"),
        ({"at": 1.0, "call": "a", "kind": "write", "token": 3}, "accepted=None is neither"),
    ],
)
def test_a_record_the_checker_would_misjudge_is_refused_naming_the_field(
    record: dict[str, Any], says: str
) -> None:
    """Helper probe, round 3: without run ids two admissions of one call at once were one
    holding (the run passed); a NaN time broke the sort; ``1.9`` was cut to token 1."""
    with pytest.raises(ValueError, match=says):
        Event.from_dict(record)
    write = {"at": 1, "call": "a", "kind": "write", "token": 3, "accepted": True}
    assert Event.from_dict(write).run == ""


def test_a_limit_whose_stale_holder_predates_the_fault_explains_only_overlaps_with_it() -> None:
    """Helper probe, round 3 (mutation testing): a lock that deleted another holder's key
    made two holders admitted after a clock step overlap, and the step's window explained it,
    as any two holders of any length. A paused holder, a clock step or a server restarted
    empty makes only a holder admitted before the fault stale."""
    window = [Window("clock-forward", 1.0, 9.0, limit="clock stepped forward", stale_before=1.2)]
    after = [*call("a", "k", 5, 2.0, 4.0), *call("b", "k", 6, 3.0, 5.0)]
    assert check(after, [], window).overlaps_unexplained == [("k", "a", "b")]
    stale = [*call("a", "k", 5, 0.5, 4.0), *call("b", "k", 6, 3.0, 5.0)]
    verdict = check(stale, [], window)
    assert verdict.ok and verdict.overlaps_explained == {"clock stepped forward": 1}
    failover = [Window("sentinel", 1.0, 9.0, limit="two primaries for a while")]
    assert check(after, [], failover).overlaps_explained == {"two primaries for a while": 1}


def test_a_holder_whose_task_began_before_the_fault_may_be_the_stale_one() -> None:
    """An admission is recorded after the acquire (and a lazy fencing read): a busy worker
    records it after the fault was injected although its acquire ran before. Its task's start
    (``since``) says it may predate the fault (review of the rule above)."""
    window = [Window("clock-forward", 1.0, 9.0, limit="clock stepped forward", stale_before=1.2)]
    late = call("a", "k", 5, 2.0, 4.0)
    late[1] = Event(2.0, "a", "admitted", "k", token=5, since=1.1)
    verdict = check([*late, *call("b", "k", 6, 3.0, 5.0)], [], window)
    assert verdict.ok and verdict.overlaps_explained == {"clock stepped forward": 1}


def test_a_write_reported_otherwise_than_the_store_logged_it_is_a_violation() -> None:
    """Helper probe, round 3: the checker never compared a body's ``accepted`` with the
    store's log, so a write reported accepted that never committed passed."""
    events = [
        *call("a", "k", 10, 1, 2),
        Event(1.5, "a", "write", "k", token=10, accepted=True),
        *call("b", "k", 11, 3, 4),
        Event(3.5, "b", "write", "k", token=11, accepted=True),
    ]
    logged = [StoreWrite(1, "k", 10, True, "a"), StoreWrite(2, "k", 11, True, "b")]
    assert check(events, logged).ok
    missing = check(events, logged[:1])
    assert [(e.call, e.token) for e in missing.misreported_writes] == [("b", 11)]
    assert not missing.ok
    assert missing.details()["misreported_writes"] == [
        {"at": 3.5, "call": "b", "kind": "write", "key": "k", "token": 11, "accepted": True}
    ]
    refused = check(events, [logged[0], StoreWrite(2, "k", 11, False, "b")])
    assert len(refused.misreported_writes) == 1 and not refused.ok
    twice = [*events, Event(3.6, "b", "write", "k", token=11, accepted=True)]
    assert len(check(twice, logged).misreported_writes) == 1  # one logged write, told twice
    elsewhere = [*call("a", "k", 10, 1, 2), Event(1.5, "a", "write", "j", 10, True)]
    assert check(elsewhere, logged[:1]).misreported_writes == elsewhere[-1:]  # its key


def test_a_call_the_harness_never_submitted_is_a_violation() -> None:
    """Helper probe, round 3: a call admitted and writing, with no ``submitted`` and no
    ``final`` (records cut at the front), passed."""
    phantom = [e for e in call("p", "k", 11, 3, 4) if e.kind not in ("submitted", "final")]
    verdict = check(call("a", "k", 10, 1, 2) + phantom, [])
    assert verdict.unsubmitted_calls == ["p"] and not verdict.ok
    assert verdict.details() == {"unsubmitted": ["p"]}


def test_a_pause_explains_only_an_overlap_with_a_holder_it_paused() -> None:
    """Helper probe, round 4: a pause window explained any overlap that began in it with a
    holder admitted before the pause, on any key and worker: here ``a`` (pid 1) wrote on
    throughout, never paused, while the paused holder (pid 3) held another key."""

    def ran(pid: int, events: list[Event]) -> list[Event]:
        return [replace(e, pid=pid) for e in events]

    events = [
        *ran(1, call("a", "k", 10, 1, 4)),
        *ran(2, call("b", "k", 11, 2, 2.3)),
        *ran(3, call("p", "j", 5, 1.2, 4.6)),
    ]

    def pause(*pids: int) -> list[Window]:
        return [
            Window("pause-holder", 1.5, 4.5, "paused", stale_before=1.6, holders=frozenset(pids))
        ]

    other = check(events, [], pause(3))
    assert other.overlaps_unexplained == [("k", "a", "b")] and not other.ok
    assert check(events, [], pause(1)).overlaps_explained == {"paused": 1}
    newer = check(events, [], pause(2))  # b was admitted after the pause: not its stale holder
    assert newer.overlaps_unexplained == [("k", "a", "b")]
    # Review, round 3: a pause between a's acquire and its admitted record makes that record
    # the later one; a's task began (since) before the pause, so a is the stale holder.
    late = [
        *ran(
            1,
            [
                replace(e, since=1.0) if e.kind == "admitted" else e
                for e in call("a", "k", 10, 2.5, 4)
            ],
        ),
        *ran(2, call("b", "k", 11, 2, 2.8)),
    ]
    assert check(late, [], pause(1)).overlaps_explained == {"paused": 1}
    anyone = [Window("clock-forward", 1.5, 4.5, "clock stepped forward", stale_before=1.6)]
    assert check(events, [], anyone).overlaps_explained == {"clock stepped forward": 1}
    assert Event.from_dict({"at": 1, "call": "a", "kind": "submitted", "pid": 7}).pid == 7
    with pytest.raises(ValueError, match=r"pid='7' is no whole number"):
        Event.from_dict({"at": 1, "call": "a", "kind": "submitted", "pid": "7"})


def test_a_stale_write_before_the_newer_holder_s_first_write_is_counted() -> None:
    """Helper probe, round 4: paused ``a`` (token 10) resumed and wrote at 3.2 s, after ``b``
    (11) was admitted at 3.0 s and before b's first write at 3.5 s. The store rightly accepted
    it (the fence cannot know 11 yet), and the checker, comparing each write with the largest
    token accepted before it, counted nothing: now it is counted, by the store's time."""
    events = call("a", "k", 10, 1, 3.3) + call("b", "k", 11, 3, 4)
    writes = [
        StoreWrite(1, "k", 10, True, "a", at=1.1),
        StoreWrite(2, "k", 10, True, "a", at=3.2),
        StoreWrite(3, "k", 11, True, "b", at=3.5),
    ]
    window = [Window("pause-holder", 1.5, 4.5, "paused", stale_before=1.6)]
    verdict = check(events, writes, window)
    assert verdict.stale_before_newer == [writes[1]] and not verdict.stale_accepted
    assert verdict.summary()["stale_writes_before_newer"] == 1
    assert verdict.ok  # the limit of fencing: its overlap is judged, under the pause here
    assert not check(events, writes).ok  # outside a limit's window, the overlap fails
    before = [writes[0], replace(writes[1], at=2.9), writes[2]]  # before b was admitted
    assert check(events, before, window).stale_before_newer == []
    untimed = [replace(w, at=None) for w in writes]
    assert check(events, untimed, window).stale_before_newer == []


def test_a_call_admitted_without_a_token_whose_body_ran_on_is_judged_as_a_holder() -> None:
    """Helper probe, round 4: a call admitted without a token and without a write was no
    holder however long its body ran: ``b`` ran from 2 to 5 s beside ``a``, and passed. It
    must show that it stopped: its ``lost`` before any write, then its end (their order, not
    their times: a pause between them is no act)."""

    def tokenless(ended: float | None, says_lost: bool = True) -> list[Event]:
        end = [] if ended is None else [Event(ended, "b", "body_end", "k")]
        lost = [Event(2.02, "b", "lost", "k")] if says_lost else []
        return [
            Event(1.5, "b", "submitted", "k"),
            Event(2, "b", "admitted", "k", token=None),
            Event(2.01, "b", "body_start", "k"),
            *lost,
            *end,
            Event(6, "b", "final", "k", state="LOST"),
        ]

    a = call("a", "k", 10, 1, 5)
    ran_on = check(a + tokenless(5, says_lost=False), [])
    assert ran_on.overlaps_unexplained == [("k", "a", "b")] and not ran_on.ok
    assert ran_on.admitted_lost == 0
    stalled = check(a + tokenless(5), [])  # said lost at once; its end recorded 3 s later
    assert stalled.ok and stalled.admitted_lost == 1, stalled.summary()
    before = call("a", "k", 10, 1, 1.9)
    stopped = check(before + tokenless(2.05), [])
    assert stopped.ok and stopped.admitted_lost == 1, stopped.summary()
    unended = check(before + tokenless(None), [])  # nothing shows that it stopped
    assert unended.token_inversions == [("k", "a", "b")] and not unended.ok
    silent = check(before + tokenless(2.05, says_lost=False), [])
    assert silent.token_inversions == [("k", "a", "b")] and not silent.ok


def test_a_clean_history_is_checked_without_judging_every_pair_of_holders(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Helper probe, round 4: every pair of a key's holders was judged, so 98,000 events
    (14,000 calls one after the other on 4 keys) took 15.8 s. Holders one after the other
    with increasing tokens need no pair judged: the overlap sweep stops at the next one."""
    judged = 0
    overlap = history._overlap

    def counted(a: Holding, b: Holding) -> bool:
        nonlocal judged
        judged += 1
        return overlap(a, b)

    monkeypatch.setattr(history, "_overlap", counted)
    events = [e for i in range(2000) for e in call(f"c{i}", f"k{i % 4}", 100 + i, i, i + 0.5)]
    verdict = check(events, [])
    assert verdict.ok, verdict.summary()
    assert judged == 0  # was 2000 * 1999 / 2 / 4 pairs
    inverted = events + call("late", "k0", 1, 3000, 3001)  # after every holder of k0
    found = check(inverted, []).token_inversions
    assert len(found) == 500 and found[0] == ("k0", "c0", "late")
    assert judged == 500
