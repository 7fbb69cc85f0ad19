"""``POST /v1/answer``'s ``recipe_config``: R2AG's evaluation at top-k = 2 and top-t (App. C.2).

The model is the scripted OpenAI-compatible server (the policy's ``openai`` engine), so the
expansion it writes is known; the retriever and the policy service are the real ones over HTTP.
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

QUESTION = "Where was the founder of Acme Records born?"
EXPANSION = (
    "<think>two hops</think>\n<base-Q>Acme Records founder</base-Q>\n<base-Q>Jane Roe birthplace</base-Q>\n"
    "<predicted-Q>Velmora</predicted-Q>\n<end/>"
)
STOP = "<think>found</think>\n<base-Q>stop retrieval</base-Q>\n<predicted-Q>none</predicted-Q>\n<end/>"


@pytest.fixture(scope="module")
def r2ag_url(indexed: str, model_path: str) -> Iterator[str]:
    with LocalServer(scripted.create_app({QUESTION: [EXPANSION, STOP]})) as llm:
        settings = small_settings(
            indexed, model_path, engine="openai", openai_base_url=f"{llm.url}/v1", max_new_tokens_per_step=256
        )
        with LocalServer(create_app(settings)) as server:
            yield server.url


def answer(url: str, **extra: object) -> httpx.Response:
    body = {"question": QUESTION, "recipe": "r2ag", "return_trace": True, **extra}
    return httpx.post(f"{url}/v1/answer", json=body, timeout=300)


def first_step(reply: httpx.Response) -> dict[str, Any]:
    assert reply.status_code == 200, reply.text
    step: dict[str, Any] = reply.json()["steps"][0]
    return step


def test_training_defaults_retrieve_every_branch_at_top_1(r2ag_url: str) -> None:
    step = first_step(answer(r2ag_url))
    assert step["queries"] == ["Acme Records founder", "Jane Roe birthplace", "Velmora"]
    assert [len(docs) for docs in step["docs"]] == [1, 1, 1]


def test_top_t_and_top_k_of_the_protocol_reach_the_episode(r2ag_url: str) -> None:
    """MuSiQue's protocol options (top-k 2, t = M/2 = 2): the third branch is not retrieved and
    each of the first two brings 2 documents."""
    step = first_step(answer(r2ag_url, recipe_config={"top_k": 2, "top_t": 2}))
    assert step["queries"] == ["Acme Records founder", "Jane Roe birthplace"]
    assert [len(docs) for docs in step["docs"]] == [2, 2]


def test_a_bad_option_is_a_422_naming_it(r2ag_url: str) -> None:
    for config, named in (({"top_t": 0}, "top_t"), ({"topk": 2}, "topk")):
        reply = answer(r2ag_url, recipe_config=config)
        assert reply.status_code == 409 and reply.json()["error"] == "invalid_recipe_config"
        assert named in reply.json()["message"]
