"""What every typed service client shares: the error type, the response check, the lifecycle.

Every client sends the services' API key as ``Authorization: Bearer <key>``: the ``api_key=``
argument when given, else ``$HOPRL_API_KEY`` (what the services themselves read; see
:mod:`services.security`), else nothing (services started without a key are open).
"""

from __future__ import annotations

from typing import Any, Self

import httpx

from hoprl.settings import get_settings

# Keep-alive: the client must drop an idle connection before the server does. With both at 5 s
# (httpx's and uvicorn's defaults), a request sent on a connection the server is just closing
# fails with ReadError; that crashed a GRPO run whose generation left the retriever idle between
# searches. The services keep idle connections SERVER_KEEP_ALIVE_S, the clients CLIENT_KEEP_ALIVE_S.
SERVER_KEEP_ALIVE_S = 30
CLIENT_KEEP_ALIVE_S = 2.0
#: the environment variable holding the key every service requires when it is set
API_KEY_ENV = "HOPRL_API_KEY"


def api_key(explicit: str | None = None) -> str | None:
    """The key to send: ``explicit`` when given (``""`` = send none), else ``$HOPRL_API_KEY``."""
    if explicit is not None:
        return explicit or None
    key = get_settings().api_key
    return key.get_secret_value() if key else None


def client_options(timeout: float, kwargs: dict[str, Any]) -> dict[str, Any]:
    """httpx client options: the timeout, connection limits with the keep-alive above, the API key
    header (``kwargs["api_key"]`` or ``$HOPRL_API_KEY``), then the other ``kwargs``."""
    kwargs = dict(kwargs)
    key = api_key(kwargs.pop("api_key", None))
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    headers.update(kwargs.pop("headers", None) or {})
    limits = httpx.Limits(keepalive_expiry=CLIENT_KEEP_ALIVE_S)
    return {"timeout": timeout, "limits": limits, "headers": headers, **kwargs}


class ServiceError(RuntimeError):
    """A service answered with an error; ``status`` and the JSON ``body`` are kept."""

    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        self.body = body
        message = body.get("message") if isinstance(body, dict) else body
        super().__init__(f"HTTP {status}: {message}")


def check(response: httpx.Response) -> Any:
    """The JSON body of a 2xx response; :class:`ServiceError` with the error body otherwise."""
    if response.status_code >= 400:
        try:
            body = response.json()
        except ValueError:
            body = response.text
        raise ServiceError(response.status_code, body)
    return response.json()


class ServiceClient:
    """A blocking client of one hoprl service: ``with RetrieverClient(url) as client: ...``.

    ``kwargs`` go to :class:`httpx.Client`, except ``api_key`` (default ``$HOPRL_API_KEY``).
    """

    def __init__(self, base_url: str, timeout: float = 60.0, **kwargs: Any) -> None:
        self.http = httpx.Client(base_url=base_url, **client_options(timeout, kwargs))

    def ready(self) -> bool:
        """``GET /readyz`` answered 200 (False while the service is down or not ready)."""
        try:
            return self.http.get("/readyz").status_code == 200
        except httpx.TransportError:
            return False

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
