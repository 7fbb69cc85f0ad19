"""One error shape for every service: 4xx/5xx answers carry :class:`hoprl.schemas.ErrorBody`.

:func:`install_error_handlers` is the one call every app makes (in
:func:`services.app.create_service_app`, before the routers are included). It installs, for every
route of the service:

- the JSON error body for :class:`ApiError`, validation errors, Starlette's HTTP errors and crashes;
- ``Allow`` on every 405, listing every method the path answers (Starlette names only the first
  route that matched the path);
- a request-body check that runs before any route (:func:`check_json_body`): a body sent to a JSON
  route with another ``Content-Type`` is a 415, and a string holding a lone UTF-16 surrogate
  (``"\\ud800"``: valid JSON syntax, but not a Unicode character, so no tokenizer, database or
  JSON encoder downstream can take it) is a 422 naming where it is;
- :class:`StartupError`: raised while a service starts, it stops the server with its message alone
  (no traceback) and a non-zero exit status.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hoprl.schemas import VISIBLE, VISIBLE_MESSAGE, ErrorBody

log = logging.getLogger("hoprl.services")


class ApiError(Exception):
    """Raise from a route to answer ``status`` with a JSON body naming the problem."""

    def __init__(
        self, status: int, error: str, message: str, detail: Any = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.error, self.message, self.detail = status, error, message, detail
        self.headers = headers  # e.g. Retry-After on a 429


def state_of(name: str, starting: str, detail: Any = None) -> Callable[[Request], Awaitable[Any]]:
    """A dependency for what a service's lifespan puts on ``app.state.<name>``: the value, or a 503
    ``not_ready`` saying ``starting`` (with ``detail``) until the lifespan has set it.

    A dependency, so a test can hand the routes another one (``app.dependency_overrides``); ``async``,
    so resolving it takes no thread from the pool the routes run in (with every thread busy, a
    request must still reach its 429 or 503 at once).
    """

    async def of(request: Request) -> Any:
        value = getattr(request.app.state, name, None)
        if value is None:
            raise ApiError(503, "not_ready", starting, detail)
        return value

    of.__name__ = f"{name}_of"
    return of


class StartupError(Exception):
    """Raise while a service starts (its lifespan) to stop it with this message and exit non-zero.

    The message should say what is wrong and which setting fixes it; it is logged as is, without
    a traceback (the problem is the deployment's, not the code's).
    """


def error_response(
    status: int, error: str, message: str, detail: Any = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    body = ErrorBody(error=error, message=message, detail=detail)
    return JSONResponse(status_code=status, content=body.model_dump(mode="json"), headers=headers)


def _deepest_first(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The errors with the most specific one of the first field first: a union field (``stop``: a
    string or a list of strings) fails once per branch, and the branch the value took (the list,
    with its bad item) says more than "Input should be a valid string"."""
    if len(errors) < 2:
        return errors
    field = tuple(errors[0].get("loc", ()))[:2]
    same = [e for e in errors if tuple(e.get("loc", ()))[:2] == field]
    chosen = max(same, key=lambda e: len(e.get("loc", ())))
    return [chosen, *(e for e in errors if e is not chosen)]


def _validation_message(errors: list[dict[str, Any]]) -> tuple[str, str]:
    if any(e.get("type") == "json_invalid" for e in errors):
        return "malformed_json", "the request body is not valid JSON"
    first = errors[0]
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "body"
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")  # pydantic's prefix
    if first.get("type") == "string_pattern_mismatch" and VISIBLE in message:
        message = VISIBLE_MESSAGE  # the non-blank rule, in words rather than as its regex
    return "invalid_request", f"{where}: {message}"


#: the methods probed for ``Allow`` (HEAD is answered wherever GET is, by Starlette)
_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def allowed_methods(request: Request) -> str:
    """Every method some route of this app answers on the request's path, for ``Allow``.

    Each method is probed through the routes' own ``matches`` (FastAPI nests included routers,
    so the top-level routes are asked, never walked).
    """
    allowed = [
        method
        for method in _METHODS
        if any(route.matches({**request.scope, "method": method})[0] == Match.FULL
               for route in request.app.router.routes)
    ]  # fmt: skip
    return ", ".join(allowed)


# -- the request-body check every route gets ------------------------------------------------------


