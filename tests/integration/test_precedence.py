"""Configuration precedence against a real Redis: task option > app setting > default, with the
settings given in code or as Django-style ``CELERY_REDLOCK_*`` names.

The validation and resolution of options and settings, which need no Redis, are proved in
``tests/unit/test_config.py`` and ``tests/unit/test_django_settings.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_redlock import Lock, LockContended, LockedTask, current_lock
from celery_redlock import lock_key as lock_key_of
from support.apps import app_from


def test_task_policy_overrides_the_app_policy(redis_url: str) -> None:
    app = Celery("cfg", set_as_current=False)
    app.conf.update(redlock_url=redis_url, redlock_on_contention="fail")
    ran: list[str] = []

    @app.task(base=LockedTask, shared=False, lazy=False, name="proj.app_policy", lock_name="j")
    def app_policy(x: int) -> None:
        ran.append("app_policy")

    @app.task(
        base=LockedTask,
        shared=False,
        lazy=False,
        name="proj.task_policy",
        lock_name="j",
        lock_on_contention="skip",
    )
    def task_policy(x: int) -> None:
        ran.append("task_policy")

    assert lock_key_of(app_policy, 1) == lock_key_of(task_policy, 1)
    key = lock_key_of(app_policy, 1)
    holder = Lock(redis_url, key.removeprefix("redlock:{").removesuffix("}"), ttl=30)
    assert holder.key == key
    assert holder.acquire(blocking=False)
    try:
        skipped = task_policy.apply(args=(1,))
        failed = app_policy.apply(args=(1,))
    finally:
        holder.release()
        app.close()
    assert skipped.successful()
    assert isinstance(failed.result, LockContended)
    assert ran == []


def test_precedence_task_option_then_setting_then_default(
    settings_path: Any, redis_url: str
) -> None:
    path, module, _ = settings_path
    module.CELERY_REDLOCK_URL = redis_url
    module.CELERY_REDLOCK_LEASE = 12
    module.CELERY_REDLOCK_ON_CONTENTION = "fail"
    app = app_from(path)

    @app.task(base=LockedTask, shared=False, lazy=False, name="proj.by_setting", lock_by=())
    def by_setting() -> float:
        lock = current_lock()
        assert lock is not None
        return float(lock.ttl)

    @app.task(
        base=LockedTask,
        shared=False,
        lazy=False,
        name="proj.by_option",
        lock_by=(),
        lock_name="proj.by_setting",
        lock_on_contention="skip",
    )
    def by_option() -> str:
        return "ran"

    assert by_setting.apply().get() == 12.0  # the lease came from CELERY_REDLOCK_LEASE
    key = lock_key_of(by_setting)
    assert key == lock_key_of(by_option)
    holder = Lock(redis_url, key.removeprefix("redlock:{").removesuffix("}"), ttl=30)
    assert holder.acquire()
    try:
        with pytest.raises(LockContended):
            by_setting.apply().get()  # CELERY_REDLOCK_ON_CONTENTION="fail" over the default
        assert by_option.apply().get() is None  # the task option "skip" over the setting
    finally:
        holder.release()
        app.close()
