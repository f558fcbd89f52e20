"""``celery redlock --help`` and docs/operations.md say the same (issue 24, item 10): how to
give the app, what ``ls --json`` prints, what FENCE ``-`` means."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from celery_redlock.cli import redlock
from celery_redlock.cli._commands import JSON_HELP
from support import ROOT

GUIDE = Path(ROOT, "docs", "operations.md").read_text()


def _help(*args: str) -> str:
    done = CliRunner().invoke(redlock, [*args, "--help"], terminal_width=100)
    assert done.exit_code == 0, done.output
    return " ".join(done.output.split())


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_the_group_help_shows_how_to_give_the_app() -> None:
    assert "celery -A yourproject redlock ls" in _help()
    assert "celery -A yourproject redlock ..." in GUIDE


def test_ls_json_is_described_alike_in_help_and_docs() -> None:
    assert _flat(JSON_HELP) in _help("ls")
    assert f"`ls --json`: {_flat(JSON_HELP)}" in _flat(GUIDE)


def test_fence_dash_is_explained_in_help_and_docs() -> None:
    assert '"-" for a one-server lock, which stores none' in _help("ls")
    assert "**FENCE** is the lock's fencing counter. It is `-` for a lock on one Redis" in _flat(
        GUIDE
    )


def test_the_docs_list_warm_shutdown_among_the_look_dead_cases() -> None:
    assert "a worker in **warm shutdown**" in _flat(GUIDE)
