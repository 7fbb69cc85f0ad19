"""The passage readers (``hoprl/data/passages.py``) on files written here in each corpus's format:
FlashRAG's ``{"id", "contents"}`` JSONL and DPR's ``id<TAB>text<TAB>title`` TSV, plain and gzipped,
read whole and from every position a read returned (what a resumed ingest does)."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import pytest

from hoprl.data.jsonl import DataError
from hoprl.data.passages import (
    Position,
    batches,
    detect_format,
    flashrag_contents,
    read_passages,
    source_key,
)

# (id, title, text): quotes, a tab, non-ASCII, and a text that spans two lines (TSV quotes it)
ROWS = [
    ("1", "Aaron", 'Aaron Aaron ( or ; "Ahärôn") is a prophet, high priest, and the brother of Moses.'),
    ("2", "Aaron", "He is mentioned in the Quran\tand the Bible."),
    ("3", "Zebra", "Zebras are African equines\nwith black-and-white stripes."),
    ("4", "", "A passage without a title."),
    ("5", "Ansk", "The Ansk is a river of 412 km."),
]


def write_flashrag(path: Path, rows: list[tuple[str, str, str]] = ROWS, blank_after: int = 2) -> None:
    """FlashRAG's layout: the title in double quotes on the first line of ``contents``."""
    lines = []
    for i, (pid, title, text) in enumerate(rows):
        contents = f'"{title}"\n{text}' if title else text
        lines.append(
            json.dumps({"id": int(pid) if i == 0 else pid, "contents": contents}, ensure_ascii=False)
        )
        if i == blank_after:
            lines.append("")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def write_dpr(
    path: Path, rows: list[tuple[str, str, str]] = ROWS, columns: tuple[str, ...] = ("id", "text", "title")
) -> None:
    """DPR's psgs_w100.tsv layout (``csv`` quoting, so a field with a quote, tab or newline is quoted)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(columns)
        for pid, title, text in rows:
            fields = {"id": pid, "text": text, "title": title}
            writer.writerow([fields[c] for c in columns])


START = Position()


def triples(path: Path, start: Position = START) -> list[tuple[str, str, str]]:
    return [(p.document.id, p.document.title, p.document.text) for p in read_passages(path, start=start)]


@pytest.mark.parametrize("name", ["wiki.jsonl", "wiki.jsonl.gz", "psgs.tsv", "psgs.tsv.gz"])
def test_both_formats_read_every_passage_and_resume_from_every_position(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    (write_flashrag if ".jsonl" in name else write_dpr)(path)
    passages = list(read_passages(path))
    assert [(p.document.id, p.document.title, p.document.text) for p in passages] == ROWS
    for i, passage in enumerate(passages):  # a later process starts just after any passage
        assert triples(path, passage.end) == ROWS[i + 1 :]
    # JSONL: 5 records and a blank line; TSV: the header and 5 records, one of them on two lines
    assert passages[-1].end.line == (6 if ".jsonl" in name else 7)


def test_line_numbers_count_physical_lines(tmp_path: Path) -> None:
    jsonl, tsv = tmp_path / "c.jsonl", tmp_path / "c.tsv"
    write_flashrag(jsonl)
    write_dpr(tsv)
    assert [p.line for p in read_passages(jsonl)] == [1, 2, 3, 5, 6]  # line 4 is blank
    assert [p.line for p in read_passages(tsv)] == [2, 3, 4, 6, 7]  # the header, then "Zebra" spans 4-5


def test_dpr_columns_are_found_by_name(tmp_path: Path) -> None:
    path = tmp_path / "swapped.tsv"
    write_dpr(path, columns=("title", "id", "text"))
    assert triples(path) == ROWS


def test_flashrag_contents_split_like_flashrag() -> None:
    assert flashrag_contents('"Aaron"\nAaron is a prophet.\nSecond line.') == (
        "Aaron",
        "Aaron is a prophet.\nSecond line.",
    )
    assert flashrag_contents("no title") == ("", "no title")


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        (
            "bad.jsonl",
            '{"id": "1", "contents": "\\"T\\"\\nok"}\n{"id": "2", "contents": \n',
            r"bad\.jsonl:2: not JSON",
        ),
        ("bad.jsonl", '{"id": "1", "text": "no contents"}\n', r"bad\.jsonl:1: a FlashRAG passage is"),
        ("bad.jsonl", '{"id": "1", "contents": "\\"T\\"\\n   "}\n', r"bad\.jsonl:1: not a passage \(text"),
        (
            "bad.tsv",
            "id\ttext\ttitle\n1\tok\tT\n2\tmissing a field\n",
            r"bad\.tsv:3: 2 fields where the header has 3",
        ),
        ("bad.tsv", "pid\tpassage\n1\tok\n", r"bad\.tsv:1: a DPR passage file starts with the header"),
        ("bad.txt", "", r"cannot tell the format"),
    ],
)
def test_malformed_records_name_their_line(tmp_path: Path, name: str, content: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(DataError, match=message):
        list(read_passages(path))


def test_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        list(read_passages(tmp_path / "absent.tsv"))


def test_batches_and_formats() -> None:
    assert [len(b) for b in batches(iter(range(7)), 3)] == [3, 3, 1]  # type: ignore[arg-type]
    assert detect_format("x/psgs_w100.tsv.gz") == "dpr"
    assert detect_format("wiki18_100w.jsonl") == "flashrag"


def test_the_source_key_changes_with_the_file(tmp_path: Path) -> None:
    path = tmp_path / "wiki.jsonl"
    write_flashrag(path)
    key = source_key(path)
    assert key.startswith("wiki.jsonl@") and key == source_key(path)
    write_flashrag(path, ROWS[:-1])
    assert source_key(path) != key