def _is_json(content_type: str | None) -> bool:
    """``application/json`` or ``application/<anything>+json``, parameters ignored (FastAPI's rule)."""
    kind = (content_type or "").split(";", 1)[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


Location = tuple[str | int, ...]


def find_value(value: Any, loc: Location, bad: Callable[[Any], bool]) -> Location | None:
    """Where the first JSON value (object keys included) for which ``bad`` holds is, else None.

    ``loc`` is the location of ``value`` itself, e.g. ``("body",)``; a key is reported as its
    object's location plus ``"<key>"``.
    """
    stack: list[tuple[Any, Location]] = [(value, loc)]
    while stack:
        item, where = stack.pop()
        if bad(item):
            return where
        if isinstance(item, dict):
            for key, child in reversed(item.items()):
                stack.append((child, (*where, key)))
                stack.append((key, (*where, "<key>")))
        elif isinstance(item, list):
            stack.extend((child, (*where, i)) for i, child in reversed(list(enumerate(item))))
    return None


def has_lone_surrogate(value: Any) -> bool:
    """A string holding a lone UTF-16 surrogate.

    Python's ``json`` decodes ``"\\ud800"`` (and UTF-8 bytes of a surrogate) into such a string;
    a well-formed pair decodes to one astral character, so whatever surrogate is left is lone.
    """
    if not isinstance(value, str) or value.isascii():
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


async def check_json_body(request: Request) -> None:
    """Run before every route: 415 for a non-JSON body to a JSON route, 422 for a lone surrogate.

    A FastAPI dependency rather than a middleware, so that it sees the route (only routes with a
    JSON body are checked), reuses the body FastAPI already parsed, and its errors go through the
    app's own exception handlers (e.g. the OpenAI envelope on the OpenAI-compatible routes).
    """
    route = request.scope.get("route")
    if not isinstance(route, APIRoute) or route.body_field is None:
        return
    body = await request.body()
    if not body:
        return  # a missing body is the route's own "field required" 422
    content_type = request.headers.get("content-type")
    if not _is_json(content_type):
        raise ApiError(
            415,
            "unsupported_media_type",
            f"this route takes a JSON body; send it with 'Content-Type: application/json' "
            f"(got {content_type or 'no Content-Type'!r})",
        )
    where = find_value(await request.json(), ("body",), has_lone_surrogate)
    if where is not None:
        message = (
            "the string holds a lone UTF-16 surrogate (e.g. \\ud800), which is not a Unicode character; "
            "send valid UTF-8 text"
        )
        raise RequestValidationError([{"type": "string_unicode", "loc": where, "msg": message}])


class _StartupErrors:
    """ASGI middleware: a :class:`StartupError` in the lifespan fails start-up with its message only.

    Starlette reports any lifespan exception with its formatted traceback; uvicorn logs that and
    exits. Here the failure message is held back until the exception is known: a StartupError
    sends its own text instead (uvicorn then exits with status 3, "Application startup failed").
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            return await self.app(scope, receive, send)
        held: list[Message] = []

        async def hold_failure(message: Message) -> None:
            if message["type"] == "lifespan.startup.failed":
                held.append(message)
            else:
                await send(message)

        try:
            await self.app(scope, receive, hold_failure)
        except StartupError as exc:
            await send({"type": "lifespan.startup.failed", "message": str(exc)})
            return
        except BaseException:
            for message in held:
                await send(message)
            raise
        for message in held:
            await send(message)


def install_error_handlers(app: FastAPI) -> None:
    """Error bodies, ``Allow`` on 405, the body check and start-up errors (module doc).

    Call it before ``app.include_router``: the body check is a dependency of the routes included
    after it.
    """
    app.router.dependencies.append(Depends(check_json_body))
    app.add_middleware(_StartupErrors)

    @app.exception_handler(ApiError)
    async def _api(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.error, exc.message, exc.detail, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = _deepest_first(
            [{k: v for k, v in e.items() if k in ("type", "loc", "msg")} for e in exc.errors()]
        )
        code, message = _validation_message(errors)
        return error_response(400 if code == "malformed_json" else 422, code, message, errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        headers = dict(exc.headers or {})
        message = str(exc.detail)
        if exc.status_code == 405:
            headers["Allow"] = allowed_methods(request)
            message = f"{request.method} is not allowed on {request.url.path}; allowed: {headers['Allow']}"
        return error_response(exc.status_code, code, message, headers=headers)

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, "internal_error", "the service failed; see its log for details")


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in {
        400: "malformed request body",
        404: "unknown resource",
        413: "batch larger than the service allows",
        415: "a request body that is not JSON (Content-Type must be application/json)",
        422: "invalid request",
        503: "a dependency is not ready",
    }.items()
}
