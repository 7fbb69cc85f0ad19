"""What corpus ingestion asks of the retriever, on both Qdrant engines: collection options (on-disk
vectors and indexes, int8 / binary quantization with rescoring, shards and replicas), ingests that
carry a checkpoint (the progress record, duplicate ids), and the optimize route."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import httpx
import pytest

from hoprl.clients.http import ServiceError
from hoprl.clients.retriever import RetrieverClient
from hoprl.schemas import Document
from hoprl.schemas.retriever import CollectionOptions, IngestCheckpoint, SearchRequest
from services.retriever.index import HybridIndex
from services.retriever.settings import RetrieverSettings

from .conftest import CORPUS

SOURCE = "wiki.jsonl@0123456789abcdef"


def fresh(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


def checkpoint(
    batch: int, lines: list[int], end_offset: int, size: int = 2, source: str = SOURCE
) -> IngestCheckpoint:
    return IngestCheckpoint(
        source=source, batch=batch, batch_size=size, lines=lines, end_offset=end_offset, end_line=lines[-1]
    )


@pytest.mark.parametrize("quantization", ["int8", "binary"])
def test_options_are_recorded_applied_and_searched_with(service: str, quantization: str) -> None:
    """A quantized collection on disk answers dense and hybrid searches with rescoring; its options
    are listed by GET and, on qdrant-edge, are the shard's own configuration."""
    name = fresh(quantization)
    options = CollectionOptions(
        on_disk=True, hnsw_on_disk=True, sparse_on_disk=True, quantization=quantization, always_ram=True,
        rescore=True, oversampling=2.0,
    )  # fmt: skip
    with RetrieverClient(service) as client:
        created = client.create(name, options)
        assert created.options == options and created.points == 0
        client.ingest(name, CORPUS)
        info = client.optimize(name)
        assert info.options == options and info.points == len(CORPUS)
        assert client.create(name, options).options == options  # the same options again: idempotent
        for mode in ("dense", "hybrid"):
            (hits,) = client.search(name, ["Who founded Acme Records?"], top_k=2, mode=mode)
            assert hits[0].id == "acme", mode
        client.delete(name)


def test_the_edge_shard_is_configured_as_asked(tmp_path: Path) -> None:
    index = HybridIndex(RetrieverSettings(storage_path=tmp_path))
    try:
        options = CollectionOptions(on_disk=True, hnsw_on_disk=True, sparse_on_disk=True, quantization="int8",
                                    always_ram=False)  # fmt: skip
        index.create("wiki", options=options)
        config = json.loads((tmp_path / "wiki" / "shard" / "edge_config.json").read_text())
        dense = config["vectors"]["dense"]
        assert dense["on_disk"] is True and dense["hnsw_config"]["on_disk"] is True
        assert dense["quantization_config"] == {"scalar": {"type": "int8", "always_ram": False}}
        assert all(config["sparse_vectors"][n]["on_disk"] is True for n in ("bm25", "title_bm25"))
        index.create("binary", options=CollectionOptions(quantization="binary"))
        binary = json.loads((tmp_path / "binary" / "shard" / "edge_config.json").read_text())
        assert binary["vectors"]["dense"]["quantization_config"]["binary"]["always_ram"] is True
    finally:
        index.close()


def test_other_options_for_an_existing_collection_are_a_409(service: str) -> None:
    name = fresh("opts")
    with RetrieverClient(service) as client:
        client.create(name, CollectionOptions(quantization="int8"))
        assert client.create(name).options.quantization == "int8"  # no options asked: keeps its own
        with pytest.raises(ServiceError) as err:
            client.create(name, CollectionOptions(quantization="binary", on_disk=True))
        client.delete(name)
    assert err.value.status == 409 and err.value.body["error"] == "collection_options_differ"
    assert err.value.body["detail"] == {
        "on_disk": {"collection": False, "asked": True},
        "quantization": {"collection": "int8", "asked": "binary"},
    }


@pytest.mark.parametrize("field", ["shard_number", "replication_factor"])
def test_embedded_storage_refuses_shards_and_replicas(service: str, field: str) -> None:
    response = httpx.put(f"{service}/v1/collections/{fresh('sharded')}", json={"options": {field: 3}})
    assert response.status_code == 422
    body = response.json()
    assert body["error"] == "needs_a_qdrant_server"
    assert f"{field} 3 need a Qdrant server (set QDRANT_URL" in body["message"]
    published = httpx.get(f"{service}/openapi.json").json()["components"]["schemas"]["CollectionOptions"]
    assert published["properties"][field]["maximum"] == 1  # what embedded storage takes, as published


@pytest.mark.parametrize(
    "options",
    [{"quantization": "int4"}, {"oversampling": 0.5}, {"shard_number": 0}, {"on_disk": "yes"}, {"x": 1}],
)
def test_invalid_options_are_a_422(service: str, options: dict) -> None:
    response = httpx.put(f"{service}/v1/collections/{fresh('bad')}", json={"options": options})
    assert response.status_code == 422 and response.json()["error"] == "invalid_request"


