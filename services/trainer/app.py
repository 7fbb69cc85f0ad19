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
    return create_service_app("trainer", description, lifespan, router, ready)


app = create_app()
