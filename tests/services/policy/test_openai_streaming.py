"""Streaming as decoded: timed at the official client, equal to the whole reply, never past a stop.

Before, the stream was replayed once decoding had ended (the first chunk came at 7.21 s of 7.23 s);
now the transformers engine hands each row's new text over from its decoding loop.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from hoprl.generation.engines import SamplingParams
from hoprl.generation.streaming import TextStream, held_back
from hoprl.generation.transformers_engine import TransformersEngine

MODEL = "smollm2-135m-instruct"
COUNTING = "1, 2, 3, 4, 5,"  # the model keeps counting, so it uses every one of its tokens
HELLO = [{"role": "user", "content": "Name three colors."}]


@pytest.fixture(scope="module")
def client(policy_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{policy_url}/v1", api_key="unused", max_retries=0)


def timed(create: Any, **kwargs: Any) -> list[tuple[float, Any]]:
    """Each chunk of ``create(stream=True, **kwargs)`` with its arrival time since the request."""
    start = time.perf_counter()
    return [(time.perf_counter() - start, chunk) for chunk in create(stream=True, **kwargs)]


def test_completion_chunks_arrive_as_decoded(client: openai.OpenAI) -> None:
    kwargs = {"model": MODEL, "prompt": COUNTING, "max_tokens": 32, "temperature": 0}
    arrivals = [(t, c.choices[0].text) for t, c in timed(client.completions.create, **kwargs) if c.choices]
    pieces = [(t, text) for t, text in arrivals if text]
    first, last = pieces[0][0], pieces[-1][0]
    assert len(pieces) >= 16 and first < last / 4, (first, last, len(pieces))
    whole = client.completions.create(**kwargs).choices[0]  # type: ignore[call-overload]
    assert whole.finish_reason == "length" and "".join(text for _, text in pieces) == whole.text


def test_chat_stream_as_decoded_equals_the_greedy_reply(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"model": MODEL, "messages": HELLO, "max_tokens": 32, "temperature": 0}
    chunks = timed(client.chat.completions.create, stream_options={"include_usage": True}, **kwargs)
    pieces = [(t, c.choices[0].delta.content) for t, c in chunks if c.choices and c.choices[0].delta.content]
    assert pieces[0][0] < pieces[-1][0] / 3, pieces
    whole = client.chat.completions.create(**kwargs)
    assert "".join(text for _, text in pieces) == whole.choices[0].message.content
    assert chunks[0][1].choices[0].delta.role == "assistant"
    ends = [c.choices[0].finish_reason for _, c in chunks if c.choices and c.choices[0].finish_reason]
    assert ends == [whole.choices[0].finish_reason]
    assert chunks[-1][1].usage == whole.usage


def test_the_event_stream_ends_with_done(policy_url: str) -> None:
    body = {"messages": HELLO, "max_tokens": 8, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{policy_url}/v1/chat/completions", json=body, timeout=120) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)


def test_a_stream_never_passes_a_stop_string(client: openai.OpenAI) -> None:
    """ "9, 10," ends the count: the "1" and "0" wait (they may begin the stop) and are never sent."""
    kwargs = {"model": MODEL, "prompt": COUNTING, "max_tokens": 32, "temperature": 0, "stop": ["10,"]}
    whole = client.completions.create(**kwargs).choices[0]  # type: ignore[call-overload]
    assert whole.finish_reason == "stop" and whole.text.endswith("9, ")
    pieces = [c.choices[0].text for _, c in timed(client.completions.create, **kwargs) if c.choices]
    assert "".join(pieces) == whole.text and not any("1" in p for p in pieces[-3:])


def test_n_choices_stream_side_by_side(client: openai.OpenAI) -> None:
    kwargs = {"model": MODEL, "messages": HELLO, "max_tokens": 12, "temperature": 1.0, "n": 2, "seed": 3}
    whole = client.chat.completions.create(**kwargs)  # type: ignore[call-overload]
    texts = ["", ""]
    for _, chunk in timed(client.chat.completions.create, **kwargs):
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts == [c.message.content for c in whole.choices] and texts[0] != texts[1]


def test_a_stream_with_logprobs_carries_them(client: openai.OpenAI) -> None:
    """Log-probs are known once decoding ends, so these chunks come then, each with its tokens'."""
    kwargs: dict[str, Any] = {"model": MODEL, "messages": HELLO, "max_tokens": 6, "temperature": 0}
    whole = client.chat.completions.create(logprobs=True, **kwargs).choices[0]
    chunks = [c for _, c in timed(client.chat.completions.create, logprobs=True, **kwargs) if c.choices]
    pieces = [c.choices[0] for c in chunks if c.choices[0].delta.content]
    assert "".join(p.delta.content or "" for p in pieces) == whole.message.content
    tokens = [t.token for p in pieces for t in ((p.logprobs and p.logprobs.content) or [])]
    assert whole.logprobs is not None and tokens == [t.token for t in whole.logprobs.content or []]


@pytest.mark.parametrize(
    ("text", "stop", "held"),
    [
        ("the answer is <", ["</answer>"], 1),
        ("the answer is </ans", ["</answer>"], 5),
        ("xaa", ["aab"], 2),  # the earliest place the stop may begin
        ("the answer", ["</answer>"], 0),
        ("9, 1", ["10,", "\n"], 1),
        ("", ["x"], 0),
    ],
)
def test_held_back(text: str, stop: list[str], held: int) -> None:
    assert held_back(text, stop) == held


def test_text_stream_sends_only_what_no_token_can_change(model_path: str) -> None:
    """A character split over tokens and a stop string split over tokens are both held back."""
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    text = "Tea 🍵 is ready </answer> and more"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) > len(tokenizer("Tea 🍵", add_special_tokens=False)["input_ids"]) > 3  # 🍵 spans tokens
    pieces: list[str] = []
    stream = TextStream(tokenizer, {tokenizer.eos_token_id}, ["</answer>"], pieces.append)
    for token in ids:
        stream.push(token)
    assert "".join(pieces) == "Tea 🍵 is ready " and not any("\ufffd" in p for p in pieces)
    assert stream.done and len(pieces) > 3


def test_a_streamed_call_beside_an_unstreamed_one(model_path: str) -> None:
    """Two concurrent calls share the engine's batch: only the streamed one's text reaches its sink,
    and its pieces add up to its text."""
    engine = TransformersEngine(model_path)
    prompts = [[{"role": "user", "content": q}] for q in ("Name three colors.", "Count to five.")]
    params = SamplingParams(max_tokens=24, temperature=0)
    pieces: list[tuple[int, str]] = []
    streamed = replace(params, on_text=lambda choice, text: pieces.append((choice, text)))
    with ThreadPoolExecutor(2) as pool:
        calls = [
            pool.submit(engine.generate, [prompts[0]], streamed),
            pool.submit(engine.generate, [prompts[1]], params),
        ]
        texts = [call.result()[0][0].text for call in calls]
    engine.close()
    assert texts[0] != texts[1] and "".join(t for _, t in pieces) == texts[0] and len(pieces) > 3
    assert {choice for choice, _ in pieces} == {0}
