"""EVO-RAG's GRPO over sibling candidates (§3.4 "Path B", App. A.5, App. C Table 10).

The paper's GRPO replaces PPO's advantage with ``A_t^(i) = (r~_t^(i) - mu_t) / (sigma_t + eps)``
"over candidates" / "across sibling candidates" (§3.4, App. A.5): the candidates ``i`` are
*siblings*, actions sampled from the same state at step ``t``, and ``mu_t``, ``sigma_t`` are
taken over them. Table 10 rolls out **one episode per prompt** (``Rollout n (per prompt) = 1``),
so the group is the siblings, not independent episodes of the question.

**Sampling** (:class:`SiblingRun`). One episode per question runs the recipe's agent loop. At
every step ``t``, besides the action the episode continues with (candidate 0), ``K - 1`` more
candidates are sampled from the same conversation (``K = num_generations``; the paper gives no
number). Each is parsed and executed once, without changing the episode (a SEARCH retrieves its
documents; nothing else needs the environment) and recorded in ``meta["siblings"][t]``.

**Rewards** (:func:`sibling_groups`). Candidate ``i``'s step reward ``r~_t^(i)`` is the recipe's
``R_t = sum_k w_k(t) r_k(t)`` of the *branch* made of the episode's steps before ``t`` and the
candidate (:meth:`EvoRag.score`, then the last of :meth:`EvoRag.step_rewards`): the same seven
signals and the same ``p(t)`` weights as the episode's own step ``t``.

**Advantages** (:func:`sibling_advantages`). ``(r - mean) / (std + 1e-6)`` with the sample std
(:mod:`hoprl.training.policy_loss`: verl's GRPO, on which the paper trains, App. C); a step whose
siblings all scored the same has no signal and is left out.

**Update** (:func:`sibling_rows`). Each candidate is a row: the branch's tokens, mask 1 only on
the candidate's own tokens (the steps before it are context), its advantage on every one of
them; one optimizer step on the clipped token loss of :func:`~hoprl.training.policy_loss.clipped_loss`
(TRL's ``GRPOTrainer`` cannot take rows whose number depends on the episodes: ``policy_loss``
says why the loss is written here). Table 10's GRPO has no KL (``kl_coef = 0.0``).

The option ``advantage: per_step`` keeps the project's earlier reading (TRL's trainer, ``G``
independent episodes per question normalised per step index: :mod:`hoprl.training.grpo`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from hoprl.agent.runner import AgentRecipe, ChatModel, RunOptions, _Run
from hoprl.agent.tokens import to_token_trajectory
from hoprl.clients.retriever import AsyncRetrieverClient
from hoprl.domain import Action, Completion, Episode, Question, Step, TokenTrajectory
from hoprl.training.policy_loss import VERL_EPS, group_advantages

#: the episode's meta key: per step (a string of ``t``), the siblings' Step dumps
SIBLINGS = "siblings"


class SiblingRun(_Run):
    """An episode that samples ``k - 1`` sibling candidates beside every action it takes."""

    def __init__(self, *args: Any, k: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.k, self.max_tokens = k, 0

    async def generate(self, max_tokens: int) -> Completion:
        self.max_tokens = max_tokens
        return await super().generate(max_tokens)

    async def act(self, t: int, text: str, action: Action) -> bool:
        siblings = await asyncio.gather(*(self.sibling(t, j) for j in range(1, self.k)))
        self.episode.meta.setdefault(SIBLINGS, {})[str(t)] = [s.model_dump() for s in siblings]
        return await super().act(t, text, action)

    async def sibling(self, t: int, j: int) -> Step:
        """Candidate ``j`` of step ``t``: sampled from the current conversation, parsed and executed
        (a search retrieves) without touching the episode or its token budget."""
        seed = None if self.seed is None else self.seed + 7919 * j
        (completion,) = await self.llm.chat(
            self.messages, stop=self.stop, max_tokens=self.max_tokens,
            temperature=self.opts.shape.temperature, top_p=self.opts.top_p, seed=seed,
        )  # fmt: skip
        if completion.finish_reason == "length" and not getattr(self.recipe, "accept_truncated", False):
            action = Action("format_error", error=f"segment cut at max_tokens={self.max_tokens}")
        else:
            action = self.recipe.parse(completion.text)
        if action.kind == "search" and not action.queries:
            action = Action("format_error", error="search action without queries")
        step = Step(t=t, action=action.kind, text=completion.text, queries=list(action.queries),
                    query_kinds=list(action.query_kinds) or ["search"] * len(action.queries),
                    answer=action.answer, error=action.error)  # fmt: skip
        if action.kind == "search":
            step.docs = await self.retrieve(action.queries)
            step.information = self.recipe.information(step.docs)
        return step


async def run_sibling_episodes(recipe: AgentRecipe, questions: Sequence[Question], llm: ChatModel,
                               retriever: AsyncRetrieverClient, collection: str, *, k: int,
                               concurrency: int = 8, **options: Any) -> list[Episode]:  # fmt: skip
    """One episode per question with ``k`` candidates at every step (``k - 1`` siblings recorded)."""
    semaphore = asyncio.Semaphore(concurrency)
    opts = RunOptions(**options)

    async def one(question: Question) -> Episode:
        async with semaphore:
            return await SiblingRun(recipe, question, llm, retriever, collection, opts, 0, k=k).timed()

    return list(await asyncio.gather(*(one(q) for q in questions)))


def branch(episode: Episode, t: int, candidate: Step) -> Episode:
    """The episode's steps before ``t`` followed by ``candidate`` (siblings and scores dropped)."""
    meta = {k: v for k, v in episode.meta.items() if k not in (SIBLINGS, "evo_rag")}
    steps = [s.model_copy(deep=True) for s in episode.steps[: t - 1]] + [candidate.model_copy(deep=True)]
    for s in steps:
        s.signals = {}
    return episode.model_copy(update={"steps": steps, "meta": meta}, deep=True)


