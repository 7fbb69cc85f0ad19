"""The retriever service's wire contracts: ingest, search, collections, Search-R1's ``/retrieve``.

A search request's ``filter`` is validated here, so a bad condition is a 422 that names it before
the index sees it (Qdrant's JSON paths and int64 integers set the bounds).

The requests are strict (``"top_k": "5"`` or ``true`` is a 422, not 5 or 1) and publish the
retriever's size ceilings (:data:`MAX_QUERIES`, :data:`MAX_QUERY_CHARS`, :data:`MAX_TOP_K`,
:data:`MAX_DOCUMENTS`) in their OpenAPI schema; the ``RETRIEVER_MAX_*`` settings default to these
ceilings and may only lower them (a lowered limit answers 413 / 422 naming its setting).
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictStr,
    StringConstraints,
    field_validator,
)

from hoprl.domain import SearchMode
from hoprl.schemas import MAX_JSON_INT, Bool, Document, Int, json_number, non_blank

#: the most queries in one search request (RETRIEVER_MAX_QUERIES may lower it)
MAX_QUERIES = 256
#: the most characters in one query (RETRIEVER_MAX_QUERY_CHARS may lower it): 4x the policy's
#: question cap, so a question or an agent's generated query (<= POLICY_MAX_NEW_TOKENS_PER_STEP tokens)
#: fits; the dense encoder reads the first RETRIEVER_EMBED_MAX_LENGTH tokens of it anyway
MAX_QUERY_CHARS = 8_192
#: the most hits per query (RETRIEVER_MAX_TOP_K may lower it)
MAX_TOP_K = 100
#: the most documents in one ingest request (RETRIEVER_MAX_DOCUMENTS may lower it)
MAX_DOCUMENTS = 4_096
#: a collection name: letters, digits, '_', '-', '.', starting with a letter or digit, at most 128
COLLECTION_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
CollectionName = Annotated[str, StringConstraints(pattern=COLLECTION_NAME)]
#: a search query: 1 to MAX_QUERY_CHARS characters, at least one of them visible
Query = Annotated[str, non_blank(MAX_QUERY_CHARS)]

#: a metadata field name, or a dotted path into nested metadata (``"kind"``, ``"source.site"``):
#: the keys Qdrant's JSON paths accept without quoting ("" or "a b" made it fail: invalid JSON path)
FILTER_KEY = r"^[A-Za-z0-9_-]{1,64}(\.[A-Za-z0-9_-]{1,64}){0,7}$"
_INT64 = MAX_JSON_INT  # Qdrant keeps int64; a request carries at most I-JSON's safe integers
FilterKey = Annotated[str, StringConstraints(pattern=FILTER_KEY)]
FilterInt = Annotated[int, Field(ge=-_INT64, le=_INT64), BeforeValidator(json_number)]
FilterValue = (
    StrictStr
    | FilterInt
    | Annotated[list[StrictStr], Field(min_length=1, max_length=256)]
    | Annotated[list[FilterInt], Field(min_length=1, max_length=256)]
)

#: no key but a FILTER_KEY one (``additionalProperties: false`` beside the key pattern)
Filter = Annotated[
    dict[FilterKey, FilterValue], Field(max_length=32, json_schema_extra={"additionalProperties": False})
]


class Hit(BaseModel):
    id: str
    title: str
    text: str
    score: float
    rank: int
    metadata: dict[str, Any] = Field(default_factory=dict)


class IngestRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    documents: list[Document] = Field(
        min_length=1, max_length=MAX_DOCUMENTS, description="at most RETRIEVER_MAX_DOCUMENTS"
    )


class IngestResponse(BaseModel):
    collection: str
    upserted: int
    points: int = Field(description="points in the collection after the ingest")
    took_ms: float


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    collection: CollectionName = Field(description="letters, digits, '_', '-', '.'; at most 128")
    queries: list[Query] = Field(
        min_length=1,
        max_length=MAX_QUERIES,
        description="1 to RETRIEVER_MAX_QUERIES queries, each 1 to RETRIEVER_MAX_QUERY_CHARS characters "
        "with at least one visible character",
    )
    top_k: Int = Field(default=5, ge=1, le=MAX_TOP_K, description="hits per query (<= RETRIEVER_MAX_TOP_K)")
    mode: SearchMode = "hybrid"
    filter: Filter | None = Field(
        default=None,
        description="payload filter on document metadata, every condition must hold: {field: value} "
        "matches documents whose metadata field equals value, {field: [values]} any of the values. "
        "A field is a name of letters, digits, '_' and '-' (a dotted path reaches nested metadata); a "
        "value is a string or an integer, a list holds strings only or integers only",
    )
    feedback: Bool | None = Field(
        default=None,
        description="hybrid only: add the second (pseudo-relevance feedback) round; "
        "default: the service's RETRIEVER_FEEDBACK",
    )

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
    """'str' or 'int' for a value a filter can match exactly (|value| <= 2**53 - 1), else None."""
    if isinstance(value, str):
        return "str"
    if isinstance(value, float) and value.is_integer():  # 5.0 is an integer to JSON Schema
        value = int(value)
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
    leases: list[str] = Field(
        default_factory=list,
        description="who holds the collection in use (e.g. a trainer's job ids): it cannot be deleted "
        "until each releases it (DELETE /v1/collections/{name}/leases/{holder})",
    )


class RetrieveRequest(BaseModel):
    """Search-R1's retrieval-server request shape."""

    model_config = ConfigDict(extra="forbid")

    queries: list[Query] = Field(min_length=1, max_length=MAX_QUERIES, description="as SearchRequest.queries")
    topk: Int = Field(default=3, ge=1, le=MAX_TOP_K, description="hits per query (<= RETRIEVER_MAX_TOP_K)")
    return_scores: Bool = False
    collection: CollectionName | None = Field(
        default=None, description="default: RETRIEVER_DEFAULT_COLLECTION"
    )


class RetrieveResponse(BaseModel):
    result: list[list[dict[str, Any]]]
