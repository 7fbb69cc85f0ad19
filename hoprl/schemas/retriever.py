"""The retriever service's wire contracts: ingest, search, collections, Search-R1's ``/retrieve``.

A search request's ``filter`` is validated here, so a bad condition is a 422 that names it before
the index sees it (Qdrant's JSON paths and int64 integers set the bounds).
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, StringConstraints, field_validator

from hoprl.domain import SearchMode
from hoprl.schemas import Document

#: a metadata field name, or a dotted path into nested metadata (``"kind"``, ``"source.site"``):
#: the keys Qdrant's JSON paths accept without quoting ("" or "a b" made it fail: invalid JSON path)
FILTER_KEY = r"^[A-Za-z0-9_-]{1,64}(\.[A-Za-z0-9_-]{1,64}){0,7}$"
_INT64 = 2**63 - 1  # Qdrant keeps integers as int64
FilterKey = Annotated[str, StringConstraints(pattern=FILTER_KEY)]
FilterInt = Annotated[StrictInt, Field(ge=-_INT64, le=_INT64)]
FilterValue = (
    StrictStr
    | FilterInt
    | Annotated[list[StrictStr], Field(min_length=1, max_length=256)]
    | Annotated[list[FilterInt], Field(min_length=1, max_length=256)]
)


class Hit(BaseModel):
    id: str
    title: str
    text: str
    score: float
    rank: int
    metadata: dict[str, Any] = Field(default_factory=dict)


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
    filter: dict[FilterKey, FilterValue] | None = Field(
        default=None,
        max_length=32,
        description="payload filter on document metadata, every condition must hold: {field: value} "
        "matches documents whose metadata field equals value, {field: [values]} any of the values. "
        "A field is a name of letters, digits, '_' and '-' (a dotted path reaches nested metadata); a "
        "value is a string or an integer, a list holds strings only or integers only",
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

    @field_validator("filter", mode="before")
    @classmethod
    def _filter_shape(cls, filter: Any) -> Any:
        """Name the first bad condition in plain words (the type errors of a union are a list of 4)."""
        if not isinstance(filter, dict):
            return filter  # null, or the type error "a valid dictionary"
        for key, value in filter.items():
            if not isinstance(key, str) or not re.match(FILTER_KEY, key):
                raise ValueError(
                    f"filter key {key!r} is not a metadata field name: use letters, digits, '_' or '-' "
                    "(1-64 of them; a '.' between names reaches nested metadata)"
                )
            values = value if isinstance(value, list) else [value]
            kinds = {_filter_kind(v) for v in values}
            if not values or None in kinds or len(kinds) > 1:
                raise ValueError(
                    f"filter[{key!r}] = {json.dumps(value)} cannot be matched: use a string, an integer, "
                    "or a non-empty list of strings or of integers (null, true/false, decimals and objects "
                    "are not filter values)"
                )
        return filter


def _filter_kind(value: Any) -> str | None:
    """'str' or 'int' for a value a filter can match exactly (int64), else None."""
    if isinstance(value, str):
        return "str"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) <= _INT64:
        return "int"
    return None


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


class RetrieveRequest(BaseModel):
    """Search-R1's retrieval-server request shape."""

    model_config = ConfigDict(extra="forbid")

    queries: list[str] = Field(min_length=1)
    topk: int = Field(default=3, ge=1, le=100)
    return_scores: bool = False
    collection: str | None = Field(default=None, description="default: RETRIEVER_DEFAULT_COLLECTION")


class RetrieveResponse(BaseModel):
    result: list[list[dict[str, Any]]]
