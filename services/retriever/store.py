"""The two Qdrant engines behind the retriever, with one small interface.

- :class:`EdgeStore` (embedded default): ``qdrant-edge-py``, the real Qdrant engine in-process,
  one shard folder per collection under the storage path. Chosen over qdrant-client's local mode,
  which is pure Python: a hybrid RRF query over ~5k points took 145 ms there and 0.35 ms here
  (measured on this project's 2-core machine).
- :class:`ClientStore`: ``qdrant-client`` against a Qdrant server (``QDRANT_URL``); the tests also
  run it in qdrant-client's local mode, so one suite covers both code paths.

Both speak the same Query API: prefetches of named dense / sparse vectors fused by weighted RRF.
A collection's :class:`~hoprl.schemas.retriever.CollectionOptions` (on-disk vectors and HNSW,
int8 or binary quantization, shards and replicas) map onto each engine's own configuration
classes here; the embedded engines hold one shard and refuse more (:class:`NeedsServer`).
"""

from __future__ import annotations

import fcntl
import json
import shutil
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import qdrant_edge as qe
from qdrant_client import QdrantClient, models

from hoprl.schemas.retriever import CollectionOptions
from services.errors import StartupError

Sparse = tuple[list[int], list[float]]
DENSE, SPARSE, TITLE = "dense", "bm25", "title_bm25"
_NAMESPACE = uuid.UUID("6f0d3a52-5b2f-4c8e-9a57-1b7e0c1d2e3f")


def point_id(doc_id: str) -> str:
    """Qdrant point ids are ints or UUIDs; a doc id maps to a stable UUID5 (idempotent upserts)."""
    return str(uuid.uuid5(_NAMESPACE, doc_id))


@dataclass
class PointIn:
    doc_id: str
    dense: list[float]
    sparse: Sparse
    title_sparse: Sparse
    payload: dict[str, Any]

    def build(self, point: Any, sparse_vector: Any) -> Any:
        """This point in one engine's classes: ``point`` (``qe.Point``, ``models.PointStruct``) with
        the named vectors, the sparse ones built by ``sparse_vector``."""
        vector = {
            DENSE: self.dense,
            SPARSE: sparse_vector(indices=self.sparse[0], values=self.sparse[1]),
            TITLE: sparse_vector(indices=self.title_sparse[0], values=self.title_sparse[1]),
        }
        return point(id=point_id(self.doc_id), vector=vector, payload=self.payload)


@dataclass(frozen=True)
class Quantized:
    """Search-time use of a collection's quantized vectors (its ``rescore`` and ``oversampling``)."""

    rescore: bool
    oversampling: float


@dataclass
class Prefetch:
    """One candidate list: a named vector, its query vector, how many candidates, and for a dense
    list of a quantized collection how to use the quantized vectors."""

    using: str
    vector: list[float] | Sparse
    limit: int
    quantized: Quantized | None = None


@dataclass
class Query:
    prefetches: list[Prefetch]
    limit: int
    rrf_k: int = 60
    weights: list[float] = field(default_factory=list)
    filter: dict[str, Any] | None = None


@dataclass
class ScoredPayload:
    payload: dict[str, Any]
    score: float


class Store(Protocol):
    def names(self) -> list[str]: ...
    def exists(self, name: str) -> bool: ...
    def create(self, name: str, dim: int, meta: dict[str, Any], options: CollectionOptions) -> None: ...
    def meta(self, name: str) -> dict[str, Any]: ...
    def set_meta(self, name: str, meta: dict[str, Any]) -> None: ...
    def delete(self, name: str) -> None: ...
    def count(self, name: str) -> int: ...
    def upsert(self, name: str, points: list[PointIn]) -> None: ...
    def payloads(self, name: str, doc_ids: list[str], fields: list[str]) -> dict[str, dict[str, Any]]: ...
    def optimize(self, name: str) -> None: ...
    def query(self, name: str, queries: list[Query]) -> list[list[ScoredPayload]]: ...
    def close(self) -> None: ...


class NeedsServer(ValueError):
    """An option only a Qdrant server honours (shards, replicas), asked of embedded storage."""


