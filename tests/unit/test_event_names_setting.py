"""``redlock_event_names``: the group of the Celery events of a contended task."""

from __future__ import annotations

import logging

import pytest
from celery import Celery

from celery_redlock import LockConfigError
from celery_redlock._celery.options import resolve


def app(**conf: object) -> Celery:
    a = Celery("t", set_as_current=False)
    a.conf.update(redlock_url="redis://127.0.0.1:1/0", **conf)
    return a


def test_the_default_is_the_redlock_group() -> None:
    assert resolve(app()).event_names == "redlock"


def test_the_old_names_are_deprecated_but_kept(caplog: pytest.LogCaptureFixture) -> None:
    deprecated = "redlock_event_names='task-lock' is deprecated"
    with (
        pytest.warns(DeprecationWarning, match=deprecated),
        caplog.at_level(logging.WARNING, logger="celery_redlock.config"),
    ):
        assert resolve(app(redlock_event_names="task-lock")).event_names == "task-lock"
    # Python hides a DeprecationWarning in a worker (outside __main__): the log line shows it.
    assert [r.levelno for r in caplog.records if deprecated in r.getMessage()] == [logging.WARNING]


def test_a_misspelled_value_names_the_setting_and_a_hint() -> None:
    with pytest.raises(LockConfigError, match=r"redlock_event_names.*did you mean 'task-lock'"):
        resolve(app(redlock_event_names="task_lock"))
