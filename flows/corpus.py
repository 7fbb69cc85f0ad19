"""``ingest_corpus``: a passage file (FlashRAG JSONL, DPR TSV) into a retriever collection, resumably.

The open-domain papers retrieve from a Wikipedia dump (DPR's / FlashRAG's ``wiki-18``: 21,015,324
passages of 100 words), far more than a process holds at once. The flow reads the file as a stream
(:mod:`hoprl.data.passages`), a window of batches at a time, and fans each batch out as a Celery
``embed_batch`` unit (:mod:`flows.fanout`; in this process where no broker is configured). A unit
sends its batch to the retriever with an :class:`~hoprl.schemas.retriever.IngestCheckpoint`; the
retriever embeds it exactly as every collection is embedded (its dense encoder and the two BM25
sparse vectors), upserts it under one uuid5 per passage id, and only then records the batch in the
collection's progress record for this file (:mod:`services.retriever.progress`).

Killed at any point (``kill -9`` included), a re-run with the same file, collection and batch
size reads the record and starts at the first batch not stored, skipping the later ones a fan-out
had already finished: nothing is lost, and a batch stored but not yet recorded is stored again over
the same points, so nothing is counted twice. A passage id that two lines of the file carry stops
the ingest with an error naming both lines (within a window here, across windows the retriever).

At the end the collection is optimized (the HNSW graph and the quantized vectors are built; a
Qdrant server does that by itself) and the summary returned. Progress shows as tqdm meter lines in
the flow's log (at most one every ``every_s`` seconds, and the last) and as the Prefect progress
artifact ``corpus-<collection>``::

    ingest wiki18:  41%|####1     | 5.60G/13.7G [2:05:10<3:01:02, 746kB/s] 8,601,600 passages, 1,146/s
"""

from __future__ import annotations

import time
from contextlib import closing
from pathlib import Path
from typing import Any, cast
from uuid import UUID

from prefect import State, flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact
from tqdm import tqdm

from flows.fanout import embed_batch, fan_out
from flows.report import artifact_key
from hoprl.clients.http import ServiceError
from hoprl.clients.retriever import RetrieverClient
from hoprl.data.jsonl import DataError
from hoprl.data.passages import Format, Position, batches, detect_format, read_passages, source_key
from hoprl.schemas.retriever import CollectionOptions, IngestCheckpoint, IngestProgress

BATCH_SIZE = 256
#: batches in flight at once: each window is fanned out and waited for before the next is read
WINDOW = 8
OPTIMIZE_TIMEOUT_S = 24 * 3600


def _refused(exc: ServiceError) -> DataError:
    """A 4xx of the retriever (options that differ, shards on embedded storage) as the error the
    command line prints."""
    message = exc.body.get("message") if isinstance(exc.body, dict) else None
    return DataError(message or str(exc))


def unless_refused(task: object, task_run: object, state: State) -> bool:
    """Prefect's ``retry_condition_fn``: retry a lost connection, not a refusal (the same next time)."""
    return not isinstance(state.data, DataError)


@task(retries=2, retry_delay_seconds=10, retry_condition_fn=unless_refused)
def open_collection(
    collection: str, retriever_url: str, options: dict[str, Any] | None, source: str, batch_size: int
) -> dict[str, Any]:
    """Create the collection with ``options`` (None: the defaults for a new collection, whatever an
    existing one has), or check that an existing one has them; returns this file's progress
    record, a fresh one for a file not seen before."""
    asked = CollectionOptions.model_validate(options) if options is not None else None
    try:
        with RetrieverClient(retriever_url) as client:
            info = client.create(collection, asked)
    except ServiceError as exc:
        if 400 <= exc.status < 500:
            raise _refused(exc) from None
        raise
    state = info.ingests.get(source) or IngestProgress(batch_size=batch_size)
    if state.batch_size != batch_size:
        raise DataError(
            f"the ingest of {source.rsplit('@', 1)[0]} into {collection} runs in batches of "
            f"{state.batch_size}; resume it with --batch-size {state.batch_size}, or delete the collection "
            "to start over"
        )
    return {**state.model_dump(), "embedder": info.embedder, "points": info.points}


@task
def ingest_window(
    job: dict[str, Any], start: dict[str, int], first_batch: int, window: int, skip: list[int]
) -> dict[str, Any]:
    """Read up to ``window`` batches from ``start`` (batch ``first_batch`` on), fan out those not
    in ``skip`` (stored by an earlier run), and wait for them.

    Args:
        job: ``path``, ``format``, ``source``, ``collection``, ``retriever_url``, ``run_id``,
            ``batch_size`` and ``queue`` of the ingest.

    Returns where the window ended (``offset``, ``line``), the batches and passages it read, those
    it sent, and ``eof``.
    """
    size, skipped = job["batch_size"], set(skip)
    units, seen = [], dict[str, int]()
    end, read, passages, sent_passages, eof = Position(**start), 0, 0, 0, True
    with closing(read_passages(job["path"], job["format"], Position(**start))) as stream:
        for batch in batches(stream, size):
            number = first_batch + read
            for p in batch:
                if p.document.id in seen:
                    raise DataError(
                        f"{job['path']}:{p.line}: passage id {p.document.id!r} is also at line "
                        f"{seen[p.document.id]}; ids must be unique within a file"
                    )
                seen[p.document.id] = p.line
            end, read, passages = batch[-1].end, read + 1, passages + len(batch)
            if number not in skipped:
                checkpoint = IngestCheckpoint(
                    source=job["source"], batch=number, batch_size=size, lines=[p.line for p in batch],
                    end_offset=end.offset, end_line=end.line,
                )  # fmt: skip
                documents = [p.document.model_dump() for p in batch]
                unit_id = f"{job['source']}:{number}"
                units.append(embed_batch.s(job["run_id"], unit_id, job["collection"], documents,
                                           job["retriever_url"], checkpoint.model_dump()))  # fmt: skip
                sent_passages += len(batch)
            if read == window:
                eof = False
                break
    fan_out(units, queue=job["queue"], description=f"batches {first_batch}-{first_batch + read - 1}")
    return {"offset": end.offset, "line": end.line, "batches": read, "passages": passages,
            "sent": len(units), "sent_passages": sent_passages, "eof": eof}  # fmt: skip


