"""The trainer service: ``uvicorn services.trainer.app:app`` or ``hoprl serve trainer``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import JSONResponse

import hoprl
from hoprl.registry.store import Registry
from services.errors import error_response, install_error_handlers
from services.security import install_api_key
from services.trainer.queue import JobQueue
from services.trainer.routes import router
from services.trainer.settings import TrainerSettings


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

    app = FastAPI(
        title="hoprl trainer",
        version=hoprl.__version__,
        description="Training jobs (GRPO / DAPO / Dr.GRPO, SFT, PPO, DPO) recorded in the run registry.",
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
        """The registry answers and the queue thread runs."""
        registry: Registry | None = getattr(app.state, "registry", None)
        if registry is None:
            return error_response(503, "not_ready", "the registry is still opening")
        try:
            queued = len(registry.list_runs(status="queued", limit=1000))
        except Exception as exc:  # any database failure means "not ready", reported by name
            return error_response(503, "registry_unavailable", f"the run registry did not answer: {exc}")
        if not app.state.queue.thread.is_alive():
            return error_response(503, "queue_stopped", "the job queue thread is not running")
        return JSONResponse(
            {"status": "ready", "queued": queued, "running": app.state.queue.current is not None}
        )

    return app


app = create_app()
