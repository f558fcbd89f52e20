"""The sdist and the wheel built from this checkout, as the registry would receive them.

``python -m build`` makes the sdist, then the wheel from the unpacked sdist (so the sdist is
complete enough to build), in an isolated environment whose setuptools is pinned to the floor
that ``[build-system] requires`` names: the floor must be able to build the project. Then both
archives are opened: the license notice and its metadata, the project URLs, a long description
(the README) whose links work on the registry page, the files a source user needs (docs,
CHANGELOG, tests and what they import), and a ``.dev`` version while the CHANGELOG's top section
is ``[Unreleased]``.
"""

from __future__ import annotations

import email
import email.message
import importlib.metadata
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from support import ROOT

try:  # the distribution, not a module: a stray build/ directory in the checkout imports too
    importlib.metadata.version("build")
except importlib.metadata.PackageNotFoundError:
    pytest.skip("building needs the dev extra (pip install -e '.[dev]')", allow_module_level=True)

PYPROJECT = (ROOT / "pyproject.toml").read_text()
#: The repository every absolute link of the long description points into.
HOMEPAGE = re.search(r'^Homepage = "([^"]+)"', PYPROJECT, re.M).group(1)  # type: ignore[union-attr]
URLS = dict(re.findall(r'^(\w+) = "(https://[^"]+)"', PYPROJECT.split("[project.urls]")[1], re.M))


def setuptools_floor() -> str:
    """The version in ``requires = ["setuptools>=X"]``."""
    match = re.search(r'^requires = \["setuptools>=([\d.]+)"\]', PYPROJECT, re.M)
    assert match, "[build-system] requires names no setuptools floor"
    return match.group(1)


@dataclass(frozen=True)
class Built:
    sdist: tarfile.TarFile
    wheel: zipfile.ZipFile
    sdist_root: str
    metadata: email.message.Message
    pkg_info: email.message.Message

    def sdist_names(self) -> set[str]:
        return {n.removeprefix(self.sdist_root + "/") for n in self.sdist.getnames()}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    out = tmp_path_factory.mktemp("dist")
    constraint = out / "constraints.txt"
    floor = setuptools_floor()  # its first release line: 77 -> the newest 77.x
    constraint.write_text(f"setuptools>={floor},<{int(floor.split('.')[0]) + 1}\n")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        env={**os.environ, "PIP_CONSTRAINT": str(constraint)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (sdist_path,) = out.glob("*.tar.gz")
    (wheel_path,) = out.glob("*.whl")
    with tarfile.open(sdist_path) as sdist, zipfile.ZipFile(wheel_path) as wheel:
        root = sdist.getnames()[0].split("/")[0]
        (metadata_name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = email.message_from_bytes(wheel.read(metadata_name))
        pkg_info_file = sdist.extractfile(f"{root}/PKG-INFO")
        assert pkg_info_file is not None
        pkg_info = email.message_from_bytes(pkg_info_file.read())
        yield Built(sdist, wheel, root, metadata, pkg_info)


def test_the_license_notice_ships_in_both(built: Built) -> None:
    notice = (ROOT / "LICENSE").read_text()
    assert notice.startswith("MIT License")
    licenses = [n for n in built.wheel.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
    assert len(licenses) == 1, built.wheel.namelist()
    assert built.wheel.read(licenses[0]).decode() == notice
    assert "LICENSE" in built.sdist_names()
    for metadata in (built.metadata, built.pkg_info):
        assert metadata["License-Expression"] == "MIT"
        assert metadata.get_all("License-File") == ["LICENSE"]


def test_the_project_urls_are_declared(built: Built) -> None:
    assert set(URLS) == {"Homepage", "Documentation", "Changelog", "Issues"}
    declared = dict(u.split(", ", 1) for u in built.metadata.get_all("Project-URL") or [])
    assert declared == URLS
    assert all(u.startswith(HOMEPAGE) for u in URLS.values())


def test_the_long_description_has_no_relative_links(built: Built) -> None:
    description = built.metadata.get_payload()
    assert isinstance(description, str)
    assert built.metadata["Description-Content-Type"] == "text/markdown"
    assert description.startswith("# celery-redlock")
    targets = re.findall(
        r"\]\(([^)\s]+)\)", re.sub(r"^```.*?^```", "", description, flags=re.S | re.M)
    )
    assert targets, "the README links to its docs"
    relative = [t for t in targets if not re.match(r"(https?:|mailto:|#)", t)]
    assert not relative, f"relative links break on the registry page: {relative}"


def test_the_sdist_has_docs_changelog_tests_and_what_they_import(built: Built) -> None:
    names = built.sdist_names()
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.split()
    wanted = [
        n
        for n in tracked
        if n.split("/")[0] in {"docs", "tests", "support", "example_project", "chaos", "benchmarks"}
        or n in {"CHANGELOG.md", "LICENSE", "README.md", "Makefile", "noxfile.py"}
    ] or ["docs/guide.md", "CHANGELOG.md", "tests/conftest.py", "support/__init__.py"]
    missing = sorted(set(wanted) - names)
    assert not missing, f"not in the sdist: {missing}"
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_the_wheel_holds_the_package_only(built: Built) -> None:
    tops = {n.split("/")[0] for n in built.wheel.namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"celery_redlock"}
    assert "celery_redlock/py.typed" in built.wheel.namelist()


def test_the_version_is_a_dev_version_under_unreleased(built: Built) -> None:
    import celery_redlock

    version = built.metadata["Version"]
    assert version == celery_redlock.__version__ == built.pkg_info["Version"]
    assert re.fullmatch(r"\d+\.\d+\.\d+\.dev\d+", version), version
    changelog = (ROOT / "CHANGELOG.md").read_text()
    sections = re.findall(r"^## \[([^\]]+)\]", changelog, re.M)
    assert sections[0] == "Unreleased"
    released = [tuple(map(int, s.split("."))) for s in sections[1:]]
    upcoming = tuple(map(int, version.split(".dev")[0].split(".")))
    assert all(upcoming > r for r in released), (version, sections)


def test_the_dev_tools_are_not_in_the_test_extra(built: Built) -> None:
    requires = built.metadata.get_all("Requires-Dist") or []
    test_extra = [r for r in requires if re.search(r"""extra\s*==\s*["']test["']""", r)]
    dev_extra = [r for r in requires if re.search(r"""extra\s*==\s*["']dev["']""", r)]
    assert test_extra and dev_extra
    tools = re.compile(r"^(ruff|mypy|nox|build)\b")
    assert not [r for r in test_extra if tools.match(r)], test_extra
    assert {m.group(1) for r in dev_extra if (m := tools.match(r))} == {
        "ruff",
        "mypy",
        "nox",
        "build",
    }
