"""End-to-end episodes: every recipe, a live retriever and a scripted model, both over real HTTP."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
from typing import Any

import numpy as np
import pytest

from hoprl.agent.runner import run_episode, run_episodes
from hoprl.clients.llm import LLMClient
from hoprl.clients.retriever import AsyncRetrieverClient, RetrieverClient
from hoprl.data.synthetic import SyntheticQuestion, generate, hops_for
from hoprl.domain import Episode
from hoprl.embedding import get_embedder
from hoprl.recipes import get_recipe
from hoprl.schemas import Document
from services.local import LocalServer
from tests import scripted_llm as scripted
from tests.conftest import shape

COLLECTION = "runner-e2e"
JUNK = "\n<information>a model that keeps talking past its stop</information>"


@pytest.fixture(scope="module")
def questions(retriever_url: str) -> list[SyntheticQuestion]:
    """Three answerable questions (comparison, 2-hop, 4-hop) with all their paragraphs indexed."""
    pool = generate(seed=3, n_entities=80, n_train=12, n_dev=0, n_test=0)["train"]
    chosen = [pool[0], pool[5], pool[6]]
    docs = {
        hashlib.sha1(f"{p.title}\n{p.text}".encode()).hexdigest()[:16]: p for q in pool for p in q.paragraphs
    }
    with RetrieverClient(retriever_url) as client:
        client.ingest(COLLECTION, [Document(id=i, title=p.title, text=p.text) for i, p in docs.items()])
    return chosen


def run(coro_factory: Any, llm_url: str, retriever_url: str) -> Any:
    async def go() -> Any:
        llm = LLMClient(llm_url, model="scripted", timeout=30, retries=0)
        retriever = AsyncRetrieverClient(retriever_url)
        try:
            return await coro_factory(llm, retriever)
        finally:
            await llm.aclose()
            await retriever.aclose()

    return asyncio.run(go())


def columns(episodes: list[Episode], questions: list[SyntheticQuestion]) -> dict[str, Any]:
    by_id = {q.id: q for q in questions}
    return {
        "answers": [e.answers for e in episodes],
        "paragraphs": [by_id[e.question_id].paragraphs for e in episodes],
        "episodes": episodes,
    }


def expected_reward(name: str, ep: Episode) -> float:
    """The expert's reward by hand: every answer is right, every format is clean."""
    if name == "arena":
        return 1 + 1 + 1 + 10
    if name != "when-to-search":
        return 1.0  # EM (naive-rag, search-r1) or R_ans (eval-rar)
    queries = ep.queries  # stage 1, correct: r_a = 1; r_f = 1; r_s below
    vectors = get_embedder().encode(queries)
    pairs = list(itertools.combinations(range(len(queries)), 2))
    # Eq. 8 as printed: avg_sim = sum over i < j of cos(q_i, q_j), divided by N(N-1); r_s = -avg_sim
    n = len(queries)
    r_s = -sum(float(np.dot(vectors[i], vectors[j])) for i, j in pairs) / (n * (n - 1))
    return 1 + 1 + r_s


NAMES = ["naive-rag", "search-r1", "eval-rar", "arena", "when-to-search"]


@pytest.mark.parametrize("name", NAMES)
def test_expert_episode_for_every_recipe(
    name: str, questions: list[SyntheticQuestion], retriever_url: str
) -> None:
    recipe = get_recipe(name)
    segments = {q.question: recipe.expert_segments(q) for q in questions}
    app = scripted.create_app({k: [s + JUNK for s in v] for k, v in segments.items()})
    with LocalServer(app) as server:
        episodes: list[Episode] = run(
            lambda llm, ret: run_episodes(
                recipe,
                questions,
                llm,
                ret,
                COLLECTION,
                n_samples=2,
                concurrency=4,
                shape=shape(max_steps=8, temperature=0.7),
                seed=11,
            ),
            server.url + "/v1",
            retriever_url,
        )
    assert [(e.question_id, e.sample) for e in episodes] == [(q.id, s) for q in questions for s in (0, 1)]
    for ep in episodes:
        q = next(q for q in questions if q.id == ep.question_id)
        assert (ep.outcome, ep.final_answer, ep.recipe) == ("answer", q.answers[0], name)
        assert [s.text for s in ep.steps] == segments[q.question]  # stop text kept, the rest cut
        if name == "naive-rag":
            assert ep.prompt[1]["content"].startswith("Documents:\n[1] ")
        else:
            assert ep.prompt == recipe.messages(q)
        assert ep.timings["generation"] > 0 and ep.timings["total"] >= ep.timings["generation"]
        searched = [s for s in ep.steps if s.action == "search"]
        for step in searched:
            assert [len(d) for d in step.docs] == [recipe.top_k] * len(step.queries)
            assert step.information == recipe.information(step.docs)
        if name in ("search-r1", "eval-rar", "when-to-search"):
            assert [s.queries for s in searched] == [[h.query] for h in hops_for(q)]
            assert set(ep.gold_titles) <= set(ep.retrieved_titles)  # one good query per hop finds it
            assert ep.timings["retrieval"] > 0
    # the model saw the injected information as user turns, in order
    last = max((r for r in app.state.requests), key=lambda r: len(r["messages"]))
    roles = [m["role"] for m in last["messages"]]
    assert roles[:2] == ["system", "user"] and roles[2:] == ["assistant", "user"] * ((len(roles) - 2) // 2)
    rewards = [
        fn([""] * len(episodes), [""] * len(episodes), **columns(episodes, questions))
        for fn in recipe.reward_funcs()
    ]
    totals = [sum(r or 0.0 for r in row) for row in zip(*rewards, strict=True)]
    assert totals == pytest.approx([expected_reward(name, e) for e in episodes], abs=1e-5)


def expert_episode(recipe: Any, q: SyntheticQuestion, retriever_url: str) -> Episode:
    """``recipe``'s episode on ``q`` against a scripted model writing the recipe's expert segments."""
    app = scripted.create_app({q.question: recipe.expert_segments(q)})
    with LocalServer(app) as server:
        return run(
            lambda llm, ret: run_episode(recipe, q, llm, ret, COLLECTION, shape=shape()),
            server.url + "/v1",
            retriever_url,
        )


def test_naive_rag_retrieves_first(questions: list[SyntheticQuestion], retriever_url: str) -> None:
    recipe = get_recipe("naive-rag")
    q = questions[1]
    ep = expert_episode(recipe, q, retriever_url)
    (step,) = ep.steps
    assert step.queries == [q.question] and len(step.docs[0]) == recipe.top_k
    assert step.information == ""  # the documents are in the prompt
    assert f"[1] {step.docs[0][0].title}: {step.docs[0][0].text}" in ep.prompt[1]["content"]
    assert ep.retrieval_count == 1 and ep.timings["retrieval"] > 0


def test_arena_needs_no_retrieval(questions: list[SyntheticQuestion], retriever_url: str) -> None:
    ep = expert_episode(get_recipe("arena"), questions[0], retriever_url)
    assert ep.outcome == "answer" and ep.retrieval_count == 0 and ep.timings["retrieval"] == 0.0