@task(retries=2, retry_delay_seconds=10)
def optimize(collection: str, retriever_url: str) -> dict[str, Any]:
    """Build the HNSW graph and quantized vectors (embedded storage); the collection's info after."""
    with RetrieverClient(retriever_url, timeout=OPTIMIZE_TIMEOUT_S) as client:
        return client.optimize(collection).model_dump()


def meter(
    name: str, done: int, total: int | None, first: int, elapsed: float, passages: int, sent: int
) -> str:
    """One progress line: tqdm's meter over the file's bytes, then passages and their rate."""
    line = tqdm.format_meter(done, total, elapsed, prefix=f"ingest {name}", ascii=True, ncols=100,
                             unit="B", unit_scale=True, initial=first)  # fmt: skip
    rate = f", {sent / elapsed:,.0f}/s" if elapsed > 0 and sent else ""
    return f"{line} {passages:,} passages{rate}"


@flow(name="ingest_corpus")
def ingest_corpus(
    path: str,
    collection: str,
    retriever_url: str,
    format: Format | None = None,
    batch_size: int = BATCH_SIZE,
    options: dict[str, Any] | None = None,
    window: int = WINDOW,
    queue: str | None = None,
    run_id: str | None = None,
    every_s: float = 10.0,
) -> dict[str, Any]:
    """Ingest the passage file ``path`` into ``collection`` through the retriever at ``retriever_url``.

    Args:
        format: ``flashrag`` or ``dpr``; None tells it from the file name (``.jsonl`` / ``.tsv``).
        batch_size: passages per batch, the unit of fan-out and of progress (a resumed ingest must
            keep it).
        options: :class:`~hoprl.schemas.retriever.CollectionOptions` as a dict (on-disk vectors,
            quantization, shards, ...); used when the collection is created, checked against an
            existing one (None: the defaults, or the existing collection's own).
        window: batches in flight at once (raise it with more Celery workers).
        queue: the Celery queue of the units (workers started with ``-Q``).
        run_id: the units' run key (default ``corpus-<collection>``).

    Returns the summary: the source key, the passages and batches of the file, those this run sent
    (``sent_*``) and those an earlier run had stored (``resumed_*``), passages per second, the
    seconds the final optimize took, and the collection's points, embedder and options.
    """
    log = get_run_logger()
    fmt = format or detect_format(path)
    source = source_key(path)
    state = open_collection(collection, retriever_url, options, source, batch_size)
    job = {"path": str(path), "format": fmt, "source": source, "collection": collection, "queue": queue,
           "retriever_url": retriever_url, "run_id": run_id or f"corpus-{collection}",
           "batch_size": batch_size}  # fmt: skip
    at, number = {"offset": state["offset"], "line": state["line"]}, state["next_batch"]
    skip = sorted(int(b) for b in state["ahead"])
    passages, first = state["passages"], state["offset"]
    if number or skip:
        log.info("resuming %s at batch %d (%d passages stored, byte %d; %d later batches stored too)",
                 collection, number, passages, first, len(skip))  # fmt: skip
    total = Path(path).stat().st_size if not str(path).endswith(".gz") else None
    key = artifact_key("corpus", collection)
    description = f"ingest of {Path(path).name} into {collection}"
    artifact = cast(UUID, create_progress_artifact(0.0, key=key, description=description))
    began = logged = time.monotonic()
    sent = sent_batches = 0
    while True:
        result = ingest_window(job, at, number, window, [b for b in skip if b >= number])
        at = {"offset": result["offset"], "line": result["line"]}
        number += result["batches"]
        passages += result["passages"]
        sent, sent_batches = sent + result["sent_passages"], sent_batches + result["sent"]
        now = time.monotonic()
        if total:
            update_progress_artifact(artifact, 100.0 * at["offset"] / total)
        if result["eof"] or now - logged >= every_s:
            log.info("%s", meter(collection, at["offset"], total, first, now - began, passages, sent))
            logged = now
        if result["eof"]:
            break
    elapsed = time.monotonic() - began
    update_progress_artifact(artifact, 100.0)
    info = optimize(collection, retriever_url)
    optimized = time.monotonic() - began - elapsed
    summary = {
        "collection": collection, "source": source, "format": fmt, "batch_size": batch_size,
        "batches": number, "passages": passages, "sent_batches": sent_batches, "sent_passages": sent,
        "resumed_batches": number - sent_batches, "resumed_passages": passages - sent,
        "seconds": round(elapsed, 2), "passages_per_s": round(sent / elapsed, 1) if elapsed > 0 else 0.0,
        "optimize_s": round(optimized, 2),
        "points": info["points"], "embedder": info["embedder"], "options": info["options"],
    }  # fmt: skip
    rows = "\n".join(f"| {k} | {v} |" for k, v in summary.items() if k != "options")
    table = f"| | |\n|---|---|\n{rows}\n"
    create_markdown_artifact(
        table, key=artifact_key("corpus", f"{collection}-summary"), description=description
    )
    log.info("%s: %d passages (%d sent by this run, %.1f/s), %d points", description, passages, sent,
             summary["passages_per_s"], info["points"])  # fmt: skip
    return summary
