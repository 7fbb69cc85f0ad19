"""An index persists across a service restart, on the embedded engine and the client path; one
storage folder serves one retriever process."""

from __future__ import annotations

import os
import subprocess
import sys
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
        client.lease("keep", "job-held")
        before = client.search("keep", ["Who founded Acme Records?"], top_k=3)[0]
    with LocalServer(create_app(settings)) as server, RetrieverClient(server.url) as client:
        assert {c.name: c.points for c in client.collections()} == {"keep": len(CORPUS)}
        assert client.info("keep").leases == ["job-held"]  # a lease outlasts the restart
        after = client.search("keep", ["Who founded Acme Records?"], top_k=3)[0]
    assert [h.id for h in after] == [h.id for h in before]


@pytest.mark.parametrize("engine", ["edge", "local"])
def test_a_second_retriever_on_the_same_storage_says_why_and_exits(tmp_path: Path, engine: str) -> None:
    """Started the way users start it (uvicorn), a second retriever on a folder that one already
    holds stops at start-up, names the folder and the setting, and shows no traceback (it was
    qdrant-edge's ``Can't init WAL`` traceback, or qdrant-client's RuntimeError)."""
    settings = RetrieverSettings(storage_path=tmp_path / "qdrant", engine=engine)
    with LocalServer(create_app(settings)) as server, RetrieverClient(server.url) as client:
        client.ingest("keep", CORPUS[:1])
        env = {**os.environ, "RETRIEVER_STORAGE_PATH": str(settings.storage_path), "RETRIEVER_ENGINE": engine}
        second = subprocess.run(
            [sys.executable, "-m", "uvicorn", "services.retriever.app:app", "--port", "0"],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert second.returncode != 0, second.stderr
        folder = str(settings.storage_path.resolve())
        for named in (folder, "in use by another process", "RETRIEVER_STORAGE_PATH"):
            assert named in second.stderr, second.stderr
        assert "Traceback" not in second.stderr, second.stderr
        assert client.search("keep", ["Acme"], top_k=1)[0][0].id == "acme"  # the first one is unharmed
    # Once the first one stopped, the folder opens again (the lock went with it).
    with LocalServer(create_app(settings)) as server, RetrieverClient(server.url) as client:
        assert {c.name: c.points for c in client.collections()} == {"keep": 1}
