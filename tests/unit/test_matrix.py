"""Every Python and system the classifiers declare and every Redis line the README claims is
run by CI.

Read from the files, not run: ``.ci/run`` runs ``make`` targets, the Makefile's targets run nox
sessions, ``noxfile.py`` gives each session its Python and its Redis server; the README's
"Tested" paragraph names the targets. A classifier, a claimed Redis line or a target that CI
does not reach fails here.
"""

from __future__ import annotations

import re

from support import ROOT

PYPROJECT = (ROOT / "pyproject.toml").read_text()
README = (ROOT / "README.md").read_text()
NOXFILE = (ROOT / "noxfile.py").read_text()


def ci_targets() -> list[str]:
    """The ``make`` targets ``.ci/run`` runs, in order (as a step, or beside the next one)."""
    text = (ROOT / ".ci" / "run").read_text()
    return re.findall(r"^(?:step|beside) (?:env .+ )?make ([\w.-]+)$", text, re.M)


def make_recipe(target: str) -> str:
    text = (ROOT / "Makefile").read_text()
    match = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", text, re.M)
    assert match, f"the Makefile has no target {target}"
    return match.group(1)


def nox_sessions_run_by_ci() -> set[str]:
    sessions: set[str] = set()
    for target in ci_targets():
        for line in re.findall(r"\$\(NOX\) -s (.+)", make_recipe(target)):
            sessions.update(line.split())
    return sessions


def test_ci_runs_the_readme_commands_and_the_matrix() -> None:
    targets = ci_targets()
    assert targets[0] == "test"  # the README's command: lint and the whole suite
    named = set(re.findall(r"\(`make ([\w.-]+)`\)", README.split("**Tested**")[1]))
    assert named and named <= set(targets), (named, targets)


def test_the_declared_operating_systems_are_the_one_ci_runs_on() -> None:
    # macOS is "expected to work, not run here" in the README: it is not a classifier.
    declared = re.findall(r'"Operating System :: ([^"]+)"', PYPROJECT)
    assert declared == ["POSIX :: Linux"]
    assert "macOS (pool-child liveness" in README


def test_every_declared_python_is_run_by_ci() -> None:
    declared = set(re.findall(r'"Programming Language :: Python :: (3\.\d+)"', PYPROJECT))
    assert declared == {"3.10", "3.11", "3.12", "3.13"}
    assert re.search(r'^requires-python = ">=3\.10"$', PYPROJECT, re.M)
    sessions = nox_sessions_run_by_ci()
    versions = {s.removeprefix("newest-") for s in sessions if s.startswith("newest-")}
    lowest = re.search(r'^LOWEST_PYTHON = "(3\.\d+)"$', NOXFILE, re.M)
    assert lowest and "lowest" in sessions
    running = versions | {lowest.group(1)}
    # make test runs this interpreter's .venv: Python 3.11 on the CI machine (see .ci/run).
    assert declared - running <= {"3.11"}, f"declared but not run by CI: {declared - running}"
    assert lowest.group(1) == min(declared, key=lambda v: tuple(map(int, v.split("."))))


def test_every_claimed_redis_line_is_run_by_ci() -> None:
    claimed = re.search(r"a Redis\s+server of the ([\d.]+) or ([\d.]+) line", README)
    assert claimed, "the README names the Redis lines it supports"
    assert set(claimed.groups()) == {"6.2", "7.0"}
    assert "redis-6.2" in nox_sessions_run_by_ci()
    assert '" v=6.2." not in version' in NOXFILE  # the session checks the server it was given
    assert "5.0 or newer" not in README


def _version(text: str) -> tuple[int, ...]:
    parts = tuple(map(int, text.split(".")))
    return parts + (0,) * (3 - len(parts))


def test_ci_runs_the_floors_pyproject_accepts_on_the_newest_python_too() -> None:
    """The floors differ by Python (kombu 5.3.3 from 3.12 on): the lowest-3.13 session pins
    exactly what pyproject.toml accepts on 3.13, and CI runs it."""
    block = re.search(r"^dependencies = \[\n(.*?)^\]", PYPROJECT, re.M | re.S)
    assert block
    floors: dict[str, tuple[int, ...]] = {}
    for name, floor, marker in re.findall(
        r'^\s+"(\w+)>=([\d.]+)(?:; python_version >= \'(3\.\d+)\')?",?$', block.group(1), re.M
    ):
        if not marker or _version(marker) <= _version("3.13"):
            floors[name] = max(floors.get(name, ()), _version(floor))
    pins = re.search(r"^LOWEST_ON_NEWEST_PYTHON = \[(.*)\]$", NOXFILE, re.M)
    assert pins
    pinned = {name: _version(v) for name, v in re.findall(r'"(\w+)==([\d.]+)"', pins.group(1))}
    assert pinned == floors == {"celery": (5, 3, 0), "kombu": (5, 3, 3), "redis": (5, 0, 8)}
    assert re.search(r'^LOWEST_NEWEST_PYTHON = "3\.13"$', NOXFILE, re.M)
    assert "lowest-3.13" in nox_sessions_run_by_ci()
