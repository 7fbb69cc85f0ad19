"""R2AG: a retrieval tree of base and predicted sub-queries, scored by the Top-Survivor reward.

The recipe in four parts, one module each:

- :mod:`~hoprl.recipes.r2ag.config`: the weights, cut-offs and named readings (paper defaults);
- :mod:`~hoprl.recipes.r2ag.protocol`: the prompt, the expansion parser (``<think>``,
  ``<base-Q>``, ``<predicted-Q>``; the stop is ``<base-Q>stop retrieval</base-Q>``), the
  injected top-1 documents and the scripted expert;
- :mod:`~hoprl.recipes.r2ag.reward`: the Top-Survivor reward (Eq. 5, App. B.2);
- :mod:`~hoprl.recipes.r2ag.forest`: the retrieval forest of progressive iterative training
  (Algorithm 1: every unfinished response's pruned tree joins the next level), which
  :mod:`hoprl.training.r2ag_rounds` drives.

``docs/recipes/r2ag.md`` maps each mechanism of the paper to its code and the test that pins it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from hoprl.domain import Action, Episode, Question, RetrievedDoc
from hoprl.recipes.base import RewardFunc
from hoprl.recipes.r2ag.config import KIND_OF_TAG, L_MAX, SCORE_VERSION, SIGNALS, TAGS, R2agConfig
from hoprl.recipes.r2ag.forest import (
    Forest,
    Node,
    RetrievalTree,
    context,
    documents,
    expand,
    finished,
    grow_forest,
    prune,
    survivors,
    tree_from_dict,
    tree_to_dict,
)
from hoprl.recipes.r2ag.protocol import (
    END,
    NO_PREDICTION,
    STOP_QUERY,
    SYSTEM_PROMPT,
    expert_segments,
    parse_expansion,
    render_information,
    stop_segment,
)
from hoprl.recipes.r2ag.reward import (
    average_precision,
    episode_return,
    episode_step_rewards,
    make_reward_funcs,
    score_episode,
)
from hoprl.recipes.rewards import normalize_title

__all__ = [
    "END", "KIND_OF_TAG", "L_MAX", "NO_PREDICTION", "SCORE_VERSION", "SIGNALS", "STOP_QUERY",
    "SYSTEM_PROMPT", "TAGS", "Forest", "Node", "R2ag", "R2agConfig", "RetrievalTree",
    "average_precision", "context", "documents", "episode_return", "episode_step_rewards", "expand",
    "expert_segments", "finished", "grow_forest", "make_reward_funcs", "normalize_title", "parse_expansion",
    "prune", "render_information", "score_episode", "stop_segment", "survivors", "tree_from_dict",
    "tree_to_dict",
]  # fmt: skip


class R2ag:
    """The ``r2ag`` recipe: tree protocol, Top-Survivor rewards, expert."""

    name: ClassVar[str] = "r2ag"
    stop: ClassVar[list[str]] = [END]

    def __init__(self, **config: Any) -> None:
        self.config = R2agConfig(**config)
        self.top_k = self.config.top_k
        self.max_steps = self.config.l_max + 1  # L_MAX expansions, then the stop

    def messages(self, question: Question) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"Question: {question.question}"},
        ]

    def parse(self, segment: str) -> Action:
        """The expansion; with ``top_t`` only its first t sub-queries go to the retriever."""
        action = parse_expansion(segment)
        t = self.config.top_t
        if t is not None and len(action.queries) > t:
            action.queries, action.query_kinds = action.queries[:t], action.query_kinds[:t]
        return action

    def information(self, docs: list[list[RetrievedDoc]]) -> str:
        return render_information(docs)

    def reward_weights(self) -> list[float]:
        """Only the total is optimised; the per-signal rewards after it are logged (weight 0)."""
        return [1.0] + [0.0] * len(SIGNALS)

    def reward_funcs(self) -> list[RewardFunc]:
        return make_reward_funcs(self.config)

    def score(self, episode: Episode) -> Episode:
        return score_episode(episode, self.config)

    def expert_segments(self, question: Question, noise: float = 0.0, seed: int = 0) -> list[str]:
        """One expansion with one base-Q per gold hop (and ``<predicted-Q>none</predicted-Q>``),
        then ``<base-Q>stop retrieval</base-Q>``. ``noise`` and ``seed`` are accepted for interface
        parity; the R2AG expert is exact."""
        return expert_segments(question)

    def expert(self, question: Question, noise: float = 0.0, seed: int = 0) -> str:
        return "".join(self.expert_segments(question, noise, seed))
