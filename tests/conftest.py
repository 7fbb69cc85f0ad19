"""Shared fixtures: live services over real HTTP on 127.0.0.1 with real embedded storage, a tiny
model with the real tokenizer (:mod:`tests.models`), a synthetic-world index, a fresh PostgreSQL."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from hoprl.clients.retriever import RetrieverClient
from hoprl.data.corpus import pool
from hoprl.data.synthetic import generate
from hoprl.domain import EpisodeShape, Question
from hoprl.evaluation import corpus_collection, ensure_indexed
from hoprl.generation.model import resolve_model
from services.local import LocalServer
from services.retriever.app import create_app
from services.retriever.settings import RetrieverSettings
from tests.exit_guard import pytest_sessionfinish, pytest_unconfigure  # noqa: F401  (hooks)
from tests.models import make_tiny_model
from tests.postgres import admin_url_or_skip, fresh_database

torch.set_num_threads(1)
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


def shape(
    max_steps: int = 10,
    max_new_tokens_per_step: int = 512,
    token_budget: int = 4096,
    temperature: float = 1.0,
    **rest: object,
) -> EpisodeShape:
    """An episode shape for a test: roomy limits and sampling at 1.0 (what the runner's options
    defaulted to before episodes had a shape) unless the test names its own."""
    return EpisodeShape.model_validate(
        {
            "max_steps": max_steps,
            "max_new_tokens_per_step": max_new_tokens_per_step,
            "token_budget": token_budget,
            "temperature": temperature,
            **rest,
        }
    )


def load_script(relative: str, name: str) -> ModuleType:
    """A file of the repository that is no package module (a bench or infra script, another
    folder's conftest), imported by its path and registered as ``name``."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


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


@pytest.fixture(scope="session")
def tokenizer_path() -> str:
    return resolve_model(None, ROOT / ".hoprl/models/smollm2-135m-instruct")


@pytest.fixture(scope="session")
def tiny_model(tokenizer_path: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_model(tokenizer_path, tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def synthetic() -> dict[str, list[Question]]:
    """A small slice of the synthetic world: 8 train and 4 dev questions."""
    splits = generate(seed=0)
    return {"train": list(splits["train"][:8]), "dev": list(splits["dev"][:4])}


@pytest.fixture(scope="session")
def collection(retriever_url: str, synthetic: dict[str, list[Question]]) -> str:
    """The slice's paragraphs indexed in the live retriever."""
    documents = pool(synthetic["train"] + synthetic["dev"])
    name = corpus_collection("trainer-test", documents)
    with RetrieverClient(retriever_url) as client:
        ensure_indexed(client, name, documents)
    return name


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh database on the real PostgreSQL for this session's trainer services (skips without one)."""
    with fresh_database(admin_url_or_skip()) as url:
        yield url.render_as_string(hide_password=False)
