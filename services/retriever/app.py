"""The retriever service: ``uvicorn services.retriever.app:app`` or ``hoprl serve retriever``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from services.app import create_service_app, publish_limits
from services.errors import ApiError
from services.retriever.index import HybridIndex
from services.retriever.routes import IndexDep, router
from services.retriever.settings import RetrieverSettings


def ready(index: IndexDep) -> dict[str, Any]:
    """Qdrant storage answers and the embedder is loaded."""
    try:
        names = index.store.names()
    except Exception as exc:  # any storage failure means "not ready", reported by name
        raise ApiError(503, "qdrant_unavailable", f"Qdrant did not answer: {exc}") from None
    return {"collections": len(names), "embedder": index.embedder.name}


def create_app(settings: RetrieverSettings | None = None) -> FastAPI:
    settings = settings or RetrieverSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.index = HybridIndex(settings)
        try:
            yield
        finally:
            app.state.index.close()

    description = "Hybrid (dense + BM25, RRF-fused) search over Qdrant collections."
    app = create_service_app("retriever", description, lifespan, router, ready)
    queries, chars = {"maxItems": settings.max_queries}, {"maxLength": settings.max_query_chars}
    top_k = {"maximum": settings.max_top_k}
    limits = {  # the RETRIEVER_MAX_* settings as set (services.app.publish_limits)
        "SearchRequest.queries": queries, "SearchRequest.queries[]": chars, "SearchRequest.top_k": top_k,
        "RetrieveRequest.queries": queries, "RetrieveRequest.queries[]": chars, "RetrieveRequest.topk": top_k,
        "IngestRequest.documents": {"maxItems": settings.max_documents},
    }  # fmt: skip
    if not settings.qdrant_url:  # embedded storage keeps one shard (services.retriever.store.NeedsServer)
        limits |= {"CollectionOptions.shard_number": {"maximum": 1},
                   "CollectionOptions.replication_factor": {"maximum": 1}}  # fmt: skip
    publish_limits(app, limits)
    return app


app = create_app()
