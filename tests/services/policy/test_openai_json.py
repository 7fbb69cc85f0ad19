"""``response_format``: JSON enforced while decoding (llguidance), through the official client."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from pydantic import BaseModel

MODEL = "smollm2-135m-instruct"
ASK: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Name a color and how many letters it has."}
]


class Pick(BaseModel):
    color: str
    letters: int


@pytest.fixture(scope="module")
def client(policy_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{policy_url}/v1", api_key="unused", max_retries=0)


def test_parse_gets_the_schema(client: openai.OpenAI) -> None:
    """The client's own structured-output helper: a strict JSON schema in, a parsed model out."""
    plain = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=32, temperature=0)
    with pytest.raises(ValueError):  # left free, the model answers in prose
        json.loads(plain.choices[0].message.content or "")
    reply = client.chat.completions.parse(
        model=MODEL, messages=ASK, max_tokens=32, temperature=0, response_format=Pick
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Pick)
    assert set(json.loads(choice.message.content or "")) == {"color", "letters"}


def test_a_json_stream(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"color": {"type": "string"}}, "required": ["color"]}
    response_format: Any = {"type": "json_schema", "json_schema": {"name": "color", "schema": schema}}
    stream = client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=32, temperature=0, stream=True,
        response_format=response_format,
    )  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert isinstance(json.loads(text)["color"], str)


def test_a_json_schema_needs_its_schema(client: openai.OpenAI) -> None:
    no_schema: Any = {"type": "json_schema"}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, response_format=no_schema)
    assert caught.value.param == "response_format" and "json_schema" in caught.value.message