def refuse_cluster_options(options: CollectionOptions) -> None:
    """Embedded storage keeps one shard of each collection: more shards or replicas is an error."""
    asked = {"shard_number": options.shard_number, "replication_factor": options.replication_factor}
    wanted = [f"{k} {v}" for k, v in asked.items() if v > 1]
    if wanted:
        raise NeedsServer(
            f"{' and '.join(wanted)} need a Qdrant server (set QDRANT_URL, e.g. the compose profile "
            "qdrant-cluster); embedded storage keeps one shard of each collection"
        )


def _quantization(options: CollectionOptions, engine: Any) -> Any:
    """The quantization config in one engine's classes (``qe`` or ``models``), None without."""
    if options.quantization == "int8":
        if engine is qe:
            return qe.ScalarQuantizationConfig(type=qe.ScalarType.Int8, always_ram=options.always_ram)
        config = models.ScalarQuantizationConfig(type=models.ScalarType.INT8, always_ram=options.always_ram)
        return models.ScalarQuantization(scalar=config)
    if options.quantization == "binary":
        if engine is qe:
            return qe.BinaryQuantizationConfig(always_ram=options.always_ram)
        return models.BinaryQuantization(
            binary=models.BinaryQuantizationConfig(always_ram=options.always_ram)
        )
    return None


#: Qdrant's HNSW defaults (m, ef_construct, full_scan_threshold in KB), which qdrant-edge's config
#: class wants spelled out when only the graph's placement changes
HNSW_DEFAULTS = (16, 100, 10_000)


def qdrant_filter(filter: dict[str, Any] | None, engine: Any) -> Any:
    """``{"field": value}`` or ``{"field": [values]}`` on document metadata as a Qdrant filter in
    one engine's classes (``qe`` or ``models``: both name them ``Filter``, ``FieldCondition`` and
    ``MatchAny``); None without a filter."""
    if not filter:
        return None
    values = {key: value if isinstance(value, list) else [value] for key, value in filter.items()}
    match = engine.MatchAny
    must = [engine.FieldCondition(key=f"metadata.{k}", match=match(any=v)) for k, v in values.items()]
    return engine.Filter(must=must)


class StorageInUse(StartupError):
    """The embedded storage folder is held by another retriever (one process per folder)."""


class FolderLock:
    """An exclusive lock on an embedded storage folder, held until :meth:`release`.

    Both embedded engines open a folder in one process only; a second one failed deep inside the
    engine (qdrant-edge: ``Can't init WAL``; qdrant-client's local mode: a RuntimeError). This lock
    is taken first, so the second retriever stops at once with a message that names the folder and
    the setting. ``flock`` locks belong to the open file, so two stores in one process conflict
    too, and the kernel drops the lock when a process dies (no stale lock file to clean up).
    """

    NAME = ".hoprl-retriever.lock"

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.file = (root / self.NAME).open("a")
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.file.close()
            raise StorageInUse(
                f"the retriever's storage folder {root.resolve()} is in use by another process (a "
                "retriever, or a command that runs one, already opened it; embedded Qdrant opens a "
                "folder in one process only). Stop that process, give this retriever its own folder "
                "with RETRIEVER_STORAGE_PATH, or share one Qdrant server through QDRANT_URL."
            ) from None

    def release(self) -> None:
        self.file.close()  # closing the file releases the lock


