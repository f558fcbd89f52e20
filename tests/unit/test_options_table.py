"""The options table is the one declaration: both APIs take exactly its rows, and the
combinations of options and settings that cannot work are refused when the app finalizes.

No Redis is contacted: the URLs name free-looking ports that are never connected to.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_redlock import LockConfigError, LockedTask, single_instance
from celery_redlock._celery.options import OPTIONS, SETTINGS
from celery_redlock._celery.wiring import check_app
from celery_redlock.decorators import InstanceOptions

QUORUM = [f"redis://127.0.0.1:{port}/0" for port in (1, 2, 3)]


def test_decorator_keywords_are_the_rows_of_the_options_table() -> None:
    assert list(InstanceOptions.__annotations__) == list(OPTIONS)


@pytest.mark.parametrize("name", list(OPTIONS))
def test_locked_task_has_each_option_with_its_default(name: str) -> None:
    option = OPTIONS[name]
    assert option.attr == f"lock_{name}"
    assert getattr(LockedTask, option.attr) == option.default


@pytest.mark.parametrize("mode", [True, "keep", "until_executed"])
def test_enqueue_on_the_decorator_is_refused_at_decoration_naming_the_alternative(
    mode: bool | str,
) -> None:
    def work(key: str) -> None: ...

    with pytest.raises(LockConfigError) as info:
        single_instance(enqueue=mode)(work)  # type: ignore[arg-type]
    message = str(info.value)
    assert f"enqueue={mode!r}" in message and "work" in message
    assert f"expected base=LockedTask with lock_enqueue={mode!r} " in message


@pytest.fixture
def quorum_app() -> Iterator[Celery]:
    app = Celery("crosscheck", set_as_current=False)
    app.conf.redlock_url = QUORUM
    yield app
    app.close()


def _limited_task(app: Celery) -> Any:
    # shared=False: a shared task would be built again by every app finalized later.
    @app.task(base=LockedTask, shared=False, lock_limit=2)
    def limited(key: str) -> None: ...

    return limited


def test_lock_limit_over_a_quorum_is_refused_when_the_app_finalizes(quorum_app: Celery) -> None:
    _limited_task(quorum_app)
    with pytest.raises(LockConfigError) as info:
        quorum_app.finalize()
    message = str(info.value)
    assert "limited" in message  # the task ...
    assert "lock_limit=2" in message  # ... and the option
    assert "quorum" in message


def test_lock_limit_over_a_quorum_is_refused_at_the_first_tasks_access(quorum_app: Celery) -> None:
    _limited_task(quorum_app)
    with pytest.raises(LockConfigError, match=r"limited.*lock_limit=2"):
        _ = quorum_app.tasks


@pytest.mark.parametrize(("keyword", "value"), [("limit", 2), ("rate", "1/s")])
def test_a_single_instance_keyword_over_a_quorum_is_named_as_written(
    quorum_app: Celery, keyword: str, value: object
) -> None:
    """The worker's start refused ``@single_instance(rate="1/s")`` over a quorum naming
    ``lock_rate``, an option its user never wrote."""

    @quorum_app.task(shared=False, name="crosscheck.decorated")
    @single_instance(**{keyword: value})  # type: ignore[arg-type]
    def decorated(key: str) -> None: ...

    with pytest.raises(LockConfigError) as info:
        check_app(quorum_app)
    message = str(info.value)
    assert f"@single_instance keyword {keyword}=" in message, message
    assert "is invalid with a Redlock quorum" in message
    assert f"lock_{keyword}" not in message


def test_lock_limit_over_one_node_and_limit_one_over_a_quorum_are_accepted() -> None:
    one_node = Celery("one", set_as_current=False)
    one_node.conf.redlock_url = QUORUM[0]
    quorum = Celery("quorum", set_as_current=False)
    quorum.conf.redlock_url = QUORUM
    _limited_task(one_node)

    @quorum.task(base=LockedTask, shared=False)
    def exclusive(key: str) -> None: ...

    one_node.finalize()
    quorum.finalize()
    assert "tests.unit.test_options_table.limited" in one_node.tasks
    one_node.close()
    quorum.close()


#: The marker line right above the generated settings table in docs/configuration.md.
SETTINGS_MARKER = "<!-- app settings: generated from celery_redlock._celery.options.SETTINGS -->"
CONFIGURATION = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def render_settings_table() -> str:
    """The app settings table of docs/configuration.md, one row per row of SETTINGS."""
    lines = ["| setting | default | accepted values | meaning |", "|---|---|---|---|"]
    for setting in SETTINGS.values():
        cells = (f"`{setting.key}`", setting.shown, setting.kind, setting.doc)
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def test_the_settings_table_is_rendered_from_the_declaration() -> None:
    text = CONFIGURATION.read_text()
    assert text.count(SETTINGS_MARKER) == 1, f"configuration.md needs {SETTINGS_MARKER!r} once"
    table = text.split(SETTINGS_MARKER, 1)[1].lstrip("\n").split("\n\n", 1)[0]
    expected = render_settings_table()
    assert table == expected, f"the settings table differs from SETTINGS; use:\n\n{expected}"


def test_each_setting_has_one_row_and_is_a_field_of_the_resolved_settings() -> None:
    table = render_settings_table()
    assert [line.split("`")[1] for line in table.splitlines()[2:]] == list(SETTINGS)
    assert len(set(SETTINGS)) == len(SETTINGS)  # redlock_key_secret was listed twice once
