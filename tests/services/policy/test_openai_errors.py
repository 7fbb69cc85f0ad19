"""OpenAI fidelity of the errors, the parameters and the message roles, through the official client.

The ``openai`` client is the reference: an error must reach it as ``e.status_code``, ``e.code``,
``e.param`` and ``e.message`` (OpenAI's envelope, 400 for an invalid request); a parameter this
server does not implement must be a 400 naming it, never ignored; tool turns must be accepted.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from transformers import AutoTokenizer

from services.local import LocalServer
from services.policy.app import create_app

from .conftest import small_settings

MODEL = "smollm2-135m-instruct"
HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Name three colors."}]
TOOL_TURNS: list[dict[str, Any]] = [
    {"role": "user", "content": "What is the weather in Velmora?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Velmora"}'}},
    ]},
    {"role": "tool", "tool_call_id": "call_1", "content": "Rain, 11 degrees"},
]  # fmt: skip
# A ChatML template that renders tool calls and results, as tool-calling models' templates do.
TOOL_TEMPLATE = """\
{%- for m in messages -%}
{%- if m.role == 'assistant' and m.tool_calls -%}
<|im_start|>assistant
{% for c in m.tool_calls -%}
<tool_call>{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}</tool_call>
{%- endfor %}<|im_end|>
{% elif m.role == 'tool' -%}
<|im_start|>user
<tool_response>{{ m.content }}</tool_response><|im_end|>
{% else -%}
<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif -%}
"""


@pytest.fixture(scope="module")
def client(policy_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{policy_url}/v1", api_key="unused", max_retries=0)


def raised(call: Any, **kwargs: Any) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as caught:
        call(**kwargs)
    return caught.value


@pytest.mark.parametrize(
    ("change", "status", "code", "param", "says"),
    [
        ({"max_tokens": 10_000}, 400, "max_tokens_too_large", "max_tokens", "POLICY_MAX_TOKENS"),
        ({"max_tokens": 0}, 400, "invalid_request", "max_tokens", "greater than or equal to 1"),
        ({"model": "gpt-4"}, 404, "model_not_found", "model", "'gpt-4'"),
        ({"n": 99}, 400, "n_too_large", "n", "POLICY_MAX_N"),
        ({"messages": []}, 400, "invalid_request", "messages", "at least 1 item"),
        ({"messages": [{"role": "bot", "content": "x"}]}, 400, "invalid_request", "messages[0].role", "role"),
        ({"temperature": 3}, 400, "invalid_request", "temperature", "less than or equal to 2"),
        ({"stop": [""]}, 400, "invalid_request", "stop[0]", "at least 1 character"),  # the schema says so
        ({"messages": [{"role": "user", "content": "x" * 5000}]}, 400, "prompt_too_long", "messages", "4000"),
    ],
)
def test_chat_errors_reach_the_client(
    client: openai.OpenAI, change: dict[str, Any], status: int, code: str, param: str, says: str
) -> None:
    request = {"model": MODEL, "messages": HELLO, "max_tokens": 4, **change}
    e = raised(client.chat.completions.create, **request)
    assert (e.status_code, e.code, e.param, e.type) == (status, code, param, "invalid_request_error")
    assert e.message.startswith(f"Error code: {status} - ") and says in e.message, e.message


def test_completion_errors_reach_the_client(client: openai.OpenAI) -> None:
    empty = raised(client.completions.create, model=MODEL, prompt="  ")
    assert (empty.status_code, empty.code) == (
        400,
        "invalid_request",
    ) and "visible character" in empty.message
    assert (empty.param or "").startswith("prompt"), empty.param
    stream = raised(client.completions.create, model="gpt-4", prompt="Hi", stream=True)
    assert (stream.status_code, stream.code, stream.param) == (404, "model_not_found", "model")


def test_a_stream_that_cannot_start_is_an_http_error(client: openai.OpenAI) -> None:
    long = [{"role": "user", "content": "x" * 5000}]
    e = raised(client.chat.completions.create, model=MODEL, messages=long, stream=True)
    assert (e.status_code, e.code) == (400, "prompt_too_long")


def test_envelope_on_any_error_of_the_openai_routes(policy_url: str) -> None:
    wrong_method = httpx.post(f"{policy_url}/v1/models")
    assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "GET"
    assert wrong_method.json()["error"]["code"] == "method_not_allowed"
    json_type = {"content-type": "application/json"}
    broken = httpx.post(f"{policy_url}/v1/chat/completions", content=b'{"messages": [', headers=json_type)
    assert broken.status_code == 400
    error = broken.json()["error"]
    assert error == {"message": error["message"], "type": "invalid_request_error", "param": None,
                     "code": "malformed_json"}  # fmt: skip


def test_hoprl_routes_keep_the_project_error_body(policy_url: str) -> None:
    body = httpx.post(f"{policy_url}/v1/answer", json={}).json()
    assert body["error"] == "invalid_request" and "question" in body["message"] and "detail" in body


def test_openapi_declares_the_envelope(policy_url: str) -> None:
    paths = httpx.get(f"{policy_url}/openapi.json").json()["paths"]

    def schema(path: str, method: str, status: str) -> str:
        return paths[path][method]["responses"][status]["content"]["application/json"]["schema"]["$ref"]

    for path in ("/v1/chat/completions", "/v1/completions"):
        assert schema(path, "post", "400").endswith("/OpenAIErrorResponse")
        assert schema(path, "post", "404").endswith("/OpenAIErrorResponse")
        assert "422" not in paths[path]["post"]["responses"]  # OpenAI answers 400, so does this server
    assert schema("/v1/models", "get", "4XX").endswith("/OpenAIErrorResponse")
    assert schema("/v1/answer", "post", "422").endswith("/ErrorBody")


CHAT_UNSUPPORTED: list[tuple[str, Any]] = [
    ("tools", [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]),
    ("tool_choice", "required"),
    ("logit_bias", {"2": -100}),
    ("frequency_penalty", 0.5),
    ("presence_penalty", -0.5),
    ("functions", [{"name": "lookup", "parameters": {"type": "object"}}]),
    ("function_call", "auto"),
    ("reasoning_effort", "low"),
    ("store", True),
    ("modalities", ["text", "audio"]),
    ("audio", {"voice": "alloy", "format": "wav"}),
    ("prediction", {"type": "content", "content": "Red"}),
    ("web_search_options", {"search_context_size": "low"}),
    ("verbosity", "low"),
]


@pytest.mark.parametrize(("name", "value"), CHAT_UNSUPPORTED)
def test_chat_rejects_what_it_does_not_implement(client: openai.OpenAI, name: str, value: Any) -> None:
    e = raised(client.chat.completions.create, model=MODEL, messages=HELLO, max_tokens=4, **{name: value})
    assert (e.status_code, e.code, e.param) == (400, "unsupported_parameter", name)
    assert f"'{name}' is not supported" in e.message


@pytest.mark.parametrize(
    ("extra", "code", "param"),
    [
        ({"echo": True}, "unsupported_parameter", "echo"),  # vLLM's chat echo
        ({"top_k": 5}, "unrecognized_parameter", "top_k"),  # not an OpenAI parameter at all
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
         "unsupported_parameter", "messages[0].content[0].type"),
        ({"messages": [{"role": "assistant", "content": "Hi", "refusal": "no"}]},
         "unsupported_parameter", "messages[0].refusal"),
    ],
)  # fmt: skip
def test_chat_rejects_extra_body(client: openai.OpenAI, extra: dict[str, Any], code: str, param: str) -> None:
    e = raised(client.chat.completions.create, model=MODEL, messages=HELLO, max_tokens=4, extra_body=extra)
    assert (e.status_code, e.code, e.param) == (400, code, param)


@pytest.mark.parametrize(
    ("name", "value"),
    [("echo", True), ("best_of", 2), ("logit_bias", {"2": 5}), ("suffix", " end"), ("presence_penalty", 1.0)],
)
def test_completions_reject_what_they_do_not_implement(client: openai.OpenAI, name: str, value: Any) -> None:
    e = raised(client.completions.create, model=MODEL, prompt="One, two,", max_tokens=2, **{name: value})
    assert (e.status_code, e.code, e.param) == (400, "unsupported_parameter", name)


def test_values_that_ask_for_nothing_are_accepted(client: openai.OpenAI) -> None:
    plain = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=6, temperature=0)
    no_ops = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=6, temperature=0, tools=[], tool_choice="none",
        parallel_tool_calls=False, response_format={"type": "text"}, logit_bias={}, frequency_penalty=0,
        presence_penalty=0, store=False, user="user-7", metadata={"run": "a"}, top_p=None, n=None,
    )  # fmt: skip
    assert no_ops.choices[0].message.content == plain.choices[0].message.content


def test_a_tool_turn_is_accepted(client: openai.OpenAI) -> None:
    turns = [*HELLO, {"role": "assistant", "content": "Red, blue."}]
    turns.append({"role": "tool", "tool_call_id": "call_1", "content": "Rain, 11 degrees"})
    reply = client.chat.completions.create(model=MODEL, messages=turns, max_tokens=4)  # type: ignore[arg-type]
    assert reply.choices[0].message.content is not None
    e = raised(client.chat.completions.create, model=MODEL, messages=[{"role": "tool", "content": "x"}])
    assert (e.status_code, e.code, e.param) == (400, "missing_required_parameter", "messages[0].tool_call_id")


def test_a_template_without_tool_calls_is_a_clear_400(client: openai.OpenAI) -> None:
    """The default model's template has no place for tool calls: say so, never drop them silently."""
    e = raised(client.chat.completions.create, model=MODEL, messages=TOOL_TURNS, max_tokens=4)
    assert (e.status_code, e.code, e.param) == (400, "unsupported_messages", "messages")
    assert "chat template" in e.message and "smollm2-135m-instruct" in e.message


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory: pytest.TempPathFactory, model_path: str) -> str:
    """The default model's weights under a chat template that renders tool calls."""
    folder = tmp_path_factory.mktemp("tool-model")
    for file in Path(model_path).iterdir():
        if file.name != "chat_template.jinja":
            (folder / file.name).symlink_to(file)
    (folder / "chat_template.jinja").write_text(TOOL_TEMPLATE)
    return str(folder)


@pytest.fixture(scope="module")
def tool_url(indexed: str, tool_model: str) -> Iterator[str]:
    with LocalServer(create_app(small_settings(indexed, tool_model))) as server:
        yield server.url


def test_tool_calls_render_through_a_template_that_takes_them(tool_url: str, tool_model: str) -> None:
    client = openai.OpenAI(base_url=f"{tool_url}/v1", api_key="unused", max_retries=0)
    reply = client.chat.completions.create(model=tool_model, messages=TOOL_TURNS, max_tokens=4)  # type: ignore[arg-type]
    assert reply.choices[0].message.content is not None
    # The template got the arguments as an object (HF templates expect one), not as JSON text.
    tokenizer = AutoTokenizer.from_pretrained(tool_model)
    rendered = "<|im_start|>user\nWhat is the weather in Velmora?<|im_end|>\n<|im_start|>assistant\n"
    rendered += '<tool_call>{"name": "get_weather", "arguments": {"city": "Velmora"}}</tool_call><|im_end|>\n'
    rendered += "<|im_start|>user\n<tool_response>Rain, 11 degrees</tool_response><|im_end|>\n"
    rendered += "<|im_start|>assistant\n"
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(tokenizer(rendered, add_special_tokens=False)["input_ids"])
