"""The "classic fixtures" recipe of docs/testing.md, run as written by pytester.

A user's ``conftest.py`` is the recipe's loading block plus its fixtures block, and the test
module is its test block, verbatim: Celery's in-process ``celery_app`` and ``celery_worker``
(a real worker, threads pool) with our plugin's throwaway Redis as broker, result backend and
lock store. It runs both ways the docs describe: with pytest-celery 1.x enabled (which shadows
the in-process ``celery_worker``, taken back by the recipe's import) and without it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

TESTING = (Path(__file__).resolve().parents[2] / "docs" / "testing.md").read_text()
BLOCKS = re.findall(r"^```python\n(.*?)^```", TESTING, flags=re.S | re.M)


def block_with(text: str) -> str:
    (block,) = [b for b in BLOCKS if text in b]
    return block


WITH_PYTEST_CELERY = block_with("from celery.contrib.pytest import celery_worker")
WITHOUT_PYTEST_CELERY = block_with('pytest_plugins = ["celery.contrib.pytest",')
FIXTURES = block_with("def celery_config(redlock_url)")
TEST = block_with("def test_a_duplicate_is_skipped(celery_app, celery_worker, lock_events)")

#: The ``filterwarnings`` of docs/testing.md's "Warnings as errors" block, as the recipe runs.
(WARNINGS,) = re.findall(r"^```toml\n(.*?)^```", TESTING, flags=re.S | re.M)
IGNORES = re.findall(r'^    "(ignore:.*)",$', WARNINGS, flags=re.M)

INI = "[pytest]\naddopts = -p no:cacheprovider {flags}\nfilterwarnings =\n    error\n" + "".join(
    f"    {ignore}\n" for ignore in IGNORES
)


def test_the_docs_list_the_warnings_the_recipe_ignores() -> None:
    assert len(IGNORES) == 4  # the block is read: the recipe runs with what users copy
    assert '"error",' in WARNINGS


@pytest.mark.parametrize(
    ("loading", "flags"),
    [
        pytest.param(WITH_PYTEST_CELERY, "", id="pytest-celery enabled"),
        pytest.param(WITHOUT_PYTEST_CELERY, "-p no:celery", id="without pytest-celery"),
    ],
)
def test_the_classic_fixtures_recipe(pytester: pytest.Pytester, loading: str, flags: str) -> None:
    if not flags:
        pytest.importorskip("pytest_celery")
    pytester.makeini(INI.format(flags=flags))
    pytester.makeconftest(loading + "\n" + FIXTURES)
    pytester.makepyfile(test_tasks=TEST)
    result = pytester.runpytest_subprocess("-q", timeout=60)
    result.assert_outcomes(passed=1)


def test_with_pytest_celery_its_worker_shadows_the_in_process_one(
    pytester: pytest.Pytester,
) -> None:
    """Why the recipe imports ``celery_worker``: without it, pytest-celery's Docker worker."""
    pytest.importorskip("pytest_celery")
    pytester.makeini(INI.format(flags=""))
    pytester.makeconftest(FIXTURES)
    pytester.makepyfile(
        test_which="""
        def test_which(request):
            # pytest has no public lookup of the fixture a name resolves to
            definitions = request._fixturemanager.getfixturedefs("celery_worker", request.node)
            assert definitions[-1].func.__module__ == "pytest_celery.fixtures.worker"
        """
    )
    result = pytester.runpytest_subprocess("-q", timeout=60)
    result.assert_outcomes(passed=1)


def test_without_the_import_a_docker_failure_names_the_fix(pytester: pytest.Pytester) -> None:
    """Beat probe, session 30: the recipe without its ``celery_worker`` import, pytest-celery
    enabled and no Docker here: each test erred with a bare ``DockerException``. The report
    now names the import."""
    pytest.importorskip("pytest_celery")
    if os.path.exists("/var/run/docker.sock"):
        pytest.skip("needs a machine without Docker (pytest-celery would start its container)")
    pytester.makeini(INI.format(flags=""))
    conftest = WITH_PYTEST_CELERY.replace(
        "from celery.contrib.pytest import celery_worker  # noqa: F401  (the in-process worker)\n",
        "",
    )
    assert "import celery_worker" not in conftest
    pytester.makeconftest(conftest + "\n" + FIXTURES)
    pytester.makepyfile(test_recipe=TEST)
    result = pytester.runpytest_subprocess("-q", timeout=120)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "*DockerException*",
            "*celery-redlock*",
            "*from celery.contrib.pytest import celery_worker*",
        ]
    )
