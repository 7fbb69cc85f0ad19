"""The trainer service: ``uvicorn services.trainer.app:app`` or ``hoprl serve trainer``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from hoprl.registry.store import Registry
from services.app import create_service_app
from services.errors import ApiError
from services.trainer.queue import JobQueue
from services.trainer.routes import QueueDep, RegistryDep, router
from services.trainer.settings import TrainerSettings


def ready(registry: RegistryDep, queue: QueueDep) -> dict[str, Any]:
    """The registry answers and the queue thread runs."""
    try:
        queued = len(registry.list_runs(status="queued", limit=1000))
    except Exception as exc:  # any database failure means "not ready", reported by name
        raise ApiError(503, "registry_unavailable", f"the run registry did not answer: {exc}") from None
    if not queue.thread.is_alive():
        raise ApiError(503, "queue_stopped", "the job queue thread is not running")
    return {"queued": queued, "running": queue.current is not None}


def create_app(settings: TrainerSettings | None = None) -> FastAPI:
    settings = settings or TrainerSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.registry = Registry(settings.database_url, owner="trainer")
        app.state.queue = JobQueue(settings, app.state.registry)
        app.state.queue.start()
        try:
            yield
        finally:
            app.state.queue.stop()
            app.state.registry.close()

    description = "Training jobs (GRPO / DAPO / Dr.GRPO, SFT, PPO, DPO) recorded in the run registry."
    app = create_service_app("trainer", description, lifespan, router, ready)
    publish_storable(app)
    return app


#: a string the run registry can store: no NUL character (PostgreSQL's text and JSONB refuse it)
NO_NUL = "^[^\\x00]*$"
#: the request models the registry stores whole (services.trainer.routes._storable checks them)
STORED = ("JobRequest", "Hyperparameters", "JudgeSpec")


def publish_storable(app: FastAPI) -> None:
    """Every string of a job request, and every key of its objects, publishes :data:`NO_NUL`: the
    registry stores the request whole, so a NUL is a 422 (``_storable``), and a document that called
    it valid would not be the enforced one."""
    build = app.openapi

    def mark(node: Any) -> None:
        if isinstance(node, list):
            for item in node:
                mark(item)
        if not isinstance(node, dict):
            return
        if node.get("type") == "string":
            if "pattern" in node:
                node.setdefault("allOf", []).append({"pattern": NO_NUL})
            else:
                node["pattern"] = NO_NUL
        if node.get("type") == "object":
            node["propertyNames"] = {"pattern": NO_NUL}
        for value in node.values():
            mark(value)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = build()
        for name in STORED:
            mark(schema["components"]["schemas"][name])
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


app = create_app()