def sibling_groups(episode: Episode, recipe: Any) -> list[tuple[list[Episode], list[float]]]:
    """Per step of ``episode`` with siblings: its ``K`` branches (candidate 0 = the episode's own
    action) and their step rewards ``r~_t^(i)`` (the last ``R_t`` of each scored branch)."""
    groups = []
    recorded: dict[str, list[dict[str, Any]]] = episode.meta.get(SIBLINGS, {})
    for step in episode.steps:
        others = [Step.model_validate(s) for s in recorded.get(str(step.t), [])]
        if not others:
            continue
        branches = [recipe.score(branch(episode, step.t, c)) for c in [step, *others]]
        groups.append((branches, [recipe.step_rewards(b)[-1] for b in branches]))
    return groups


def sibling_advantages(rewards: Sequence[float]) -> list[float] | None:
    """``(r - mean) / (std + 1e-6)`` over one step's siblings (sample std); None when flat.

    >>> [round(a, 6) for a in sibling_advantages([2.0, 0.0, 1.0])]  # mean 1, sample std 1
    [0.999999, -0.999999, 0.0]
    """
    return group_advantages(rewards, eps=VERL_EPS)


def candidate_trajectory(branch_episode: Episode, tokenizer: Any) -> TokenTrajectory:
    """The branch's tokens with mask 1 only on its last step's (the candidate's) tokens."""
    trajectory = to_token_trajectory(branch_episode, tokenizer)
    mask = list(trajectory.mask)
    starts = [i for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1])]
    last = starts[-1] if starts else len(mask)
    return trajectory.model_copy(update={"mask": [0] * last + mask[last:]})


def sibling_rows(episodes: Sequence[Episode], recipe: Any, tokenizer: Any) -> tuple[list[TokenTrajectory], list[float], dict[str, float], list[Episode]]:  # fmt: skip # noqa: E501
    """Every candidate of every step with spread: its row and advantage; the batch's counts; and
    every scored branch (the preference model's sibling pairs, App. A.4, are built from them)."""
    rows: list[TokenTrajectory] = []
    advantages: list[float] = []
    every: list[Episode] = []
    groups = flat = 0
    for episode in episodes:
        for branches, rewards in sibling_groups(episode, recipe):
            groups += 1
            every += branches
            adv = sibling_advantages(rewards)
            if adv is None:
                flat += 1
                continue
            for b, a in zip(branches, adv, strict=True):
                if b.steps[-1].text:  # an empty candidate has no token to carry its advantage
                    rows.append(candidate_trajectory(b, tokenizer))
                    advantages.append(a)
    counts = {
        "siblings/groups": float(groups),
        "siblings/flat": float(flat),
        "siblings/rows": float(len(rows)),
    }
    return rows, advantages, counts, every
