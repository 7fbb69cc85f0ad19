"""Retriever settings: environment variables with the ``RETRIEVER_`` prefix (``QDRANT_URL`` too)."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import SettingsConfigDict

from hoprl.embedding import Backend
from hoprl.schemas.retriever import MAX_DOCUMENTS, MAX_QUERIES, MAX_QUERY_CHARS, MAX_TOP_K
from services.settings import ServiceSettings


class RetrieverSettings(ServiceSettings):
    """Where vectors live, how documents are embedded, the fusion recipe and the request limits.

    Every field reads ``RETRIEVER_<FIELD>`` (e.g. ``RETRIEVER_STORAGE_PATH``); the Qdrant server
    is also read from the conventional ``QDRANT_URL`` / ``QDRANT_API_KEY``.
    """

    model_config = SettingsConfigDict(env_prefix="RETRIEVER_", extra="forbid")

    storage_path: Path = Field(Path(".hoprl/qdrant"), description="embedded Qdrant folder")
    qdrant_url: str | None = Field(
        None,
        validation_alias=AliasChoices("QDRANT_URL", "RETRIEVER_QDRANT_URL"),
        description="a Qdrant server; unset = embedded storage at storage_path",
    )
    qdrant_api_key: SecretStr | None = Field(
        None, validation_alias=AliasChoices("QDRANT_API_KEY", "RETRIEVER_QDRANT_API_KEY")
    )
    engine: str = Field(
        "edge",
        description="embedded engine when no QDRANT_URL: 'edge' (qdrant-edge, default) or "
        "'local' (qdrant-client's pure-Python local mode, slow; for parity tests)",
    )
    embedder: str | None = Field(None, description="embedder folder or HF id; unset = bundled MiniLM")
    embed_backend: Backend = Field(
        "onnx-int8",
        description="'onnx-int8' (ONNX Runtime, int8 weights: the fastest), 'onnx' (float32) or 'torch' "
        "(bf16 autocast where the CPU has it); the onnx backends export the model once into ~/.cache/hoprl",
    )
    embed_max_length: int = Field(
        64,
        ge=16,
        le=512,
        description="tokens embedded per document or query (BM25 always sees the whole text): 64 indexes "
        "1.9x faster than 128 at equal hybrid recall on hotpotqa_dev and 2wiki_dev; MuSiQue loses ~2 points "
        "of Recall@5, so set 128 for long, paraphrased paragraphs (docs/retrieval.md)",
    )
    embed_batch_size: int = Field(32, ge=1, le=512)
    torch_threads: int = Field(0, ge=0, description="encoder threads for indexing; 0 = every core")
    query_threads: int | None = Field(
        None,
        ge=0,
        description="encoder threads for a search's queries; unset = every core on the onnx backends "
        "(ONNX Runtime's pool degrades gracefully when the other core is busy) and 1 on torch (whose "
        "OpenMP pool made single-query p90 ~800 ms under load, measured)",
    )

    bm25_k1: float = Field(1.2, gt=0)
    bm25_b: float = Field(0.75, ge=0, le=1)
    # The fusion recipe below was chosen by the ablation in docs/retrieval.md (hotpotqa_dev only;
    # 2wiki and musique were never tuned on). Qdrant's RRF: each hit adds 1 / ((rank0 + 1) / w + k - 1).
    rrf_k: int = Field(2, ge=1, description="Qdrant's RRF k (its default; the textbook k plus one)")
    weight_dense: float = Field(1.0, gt=0, description="RRF weight of the dense list")
    weight_sparse: float = Field(1.0, gt=0, description="RRF weight of the BM25 (title + text) list")
    feedback: bool = Field(
        True,
        description="hybrid search adds a second round: BM25 of the question plus the first round's "
        "top paragraph, against titles and against title + text (finds the bridge entity's page)",
    )
    weight_feedback_title: float = Field(2.0, gt=0, description="RRF weight, feedback vs titles")
    weight_feedback_sparse: float = Field(1.0, gt=0, description="RRF weight, feedback vs title + text")
    prefetch_limit: int = Field(100, ge=1, le=1000, description="candidates per prefetch before fusion")

    default_collection: str = Field("default", description="collection for the Search-R1 /retrieve route")
    # The request models publish these ceilings in OpenAPI (hoprl.schemas.retriever); a setting may
    # lower its limit (413 / 422 naming it), not raise it past what the schema promises.
    max_queries: int = Field(MAX_QUERIES, ge=1, le=MAX_QUERIES, description="queries per search request")
    max_query_chars: int = Field(
        MAX_QUERY_CHARS, ge=1, le=MAX_QUERY_CHARS, description="characters per query (search and /retrieve)"
    )
    max_documents: int = Field(
        MAX_DOCUMENTS, ge=1, le=MAX_DOCUMENTS, description="documents per ingest request"
    )
    max_top_k: int = Field(MAX_TOP_K, ge=1, le=MAX_TOP_K, description="hits per query")

    @property
    def search_threads(self) -> int:
        """Threads for query encoding (0 = every core), resolved from the backend when unset."""
        if self.query_threads is not None:
            return self.query_threads
        return 1 if self.embed_backend == "torch" else 0

    @field_validator("engine")
    @classmethod
    def _engine(cls, value: str) -> str:
        if value not in ("edge", "local"):
            raise ValueError(f"RETRIEVER_ENGINE must be 'edge' or 'local', got {value!r}")
        return value
