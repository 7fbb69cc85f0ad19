"""Read and write the common question schema (JSON Lines, one question per line)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from pydantic import ValidationError

from hoprl.domain import Question


class DataError(ValueError):
    """A data file is missing or malformed; the message names the file and line."""


def iter_questions(path: str | Path) -> Iterator[Question]:
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file (benchmark samples live in ../shared/data)")
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield Question.model_validate(json.loads(line))
            except (json.JSONDecodeError, ValidationError) as exc:
                first = str(exc).splitlines()[0]
                raise DataError(f"{path}:{lineno}: not a question in the common schema ({first})") from None


def load_questions(path: str | Path, limit: int | None = None) -> list[Question]:
    """Load a common-schema JSONL file (e.g. ``../shared/data/hotpotqa_dev.jsonl``), read in place."""
    out: list[Question] = []
    for q in iter_questions(path):
        if limit is not None and len(out) >= limit:
            break
        out.append(q)
    return out


def write_questions(path: str | Path, questions: Iterable[Question]) -> int:
    """Write one question per line, with the fields of its own class (a synthetic question's
    ``hops`` too), creating the folder; returns the count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w", encoding="utf-8") as f:
        for q in questions:
            f.write(q.model_dump_json() + "\n")
            n += 1
    return n
