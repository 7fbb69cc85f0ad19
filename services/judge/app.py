"""The judge service: ``uvicorn services.judge.app:app`` or ``hoprl serve judge``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from redis.exceptions import RedisError

from services.app import create_service_app, publish_limits
from services.errors import ApiError
from services.judge.backends import make_backend
from services.judge.cache import make_cache
from services.judge.routes import BackendDep, CacheDep, SettingsDep, router
from services.judge.settings import JudgeSettings


async def ready(backend: BackendDep, cache: CacheDep, settings: SettingsDep) -> dict[str, Any]:
    """Redis answers (when configured) and the LLM endpoint serves the model (backend openai)."""
    try:
        await cache.ping()
    except RedisError as exc:
        raise ApiError(503, "redis_unavailable", f"Redis at JUDGE_REDIS_URL did not answer: {exc}") from None
    problem = await backend.ready()
    if problem is not None:
        raise ApiError(503, "llm_unavailable", problem)
    return {"backend": settings.backend, "cache": cache.name, "model": backend.model or None}


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

    description = "Answer equivalence and answerability verdicts: rules, or an LLM with a rules fallback."
    app = create_service_app("judge", description, lifespan, router, ready)
    batch = {"maxItems": settings.max_batch}  # JUDGE_MAX_BATCH as set (services.app.publish_limits)
    publish_limits(app, {"AnswerRequest.items": batch, "AnswerableRequest.items": batch})
    app.state.settings = settings
    return app


app = create_app()
