"""The judge service: ``uvicorn services.judge.app:app`` or ``hoprl serve judge``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError

import hoprl
from services.errors import error_response, install_error_handlers
from services.judge.backends import make_backend
from services.judge.cache import make_cache
from services.judge.routes import router
from services.judge.settings import JudgeSettings
from services.security import install_api_key


def create_app(settings: JudgeSettings | None = None) -> FastAPI:
    settings = settings or JudgeSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.backend = make_backend(settings)
        app.state.cache = make_cache(settings)
        try:
            yield
        finally:
            await app.state.cache.close()
            await app.state.backend.close()

    app = FastAPI(
        title="hoprl judge",
        version=hoprl.__version__,
        description="Answer equivalence and answerability verdicts: rules, or an LLM with a rules fallback.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    install_error_handlers(app)
    install_api_key(app)
    app.include_router(router)

    @app.get("/healthz", operation_id="healthz")
    def healthz() -> dict[str, str]:
        """The process is alive (no dependency is called)."""
        return {"status": "ok"}

    @app.get("/readyz", operation_id="readyz", responses={503: {"description": "not ready"}})
    async def readyz() -> JSONResponse:
        """Redis answers (when configured) and the LLM endpoint serves the model (backend openai)."""
        if getattr(app.state, "backend", None) is None:
            return error_response(503, "not_ready", "the judge is still starting")
        try:
            await app.state.cache.ping()
        except RedisError as exc:
            return error_response(503, "redis_unavailable", f"Redis at JUDGE_REDIS_URL did not answer: {exc}")
        problem = await app.state.backend.ready()
        if problem is not None:
            return error_response(503, "llm_unavailable", problem)
        body = {"status": "ready", "backend": settings.backend, "cache": app.state.cache.name}
        return JSONResponse(body | {"model": app.state.backend.model or None})

    return app


app = create_app()
