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
from typing import Annotated, Any, Literal

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
from hoprl.schemas import MAX_JSON_INT, Bool, Document, Float, Int, json_number, non_blank

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


#: a source file's key in a collection's progress records: ``<file name>@<16 hex>``
SOURCE_KEY = r"^[^\x00-\x1f]{1,240}@[0-9a-f]{16}$"
Quantization = Literal["none", "int8", "binary"]


class CollectionOptions(BaseModel):
    """How Qdrant keeps a collection: fixed when it is created, recorded in its metadata.

    The defaults are the small-corpus setup (everything in RAM, no quantization, one shard). For a
    corpus of millions of passages the usual setup is ``on_disk`` vectors with ``int8`` quantized
    copies kept in RAM (``always_ram``) and rescored, which keeps a quarter of the float32 size in
    RAM; ``binary`` keeps a thirty-second and wants ``oversampling`` of 2-3.
    """

    model_config = ConfigDict(extra="forbid")

    on_disk: Bool = Field(
        False, description="original dense vectors memory-mapped from disk, not held in RAM"
    )
    hnsw_on_disk: Bool = Field(False, description="the HNSW graph memory-mapped from disk")
    sparse_on_disk: Bool = Field(False, description="the two BM25 sparse indexes memory-mapped from disk")
    quantization: Quantization = Field(
        "none",
        description="quantized copies of the dense vectors: 'int8' (scalar) or 'binary' (1 bit a dimension)",
    )
    always_ram: Bool = Field(True, description="keep the quantized copies in RAM (with quantization only)")
    rescore: Bool = Field(
        True, description="search time: rescore the quantized candidates with the original vectors"
    )
    oversampling: Float = Field(
        1.0,
        ge=1.0,
        le=16.0,
        description="search time: fetch this many times the candidates from the quantized index",
    )
    shard_number: Int = Field(
        1, ge=1, le=256, description="shards (a Qdrant server only; embedded storage has one)"
    )
    replication_factor: Int = Field(
        1, ge=1, le=16, description="copies of each shard on other nodes (a Qdrant cluster only)"
    )


class CreateCollectionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    options: CollectionOptions = Field(default_factory=CollectionOptions)


class IngestCheckpoint(BaseModel):
    """Where an ingest's batch sits in a source file (``hoprl ingest-corpus``): the retriever
    records it in the collection's metadata once Qdrant has the batch, so a re-run skips it."""

    model_config = ConfigDict(extra="forbid")

    source: Annotated[str, StringConstraints(pattern=SOURCE_KEY)] = Field(
        description="the file's key, <file name>@<16 hex of its name, size and first MiB>"
    )
    batch: Int = Field(ge=0, description="the batch's number in the file, from 0")
    batch_size: Int = Field(
        ge=1, le=MAX_DOCUMENTS, description="passages per batch (the last may have fewer)"
    )
    lines: list[Annotated[int, Field(ge=1, le=MAX_JSON_INT), BeforeValidator(json_number)]] = Field(
        max_length=MAX_DOCUMENTS,
        description="the line each document starts on, one per document in their order (else a 409)",
    )
    end_offset: Int = Field(
        ge=0, le=MAX_JSON_INT, description="byte offset just after the batch's last record"
    )
    end_line: Int = Field(ge=0, le=MAX_JSON_INT, description="lines read up to end_offset")


class IngestProgress(BaseModel):
    """How far one source file's ingest has come: batches ``0 .. next_batch - 1`` are in Qdrant,
    and the file's next record starts at ``offset`` (after ``line`` lines); ``ahead`` lists later
    batches already in, which a fan-out finished before an earlier one."""

    batch_size: int
    next_batch: int = 0
    passages: int = Field(0, description="passages in batches 0 .. next_batch - 1")
    offset: int = 0
    line: int = 0
    ahead: dict[str, list[int]] = Field(
        default_factory=dict, description="batch number -> [end_offset, end_line, passages]"
    )


class IngestRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    documents: list[Document] = Field(
        min_length=1, max_length=MAX_DOCUMENTS, description="at most RETRIEVER_MAX_DOCUMENTS"
    )
    checkpoint: IngestCheckpoint | None = Field(
        default=None,
        description="where this batch sits in a source file: recorded once the batch is stored; a document "
        "id already stored from another line of the same file, or a line count other than the documents', "
        "is a 409",
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
    options: CollectionOptions = Field(
        default_factory=CollectionOptions, description="how Qdrant keeps it (fixed at creation)"
    )
    ingests: dict[str, IngestProgress] = Field(
        default_factory=dict, description="source file key -> how far its ingest has come"
    )
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
