"""The documents speak in the project's own voice: what the project is, its history by date or version.

Scanned: the Markdown pages (README.md, CHANGELOG.md, docs/), the comments of the configs, the
Makefile, the compose file and pyproject.toml, and the comments and docstrings of every Python file
(code strings are left alone: a scripted expert's "I need ..." is model text, not narrative). In
Markdown, inline code and double-quoted text are left alone for the first-person rules, since they
quote a model or a paper ("These results do not give what I need.").

A violation names ``file:line`` and the rule. The rules:

- no issue numbers (``issue 26``, ``#26``) and no "the issue's" targets: history is told by date
  or version;
- no first-person narrative (``I``, ``I'm``, ``I've``, ``I'd``, ``I'll``, "we ran" and the like);
- no "the brief", no "sitting", no numbered "session N" (who worked when);
- no reference to files outside the repository: ``DESIGN.md``, ``STYLE.md``, ``../shared/papers``,
  ``/work/``; the benchmark files at ``../shared/data`` and the Compose schema at
  ``../shared/schemas`` are user-facing locations the README documents, and stay;
- no file in the repository named after a session or a sitting (``w2s-session6-hops.png``).

Each rule has a case of its own in :data:`CASES` below that must be caught, and one that must not.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: (rule, pattern) over prose: comments, docstrings and Markdown outside code and quotes
FIRST_PERSON: list[tuple[str, re.Pattern[str]]] = [
    ("first person", re.compile(r"(?<![\w/.-])I(?:'m|'ve|'d|'ll)?(?![\w/.-])")),
    ("first person", re.compile(r"\b[Ww]e(?:'ve| have)? (?:ran|run|did|chose|left|tried|measured|found)\b")),
]
#: (rule, pattern) over the whole text of a scanned line, quotes and code included
ANYWHERE: list[tuple[str, re.Pattern[str]]] = [
    ("issue number", re.compile(r"\b[Ii]ssues? #?\d+")),
    ("issue number", re.compile(r"(?<![\w&#/])#\d{1,4}\b")),
    ("the issue's", re.compile(r"\b[Tt]he issue's\b")),
    ("the brief", re.compile(r"\b[Tt]he brief(?:'s)?\b|\bunder which brief\b")),
    ("sitting", re.compile(r"\bsittings?\b", re.IGNORECASE)),
    ("numbered session", re.compile(r"\b[Ss]ession[- ]?\d+")),
    ("outside the repository", re.compile(r"\b(?:DESIGN|STYLE)\.md\b|\.\./shared/papers|(?<![\w.])/work/")),
]
#: tracked files named after who made them
BANNED_NAME = re.compile(r"(?:session|sitting)[-_]?\d|w2s-s\d", re.IGNORECASE)

#: Markdown spans the first-person rules skip: fenced code, inline code, double-quoted text
CODE_FENCE = re.compile(r"^\s*```")
QUOTED = re.compile(r"`[^`]*`|\"[^\"]*\"|“[^”]*”")

PROSE_FILES = ("README.md", "CHANGELOG.md")
COMMENT_FILES = ("Makefile", "docker-compose.yml", "pyproject.toml")
SKIP = {"tests/test_voice.py"}  # this file states the rules it enforces


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [p for p in out.stdout.splitlines() if (ROOT / p).is_file()]


def blank(match: re.Match[str]) -> str:
    """A quoted or code span as spaces, its line breaks kept; one that crosses a paragraph is not
    a span (an unmatched quote), so it stays."""
    span = match.group(0)
    return span if "\n\n" in span else re.sub(r"[^\n]", " ", span)


def markdown_lines(text: str) -> Iterator[tuple[int, str, str]]:
    """(line number, the whole line, the line without code or quotes); fenced blocks have no prose."""
    lines = text.splitlines()
    fenced = False
    for i, line in enumerate(lines):
        if CODE_FENCE.match(line):
            fenced = not fenced
            lines[i] = ""
        elif fenced:
            lines[i] = ""
    prose = QUOTED.sub(blank, "\n".join(lines)).splitlines()
    for n, (line, without) in enumerate(zip(text.splitlines(), prose, strict=False), 1):
        yield n, line, without


def hash_comment_lines(text: str) -> Iterator[tuple[int, str, str]]:
    """The ``#`` comments of a YAML, TOML or Makefile, each as its own prose."""
    for n, line in enumerate(text.splitlines(), 1):
        if "#" in line:
            comment = line[line.index("#") :]
            yield n, comment, comment


def python_lines(text: str) -> Iterator[tuple[int, str, str]]:
    """Comments and docstrings of a Python file, line by line."""
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string, tok.string
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            doc = body[0].value
            if isinstance(doc.value, str):
                for i, line in enumerate(doc.value.splitlines()):
                    # in a docstring, ``...`` is code, and double quotes quote a text
                    yield doc.lineno + i, line, QUOTED.sub(" ", re.sub(r"``[^`]*``", " ", line))


def lines_of(path: str, text: str) -> Iterator[tuple[int, str, str]]:
    if path.endswith(".md"):
        return markdown_lines(text)
    if path.endswith(".py"):
        return python_lines(text)
    return hash_comment_lines(text)


