"""EVO-RAG: seven step-level rewards, an in-episode weight scheduler and a two-stage curriculum.

Ji et al., "Curriculum-Guided Reinforcement Learning for Efficient Multi-Hop Retrieval-Augmented
Generation" (arXiv:2505.17391). The policy acts one step at a time::

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

Episodes run up to ``T_max = 20`` steps (the trainer's ``max_turns`` default for this recipe is
derived from ``t_max``: :func:`trainer_defaults`), so ``p(t)`` reaches 1, ``r_act`` can fire from
``p(t) >= 0.3`` (step 7 of 20) and the late weights are reached. ``docs/recipes/evo-rag.md`` maps
every mechanism of the paper to its code and test.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from hoprl.agent.parsing import parse_tags
from hoprl.agent.trajectory import Episode, RetrievedDoc, Step
from hoprl.data.synthetic import hops_for
from hoprl.judging import Judge, RulesJudge
from hoprl.metrics.answer import exact_match, f1
from hoprl.recipes.base import Action, RewardFunc, versioned
from hoprl.recipes.rewards import (
    episode_reward,
    gold_titles_in,
    query_cosines,
    sequence_reward,
    signal_total,
    step_rewards,
)
from hoprl.schemas import Question

Stage = Literal["discovery", "refinement"]
SwitchRule = Literal["best", "previous"]
RefEvidence = Literal["retrieved", "gold_and_retrieved"]
SIGNALS = ("r_ret", "r_dup", "r_bt", "r_ref", "r_step", "r_ans", "r_act")
SCORE_VERSION = "evo_rag@1"


class EvoRagConfig(BaseModel):
    """EVO-RAG's constants. Weight triples are Table 2's (Start, Mid, End) endpoints."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    t_max: int = Field(default=20, ge=2, le=64, description="episode cap T_max (the trainer's max_turns)")
    top_k: int = Field(default=3, ge=1, description="documents per SEARCH")
    act_p: float = Field(default=0.3, description="r_act applies when p(t) >= act_p")
    w_ret: tuple[float, float, float] = (2.0, 1.0, 0.5)
    w_act: tuple[float, float, float] = (1.5, 0.8, 0.4)
    w_dup: tuple[float, float, float] = (0.1, 0.5, 1.2)
    w_bt: tuple[float, float, float] = (0.3, 0.5, 1.0)
    w_ref: tuple[float, float, float] = (0.5, 0.5, 0.5)
    w_step: tuple[float, float, float] = (0.02, 0.05, 0.10)
    w_ans: tuple[float, float, float] = (0.05, 0.10, 1.00)
    # The stage switch: the paper's rule (best EMA so far); alpha, eps and P are not given as
    # numbers in the paper, so these three values are ours.
    ema_alpha: float = Field(default=0.3, gt=0.0, le=1.0, description="EMA weight of the newest dev return")
    switch_eps: float = Field(default=0.01, description="an EMA gain below this is a flat check")
    switch_patience: int = Field(default=3, ge=1, description="flat checks in a row before switching")
    switch_rule: SwitchRule = Field(
        default="best",
        description="best: a check is flat when the EMA is not eps above the best EMA so far (the paper); "
        "previous: not eps above the previous check's EMA (an option)",
    )
    ref_evidence: RefEvidence = Field(
        default="retrieved",
        description="what r_ref's judge reads: the retrieved documents (the paper), or the gold "
        "paragraphs plus the retrieved ones (an option)",
    )

    def endpoints(self, signal: str) -> tuple[float, float, float]:
        """(Start, Mid, End) weights of ``r_xxx``."""
        triple: tuple[float, float, float] = getattr(self, "w_" + signal.removeprefix("r_"))
        return triple


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


#: Context tokens allowed per retrieved document, as :func:`render_information` writes it (SmolLM2's
#: tokenizer): the median three-document block measured 440 tokens on HotpotQA (p90 689), 267 on
#: 2Wiki and 382 on MuSiQue (100 dev questions each), the synthetic world's 174; 20 searches over
#: the first 20 HotpotQA dev questions' paragraphs came to 11,434 context tokens.
INFO_TOKENS_PER_DOC = 200


def trainer_defaults(recipe_config: dict[str, Any], max_new_tokens_per_step: int = 64) -> dict[str, Any]:
    """The trainer's episode limits for this recipe, derived from its config (one source of truth).

    ``max_turns = t_max`` (the paper's T_max = 20 by default), and a ``token_budget`` (context
    growth per episode) that lets all ``t_max`` steps be searches: per step, the generated tokens
    plus ``top_k`` documents of :data:`INFO_TOKENS_PER_DOC`. With the defaults:
    20 * (64 + 3 * 200) = 13280 tokens.

    >>> trainer_defaults({"t_max": 5, "top_k": 2}, max_new_tokens_per_step=32)
    {'max_turns': 5, 'token_budget': 2160}
    """
    cfg = EvoRagConfig(**recipe_config)
    per_step = max_new_tokens_per_step + cfg.top_k * INFO_TOKENS_PER_DOC
    return {"max_turns": cfg.t_max, "token_budget": cfg.t_max * per_step}


def _scored_stage(episode: Episode) -> Stage:
    if "evo_rag" not in episode.meta:
        raise KeyError(f"episode {episode.question_id!r} is not scored; call evo_rag.score_episode first")
    stage: Stage = episode.meta["evo_rag"]["stage"]
    return stage


# --- curriculum -----------------------------------------------------------------------------


class Curriculum(BaseModel):
    """Discovery -> Refinement when the EMA of dev returns stops improving on its best.

    Each :meth:`update` is one dev check (the trainer runs one per checkpoint). The first check
    seeds the EMA (and the best EMA) with its dev return. After that::

        ema  = alpha * dev_return + (1 - alpha) * ema
        flat = ema - best < eps          # rule "best" (the paper); "previous": ema - ema_before
        best = max(best, ema)

    ``patience`` flat checks in a row switch the stage, once; a check that is not flat resets the
    count. This is the paper's rule: the running EMA fails to improve on the **best** EMA so far
    by ``eps`` for ``P`` consecutive checks, so a dip followed by a slow recovery below the old
    best counts as a plateau. ``rule="previous"`` (the project's earlier reading, kept as an
    option) compares with the previous check's EMA instead, so any recovery resets the count.
    State is plain data: ``Curriculum.model_validate(c.to_dict())`` resumes it.
    """

    model_config = ConfigDict(extra="forbid")

    alpha: float = Field(default=0.3, gt=0.0, le=1.0)
    eps: float = 0.01
    patience: int = Field(default=3, ge=1)
    rule: SwitchRule = "best"
    stage: Stage = "discovery"
    ema: float | None = None
    best: float | None = Field(default=None, description="the highest EMA so far")
    flat_checks: int = 0
    checks: int = 0
    switched_at: int | None = Field(default=None, description="the check that switched the stage")

    @classmethod
    def from_config(cls, config: EvoRagConfig) -> Curriculum:
        return cls(
            alpha=config.ema_alpha,
            eps=config.switch_eps,
            patience=config.switch_patience,
            rule=config.switch_rule,
        )

    def update(self, dev_return: float) -> bool:
        """Record one dev return; True exactly when this check switches to Refinement."""
        if not math.isfinite(dev_return):
            raise ValueError(f"dev return must be finite, got {dev_return}")
        self.checks += 1
        if self.ema is None:
            self.ema = self.best = dev_return
            return False
        previous, self.ema = self.ema, self.alpha * dev_return + (1 - self.alpha) * self.ema
        best = previous if self.best is None else self.best  # (a state saved before `best` existed)
        reference = best if self.rule == "best" else previous
        self.best = max(best, self.ema)
        if self.stage == "refinement":
            return False
        self.flat_checks = self.flat_checks + 1 if self.ema - reference < self.eps else 0
        if self.flat_checks < self.patience:
            return False
        self.stage, self.switched_at = "refinement", self.checks
        return True

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> Curriculum:
        return cls.model_validate(state)


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


# --- protocol -------------------------------------------------------------------------------

SYSTEM_PROMPT = """You answer multi-hop questions by searching a document collection step by step.
Each turn, reason briefly inside <think>...</think>, then take exactly one action:
- <search>query</search> to retrieve documents; results come back inside <information>.
- <backtrack/> to discard your last search and its results when they led nowhere.
- <answer>short answer</answer> when the evidence answers the question.
- <refuse/> when the evidence shows the question cannot be answered.
Search for one fact per step, avoid repeating earlier queries, and finish within {t_max} steps."""

_ACTION_TAGS = ("search", "answer")
_MARKERS = {"<backtrack/>": "backtrack", "<refuse/>": "refuse"}


def parse_action(segment: str) -> Action:
    """Parse one EVO-RAG segment; anything unreadable is ``Action('format_error')``, never raised.

    The action is the first ``<search>``/``<answer>`` block or marker outside ``<think>``; more
    than one action, an unclosed or empty action block, or tags inside it are format errors.
    """
    parsed = parse_tags(segment, ["think", *_ACTION_TAGS])
    fatal = [e for e in parsed.errors if e.startswith(("too_long", "nested"))]
    if fatal:
        return Action("format_error", error=fatal[0])
    spans = [(b.start, b.end) for b in parsed.blocks]
    found: list[tuple[int, str, str | None, bool]] = [
        (b.start, b.tag, b.content, b.closed) for b in parsed.blocks if b.tag in _ACTION_TAGS
    ]
    for marker, kind in _MARKERS.items():
        at = segment.find(marker)
        while at != -1:
            if not any(s <= at < e for s, e in spans):
                found.append((at, kind, None, True))
            at = segment.find(marker, at + 1)
    if not found:
        return Action("format_error", error="no action: use <search>, <backtrack/>, <answer> or <refuse/>")
    if len(found) > 1:
        return Action("format_error", error=f"{len(found)} actions in one segment; take one per turn")
    _, kind, content, closed = found[0]
    if kind in _MARKERS.values():
        return Action(kind)  # type: ignore[arg-type]
    if not closed:
        return Action("format_error", error=f"unclosed <{kind}>")
    if not content or "<" in content:
        return Action("format_error", error=f"<{kind}> is empty or contains a tag")
    if kind == "search":
        return Action("search", queries=[content], query_kinds=["search"])
    return Action("answer", answer=content)


def render_information(docs: list[list[RetrievedDoc]]) -> str:
    """Retrieved documents as the ``<information>`` block the policy reads (mask 0)."""
    lines = [f"Doc {i} (Title: {d.title}) {d.text}" for i, d in enumerate((d for r in docs for d in r), 1)]
    return "\n<information>\n" + "\n".join(lines) + "\n</information>\n"


def _hop_thought(title: str, relation: str) -> str:
    need = f"the {relation.replace('_', ' ')} of {title}" if relation else f"what {title} says"
    return f"<think>Next I need {need}.</think>"


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
        """One SEARCH per gold hop, then ANSWER (or REFUSE when ``answers == []``).

        With probability ``noise`` per hop, a search for a distractor paragraph's title and a
        BACKTRACK come first, so warm-start data shows recovery. Each segment ends with a stop
        sequence, as the runner would cut it.
        """
        rng = random.Random(f"{seed}:{question.id}")
        distractors = [p.title for p in question.paragraphs if not p.is_gold]
        segments = []
        for hop in hops_for(question):
            thought = _hop_thought(hop.title, hop.relation)
            if distractors and rng.random() < noise:
                segments.append(f"{thought}\n<search>{rng.choice(distractors)}</search>")
                segments.append("<think>That result is off the path; drop it.</think>\n<backtrack/>")
            segments.append(f"{thought}\n<search>{hop.query}</search>")
        if question.answers:
            final = f"<think>The evidence answers it.</think>\n<answer>{question.answers[0]}</answer>"
        else:
            final = "<think>No document states the last fact; it cannot be answered.</think>\n<refuse/>"
        return [*segments, final]

    def expert(self, question: Question, noise: float = 0.0, seed: int = 0) -> str:
        return "".join(self.expert_segments(question, noise, seed))
