"""HTTP routes of the retriever (``/v1`` paths, typed responses, declared errors)."""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path

from hoprl.schemas.retriever import (
    COLLECTION_NAME,
    CollectionInfo,
    CreateCollectionRequest,
    IngestRequest,
    IngestResponse,
    RetrieveRequest,
    RetrieveResponse,
    SearchRequest,
    SearchResponse,
)
from services.errors import ERROR_RESPONSES, ApiError, state_of
from services.retriever.index import CollectionInUse, CollectionNotFound, HybridIndex, OptionsDiffer
from services.retriever.progress import BatchSizeDiffers, DuplicateId, LinesDiffer
from services.retriever.store import NeedsServer

router = APIRouter(responses=ERROR_RESPONSES)
NAME = re.compile(COLLECTION_NAME)
# The pattern is declared for clients (and the fuzzer); _valid_name checks it with a plainer message.
CollectionName = Annotated[
    str,
    Path(
        description="collection name: letters, digits, '_', '-', '.'",
        json_schema_extra={"pattern": NAME.pattern},
    ),
]


def _links(name: str) -> dict[str, dict[str, Any]]:
    """OpenAPI links from an operation that leaves collection ``name`` (an expression) in place:
    what a client can do with it next; schemathesis' stateful tests follow them."""
    by_path = {"parameters": {"name": name}}
    return {
        "GetCollection": {"operationId": "get_collection", **by_path},
        "IngestDocuments": {"operationId": "ingest_documents", **by_path},
        "Search": {"operationId": "search", "requestBody": {"collection": name}},
        "DeleteCollection": {"operationId": "delete_collection", **by_path},
    }


index_of = state_of("index", "the index is still loading")  # the index the lifespan opened


IndexDep = Annotated[HybridIndex, Depends(index_of)]


def _valid_name(name: str) -> str:
    if not NAME.match(name):
        raise ApiError(
            422,
            "invalid_collection_name",
            f"collection name {name!r} is invalid: use 1-128 letters, digits, '_', '-' or '.', "
            "starting with a letter or digit",
        )
    return name


def _not_found(name: str) -> ApiError:
    """404 without the other collections' names (they are not the caller's to learn from an error)."""
    return ApiError(
        404,
        "collection_not_found",
        f"collection {name!r} does not exist; GET /v1/collections lists the collections, and ingesting "
        f"documents creates one (POST /v1/collections/{name}/documents)",
    )


@router.get("/v1/collections", operation_id="list_collections")
def list_collections(index: IndexDep) -> list[CollectionInfo]:
    return index.collections()


@router.get("/v1/collections/{name}", operation_id="get_collection")
def get_collection(name: CollectionName, index: IndexDep) -> CollectionInfo:
    try:
        return index.info(_valid_name(name))
    except CollectionNotFound:
        raise _not_found(name) from None


CREATED: dict[int | str, dict[str, Any]] = {
    200: {"description": "the collection", "links": _links("$request.path.name")}
}
INGESTED: dict[int | str, dict[str, Any]] = {
    200: {"description": "the ingest's counts", "links": _links("$response.body#/collection")}
}


def _conflict(description: str) -> dict[int | str, dict[str, Any]]:
    return {409: {**ERROR_RESPONSES[404], "description": description}}


CREATE_CONFLICT = _conflict("the collection exists with other options")


