"""The fault run's history checker on crafted histories (chaos.history)."""

from __future__ import annotations

from chaos.history import Event, StoreWrite, Window, check, takeover_times


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
    writes = [StoreWrite(1, "k", 10, True), StoreWrite(2, "k", 11, True)]
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
    writes = [StoreWrite(1, "k", 11, True), StoreWrite(2, "k", 10, False)]
    verdict = check(events, writes)
    assert verdict.ok and verdict.rejected == 1
    stale = check(events, [StoreWrite(1, "k", 11, True), StoreWrite(2, "k", 10, True)])
    assert not stale.ok and [w.seq for w in stale.stale_accepted] == [2]
    again = check(events, [StoreWrite(1, "k", 11, True), StoreWrite(2, "k", 11, True)])
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
