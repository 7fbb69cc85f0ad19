"""The retriever's logic: embed, encode BM25, upsert, and fuse with Qdrant's Query API."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from hoprl.embedding import Backend, Embedder, TextEncoder
from hoprl.onnx_embedding import OnnxEmbedder
from hoprl.schemas import Document
from hoprl.schemas.retriever import (
    CollectionInfo,
    CollectionOptions,
    Hit,
    IngestCheckpoint,
    IngestResponse,
    SearchRequest,
    SearchResponse,
)
from services.retriever import progress
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
    Quantized,
    Query,
    ScoredPayload,
    Store,
)

log = logging.getLogger("hoprl.retriever")
#: points fetched beyond ``top_k``, so that a tie at the cut is broken by doc id, not by the engine
TIE_MARGIN = 8


def load_embedder(
    model: str | Path | None = None,
    backend: Backend = "torch",
    max_length: int = 256,
    batch_size: int = 32,
    threads: int = 0,
    query_threads: int = 1,
) -> TextEncoder:
    """An embedder on ``backend``: torch (bf16 autocast where the CPU has it), or ONNX Runtime in
    float32 or with int8 weights (:mod:`hoprl.onnx_embedding`; here, beside its one consumer, so
    the two embedding modules import one way only). ``threads`` and ``query_threads``
    size ONNX Runtime's sessions; the torch embedder switches per block (:meth:`TextEncoder.threads`)."""
    if backend == "torch":
        return Embedder(model, max_length=max_length, batch_size=batch_size)
    return OnnxEmbedder(model, max_length=max_length, batch_size=batch_size, quantize=backend == "onnx-int8",
                        threads=threads, query_threads=query_threads)  # fmt: skip


class CollectionNotFound(LookupError):
    pass


class OptionsDiffer(Exception):
    """A create with options other than those the existing collection was made with."""

    def __init__(self, name: str, differences: dict[str, tuple[Any, Any]]) -> None:
        super().__init__(name)
        self.name, self.differences = name, differences


class CollectionInUse(Exception):
    """A delete of a collection that leases still hold (e.g. a trainer's queued or running jobs)."""

    def __init__(self, name: str, holders: list[str]) -> None:
        super().__init__(name)
        self.name, self.holders = name, holders


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


def sparse_text(doc: Document) -> str:
    """Title-aware text for BM25 (+3 to 6 points of Recall@5 over the text alone, docs/retrieval.md)."""
    return f"{doc.title} {doc.text}"


