"""Run a service app on a loopback port in a background thread (CLI commands and tests).

Real HTTP on 127.0.0.1, real uvicorn, same app object as ``hoprl serve``; only the process
boundary is saved, so a command like ``hoprl eval-retrieval`` works with no server running.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType

import uvicorn
from fastapi import FastAPI

from hoprl.clients.http import SERVER_KEEP_ALIVE_S


class LocalServer:
    """``with LocalServer(app) as server: httpx.get(server.url + "/healthz")``."""

    def __init__(
        self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, startup_timeout: float = 120
    ) -> None:
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on",
                                timeout_keep_alive=SERVER_KEEP_ALIVE_S)  # fmt: skip
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="hoprl-local-server", daemon=True)
        self.host = host
        self.startup_timeout = startup_timeout
        self.url = ""

    def __enter__(self) -> LocalServer:
        self.thread.start()
        deadline = time.monotonic() + self.startup_timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the local service did not start; see the log above")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://{self.host}:{port}"
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
