"""README.md's layout tree stays true to the repository.

The tree (the fenced block under ``## Layout``) has one line per entry: two spaces of indent per
level, the name (a folder ends in ``/``), at least two spaces, then what it holds. These tests
read it statically and fail with the exact lines to add or remove, so that a module moved or split
by another branch is one copy-paste away from a green README after the merge.

The rule: every ``.py`` file under the code folders (:data:`CODE`) has a line of its own. A
package's ``__init__.py`` may instead be covered by its folder's line. Every name in the tree
exists. Every top-level folder of :data:`FOLDERS` that exists has a line.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

#: the folders whose every .py file the tree names
CODE = ("hoprl", "services", "flows", "cli", "bench")
#: top-level folders the tree names (as one line each) whenever they exist
FOLDERS = (*CODE, "configs", "infra", "docs", "tests")
#: ``<indent><name>  <description>``: a name is a folder (``x/``) or a file (``x.py``, ``Makefile``)
ENTRY = re.compile(r"^(?P<indent> *)(?P<name>[\w.@-]+/?)(?: {2,}(?P<what>\S.*))?$")
INDENT = 2


@dataclass(frozen=True)
class Entry:
    path: str  # relative to the repository root; folders end in "/"
    line: int  # 1-based line number in README.md
    text: str  # the README line as written
    what: str  # the description


def tree_block() -> tuple[int, list[str]]:
    """The layout block's first line number (1-based) in README.md and its lines."""
    lines = README.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == "## Layout"), None)
    assert start is not None, "README.md has no '## Layout' section"
    fence = next(i for i in range(start, len(lines)) if lines[i].startswith("```"))
    end = next(i for i in range(fence + 1, len(lines)) if lines[i].startswith("```"))
    return fence + 2, lines[fence + 1 : end]


def parse_tree() -> tuple[list[Entry], list[str]]:
    """Every entry of the tree with its full path, and the lines that break the format."""
    first, lines = tree_block()
    entries: list[Entry] = []
    problems: list[str] = []
    stack: list[str] = []  # the folder at each indent level
    for number, text in enumerate(lines, first):
        match = ENTRY.match(text)
        if not match:
            problems.append(f"README.md:{number}: not `<indent><name>  <description>`: {text!r}")
            continue
        level, rest = divmod(len(match["indent"]), INDENT)
        if rest or level > len(stack):
            indent = len(match["indent"])
            problems.append(f"README.md:{number}: indent {indent} does not fit the tree: {text!r}")
            continue
        del stack[level:]
        name = match["name"]
        entries.append(Entry("".join(stack) + name, number, text, match["what"] or ""))
        if name.endswith("/"):
            stack.append(name)
    return entries, problems


def code_files() -> list[str]:
    """Every .py file under the code folders, relative to the root (caches left out)."""
    return sorted(
        p.relative_to(ROOT).as_posix()
        for folder in CODE
        for p in (ROOT / folder).rglob("*.py")
        if "__pycache__" not in p.parts
    )


def indent_of(text: str) -> int:
    return len(text) - len(text.lstrip())


def description_offset(entries: list[Entry]) -> int:
    """How far after its indent a line's description starts in the README (the most common)."""
    offsets = Counter(len(e.text) - len(e.what) - indent_of(e.text) for e in entries if e.what)
    return offsets.most_common(1)[0][0] if offsets else 26


def pad(line: str, offset: int) -> str:
    return line.ljust(indent_of(line) + max(offset, len(line.lstrip()) + 2))


def line_to_add(path: str, entries: list[Entry]) -> str:
    """Where a missing file goes (below its deepest folder that has a line) and the line itself."""
    folders = {e.path: e for e in entries if e.path.endswith("/")}
    parts = path.rstrip("/").split("/")
    last = "/" if path.endswith("/") else ""
    for depth in range(len(parts) - 1, 0, -1):
        parent = "/".join(parts[:depth]) + "/"
        if parent in folders:
            below = folders[parent]
            break
    else:
        depth, below = 0, None
    lines = [
        " " * (INDENT * level) + part + ("/" if level < len(parts) - 1 else last)
        for level, part in enumerate(parts)
        if level >= depth
    ]
    offset = description_offset(entries)
    lines = [pad(line, offset) + "<what it holds>" for line in lines]
    where = f"inside {below.path} (README.md:{below.line})" if below else "at the top level of the tree"
    return f"  add {where}:\n" + "\n".join(f"      {line}" for line in lines)


def test_the_tree_is_well_formed() -> None:
    entries, problems = parse_tree()
    assert len(entries) > 50, f"only {len(entries)} entries parsed from README.md's layout tree"
    problems += [f"README.md:{e.line}: {e.path} says nothing: {e.text!r}" for e in entries if not e.what]
    seen: dict[str, int] = {}
    for e in entries:
        if e.path in seen:
            problems.append(f"README.md:{e.line}: {e.path} is listed twice (also line {seen[e.path]})")
        seen.setdefault(e.path, e.line)
    assert not problems, "README.md's layout tree:\n" + "\n".join(problems)


def test_every_module_is_in_the_tree() -> None:
    entries, _ = parse_tree()
    listed = {e.path for e in entries}
    missing = [
        path
        for path in code_files()
        if path not in listed
        and not (path.endswith("/__init__.py") and path.removesuffix("__init__.py") in listed)
    ]
    missing += [f"{f}/" for f in FOLDERS if (ROOT / f).is_dir() and f"{f}/" not in listed]
    assert not missing, (
        "README.md's layout tree lacks these (one line each, saying what the module holds):\n"
        + "\n".join(f"- {path}\n{line_to_add(path, entries)}" for path in missing)
    )


def test_every_name_in_the_tree_exists() -> None:
    entries, _ = parse_tree()
    gone = [e for e in entries if not (ROOT / e.path).exists()]
    assert not gone, (
        "README.md's layout tree names what does not exist; remove (or rename) these lines:\n"
        + ("\n".join(f"  README.md:{e.line}: {e.text.strip()}  ({e.path})" for e in gone))
    )
