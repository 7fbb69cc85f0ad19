"""DPO on step-level preference pairs built from EVO-RAG rollouts, trained with TRL.

**Sibling pairs** (:func:`sibling_pairs`, the default, App. A.4: "sibling candidates at the same
step are used to increase pair diversity"): one episode per question samples ``K`` candidates at
every step from the same state (:mod:`hoprl.training.siblings`). Each candidate's trajectory
prefix (the episode's steps before ``t``, then the candidate) is scored by its weighted return
``sum_{s <= t} R_s`` (App. A.4), and the candidates of a step are paired as below.

**Prefix pairs** (:func:`build_pairs`, ``dpo_pairs: prefixes``, the project's earlier reading):
EVO-RAG compares *prefixes*: for one question, every stored episode is a path through a tree of
steps. Two episodes that agree on steps ``1..t-1`` (same generated text and same injected
information, so the policy saw the same context) and differ at step ``t`` are *siblings* at ``t``.
Each distinct step-``t`` text is a *candidate*; its value is the weighted return from ``t`` on::

    G_t = sum_{s >= t} R_s          R_s = sum_k w_k(s) r_k(s)   (evo_rag.episode_step_rewards)

averaged over the stored episodes that continue with that candidate (a Monte Carlo estimate of
the candidate's value). Siblings share the rewards of steps ``1..t-1`` when their signals depend
only on the shared prefix, so ranking by ``G_t`` ranks the full returns the same way; ``G_t``
leaves out the shared part, which would only add noise where it differs.

Pairs, per sibling group: rank candidates by value; pair the best with the worst, the second best
with the second worst, and so on, keeping a pair only when its margin exceeds ``delta``. Every
candidate appears in at most one pair, so positives (chosen) and negatives (rejected) are balanced
1:1 and one strong candidate cannot dominate a group. Rows are in TRL's conversational format::

    {"prompt": [messages up to step t-1], "chosen": [{"role": "assistant", "content": step t}],
     "rejected": [...], "margin": G_chosen - G_rejected, "question_id": ..., "t": t}

GRPO, PPO and DPO read the same stored episodes, so the three objectives are compared on
identical rollouts.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from hoprl.agent.tokens import episode_messages
from hoprl.domain import Episode
from hoprl.recipes.evo_rag import EvoRagConfig, episode_step_rewards

log = logging.getLogger("hoprl.trainer.dpo")


class DPOJobConfig(BaseModel):
    """Pair construction and DPO training settings (TRL's ``DPOConfig`` gets the training ones)."""

    model_config = ConfigDict(extra="forbid")

    delta: float = Field(default=0.1, ge=0.0, description="keep pairs with G_chosen - G_rejected > delta")
    beta: float = Field(default=0.1, gt=0.0, description="DPO's KL strength")
    steps: int = Field(default=100, ge=1)
    batch_size: int = Field(default=4, ge=1)
    gradient_accumulation_steps: int = Field(default=1, ge=1)
    learning_rate: float = 1e-6
    max_length: int | None = Field(default=2048, description="prompt + completion tokens (None: no cap)")
    seed: int = 0
    report_to: str = Field(default="none", description="TRL's report_to: none, wandb, mlflow, ...")


@dataclass
class SiblingGroup:
    """Candidates for step ``t`` after one shared prefix: step text -> the episodes that took it."""

    question_id: str
    t: int
    prompt: list[dict[str, str]]
    candidates: dict[str, list[Episode]] = field(default_factory=dict)


def _prefix_key(episode: Episode, t: int) -> tuple[Any, ...]:
    """What the policy saw before step ``t``: question, initial messages, earlier steps."""
    prompt = tuple((m["role"], m["content"]) for m in episode.prompt)
    steps = tuple((s.text, s.information) for s in episode.steps[: t - 1])
    return (episode.question_id, prompt, steps)


def sibling_groups(episodes: Sequence[Episode]) -> list[SiblingGroup]:
    """Every prefix shared by at least two different step-``t`` continuations, in first-seen order."""
    groups: dict[tuple[Any, ...], SiblingGroup] = {}
    for ep in episodes:
        for t in range(1, len(ep.steps) + 1):
            key = _prefix_key(ep, t)
            if key not in groups:
                prefix = ep.model_copy(update={"steps": ep.steps[: t - 1]})
                groups[key] = SiblingGroup(ep.question_id, t, episode_messages(prefix))
            groups[key].candidates.setdefault(ep.steps[t - 1].text, []).append(ep)
    return [g for g in groups.values() if len(g.candidates) > 1]


def returns_to_go(rewards: Sequence[float]) -> list[float]:
    """``G_t = sum_{s >= t} R_s`` for every step: ``[1, 2, 3] -> [6, 5, 3]``."""
    out, total = [], 0.0
    for r in reversed(rewards):
        total += r
        out.append(total)
    return out[::-1]


def candidate_values(group: SiblingGroup, config: EvoRagConfig | None = None) -> dict[str, float]:
    """Mean ``G_t`` of each candidate over the episodes that continue with it."""
    values = {}
    for text, eps in group.candidates.items():
        gs = [returns_to_go(episode_step_rewards(ep, config))[group.t - 1] for ep in eps]
        values[text] = sum(gs) / len(gs)
    return values


def build_pairs(
    episodes: Sequence[Episode], delta: float = 0.1, config: EvoRagConfig | None = None
) -> list[dict[str, Any]]:
    """Balanced preference rows from scored episodes (module doc); deterministic for one input.

    Example::

        rows = build_pairs([recipe.score(ep) for ep in stored], delta=0.1)
        train_dpo("checkpoints/sft", rows, DPOJobConfig(steps=200), "checkpoints/dpo")
    """
    rows = []
    for group in sibling_groups(episodes):
        values = candidate_values(group, config)
        rows += pair_rows(values, delta, group.prompt, group.question_id, group.t)
    log.info("%d preference pairs from %d episodes (delta=%s)", len(rows), len(episodes), delta)
    return rows


def pair_rows(
    values: dict[str, float], delta: float, prompt: list[dict[str, str]], question_id: str, t: int
) -> list[dict[str, Any]]:
    """One group's rows: candidates ranked by value, best with worst, second best with second
    worst, ..., each kept when its margin exceeds ``delta`` (positives and negatives 1:1)."""
    ranked = sorted(values, key=lambda text: -values[text])
    half = len(ranked) // 2
    rows = []
    for chosen, rejected in zip(ranked[:half], ranked[::-1][:half], strict=True):
        margin = values[chosen] - values[rejected]
        if margin > delta:
            rows.append(
                {
                    "prompt": prompt,
                    "chosen": [{"role": "assistant", "content": chosen}],
                    "rejected": [{"role": "assistant", "content": rejected}],
                    "margin": margin,
                    "question_id": question_id,
                    "t": t,
                }
            )
    return rows


def sibling_pairs(
    episodes: Sequence[Episode], recipe: Any, delta: float = 0.1
) -> tuple[list[dict[str, Any]], list[Episode]]:
    """Rows from the sibling candidates of sibling episodes (App. A.4), and every scored branch.

    A candidate's value is its prefix's weighted return ``sum_{s <= t} R_s``
    (:meth:`EvoRag.step_rewards` of the branch); candidates that wrote the same text share the
    mean of their values. Episodes without recorded siblings give no rows.
    """
    from hoprl.training.siblings import sibling_groups as step_siblings

    rows: list[dict[str, Any]] = []
    every: list[Episode] = []
    for episode in episodes:
        for branches, _ in step_siblings(episode, recipe):
            every += branches
            returns: dict[str, list[float]] = {}
            for b in branches:
                returns.setdefault(b.steps[-1].text, []).append(sum(recipe.step_rewards(b)))
            values = {text: sum(r) / len(r) for text, r in returns.items()}
            first = branches[0]
            prompt = episode_messages(first.model_copy(update={"steps": first.steps[:-1]}))
            rows += pair_rows(values, delta, prompt, episode.question_id, first.steps[-1].t)
    log.info("%d sibling preference pairs from %d episodes (delta=%s)", len(rows), len(episodes), delta)
    return rows, every


def train_dpo(
    model_path: str | Path, pairs: Sequence[dict[str, Any]], config: DPOJobConfig, out_dir: str | Path
) -> list[dict[str, float]]:
    """Fine-tune ``model_path`` with TRL's DPOTrainer on ``pairs``; save model and tokenizer.

    The reference model is a frozen copy of the starting weights (TRL's default). Returns TRL's
    log history (loss, rewards/chosen, rewards/rejected, rewards/margins, ... per logged step).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    model = AutoModelForCausalLM.from_pretrained(str(model_path))
    trainer = dpo_trainer(model, tokenizer, pairs, config, out_dir)
    trainer.train()
    trainer.save_model(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return [dict(entry) for entry in trainer.state.log_history]


def dpo_trainer(
    model: Any,
    tokenizer: Any,
    pairs: Sequence[dict[str, Any]],
    config: DPOJobConfig,
    out_dir: str | Path,
    ref_model: Any = None,
    optimizers: tuple[Any, Any] = (None, None),
) -> Any:
    """TRL's DPOTrainer on in-memory models (what :func:`train_dpo` runs). The job loop
    (:mod:`hoprl.training.offpolicy`) builds one per step with the same ``ref_model`` and
    ``optimizers``, so the reference stays the starting policy and Adam keeps its moments."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    from hoprl.training.hardware import common_args

    if not pairs:
        raise ValueError("no preference pairs: store more samples per question or lower delta")
    args = DPOConfig(
        beta=config.beta,
        max_steps=config.steps,
        per_device_train_batch_size=config.batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        learning_rate=config.learning_rate,
        max_length=config.max_length,
        save_strategy="no",
        **common_args(str(out_dir), config.seed, config.report_to),
    )
    columns = ("prompt", "chosen", "rejected")
    dataset = Dataset.from_list([{k: row[k] for k in columns} for row in pairs])
    return DPOTrainer(
        model=model,
        ref_model=ref_model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        optimizers=optimizers,
    )