def test_checkpoints_build_the_progress_record_in_any_order(service: str) -> None:
    """Batch 1 finishes before batch 0 (a fan-out): it waits in ``ahead``, then both count."""
    name = fresh("progress")
    docs = [
        Document(id=f"p{i}", title=f"Title {i}", text=f"Passage number {i} about river {i}.")
        for i in range(5)
    ]
    with RetrieverClient(service) as client:
        client.create(name)
        client.ingest(name, docs[2:4], checkpoint(1, [3, 4], 400))
        state = client.info(name).ingests[SOURCE]
        assert (state.next_batch, state.passages, state.offset, state.ahead) == (0, 0, 0, {"1": [400, 4, 2]})
        client.ingest(name, docs[0:2], checkpoint(0, [1, 2], 200))
        client.ingest(name, docs[0:2], checkpoint(0, [1, 2], 200))  # a batch stored again: no change
        state = client.info(name).ingests[SOURCE]
        assert (state.next_batch, state.passages, state.offset, state.line, state.ahead) == (2, 4, 400, 4, {})
        client.ingest(name, docs[4:], checkpoint(2, [5], 500))
        info = client.info(name)
        (hits,) = client.search(name, ["Passage number 3 about river 3"], top_k=1)
        client.delete(name)
    assert info.points == 5 and info.ingests[SOURCE].next_batch == 3 and info.ingests[SOURCE].passages == 5
    assert hits[0].id == "p3" and hits[0].metadata == {}  # the file and line stay out of a hit


def test_a_repeated_id_within_a_file_is_a_409_naming_both_lines(service: str) -> None:
    name = fresh("dups")
    a, b = Document(id="x", text="first text"), Document(id="y", text="second text")
    with RetrieverClient(service) as client:
        client.ingest(name, [a, b], checkpoint(0, [1, 2], 100))
        with pytest.raises(ServiceError) as across:  # line 7 brings x again
            client.ingest(
                name, [Document(id="z", text="z"), Document(id="x", text="other")], checkpoint(1, [6, 7], 200)
            )
        with pytest.raises(ServiceError) as within:
            client.ingest(
                name, [Document(id="w", text="w"), Document(id="w", text="w2")], checkpoint(1, [6, 7], 200)
            )
        # the same lines again (a resumed batch), and the same id from another file: both fine
        client.ingest(name, [a, b], checkpoint(0, [1, 2], 100))
        client.ingest(
            name, [Document(id="x", text="replaced")], checkpoint(0, [9], 50, source="other.tsv@" + "f" * 16)
        )
        info = client.info(name)
        (hits,) = client.search(name, ["replaced"], top_k=1)
        client.delete(name)
    assert across.value.status == 409 and across.value.body["error"] == "duplicate_document_id"
    assert "'x' at line 7 of wiki.jsonl is also at line 1" in across.value.body["message"]
    assert across.value.body["detail"] == {"id": "x", "line": 7, "first_line": 1}
    assert within.value.body["detail"] == {"id": "w", "line": 7, "first_line": 6}
    assert info.points == 2 and info.ingests[SOURCE].next_batch == 1  # the refused batches wrote nothing
    assert hits[0].id == "x" and hits[0].text == "replaced"


def test_a_resumed_file_keeps_its_batch_size(service: str) -> None:
    name = fresh("size")
    with RetrieverClient(service) as client:
        client.ingest(name, [Document(id="a", text="a")], checkpoint(0, [1], 10, size=1))
        with pytest.raises(ServiceError) as err:
            client.ingest(name, [Document(id="b", text="b")], checkpoint(1, [2], 20, size=4))
        client.delete(name)
    assert err.value.status == 409 and err.value.body["error"] == "batch_size_differs"
    assert "runs in batches of 1, not 4" in err.value.body["message"]


def test_a_checkpoint_needs_one_line_per_document(service: str) -> None:
    body = {"documents": [{"id": "a", "text": "a"}], "checkpoint": checkpoint(0, [1, 2], 10).model_dump()}
    response = httpx.post(f"{service}/v1/collections/{fresh('lines')}/documents", json=body)
    assert response.status_code == 409 and response.json()["error"] == "checkpoint_lines_differ"
    assert "2 line numbers for 1 documents" in response.json()["message"]


def test_an_empty_collection_takes_bm25_lengths_from_its_first_ingest(tmp_path: Path) -> None:
    index = HybridIndex(RetrieverSettings(storage_path=tmp_path))
    try:
        index.create("late")
        assert index.meta("late")["avgdl"] is None
        assert index.search(SearchRequest(collection="late", queries=["river"])).results == [[]]
        index.ingest("late", CORPUS)
        with_docs = index.meta("late")
        index.ingest("early", CORPUS)
        assert with_docs["avgdl"] == index.meta("early")["avgdl"] > 3  # what an ingest-created one gets
        assert with_docs["avgdl_title"] == index.meta("early")["avgdl_title"]
        assert with_docs["embedder"] == index.embedder.name and with_docs["embed_max_length"] == 64
    finally:
        index.close()
