"""What every typed service client shares: the error type, the response check, the lifecycle."""

from __future__ import annotations

from typing import Any, Self

import httpx


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
    """A blocking client of one hoprl service: ``with RetrieverClient(url) as client: ...``."""

    def __init__(self, base_url: str, timeout: float = 60.0, **kwargs: Any) -> None:
        self.http = httpx.Client(base_url=base_url, timeout=timeout, **kwargs)

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
