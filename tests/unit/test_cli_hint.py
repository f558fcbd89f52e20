"""The command a hint of ``celery redlock`` gives to paste (``release NAME`` names the
``inspect`` that lists the keys): it must reach the same locks as the command the operator ran,
so it repeats the Celery options that choose the app and its settings, never a password."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import pytest
from celery.bin.celery import celery

from celery_redlock.cli import redlock
from celery_redlock.cli._group import command_line

APP = "tests.unit.hint_app"


def _hint(*argv: str) -> str:
    """The hint of ``celery <argv> redlock ...``, parsed as Celery's own entry point parses
    ``sys.argv`` (Celery 5.3 keeps the loaded app, not the name, so it is read from there)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", ["celery", *argv, "redlock", "release", "x"])
        root = celery.make_context("celery", [*argv, "redlock"], auto_envvar_prefix="CELERY")
        group = click.Context(redlock, parent=root, info_name="redlock")
        return command_line(group, "inspect", "a b")


def test_the_hint_repeats_the_app_and_the_options_typed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workdir = tmp_path / "x y"
    workdir.mkdir()
    monkeypatch.chdir(tmp_path)  # --workdir changes into it: back after the test
    typed = ["-b", "redis://u:pw@h:1/0", "--config", "settings", "--workdir", str(workdir)]
    assert _hint("-A", APP, *typed) == (
        f"celery -A {APP} -b 'redis://***@h:1/0' --config settings --workdir '{workdir}' "
        "redlock inspect 'a b'"
    )


def test_the_hint_leaves_out_what_the_environment_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("BROKER_URL", "CELERY_BROKER_URL"):  # by Celery's envvar, or click's prefix
        monkeypatch.setenv(name, "redis://h:1/0")
    assert _hint("-A", APP) == f"celery -A {APP} redlock inspect 'a b'"


def test_without_an_app_the_hint_says_yourproject() -> None:
    assert _hint() == "celery -A yourproject redlock inspect 'a b'"
