"""What the documentation site is built from, beyond its examples (test_docs_examples.py).

The docs home (docs/index.md) and the README share their pitch and extras table: the home
includes README.md's marked sections (pymdownx.snippets, as ``mkdocs build`` renders it), so
they cannot drift. These tests fail if the inclusion is dropped, a section loses its
markers, a shared link would break on one side, or the extras table leaves out an extra of
pyproject.toml. And code blocks and API signatures wrap at the page's edge (the site's CSS)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
README = ROOT / "README.md"
HOME = ROOT / "docs" / "index.md"
SECTIONS = ("pitch", "extras")
REF_USE = re.compile(r"\]\[([^\]]+)\]")
REF_DEF = re.compile(r"^\[([^\]]+)\]:\s*(\S+)\s*$", re.M)


def section(name: str) -> str:
    text = README.read_text()
    start = re.findall(rf"^.*--8<-- \[start:{name}\].*$", text, re.M)
    end = re.findall(rf"^.*--8<-- \[end:{name}\].*$", text, re.M)
    assert len(start) == len(end) == 1, f"README.md must mark section {name!r} once"
    return text.split(start[0], 1)[1].split(end[0], 1)[0]


@pytest.mark.parametrize("name", SECTIONS)
def test_the_home_includes_the_readme_section(name: str) -> None:
    assert f'--8<-- "README.md:{name}"' in HOME.read_text().splitlines()
    assert section(name).strip()


def test_the_snippets_extension_is_on() -> None:
    mkdocs = (ROOT / "mkdocs.yml").read_text()
    assert re.search(r"^  - pymdownx\.snippets:\n      base_path: \[\"\.\"\]\n      check_paths: true$", mkdocs, re.M)


@pytest.mark.parametrize("name", SECTIONS)
def test_shared_links_resolve_from_both_files(name: str) -> None:
    """An inline relative link would point at docs/x.md from the README and at docs/docs/x.md
    from the home: shared sections use reference links, which each file defines for itself."""
    text = section(name)
    inline = [m for m in re.findall(r"\]\(([^)]+)\)", text) if not m.startswith(("http://", "https://"))]
    assert not inline, f"relative inline links in README section {name!r}: {inline}"
    for path in (README, HOME):
        defined = dict(REF_DEF.findall(path.read_text()))
        for ref in REF_USE.findall(text):
            assert ref in defined, f"{path.name} does not define [{ref}]"
            target, _, anchor = defined[ref].partition("#")
            file = path.parent / target
            assert file.is_file(), f"[{ref}] in {path.name} points at {file}, which does not exist"
            if anchor:
                headings = [re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                            for h in re.findall(r"^#+ (.*)$", file.read_text(), re.M)]
                assert anchor in headings, f"[{ref}]: no heading #{anchor} in {target}"


def test_the_extras_table_lists_every_extra() -> None:
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    rows = re.findall(r"^\| `([a-z-]+)` \| `'redcount\[([a-z-]+)\]'` \|", section("extras"), re.M)
    assert all(a == b for a, b in rows), rows
    assert {a for a, _ in rows} == extras


def test_code_and_signatures_wrap_at_the_page_edge() -> None:
    """Signatures are one line (no formatter) and examples keep comments beside the code:
    without the site's CSS both run off the right edge behind a scroll bar."""
    mkdocs = (ROOT / "mkdocs.yml").read_text()
    assert re.search(r"^extra_css:\n  - stylesheets/extra\.css$", mkdocs, re.M)
    css = (ROOT / "docs" / "stylesheets" / "extra.css").read_text()
    rule = re.search(r"\.md-typeset pre > code \{([^}]*)\}", css)
    assert rule is not None and "white-space: pre-wrap;" in rule.group(1)
