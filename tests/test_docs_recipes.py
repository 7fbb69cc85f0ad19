"""``docs/recipes.md`` stays true to the code: sections, tests, code pointers and statuses.

The page maps every mechanism of each paper to its code (``module:name``) and the test that pins it
(``tests/path.py::test_name``); the R2AG and EVO-RAG sections link to a page of their own. These
checks read the files statically (``ast``), so they import nothing heavy and fail with the exact
reference that went stale when a test or a function is renamed or removed.
"""

from __future__ import annotations

import ast
import itertools
import re
from functools import cache
from pathlib import Path

import pytest

from hoprl.recipes import RECIPES

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "recipes.md"

SECTION = re.compile(r"^## `([\w-]+)`$", re.MULTILINE)
TEST_REF = re.compile(r"`(tests/[\w/]+\.py)::(test_\w+)(?:\[[^\]`]*\])?`")
CODE_REF = re.compile(r"`((?:hoprl|services|flows)(?:\.\w+)+):(\w+(?:\.\w+)?)`")
LINK = re.compile(r"\]\((recipes/[\w-]+\.md)\)")
TEST_FILE = re.compile(r"tests/[\w/]+\.py")
#: a test function's name on a linked page, in either of its forms (``::test_x``, `` `test_x` ``);
#: a file name (``test_x.py``) or a path segment is not one
TEST_NAME = re.compile(r"(?<![/\w])(test_\w+)(?!\w|\.py)")
STATUSES = ("as the paper", "option, default as the paper", "as the baseline", "the project's", "not yet")


def doc() -> str:
    return DOC.read_text()


@cache
def definitions(path: Path) -> dict[str, set[str]]:
    """Top-level names defined in ``path`` (functions, classes, assignments), each with its class
    members (methods and class-level assignments) when it is a class."""

    def assigned(node: ast.stmt) -> list[str]:
        if isinstance(node, ast.Assign):
            return [t.id for t in node.targets if isinstance(t, ast.Name)]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            return [node.target.id]
        return []

    out: dict[str, set[str]] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            out[node.name] = set()
        elif isinstance(node, ast.ClassDef):
            members = {n.name for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
            out[node.name] = members | {name for n in node.body for name in assigned(n)}
        for name in assigned(node):
            out[name] = set()
    return out


def module_file(module: str) -> Path:
    base = ROOT / module.replace(".", "/")
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def table_rows(text: str) -> list[list[str]]:
    """The body rows of every markdown table in ``text`` (header and separator rows left out)."""
    rows, previous = [], ""
    for line in text.splitlines():
        if line.startswith("|") and not line.startswith("|---") and previous.startswith("|"):
            rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
        previous = line
    return [r for r in rows if not set("".join(r)) <= set("-|: ")]


def test_every_recipe_has_a_section() -> None:
    sections = SECTION.findall(doc())
    assert sorted(sections) == sorted(RECIPES), f"sections {sections}, recipes {sorted(RECIPES)}"
    assert len(sections) == len(set(sections)), "a recipe has two sections"


def test_every_named_test_is_a_test_function_of_its_file() -> None:
    refs = TEST_REF.findall(doc())
    assert len(refs) >= 40, f"only {len(refs)} test references parsed: still `tests/x.py::name`?"
    missing = [
        f"{path}::{name}"
        for path, name in refs
        if not (ROOT / path).is_file() or name not in definitions(ROOT / path)
    ]
    assert not missing, f"docs/recipes.md names tests that do not exist: {missing}"


def test_every_code_pointer_resolves_to_a_definition() -> None:
    refs = CODE_REF.findall(doc())
    assert len(refs) >= 40, f"only {len(refs)} code references parsed: still `module:name`?"
    missing = []
    for module, name in refs:
        path = module_file(module)
        top, _, member = name.partition(".")
        defined = definitions(path) if path.is_file() else {}
        if top not in defined or (member and member not in defined[top]):
            missing.append(f"{module}:{name}")
    assert not missing, f"docs/recipes.md points at code that does not exist: {missing}"


def test_every_row_has_a_status_and_a_test_or_says_why_not() -> None:
    rows = table_rows(doc())
    assert len(rows) >= 30
    for row in rows:
        assert len(row) == 5, f"a row needs mechanism | rests on | code | test | status: {row}"
        _, source, code, tests, status = row
        assert source and CODE_REF.search(code), f"a row without its source or code pointer: {row}"
        assert status.startswith(STATUSES), f"unknown status {status!r}; use one of {STATUSES}"
        # a row without a test must say so in its status (not yet / not pinned)
        assert TEST_REF.search(tests) or (tests == "—" and ("not" in status or "project" in status)), row


@pytest.mark.parametrize("link", sorted(set(LINK.findall(DOC.read_text()))))
def test_linked_recipe_pages_name_only_existing_tests(link: str) -> None:
    """A recipe page linked from docs/recipes.md exists, and every test it names is a test function
    of one of the test files it names (pages write ``R `test_x``` or ``file.py::test_x``)."""
    page = DOC.parent / link
    assert page.is_file(), f"docs/recipes.md links to {link}, which does not exist"
    text = page.read_text()
    files = sorted({ROOT / p for p in TEST_FILE.findall(text)})
    assert files and all(f.is_file() for f in files), f"{link} names missing test files: {files}"
    names = set(TEST_NAME.findall(text))
    assert names, f"{link} names no test"
    defined = {name for f in files for name in definitions(f)}
    assert not sorted(names - defined), f"{link} names tests that do not exist: {sorted(names - defined)}"


def test_the_linked_pages_are_the_recipes_with_their_own_page() -> None:
    """R2AG and EVO-RAG keep their full table on a page of their own, linked from their section."""
    text = doc()
    starts = [(m.start(), m.group(1)) for m in SECTION.finditer(text)] + [(len(text), "")]
    sections = {name: text[a:b] for (a, name), (b, _) in itertools.pairwise(starts)}
    for name in ("r2ag", "evo-rag"):
        assert f"](recipes/{name}.md)" in sections[name], f"the {name} section must link its page"
    for name, body in sections.items():
        assert table_rows(body) or LINK.search(body), f"the {name} section has no table and no page"
