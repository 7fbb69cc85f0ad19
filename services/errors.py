"""One error shape for every service: 4xx/5xx answers carry :class:`hoprl.schemas.ErrorBody`."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from hoprl.schemas import ErrorBody

log = logging.getLogger("hoprl.services")


class ApiError(Exception):
    """Raise from a route to answer ``status`` with a JSON body naming the problem."""

    def __init__(self, status: int, error: str, message: str, detail: Any = None) -> None:
        super().__init__(message)
        self.status, self.error, self.message, self.detail = status, error, message, detail


def error_response(status: int, error: str, message: str, detail: Any = None) -> JSONResponse:
    body = ErrorBody(error=error, message=message, detail=detail)
    return JSONResponse(status_code=status, content=body.model_dump(mode="json"))


def _validation_message(errors: list[dict[str, Any]]) -> tuple[str, str]:
    if any(e.get("type") == "json_invalid" for e in errors):
        return "malformed_json", "the request body is not valid JSON"
    first = errors[0]
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "body"
    return "invalid_request", f"{where}: {first.get('msg', 'invalid value')}"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.error, exc.message, exc.detail)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{k: v for k, v in e.items() if k in ("type", "loc", "msg")} for e in exc.errors()]
        code, message = _validation_message(errors)
        return error_response(400 if code == "malformed_json" else 422, code, message, errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(exc.status_code, code, str(exc.detail))

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
        422: "invalid request",
        503: "a dependency is not ready",
    }.items()
}
