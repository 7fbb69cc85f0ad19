"""The retriever service: ``uvicorn services.retriever.app:app`` or ``hoprl serve retriever``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import JSONResponse

import hoprl
from services.errors import error_response, install_error_handlers
from services.retriever.index import HybridIndex
from services.retriever.routes import router
from services.retriever.settings import RetrieverSettings
from services.security import install_api_key


def create_app(settings: RetrieverSettings | None = None) -> FastAPI:
    settings = settings or RetrieverSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.index = HybridIndex(settings)
        try:
            yield
        finally:
            app.state.index.close()

    app = FastAPI(
        title="hoprl retriever",
        version=hoprl.__version__,
        description="Hybrid (dense + BM25, RRF-fused) search over Qdrant collections.",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    install_api_key(app)
    app.include_router(router)

    @app.get("/healthz", operation_id="healthz")
    def healthz() -> dict[str, str]:
        """The process is alive (no dependency is called)."""
        return {"status": "ok"}

    @app.get("/readyz", operation_id="readyz", responses={503: {"description": "not ready"}})
    def readyz() -> JSONResponse:
        """Qdrant storage answers and the embedder is loaded."""
        index: HybridIndex | None = getattr(app.state, "index", None)
        if index is None:
            return error_response(503, "not_ready", "the index is still loading")
        try:
            names = index.store.names()
        except Exception as exc:  # any storage failure means "not ready", reported by name
            return error_response(503, "qdrant_unavailable", f"Qdrant did not answer: {exc}")
        return JSONResponse({"status": "ready", "collections": len(names), "embedder": index.embedder.name})

    return app


app = create_app()