@router.put(
    "/v1/collections/{name}", operation_id="create_collection", responses={**CREATED, **CREATE_CONFLICT}
)
def create_collection(
    name: CollectionName, index: IndexDep, body: CreateCollectionRequest | None = None
) -> CollectionInfo:
    """Create an empty collection (idempotent). Ingesting into a missing collection creates it too.

    The body's ``options`` say how Qdrant keeps it (on-disk vectors, HNSW and sparse indexes,
    int8 or binary quantization with rescoring, shards and replicas); they are fixed at creation
    and listed by ``GET``. Asking again with other options is a 409 naming the differences; shards
    or replicas on embedded storage are a 422 (they need a Qdrant server)."""
    try:
        return index.create(_valid_name(name), options=body.options if body else None)
    except OptionsDiffer as exc:
        differences = "; ".join(
            f"{k}: {have!r}, asked {want!r}" for k, (have, want) in exc.differences.items()
        )
        raise ApiError(
            409,
            "collection_options_differ",
            f"collection {name!r} exists with other options ({differences}); options are fixed when a "
            "collection is created: delete it and create it again to change them",
            {k: {"collection": have, "asked": want} for k, (have, want) in exc.differences.items()},
        ) from None
    except NeedsServer as exc:
        raise ApiError(422, "needs_a_qdrant_server", str(exc)) from None


@router.post("/v1/collections/{name}/optimize", operation_id="optimize_collection")
def optimize_collection(name: CollectionName, index: IndexDep) -> CollectionInfo:
    """Build the collection's HNSW graph and quantized vectors now. Embedded storage (qdrant-edge)
    runs no optimizer by itself, so a large ingest ends with this; on a Qdrant server it returns
    at once (the server's optimizers run in the background)."""
    try:
        return index.optimize(_valid_name(name))
    except CollectionNotFound:
        raise _not_found(name) from None


IN_USE: dict[int | str, dict[str, Any]] = {
    409: {**ERROR_RESPONSES[404], "description": "leases hold the collection (e.g. a trainer's jobs)"}
}
LeaseHolder = Annotated[
    str,
    Path(
        description="who holds the lease, e.g. a trainer job's id: letters, digits, '_', '-', '.'",
        json_schema_extra={"pattern": NAME.pattern},
    ),
]


@router.delete("/v1/collections/{name}", operation_id="delete_collection", responses=IN_USE)
def delete_collection(name: CollectionName, index: IndexDep) -> dict[str, str]:
    """Delete a collection; 409 naming the holders while leases hold it (a trainer's queued or
    running jobs that train on it)."""
    try:
        index.delete(_valid_name(name))
    except CollectionNotFound:
        raise _not_found(name) from None
    except CollectionInUse as exc:
        raise ApiError(
            409,
            "collection_in_use",
            f"collection {name!r} is in use by {', '.join(exc.holders)}; it can be deleted once they end "
            f"(a trainer releases its jobs' leases itself; DELETE /v1/collections/{name}/leases/<holder> "
            "releases a stale one)",
            {"leases": exc.holders},
        ) from None
    return {"deleted": name}


def _lease(name: str, holder: str, index: HybridIndex, held: bool) -> CollectionInfo:
    if not NAME.match(holder):
        raise ApiError(
            422, "invalid_lease_holder", f"lease holder {holder!r} is invalid: use 1-128 letters, digits, "
            "'_', '-' or '.', starting with a letter or digit",
        )  # fmt: skip
    try:
        index.lease(_valid_name(name), holder, held)
        return index.info(name)
    except CollectionNotFound:
        raise _not_found(name) from None


@router.put("/v1/collections/{name}/leases/{holder}", operation_id="lease_collection")
def lease_collection(name: CollectionName, holder: LeaseHolder, index: IndexDep) -> CollectionInfo:
    """Mark the collection in use by ``holder`` (idempotent): while any lease holds it, deleting it
    is a 409. The trainer leases the collection of each job it queues and releases it when the job
    ends; leases live in the collection's metadata, so a restart keeps them."""
    return _lease(name, holder, index, held=True)


@router.delete("/v1/collections/{name}/leases/{holder}", operation_id="release_collection")
def release_collection(name: CollectionName, holder: LeaseHolder, index: IndexDep) -> CollectionInfo:
    """Release ``holder``'s lease (idempotent: releasing one not held changes nothing)."""
    return _lease(name, holder, index, held=False)


