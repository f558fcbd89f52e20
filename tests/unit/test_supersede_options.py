"""``lock_enqueue="replace"``, ``lock_debounce`` and ``lock_debounce_max``: accepted by both APIs,
and the mixes a debounce cannot honour refused at registration. No Redis is contacted."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

import celery_redlock
from celery_redlock import LockConfigError, LockedTask, single_instance
from celery_redlock._celery.identity import spec_of
from celery_redlock._celery.options import supersedes


def work(doc: str) -> None: ...


@pytest.mark.parametrize(
    "options",
    [{"enqueue": "replace"}, {"debounce": 0.5}, {"debounce": 0.5, "debounce_max": 2}],
)
def test_both_apis_accept_replace_and_debounce(options: dict[str, Any]) -> None:
    app = Celery("supersede", set_as_current=False)
    lock_options = {f"lock_{name}": value for name, value in options.items()}
    by_class = app.task(base=LockedTask, shared=False, name="a", **lock_options)(work)
    by_decorator = app.task(shared=False, name="b")(single_instance(**options)(work))
    for task in (by_class, by_decorator):
        spec = spec_of(task)
        assert spec is not None and supersedes(spec.options)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"debounce_max": 2}, "lock_debounce_max=2.0 is invalid"),
        ({"debounce_max": 2}, "without a lock_debounce, which it caps: set lock_debounce too"),
        ({"debounce": 3, "debounce_max": 2}, "None or >= lock_debounce (which is 3.0)"),
        ({"debounce": 1, "enqueue": "keep"}, "expected lock_enqueue=False or 'replace'"),
        ({"debounce": 1, "enqueue": "replce"}, "did you mean 'replace'?"),
    ],
)
def test_mixes_a_debounce_cannot_honour_are_refused(options: dict[str, Any], expected: str) -> None:
    if options.get("enqueue") != "keep":  # which the decorator refuses on its own (below)
        keywords = expected.replace("lock_", "")  # the decorator's messages name its keywords
        with pytest.raises(LockConfigError, match=re.escape(keywords)):
            single_instance(**options)(work)
    with pytest.raises(LockConfigError, match=re.escape(expected)):
        lock_options = {f"lock_{name}": value for name, value in options.items()}
        type("Debounced", (LockedTask,), lock_options)


def test_keep_is_still_refused_by_the_decorator() -> None:
    for value in (True, "keep"):
        with pytest.raises(LockConfigError, match="base=LockedTask"):
            single_instance(enqueue=value)(work)


def test_the_celery_layer_uses_no_private_python_or_celery_internals() -> None:
    """No private CPython JSON encoder, no stack-frame walk into Celery (issue 19, item 4):
    each can break on any release. The canonical JSON comes from the public encoder, the
    publishing task from the router (``routing.routed_task``)."""
    package = Path(celery_redlock.__file__).parent / "_celery"
    text = {path.name: path.read_text() for path in package.glob("*.py")}
    for forbidden in ("c_make_encoder", "_getframe", "f_locals", "__code__"):
        assert not [name for name, source in text.items() if forbidden in source], forbidden
