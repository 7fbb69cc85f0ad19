"""Retrieval evaluation of a question file through the retriever service."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from hoprl.clients.http import ServiceError
from hoprl.clients.retriever import RetrieverClient
from hoprl.data.corpus import corpus_match, doc_id, gold_ids, gold_paragraphs, pool
from hoprl.domain import Question, SearchMode
from hoprl.metrics.retrieval import retrieval_report
from hoprl.schemas import Document

INGEST_BATCH = 256
SEARCH_BATCH = 64
#: hits of the search that finds a gold paragraph's passages in a corpus (:func:`corpus_gold`)
GOLD_LOOKUP_K = 10
GOLD_QUERY_CHARS = 2_000


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


def corpus_gold(
    client: RetrieverClient, collection: str, questions: Sequence[Question]
) -> list[dict[str, str | None]]:
    """Each question's gold paragraphs found in a corpus ``collection`` whose ids are its own.

    For every gold paragraph (:func:`hoprl.data.corpus.gold_paragraphs`) the collection is searched
    (hybrid) with the paragraph's title and text; of the top :data:`GOLD_LOOKUP_K` hits,
    :func:`hoprl.data.corpus.corpus_match` picks the passage with its title, and of several with it
    the one whose text overlaps the paragraph's most. Returns, per question, the paragraph's id in
    its pooled corpus (:func:`hoprl.data.corpus.doc_id`) -> the corpus passage's id, or ``None``
    when no hit has the title (the paragraph is not in the corpus: it stays gold and is never
    retrieved, so it lowers recall).
    """
    golds = [gold_paragraphs(q) for q in questions]
    flat = [p for ps in golds for p in ps]
    found: list[str | None] = []
    for i in range(0, len(flat), SEARCH_BATCH):
        batch = flat[i : i + SEARCH_BATCH]
        queries = [f"{p.title}\n{p.text}"[:GOLD_QUERY_CHARS] for p in batch]
        hits = client.search(collection, queries, top_k=GOLD_LOOKUP_K, mode="hybrid")
        for p, row in zip(batch, hits, strict=True):
            match = corpus_match(p, [Document(id=h.id, title=h.title, text=h.text) for h in row])
            found.append(match[0] if match else None)
    out, at = [], 0
    for ps in golds:
        out.append({doc_id(p.title, p.text): found[at + j] for j, p in enumerate(ps)})
        at += len(ps)
    return out


def gold_sets(matches: Sequence[dict[str, str | None]]) -> list[set[str]]:
    """The gold ids to score a corpus's rankings against: each matched passage's corpus id, and an
    unmatched paragraph's own id (which no corpus passage has: a gold never retrieved)."""
    return [{found or own for own, found in m.items()} for m in matches]


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
    corpus: str | None = None,
) -> RetrievalEval:
    """Pool, index (through the service) and score every mode: Recall@K, Full-Recall@K, mAP.

    ``corpus``: search this collection (a corpus ingested with ``hoprl ingest-corpus``) instead of
    the pooled paragraphs; the gold paragraphs are found in it by title and text (:func:`corpus_gold`).
    """
    if corpus is None:
        documents = pool(questions)
        collection = corpus_collection(name, documents)
        rate = ensure_indexed(client, collection, documents)
        out = RetrievalEval(collection=collection, documents=len(documents), index_rate=rate)
        golds = [gold_ids(q) for q in questions]
    else:
        points = {c.name: c.points for c in client.collections()}.get(corpus)
        if points is None:
            raise ValueError(f"collection {corpus!r} does not exist: ingest it first (hoprl ingest-corpus)")
        out = RetrievalEval(collection=corpus, documents=points, index_rate=0.0)
        golds = gold_sets(corpus_gold(client, corpus, questions))
    for mode in modes:
        rankings: list[list[str]] = []
        start = time.perf_counter()
        with progress() as bar:
            task = bar.add_task(f"searching ({mode})", total=len(questions))
            for i in range(0, len(questions), SEARCH_BATCH):
                batch = [q.question for q in questions[i : i + SEARCH_BATCH]]
                hits = client.search(out.collection, batch, top_k=max(ks), mode=mode)
                rankings.extend([h.id for h in row] for row in hits)
                bar.advance(task, len(batch))
        out.seconds[mode] = time.perf_counter() - start
        out.results[mode] = retrieval_report(rankings, golds, ks)
    return out


__all__ = [
    "RetrievalEval",
    "ServiceError",
    "corpus_collection",
    "corpus_gold",
    "ensure_indexed",
    "evaluate_retrieval",
    "gold_sets",
]
