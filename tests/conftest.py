"""Shared fixtures: live services over real HTTP on 127.0.0.1 with real embedded storage."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from services.local import LocalServer
from services.retriever.app import create_app
from services.retriever.settings import RetrieverSettings

torch.set_num_threads(1)
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def shared_file(name: str) -> Path:
    """A benchmark file from ../shared/data, or skip the test with the reason."""
    path = SHARED_DATA / name
    if not path.exists():
        pytest.skip(f"{path} not found (../shared/data sits beside the repository in CI)")
    return path


@pytest.fixture(scope="session")
def retriever_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a live retriever (embedded qdrant-edge in a temp folder), for the whole session."""
    settings = RetrieverSettings(storage_path=tmp_path_factory.mktemp("qdrant"))
    with LocalServer(create_app(settings)) as server:
        yield server.url
