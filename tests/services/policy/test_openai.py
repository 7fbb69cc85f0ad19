"""The OpenAI-compatible routes, driven by the official ``openai`` client (sync and streaming)."""

from __future__ import annotations

import asyncio

import openai
import pytest
from fastapi.testclient import TestClient
from openai.types.chat import ChatCompletionMessageParam

from services.policy.agent import Policy
from services.policy.app import create_app, create_engine
from services.policy.openai_routes import policy_of

from .conftest import small_settings

MODEL = "smollm2-135m-instruct"
HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Name three colors."}]


@pytest.fixture(scope="module")
def client(policy_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{policy_url}/v1", api_key="unused", max_retries=0)


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    (card,) = client.models.list().data
    assert card.id == MODEL
    assert (card.model_extra or {})["root"].endswith("smollm2-135m-instruct")


def test_chat_completion(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8, temperature=0)
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert reply.usage is not None and 0 < reply.usage.completion_tokens <= 8
    assert reply.usage.prompt_tokens > 10  # the chat template's system turn is counted


def test_chat_stream_equals_the_whole_reply(client: openai.OpenAI) -> None:
    kwargs = {"model": MODEL, "messages": HELLO, "max_tokens": 10, "temperature": 0}
    whole = client.chat.completions.create(**kwargs).choices[0]  # type: ignore[call-overload]
    chunks = list(client.chat.completions.create(stream=True, **kwargs))  # type: ignore[call-overload]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(chunks) > 3 and text == whole.message.content
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason


def test_completion_and_stream(client: openai.OpenAI) -> None:
    kwargs = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 6, "temperature": 0}
    whole = client.completions.create(**kwargs).choices[0]  # type: ignore[call-overload]
    assert whole.text.strip()
    chunks = list(client.completions.create(stream=True, **kwargs))  # type: ignore[call-overload]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.text


def test_stop_is_cut_and_named(client: openai.OpenAI) -> None:
    reply = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=12, temperature=0, stop=["."]
    ).choices[0]
    assert reply.finish_reason == "stop" and "." not in reply.text
    assert (reply.model_extra or {})["stop_reason"] == "."


def test_n_choices_and_seed_determinism(client: openai.OpenAI) -> None:
    def sample(seed: int) -> list[str]:
        reply = client.chat.completions.create(
            model=MODEL,
            messages=HELLO,
            max_tokens=8,
            temperature=1.0,
            n=3,
            seed=seed,
        )
        assert [c.index for c in reply.choices] == [0, 1, 2]
        return [c.message.content or "" for c in reply.choices]

    first = sample(7)
    assert sample(7) == first
    assert len(set(first)) > 1 or sample(8) != first  # sampled choices differ


def test_logprobs(client: openai.OpenAI) -> None:
    chat = client.chat.completions.create(
        model=MODEL,
        messages=HELLO,
        max_tokens=5,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    ).choices[0]
    assert chat.logprobs is not None and chat.logprobs.content
    first = chat.logprobs.content[0]
    assert first.logprob <= 0 and len(first.top_logprobs) == 3
    # Greedy decoding picks the most likely token: the chosen one tops the list.
    assert first.top_logprobs[0].token == first.token
    assert "".join(t.token for t in chat.logprobs.content) == chat.message.content
    text = client.completions.create(model=MODEL, prompt="One, two,", max_tokens=4, logprobs=2).choices[0]
    assert text.logprobs is not None and len(text.logprobs.token_logprobs or []) == len(
        text.logprobs.tokens or []
    )


def test_routes_take_the_policy_through_a_dependency(model_path: str) -> None:
    """The routes read the policy through ``policy_of``: a test hands them its own, here one that
    serves under another name with n capped at 1.

    No lifespan runs (a TestClient outside ``with``), so the app loads no model of its own.
    """
    app = create_app(small_settings("http://127.0.0.1:9", model_path))
    client = TestClient(app)
    missing = client.get("/v1/models")
    assert (missing.status_code, missing.json()["error"]["code"]) == (503, "not_ready")
    own = small_settings("http://127.0.0.1:9", model_path, served_model_name="overridden", max_n=1)
    policy = Policy(own, create_engine(own))
    try:
        app.dependency_overrides[policy_of] = lambda: policy
        assert [card["id"] for card in client.get("/v1/models").json()["data"]] == ["overridden"]
        body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0, "n": 2}
        refused = client.post("/v1/chat/completions", json=body)
        assert (refused.status_code, refused.json()["error"]["code"]) == (400, "n_too_large")
        reply = client.post("/v1/chat/completions", json=body | {"n": 1}).json()
        assert reply["model"] == "overridden" and reply["choices"][0]["message"]["role"] == "assistant"
    finally:
        asyncio.run(policy.aclose())
        policy.engine.close()
