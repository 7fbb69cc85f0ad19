"""The app every service is: one FastAPI setup, so the four services read (and answer) alike.

:func:`create_service_app` does what each service's ``create_app`` would otherwise repeat: the
title and version, the JSON error bodies (:mod:`services.errors`), the API key
(:mod:`services.security`), then the service's routes and the health endpoints
(:mod:`services.health`). A service keeps only what is its own: its lifespan (the state it makes
and closes), its readiness check and its router::

    app = create_service_app("retriever", "Hybrid search ...", lifespan, router, ready)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

from fastapi import APIRouter, FastAPI

import hoprl
from services.errors import install_error_handlers
from services.health import ReadyCheck, health_router
from services.security import install_api_key

Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]


def create_service_app(
    name: str,
    description: str,
    lifespan: Lifespan,
    router: APIRouter,
    ready: ReadyCheck,
    admin_token: str | None = None,
    admin_setting: str = "the admin token",
) -> FastAPI:
    """The FastAPI app of service ``name`` (titled ``hoprl <name>``).

    Args:
        description: the OpenAPI description, one or two sentences.
        lifespan: makes the service's state on ``app.state`` and closes it.
        router: every route of the service; its routes take their state through ``Depends``.
        ready: the readiness check behind ``/readyz`` (:func:`services.health.health_router`).
        admin_token: the bearer token of the ``/v1/admin/*`` routes (``admin_setting`` names its
            setting), checked before any body is read; None disables them (403).
    """
    app = FastAPI(
        title=f"hoprl {name}", version=hoprl.__version__, description=description, lifespan=lifespan
    )
    install_error_handlers(app)  # before the routers: its body check is a dependency of theirs
    install_api_key(app, admin_token=admin_token, admin_setting=admin_setting)
    app.include_router(router)
    app.include_router(health_router(ready))
    return app


#: ``"Model.field"`` (``"Model.field[]"``: the items of a list field) -> JSON Schema keywords
Limits = Mapping[str, Mapping[str, Any]]


def publish_limits(app: FastAPI, limits: Limits) -> None:
    """Write the service's live limits (its settings) into its OpenAPI document's request schemas.

    The request models carry fixed bounds; a setting that lowers one (``POLICY_MAX_STEPS=1``) must
    show in the published schema too, or a client generated from it (or a fuzzer) would send
    requests the service then refuses. ``limits`` names each field and the keywords it gets, e.g.
    ``{"AnswerRequest.max_steps": {"maximum": 1}}``; a nullable field gets them on its non-null
    branch. A name the document lacks raises, so a renamed field cannot drop its limit silently.
    """
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = build()
        models = schema["components"]["schemas"]
        for name, keywords in limits.items():
            model, _, field = name.partition(".")
            items = field.endswith("[]")
            target = models[model]["properties"][field.removesuffix("[]")]
            branches = [b for b in target.get("anyOf", [target]) if b.get("type") != "null"]
            for branch in branches:
                (branch["items"] if items else branch).update(keywords)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
