"""Typed HTTP clients for the retriever service (sync and async)."""

from __future__ import annotations

from typing import Any, TypedDict, Unpack

import httpx

from hoprl.clients.http import ServiceClient, client_options
from hoprl.clients.http import check as _check
from hoprl.domain import SearchMode
from hoprl.schemas import Document
from hoprl.schemas.retriever import (
    CollectionInfo,
    CollectionOptions,
    Hit,
    IngestCheckpoint,
    IngestResponse,
    SearchResponse,
)


class SearchOptions(TypedDict, total=False):
    """How to search (:class:`hoprl.schemas.retriever.SearchRequest`): ``top_k`` hits per query
    (5 when left out), ``mode`` (``hybrid``) and a metadata ``filter`` (none)."""

    top_k: int
    mode: SearchMode
    filter: dict[str, Any] | None


def _search_body(collection: str, queries: list[str], options: SearchOptions) -> dict[str, Any]:
    defaults: SearchOptions = {"top_k": 5, "mode": "hybrid", "filter": None}
    return {"collection": collection, "queries": queries, **defaults, **options}


def _ingest_body(documents: list[Document], checkpoint: IngestCheckpoint | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"documents": [d.model_dump() for d in documents]}
    if checkpoint is not None:
        body["checkpoint"] = checkpoint.model_dump()
    return body


class RetrieverClient(ServiceClient):
    """Blocking client. ``RetrieverClient("http://127.0.0.1:8001").search("hotpotqa", ["q"])``."""

    def search(
        self, collection: str, queries: list[str], **options: Unpack[SearchOptions]
    ) -> list[list[Hit]]:
        body = _search_body(collection, queries, options)
        return SearchResponse.model_validate(_check(self.http.post("/v1/search", json=body))).results

    def ingest(
        self, collection: str, documents: list[Document], checkpoint: IngestCheckpoint | None = None
    ) -> IngestResponse:
        """Upsert ``documents``; with a ``checkpoint`` (a batch of a source file) the collection's
        progress record for that file takes the batch in once it is stored."""
        url = f"/v1/collections/{collection}/documents"
        body = _ingest_body(documents, checkpoint)
        return IngestResponse.model_validate(_check(self.http.post(url, json=body)))

    def create(self, collection: str, options: CollectionOptions | None = None) -> CollectionInfo:
        """Create ``collection`` if missing (with ``options``); a 409 :class:`ServiceError` if it
        exists with other options."""
        body = {"options": options.model_dump()} if options is not None else None
        response = self.http.put(f"/v1/collections/{collection}", json=body)
        return CollectionInfo.model_validate(_check(response))

    def optimize(self, collection: str) -> CollectionInfo:
        """Build the collection's HNSW graph and quantized vectors (embedded storage); returns its info."""
        return CollectionInfo.model_validate(_check(self.http.post(f"/v1/collections/{collection}/optimize")))

    def collections(self) -> list[CollectionInfo]:
        return [CollectionInfo.model_validate(c) for c in _check(self.http.get("/v1/collections"))]

    def delete(self, collection: str) -> None:
        _check(self.http.delete(f"/v1/collections/{collection}"))

    def info(self, collection: str) -> CollectionInfo:
        """The collection's counts and leases; :class:`ServiceError` 404 when it does not exist."""
        return CollectionInfo.model_validate(_check(self.http.get(f"/v1/collections/{collection}")))

    def lease(self, collection: str, holder: str, held: bool = True) -> CollectionInfo:
        """Mark ``collection`` in use by ``holder`` (``held=False``: release it); both idempotent."""
        url = f"/v1/collections/{collection}/leases/{holder}"
        return CollectionInfo.model_validate(_check(self.http.put(url) if held else self.http.delete(url)))


class AsyncRetrieverClient:
    """Async client for the agent loop: ``await client.search(collection, queries)``."""

    def __init__(self, base_url: str, timeout: float = 60.0, **kwargs: Any) -> None:
        self.http = httpx.AsyncClient(base_url=base_url, **client_options(timeout, kwargs))

    async def search(
        self, collection: str, queries: list[str], **options: Unpack[SearchOptions]
    ) -> list[list[Hit]]:
        body = _search_body(collection, queries, options)
        response = await self.http.post("/v1/search", json=body)
        return SearchResponse.model_validate(_check(response)).results

    async def ingest(self, collection: str, documents: list[Document]) -> IngestResponse:
        url = f"/v1/collections/{collection}/documents"
        response = await self.http.post(url, json=_ingest_body(documents))
        return IngestResponse.model_validate(_check(response))

    async def aclose(self) -> None:
        await self.http.aclose()
