"""The docs cannot drift from the code: the options table is rendered from the one declaration,
every relative link points at a file and heading that exist, and every fenced block says its
language (so a Python block cannot escape ``tests/integration/test_readme.py``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from celery_redlock._celery.options import OPTIONS, SETTING_DEFAULTS, Option

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CONFIGURATION = ROOT / "docs" / "configuration.md"

#: The marker line right above the generated options table in docs/configuration.md.
MARKER = "<!-- task options: generated from celery_redlock._celery.options.OPTIONS -->"

#: The languages a fenced block may declare; only ``python`` blocks are executed.
LANGUAGES = {"python", "console", "text", "ini", "toml", "dockerfile"}


def render_options_table(options: dict[str, Option]) -> str:
    """The task options table of docs/configuration.md, one row per row of ``options``."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = [
        "| task option | `@single_instance` keyword | default | accepted values | description |",
        "|---|---|---|---|---|",
    ]
    for option in options.values():
        lines.append(
            f"| `{option.attr}` | `{option.name}` | `{option.default!r}` "
            f"| {cell(option.kind)} | {cell(option.doc)} |"
        )
    return "\n".join(lines)


def test_the_options_table_is_rendered_from_the_declaration() -> None:
    text = CONFIGURATION.read_text()
    assert text.count(MARKER) == 1, f"{CONFIGURATION.name} needs the line {MARKER!r} once"
    after = text.split(MARKER, 1)[1].lstrip("\n")
    table = after.split("\n\n", 1)[0].rstrip("\n")
    expected = render_options_table(OPTIONS)
    assert table == expected, (
        f"the options table of {CONFIGURATION.name} differs from OPTIONS; replace it with:\n\n"
        f"{expected}"
    )


def test_the_settings_table_lists_every_setting() -> None:
    text = CONFIGURATION.read_text()
    for setting in SETTING_DEFAULTS:
        assert re.search(rf"^\| `{setting}` \|", text, flags=re.M), f"{setting} has no row"


def _anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    return {_anchor(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


#: Links into the repository: what the README uses (it is the registry page, where a relative
#: link breaks), checked against this checkout like relative ones.
REPOSITORY_FILES = (
    re.search(r'^Homepage = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)  # type: ignore[union-attr]
    + "/blob/main/"
)


def _links(doc: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.S | re.M)
    return re.findall(r"\]\(([^)\s]+)\)", text)


def test_the_readme_links_are_absolute_urls_into_the_repository() -> None:
    links = _links(ROOT / "README.md")
    assert links
    relative = [t for t in links if not re.match(r"[a-z]+:", t)]
    assert not relative, f"README.md is the registry page: make these absolute: {relative}"
    assert any(t.startswith(REPOSITORY_FILES) for t in links)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_relative_links_point_at_existing_files_and_headings(doc: Path) -> None:
    for target in _links(doc):
        if target.startswith(REPOSITORY_FILES):
            path, _, anchor = target.removeprefix(REPOSITORY_FILES).partition("#")
            linked = ROOT / path
        elif re.match(r"[a-z]+:", target):
            continue
        else:
            path, _, anchor = target.partition("#")
            linked = (doc.parent / path).resolve() if path else doc
        assert linked.exists(), f"{doc.name}: link to missing {target}"
        if anchor:
            assert anchor in _anchors(linked), f"{doc.name}: no heading for {target}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_fenced_block_declares_its_language(doc: Path) -> None:
    fences = re.findall(r"^```(.*)$", doc.read_text(), flags=re.M)
    opening = fences[0::2]
    assert len(fences) % 2 == 0, f"{doc.name}: an unclosed code block"
    assert all(f == "" for f in fences[1::2]), f"{doc.name}: a closing fence with a language"
    unknown = [f for f in opening if f not in LANGUAGES]
    assert not unknown, f"{doc.name}: blocks without a known language: {unknown}"
