"""The API reference (docs/reference, rendered by mkdocstrings) links every cross-reference and
documents every public name.

Docstrings are Markdown: a cross-reference is ``[`connect`][redcount.store.connect]``, the
syntax mkdocstrings and autorefs resolve (``mkdocs build --strict`` fails on one they cannot).
A Sphinx role (``:func:`connect```) is not understood and shows on the page as literal text,
so none may appear in a docstring or on a reference page. This is checked three ways: the
docstrings of the package and its stub are scanned; the site is built (strict) and its reference pages are scanned; and every name in the
``__all__`` of every public module must have an entry on those pages, as must every public
member of the extension's classes (``Store.nodes``...), whose docstrings live in _core.pyi.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import griffe  # comes with mkdocstrings[python], a test dependency
import pytest

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
PACKAGE = ROOT / "python" / "redcount"
# Sphinx roles: :func:`x`, :py:meth:`x`, and the others of the Python domain.
ROLE = re.compile(r":(?:py:)?(?:func|meth|class|attr|mod|exc|data|obj|const|type):`")
# The same on a rendered page, where the backticks have become a <code> element.
HTML_ROLE = re.compile(r":(?:py:)?(?:func|meth|class|attr|mod|exc|data|obj|const|type):(?:`|<code>)")
# Sphinx's field lists (:param x:, :returns:...): the Google style's sections are what renders.
FIELD = re.compile(r"^\s*:(?:param|parameter|arg|argument|key|keyword|type|raises?|except|exception|returns?|rtype|yields?|var|ivar|cvar)\b[^:`]*:")
# A Markdown cross-reference that was not turned into a link (in a code block, say).
HTML_LITERAL_REF = re.compile(r"\]\[redcount[.\]]")
# Not in the reference: the command's tools are not public API.
HIDDEN = ("redcount.tools",)


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py")) + sorted(PACKAGE.rglob("*.pyi"))


def _docstrings(path: Path) -> list[ast.Expr]:
    """Every string that stands alone as a statement: module, class, function and attribute
    docstrings (griffe reads all of them)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    ]


def test_no_sphinx_role_in_a_docstring() -> None:
    found = []
    for path in _sources():
        for node in _docstrings(path):
            for offset, line in enumerate(str(node.value.value).splitlines()):
                if ROLE.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno + offset}: {line.strip()}")
    assert not found, "Sphinx roles render as literal text; write [`name`][redcount.module.name]:\n" + "\n".join(found)


def test_no_sphinx_field_list_in_a_docstring() -> None:
    """The reference reads Google-style docstrings: ``Args:``, ``Returns:``, ``Raises:``
    sections render as tables, a ``:param x:`` line as literal text."""
    found = []
    for path in _sources():
        for node in _docstrings(path):
            for offset, line in enumerate(str(node.value.value).splitlines()):
                if FIELD.match(line):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno + offset}: {line.strip()}")
    assert not found, "Use an Args: (Returns:, Raises:) section:\n" + "\n".join(found)


def test_no_rest_literal_block_in_a_docstring() -> None:
    """``text::`` and an indented block is reST; Markdown shows the ``::`` and, after a list or
    an Args section, folds the block into the text. Examples go in fenced code blocks."""
    found = []
    for path in _sources():
        for node in _docstrings(path):
            fenced = False
            for offset, line in enumerate(str(node.value.value).splitlines()):
                if line.lstrip().startswith(("```", "~~~")):
                    fenced = not fenced
                elif not fenced and line.rstrip().endswith("::"):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno + offset}: {line.strip()}")
    assert not found, "Use a fenced code block (```python ... ```):\n" + "\n".join(found)


def test_no_sphinx_attribute_comment() -> None:
    """``#:`` comments document an attribute for Sphinx only; griffe reads a docstring under it."""
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in _sources()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if line.lstrip().startswith("#:")
    ]
    assert not found, "Put the text in a docstring under the assignment:\n" + "\n".join(found)


def test_docstring_lines_keep_the_docstring_indentation() -> None:
    """A line indented less than its docstring makes every other line look indented: the whole
    docstring would render as a code block."""
    found = []
    for path in _sources():
        lines = path.read_text().splitlines()
        for node in _docstrings(path):
            for number in range(node.lineno + 1, (node.end_lineno or node.lineno) + 1):
                line = lines[number - 1]
                if line.strip() and len(line) - len(line.lstrip()) < node.col_offset:
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The documentation, built once with ``mkdocs build --strict`` (which fails on a
    cross-reference it cannot resolve)."""
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, f"mkdocs build --strict failed:\n{built.stdout}\n{built.stderr}"
    return out


def _reference_pages(site: Path) -> list[Path]:
    pages = sorted((site / "reference").rglob("*.html"))
    assert pages, f"no reference pages in {site}"
    return pages


@pytest.mark.slow
def test_reference_pages_show_no_role_and_no_unlinked_reference(site: Path) -> None:
    found = []
    for page in _reference_pages(site):
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if HTML_ROLE.search(line) or HTML_LITERAL_REF.search(line):
                found.append(f"{page.relative_to(site)}:{number}: {line.strip()[:160]}")
    assert not found, "\n".join(found)


def _final(obj: Any) -> Any:
    try:
        return obj.final_target if obj.is_alias else obj
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None


def _public_modules(module: Any) -> list[Any]:
    found = [module]
    for name, member in module.members.items():
        if member.is_alias or not member.is_module or name.startswith("_") or member.path.startswith(HIDDEN):
            continue
        found += _public_modules(member)
    return found


@pytest.mark.slow
def test_every_public_name_has_a_reference_entry(site: Path) -> None:
    package = griffe.load("redcount", search_paths=[str(ROOT / "python")], allow_inspection=False)
    collection = package.modules_collection
    rendered: set[str] = set()  # canonical paths of the objects the pages render
    for page in _reference_pages(site):
        for anchor in re.findall(r'id="(redcount(?:\.\w+)*)"', page.read_text()):
            try:
                target = _final(collection[anchor])
            except KeyError:
                continue
            if target is not None:
                rendered.add(target.path)

    missing = []
    for module in _public_modules(package):
        if module.path not in rendered:
            missing.append(f"module {module.path}")
        for export in module.exports or ():
            name = export if isinstance(export, str) else export.name
            if name.startswith("__"):
                continue  # __version__
            target = _final(module.members[name])
            if target is None:
                missing.append(f"{module.path}.{name} (does not resolve)")
            elif target.path not in rendered:
                missing.append(f"{module.path}.{name} ({target.path})")
            elif target.is_class and target.path.startswith("redcount._core."):
                # The extension's classes: their methods and properties are documented only by
                # the stub's docstrings, so check each one made it to the page.
                for member_name, member in target.members.items():
                    if not member_name.startswith("_") and member.path not in rendered:
                        missing.append(f"{module.path}.{name}.{member_name} (no docstring in _core.pyi?)")
    assert not missing, "no entry in docs/reference (add a ::: line or a docstring):\n" + "\n".join(sorted(set(missing)))
