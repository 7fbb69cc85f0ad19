"""``prepare_data`` and ``build_index``: questions into the run folder, their paragraphs into Qdrant.

Both flows pass paths and ids, never question lists: ``prepare_data`` writes one common-schema
JSONL file per split under ``<run folder>/data/`` and returns their paths with the registry's
dataset id; ``build_index`` reads those files back, pools the paragraphs into a corpus file,
ingests it through the retriever and returns the collection name with the index id.

>>> data = prepare_data("synthetic", run_id="demo")               # doctest: +SKIP
>>> index = build_index("demo", data, retriever_url="http://127.0.0.1:8001")  # doctest: +SKIP
>>> index["collection"], index["points"]                           # doctest: +SKIP
('synthetic-4f0c2a91', 1412)
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task

from flows.fanout import embed_batch, fan_out
from flows.runs import registry, run_dir
from hoprl.clients.retriever import RetrieverClient
from hoprl.data.corpus import chunk, pool
from hoprl.data.jsonl import load_questions, write_questions
from hoprl.data.mixtures import paper_spec, paper_training_set
from hoprl.data.sources import load
from hoprl.domain import Question
from hoprl.evaluation import corpus_collection
from hoprl.schemas import Document

SPLITS = ("train", "dev", "test")
INGEST_BATCH = 256


def dataset_name(spec: str) -> str:
    """``synthetic:3`` -> ``synthetic-3``; ``../shared/data/hotpotqa_dev.jsonl`` -> ``hotpotqa_dev``;
    ``paper:r2ag:../shared/data`` -> ``paper-r2ag``."""
    paper = paper_spec(spec)
    if paper is not None:
        return f"paper-{paper[0]}"
    return Path(spec).stem.replace(":", "-") if Path(spec).exists() else spec.replace(":", "-")


def sampling(spec: str) -> dict[str, Any] | None:
    """How a paper's training set was drawn (:class:`hoprl.data.mixtures.Built`'s record); None
    for any other dataset spec."""
    paper = paper_spec(spec)
    return paper_training_set(*paper).record if paper is not None else None


def split_questions(spec: str, seed: int) -> dict[str, list[Question]]:
    """Train / dev / test questions of a dataset spec (see :func:`hoprl.data.sources.load`).

    The synthetic world has its own three splits. A hub dataset, and a paper's training set
    (``paper:<recipe>[:<folder>]``, drawn with its config's seed), give ``train`` and ``dev``;
    their dev questions are halved into dev and test. A single JSONL file is shuffled with ``seed``
    and cut 80 / 10 / 10.
    """
    if spec.split(":")[0] == "synthetic":
        return {split: load(spec, split, seed=seed) for split in SPLITS}
    if Path(spec).exists():
        questions = load_questions(spec)
        random.Random(seed).shuffle(questions)
        n_eval = max(1, len(questions) // 10)
        return {
            "train": questions[2 * n_eval :],
            "dev": questions[:n_eval],
            "test": questions[n_eval : 2 * n_eval],
        }
    held_out = load(spec, "dev", seed=seed)
    half = len(held_out) // 2
    return {"train": load(spec, "train", seed=seed), "dev": held_out[:half], "test": held_out[half:]}


@task(retries=2, retry_delay_seconds=10)
def write_splits(spec: str, seed: int, limit: int | None, folder: str) -> dict[str, Any]:
    """Load (I/O: a hub download may fail transiently), cap each split at ``limit``, write JSONL."""
    paths, counts = {}, {}
    digest = hashlib.sha256()
    for split, questions in split_questions(spec, seed).items():
        path = Path(folder) / f"{split}.jsonl"
        counts[split] = write_questions(path, questions[:limit] if limit else questions)
        digest.update(path.read_bytes())
        paths[split] = str(path)
    if not counts["train"] or not counts["test"]:
        raise ValueError(f"dataset {spec!r} gave {counts}; it needs train and test questions")
    return {"paths": paths, "counts": counts, "content_hash": digest.hexdigest(), "sampling": sampling(spec)}


@flow(name="prepare_data")
def prepare_data(dataset: str, run_id: str, seed: int = 0, limit: int | None = None) -> dict[str, Any]:
    """Load ``dataset``, normalise it to the common schema, split it, write it, register it.

    Args:
        dataset: ``synthetic[:SEED]``, a common-schema JSONL path, a hub name, or a paper's training
            set: ``paper:<recipe>`` from the hub, ``paper:<recipe>:<folder>`` from a folder of
            common-schema files (``paper:evo-rag:../shared/data``).
        limit: at most this many questions per split.

    Returns ``{"dataset_id", "name", "source", "paths": {split: path}, "counts": {split: n},
    "sampling"}``, also written to ``<run folder>/data/manifest.json``. ``sampling`` is a paper
    training set's record (seed, each part's requested, available and taken counts, what the
    source lacks), else None; the registry's dataset row keeps it as its ``source``.
    """
    folder = run_dir(run_id) / "data"
    written = write_splits(dataset, seed, limit, str(folder))
    name = dataset_name(dataset)
    source = json.dumps({"spec": dataset, **written["sampling"]}) if written["sampling"] else dataset
    row = registry().register_dataset(name, source, written["content_hash"], written["counts"])
    manifest = {"dataset_id": row.id, "name": name, "source": dataset, **written}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1))
    get_run_logger().info("dataset %s (id %d): %s in %s", name, row.id, written["counts"], folder)
    return manifest


@task
def write_corpus(paths: list[str], chunk_words: int | None, out: str) -> dict[str, Any]:
    """Pool (and optionally chunk) the paragraphs of every split into one documents JSONL file."""
    questions = [q for path in paths for q in load_questions(path)]
    documents = pool(questions)
    if chunk_words:
        documents = chunk(documents, max_words=chunk_words)
    with Path(out).open("w", encoding="utf-8") as f:
        f.writelines(d.model_dump_json() + "\n" for d in documents)
    ids = "\n".join(sorted(d.id for d in documents))
    return {"path": out, "documents": len(documents), "corpus_hash": hashlib.sha256(ids.encode()).hexdigest()}


def read_documents(path: str) -> list[Document]:
    with Path(path).open(encoding="utf-8") as f:
        return [Document.model_validate_json(line) for line in f if line.strip()]


@task(retries=2, retry_delay_seconds=10)
def ingest(run_id: str, corpus: str, collection: str, retriever_url: str, use_fanout: bool) -> dict[str, Any]:
    """Ingest the corpus in batches unless the collection already holds it (idempotent by doc id)."""
    documents = read_documents(corpus)
    with RetrieverClient(retriever_url) as client:
        existing = {c.name: c for c in client.collections()}
        if collection in existing and existing[collection].points == len(documents):
            return {"points": existing[collection].points, "embedder": existing[collection].embedder}
        batches = [documents[i : i + INGEST_BATCH] for i in range(0, len(documents), INGEST_BATCH)]
        if use_fanout:
            units = [
                embed_batch.s(
                    run_id, f"{collection}:{i}", collection, [d.model_dump() for d in b], retriever_url
                )
                for i, b in enumerate(batches)
            ]
            fan_out(units, description=f"indexing {collection}")
        else:
            for batch in batches:
                client.ingest(collection, batch)
        info = next(c for c in client.collections() if c.name == collection)
    return {"points": info.points, "embedder": info.embedder}


@flow(name="build_index")
def build_index(
    run_id: str,
    data: dict[str, Any],
    retriever_url: str,
    chunk_words: int | None = None,
    use_fanout: bool = False,
) -> dict[str, Any]:
    """Pool the prepared splits' paragraphs, ingest them through the retriever, register the index.

    Args:
        data: what :func:`prepare_data` returned (its ``paths``, ``name`` and ``dataset_id``).
        chunk_words: split paragraphs longer than this many words (None: keep them whole, the
            multi-hop benchmarks' paragraphs are short).
        use_fanout: ingest through Celery ``embed_batch`` units (many workers) instead of here.

    Returns ``{"index_id", "collection", "points", "corpus"}``.
    """
    corpus = write_corpus(
        list(data["paths"].values()), chunk_words, str(run_dir(run_id) / "data" / "corpus.jsonl")
    )
    collection = corpus_collection(data["name"], read_documents(corpus["path"]))
    result = ingest(run_id, corpus["path"], collection, retriever_url, use_fanout)
    row = registry().register_index(
        collection, result["embedder"], corpus["corpus_hash"], result["points"], data["dataset_id"]
    )
    get_run_logger().info("index %s (id %d): %d points", collection, row.id, result["points"])
    return {
        "index_id": row.id,
        "collection": collection,
        "points": result["points"],
        "corpus": corpus["path"],
    }