class EdgeStore:
    """Embedded Qdrant (qdrant-edge): ``<root>/<collection>/`` holds a shard and ``meta.json``."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.lock_file = FolderLock(self.root)
        self.shards: dict[str, qe.EdgeShard] = {}
        self.lock = threading.RLock()
        for meta in sorted(self.root.glob("*/meta.json")):
            self.shards[meta.parent.name] = qe.EdgeShard.load(str(meta.parent / "shard"))

    def names(self) -> list[str]:
        return sorted(self.shards)

    def exists(self, name: str) -> bool:
        return name in self.shards

    def create(self, name: str, dim: int, meta: dict[str, Any], options: CollectionOptions) -> None:
        refuse_cluster_options(options)
        with self.lock:
            if name in self.shards:
                return
            folder = self.root / name
            if folder.exists():  # an unfinished create (no meta.json): a process died inside it
                shutil.rmtree(folder)
            (folder / "shard").mkdir(parents=True)
            m, ef, full_scan = HNSW_DEFAULTS
            hnsw = qe.HnswIndexConfig(m=m, ef_construct=ef, full_scan_threshold=full_scan, on_disk=True)
            dense = qe.EdgeVectorParams(
                size=dim, distance=qe.Distance.Cosine, on_disk=options.on_disk,
                quantization_config=_quantization(options, qe),
                hnsw_config=hnsw if options.hnsw_on_disk else None,
            )  # fmt: skip
            sparse = {
                n: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf, on_disk=options.sparse_on_disk)
                for n in (SPARSE, TITLE)
            }
            config = qe.EdgeConfig(vectors={DENSE: dense}, sparse_vectors=sparse)
            self.shards[name] = qe.EdgeShard.create(str(folder / "shard"), config)
            # meta.json is written last: a folder without it is an unfinished create, ignored on load.
            (folder / "meta.json").write_text(json.dumps(meta))

    def meta(self, name: str) -> dict[str, Any]:
        return dict(json.loads((self.root / name / "meta.json").read_text()))

    def set_meta(self, name: str, meta: dict[str, Any]) -> None:
        """Replace meta.json atomically (a rename), so a crash leaves the old or the new one."""
        with self.lock:
            folder = self.root / name
            (folder / "meta.json.tmp").write_text(json.dumps(meta))
            (folder / "meta.json.tmp").replace(folder / "meta.json")

    def delete(self, name: str) -> None:
        with self.lock:
            shard = self.shards.pop(name)
            shard.close()
            shutil.rmtree(self.root / name)

    def count(self, name: str) -> int:
        return int(self.shards[name].info().points_count)

    def upsert(self, name: str, points: list[PointIn]) -> None:
        ops = [p.build(qe.Point, qe.SparseVector) for p in points]
        with self.lock:
            shard = self.shards[name]
            shard.update(qe.UpdateOperation.upsert_points(ops))
            shard.flush()

    def payloads(self, name: str, doc_ids: list[str], fields: list[str]) -> dict[str, dict[str, Any]]:
        """The ``fields`` of the stored points among ``doc_ids``, by doc id (``doc_id`` is always read)."""
        records = self.shards[name].retrieve([point_id(d) for d in doc_ids], ["doc_id", *fields], False)
        return {r.payload["doc_id"]: dict(r.payload) for r in records if r.payload}

    def optimize(self, name: str) -> None:
        """Build the HNSW graph and the quantized vectors: qdrant-edge runs no optimizer of its own,
        so until this runs, points sit in plain segments searched exhaustively."""
        with self.lock:
            self.shards[name].optimize()

    def query(self, name: str, queries: list[Query]) -> list[list[ScoredPayload]]:
        shard = self.shards[name]
        out = []
        for q in queries:
            flt = qdrant_filter(q.filter, qe)
            if len(q.prefetches) == 1:
                p = q.prefetches[0]
                request = qe.QueryRequest(
                    limit=q.limit,
                    query=self._nearest(p),
                    filter=flt,
                    with_payload=True,
                    params=self._params(p),
                )
            else:
                request = qe.QueryRequest(
                    limit=q.limit,
                    prefetches=[
                        qe.Prefetch(limit=p.limit, query=self._nearest(p), filter=flt, params=self._params(p))
                        for p in q.prefetches
                    ],
                    # the stub types Fusion.Rrf as its own class; the engine accepts it as a query
                    query=qe.Fusion.Rrf(k=q.rrf_k, weights=q.weights or None),  # type: ignore[arg-type]
                    with_payload=True,
                )
            out.append([ScoredPayload(dict(r.payload or {}), float(r.score)) for r in shard.query(request)])
        return out

    @staticmethod
    def _nearest(p: Prefetch) -> qe.Query:
        if isinstance(p.vector, tuple):
            return qe.Query.Nearest(qe.SparseVector(indices=p.vector[0], values=p.vector[1]), using=p.using)
        return qe.Query.Nearest(p.vector, using=p.using)

    @staticmethod
    def _params(p: Prefetch) -> qe.SearchParams | None:
        if p.quantized is None:
            return None
        quantization = qe.QuantizationSearchParams(
            rescore=p.quantized.rescore, oversampling=p.quantized.oversampling
        )
        return qe.SearchParams(quantization=quantization)

    def close(self) -> None:
        with self.lock:
            for shard in self.shards.values():
                shard.close()
            self.shards.clear()
        self.lock_file.release()


class ClientStore:
    """qdrant-client: a Qdrant server (``url``) or qdrant-client's local mode (``path``)."""

    def __init__(self, url: str | None = None, path: Path | None = None, api_key: str | None = None) -> None:
        self.lock_file: FolderLock | None = None
        if url:
            self.client = QdrantClient(url=url, api_key=api_key)
        else:
            assert path is not None
            self.lock_file = FolderLock(Path(path))
            self.client = QdrantClient(path=str(path))

    def names(self) -> list[str]:
        return sorted(c.name for c in self.client.get_collections().collections)

    def exists(self, name: str) -> bool:
        return bool(self.client.collection_exists(name))

    def create(self, name: str, dim: int, meta: dict[str, Any], options: CollectionOptions) -> None:
        if self.lock_file is not None:  # qdrant-client's local mode: one shard, like qdrant-edge
            refuse_cluster_options(options)
        if self.exists(name):
            return
        dense = models.VectorParams(
            size=dim, distance=models.Distance.COSINE, on_disk=options.on_disk,
            hnsw_config=models.HnswConfigDiff(on_disk=True) if options.hnsw_on_disk else None,
            quantization_config=_quantization(options, models),
        )  # fmt: skip
        idf = models.SparseVectorParams(
            modifier=models.Modifier.IDF, index=models.SparseIndexParams(on_disk=options.sparse_on_disk)
        )
        self.client.create_collection(
            name,
            vectors_config={DENSE: dense},
            sparse_vectors_config={SPARSE: idf, TITLE: idf},
            shard_number=options.shard_number,
            replication_factor=options.replication_factor,
            metadata=meta,
        )

    def meta(self, name: str) -> dict[str, Any]:
        return dict(self.client.get_collection(name).config.metadata or {})

    def set_meta(self, name: str, meta: dict[str, Any]) -> None:
        self.client.update_collection(name, metadata=meta)

    def delete(self, name: str) -> None:
        self.client.delete_collection(name)

    def count(self, name: str) -> int:
        return int(self.client.count(name, exact=True).count)

    def upsert(self, name: str, points: list[PointIn]) -> None:
        structs = [p.build(models.PointStruct, models.SparseVector) for p in points]
        self.client.upsert(name, structs, wait=True)

    def payloads(self, name: str, doc_ids: list[str], fields: list[str]) -> dict[str, dict[str, Any]]:
        records = self.client.retrieve(
            name, [point_id(d) for d in doc_ids], with_payload=["doc_id", *fields], with_vectors=False
        )
        return {r.payload["doc_id"]: dict(r.payload) for r in records if r.payload}

    def optimize(self, name: str) -> None:
        """Nothing to do: a Qdrant server's optimizers run by themselves (and local mode has none)."""

    def query(self, name: str, queries: list[Query]) -> list[list[ScoredPayload]]:
        requests = [self._request(q) for q in queries]
        responses = self.client.query_batch_points(name, requests)
        return [[ScoredPayload(dict(p.payload or {}), float(p.score)) for p in r.points] for r in responses]

    def _request(self, q: Query) -> models.QueryRequest:
        flt = qdrant_filter(q.filter, models)
        if len(q.prefetches) == 1:
            p = q.prefetches[0]
            return models.QueryRequest(
                query=self._vector(p), using=p.using, limit=q.limit, filter=flt, with_payload=True,
                params=self._params(p),
            )  # fmt: skip
        return models.QueryRequest(
            prefetch=[
                models.Prefetch(
                    query=self._vector(p), using=p.using, limit=p.limit, filter=flt, params=self._params(p)
                )
                for p in q.prefetches
            ],
            query=models.RrfQuery(rrf=models.Rrf(k=q.rrf_k, weights=q.weights or None)),
            limit=q.limit,
            with_payload=True,
        )

    @staticmethod
    def _vector(p: Prefetch) -> list[float] | models.SparseVector:
        if isinstance(p.vector, tuple):
            return models.SparseVector(indices=p.vector[0], values=p.vector[1])
        return p.vector

    @staticmethod
    def _params(p: Prefetch) -> models.SearchParams | None:
        if p.quantized is None:
            return None
        quantization = models.QuantizationSearchParams(
            rescore=p.quantized.rescore, oversampling=p.quantized.oversampling
        )
        return models.SearchParams(quantization=quantization)

    def close(self) -> None:
        self.client.close()
        if self.lock_file is not None:
            self.lock_file.release()
