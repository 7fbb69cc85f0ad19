"""DAPO's dynamic sampling in the rollout: flat groups are refilled, or kept when every draw is flat."""

from __future__ import annotations

import asyncio
from typing import Any

from transformers import AutoModelForCausalLM, AutoTokenizer

from hoprl.recipes.baselines import SearchR1
from hoprl.schemas import Question
from services.trainer.rollout import AgentRollout, RolloutOptions, TrainingEngine, spread


class VariesOn(SearchR1):
    """Reward = generated length on the questions in ``varied``, 0 on all others (flat groups)."""

    def __init__(self, varied: set[str]) -> None:
        super().__init__()
        self.varied = varied

    def reward_funcs(self) -> list[Any]:
        def reward(prompts: Any, completions: Any, **kw: Any) -> list[float | None]:
            return [
                float(len("".join(s.text for s in e.steps))) if e.question_id in self.varied else 0.0
                for e in kw["episodes"]
            ]

        return [reward]


def collect(recipe: Any, batch: list[Question], pool: list[Question], tiny_model: str,
            retriever_url: str, collection: str) -> tuple[AgentRollout, Any]:  # fmt: skip
    opts = RolloutOptions(
        collection=collection, retriever_url=retriever_url, num_generations=3, dynamic_sampling=True,
        max_resample=3, episode={"max_steps": 1, "max_new_tokens_per_step": 8, "token_budget": 64},
    )  # fmt: skip
    rollout = AgentRollout(recipe, pool, opts)
    engine = TrainingEngine(
        AutoModelForCausalLM.from_pretrained(tiny_model), AutoTokenizer.from_pretrained(tiny_model)
    )
    return rollout, asyncio.run(rollout.collect(batch, engine, None, [1.0]))


def test_flat_group_is_refilled(tiny_model: str, retriever_url: str, collection: str,
                                synthetic: dict[str, list[Question]]) -> None:  # fmt: skip
    flat, varied = synthetic["train"][0], synthetic["train"][1]
    rollout, (episodes, questions, _, totals) = collect(
        VariesOn({varied.id}), [flat], [flat, varied], tiny_model, retriever_url, collection
    )
    assert [q.id for q in questions] == [varied.id] * 3
    assert {e.question_id for e in episodes} == {varied.id}
    assert spread(totals) > 0
    assert rollout.counts == {"resampled": 1, "kept_flat": 0}


def test_group_stays_when_every_draw_is_flat(tiny_model: str, retriever_url: str, collection: str,
                                             synthetic: dict[str, list[Question]]) -> None:  # fmt: skip
    pool = synthetic["train"][:3]
    rollout, (_, questions, _, totals) = collect(
        VariesOn(set()), [pool[0]], pool, tiny_model, retriever_url, collection
    )
    assert {q.id for q in questions} == {pool[0].id} and totals == [0.0, 0.0, 0.0]
    assert rollout.counts == {"resampled": 0, "kept_flat": 1}
