"""The ``evo-rag`` recipe as a whole: its surface, its rewards' weights, and a training episode of
T_max steps through the real runner. The modules' own tests are in ``tests/hoprl/recipes/evo_rag/``."""

from __future__ import annotations

import pytest

from hoprl.data.synthetic import generate
from hoprl.domain import RetrievedDoc
from hoprl.jobspec import resolve
from hoprl.recipes.evo_rag import EvoRag, EvoRagConfig, step_weights


@pytest.fixture(scope="module")
def questions():
    return generate(seed=1, n_entities=80, n_train=20, n_dev=5, n_test=5)["train"]


def test_protocol_surface(questions):
    recipe = EvoRag(t_max=12, top_k=5)
    assert (recipe.name, recipe.top_k, recipe.max_steps) == ("evo-rag", 5, 12)
    system, user = recipe.messages(questions[0])
    assert "<backtrack/>" in system["content"] and "12 steps" in system["content"]
    assert questions[0].question in user["content"]
    info = recipe.information([[RetrievedDoc(id="a", title="Acme Records", text="Founded by Jane Roe.")]])
    assert "<information>" in info and "Acme Records" in info and "Jane Roe" in info
    with pytest.raises(ValueError):
        EvoRag(w_rett=(1.0, 1.0, 1.0))  # misspelt constant


def test_only_the_total_is_optimised():
    """The per-signal rewards are for logging: a trainer weights them 0 (TRL would sum them all)."""
    from hoprl.recipes import get_recipe, reward_weights

    for name in ("evo-rag", "r2ag"):
        recipe = get_recipe(name)
        weights = reward_weights(recipe)
        assert len(weights) == len(recipe.reward_funcs())
        assert weights[0] == 1.0 and set(weights[1:]) == {0.0}
    assert reward_weights(get_recipe("arena")) == [1.0] * 4  # format + accuracy + relevance + bonus


def test_a_training_episode_runs_to_t_max_and_reaches_the_late_signals(retriever_url):
    """The job's episode options (resolved defaults) through the real runner, a scripted model over
    HTTP and the live retriever: 20 searches, so p(t) reaches 1 and the late, overlapping searches
    (p >= 0.3 from step 7) pay r_act = -1. With the old cap of 4 steps neither could happen."""
    import asyncio

    from hoprl.agent.runner import run_episode
    from hoprl.clients.llm import LLMClient
    from hoprl.clients.retriever import AsyncRetrieverClient, RetrieverClient
    from hoprl.schemas import Document
    from hoprl.schemas.trainer import JobRequest
    from services.local import LocalServer
    from services.trainer.jobs import rollout_options
    from services.trainer.settings import TrainerSettings
    from tests import scripted_llm as scripted

    with RetrieverClient(retriever_url) as client:
        client.ingest("evo-rag-tmax", [
            Document(id="acme", title="Acme Records", text="Acme Records was founded by Jane Roe."),
            Document(id="jane", title="Jane Roe", text="Jane Roe was born in Paris."),
        ])  # fmt: skip
    request = JobRequest(recipe="evo-rag", collection="evo-rag-tmax")
    hp = resolve(request.hyperparameters, "evo-rag")
    settings = TrainerSettings(retriever_url=retriever_url)
    shape = rollout_options(request, hp, "evo-rag-tmax", settings).shape
    assert shape.max_steps == 20
    queries = ["Acme Records founder", "Jane Roe birthplace"] + ["Acme Records founder"] * 18
    script = [f"<think>t</think><search>{q}</search>" for q in queries] + ["<answer>Paris</answer>"]
    recipe = EvoRag()
    question = generate(seed=1)["dev"][0].model_copy(update={"question": "Where was Acme's founder born?"})
    app = scripted.create_app({question.question: script})

    async def go(llm_url: str):
        llm = LLMClient(llm_url, model="scripted", timeout=30, retries=0)
        retriever = AsyncRetrieverClient(retriever_url)
        try:
            return await run_episode(recipe, question, llm, retriever, "evo-rag-tmax", shape=shape)
        finally:
            await llm.aclose()
            await retriever.aclose()

    with LocalServer(app) as server:
        episode = asyncio.run(go(server.url + "/v1"))
    assert episode.outcome == "step_cap" and len(episode.steps) == 20
    scored = recipe.score(episode)
    r_act = [s.signals["r_act"] for s in scored.steps]
    assert r_act[:6] == [0.0] * 6 and r_act[6:] == [-1.0] * 14  # p(7) = 6/19 >= 0.3
    w20 = step_weights(20, "discovery", EvoRagConfig())
    assert w20["r_act"] == 0.8 and w20["r_dup"] == 0.5  # p(20) = 1: Table 2's Mid weights reached
