"""The ``ingest_corpus`` flow under ``prefect_test_harness``, against the session's live retriever
(embedded qdrant-edge over real HTTP), with the fan-out units run eagerly: a DPR TSV file written
here, ingested, run again (nothing sent), resumed from a record a killed fan-out left (batches
stored out of order), and refused on a passage id two lines share."""

from __future__ import annotations

import asyncio
import csv
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.testing.utilities import prefect_test_harness

from flows import fanout
from flows.corpus import ingest_corpus
from hoprl.clients.retriever import RetrieverClient
from hoprl.data.jsonl import DataError
from hoprl.data.passages import batches, read_passages, source_key
from hoprl.schemas.retriever import IngestCheckpoint

N = 30  # passages in the file
SIZE = 4  # passages per batch: 8 batches, the last one of 2


@pytest.fixture(scope="module", autouse=True)
def harness() -> Iterator[None]:
    with prefect_test_harness(server_startup_timeout=120):
        was = fanout.app.conf.task_always_eager
        fanout.use_eager(True)
        yield
        fanout.use_eager(was)


def write_tsv(path: Path, n: int = N, repeat: dict[int, int] | None = None) -> Path:
    """DPR's layout; ``repeat`` = {row: row whose id it takes}."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(["id", "text", "title"])
        for i in range(n):
            pid = (repeat or {}).get(i, i)
            writer.writerow(
                [f"w{pid}", f'Passage {i} tells of the river "R{i}" and the town of Town{i}.', f"Town{i}"]
            )
    return path


def ids_of(retriever_url: str, collection: str, n: int) -> set[str]:
    with RetrieverClient(retriever_url) as client:
        hits = client.search(collection, [f"Town{i}" for i in range(n)], top_k=1, mode="sparse")
    return {row[0].id for row in hits}


def test_a_file_is_ingested_then_a_rerun_sends_nothing(tmp_path: Path, retriever_url: str) -> None:
    path, collection = write_tsv(tmp_path / "psgs.tsv"), f"corpus-{secrets.token_hex(3)}"
    first = ingest_corpus(str(path), collection, retriever_url, batch_size=SIZE, window=3)
    assert first["format"] == "dpr" and first["source"] == source_key(path)
    assert (first["passages"], first["batches"], first["sent_batches"], first["points"]) == (N, 8, 8, N)
    assert first["resumed_passages"] == 0 and first["embedder"].startswith("all-MiniLM-L6-v2")
    assert ids_of(retriever_url, collection, N) == {f"w{i}" for i in range(N)}
    again = ingest_corpus(str(path), collection, retriever_url, batch_size=SIZE, window=3)
    assert (again["sent_batches"], again["resumed_batches"], again["passages"], again["points"]) == (
        0,
        8,
        N,
        N,
    )
    with RetrieverClient(retriever_url) as client:
        state = client.info(collection).ingests[first["source"]]
    assert (state.next_batch, state.passages, state.offset, state.ahead) == (8, N, path.stat().st_size, {})

    async def keys() -> set[str]:
        async with get_client() as prefect:
            return {a.key for a in await prefect.read_artifacts() if a.key}

    assert {f"corpus-{collection}", f"corpus-{collection}-summary"} <= asyncio.run(keys())


def test_a_run_resumes_from_what_a_killed_fan_out_left(tmp_path: Path, retriever_url: str) -> None:
    """Batches 0, 1 and 4 were stored before the kill (4 finished before 2 and 3): the re-run
    sends 2, 3 and 5-7 only, and the record ends whole."""
    path, collection = write_tsv(tmp_path / "psgs.tsv"), f"resume-{secrets.token_hex(3)}"
    source, stored = source_key(path), list(batches(read_passages(path), SIZE))
    with RetrieverClient(retriever_url) as client:
        for number in (0, 4, 1):
            batch = stored[number]
            end = batch[-1].end
            lines = [p.line for p in batch]
            mark = IngestCheckpoint(source=source, batch=number, batch_size=SIZE, lines=lines,
                                    end_offset=end.offset, end_line=end.line)  # fmt: skip
            client.ingest(collection, [p.document for p in batch], mark)
        state = client.info(collection).ingests[source]
    assert (state.next_batch, state.ahead) == (2, {"4": [stored[4][-1].end.offset, 21, 4]})
    summary = ingest_corpus(str(path), collection, retriever_url, batch_size=SIZE, window=2)
    assert (summary["sent_batches"], summary["resumed_batches"]) == (5, 3)
    assert (summary["sent_passages"], summary["resumed_passages"], summary["points"]) == (N - 12, 12, N)
    assert ids_of(retriever_url, collection, N) == {f"w{i}" for i in range(N)}


@pytest.mark.parametrize(
    ("repeat", "window", "message"),
    [
        # rows 3 and 27 (lines 5 and 29) are in different windows: the retriever refuses the batch
        ({27: 3}, 2, r"document id 'w3' at line 29 of dups\.tsv is also at line 5; ids must be unique"),
        # rows 4 and 5 are in one batch: the flow refuses it before sending
        ({5: 4}, 8, r"dups\.tsv:7: passage id 'w4' is also at line 6; ids must be unique"),
    ],
)
def test_a_passage_id_two_lines_share_stops_the_ingest(
    tmp_path: Path, retriever_url: str, repeat: dict[int, int], window: int, message: str
) -> None:
    path, collection = write_tsv(tmp_path / "dups.tsv", repeat=repeat), f"dups-{secrets.token_hex(3)}"
    with pytest.raises(DataError, match=message):
        ingest_corpus(str(path), collection, retriever_url, batch_size=SIZE, window=window)


def test_options_that_differ_from_the_collection_are_a_clear_error(
    tmp_path: Path, retriever_url: str
) -> None:
    path, collection = write_tsv(tmp_path / "psgs.tsv", n=4), f"opts-{secrets.token_hex(3)}"
    ingest_corpus(str(path), collection, retriever_url, options={"quantization": "int8"})
    with pytest.raises(DataError, match=r"exists with other options .*quantization: 'int8', asked 'binary'"):
        ingest_corpus(str(path), collection, retriever_url, options={"quantization": "binary"})
    with pytest.raises(DataError, match="shard_number 2 need a Qdrant server"):
        ingest_corpus(str(path), f"{collection}-b", retriever_url, options={"shard_number": 2})
