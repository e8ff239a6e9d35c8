"""The docs name only what exists: every test file, test function and script path that
README.md, DEVELOPING.md, bench/RESULTS.md and docs/*.md name is in the tree (the table
of promises in docs/promises.md names the test that holds each promise), and every
relative link between them leads to a file."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "DEVELOPING.md", ROOT / "bench" / "RESULTS.md",
        *sorted((ROOT / "docs").glob("*.md"))]
# a path in the tree as the docs write it, optionally ::test_name
PATH = re.compile(r"(?<![\w/.-])((?:tests|bench|scripts|src|samples)/[\w./-]*\w)(?:::(\w+))?")
# (test_a, test_b) after a test file: the functions it names
NAMED = re.compile(r"`((?:tests)/[\w/]+\.py)` \(((?:`test_\w+`(?: \([^)]*\))?(?:, )?)+)\)")


# a module as the docs name it in backquotes: `dwarf/reader.py`, `passes.py`
MODULE = re.compile(r"`((?:[a-z_]+/)*[a-z_]+\.py)`")
PYTHON_FILES = None


def _python_files() -> set[str]:
    global PYTHON_FILES
    if PYTHON_FILES is None:
        PYTHON_FILES = {str(p.relative_to(ROOT)) for d in ("src", "tests", "bench", "scripts")
                        for p in (ROOT / d).rglob("*.py")}
    return PYTHON_FILES


def _functions(path: Path) -> set[str]:
    return {n.name for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _references(doc: Path) -> list[tuple[str, str | None]]:
    text = doc.read_text()
    refs = [(m.group(1), m.group(2)) for m in PATH.finditer(text)]
    for m in NAMED.finditer(text):
        refs += [(m.group(1), name) for name in re.findall(r"`(test_\w+)`", m.group(2))]
    return refs


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_and_test_named_exists(doc):
    missing = []
    for path, function in _references(doc):
        target = ROOT / path
        if not target.exists() and not any(ROOT.glob(path + ".*")):
            missing.append(path)
        elif function and target.suffix == ".py" and function not in _functions(target):
            missing.append(f"{path}::{function}")
    assert not missing, f"{doc.name} names what is not in the tree: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_named_exists(doc):
    """A module named by its package path or its file name (`dwarf/reader.py`,
    `passes.py`) is a file of the tree, so a renamed module leaves no stale name."""
    text = re.sub(r"^\| was \|.*?(?=^[^|]|\Z)", "", doc.read_text(), flags=re.M | re.S)  # renames
    missing = [m for m in MODULE.findall(text)
               if not any(f == m or f.endswith("/" + m) for f in _python_files())]
    assert not missing, f"{doc.name} names modules that are not in the tree: {missing}"


def test_the_promises_name_a_test_for_each_row():
    rows = [line for line in (ROOT / "docs" / "promises.md").read_text().splitlines()
            if line.startswith("| ") and not line.startswith(("| promise", "|---"))]
    assert len(rows) > 30
    for row in rows:
        held_by = row.rstrip(" |").rsplit(" | ", 1)[1]
        assert re.search(r"`tests/[\w/]+(\.py)?", held_by), row


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_to_files(doc):
    text = doc.read_text()
    links = re.findall(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)", text)
    missing = [link for link in links if not (doc.parent / link).exists()]
    assert not missing, f"{doc.name} links to what is not there: {missing}"


def test_the_readme_opens_with_the_two_set_up_commands_and_ci_runs_the_test_one():
    commands = [line.split("#", 1)[0].strip() for line in
                (ROOT / "README.md").read_text().splitlines()[:6] if line.startswith("    ")]
    assert commands == ["./scripts/setup.sh && .venv/bin/ctracer demo",
                        "./scripts/setup.sh && .venv/bin/python -m pytest"]
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line and not line.startswith(("#", "set ", "cd "))]
    assert ci == [commands[1]]
