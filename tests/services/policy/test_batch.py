"""``POST /v1/answer/batch``: greedy lock-step answers, repeatable and equal to lockstep_episodes.

The tiny random model (:mod:`tests.models`) decodes against the live retriever on the synthetic
world's index, so the episodes differ in length and the rounds thin out as they end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from hoprl.answer_eval import evaluate_answers
from hoprl.clients.policy import AsyncPolicyClient, PolicyClient
from hoprl.clients.retriever import AsyncRetrieverClient
from hoprl.domain import Question
from hoprl.generation.lockstep import lockstep_episodes
from hoprl.recipes import get_recipe
from hoprl.schemas.policy import AnswerResponse
from services.local import LocalServer
from services.policy.app import create_app
from services.policy.settings import PolicySettings

API_KEY = "batch-test-key"


def tiny_settings(retriever_url: str, tiny_model: str, collection: str, **overrides: Any) -> PolicySettings:
    values: dict[str, Any] = {
        "engine": "transformers",  # the default (auto) may be vllm, which has no kernel for head_dim 16
        "model": tiny_model, "retriever_url": retriever_url, "default_collection": collection,
        "default_recipe": "search-r1", "max_steps": 3, "max_new_tokens_per_step": 64, "token_budget": 512,
        "max_rollouts": 6, "max_question_chars": 200, "request_timeout_s": 120, **overrides,
    }  # fmt: skip
    return PolicySettings.model_validate(values)


@pytest.fixture(scope="module")
def served(retriever_url: str, tiny_model: str, collection: str) -> Iterator[tuple[str, Any]]:
    """A policy on the tiny model, in process: its URL and its app (for the engine)."""
    app = create_app(tiny_settings(retriever_url, tiny_model, collection))
    with LocalServer(app) as server:
        yield server.url, app


@pytest.fixture(scope="module")
def texts(synthetic: dict[str, list[Question]]) -> list[str]:
    return [q.question for q in synthetic["dev"] + synthetic["train"][:2]]


def transcript(reply: AnswerResponse) -> tuple[Any, ...]:
    steps = [(s.text, s.queries, [[d.id for d in docs] for docs in s.docs]) for s in reply.steps or []]
    return reply.answer, reply.outcome, reply.refused, [c.doc_id for c in reply.citations], steps


@pytest.mark.parametrize("recipe", ["search-r1", "naive-rag"])
def test_batch_repeats_and_equals_lockstep_episodes(
    served: tuple[str, Any], texts: list[str], collection: str, retriever_url: str, recipe: str
) -> None:
    url, app = served
    with PolicyClient(url) as client:
        first = client.answer_batch(texts, recipe=recipe, return_trace=True, constrained=False)
        again = client.answer_batch(texts, recipe=recipe, return_trace=True, constrained=False)
    assert [transcript(a) for a in again.answers] == [transcript(a) for a in first.answers]
    assert first.rounds == again.rounds >= 1 and len(first.answers) == len(texts)
    assert {a.recipe for a in first.answers} == {recipe} and not any(a.constrained for a in first.answers)

    policy = app.state.policy
    s = policy.settings
    questions = [Question(id=f"q{i}", dataset="api", split="serve", question=t) for i, t in enumerate(texts)]

    async def direct() -> list[Any]:
        retriever = AsyncRetrieverClient(retriever_url)
        try:
            return await lockstep_episodes(
                get_recipe(recipe), questions, policy.engine, retriever, collection,
                shape=s.serving_shape(),
            )  # fmt: skip
        finally:
            await retriever.aclose()

    episodes = asyncio.run(direct())
    expected = [
        (e.final_answer, e.outcome, e.refused, [[d.id for d in docs] for s in e.steps for docs in s.docs])
        for e in episodes
    ]
    got = [
        (a.answer, a.outcome, a.refused, [[d.id for d in docs] for s in a.steps or [] for docs in s.docs])
        for a in first.answers
    ]
    assert got == expected
    texts_got = [[step.text for step in a.steps or []] for a in first.answers]
    assert texts_got == [[step.text for step in e.steps] for e in episodes]


def test_constrained_batch_repeats_and_says_so(served: tuple[str, Any], texts: list[str]) -> None:
    url, _ = served

    async def twice() -> list[Any]:
        client = AsyncPolicyClient(url)
        try:
            return [await client.answer_batch(texts[:4], return_trace=True) for _ in range(2)]
        finally:
            await client.aclose()

    first, again = asyncio.run(twice())
    assert [transcript(a) for a in again.answers] == [transcript(a) for a in first.answers]
    assert all(a.constrained and (a.grammar or "").startswith("search-r1@") for a in first.answers)


def test_repeatable_evaluation_scores_the_same_twice(
    served: tuple[str, Any], synthetic: dict[str, list[Question]], retriever_url: str, collection: str
) -> None:
    url, _ = served
    questions = synthetic["dev"] + synthetic["train"][:1]

    seen: list[dict[str, Any]] = []

    def run() -> dict[str, Any]:
        return evaluate_answers(
            url, retriever_url, questions, "search-r1", collection, repeatable=True, batch_size=2,
            on_answer=seen.append,
        )  # fmt: skip

    first, again = run(), run()
    assert first["repeatable"] and first["errors"] == 0 and first["questions"] == 5
    assert seen == first["predictions"] + again["predictions"]  # each row once, in the batches' order
    keys = ("id", "prediction", "em", "f1", "retrievals", "queries", "outcome", "retrieved")
    assert [{k: r[k] for k in keys} for r in again["predictions"]] == [
        {k: r[k] for k in keys} for r in first["predictions"]
    ]


@pytest.mark.parametrize(
    ("body", "status", "error", "names"),
    [
        ({"questions": []}, 422, "invalid_request", "questions"),
        ({}, 422, "invalid_request", "questions"),
        ({"questions": "one?"}, 422, "invalid_request", "questions"),
        ({"questions": ["ok?", "  "]}, 422, "invalid_request", "questions.1: must hold at least one visible"),
        ({"questions": ["ok?", "x" * 201]}, 422, "question_chars_too_large", "questions[1]"),
        ({"questions": ["q?"] * 7}, 422, "batch_too_large", "POLICY_MAX_ROLLOUTS"),  # the schema's maxItems
        ({"questions": ["q?"], "recipe": "magic"}, 422, "unknown_recipe", "naive-rag"),
        ({"questions": ["q?"], "collection": "nope"}, 404, "collection_not_found", "'nope'"),
        ({"questions": ["q?"], "max_steps": 50}, 422, "max_steps_too_large", "POLICY_MAX_STEPS"),
        ({"questions": ["q?"], "max_steps": 0}, 422, "invalid_request", "max_steps"),
        ({"questions": ["q?"], "temperature": 1.0}, 422, "invalid_request", "temperature"),
    ],
)
def test_batch_rejects_bad_input(
    served: tuple[str, Any], body: dict[str, Any], status: int, error: str, names: str
) -> None:
    response = httpx.post(f"{served[0]}/v1/answer/batch", json=body)
    assert response.status_code == status, response.text
    reply = response.json()
    assert reply["error"] == error and names in reply["message"], reply


def test_batch_needs_the_api_key(
    retriever_url: str, tiny_model: str, collection: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOPRL_API_KEY", API_KEY)
    with LocalServer(create_app(tiny_settings(retriever_url, tiny_model, collection))) as server:
        body = {"questions": ["Who?"], "max_steps": 1}
        missing = httpx.post(f"{server.url}/v1/answer/batch", json=body)
        wrong = httpx.post(f"{server.url}/v1/answer/batch", json=body, headers={"Authorization": "Bearer no"})
        with PolicyClient(server.url) as client:  # sends $HOPRL_API_KEY
            ok = client.answer_batch(["Who?"], max_steps=1)
    assert missing.status_code == 401 and wrong.status_code == 403
    assert len(ok.answers) == 1