def scanned(paths: list[str]) -> list[str]:
    return [
        p
        for p in paths
        if p not in SKIP
        and (
            p in PROSE_FILES
            or p in COMMENT_FILES
            or (p.startswith("docs/") and p.endswith(".md"))
            or (p.startswith(("configs/", "infra/", ".ci/")) and p.endswith((".yaml", ".yml", ".toml")))
            or p.endswith(".py")
        )
    ]


def violations(path: str, text: str) -> list[str]:
    found = []
    for n, line, prose in lines_of(path, text):
        rules = [(rule, pat, line) for rule, pat in ANYWHERE]
        rules += [(rule, pat, prose) for rule, pat in FIRST_PERSON]
        for rule, pattern, where in rules:
            match = pattern.search(where)
            if match:
                found.append(f"{path}:{n}: {rule}: {match.group(0)!r} in {line.strip()[:100]!r}")
    return found


CASES = [
    # (file name, text, caught)
    ("CHANGELOG.md", "### Changed (make run, issue 26, 2026-11-28)", True),
    ("CHANGELOG.md", "### Changed (#26)", True),
    ("CHANGELOG.md", "### Changed\n#### `make run` (2026-11-28)", False),
    ("docs/x.md", "Against the issue's targets: 2x.", True),
    ("docs/x.md", "I left it out because the brief fixes k1 and b.", True),
    ("docs/x.md", "Not adopted: BM25 keeps k1 and b.", False),
    ("docs/x.md", "Session 7's Dr. GRPO campaigns are in docs/training.md.", True),
    ("docs/x.md", "![T](img/w2s-session8-t.png)", True),
    ("docs/x.md", "An ONNX session of one thread; a pytest session.", False),
    ("docs/x.md", 'The expert wrote "These results do not give what I need." every time.', False),
    ("docs/x.md", "It reads `I/O` and I/O errors.", False),
    ("docs/x.md", "| rests on | DESIGN.md §1 |", True),
    ("docs/x.md", "read in full (`../shared/papers/<recipe>.txt`)", True),
    ("docs/x.md", "make run DATASET=../shared/data/hotpotqa_dev.jsonl", False),
    ("docs/x.md", "PY=/work/main/.venv/bin/python", True),
    ("docs/x.md", "We ran it twice.", True),
    ("docs/x.md", "```\nI am code\n```", False),
    ("x.py", "# Our servers keep idle connections; I measured it in session 10.\nx = 1\n", True),
    ("x.py", '"""The fact I need, as model text."""\n', True),
    ("x.py", 'NEED = f"I need the {x}."\n', False),
    ("x.py", '"""A retry on I/O errors; the ``session`` fixture."""\n', False),
    ("configs/x.yaml", "# each with where the paper gives it (../shared/papers/arena.txt)\nlr: 1e-6\n", True),
    ("configs/x.yaml", "# the paper's settings (docs/papers.md)\nlr: 1e-6 # App. E\n", False),
]


@pytest.mark.parametrize(("path", "text", "caught"), CASES)
def test_the_rules_catch_what_they_name_and_nothing_else(path: str, text: str, caught: bool) -> None:
    assert bool(violations(path, text)) is caught, violations(path, text)


def test_docs_comments_and_docstrings_speak_in_the_projects_voice() -> None:
    found = []
    for path in scanned(tracked()):
        found += violations(path, (ROOT / path).read_text(encoding="utf-8"))
    assert not found, "not in the project's voice:\n" + "\n".join(found)


def test_no_file_is_named_after_a_session() -> None:
    named = [p for p in tracked() if BANNED_NAME.search(Path(p).name)]
    assert not named, f"files named after who made them, rename to what they show: {named}"


def test_the_changelog_is_in_released_versions() -> None:
    """Keep a Changelog: [Unreleased] on top, then versions with dates, each with the standard
    sections only, the newest first."""
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    versions = re.findall(r"^## (.+)$", text, re.MULTILINE)
    assert versions[0] == "[Unreleased]", versions[:1]
    released = versions[1:]
    assert released, "no released version"
    parsed = []
    for v in released:
        m = re.fullmatch(r"\[(\d+)\.(\d+)\.(\d+)\] - (\d{4}-\d{2}-\d{2})", v)
        assert m, f"a version heading reads '## [X.Y.Z] - YYYY-MM-DD', not {v!r}"
        parsed.append(tuple(int(x) for x in m.groups()[:3]))
    assert parsed == sorted(parsed, reverse=True), "versions newest first"
    sections = set(re.findall(r"^### (.+)$", text, re.MULTILINE))
    allowed = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
    assert sections <= allowed, f"sections other than Keep a Changelog's: {sorted(sections - allowed)}"


def test_the_latest_release_is_the_packages_version() -> None:
    from hoprl import __version__

    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    latest = re.search(r"^## \[(\d+\.\d+\.\d+)\]", text, re.MULTILINE)
    assert latest is not None and latest.group(1) == __version__, (latest, __version__)
