"""Durations the companions send to Redis in whole milliseconds refuse sub-millisecond values
(issue 22 item 13), naming the task and the option, at decoration and per call."""

from __future__ import annotations

import logging

import pytest
from celery import Celery

from celery_redlock import LockConfigError, LockedTask, single_instance


@pytest.mark.parametrize("option", ["lock_debounce", "lock_ttl", "lock_enqueue_ttl"])
def test_sub_millisecond_durations_are_refused_naming_task_and_option(option: str) -> None:
    """0.0004 s would be sent as 0 ms (an error reply at every run, or no debounce at all)."""
    app = Celery("submillisecond", set_as_current=False)
    expected = rf"proj.tiny: option {option}=0.0004 is invalid; expected .*at least 0\.001"
    with pytest.raises(LockConfigError, match=expected):

        @app.task(base=LockedTask, shared=False, lazy=False, name="proj.tiny", **{option: 0.0004})
        def tiny() -> None: ...

    keyword = option.removeprefix("lock_")
    with pytest.raises(LockConfigError, match=rf"keyword {keyword}=0.0004 is invalid"):

        @app.task(shared=False, name="proj.decorated")
        @single_instance(**{keyword: 0.0004})
        def decorated() -> None: ...

    @app.task(base=LockedTask, shared=False, lazy=False, name="proj.fine")
    def fine() -> None: ...

    with pytest.raises(LockConfigError, match=r"proj.fine: option lock_ttl=0.0004 is invalid"):
        fine.apply_async(lock_ttl=0.0004)  # per call, before anything is published
    app.close()


def test_a_per_call_option_on_a_task_without_a_lock_is_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``base=LockedTask`` forgotten: ``apply_async(lock_on_contention="wait")`` was published
    with the option as a message property nothing reads, without a word. A warning, once per
    task, not an error: a group or chord hands its options to every part (a chord's body too)."""
    app = Celery("unlocked", broker="memory://", set_as_current=False)  # nothing leaves

    @app.task(shared=False, name="proj.plain")
    def plain(account_id: int) -> None: ...

    with caplog.at_level(logging.WARNING, logger="celery_redlock.config"):
        plain.apply_async((1,), lock_ttl=5, lock_on_contention="wait")
        plain.s(2).apply_async(lock_bypass=True)
    warnings = [r.getMessage() for r in caplog.records if r.name == "celery_redlock.config"]
    assert warnings == [
        "task proj.plain takes no lock, so the per-call option lock_on_contention, lock_ttl is "
        "ignored (a task with base=LockedTask or @single_instance reads it; a group or chord "
        "passes its options to every part, a published chain to its first step)"
    ]
    app.close()
