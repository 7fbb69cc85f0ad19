"""EVO-RAG: seven step-level rewards, an in-episode weight scheduler and a two-stage curriculum.

"EVO-RAG: Evolving Retrieval-Augmented Agents for Efficient Multi-Hop Query Optimization", an
anonymous double-blind submission (no arXiv id). The policy acts
one step at a time::

    <think>...</think><search>query</search>      SEARCH(query): retrieve top-k documents
    <think>...</think><backtrack/>                BACKTRACK: drop the last search and its evidence
    <think>...</think><answer>text</answer>       ANSWER(text): end the episode
    <think>...</think><refuse/>                   REFUSE: declare the question unanswerable

Each step t in 1..T_max gets seven signals (``Step.signals``), written by :func:`score_episode`:

====== ====================================================================================
r_ret  +1 if a SEARCH retrieves a gold document (title match), -1 if not; 0 on other steps
r_dup  -(max cosine of this query to every earlier query of the episode); 0 for the first
r_bt   -1 on a BACKTRACK
r_ref  on REFUSE: +1 if the judge finds the **retrieved** evidence insufficient to answer the
       question, -1 if it suffices (the paper: the judge decides whether the evidence the agent
       retrieved answers the question). The evidence is every document retrieved so far, as
       the policy read it (title and text); the gold answers go to the judge as references.
       Rules judge: answerable iff a gold answer or alias occurs in that text; LLM judge: the
       judge service's ``answerable@1`` prompt. Option ``ref_evidence="gold_and_retrieved"``
       (the project's earlier reading) adds the question's gold paragraphs
       (``meta["gold_evidence"]``, recorded by the runner), so a refusal before any search of an
       answerable question is -1 instead of +1.
r_step -1 on every step
r_ans  (EM + F1) / 2 of the answer, on the ANSWER step
r_act  -1 on a SEARCH when r_dup < 0 and p(t) >= 0.3 (a late, overlapping search)
====== ====================================================================================

and the step reward is ``R_t = sum_k w_k(t) r_k(t)`` with ``p(t) = (t-1)/(T_max-1)`` and
``w_k(t) = (1-p) w_early_k + p w_late_k``. Stage Discovery interpolates Table 2's Start -> Mid
weights, stage Refinement Mid -> End; :class:`Curriculum` switches stage when the EMA of dev
returns fails to improve on the best EMA so far by ``eps`` for ``patience`` checks in a row.
The sequence reward is ``R = sum_t R_t`` (:func:`hoprl.recipes.rewards.sequence_reward`); PPO's
GAE and GRPO's per-step group normalisation take the ``R_t`` themselves
(:meth:`EvoRag.step_rewards`).

Episodes run up to ``T_max = 20`` steps (the trainer's ``max_steps`` default for this recipe is
derived from ``t_max``: :func:`trainer_defaults`), so ``p(t)`` reaches 1, ``r_act`` can fire from
``p(t) >= 0.3`` (step 7 of 20) and the late weights are reached. ``docs/recipes/evo-rag.md`` maps
every mechanism of the paper to its code and test.

The recipe in four parts, one module each:

- :mod:`~hoprl.recipes.evo_rag.config`: Table 2's weights, the stage switch's constants, the
  trainer's episode limits (:func:`trainer_defaults`);
- :mod:`~hoprl.recipes.evo_rag.reward`: the seven signals (:func:`score_episode`), the weight
  scheduler, ``R_t`` and ``R``, the reward functions;
- :mod:`~hoprl.recipes.evo_rag.curriculum`: the Discovery -> Refinement switch;
- :mod:`~hoprl.recipes.evo_rag.protocol`: the prompt, the action parser, the ``<information>``
  block and the scripted expert.
"""

from __future__ import annotations

from typing import Any, ClassVar

from hoprl.domain import Action, Episode, Question, RetrievedDoc
from hoprl.judging import Judge, RulesJudge
from hoprl.recipes.base import RewardFunc
from hoprl.recipes.evo_rag.config import (
    INFO_TOKENS_PER_DOC,
    SCORE_VERSION,
    SIGNALS,
    EvoRagConfig,
    RefEvidence,
    Stage,
    SwitchRule,
    trainer_defaults,
)
from hoprl.recipes.evo_rag.curriculum import Curriculum
from hoprl.recipes.evo_rag.protocol import SYSTEM_PROMPT, expert_segments, parse_action, render_information
from hoprl.recipes.evo_rag.reward import (
    episode_return,
    episode_step_rewards,
    evidence_text,
    make_reward_funcs,
    progress,
    score_episode,
    step_weights,
)

__all__ = [
    "INFO_TOKENS_PER_DOC", "SCORE_VERSION", "SIGNALS", "SYSTEM_PROMPT", "Curriculum", "EvoRag",
    "EvoRagConfig", "RefEvidence", "Stage", "SwitchRule", "episode_return", "episode_step_rewards",
    "evidence_text", "expert_segments", "make_reward_funcs", "parse_action", "progress",
    "render_information", "score_episode", "step_weights", "trainer_defaults",
]  # fmt: skip


class EvoRag:
    """The ``evo-rag`` recipe: protocol, rewards (bound to a judge and a curriculum), expert.

    ``config`` keywords are :class:`EvoRagConfig` fields. The runner caps episodes at
    ``max_steps`` (= ``t_max``): the scheduler is undefined past T_max.
    """

    name: ClassVar[str] = "evo-rag"
    stop: ClassVar[list[str]] = ["</search>", "<backtrack/>", "</answer>", "<refuse/>"]

    def __init__(
        self, judge: Judge | None = None, curriculum: Curriculum | None = None, **config: Any
    ) -> None:
        self.config = EvoRagConfig(**config)
        self.top_k = self.config.top_k
        self.max_steps = self.config.t_max
        self.judge: Judge = judge or RulesJudge()
        self.curriculum = curriculum or Curriculum.from_config(self.config)

    def messages(self, question: Question) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": SYSTEM_PROMPT.format(t_max=self.config.t_max)},
            {"role": "user", "content": f"Question: {question.question}"},
        ]

    def parse(self, segment: str) -> Action:
        return parse_action(segment)

    def information(self, docs: list[list[RetrievedDoc]]) -> str:
        return render_information(docs)

    def reward_weights(self) -> list[float]:
        """Only the total is optimised; the per-signal rewards after it are logged (weight 0)."""
        return [1.0] + [0.0] * len(SIGNALS)

    def reward_funcs(self) -> list[RewardFunc]:
        return make_reward_funcs(self.config, self.judge, self.curriculum)

    def step_rewards(self, episode: Episode) -> list[float]:
        """``R_t`` per step of an episode scored by :meth:`reward_funcs` (GRPO's per-step advantages)."""
        return episode_step_rewards(episode, self.config)

    def score(self, episode: Episode) -> Episode:
        """:func:`score_episode` with this recipe's judge, config and current stage."""
        return score_episode(episode, self.judge, self.curriculum.stage, self.config)

    def expert_segments(self, question: Question, noise: float = 0.0, seed: int = 0) -> list[str]:
        """:func:`~hoprl.recipes.evo_rag.protocol.expert_segments`: one SEARCH per gold hop (a
        distractor search and a BACKTRACK first with probability ``noise``), then ANSWER or REFUSE."""
        return expert_segments(question, noise, seed)

    def expert(self, question: Question, noise: float = 0.0, seed: int = 0) -> str:
        return "".join(self.expert_segments(question, noise, seed))
