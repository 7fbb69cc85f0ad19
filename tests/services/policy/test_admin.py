"""``POST /v1/admin/checkpoint``: bearer auth, path validation, and a live weight switch."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hoprl.clients.policy import PolicyClient, ServiceError
from services.local import LocalServer
from services.policy.app import create_app

from .conftest import ADMIN_TOKEN, small_settings

ROUTE = "/v1/admin/checkpoint"


@pytest.mark.parametrize(
    ("headers", "status", "error"),
    [
        ({}, 401, "unauthorized"),
        ({"Authorization": "Basic abc"}, 401, "unauthorized"),
        ({"Authorization": "Bearer"}, 401, "unauthorized"),
        ({"Authorization": "Bearer wrong"}, 403, "forbidden"),
    ],
)
def test_auth(policy_url: str, headers: dict[str, str], status: int, error: str) -> None:
    response = httpx.post(f"{policy_url}{ROUTE}", json={"path": "/tmp"}, headers=headers)
    assert response.status_code == status and response.json()["error"] == error
    if status == 401:
        assert response.headers["www-authenticate"] == "Bearer"


def test_disabled_without_a_token(indexed: str, model_path: str) -> None:
    with LocalServer(create_app(small_settings(indexed, model_path, admin_token=None))) as server:
        response = httpx.post(
            f"{server.url}{ROUTE}", json={"path": model_path}, headers={"Authorization": "Bearer x"}
        )
    assert response.status_code == 403 and "POLICY_ADMIN_TOKEN" in response.json()["message"]


def test_path_validation(policy_url: str, tmp_path: Path) -> None:
    with PolicyClient(policy_url, admin_token=ADMIN_TOKEN) as policy:
        with pytest.raises(ServiceError) as missing:
            policy.switch_checkpoint(str(tmp_path / "nope"))
        with pytest.raises(ServiceError) as empty:
            policy.switch_checkpoint(str(tmp_path))
    assert missing.value.status == 404 and missing.value.body["error"] == "checkpoint_not_found"
    assert empty.value.status == 422 and empty.value.body["error"] == "not_a_checkpoint"


def test_switch_serves_the_new_weights(indexed: str, model_path: str, tmp_path: Path) -> None:
    """A "trained" copy (one weight nudged) is loaded live; /v1/models reports it, outputs change."""
    model = AutoModelForCausalLM.from_pretrained(model_path)
    with torch.no_grad():
        model.lm_head.weight[:, :] += 0.05 * torch.randn_like(model.lm_head.weight)
    new = tmp_path / "step-100"
    model.save_pretrained(new)
    AutoTokenizer.from_pretrained(model_path).save_pretrained(new)
    prompt = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0, "logprobs": 1}
    with LocalServer(create_app(small_settings(indexed, model_path))) as server:
        before = httpx.post(f"{server.url}/v1/completions", json=prompt).json()["choices"][0]
        with PolicyClient(server.url, admin_token=ADMIN_TOKEN) as policy:
            switched = policy.switch_checkpoint(str(new))
            assert switched.model == "step-100" and policy.model() == "step-100"
        after = httpx.post(f"{server.url}/v1/completions", json=prompt).json()["choices"][0]
        assert httpx.get(f"{server.url}/v1/models").json()["data"][0]["root"] == str(new.resolve())
    assert after["logprobs"]["token_logprobs"] != before["logprobs"]["token_logprobs"]


@pytest.mark.parametrize("body", [b"{}", b"{", b'{"path": 1}', b'{"nope": true}'])
@pytest.mark.parametrize(
    ("headers", "status", "error"),
    [({}, 401, "unauthorized"), ({"Authorization": "Bearer wrong"}, 403, "forbidden")],
)
def test_credentials_before_the_body(
    policy_url: str, body: bytes, headers: dict[str, str], status: int, error: str
) -> None:
    """The token is checked before the body is read: without it, a broken or incomplete body gets the
    same 401 / 403 as a good one (it used to be a 422 naming the missing field, or a 400), so the
    route's shape is not revealed to a caller without the token (docs/security.md)."""
    headers = headers | {"Content-Type": "application/json"}
    response = httpx.post(f"{policy_url}{ROUTE}", content=body, headers=headers)
    assert (response.status_code, response.json()["error"]) == (status, error), response.text
    assert "path" not in response.json()["message"]


def test_an_unknown_admin_path_is_refused_alike(policy_url: str) -> None:
    """Nor does an unauthenticated caller learn which admin routes exist: 401, not 404."""
    assert httpx.post(f"{policy_url}/v1/admin/nothing-here", json={}).status_code == 401
