"""EVO-RAG's rewards: the seven step signals, the in-episode weight scheduler, R_t and R.

:func:`score_episode` writes the signals on every step (the judge decides r_ref on a REFUSE);
``R_t = sum_k w_k(t) r_k(t)`` with :func:`step_weights`, and ``R = sum_t R_t``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from hoprl.domain import Episode, RetrievedDoc, Step
from hoprl.judging import Judge
from hoprl.metrics.answer import exact_match, f1
from hoprl.recipes.base import RewardFunc, versioned
from hoprl.recipes.evo_rag.config import SCORE_VERSION, SIGNALS, EvoRagConfig, Stage
from hoprl.recipes.evo_rag.curriculum import Curriculum
from hoprl.recipes.rewards import (
    episode_reward,
    gold_titles_in,
    query_cosines,
    sequence_reward,
    signal_total,
    step_rewards,
)

# --- scheduler ------------------------------------------------------------------------------


def progress(t: int, t_max: int) -> float:
    """In-episode progress ``p(t) = (t-1)/(T_max-1)``: 0 at the first step, 1 at step T_max."""
    if not 1 <= t <= t_max:
        raise ValueError(f"step t={t} is outside 1..T_max={t_max}; cap episodes at the recipe's t_max")
    return (t - 1) / (t_max - 1)


def step_weights(t: int, stage: Stage, config: EvoRagConfig) -> dict[str, float]:
    """``w_k(t) = (1-p) w_early_k + p w_late_k``; (early, late) = (Start, Mid) or (Mid, End)."""
    p = progress(t, config.t_max)
    lo, hi = (0, 1) if stage == "discovery" else (1, 2)
    return {k: (1 - p) * config.endpoints(k)[lo] + p * config.endpoints(k)[hi] for k in SIGNALS}


# --- signals --------------------------------------------------------------------------------


def _overlaps(steps: list[Step]) -> dict[int, float]:
    """Per search step index: the max cosine of its queries to all earlier queries (if any)."""
    owners = [(i, q) for i, s in enumerate(steps) if s.action == "search" for q in s.queries]
    sims = query_cosines([q for _, q in owners])
    out: dict[int, float] = {}
    for j in range(1, len(owners)):
        i = owners[j][0]
        out[i] = max(out.get(i, -math.inf), float(sims[j, :j].max()))
    return out


def _search_signals(
    step: Step, overlap: float | None, p: float, gold: list[str], act_p: float
) -> dict[str, float]:
    docs = [d for ranked in step.docs for d in ranked]
    r_dup = 0.0 if overlap is None else -overlap
    return {
        "r_ret": 1.0 if gold_titles_in(docs, gold) else -1.0,
        "r_dup": r_dup,
        "r_act": -1.0 if r_dup < 0 and p >= act_p else 0.0,
    }


def score_episode(
    episode: Episode, judge: Judge, stage: Stage, config: EvoRagConfig | None = None
) -> Episode:
    """A copy of ``episode`` with the seven signals on every step and the stage in ``meta``.

    Pure apart from the judge call on a REFUSE step. ``meta["evo_rag"]`` records the stage the
    weights will use, the scoring version and, for a refusal, the judge's verdict trail.
    """
    cfg = config or EvoRagConfig()
    scored = episode.model_copy(deep=True)
    overlaps = _overlaps(scored.steps)
    evidence: list[str] = []
    if cfg.ref_evidence == "gold_and_retrieved":
        evidence = list(scored.meta.get("gold_evidence", []))
    meta: dict[str, Any] = {"stage": stage, "version": SCORE_VERSION}
    for i, step in enumerate(scored.steps):
        p = progress(step.t, cfg.t_max)
        signals = dict.fromkeys(SIGNALS, 0.0)
        signals["r_step"] = -1.0
        if step.action == "search":
            signals |= _search_signals(step, overlaps.get(i), p, scored.gold_titles, cfg.act_p)
        elif step.action == "backtrack":
            signals["r_bt"] = -1.0
        elif step.action == "refuse":
            verdict = judge.answerable(scored.question, list(evidence), references=list(scored.answers))
            signals["r_ref"] = -1.0 if verdict.verdict else 1.0
            meta["refusal"] = verdict.model_dump()
        elif step.action == "answer":
            answer = step.answer or ""
            signals["r_ans"] = (exact_match(answer, scored.answers) + f1(answer, scored.answers)) / 2
        step.signals = signals
        evidence.extend(evidence_text(d) for ranked in step.docs for d in ranked)
    scored.meta["evo_rag"] = meta
    return scored


def evidence_text(doc: RetrievedDoc) -> str:
    """One retrieved document as r_ref's judge reads it: as the policy read it, title and text."""
    return f"(Title: {doc.title}) {doc.text}"


def episode_step_rewards(episode: Episode, config: EvoRagConfig | None = None) -> list[float]:
    """Per-step rewards ``R_t`` of a scored episode under the stage it was scored in (for PPO)."""
    cfg = config or EvoRagConfig()
    stage = _scored_stage(episode)
    return step_rewards(episode, lambda t: step_weights(t, stage, cfg))


def episode_return(episode: Episode, config: EvoRagConfig | None = None) -> float:
    """The sequence reward ``R = sum_t R_t`` of a scored episode."""
    cfg = config or EvoRagConfig()
    stage = _scored_stage(episode)
    return sequence_reward(episode, lambda t: step_weights(t, stage, cfg))


def _scored_stage(episode: Episode) -> Stage:
    if "evo_rag" not in episode.meta:
        raise KeyError(f"episode {episode.question_id!r} is not scored; call evo_rag.score_episode first")
    stage: Stage = episode.meta["evo_rag"]["stage"]
    return stage


# --- reward functions -----------------------------------------------------------------------


def make_reward_funcs(config: EvoRagConfig, judge: Judge, curriculum: Curriculum) -> list[RewardFunc]:
    """The total reward first, then one logging reward per signal (its unweighted sum).

    Episodes not yet scored are scored **in place** on first use, under the curriculum's current
    stage, so the per-signal rewards and the run registry see the very signals the total used.
    """

    def scored(ep: Episode) -> Episode:
        if "evo_rag" not in ep.meta:
            done = score_episode(ep, judge, curriculum.stage, config)
            ep.steps, ep.meta = done.steps, done.meta
        return ep

    total = versioned("evo_rag_total@1")(episode_reward(lambda ep: episode_return(scored(ep), config)))
    return [total, *(_signal_reward(name, scored) for name in SIGNALS)]


def _signal_reward(name: str, scored: Callable[[Episode], Episode]) -> RewardFunc:
    fn = episode_reward(lambda ep: signal_total(scored(ep), name))
    return versioned(f"evo_rag_{name}@1")(fn)
