"""Passage files as open-domain corpora ship them, read as a stream: FlashRAG JSONL and DPR TSV.

- **FlashRAG** (``wiki18_100w.jsonl`` and its kin): one JSON object per line, ``{"id": "0",
  "contents": "\\"Aaron\\"\\nAaron Aaron ( or ; ...)"}``. The first line of ``contents`` is the
  title in double quotes, the rest the text (FlashRAG's own reader strips the quotes the same way);
  a ``contents`` without a line break is all text, with no title.
- **DPR** (``psgs_w100.tsv``, 21,015,324 passages of 100 words): tab-separated with the header
  ``id\\ttext\\ttitle`` (the columns are found by name, so another order reads too), fields quoted
  with ``"`` where they hold quotes, as Python's ``csv`` module reads them.

Either may be gzip-compressed (``.jsonl.gz``, ``.tsv.gz``). Nothing is loaded whole: records are
read one at a time, and every :class:`Passage` carries the :class:`Position` just after it (byte
offset into the uncompressed stream, and lines read), from which :func:`read_passages` starts
again in a later process; that is what makes an ingestion resumable (``flows/corpus.py``).

    for batch in batches(read_passages("psgs_w100.tsv"), 256):
        ...  # each batch[-1].end is where the next process would start
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from hoprl.data.jsonl import DataError
from hoprl.schemas import Document

Format = Literal["flashrag", "dpr"]
FORMATS: dict[str, Format] = {".jsonl": "flashrag", ".tsv": "dpr"}
#: the bytes of a file's head that its source key hashes (with its name and size)
HEAD_BYTES = 1 << 20
DPR_COLUMNS = ("id", "text", "title")


@dataclass(frozen=True)
class Position:
    """A place in a passage file: ``offset`` bytes into the (uncompressed) stream, after ``line``
    physical lines."""

    offset: int = 0
    line: int = 0


@dataclass(frozen=True)
class Passage:
    document: Document
    line: int  # the 1-based line its record starts on
    end: Position  # just after its record


def detect_format(path: str | Path) -> Format:
    """``flashrag`` for ``.jsonl[.gz]``, ``dpr`` for ``.tsv[.gz]``."""
    suffixes = [s for s in Path(path).suffixes if s != ".gz"]
    if suffixes and suffixes[-1] in FORMATS:
        return FORMATS[suffixes[-1]]
    raise DataError(
        f"{path}: cannot tell the format from the name; give it (flashrag for JSONL with id and "
        "contents, dpr for TSV with the header id, text, title)"
    )


def source_key(path: str | Path) -> str:
    """``<file name>@<16 hex>``: the name, the size and the first MiB, hashed. The key a
    collection's progress record is kept under: a file that grows or changes starts over."""
    path = Path(path)
    h = hashlib.sha256(f"{path.name}\x1f{path.stat().st_size}\x1f".encode())
    with path.open("rb") as f:
        h.update(f.read(HEAD_BYTES))
    return f"{path.name}@{h.hexdigest()[:16]}"


def _open(path: Path) -> io.BufferedIOBase:
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    return gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb")


def read_passages(
    path: str | Path, fmt: Format | None = None, start: Position = Position()
) -> Generator[Passage, None, None]:
    """The passages of ``path`` from ``start`` on (a :class:`Position` an earlier read returned).

    Raises :class:`DataError` naming the line of a record that is malformed or has no text.
    """
    path = Path(path)
    fmt = fmt or detect_format(path)
    with _open(path) as f:
        if fmt == "flashrag":
            yield from _flashrag(f, path, start)
        elif fmt == "dpr":
            yield from _dpr(f, path, start)
        else:
            raise DataError(f"unknown passage format {fmt!r}; valid: flashrag, dpr")


def batches(passages: Iterable[Passage], size: int) -> Iterator[list[Passage]]:
    """Consecutive lists of ``size`` passages (the last one shorter)."""
    batch: list[Passage] = []
    for passage in passages:
        batch.append(passage)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _document(path: Path, line: int, **fields: Any) -> Document:
    try:
        return Document(**fields)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:3])
        raise DataError(f"{path}:{line}: not a passage ({problems})") from None


def flashrag_contents(contents: str) -> tuple[str, str]:
    """(title, text) of a FlashRAG ``contents``: the quoted first line, then the rest."""
    title, sep, text = contents.partition("\n")
    if not sep:
        return "", contents
    return title.strip().strip('"'), text


def _flashrag(f: io.BufferedIOBase, path: Path, start: Position) -> Iterator[Passage]:
    f.seek(start.offset)
    offset, line = start.offset, start.line
    for raw in iter(f.readline, b""):
        offset += len(raw)
        line += 1
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DataError(f"{path}:{line}: not JSON ({exc})") from None
        if not isinstance(record, dict) or "id" not in record or not isinstance(record.get("contents"), str):
            raise DataError(
                f'{path}:{line}: a FlashRAG passage is {{"id": ..., "contents": "\\"title\\"\\ntext"}}'
            )
        title, text = flashrag_contents(record["contents"])
        document = _document(path, line, id=str(record["id"]), title=title, text=text)
        yield Passage(document, line, Position(offset, line))


class _Lines:
    """The decoded lines of a binary stream, counting bytes and lines as ``csv`` pulls them."""

    def __init__(self, f: io.BufferedIOBase, start: Position) -> None:
        self.f, self.offset, self.line = f, start.offset, start.line

    def __iter__(self) -> Iterator[str]:
        for raw in iter(self.f.readline, b""):
            self.offset += len(raw)
            self.line += 1
            yield raw.decode("utf-8")


def _dpr(f: io.BufferedIOBase, path: Path, start: Position) -> Iterator[Passage]:
    header = next(csv.reader(io.StringIO(f.readline().decode("utf-8")), delimiter="\t"), [])
    columns = {name.strip().lower(): i for i, name in enumerate(header)}
    if not set(DPR_COLUMNS) <= set(columns):
        raise DataError(
            f"{path}:1: a DPR passage file starts with the header id<TAB>text<TAB>title, got {header}"
        )
    at = Position(f.tell(), 1) if start.offset == 0 else start
    f.seek(at.offset)
    lines = _Lines(f, at)
    width = len(header)
    reader = csv.reader(lines, delimiter="\t")
    first = lines.line + 1
    while True:
        try:
            row = next(reader, None)
        except csv.Error as exc:
            raise DataError(f"{path}:{first}: not a TSV record ({exc})") from None
        if row is None:
            return
        if not row:  # a blank line
            first = lines.line + 1
            continue
        if len(row) != width:
            raise DataError(f"{path}:{first}: {len(row)} fields where the header has {width}")
        fields = {name: row[columns[name]] for name in DPR_COLUMNS}
        document = _document(path, first, id=fields["id"], title=fields["title"], text=fields["text"])
        yield Passage(document, first, Position(lines.offset, lines.line))
        first = lines.line + 1
