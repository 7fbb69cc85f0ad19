"""The two health endpoints of every service: ``/healthz`` (the process is alive) and ``/readyz``.

``/healthz`` calls nothing. ``/readyz`` asks the service's own readiness check, a FastAPI
dependency: it returns what the 200 body adds to ``{"status": "ready"}``, or raises
``ApiError(503, ...)`` naming what is missing, which the app answers with the usual JSON error
body. The check takes the service's state through the same dependencies as its routes, whose
accessors answer 503 ``not_ready`` until the lifespan has made the state::

    def ready(index: IndexDep) -> dict[str, Any]:
        \"\"\"Qdrant storage answers and the embedder is loaded.\"\"\"  # the operation's description
        return {"collections": len(index.store.names()), "embedder": index.embedder.name}

    app.include_router(health_router(ready))
"""

# No ``from __future__ import annotations`` here: FastAPI reads ``readyz``'s annotations, and the
# one naming ``ready`` must be evaluated where ``ready`` is in scope (inside health_router).
import inspect
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

#: a service's readiness check: a FastAPI dependency returning the ready body's other fields
ReadyCheck = Callable[..., Any]


def health_router(ready: ReadyCheck) -> APIRouter:
    """``GET /healthz`` and ``GET /readyz`` (its description is ``ready``'s docstring)."""
    router = APIRouter()

    @router.get("/healthz", operation_id="healthz")
    def healthz() -> dict[str, str]:
        """The process is alive (no dependency is called)."""
        return {"status": "ok"}

    @router.get(
        "/readyz",
        operation_id="readyz",
        description=inspect.getdoc(ready),
        responses={503: {"description": "not ready"}},
    )
    async def readyz(body: Annotated[dict[str, Any], Depends(ready)]) -> JSONResponse:
        return JSONResponse({"status": "ready", **body})

    return router
