"""The signals that say whether an RL step is working, beside what TRL logs.

TRL's GRPOTrainer logs, per step, the reward's mean and spread (``reward``, ``reward_std``, each
reward function's ``rewards/<name>/mean`` and ``/std``), the share of groups whose rewards have no
spread (``frac_reward_zero_std``), the importance-ratio clip fractions (``clip_ratio/*``), the
policy's token ``entropy``, the gradient norm (``grad_norm``) and, with ``beta > 0``, the KL term
(``kl``). This module adds what an agent's episodes need:

- **TRL's completion metrics, corrected.** TRL calls a completion *clipped* when its last token
  is not EOS (``completions/clipped_ratio``) and averages the lengths of the others
  (``completions/mean_terminated_length``, ``min_``, ``max_``). An agent episode ends on a tag
  (``</answer>``), never on EOS, so TRL read 1.0 and 0 on every step. :func:`completion_metrics`
  recomputes them from the episodes: an episode is clipped when a limit of its shape cut it
  (:data:`LIMIT_OUTCOMES`: the token budget or the step cap), and the terminated lengths are the
  policy tokens (mask 1, TRL's ``completions/mean_length``) of the others;
  :func:`replace_completion_metrics` writes them over TRL's values of the step.
- **KL to the weights the job started from, at any beta** (:class:`WarmStartKL`). TRL loads no
  reference model when ``beta == 0`` (DAPO), so nothing says how far the policy moved. With
  ``beta > 0`` the reference log-probs TRL computed are reused (no cost); otherwise a frozen copy
  of the starting weights scores the step's sampled tokens in a no-grad forward pass, on the first
  ``rows`` episodes of the step that have tokens in the loss (or all; gathered over the step's
  passes, so passes of one episode score ``rows`` of them, not all; a step whose every episode
  left the loss, dynamic sampling having dropped every group, logs no KL). Per policy token, with
  ``x = log πθ - log πref``: ``k1 = x`` and ``k3 = exp(-x) + x - 1`` (Schulman, "Approximating
  KL divergence"), averaged over the measured tokens of the step, logged at its last pass:
  ``warm_start_kl/k1``, ``warm_start_kl/k3``, and the step's seconds of the forward pass
  ``warm_start_kl/forward_s`` (with ``beta > 0``: every pass, 0 s, TRL's reference reused).
- **The same KL on a fixed probe** (:func:`probe_kl`). The KL above is measured on each step's
  own episodes, so it moves with which episodes a step drew (0.0043, 0.0360, 0.0033 over three
  steps of one demo arm). The first episodes the frozen copy scored in the job's first step
  (``rows`` of them, sampled from the starting weights) are kept with their reference log-probs,
  and at the last pass of every step (before its update) the policy scores the same tokens again:
  ``warm_start_kl/probe_k1`` and ``probe_k3``, ``probe_tokens`` (the probe's policy tokens) and
  ``probe_s`` (its seconds). The samples come from the starting weights, so the estimate is of
  KL(start || policy), with ``x = log πref - log πθ`` in the same k1 and k3 (the per-step KL
  above samples the policy, and so estimates KL(policy || start)). Two arms started from one
  checkpoint with one seed draw the same questions in their first step, but not the same samples
  (rollouts are decoded in batches, without a seed per request), so each arm's probe is its own
  draw from the starting weights: estimates of one KL, on different tokens. A job resumed after
  its first step, or one with ``beta > 0``, has no probe.
- :func:`answer_tokens`: the mean length, in tokens, of the final answers of the step's episodes.
- **Groups that teach the reader nothing** (:func:`answers_flat`, logged as ``answers_flat``): the
  share of the step's groups whose episodes were all right or all wrong by exact match (DAPO's
  accuracy of 0 or 1). ``frac_reward_zero_std`` misses them when other reward terms spread (a
  when-to-search group of wrong answers still spreads through r_s and r_f).
- **Right answers per question type** (:func:`correct_by_type`, logged as ``correct/<type>``):
  the share of the step's episodes answered right, by the question's ``type`` (``bridge``,
  ``comparison``, ...). A reward can raise one type while lowering another (a comparison's answer
  is a name its question gives; copying a given name spreads to bridges, where it is wrong): the
  overall reward hides such a trade, these lines show it while the job runs.

>>> [round(v, 4) for v in kl_sums(torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.0, -3.0]]),
...                                torch.tensor([[1.0, 1.0]]))]
[1.0, 0.3679, 2.0]
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from trl.trainer.utils import add_fused_lm_head

from hoprl.domain import Episode
from hoprl.metrics.answer import exact_match
from hoprl.training.policy_head import loss_mask, policy_token_logps

#: outcomes a limit of the episode's shape decided: TRL's "clipped" for an agent episode
LIMIT_OUTCOMES = ("token_budget", "step_cap")
#: TRL's completion metrics that read EOS, which an agent episode never ends on
COMPLETION_KEYS = (
    "completions/clipped_ratio",
    "completions/mean_terminated_length",
    "completions/min_terminated_length",
    "completions/max_terminated_length",
)


def answer_tokens(episodes: Sequence[Episode], tokenizer: Any) -> float:
    """Mean tokens of the final answers of ``episodes`` that gave one (0.0 when none did)."""
    answers = [e.final_answer for e in episodes if e.final_answer is not None]
    counts = [len(tokenizer(a, add_special_tokens=False)["input_ids"]) for a in answers]
    return sum(counts) / len(counts) if counts else 0.0


def correct(episode: Episode) -> bool:
    """DAPO's ``is_equivalent`` (Yu et al., 2025, Eq. 11) as a rule: the final answer matches a gold
    answer by normalised exact match. An unanswerable question (no gold answers) is never correct."""
    return exact_match(episode.final_answer or "", episode.answers) == 1.0


def answers_flat(episodes: Sequence[Episode]) -> bool:
    """Whether every episode of one group is right, or every one wrong (:func:`correct`).

    >>> right, wrong = (Episode(recipe="r", question_id="q", question="?", answers=["Paris"],
    ...                         final_answer=a) for a in ("paris.", "Lyon"))
    >>> answers_flat([right, right]), answers_flat([wrong, wrong]), answers_flat([right, wrong])
    (True, True, False)
    """
    return len({correct(e) for e in episodes}) <= 1


def answers_flat_share(episodes: Sequence[Episode], group_size: int) -> float:
    """The share of the consecutive groups of ``group_size`` episodes that are :func:`answers_flat`."""
    groups = [episodes[i : i + group_size] for i in range(0, len(episodes), group_size)]
    return sum(answers_flat(g) for g in groups) / max(len(groups), 1)


def correct_by_type(episodes: Sequence[Episode], types: Sequence[str | None]) -> dict[str, float]:
    """``correct/<type>``: the share of ``episodes`` that are :func:`correct`, per question type
    (``types[i]`` is episode ``i``'s; untyped questions count as ``other``).

    >>> right, wrong = (Episode(recipe="r", question_id="q", question="?", answers=["Paris"],
    ...                         final_answer=a) for a in ("Paris", "Lyon"))
    >>> correct_by_type([right, wrong, wrong, right], ["bridge", "bridge", "comparison", None])
    {'correct/bridge': 0.5, 'correct/comparison': 0.0, 'correct/other': 1.0}
    """
    tally: dict[str, list[bool]] = {}
    for episode, kind in zip(episodes, types, strict=True):
        tally.setdefault(f"correct/{kind or 'other'}", []).append(correct(episode))
    return {name: sum(hits) / len(hits) for name, hits in tally.items()}


def completion_metrics(clipped: Sequence[bool], lengths: Sequence[float]) -> dict[str, float]:
    """:data:`COMPLETION_KEYS` from each episode's ``clipped`` flag and its policy-token length.

    The terminated lengths are NaN when every episode was clipped (TRL's log leaves a NaN out).

    >>> completion_metrics([True, False, False], [90, 30, 50])["completions/mean_terminated_length"]
    40.0
    """
    ended = [n for n, cut in zip(lengths, clipped, strict=True) if not cut]
    nan = float("nan")
    return {
        "completions/clipped_ratio": sum(clipped) / max(len(clipped), 1),
        "completions/mean_terminated_length": sum(ended) / len(ended) if ended else nan,
        "completions/min_terminated_length": min(ended, default=nan),
        "completions/max_terminated_length": max(ended, default=nan),
    }


def replace_completion_metrics(
    metrics: dict[str, list[float]],
    episodes: Sequence[Episode],
    policy_mask: torch.Tensor,
    gather: Callable[[torch.Tensor], torch.Tensor],
) -> None:
    """Overwrite the step's TRL values of :data:`COMPLETION_KEYS` in ``metrics`` (a trainer's
    ``_metrics[mode]``, where TRL has just appended them) with the episodes' own.

    Args:
        policy_mask: ``[episodes, tokens]``, 1 on the policy's tokens (rows in episode order).
        gather: the accelerator's, so every process's episodes count (TRL gathers its own alike).
    """
    device = policy_mask.device
    clipped = gather(torch.tensor([e.outcome in LIMIT_OUTCOMES for e in episodes], device=device))
    lengths = gather(policy_mask.sum(-1).float())
    values = completion_metrics([bool(c) for c in clipped.tolist()], lengths.tolist())
    for key, value in values.items():
        if metrics.get(key):
            metrics[key][-1] = value
        else:
            metrics[key] = [value]


def kl_sums(logps: torch.Tensor, ref_logps: torch.Tensor, mask: torch.Tensor) -> tuple[float, float, float]:
    """``(sum k1, sum k3, tokens)`` over the mask-1 tokens; ``x = logps - ref_logps`` per token,
    ``k1 = x``, ``k3 = exp(-x) + x - 1`` (module docstring)."""
    x = (logps - ref_logps).float()
    k3 = torch.exp(-x) + x - 1
    m = mask.float()
    return float((x * m).sum()), float((k3 * m).sum()), float(m.sum())


@dataclass(frozen=True)
class ProbeEpisode:
    """One probe episode (:func:`probe_kl`): its token ids and attention mask (prompt, then
    completion, as the loss scored them), the policy-token mask of its completion, and the
    starting weights' log-probs there."""

    ids: torch.Tensor
    attention: torch.Tensor
    mask: torch.Tensor
    reference: torch.Tensor


class WarmStartKL:
    """The KL of the policy to the weights its job started from, per step (module docstring).

    Build it from the model *before* the trainer wraps or patches it, then :meth:`prepare` it with
    the trainer (it gets the trainer's fused LM head at the rollouts' temperature, so its
    log-probs are comparable with the policy's).

    Args:
        model: the policy as the job loaded it; a frozen copy is kept (the memory of one model).
        rows: score only the first ``rows`` episodes of a step (TRL shuffles a step's episodes
            before the loss, so they are a random draw); ``None``: every episode.
    """

    def __init__(self, model: Any, rows: int | None = None) -> None:
        self.frozen = copy.deepcopy(model).eval().requires_grad_(False)
        self.rows = rows
        #: the fixed probe (:func:`probe_kl`): episodes of the first step, one row each, with the
        #: frozen copy's log-probs of their policy tokens
        self.probe: list[ProbeEpisode] = []
        self.probe_step = -1  # the optimizer step the probe was last measured at
        #: the step so far (:func:`warm_start_kl`): sum k1, sum k3, tokens, the forward's seconds,
        #: episodes scored; emptied when the step's figures are logged
        self.sums = [0.0, 0.0, 0.0, 0.0]
        self.scored = 0

    def keep(self, inputs: dict[str, Any], rows: torch.Tensor, reference: torch.Tensor) -> None:
        """Add scored ``rows`` of a first-step pass to the probe, up to :attr:`rows` episodes
        (``None``: every episode of the first step)."""
        mask = loss_mask(inputs)
        for i, row in enumerate(rows.tolist()):
            if self.rows is not None and len(self.probe) >= self.rows:
                return
            ids = torch.cat([inputs["prompt_ids"][row], inputs["completion_ids"][row]]).unsqueeze(0)
            attention = torch.cat([inputs["prompt_mask"][row], inputs["completion_mask"][row]]).unsqueeze(0)
            self.probe.append(ProbeEpisode(ids, attention, mask[row : row + 1], reference[i : i + 1]))

    def prepare(self, trainer: Any) -> None:
        fp32_head = trainer.args.cast_lm_head_to_fp32
        add_fused_lm_head(self.frozen, temperature=trainer.temperature, cast_lm_head_to_fp32=fp32_head)
        self.frozen = trainer.accelerator.prepare_model(self.frozen, evaluation_mode=True)

    def scored_rows(self, inputs: dict[str, Any]) -> torch.Tensor:
        """The episodes of this pass that have tokens in the loss (a group that dynamic sampling
        dropped has none: :mod:`hoprl.training.rollout`), as row indices, up to the :attr:`rows`
        the step has left to score."""
        rows = torch.nonzero(loss_mask(inputs).sum(-1) > 0).flatten()
        return rows if self.rows is None else rows[: max(self.rows - self.scored, 0)]

    @torch.no_grad()
    def reference_logps(self, trainer: Any, inputs: dict[str, Any], rows: torch.Tensor) -> torch.Tensor:
        """The frozen copy's log-probs of the completion tokens of episodes ``rows``."""
        prompt, completion = inputs["prompt_ids"][rows], inputs["completion_ids"][rows]
        ids = torch.cat([prompt, completion], dim=1)
        attention = torch.cat([inputs["prompt_mask"][rows], inputs["completion_mask"][rows]], dim=1)
        scored = loss_mask(inputs)[rows]  # the policy's tokens only, as the loss
        logps, _ = policy_token_logps(
            self.frozen, ids, attention, completion.size(1), scored, autocast=trainer.accelerator.autocast
        )
        return logps


def warm_start_kl(
    trainer: Any,
    inputs: dict[str, Any],
    policy_logps: torch.Tensor,
    measure: WarmStartKL | None,
    last_pass: bool = True,
) -> dict[str, float]:
    """The step's ``warm_start_kl/*`` (module docstring): from TRL's reference log-probs when it has
    them (``beta > 0``, every pass), else from ``measure``'s frozen copy on the first
    :attr:`WarmStartKL.rows` episodes of the step, summed over its passes and logged at its
    ``last_pass``; ``{}`` when neither is there and at a step's other passes."""
    reference = inputs.get("ref_per_token_logps")
    if reference is not None:
        mask = loss_mask(inputs)
        sums = kl_sums(policy_logps.detach(), reference, mask)
        return kl_figures(trainer, torch.tensor(sums, device=mask.device), 0.0)
    if measure is None:
        return {}
    start = time.perf_counter()
    rows = measure.scored_rows(inputs)
    if rows.numel():
        reference = measure.reference_logps(trainer, inputs, rows)
        if trainer.state.global_step == 0:  # the warm start's own samples
            measure.keep(inputs, rows, reference)
        pass_sums = kl_sums(policy_logps[rows].detach(), reference, loss_mask(inputs)[rows])
        added = [*pass_sums, time.perf_counter() - start]
        measure.sums = [a + b for a, b in zip(measure.sums, added, strict=True)]
        measure.scored += rows.numel()
    if not last_pass:
        return {}
    # every process logs at its step's last pass, so each joins the reduce there, with zero sums
    # when none of its episodes was in the loss (every group dropped), or the others would wait
    *step_sums, seconds = measure.sums
    measure.sums, measure.scored = [0.0, 0.0, 0.0, 0.0], 0
    return kl_figures(trainer, torch.tensor(step_sums, device=policy_logps.device), seconds)


def kl_figures(trainer: Any, sums: torch.Tensor, seconds: float) -> dict[str, float]:
    """``warm_start_kl/k1``, ``k3`` (the means over every process's tokens) and ``forward_s``."""
    k1, k3, tokens = trainer.accelerator.reduce(sums, reduction="sum").tolist()
    timing = {"warm_start_kl/forward_s": seconds}
    if tokens == 0:
        return timing
    return {"warm_start_kl/k1": k1 / tokens, "warm_start_kl/k3": k3 / tokens, **timing}


def probe_kl(trainer: Any, model: Any, measure: WarmStartKL | None) -> dict[str, float]:
    """``warm_start_kl/probe_*`` (module docstring) at the last pass of each optimizer step (the one
    that syncs the gradients; the weights are those of every pass of the step), ``{}`` at its other
    passes: the policy ``model`` scores the probe's tokens in a no-grad pass, set against their
    log-probs under the starting weights. Every process measures at the same calls and the sums
    are reduced, so each process's own probe counts."""
    step = int(trainer.state.global_step)
    if measure is None or step == measure.probe_step or not trainer.accelerator.sync_gradients:
        return {}
    measure.probe_step = step
    start = time.perf_counter()
    sums = torch.zeros(3)
    training = model.training
    model.eval()  # no (LoRA) dropout: the same weights score the same tokens alike every step
    with torch.no_grad():
        for episode in measure.probe:
            logps, _ = policy_token_logps(
                model, episode.ids, episode.attention, episode.mask.size(1), episode.mask,
                autocast=trainer.accelerator.autocast,
            )  # fmt: skip
            # sampled from the starting weights: x = log pi_ref - log pi_theta (KL(start || policy))
            sums += torch.tensor(kl_sums(episode.reference, logps, episode.mask))
    model.train(training)
    k1, k3, tokens = trainer.accelerator.reduce(sums.to(trainer.accelerator.device), reduction="sum").tolist()
    timing = {"warm_start_kl/probe_s": time.perf_counter() - start}
    if tokens == 0:
        return timing
    return {"warm_start_kl/probe_k1": k1 / tokens, "warm_start_kl/probe_k3": k3 / tokens,
            "warm_start_kl/probe_tokens": tokens, **timing}  # fmt: skip
