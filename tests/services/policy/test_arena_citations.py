"""``POST /v1/answer`` with ARENA returns the references the model named in ``<relevance>``.

The model is the scripted OpenAI-compatible server (the policy's ``openai`` engine), so what it
writes is known; the retriever and the policy service are the real ones over HTTP.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from services.local import LocalServer
from services.policy.app import create_app
from tests import scripted_llm as scripted

from .conftest import small_settings

QUESTION = "Who founded Acme Records?"
ANSWER = (
    "<relevance>[2]</relevance>\n<analysis>[2] says Jane Roe founded it.</analysis>\n"
    "<answer>Jane Roe</answer>"
)
PARAGRAPHS = [
    {"title": "Beta", "text": "Beta is a band from Velmora.", "is_gold": False},
    {"title": "Acme Records", "text": "Acme Records was founded by Jane Roe.", "is_gold": True},
    {"title": "Ansk", "text": "The Ansk is a river.", "is_gold": False},
]


@pytest.fixture(scope="module")
def arena_url(indexed: str, model_path: str) -> Iterator[str]:
    with LocalServer(scripted.create_app({QUESTION: [ANSWER]})) as llm:
        settings = small_settings(
            indexed, model_path, engine="openai", openai_base_url=f"{llm.url}/v1", max_new_tokens_per_step=256
        )
        with LocalServer(create_app(settings)) as server:
            yield server.url


def answer(url: str, **extra: object) -> dict[str, Any]:
    body = {"question": QUESTION, "recipe": "arena", "return_trace": True, **extra}
    response = httpx.post(f"{url}/v1/answer", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()


def test_given_paragraphs_cite_the_named_one(arena_url: str) -> None:
    """The model names [2] of three given paragraphs: one citation, the second paragraph."""
    reply = answer(arena_url, paragraphs=PARAGRAPHS)
    assert reply["answer"] == "Jane Roe" and reply["steps"][0]["docs"] == []
    assert reply["citations"] == [{"doc_id": "paragraph:2", "title": "Acme Records"}]


def test_retrieved_references_cite_the_named_one_only(arena_url: str) -> None:
    """A bare question: 4 documents retrieved as references [1]..[4]; the model names [2], so the
    one citation is the second retrieved document, not all four."""
    reply = answer(arena_url)
    retrieved = [d for docs in reply["steps"][0]["docs"] for d in docs]
    assert len(retrieved) == 4
    assert reply["citations"] == [{"doc_id": retrieved[1]["id"], "title": retrieved[1]["title"]}]
