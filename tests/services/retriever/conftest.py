"""Retriever fixtures: one live service per Qdrant engine, so every API test runs on both."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hoprl.clients.retriever import RetrieverClient
from hoprl.schemas import Document
from services.local import LocalServer
from services.retriever.app import create_app
from services.retriever.settings import RetrieverSettings

CORPUS = [
    Document(id=doc_id, title=title, text=text, metadata={"kind": kind})
    for doc_id, title, text, kind in [
        ("acme", "Acme Records", "Acme Records was founded in 1961 by Jane Roe.", "company"),
        ("roe", "Jane Roe", "Jane Roe was born in Velmora, a city in Ostland.", "person"),
        ("velmora", "Velmora", "Velmora is the capital of Ostland, on the river Ansk.", "city"),
        ("ansk", "Ansk", "The Ansk is a river of 412 km that flows through Velmora.", "river"),
        ("brio", "Brio Motors", "Brio Motors is a car maker founded in 1988 in Tessa.", "company"),
    ]
]


@pytest.fixture(scope="module", params=["edge", "local"])
def service(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A live retriever over HTTP: 'edge' = embedded qdrant-edge, 'local' = the qdrant-client path."""
    settings = RetrieverSettings(storage_path=tmp_path_factory.mktemp(request.param), engine=request.param)
    with LocalServer(create_app(settings)) as server:
        with RetrieverClient(server.url) as client:
            client.ingest("tiny", CORPUS)
        yield server.url