class HybridIndex:
    """Collections of documents searchable by dense, BM25 and fused (RRF) queries."""

    def __init__(self, settings: RetrieverSettings, embedder: TextEncoder | None = None) -> None:
        self.settings = settings
        self.store = open_store(settings)
        # Collection metadata changes only through this index (leases, avgdl, ingest progress); a
        # server store would otherwise answer one extra HTTP call per search for it.
        self._meta: dict[str, dict[str, Any]] = {}
        self._meta_lock = threading.Lock()  # read-modify-writes of metadata and deletes never interleave
        self.embedder = embedder or load_embedder(
            settings.embedder,
            backend=settings.embed_backend,
            max_length=settings.embed_max_length,
            batch_size=settings.embed_batch_size,
            threads=settings.torch_threads,
            query_threads=settings.search_threads,
        )

    def close(self) -> None:
        self.store.close()

    # -- collections ---------------------------------------------------------------------------
    def info(self, name: str) -> CollectionInfo:
        self._require(name)
        meta = self.meta(name)
        return CollectionInfo(
            name=name, points=self.store.count(name), embedder=meta["embedder"], dim=meta["dim"],
            leases=list(meta.get("leases", [])), options=meta.get("options", {}),
            ingests=meta.get("ingests", {}),
        )  # fmt: skip

    def collections(self) -> list[CollectionInfo]:
        return [self.info(n) for n in self.store.names()]

    def create(
        self, name: str, documents: list[Document] | None = None, options: CollectionOptions | None = None
    ) -> CollectionInfo:
        """Create ``name`` if missing, with ``options`` (default: :class:`CollectionOptions`'s).

        BM25's avgdl per field is fixed from the first ingest (``documents``, or the first batch a
        later ingest brings). Asking for an existing collection with other ``options`` raises
        :class:`OptionsDiffer`; embedded storage refuses shards and replicas
        (:class:`~services.retriever.store.NeedsServer`).
        """
        if not self.store.exists(name):
            options = options or CollectionOptions()
            meta = {
                "embedder": self.embedder.name,
                "dim": self.embedder.dim,
                "embed_max_length": self.embedder.max_length,
                **(_avgdl(documents) if documents else {"avgdl": None, "avgdl_title": None}),
                "options": options.model_dump(),
            }
            self.store.create(name, self.embedder.dim, meta, options)
            log.info("created collection %s (%s)", name, meta)
        elif options is not None:
            have = CollectionOptions.model_validate(self.meta(name).get("options", {}))
            differences = {
                k: (v, getattr(options, k)) for k, v in have.model_dump().items() if getattr(options, k) != v
            }
            if differences:
                raise OptionsDiffer(name, differences)
        return self.info(name)

    def meta(self, name: str) -> dict[str, Any]:
        if name not in self._meta:
            self._meta[name] = self.store.meta(name)
        return self._meta[name]

    def delete(self, name: str) -> None:
        """Delete ``name``; :class:`CollectionInUse` while a lease holds it."""
        with self._meta_lock:
            self._require(name)
            leases = self.meta(name).get("leases", [])
            if leases:
                raise CollectionInUse(name, list(leases))
            self._meta.pop(name, None)
            self.store.delete(name)

    def lease(self, name: str, holder: str, held: bool = True) -> list[str]:
        """Mark ``name`` in use by ``holder`` (``held=False``: release the mark); idempotent.
        The marks live in the collection's metadata, so they outlast a restart. Returns them all."""
        with self._meta_lock:
            self._require(name)
            meta = dict(self.meta(name))
            leases = set(meta.get("leases", []))
            updated = sorted(leases | {holder} if held else leases - {holder})
            if updated != sorted(leases):
                meta["leases"] = updated
                self.store.set_meta(name, meta)
                self._meta[name] = meta
            return updated

    def _require(self, name: str) -> None:
        if not self.store.exists(name):
            raise CollectionNotFound(name)

    def _bm25(self, name: str, documents: list[Document] | None = None) -> tuple[Bm25, Bm25]:
        """The (title + text, title) encoders of a collection, with its frozen avgdl values; a
        collection created empty fixes them from ``documents``, its first ingest. (A query's
        vector does not depend on avgdl, so a search of an empty collection reads any value.)"""
        meta = self.meta(name)
        if meta.get("avgdl") is None and documents:
            with self._meta_lock:
                meta = dict(self.meta(name))
                if meta.get("avgdl") is None:
                    meta |= _avgdl(documents)
                    self.store.set_meta(name, meta)
                    self._meta[name] = meta
        s = self.settings
        return (
            Bm25(k1=s.bm25_k1, b=s.bm25_b, avgdl=float(meta.get("avgdl") or 100.0)),
            Bm25(k1=s.bm25_k1, b=s.bm25_b, avgdl=float(meta.get("avgdl_title") or 3.0)),
        )

    def _quantized(self, name: str) -> Quantized | None:
        """How a dense prefetch uses the collection's quantized vectors, None where it has none."""
        options = CollectionOptions.model_validate(self.meta(name).get("options", {}))
        if options.quantization == "none":
            return None
        return Quantized(options.rescore, options.oversampling)

    def optimize(self, name: str) -> CollectionInfo:
        """Build the collection's HNSW graph and quantized vectors now (embedded storage; a Qdrant
        server's optimizers run by themselves)."""
        self._require(name)
        self.store.optimize(name)
        return self.info(name)

    # -- ingest and search ---------------------------------------------------------------------
    def ingest(
        self, name: str, documents: list[Document], checkpoint: IngestCheckpoint | None = None
    ) -> IngestResponse:
        """Upsert documents by id: ingesting the same ids again replaces, never duplicates.

        With a ``checkpoint`` (a batch of a source file), each point also records its file and line
        (payload ``origin``), a document id stored from another line of the same file raises
        :class:`~services.retriever.progress.DuplicateId` before anything is written, and once
        the batch is stored the collection's progress record takes it in.
        """
        start = time.perf_counter()
        self.create(name, documents)
        if checkpoint is not None:
            progress.check_checkpoint(self.meta(name), checkpoint, len(documents))
            stored = self.store.payloads(name, [d.id for d in documents], ["origin"])
            progress.check_duplicates(documents, checkpoint, stored)
        text_bm25, title_bm25 = self._bm25(name, documents)
        with self.embedder.threads(self.settings.torch_threads):
            dense = self.embedder.encode([dense_text(d) for d in documents])
        points = [
            PointIn(
                doc_id=d.id,
                dense=dense[i].tolist(),
                # equal BM25 scores rank by the doc id's hash in every build (sparse.tie_factor)
                sparse=text_bm25.document(sparse_text(d), key=d.id),
                title_sparse=title_bm25.document(d.title, key=d.id),
                payload={"doc_id": d.id, "title": d.title, "text": d.text, "metadata": d.metadata}
                | progress.origin(checkpoint, i),
            )
            for i, d in enumerate(documents)
        ]
        self.store.upsert(name, points)
        if checkpoint is not None:  # only once Qdrant has the batch (its upsert waits for that)
            with self._meta_lock:
                meta = progress.record(dict(self.meta(name)), checkpoint, len(documents))
                self.store.set_meta(name, meta)
                self._meta[name] = meta
        took = (time.perf_counter() - start) * 1000
        return IngestResponse(
            collection=name, upserted=len(points), points=self.store.count(name), took_ms=took
        )

    def search(self, request: SearchRequest) -> SearchResponse:
        """Dense, BM25, or hybrid: RRF of both, then (by default) a pseudo-relevance feedback round.

        The feedback round re-queries BM25 with the question plus the first round's top paragraph,
        against titles and against title + text, and fuses all four lists: the top paragraph of a
        multi-hop question usually names the bridge entity whose own page is the second hop.
        """
        start = time.perf_counter()
        self._require(request.collection)
        s = self.settings
        bm25, _ = self._bm25(request.collection)
        depth = max(s.prefetch_limit, request.top_k)
        dense = self._dense(request)
        rounds = []
        for text, vector in zip(request.queries, dense, strict=True):
            prefetches, weights = [], []
            if vector is not None:
                prefetches.append(Prefetch(DENSE, vector, depth, self._quantized(request.collection)))
                weights.append(s.weight_dense)
            if request.mode != "dense":
                prefetches.append(Prefetch(SPARSE, bm25.query(text), depth))
                weights.append(s.weight_sparse)
            rounds.append(Query(prefetches, request.top_k, s.rrf_k, weights, request.filter))
        feedback = request.feedback if request.feedback is not None else s.feedback
        if request.mode == "hybrid" and feedback:
            firsts = self._query(request.collection, [replace(q, limit=1) for q in rounds])
            for text, query, first in zip(request.queries, rounds, firsts, strict=True):
                if first:
                    expanded = bm25.query(f"{text} {first[0].payload['text']}")
                    query.prefetches += [Prefetch(TITLE, expanded, depth), Prefetch(SPARSE, expanded, depth)]
                    query.weights += [s.weight_feedback_title, s.weight_feedback_sparse]
        results = self._query(request.collection, rounds)
        took = (time.perf_counter() - start) * 1000
        hits = [[_hit(r, rank) for rank, r in enumerate(rows, start=1)] for rows in results]
        return SearchResponse(collection=request.collection, mode=request.mode, results=hits, took_ms=took)

    def _query(self, name: str, queries: list[Query]) -> list[list[ScoredPayload]]:
        """The store's results, equal scores ordered by doc id.

        Qdrant's RRF returns points with equal fused scores (one ranked 1st by dense and 2nd by
        BM25, another the other way round: common on short queries) in an arbitrary order that
        changes from call to call. That made the same search return different orders, and through
        the feedback round (which expands with the first hit) different scores and documents. So
        ``TIE_MARGIN`` more points are fetched, sorted by (score, doc id), and cut.

        Ties inside one prefetch list still take their ranks in the engine's order, which is
        stable for one shard but can differ between two shards built from the same documents.
        Fusing here instead settled those too, but made the hybrid p50 1.5-1.8x slower and
        batched throughput 2x lower (``bench/retrieval.py``, 2026-11-24), so Qdrant still fuses.
        """
        wider = [replace(q, limit=q.limit + TIE_MARGIN) for q in queries]
        results = self.store.query(name, wider)
        return [
            sorted(rows, key=lambda r: (-r.score, r.payload["doc_id"]))[: q.limit]
            for q, rows in zip(queries, results, strict=True)
        ]

    def _dense(self, request: SearchRequest) -> list[list[float] | None]:
        if request.mode == "sparse":
            return [None] * len(request.queries)
        with self.embedder.threads(self.settings.search_threads):
            return [v.tolist() for v in self.embedder.encode(request.queries)]


def _avgdl(documents: list[Document]) -> dict[str, float]:
    """BM25's mean document length per field, from the documents a collection is first fed."""
    return {
        "avgdl": mean_length([sparse_text(d) for d in documents]),
        "avgdl_title": mean_length([d.title for d in documents]),
    }


def _hit(row: ScoredPayload, rank: int) -> Hit:
    p = row.payload
    return Hit(
        id=p["doc_id"], title=p["title"], text=p["text"], score=row.score, rank=rank, metadata=p["metadata"]
    )
