"""``POLICY_ENGINE=auto`` (the default): vLLM wherever the ``vllm`` package is installed, else
transformers, resolved when the settings are read, so ``/readyz`` names the engine that serves."""

from __future__ import annotations

import importlib.util

import httpx
import pytest

import services.policy.settings as policy_settings
from services.local import LocalServer
from services.policy.app import create_app
from services.policy.settings import PolicySettings

from .conftest import small_settings


def without_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """The interpreter's package lookup, as on a machine where vLLM is not installed."""
    real = importlib.util.find_spec
    monkeypatch.setattr(policy_settings, "find_spec", lambda name: None if name == "vllm" else real(name))


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_auto_serves_vllm_where_it_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POLICY_ENGINE", raising=False)
    assert PolicySettings().engine == "vllm"
    monkeypatch.setenv("POLICY_ENGINE", "auto")
    assert PolicySettings().engine == "vllm"


def test_auto_serves_transformers_without_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    without_vllm(monkeypatch)
    monkeypatch.delenv("POLICY_ENGINE", raising=False)
    assert PolicySettings().engine == "transformers"
    assert PolicySettings(engine="auto").engine == "transformers"


@pytest.mark.parametrize("engine", ["transformers", "vllm", "openai"])
def test_a_named_engine_is_kept(monkeypatch: pytest.MonkeyPatch, engine: str) -> None:
    without_vllm(monkeypatch)  # an explicit vllm is kept where the lookup finds none (its start says why)
    monkeypatch.setenv("POLICY_ENGINE", engine)
    assert PolicySettings().engine == engine


def test_readyz_names_the_resolved_engine(
    monkeypatch: pytest.MonkeyPatch, indexed: str, model_path: str
) -> None:
    without_vllm(monkeypatch)
    settings = small_settings(indexed, model_path, engine="auto")
    with LocalServer(create_app(settings)) as server:
        ready = httpx.get(f"{server.url}/readyz").json()
    assert ready["engine"] == "transformers" and ready["model"] == "smollm2-135m-instruct"
