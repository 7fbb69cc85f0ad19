"""OpenAI's error envelope on the OpenAI routes: ``{"error": {"message", "type", "param", "code"}}``.

The official client reads it into ``e.message``, ``e.code``, ``e.param`` and ``e.type``. A route
built with :class:`OpenAIRoute` answers every error in it, whatever raised the error: body
validation, an :class:`~services.errors.ApiError`, a method the route lacks, a crash. The app's
own handlers (:mod:`services.errors`) still decide status and message, so every generic rule there
holds here too; only the body's shape differs, and a 422 becomes OpenAI's 400.

    raise ApiError(400, "n_too_large", "n=9 exceeds 4 (POLICY_MAX_N)", {"param": "n"})
    -> 400 {"error": {"message": "n=9 exceeds 4 (POLICY_MAX_N)", "type": "invalid_request_error",
                      "param": "n", "code": "n_too_large"}}
"""

from __future__ import annotations

import inspect
import json
import logging
import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from hoprl.schemas.policy_openai import OpenAIError, OpenAIErrorResponse
from services.errors import ApiError

log = logging.getLogger("hoprl.policy")
ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}
_DESCRIPTIONS: dict[int | str, str] = {
    400: "invalid or unsupported parameter, or malformed body; 'param' names the field",
    404: "the model is not served here",
    429: "too many generation requests in flight",
    504: "the request ran past POLICY_REQUEST_TIMEOUT_S",
    "4XX": "any other client error (a wrong content type, a method the route lacks ...)",
}
# No 500: a crash is a bug to fix, not an answer a client should plan for; it still comes in the
# envelope (the handler below), while the published responses list only what a client can cause.
OPENAI_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": OpenAIErrorResponse, "description": text} for code, text in _DESCRIPTIONS.items()
}


def _type(status: int) -> str:
    return "server_error" if status >= 500 else ERROR_TYPES.get(status, "invalid_request_error")


def openai_error(
    status: int,
    code: str | None,
    message: str,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = OpenAIErrorResponse(error=OpenAIError(message=message, type=_type(status), param=param, code=code))
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def error_event(exc: Exception) -> dict[str, Any]:
    """The ``data: {"error": ...}`` event of a stream that fails after its first chunk."""
    if isinstance(exc, ApiError):
        param = exc.detail.get("param") if isinstance(exc.detail, dict) else None
        error = OpenAIError(message=exc.message, type=_type(exc.status), param=param, code=exc.error)
    else:
        log.error("a stream failed after its first chunk", exc_info=exc)
        error = OpenAIError(
            message="the service failed; see its log", type="server_error", code="internal_error"
        )
    return {"error": error.model_dump()}


def _param(detail: Any) -> str | None:
    """The field at fault: ``{"param": ...}`` of an ApiError, or a validation error's location."""
    if isinstance(detail, dict):
        return detail.get("param")
    if not (isinstance(detail, list) and detail and isinstance(detail[0], dict)):
        return None
    if detail[0].get("type") == "json_invalid":
        return None
    # Drop "body" and the union branch pydantic names in the location ("str", "list[ContentPart]").
    loc = [
        p
        for p in detail[0].get("loc", ())
        if p != "body" and not re.fullmatch(r"(constrained-)?(str|int)|\w+\[.*\]", str(p))
    ]
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    return path or None


async def _reshaped(request: Request, exc: Exception) -> Response:
    """The app's own answer to ``exc`` (:mod:`services.errors`) in OpenAI's envelope; 422 becomes 400.

    The app's handlers still decide status and message, so every generic rule there applies here
    too; only the body's shape (and OpenAI's 400 for any invalid request) differs.
    """
    handlers = request.app.exception_handlers
    handler = next((handlers[c] for c in type(exc).__mro__ if c in handlers), None)
    if handler is None:
        raise exc
    response = handler(request, exc)
    response = await response if inspect.isawaitable(response) else response
    try:
        body = json.loads(response.body)
    except (AttributeError, ValueError):
        return response
    if not (isinstance(body, dict) and isinstance(body.get("error"), str)):
        return response
    status = 400 if response.status_code == 422 else response.status_code
    headers = {k: v for k, v in response.headers.items() if k not in ("content-length", "content-type")}
    return openai_error(status, body["error"], str(body.get("message")), _param(body.get("detail")), headers)


class OpenAIRoute(APIRoute):
    """A route whose errors, whatever raises them, carry OpenAI's envelope (see :func:`_reshaped`)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:  # body validation, ApiError, a crash: the app's handler answers
                return await _reshaped(request, exc)

        return route

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().handle(scope, receive, send)
        except StarletteHTTPException as exc:  # a method the route lacks: refused before its handler
            response = await _reshaped(Request(scope, receive, send), exc)
            await response(scope, receive, send)
