"""Group-normalised advantages and the clipped token-level surrogate of the project's own loops.

R2AG's rounds (:mod:`hoprl.training.r2ag_rounds`) and EVO-RAG's sibling GRPO
(:mod:`hoprl.training.siblings`) train on groups whose rows are not TRL's: a group is one tree's
``G`` responses at an expansion level (R2AG Algorithm 1) or the ``K`` sibling candidates sampled
from one state (EVO-RAG §3.4), and how many groups a step holds depends on the rollout. TRL's
``GRPOTrainer`` fixes a step's rows in advance (``questions_per_step x num_generations``), so
these loops compute the same loss by hand, here.

**Advantages.** ``A_i = (R_i - mean(R)) / (std(R) + eps)`` within a group, with the *sample*
standard deviation (Bessel's ``n - 1``): verl, on which both papers train (EVO-RAG App. C; R2AG
builds on DAPO's verl recipe), takes ``torch.std`` (unbiased) in its GRPO advantage, as TRL does.
A group whose rewards have zero spread has no signal: R2AG's Eq. 6 keeps only groups with
``std > 0`` (DAPO's dynamic sampling), and the sibling loop does the same.

**Loss.** ``-min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)`` per policy token (mask 1),
aggregated per token over the batch (``dapo``: R2AG's Eq. 6, ``1 / sum_i |o_i|``), per sequence
then per batch (``grpo``) or over ``B x max_tokens`` (``dr_grpo``). With one update per batch,
``rho`` is 1 when the gradient is taken (as in TRL with one iteration per generation).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import torch
from trl.trainer.utils import selective_log_softmax

from hoprl.domain import TokenTrajectory

#: verl's epsilon in its GRPO advantage (``compute_grpo_outcome_advantage``, ``epsilon=1e-6``)
VERL_EPS = 1e-6


def group_advantages(rewards: Sequence[float], scale: bool = True, eps: float = 1e-4) -> list[float] | None:
    """GRPO advantages of one group, or None when its rewards have zero spread (dropped).

    ``scale``: divide by the group's sample std plus ``eps`` (GRPO); without it only the mean is
    subtracted (Dr. GRPO, ``scale_rewards="none"``).

    >>> group_advantages([1.0, 0.0, 0.5], eps=0.0)  # mean 0.5, sample std 0.5
    [1.0, -1.0, 0.0]
    """
    if len(rewards) < 2 or max(rewards) == min(rewards):
        return None
    mean = sum(rewards) / len(rewards)
    if not scale:
        return [r - mean for r in rewards]
    std = statistics.stdev(rewards)
    return [(r - mean) / (std + eps) for r in rewards]


def level_advantages(
    groups: Sequence[Sequence[float]], scaling: str, eps: float = 1e-4
) -> list[list[float] | None]:
    """:func:`group_advantages` of each group under TRL's ``scale_rewards`` (``group`` / ``batch``
    / ``none``); ``batch`` divides the centred rewards by the std over every group's rewards."""
    advantages = [group_advantages(g, scale=scaling == "group", eps=eps) for g in groups]
    if scaling != "batch":
        return advantages
    std = statistics.stdev([r for g in groups for r in g])
    return [None if a is None else [x / (std + eps) for x in a] for a in advantages]


def clipped_loss(
    model: Any,
    trajectories: Sequence[TokenTrajectory],
    advantages: Sequence[float],
    pad_id: int,
    *,
    temperature: float = 1.0,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    loss_type: str = "dapo",
    max_tokens: int = 1,
) -> torch.Tensor:
    """The clipped surrogate (module doc) over each trajectory's mask-1 tokens, one advantage per
    trajectory. ``max_tokens`` is ``dr_grpo``'s constant length normaliser."""
    ids = [t.prompt_ids + t.completion_ids for t in trajectories]
    width = max(len(x) for x in ids)
    device = next(model.parameters()).device
    input_ids = torch.tensor([x + [pad_id] * (width - len(x)) for x in ids], device=device)
    attention = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids], device=device)
    # shifted frame: position i predicts token i + 1; mask 1 where that token is the policy's
    mask = torch.tensor(
        [
            [0] * (len(t.prompt_ids) - 1) + t.mask + [0] * (width - len(x))
            for t, x in zip(trajectories, ids, strict=True)
        ],
        dtype=torch.float32,
        device=device,
    )
    logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1].float() / temperature
    logps = selective_log_softmax(logits, input_ids[:, 1:])
    ratio = torch.exp(logps - logps.detach())
    adv = torch.tensor(list(advantages), device=device)[:, None]
    clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    per_token = -torch.min(ratio * adv, clipped * adv) * mask
    if loss_type == "grpo":
        return (per_token.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "dr_grpo":
        return per_token.sum() / (len(trajectories) * max_tokens)
    return per_token.sum() / mask.sum().clamp(min=1.0)
