"""The retriever's logic: embed, encode BM25, upsert, and fuse with Qdrant's Query API."""

from __future__ import annotations

import logging
import time

import torch

from hoprl.embedding import Embedder
from hoprl.schemas import CollectionInfo, Document, Hit, IngestResponse, SearchRequest, SearchResponse
from services.retriever.settings import RetrieverSettings
from services.retriever.sparse import Bm25, mean_length
from services.retriever.store import (
    DENSE,
    SPARSE,
    TITLE,
    ClientStore,
    EdgeStore,
    PointIn,
    Prefetch,
    Query,
    ScoredPayload,
    Store,
)

log = logging.getLogger("hoprl.retriever")


class CollectionNotFound(LookupError):
    pass


def open_store(settings: RetrieverSettings) -> Store:
    """A Qdrant server when ``QDRANT_URL`` is set, else embedded storage on disk."""
    if settings.qdrant_url:
        key = settings.qdrant_api_key.get_secret_value() if settings.qdrant_api_key else None
        return ClientStore(url=settings.qdrant_url, api_key=key)
    if settings.engine == "local":
        return ClientStore(path=settings.storage_path)
    return EdgeStore(settings.storage_path)


def dense_text(doc: Document) -> str:
    """Title-aware text for the dense vector: the title carries the entity a hop asks about."""
    return f"{doc.title}. {doc.text}" if doc.title else doc.text


class HybridIndex:
    """Collections of documents searchable by dense, BM25 and fused (RRF) queries."""

    def __init__(self, settings: RetrieverSettings, embedder: Embedder | None = None) -> None:
        if settings.torch_threads:
            torch.set_num_threads(settings.torch_threads)
        self.settings = settings
        self.store = open_store(settings)
        self.embedder = embedder or Embedder(
            settings.embedder, max_length=settings.embed_max_length, batch_size=settings.embed_batch_size
        )

    def close(self) -> None:
        self.store.close()

    # -- collections ---------------------------------------------------------------------------
    def info(self, name: str) -> CollectionInfo:
        self._require(name)
        meta = self.store.meta(name)
        return CollectionInfo(
            name=name, points=self.store.count(name), embedder=meta["embedder"], dim=meta["dim"]
        )

    def collections(self) -> list[CollectionInfo]:
        return [self.info(n) for n in self.store.names()]

    def create(self, name: str, sample: list[str] | None = None) -> CollectionInfo:
        """Create ``name`` if missing; BM25's avgdl is fixed from ``sample`` (the first ingest)."""
        if not self.store.exists(name):
            avgdl = mean_length(sample) if sample else 100.0
            meta = {"embedder": self.embedder.name, "dim": self.embedder.dim, "avgdl": avgdl}
            self.store.create(name, self.embedder.dim, meta)
            log.info("created collection %s (avgdl %.1f)", name, avgdl)
        return self.info(name)

    def delete(self, name: str) -> None:
        self._require(name)
        self.store.delete(name)

    def _require(self, name: str) -> None:
        if not self.store.exists(name):
            raise CollectionNotFound(name)

    def _bm25(self, name: str) -> Bm25:
        s = self.settings
        return Bm25(k1=s.bm25_k1, b=s.bm25_b, avgdl=float(self.store.meta(name)["avgdl"]))

    # -- ingest and search ---------------------------------------------------------------------
    def ingest(self, name: str, documents: list[Document]) -> IngestResponse:
        """Upsert documents by id: ingesting the same ids again replaces, never duplicates."""
        start = time.perf_counter()
        self.create(name, sample=[f"{d.title} {d.text}" for d in documents])
        bm25 = self._bm25(name)
        dense = self.embedder.encode([dense_text(d) for d in documents])
        points = [
            PointIn(
                doc_id=d.id,
                dense=dense[i].tolist(),
                sparse=bm25.document(f"{d.title} {d.text}"),
                title_sparse=bm25.document(d.title) if d.title else ([], []),
                payload={"doc_id": d.id, "title": d.title, "text": d.text, "metadata": d.metadata},
            )
            for i, d in enumerate(documents)
        ]
        self.store.upsert(name, points)
        took = (time.perf_counter() - start) * 1000
        return IngestResponse(
            collection=name, upserted=len(points), points=self.store.count(name), took_ms=took
        )

    def search(self, request: SearchRequest) -> SearchResponse:
        start = time.perf_counter()
        self._require(request.collection)
        queries = [
            self._query(request, q, v) for q, v in zip(request.queries, self._dense(request), strict=True)
        ]
        results = self.store.query(request.collection, queries)
        took = (time.perf_counter() - start) * 1000
        hits = [[_hit(r, rank) for rank, r in enumerate(rows, start=1)] for rows in results]
        return SearchResponse(collection=request.collection, mode=request.mode, results=hits, took_ms=took)

    def _dense(self, request: SearchRequest) -> list[list[float] | None]:
        if request.mode == "sparse":
            return [None] * len(request.queries)
        return [v.tolist() for v in self.embedder.encode(request.queries)]

    def _query(self, request: SearchRequest, text: str, dense: list[float] | None) -> Query:
        s = self.settings
        depth = max(s.prefetch_limit, request.top_k)
        candidates: list[tuple[float, Prefetch]] = []
        if dense is not None:
            candidates.append((s.weight_dense, Prefetch(DENSE, dense, depth)))
        if request.mode != "dense":
            bm25 = self._bm25(request.collection)
            candidates.append((s.weight_sparse, Prefetch(SPARSE, bm25.query(text), depth)))
            if request.mode == "hybrid" and s.weight_title > 0:
                candidates.append((s.weight_title, Prefetch(TITLE, bm25.query(text), depth)))
        if request.mode == "hybrid":
            candidates = [(w, p) for w, p in candidates if w > 0]
        else:
            candidates = [(1.0, p) for _, p in candidates]
        return Query(
            prefetches=[p for _, p in candidates],
            limit=request.top_k,
            rrf_k=s.rrf_k,
            weights=[w for w, _ in candidates],
            filter=request.filter,
        )


def _hit(row: ScoredPayload, rank: int) -> Hit:
    p = row.payload
    return Hit(
        id=p["doc_id"], title=p["title"], text=p["text"], score=row.score, rank=rank, metadata=p["metadata"]
    )
