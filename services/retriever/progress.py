"""A collection's record of how far each source file's ingest has come (``hoprl ingest-corpus``).

The record lives in the collection's metadata under ``ingests``, one
:class:`~hoprl.schemas.retriever.IngestProgress` per source file key, and is written only after
Qdrant has stored a batch: a batch the record names is in the collection, and a batch stored but
not yet recorded (the process died between the two) is stored again by the next run, over the
same point ids (one uuid5 per document id), so nothing is lost and nothing counted twice.

Batches of a fan-out finish in any order: a finished batch past the first unfinished one waits in
``ahead`` until the ones before it are in, and the record's ``offset`` always ends the unbroken run
of finished batches from the file's start, which is where a re-run starts reading.

Document ids must be unique within a source file: each point keeps its file and line (payload
``origin``), and a batch that brings an id the collection holds from another line of the same
file is refused before anything is written (:class:`DuplicateId`). Another file may reuse an id:
its passage replaces the stored one, as any re-ingest does.
"""

from __future__ import annotations

from typing import Any

from hoprl.schemas import Document
from hoprl.schemas.retriever import IngestCheckpoint, IngestProgress


class DuplicateId(ValueError):
    """A document id that two lines of one source file carry."""

    def __init__(self, doc_id: str, source: str, line: int, first: int) -> None:
        super().__init__(
            f"document id {doc_id!r} at line {line} of {source.rsplit('@', 1)[0]} is also at line {first}; "
            "ids must be unique within a file: give one of them another id, or drop one"
        )
        self.doc_id, self.source, self.line, self.first = doc_id, source, line, first


class BatchSizeDiffers(ValueError):
    """A batch of a file whose ingest was started with another batch size."""


class LinesDiffer(ValueError):
    """A checkpoint whose line numbers do not pair with the batch's documents (which JSON Schema
    cannot say, so a schema-valid request the service cannot serve: a 409, not a 422)."""


def origin(checkpoint: IngestCheckpoint | None, i: int) -> dict[str, Any]:
    """The payload field that names document ``i``'s file and line (nothing without a checkpoint)."""
    if checkpoint is None:
        return {}
    return {"origin": {"source": checkpoint.source, "line": checkpoint.lines[i]}}


def check_checkpoint(meta: dict[str, Any], checkpoint: IngestCheckpoint, documents: int) -> None:
    """One line per document, and one batch size: batch numbers mean the same thing in every run
    of a file's ingest."""
    if len(checkpoint.lines) != documents:
        raise LinesDiffer(
            f"checkpoint.lines has {len(checkpoint.lines)} line numbers for {documents} documents"
        )
    known = meta.get("ingests", {}).get(checkpoint.source)
    if known and known["batch_size"] != checkpoint.batch_size:
        raise BatchSizeDiffers(
            f"the ingest of {checkpoint.source.rsplit('@', 1)[0]} into this collection runs in batches of "
            f"{known['batch_size']}, not {checkpoint.batch_size}: resume it with that batch size, or delete "
            "the collection to start over"
        )


def check_duplicates(
    documents: list[Document], checkpoint: IngestCheckpoint, stored: dict[str, dict[str, Any]]
) -> None:
    """Raise :class:`DuplicateId` for an id this batch repeats, or that ``stored`` (the points
    with these ids and their ``origin``) holds from another line of the same file."""
    seen: dict[str, int] = {}
    for document, line in zip(documents, checkpoint.lines, strict=True):
        if document.id in seen:
            raise DuplicateId(document.id, checkpoint.source, line, seen[document.id])
        seen[document.id] = line
        before = stored.get(document.id, {}).get("origin") or {}
        if before.get("source") == checkpoint.source and before.get("line") != line:
            raise DuplicateId(document.id, checkpoint.source, line, int(before["line"]))


def record(meta: dict[str, Any], checkpoint: IngestCheckpoint, passages: int) -> dict[str, Any]:
    """``meta`` with the stored batch taken into its file's progress record."""
    ingests = dict(meta.get("ingests", {}))
    known = ingests.get(checkpoint.source)
    state = (
        IngestProgress.model_validate(known) if known else IngestProgress(batch_size=checkpoint.batch_size)
    )
    if checkpoint.batch >= state.next_batch:
        state.ahead[str(checkpoint.batch)] = [checkpoint.end_offset, checkpoint.end_line, passages]
    while str(state.next_batch) in state.ahead:
        state.offset, state.line, n = state.ahead.pop(str(state.next_batch))
        state.passages += n
        state.next_batch += 1
    ingests[checkpoint.source] = state.model_dump()
    return {**meta, "ingests": ingests}
