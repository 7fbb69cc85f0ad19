"""DAPO's dynamic sampling in the rollout: flat groups are refilled, or kept when every draw is flat;
the refills a step draws depend on the seed, the step and the batch alone."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from hoprl.domain import Episode, Question
from hoprl.recipes.baselines import SearchR1
from hoprl.training.rollout import AgentRollout, RolloutOptions, TrainingEngine, spread
from tests.conftest import shape


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
            retriever_url: str, collection: str,
            signal: str = "rewards") -> tuple[AgentRollout, Any]:  # fmt: skip
    opts = RolloutOptions(
        collection=collection, retriever_url=retriever_url, num_generations=3, dynamic_sampling=True,
        dynamic_sampling_signal=signal,  # type: ignore[arg-type]
        max_resample=3, shape=shape(max_steps=1, max_new_tokens_per_step=8, token_budget=64),
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
    trail = {"for": flat.id, "candidates": [varied.id], "tried": 1, "outcome": "resampled"}
    assert all(e.meta["dynamic_sampling"] == trail for e in episodes)


def test_group_stays_when_every_draw_is_flat(tiny_model: str, retriever_url: str, collection: str,
                                             synthetic: dict[str, list[Question]]) -> None:  # fmt: skip
    pool = synthetic["train"][:3]
    rollout, (episodes, questions, _, totals) = collect(
        VariesOn(set()), [pool[0]], pool, tiny_model, retriever_url, collection
    )
    assert {q.id for q in questions} == {pool[0].id} and totals == [0.0, 0.0, 0.0]
    assert rollout.counts == {"resampled": 0, "kept_flat": 1}
    # both other questions were tried, in the order of the plan for this (seed, step, batch)
    (plan,) = rollout.refills([pool[0]], None)
    assert sorted(q.id for q in plan) == sorted([pool[1].id, pool[2].id])
    trail = {"for": pool[0].id, "candidates": [q.id for q in plan], "tried": 2, "outcome": "kept_flat"}
    assert all(e.meta["dynamic_sampling"] == trail for e in episodes)


def test_answers_signal_refills_a_group_whose_rewards_spread_but_answers_agree(
    tiny_model: str, retriever_url: str, collection: str, synthetic: dict[str, list[Question]]
) -> None:
    """DAPO's rule (Eq. 11): a group is kept for its answers, not for another term's spread. The
    untrained tiny model answers nothing right, so every group's answers agree (all wrong) although
    its rewards (generated length) spread: refilled until the plan runs out, then kept."""
    pool = [q for q in synthetic["train"] if q.answerable][:3]
    varied = VariesOn({q.id for q in pool})
    by_rewards, (_, _, _, totals) = collect(varied, [pool[0]], pool, tiny_model, retriever_url, collection)
    assert spread(totals) > 0 and by_rewards.counts == {"resampled": 0, "kept_flat": 0}
    by_answers, (episodes, questions, _, totals) = collect(
        varied, [pool[0]], pool, tiny_model, retriever_url, collection, signal="answers"
    )
    assert not any(e.final_answer and e.final_answer in e.answers for e in episodes)
    assert by_answers.counts == {"resampled": 0, "kept_flat": 1}
    assert {q.id for q in questions} == {pool[0].id}
    assert all(e.meta["dynamic_sampling"]["tried"] == 2 for e in episodes)


OPTS = RolloutOptions(collection="c", retriever_url="http://127.0.0.1:9", num_generations=2, shape=shape(),
                      dynamic_sampling=True, dynamic_sampling_signal="rewards", max_resample=3,
                      seed=7)  # fmt: skip


def ids(plan: list[list[Question]]) -> list[list[str]]:
    return [[q.id for q in group] for group in plan]


def test_refills_depend_only_on_seed_step_and_batch(synthetic: dict[str, list[Question]]) -> None:
    """A resumed job builds a new rollout: its draws at step 3 must be the killed job's at step 3
    (the old ``Random(seed)`` in the rollout started over, and drew as groups finished)."""
    pool = synthetic["train"]  # 8 questions
    batch = pool[:2]
    first, resumed = AgentRollout(SearchR1(), pool, OPTS), AgentRollout(SearchR1(), pool, OPTS)
    first.refills(batch, 1), first.refills(batch, 2)  # the killed job had drawn steps 1 and 2
    plan = ids(first.refills(batch, 3))
    assert ids(resumed.refills(batch, 3)) == plan == ids(first.refills(batch, 3))
    # the 6 questions outside the batch, 3 per group, none twice
    drawn = [q for group in plan for q in group]
    assert [len(group) for group in plan] == [3, 3]
    assert sorted(drawn) == sorted(q.id for q in pool[2:])
    # another step, seed or batch draws otherwise
    assert ids(first.refills(batch, 4)) != plan
    assert ids(AgentRollout(SearchR1(), pool, replace(OPTS, seed=8)).refills(batch, 3)) != plan
    assert ids(first.refills([pool[0], pool[2]], 3)) != plan


@pytest.mark.parametrize(
    ("pool_size", "groups", "max_resample", "sizes"),
    [
        (8, 2, 3, [3, 3]),
        (8, 2, 1, [1, 1]),
        (5, 2, 3, [2, 1]),  # 3 others dealt round-robin
        (3, 3, 3, [0, 0, 0]),  # every question is in the batch
        (8, 1, 0, [0]),  # max_resample=0: dynamic sampling that never refills
    ],
)
def test_refills_are_dealt_round_robin(synthetic: dict[str, list[Question]], pool_size: int, groups: int,
                                       max_resample: int, sizes: list[int]) -> None:  # fmt: skip
    pool = synthetic["train"][:pool_size]
    rollout = AgentRollout(SearchR1(), pool, replace(OPTS, max_resample=max_resample))
    plan = rollout.refills(pool[:groups], 1)
    assert [len(group) for group in plan] == sizes
    drawn = [q.id for group in plan for q in group]
    assert len(set(drawn)) == len(drawn) and not set(drawn) & {q.id for q in pool[:groups]}


def test_no_refills_without_dynamic_sampling(synthetic: dict[str, list[Question]]) -> None:
    rollout = AgentRollout(SearchR1(), synthetic["train"], replace(OPTS, dynamic_sampling=False))
    assert rollout.refills(synthetic["train"][:2], 1) == [[], []]


def test_by_answers_an_unanswerable_question_is_never_a_refill(synthetic: dict[str, list[Question]]) -> None:
    """No sample can be right on a question without gold answers, so its group is flat by answers
    whatever the policy does: drawing it would only waste a group of episodes."""
    pool = [q for q in synthetic["train"] if q.answerable][:6]
    pool[3:] = [q.model_copy(update={"answers": []}) for q in pool[3:]]
    by_answers = AgentRollout(SearchR1(), pool, replace(OPTS, dynamic_sampling_signal="answers"))
    (plan,) = by_answers.refills(pool[:1], 1)
    assert sorted(q.id for q in plan) == sorted(q.id for q in pool[1:3])
    by_rewards = AgentRollout(SearchR1(), pool, OPTS)
    assert len(by_rewards.refills(pool[:1], 1)[0]) == 3


@pytest.mark.parametrize("outcome", ["kept_flat", "resampled", "spread", None])
def test_only_a_group_kept_flat_loses_its_loss_mask(outcome: str | None) -> None:
    """``flat_groups="drop"`` (the default) zeroes the policy-token mask of a group kept flat after
    every refill, and of no other; ``"train"`` leaves every mask as it is."""
    meta = {} if outcome is None else {"dynamic_sampling": {"outcome": outcome, "tried": 3}}
    episode = Episode(recipe="search-r1", question_id="q", question="?", meta=meta)
    mask = [0, 1, 1, 0, 1]
    dropped = AgentRollout(SearchR1(), [], OPTS).loss_mask(mask, episode)
    assert dropped == ([0, 0, 0, 0, 0] if outcome == "kept_flat" else mask)
    assert AgentRollout(SearchR1(), [], replace(OPTS, flat_groups="train")).loss_mask(mask, episode) == mask
