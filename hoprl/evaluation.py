"""Retrieval evaluation of a question file through the retriever service."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from hoprl.clients.http import ServiceError
from hoprl.clients.retriever import RetrieverClient
from hoprl.data.corpus import gold_ids, pool
from hoprl.domain import Question, SearchMode
from hoprl.metrics.retrieval import retrieval_report
from hoprl.schemas import Document

INGEST_BATCH = 256
SEARCH_BATCH = 64


def progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        transient=True,
    )


def corpus_collection(name: str, documents: Sequence[Document]) -> str:
    """A collection name that changes when the corpus does: ``<name>-<8 hex of the doc ids>``."""
    digest = hashlib.sha1("\n".join(sorted(d.id for d in documents)).encode()).hexdigest()[:8]
    return f"{name}-{digest}"


def ensure_indexed(client: RetrieverClient, collection: str, documents: Sequence[Document]) -> float:
    """Ingest ``documents`` unless the collection already holds exactly them; returns docs/s (0 if cached)."""
    existing = {c.name: c.points for c in client.collections()}
    if existing.get(collection) == len(documents):
        return 0.0
    start = time.perf_counter()
    with progress() as bar:
        task = bar.add_task(f"indexing {collection}", total=len(documents))
        for i in range(0, len(documents), INGEST_BATCH):
            batch = list(documents[i : i + INGEST_BATCH])
            client.ingest(collection, batch)
            bar.advance(task, len(batch))
    return len(documents) / (time.perf_counter() - start)


@dataclass
class RetrievalEval:
    collection: str
    documents: int
    index_rate: float
    results: dict[str, dict[str, float]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


def evaluate_retrieval(
    client: RetrieverClient,
    questions: Sequence[Question],
    modes: Sequence[SearchMode],
    ks: Sequence[int],
    name: str = "eval",
) -> RetrievalEval:
    """Pool, index (through the service) and score every mode: Recall@K, Full-Recall@K, mAP."""
    documents = pool(questions)
    collection = corpus_collection(name, documents)
    rate = ensure_indexed(client, collection, documents)
    out = RetrievalEval(collection=collection, documents=len(documents), index_rate=rate)
    golds = [gold_ids(q) for q in questions]
    for mode in modes:
        rankings: list[list[str]] = []
        start = time.perf_counter()
        with progress() as bar:
            task = bar.add_task(f"searching ({mode})", total=len(questions))
            for i in range(0, len(questions), SEARCH_BATCH):
                batch = [q.question for q in questions[i : i + SEARCH_BATCH]]
                hits = client.search(collection, batch, top_k=max(ks), mode=mode)
                rankings.extend([h.id for h in row] for row in hits)
                bar.advance(task, len(batch))
        out.seconds[mode] = time.perf_counter() - start
        out.results[mode] = retrieval_report(rankings, golds, ks)
    return out


__all__ = ["RetrievalEval", "ServiceError", "corpus_collection", "ensure_indexed", "evaluate_retrieval"]
