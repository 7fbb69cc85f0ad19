"""``/v1/answer``'s step limit and the fields an evaluation protocol sends (sampling, references).

EVO-RAG evaluates episodes of up to T_max = 20 steps (its App. A.2), so the service's limit
(POLICY_MAX_STEPS) is 20 by default while a request that names no max_steps keeps the old 10
(POLICY_DEFAULT_MAX_STEPS). R2AG evaluates at temperature 0.6, top-p 0.9 (its App. C.2); ARENA
answers over the question's own paragraphs (its §4.4).
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from services.local import LocalServer
from services.policy.app import create_app
from services.policy.settings import PolicySettings

from .conftest import small_settings


def test_the_limit_lets_a_protocol_ask_for_evo_rags_twenty_steps() -> None:
    fields = PolicySettings.model_fields
    assert fields["max_steps"].default == 20 and fields["default_max_steps"].default == 10


@pytest.fixture(scope="module")
def paper_limits_url(indexed: str, model_path: str) -> Iterator[str]:
    """A policy with the default step limit (20) and short generations (naive-rag answers in one step)."""
    limit = PolicySettings.model_fields["max_steps"].default
    with LocalServer(create_app(small_settings(indexed, model_path, max_steps=limit))) as server:
        yield server.url


def test_twenty_steps_accepted_above_the_limit_a_422_naming_the_field(paper_limits_url: str) -> None:
    ok = httpx.post(f"{paper_limits_url}/v1/answer", json={"question": "Who founded Acme Records?",
                                                          "max_steps": 20}, timeout=120)  # fmt: skip
    assert ok.status_code == 200, ok.text
    too_many = httpx.post(f"{paper_limits_url}/v1/answer", json={"question": "q?", "max_steps": 21})
    assert too_many.status_code == 422
    body = too_many.json()
    assert body["error"] == "max_steps_too_large"
    assert "max_steps=21" in body["message"] and "POLICY_MAX_STEPS" in body["message"]


def test_sampling_fields_accepted_and_bounded(paper_limits_url: str) -> None:
    question = {"question": "Who founded Acme Records?", "temperature": 0.6, "top_p": 0.9, "seed": 7}
    reply = httpx.post(f"{paper_limits_url}/v1/answer", json=question, timeout=120)
    assert reply.status_code == 200, reply.text
    hot = httpx.post(f"{paper_limits_url}/v1/answer", json={"question": "q?", "temperature": 2.5})
    assert hot.status_code == 422 and "temperature" in hot.text


def test_references_count_against_the_prompt_limit(paper_limits_url: str) -> None:
    # small_settings: max_prompt_chars 4000; one paragraph of 4,000 characters plus the question is over it
    big = {"title": "T", "text": "x" * 4000, "is_gold": False}
    response = httpx.post(f"{paper_limits_url}/v1/answer",
                          json={"question": "q?", "recipe": "arena", "paragraphs": [big]})  # fmt: skip
    assert response.status_code == 422
    assert response.json()["error"] == "prompt_chars_too_large" and "POLICY_MAX_PROMPT_CHARS" in response.text
