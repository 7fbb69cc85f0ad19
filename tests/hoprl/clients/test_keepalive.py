"""Idle connections: clients drop them before our servers do, so no request meets a closing socket."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from hoprl.clients.http import CLIENT_KEEP_ALIVE_S, SERVER_KEEP_ALIVE_S, client_options
from hoprl.clients.retriever import AsyncRetrieverClient, RetrieverClient
from hoprl.schemas import Document
from services.local import LocalServer
from services.retriever.app import create_app
from services.retriever.settings import RetrieverSettings


def test_clients_expire_idle_connections_well_before_the_servers() -> None:
    options = client_options(5.0, {})
    assert options["timeout"] == 5.0
    assert options["limits"].keepalive_expiry == CLIENT_KEEP_ALIVE_S
    assert SERVER_KEEP_ALIVE_S >= 5 * CLIENT_KEEP_ALIVE_S
    assert client_options(5.0, {"limits": None})["limits"] is None  # callers can still override


def test_requests_after_idle_gaps_succeed(retriever_url: str) -> None:
    """The failure this prevents: a GRPO rollout whose generation left the retriever client idle
    for seconds between searches got ReadError on a reused keep-alive connection."""
    doc = Document(id="k", title="Keep", text="Keep-alive is a property of HTTP/1.1 connections.")
    with RetrieverClient(retriever_url) as client:
        client.ingest("keepalive", [doc])
        for _ in range(2):
            assert client.search("keepalive", ["keep-alive"], top_k=1)[0][0].id == "k"
            time.sleep(CLIENT_KEEP_ALIVE_S + 0.5)

    async def idle_async() -> list[str]:
        client = AsyncRetrieverClient(retriever_url)
        ids = []
        try:
            for _ in range(2):
                ids.append((await client.search("keepalive", ["keep-alive"], top_k=1))[0][0].id)
                await asyncio.sleep(CLIENT_KEEP_ALIVE_S + 0.5)
        finally:
            await client.aclose()
        return ids

    assert asyncio.run(idle_async()) == ["k", "k"]


def test_local_server_keeps_idle_connections_for_the_server_keep_alive(tmp_path: Path) -> None:
    server = LocalServer(create_app(RetrieverSettings(storage_path=tmp_path)))
    assert server.server.config.timeout_keep_alive == SERVER_KEEP_ALIVE_S