INGEST_CONFLICT = _conflict(
    "a checkpoint the collection cannot take: a document id repeated within one source file, another "
    "batch size for that file, or line numbers that do not pair with the documents"
)


@router.post(
    "/v1/collections/{name}/documents",
    operation_id="ingest_documents",
    responses={**INGESTED, **INGEST_CONFLICT},
)
def ingest(name: CollectionName, body: IngestRequest, index: IndexDep) -> IngestResponse:
    """Upsert a batch of documents; ids make it idempotent (re-ingesting replaces, never duplicates).

    With a ``checkpoint`` (a batch of a source file, as ``hoprl ingest-corpus`` sends them), the
    collection's progress record for that file takes the batch in once it is stored (``GET``
    lists it under ``ingests``), and a document id the collection holds from another line of the
    same file is a 409 ``duplicate_document_id`` naming both lines."""
    limit = index.settings.max_documents
    if len(body.documents) > limit:
        raise ApiError(
            422,
            "batch_too_large",
            f"documents: {len(body.documents)} in one request; the limit is {limit} "
            "(RETRIEVER_MAX_DOCUMENTS)",
        )
    try:
        return index.ingest(_valid_name(name), body.documents, body.checkpoint)
    except DuplicateId as exc:
        raise ApiError(409, "duplicate_document_id", str(exc),
                       {"id": exc.doc_id, "line": exc.line, "first_line": exc.first}) from None  # fmt: skip
    except BatchSizeDiffers as exc:
        raise ApiError(409, "batch_size_differs", str(exc)) from None
    except LinesDiffer as exc:
        raise ApiError(409, "checkpoint_lines_differ", str(exc)) from None


def check_limits(queries: list[str], top_k: int, index: HybridIndex, top_k_field: str) -> None:
    """422 naming the first request size over its ``RETRIEVER_MAX_*`` setting (published as set)."""
    s = index.settings
    if len(queries) > s.max_queries:
        raise ApiError(
            422,
            "batch_too_large",
            f"queries: {len(queries)} in one request; the limit is {s.max_queries} (RETRIEVER_MAX_QUERIES)",
        )
    for i, query in enumerate(queries):
        if len(query) > s.max_query_chars:
            raise ApiError(
                422,
                "query_too_long",
                f"queries[{i}]: {len(query)} characters; the limit is {s.max_query_chars} "
                "(RETRIEVER_MAX_QUERY_CHARS)",
            )
    if top_k > s.max_top_k:
        raise ApiError(
            422,
            "top_k_out_of_range",
            f"{top_k_field} must be between 1 and {s.max_top_k} (RETRIEVER_MAX_TOP_K)",
        )


@router.post("/v1/search", operation_id="search")
def search(body: SearchRequest, index: IndexDep) -> SearchResponse:
    """Search a batch of queries; ``mode`` is dense, sparse (BM25) or hybrid (RRF of both)."""
    check_limits(body.queries, body.top_k, index, "top_k")
    try:
        return index.search(body)
    except CollectionNotFound:
        raise _not_found(body.collection) from None


@router.post("/retrieve", operation_id="retrieve_search_r1")
def retrieve(body: RetrieveRequest, index: IndexDep) -> RetrieveResponse:
    """Search-R1 compatibility: documents as ``{"id", "contents": '"title"\\ntext'}``."""
    collection = body.collection or index.settings.default_collection
    check_limits(body.queries, body.topk, index, "topk")
    query = SearchRequest(collection=collection, queries=body.queries, top_k=body.topk, mode="hybrid")
    response = search(query, index)
    result: list[list[dict[str, Any]]] = []
    for hits in response.results:
        docs = [{"id": h.id, "contents": f'"{h.title}"\n{h.text}'} for h in hits]
        if body.return_scores:
            result.append([{"document": d, "score": h.score} for d, h in zip(docs, hits, strict=True)])
        else:
            result.append(docs)
    return RetrieveResponse(result=result)
