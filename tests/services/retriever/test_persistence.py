"""An index persists across a service restart, on the embedded engine and the client path."""

from __future__ import annotations

from pathlib import Path

import pytest

from hoprl.clients.retriever import RetrieverClient
from services.local import LocalServer
from services.retriever.app import create_app
from services.retriever.settings import RetrieverSettings

from .conftest import CORPUS


@pytest.mark.parametrize("engine", ["edge", "local"])
def test_index_survives_restart(tmp_path: Path, engine: str) -> None:
    settings = RetrieverSettings(storage_path=tmp_path, engine=engine)
    with LocalServer(create_app(settings)) as server, RetrieverClient(server.url) as client:
        client.ingest("keep", CORPUS)
        before = client.search("keep", ["Who founded Acme Records?"], top_k=3)[0]
    with LocalServer(create_app(settings)) as server, RetrieverClient(server.url) as client:
        assert {c.name: c.points for c in client.collections()} == {"keep": len(CORPUS)}
        after = client.search("keep", ["Who founded Acme Records?"], top_k=3)[0]
    assert [h.id for h in after] == [h.id for h in before]
