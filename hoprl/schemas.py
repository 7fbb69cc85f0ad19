"""Wire contracts shared by the library, the services and their clients.

The common question schema is the one of ``../shared/data`` (one JSON object per line)::

    {"id", "dataset", "split", "question", "answers": [gold first, then aliases], "type",
     "paragraphs": [{"title", "text", "is_gold"}], "gold_titles": [...]}

Every loader (local JSONL, Hugging Face hub, the synthetic world) produces :class:`Question`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

SearchMode = Literal["dense", "sparse", "hybrid"]


class Paragraph(BaseModel):
    title: str
    text: str
    is_gold: bool = False


class Question(BaseModel):
    """One question in the common schema; ``answers[0]`` is the gold answer, the rest aliases."""

    model_config = ConfigDict(extra="ignore")

    id: str
    dataset: str
    split: str
    question: str
    answers: list[str] = Field(default_factory=list)
    type: str | None = None
    paragraphs: list[Paragraph] = Field(default_factory=list)
    gold_titles: list[str] = Field(default_factory=list)

    @property
    def answerable(self) -> bool:
        """Unanswerable questions (the synthetic world's) carry no answers."""
        return bool(self.answers)


class Document(BaseModel):
    """A retrievable passage. ``id`` is stable: see :func:`hoprl.data.corpus.doc_id`."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=256)
    title: str = Field(default="", max_length=2_000)
    text: str = Field(min_length=1, max_length=100_000)
    metadata: dict[str, Any] = Field(default_factory=dict)


class Hit(BaseModel):
    id: str
    title: str
    text: str
    score: float
    rank: int
    metadata: dict[str, Any] = Field(default_factory=dict)


class ErrorBody(BaseModel):
    """Every 4xx/5xx answer of every service has this JSON body."""

    error: str = Field(description="machine-readable error code, e.g. 'collection_not_found'")
    message: str = Field(description="what went wrong and how to fix it")
    detail: Any = None


class IngestRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    documents: list[Document] = Field(min_length=1)


class IngestResponse(BaseModel):
    collection: str
    upserted: int
    points: int = Field(description="points in the collection after the ingest")
    took_ms: float


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    collection: str = Field(min_length=1, max_length=128)
    queries: list[str] = Field(min_length=1)
    top_k: int = Field(default=5, ge=1, le=100)
    mode: SearchMode = "hybrid"
    filter: dict[str, Any] | None = Field(
        default=None,
        description="payload filter: {field: value} or {field: [values]} on document metadata",
    )
    feedback: bool | None = Field(
        default=None,
        description="hybrid only: add the second (pseudo-relevance feedback) round; "
        "default: the service's RETRIEVER_FEEDBACK",
    )

    @field_validator("queries")
    @classmethod
    def _non_empty(cls, queries: list[str]) -> list[str]:
        for i, q in enumerate(queries):
            if not q.strip():
                raise ValueError(f"queries[{i}] is empty; every query needs at least one word")
        return queries


class SearchResponse(BaseModel):
    collection: str
    mode: SearchMode
    results: list[list[Hit]] = Field(description="one ranked hit list per query, in query order")
    took_ms: float


class CollectionInfo(BaseModel):
    name: str
    points: int
    embedder: str
    dim: int
