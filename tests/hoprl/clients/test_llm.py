"""The chat client against a scripted OpenAI-compatible server over real HTTP."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hoprl.clients.llm import LLMClient, expected_close, restore_stop
from hoprl.domain import Completion
from services.local import LocalServer
from tests import scripted_llm as scripted

STOP = ["</search>", "</answer>"]


@pytest.mark.parametrize(
    ("text", "finish", "stop_reason", "appended"),
    [
        ("<search>acme", "stop", "</search>", "</search>"),  # rule 1: the server names the stop
        ("<think>x</think><search>acme", "stop", None, "</search>"),  # rule 2: last unclosed tag
        ("<search>a</search><answer>Jane", "stop", 151645, "</answer>"),  # EOS token id: rule 2
        ("<answer>Jane", "stop", "</bogus>", "</answer>"),  # named stop was never asked for: rule 2
        ("<think>done</think>", "stop", None, None),  # nothing open: the model ended its turn
        ("<search>acme", "length", None, None),  # rule 3: cut by max_tokens
        ("<search>acme</search>", "stop", "</search>", None),  # server already kept it
    ],
)
def test_restore_stop(text: str, finish: str, stop_reason: Any, appended: str | None) -> None:
    assert restore_stop(text, finish, stop_reason, STOP) == appended


def test_expected_close_ignores_non_tag_stops() -> None:
    assert expected_close("<answer>x", ["\n\n", "</answer>"]) == "</answer>"
    assert expected_close("<answer>x", ["\n\n"]) is None


def chat(app: Any, **kwargs: Any) -> list[Completion]:
    async def go(url: str) -> list[Completion]:
        llm = LLMClient(url + "/v1", model="scripted", timeout=10, retries=0)
        try:
            return await llm.chat([{"role": "user", "content": "Q1"}], **kwargs)
        finally:
            await llm.aclose()

    with LocalServer(app) as server:
        return asyncio.run(go(server.url))


@pytest.mark.parametrize("report", [True, False])
def test_stop_text_is_kept_and_the_rest_cut(report: bool) -> None:
    app = scripted.create_app(
        {"Q1": ["<think>t</think><search>acme</search><information>fake"]}, report_stop_reason=report
    )
    (c,) = chat(app, stop=STOP, max_tokens=50)
    assert c.text == "<think>t</think><search>acme</search>"
    assert (c.finish_reason, c.stop) == ("stop", "</search>")
    assert c.usage["completion_tokens"] > 0 and c.usage["prompt_tokens"] > 0
    sent = app.state.requests[0]
    assert sent["stop"] == STOP and sent["max_tokens"] == 50


def test_n_choices_seed_and_logprobs() -> None:
    app = scripted.create_app({"Q1": ["<answer>Jane Roe</answer>"]})
    out = chat(app, stop=STOP, n=3, seed=7, logprobs=True, temperature=0.5)
    assert [c.text for c in out] == ["<answer>Jane Roe</answer>"] * 3
    assert out[0].logprobs is not None
    assert [t for t, _ in out[0].logprobs] == ["<", "answer", ">", "Jane", " ", "Roe"]
    assert app.state.requests[0]["seed"] == 7 and app.state.requests[0]["temperature"] == 0.5


def test_length_cut_appends_nothing() -> None:
    app = scripted.create_app({"Q1": ["<think>a long chain of thought</think>"]})
    (c,) = chat(app, stop=STOP, max_tokens=4)  # "<", "think", ">", "a"
    assert (c.text, c.finish_reason, c.stop) == ("<think>a", "length", None)
