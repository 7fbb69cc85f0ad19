"""EVO-RAG's config: the trainer's episode limits derive from T_max and hold T_max searches."""

from __future__ import annotations

import pytest

from hoprl.data.synthetic import generate
from hoprl.domain import Episode, RetrievedDoc, Step
from hoprl.jobspec import resolve
from hoprl.recipes.evo_rag import EvoRag, EvoRagConfig
from tests.conftest import shared_file


def test_the_trainer_caps_evo_rag_episodes_at_t_max():
    """A job's max_steps follows the recipe's T_max (one source), unless the request sets it."""
    from hoprl.schemas.trainer import Hyperparameters

    assert resolve(Hyperparameters(), "evo-rag").max_steps == EvoRagConfig().t_max == 20
    assert resolve(Hyperparameters(recipe_config={"t_max": 8}), "evo-rag").max_steps == 8
    assert resolve(Hyperparameters(max_steps=4), "evo-rag").max_steps == 4  # an explicit request wins
    assert resolve(Hyperparameters(), "search-r1").max_steps == 4
    # never an error at submission: a budget past the bound is capped; an invalid recipe_config
    # derives nothing (the job reports the recipe's own error when it starts)
    big = resolve(Hyperparameters(recipe_config={"t_max": 64}, max_new_tokens_per_step=4096), "evo-rag")
    assert (big.max_steps, big.token_budget) == (64, 32768)
    assert resolve(Hyperparameters(recipe_config={"t_max": "many"}), "evo-rag").max_steps == 4


def test_the_default_token_budget_holds_t_max_searches_over_hotpotqa(tokenizer):
    """20 SEARCH steps of 64 generated tokens, each followed by three real HotpotQA paragraphs, fit
    the default budget, T_max x (256 generated, Table 10 + 3 documents x 200) = 17,120 (counted as
    the runner counts it: the context's growth, here the token trajectory's completion). The old
    defaults (4 turns, 512 tokens) held less than two steps."""
    import json

    from hoprl.agent.tokens import to_token_trajectory
    from hoprl.schemas.trainer import Hyperparameters

    data = shared_file("hotpotqa_dev.jsonl")
    hp = resolve(Hyperparameters(), "evo-rag")
    assert hp.token_budget == 20 * (256 + 3 * 200)
    recipe = EvoRag()
    lines = data.read_text().splitlines()[: hp.max_steps]
    thought = tokenizer.decode(tokenizer("<think>" + "I need the next fact. " * 20)["input_ids"][:56])
    steps = []
    for t, line in enumerate(lines, 1):
        paragraphs = json.loads(line)["paragraphs"][:3]
        docs = [
            [RetrievedDoc(id=f"{t}-{i}", title=x["title"], text=x["text"]) for i, x in enumerate(paragraphs)]
        ]
        text = f"{thought}</think><search>hop {t}</search>"
        steps.append(Step(t=t, action="search", text=text, queries=[f"hop {t}"], docs=docs,
                          information=recipe.information(docs)))  # fmt: skip
    question = "Where was the founder of Acme Records born?"
    episode = Episode(recipe="evo-rag", question_id="q", question=question, answers=["Paris"], steps=steps)
    episode.prompt = recipe.messages(generate(seed=1)["dev"][0])
    completion = to_token_trajectory(episode, tokenizer).completion_ids
    assert len(completion) <= hp.token_budget, (len(completion), hp.token_budget)
    assert len(completion) > 2 * 512  # the old budget was not even close


@pytest.fixture(scope="module")
def tokenizer(tokenizer_path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_path)
