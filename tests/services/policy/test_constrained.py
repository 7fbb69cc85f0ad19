"""``/v1/answer`` under the recipe's action grammar: every recipe answers (or refuses, or stops).

The real default model (SmolLM2-135M-Instruct) behind real HTTP and a live retriever. Unconstrained,
it writes text its recipe cannot parse (search-r1 ended every dev question with a format error at
step 1); served under the grammar, each step parses to an action and the episode ends properly.
Rollouts, which train the policy, are never constrained.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hoprl.agent.grammar import GRAMMARS
from hoprl.clients.retriever import RetrieverClient
from hoprl.data.corpus import pool
from hoprl.data.jsonl import load_questions
from hoprl.domain import Question
from hoprl.recipes import RECIPES, get_recipe
from services.local import LocalServer
from services.policy.app import create_app

from .conftest import COLLECTION, small_settings

QUESTIONS = ["Who founded Acme Records?", "Where was Jane Roe born?", "Which river flows through Velmora?"]
#: R2AG only retrieves: its episode ends with the stop signal once it has expanded its tree.
ENDS = {name: {"stop"} if name == "r2ag" else {"answer", "refuse"} for name in RECIPES}


@pytest.fixture(scope="module")
def served(indexed: str, model_path: str) -> Iterator[str]:
    """The policy with room for a whole constrained step (the grammars need up to 256 tokens)."""
    settings = small_settings(
        indexed, model_path, max_steps=3, max_tokens=256, max_new_tokens_per_step=256, token_budget=1536,
        request_timeout_s=900,
    )  # fmt: skip
    with LocalServer(create_app(settings)) as server:
        yield server.url


async def answer_all(url: str, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        return list(await asyncio.gather(*(http.post("/v1/answer", json=body) for body in bodies)))


@pytest.fixture(scope="module")
def hotpot(indexed: str) -> tuple[str, list[Question]]:
    """Three HotpotQA dev questions, their pooled paragraphs indexed in the live retriever."""
    data = Path(__file__).resolve().parents[4] / "shared" / "data" / "hotpotqa_dev.jsonl"
    if not data.exists():
        pytest.skip(f"{data} not found (../shared/data sits beside the repository in CI)")
    questions = load_questions(data, limit=3)
    with RetrieverClient(indexed) as client:
        client.ingest("hotpot-few", pool(questions))
    return "hotpot-few", questions


def test_every_recipe_answers_under_its_grammar(served: str, hotpot: tuple[str, list[Question]]) -> None:
    """A real HotpotQA question, all recipes at once (the engine batches them): each episode ends
    with its recipe's own final action, never a format error, and every step parses. Two steps: a
    first that may search (or expand) and a last that must end, the grammar's two forms; a third
    step would decode the first form again at ~60 s more in the suite. One question: the grammar
    is the recipe's, not the question's, and a second question per recipe took the test from 43 s
    to 140 s (measured alone; 194 s in the suite), decoding up to 256 tokens a step on CPU."""
    collection, questions = hotpot
    bodies: list[dict[str, Any]] = [
        {
            "question": q.question,
            "recipe": name,
            "collection": collection,
            "return_trace": True,
            "max_steps": 2,
        }
        for name in sorted(RECIPES)
        for q in questions[:1]
    ]
    replies = asyncio.run(answer_all(served, bodies))
    for body, response in zip(bodies, replies, strict=True):
        assert response.status_code == 200, response.text
        reply, name = response.json(), body["recipe"]
        assert reply["constrained"] is True and reply["grammar"] == f"{name}@{GRAMMARS[name].version}", reply
        assert reply["outcome"] in ENDS[name], (name, reply["outcome"], [s["text"] for s in reply["steps"]])
        if reply["outcome"] == "answer":
            assert reply["answer"].strip()
        recipe = get_recipe(name)
        for step in reply["steps"]:
            action = recipe.parse(step["text"])
            assert action.kind == step["action"] != "format_error", (name, step)


def test_a_request_can_turn_the_grammar_off(served: str) -> None:
    """``constrained: false`` serves the model as it is: search-r1's untrained policy then fails the
    protocol on the very questions it answers under the grammar."""
    bodies = [{"question": q, "recipe": "search-r1", "constrained": False} for q in QUESTIONS]
    replies = [r.json() for r in asyncio.run(answer_all(served, bodies))]
    assert all(r["constrained"] is False and r["grammar"] is None for r in replies)
    assert [r["outcome"] for r in replies].count("format_error") >= 2, replies


def test_rollouts_stay_unconstrained(served: str) -> None:
    """A rollout's step is the model's free greedy text (what /v1/chat/completions gives for the same
    turn), not the grammar's: training must see the policy's own format mistakes."""
    question = {"id": "q1", "dataset": "tiny", "split": "dev", "question": QUESTIONS[0]}
    sampling = {
        "shape": {"max_steps": 1, "max_new_tokens_per_step": 32, "token_budget": 1536, "temperature": 0.0}
    }
    body = {"questions": [question], "recipe": "search-r1", "collection": COLLECTION, "sampling": sampling}
    rollout = httpx.post(f"{served}/v1/rollouts", json=body, timeout=600).json()["rollouts"][0]
    recipe = get_recipe("search-r1")
    chat = {
        "model": "smollm2-135m-instruct", "messages": rollout["episode"]["prompt"], "max_tokens": 32,
        "temperature": 0, "stop": recipe.stop,
    }  # fmt: skip
    free = httpx.post(f"{served}/v1/chat/completions", json=chat, timeout=600).json()["choices"][0]
    step = rollout["episode"]["steps"][0]
    assert step["text"] == free["message"]["content"] + (free.get("stop_reason") or "")
    answered = httpx.post(
        f"{served}/v1/answer", json={"question": QUESTIONS[0], "recipe": "search-r1", "return_trace": True},
        timeout=600,
    ).json()  # fmt: skip
    assert answered["steps"][0]["text"].startswith("<think>") and answered["steps"][0]["text"] != step["text"]


def test_setting_off_and_an_engine_that_cannot_constrain(served: str, indexed: str, model_path: str) -> None:
    """POLICY_CONSTRAINED_DECODING=false serves free unless a request asks; the openai engine cannot
    constrain, so asking is a 422 and the default answers free, saying so."""
    off = small_settings(indexed, model_path, max_new_tokens_per_step=256, constrained_decoding=False)
    remote = small_settings(
        indexed, model_path, max_new_tokens_per_step=256, engine="openai", openai_base_url=f"{served}/v1"
    )
    question = {"question": QUESTIONS[0], "recipe": "naive-rag", "max_steps": 1}
    with LocalServer(create_app(off)) as server, httpx.Client(base_url=server.url, timeout=600) as http:
        free = http.post("/v1/answer", json=question).json()
        asked = http.post("/v1/answer", json={**question, "constrained": True}).json()
    assert (free["constrained"], free["grammar"]) == (False, None)
    assert (asked["constrained"], asked["grammar"]) == (True, "naive-rag@2")
    with LocalServer(create_app(remote)) as server:
        refused = httpx.post(f"{server.url}/v1/answer", json={**question, "constrained": True}, timeout=600)
        default = httpx.post(f"{server.url}/v1/answer", json=question, timeout=600).json()
    assert refused.status_code == 422 and refused.json()["error"] == "constraint_unsupported"
    assert "openai engine" in refused.json()["message"] and default["constrained"] is False


def test_the_last_affordable_step_may_only_end_the_episode() -> None:
    """A step turns final when it is the last allowed one, or when after its longest search turn the
    runner's next call could not hold a closing turn (tests/hoprl/agent/test_forced_ending.py has
    the arithmetic): search-r1's turns are 105 tokens at 200 and 256, so 2048 - 105 - 105 = 1838 grown
    tokens is the last point it may search."""
    from hoprl.generation.chat import Constraint

    first = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    rule = Constraint("search-r1", max_steps=5, step_tokens=256, token_budget=2048, count=len)
    for free in (
        rule.grammar(first, step=0, max_tokens=256, grown=0),
        rule.grammar(first, step=1, max_tokens=200, grown=1838),  # a short grant is no reason to close
    ):
        assert free is not None and "<search>" in free.lark
    for late in (
        rule.grammar(first, step=4, max_tokens=256, grown=0),  # the step cap
        rule.grammar(first, step=1, max_tokens=256, grown=1839),  # no room for a closing turn after it
    ):
        assert late is not None and "<search>" not in late.lark and "<answer>" in late.lark
    assert rule.grammar(first, step=1, max_tokens=20, grown=0) is None  # not even the tags
