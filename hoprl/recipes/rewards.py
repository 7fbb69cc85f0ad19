"""Reward plumbing shared by the recipes: one adapter from step signals to rewards.

Recipes with step-level rewards write their signals into each :class:`~hoprl.domain.Step`
(``step.signals``, a dict ``name -> value``). This module turns them into the two numbers the
objectives need, with one formula:

    R_t = sum_k w_k(t) * r_k(t)        (step reward: PPO runs GAE over these)
    R   = sum_t R_t                    (sequence reward: GRPO, DAPO and DPO use this)

``weights`` is a function ``t -> {signal: weight}`` so a recipe can schedule weights inside the
episode (EVO-RAG) or keep them constant (R2AG). Every weighted signal must be present on every
step: a missing one means the episode was never scored, and silently reading it as 0 would train
on a wrong reward.

Example::

    weights = lambda t: {"hit": 1.0, "step": 0.1}
    step_rewards(episode, weights)     # [R_1, R_2, ...]
    sequence_reward(episode, weights)  # sum of the above
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from hoprl.domain import Episode, RetrievedDoc
from hoprl.recipes.base import RewardFunc

#: ``t -> {signal name: weight}`` for the 1-based step index ``t``
WeightFn = Callable[[int], Mapping[str, float]]


def step_rewards(episode: Episode, weights: WeightFn) -> list[float]:
    """Per-step rewards ``R_t = sum_k w_k(t) r_k(t)``, one per step, in step order.

    Signals without a weight are ignored (they are logged, not optimised); a weighted signal
    missing from a step raises, naming the step.
    """
    rewards = []
    for step in episode.steps:
        total = 0.0
        for name, weight in weights(step.t).items():
            if name not in step.signals:
                raise KeyError(
                    f"step t={step.t} of episode {episode.question_id!r} has no signal {name!r} "
                    f"(has: {sorted(step.signals)}); score the episode with its recipe first"
                )
            total += weight * step.signals[name]
        rewards.append(total)
    return rewards


def sequence_reward(episode: Episode, weights: WeightFn) -> float:
    """The sequence reward ``R = sum_t R_t`` (0.0 for an episode with no steps)."""
    return float(sum(step_rewards(episode, weights)))


def signal_total(episode: Episode, name: str) -> float:
    """Sum over steps of one unweighted signal, for logging; raises if a step lacks it."""
    missing = [s.t for s in episode.steps if name not in s.signals]
    if missing:
        raise KeyError(f"signal {name!r} missing on steps {missing}; score the episode first")
    return float(sum(s.signals[name] for s in episode.steps))


def episode_reward(fn: Callable[[Episode], float | None]) -> RewardFunc:
    """Lift a function of one episode to TRL's ``(prompts, completions, **kwargs)`` signature.

    The returned reward reads ``kwargs["episodes"]`` (one :class:`Episode` per completion).
    """

    def reward(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        episodes = kwargs.get("episodes")
        if episodes is None:
            raise KeyError("this reward needs kwargs['episodes'] (one Episode per completion)")
        if len(episodes) != len(completions):
            raise ValueError(f"{len(episodes)} episodes for {len(completions)} completions")
        return [fn(ep) for ep in episodes]

    return reward


def normalize_title(title: str) -> str:
    """Titles match case- and whitespace-insensitively ("Acme  Corp" == "acme corp")."""
    return " ".join(title.casefold().split())


def gold_titles_in(docs: Iterable[RetrievedDoc], gold_titles: Iterable[str]) -> set[str]:
    """The normalised gold titles among ``docs``."""
    gold = {normalize_title(t) for t in gold_titles}
    return {normalize_title(d.title) for d in docs} & gold


def query_cosines(queries: Sequence[str]) -> np.ndarray:
    """Cosine similarity matrix (n x n) between ``queries`` with the shared embedder.

    Each distinct query is embedded once per call (episodes repeat queries; that is exactly
    what the redundancy rewards look for), then the matrix is gathered back to input order.
    The product of the unit vectors is what :meth:`Embedder.similarity` computes, without
    encoding the list twice.
    """
    if not queries:
        return np.zeros((0, 0), dtype=np.float32)
    from hoprl.embedding import get_embedder  # torch and transformers: only where a reward embeds

    distinct = list(dict.fromkeys(queries))
    vectors = get_embedder().encode(distinct)
    sims = vectors @ vectors.T
    index = [distinct.index(q) for q in queries]
    return sims[np.ix_(index, index)]
