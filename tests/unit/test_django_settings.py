"""Django-style settings: ``CELERY_REDLOCK_*`` names read through
``app.config_from_object("proj.settings", namespace="CELERY")``, without installing Django.

A settings module is registered in ``sys.modules`` under a throwaway name, and read through a
lazy object like ``django.conf.settings`` (which Celery's Django integration passes as
``"django.conf:settings"``).
"""

from __future__ import annotations

import re
from typing import Any

import celery
import pytest

from celery_redlock import LockConfigError, LockedTask, lock_key
from celery_redlock._celery.options import settings_for
from support.apps import app_from


def test_celery_redlock_names_arrive(settings_path: Any) -> None:
    path, module, _ = settings_path
    module.CELERY_REDLOCK_URL = "redis://127.0.0.1:1/4"
    module.CELERY_REDLOCK_LEASE = 12
    module.CELERY_REDLOCK_ON_CONTENTION = "retry"
    module.CELERY_REDLOCK_ON_UNAVAILABLE = "fail"
    module.CELERY_REDLOCK_PREFIX = "myproj"
    module.CELERY_REDLOCK_TTL_MARGIN = 2
    settings = settings_for(app_from(path))
    assert (settings.url, settings.lease, settings.on_contention) == (
        "redis://127.0.0.1:1/4",
        12.0,
        "retry",
    )
    assert (settings.on_unavailable, settings.prefix, settings.ttl_margin) == (
        "fail",
        "myproj",
        2.0,
    )


def test_the_namespaced_name_wins_and_unprefixed_upper_case_is_ignored(
    settings_path: Any,
) -> None:
    path, module, _ = settings_path
    module.CELERY_REDLOCK_URL = "redis://127.0.0.1:1/4"
    module.REDLOCK_LEASE = 99  # not CELERY_-prefixed: another setting of the project, ignored
    module.CELERY_REDLOCK_ON_CONTENTION = "retry"
    module.redlock_on_contention = "fail"  # Celery's lower-case fallback, below the prefixed
    settings = settings_for(app_from(path))
    assert (settings.lease, settings.on_contention) == (30.0, "retry")


def test_settings_are_read_at_the_first_lock_operation_not_at_import(settings_path: Any) -> None:
    path, module, lazy = settings_path
    module.CELERY_REDLOCK_URL = "redis://127.0.0.1:1/4"
    app = app_from(path)

    @app.task(base=LockedTask, shared=False, name="proj.sync")
    def sync(account_id: int) -> None: ...

    assert lazy.reads == []  # a tasks module imported before Django is set up still works
    assert lock_key(sync, 1).startswith("redlock:{proj.sync:")
    assert "CELERY_REDLOCK_URL" in lazy.reads
    app.close()


def test_the_redis_broker_is_the_fallback_url(settings_path: Any) -> None:
    path, module, _ = settings_path
    module.CELERY_BROKER_URL = "redis://127.0.0.1:1/7"
    assert settings_for(app_from(path)).url == "redis://127.0.0.1:1/7"


@pytest.mark.skipif(
    tuple(map(int, celery.__version__.split(".")[:2])) < (5, 7),
    reason="Celery < 5.7 looks up CELERY_X in every layer before x: the module's value wins",
)
def test_app_conf_assigned_in_code_wins_over_the_settings_module(settings_path: Any) -> None:
    path, module, _ = settings_path
    module.CELERY_REDLOCK_URL = "redis://127.0.0.1:1/4"
    module.CELERY_REDLOCK_LEASE = 12
    app = app_from(path)
    app.conf.redlock_lease = 5
    assert settings_for(app).lease == 5.0


@pytest.mark.parametrize(
    ("name", "value", "named"),
    [
        ("CELERY_REDLOCK_LEASE", "ten", "setting CELERY_REDLOCK_LEASE='ten' is invalid"),
        # A number read from an environment variable (helper probe, round 3): say to write it.
        (
            "CELERY_REDLOCK_LEASE",
            "10",
            "and <= 315360000, not a string: write CELERY_REDLOCK_LEASE=10",
        ),
        ("CELERY_REDLOCK_URL", "http://x", "setting CELERY_REDLOCK_URL='http://x' is invalid"),
        ("CELERY_REDLOCK_ON_CONTENTION", "wiat", "setting CELERY_REDLOCK_ON_CONTENTION='wiat'"),
    ],
)
def test_an_invalid_setting_is_named_as_the_settings_module_spells_it(
    settings_path: Any, name: str, value: Any, named: str
) -> None:
    """Under ``namespace="CELERY"`` an error names ``CELERY_REDLOCK_LEASE``, the name a Django
    user wrote and can search for, not Celery's internal ``redlock_lease``."""
    path, module, _ = settings_path
    module.CELERY_REDLOCK_URL = "redis://127.0.0.1:1/4"
    setattr(module, name, value)
    with pytest.raises(LockConfigError, match=re.escape(named)):
        settings_for(app_from(path))
