"""API keys for every service: one shared key, ``HOPRL_API_KEY``, checked by one ASGI middleware.

Every service installs it (:func:`install_api_key`, called by :func:`services.app.create_service_app`).
With ``HOPRL_API_KEY`` set, every request needs ``Authorization: Bearer <key>``, except the health
probes and the API docs (:data:`OPEN_PATHS`) and the admin routes (``/v1/admin/*``), which take
their own token instead (the policy's ``POLICY_ADMIN_TOKEN``, passed as ``admin_token``): there is
one ``Authorization`` header, and the admin token is the stronger secret. The same middleware checks
that token, so an admin route too answers 401 / 403 before its body is read: an unauthenticated
caller learns nothing of its shape (a broken or empty body is not parsed). Without an admin token
configured, every ``/v1/admin/*`` request is a 403 ``admin_disabled``. Without the header (or with
another scheme) the answer is 401 with ``WWW-Authenticate: Bearer``; a wrong key or token is 403.
Both carry the usual JSON error body. Keys are compared with :func:`secrets.compare_digest`, so
the time taken does not leak how many leading characters matched.

Unset (the embedded default, services on 127.0.0.1) means open; the service logs a warning when it
starts. The clients (:mod:`hoprl.clients`) send ``$HOPRL_API_KEY`` by default, so services that
call each other, flows and CLI commands need nothing else::

    HOPRL_API_KEY=$(python -c 'import secrets; print(secrets.token_urlsafe(32))') hoprl serve retriever
    curl -H "Authorization: Bearer $HOPRL_API_KEY" http://127.0.0.1:8001/v1/collections

Why a middleware rather than a FastAPI dependency: it sees every request, including routes added
later and unknown paths (an unauthenticated caller cannot probe which routes exist), and it needs
no change to any route. The OpenAPI document still shows the lock on each protected operation
(:func:`_openapi_with_security`).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from fastapi.security.utils import get_authorization_scheme_param
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hoprl.clients.http import API_KEY_ENV
from hoprl.schemas import ErrorBody
from hoprl.settings import get_settings
from services.errors import error_response

log = logging.getLogger("hoprl.security")

#: paths that never need the key: liveness and readiness probes, the API docs
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
#: routes guarded by their own admin token instead of the API key
ADMIN_PREFIX = "/v1/admin/"
#: the policy's OpenAI-compatible routes answer in OpenAI's error envelope, so the official
#: client's ``e.message`` / ``e.code`` work on a 401 / 403 too
OPENAI_PATHS = frozenset({"/v1/models", "/v1/chat/completions", "/v1/completions"})
API_KEY_SCHEME = "ApiKey"
ADMIN_SCHEME = "AdminToken"


def api_key_from_env() -> str | None:
    """``$HOPRL_API_KEY``, or None when unset or empty; a key that cannot travel in a header raises."""
    secret = get_settings().api_key
    if secret is None:
        return None
    key = secret.get_secret_value()
    if not key.isascii() or not key.isprintable() or key != key.strip() or " " in key:
        raise ValueError(
            f"{API_KEY_ENV} must be printable ASCII without spaces (it is sent as 'Authorization: "
            "Bearer <key>'); e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
    return key


class ApiKeyMiddleware:
    """Pure ASGI middleware: 401 / 403 for requests without the right bearer key (or admin token).

    ``key=None`` lets every request but the admin routes through and only logs the start-up
    warning; ``admin_token=None`` answers every admin route 403 (``admin_setting`` names the
    setting that enables them).
    """

    def __init__(
        self, app: ASGIApp, key: str | None, service: str, admin_token: str | None = None,
        admin_setting: str = "the admin token",
    ) -> None:  # fmt: skip
        self.app = app
        self.key = key.encode() if key else None
        self.admin_token = admin_token.encode() if admin_token else None
        self.admin_setting = admin_setting
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            return await self.app(scope, self._announce(receive), send)
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        response = self._refusal(scope)
        if response is None:
            return await self.app(scope, receive, send)
        await response(scope, receive, send)

    def _refusal(self, scope: Scope) -> JSONResponse | None:
        """The 401 / 403 this request gets before anything reads it, or None to let it through."""
        admin = scope["path"].startswith(ADMIN_PREFIX)
        if not admin and self.key is None:
            return None
        scheme, token = get_authorization_scheme_param(Headers(scope=scope).get("authorization"))
        setting = self.admin_setting if admin else API_KEY_ENV
        if scheme.lower() != "bearer" or not token:
            who = "admin routes need" if admin else "this service needs"
            message = f"{who} 'Authorization: Bearer <{setting}>'"
            response = _error(scope["path"], 401, "unauthorized", message)
            response.headers["WWW-Authenticate"] = "Bearer"
            return response
        if admin and self.admin_token is None:
            message = f"admin routes are disabled: set {setting} to enable them"
            return _error(scope["path"], 403, "admin_disabled", message)
        expected = self.admin_token if admin else self.key
        if expected is None or not secrets.compare_digest(token.encode(), expected):
            noun = "admin token" if admin else "API key"
            return _error(scope["path"], 403, "forbidden", f"the {noun} is wrong (it must equal {setting})")
        return None

    def _announce(self, receive: Receive) -> Receive:
        """``receive`` that logs whether the key is required when the server starts."""

        async def wrapped() -> Message:
            message = await receive()
            if message["type"] == "lifespan.startup":
                if self.key is None:
                    log.warning(
                        "%s: %s is unset, so every route is open to anyone who can reach this port; "
                        "set it for any deployment beyond 127.0.0.1", self.service, API_KEY_ENV,
                    )  # fmt: skip
                else:
                    log.info("%s: every route but %s needs the API key", self.service, sorted(OPEN_PATHS))
            return message

        return wrapped


def _error(path: str, status: int, code: str, message: str) -> JSONResponse:
    """The service's JSON error body, or OpenAI's envelope on the OpenAI-compatible routes."""
    if path not in OPENAI_PATHS:
        return error_response(status, code, message)
    kind = "authentication_error" if status == 401 else "permission_error"
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return JSONResponse(body, status_code=status)


def install_api_key(
    app: FastAPI,
    key: str | None = None,
    admin_token: str | None = None,
    admin_setting: str = "the admin token",
) -> None:
    """Require the API key on ``app`` (``key``, else ``$HOPRL_API_KEY``) and ``admin_token`` on its
    ``/v1/admin/*`` routes, and document both in OpenAPI."""
    key = key or api_key_from_env()
    app.add_middleware(
        ApiKeyMiddleware, key=key, service=app.title, admin_token=admin_token, admin_setting=admin_setting
    )
    app.openapi = _openapi_with_security(app, app.openapi, key is not None)  # type: ignore[method-assign]


def _openapi_with_security(
    app: FastAPI, build: Callable[[], dict[str, Any]], keyed: bool
) -> Callable[[], dict[str, Any]]:
    """``app.openapi`` plus the bearer schemes, each protected operation's lock and its 401 / 403.

    Only what is enforced is published: without an API key (``keyed`` false) the operations carry no
    lock, as they take requests without one; the admin routes always need their token."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = build()
        components = schema.setdefault("components", {})
        components.setdefault("schemas", {}).setdefault(
            "ErrorBody", ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
        )
        if keyed:
            components.setdefault("securitySchemes", {})[API_KEY_SCHEME] = {
                "type": "http", "scheme": "bearer", "description": f"the service's {API_KEY_ENV}",
            }  # fmt: skip
        for path, operations in schema.get("paths", {}).items():
            if path in OPEN_PATHS or not (keyed or path.startswith(ADMIN_PREFIX)):
                continue
            model = "ErrorBody"
            if path in OPENAI_PATHS and "OpenAIErrorResponse" in components["schemas"]:
                model = "OpenAIErrorResponse"
            error = {"content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model}"}}}}
            admin = path.startswith(ADMIN_PREFIX)
            if admin:
                components.setdefault("securitySchemes", {})[ADMIN_SCHEME] = {
                    "type": "http", "scheme": "bearer", "description": "the service's admin token",
                }  # fmt: skip
            for operation in operations.values():
                operation["security"] = [{ADMIN_SCHEME if admin else API_KEY_SCHEME: []}]
                responses = operation.setdefault("responses", {})
                responses.setdefault("401", {"description": "no bearer key", **error})
                responses.setdefault("403", {"description": "wrong key", **error})
        app.openapi_schema = schema
        return schema

    return openapi
