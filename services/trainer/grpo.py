"""GRPO / DAPO / Dr.GRPO through TRL, with multi-turn agent rollouts and ARENA's k2 KL.

TRL does the optimisation; this module only configures it:

- generation is :class:`~services.trainer.rollout.AgentRollout` (TRL's ``rollout_func``): the
  recipe's agent loop against the retriever, with the current weights, and ``env_mask`` = 0 on
  injected tokens, so they never enter the loss;
- the rewards are the recipe's ``reward_funcs()``, weighted by its ``reward_weights`` (TRL logs each);
- ``loss_type`` is the objective (``grpo``, ``dapo``, ``dr_grpo``), with ``epsilon`` /
  ``epsilon_high`` (R2AG: 0.2 / 0.28) and ``beta`` (0 = no KL, no reference model);
- :class:`HoprlGRPOTrainer` swaps TRL's k3 KL estimator for ARENA's k2 when asked.

**The k2 estimator.** TRL adds ``beta * k3`` with ``k3 = exp(r - l) - (r - l) - 1`` (``l`` the
policy's token log-prob, ``r`` the reference's), which grows like ``exp(r - l)`` when the policy
puts almost no mass on a sampled token. ARENA uses ``k2 = ½ (l - r)²`` instead (Schulman, 2020,
"Approximating KL divergence"), quadratic in the log-ratio. The subclass leaves TRL's loss
computation as it is, with the KL switched off for the duration of that call (``beta`` stays
non-zero everywhere else, so TRL still computes the reference log-probs), and adds
``beta * mean_masked(k2)`` to it, using the policy log-probs TRL computed in that same forward
pass. The k2 term is averaged over mask-1 tokens per sequence and then over sequences (the
``grpo`` aggregation) for every loss type, and divided by the gradient-accumulation steps like
TRL's loss; it is logged as ``kl`` (the k2 value).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from hoprl.schemas import Question
from services.trainer.hardware import accelerator_args
from services.trainer.protocol import Hyperparameters, reward_scaling
from services.trainer.rollout import AgentRollout

log = logging.getLogger("hoprl.trainer")


def k2_kl(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """Per-token k2 estimator ``½ (log πθ - log πref)²``.

    >>> float(k2_kl(torch.tensor([-1.0]), torch.tensor([-3.0])))
    2.0
    """
    return 0.5 * (logps - ref_logps) ** 2


def masked_sequence_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over mask-1 tokens of each row, then over rows (rows without such tokens count 0)."""
    return ((values * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()


class HoprlGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer with ``kl_estimator="k2"`` available (see the module docstring)."""

    def __init__(self, *args: Any, kl_estimator: str = "k3", **kwargs: Any) -> None:
        if kl_estimator not in ("k3", "k2"):
            raise ValueError(f"kl_estimator must be 'k3' or 'k2', got {kl_estimator!r}")
        self.kl_estimator = kl_estimator
        self._policy_logps: torch.Tensor | None = None
        super().__init__(*args, **kwargs)

    def _get_per_token_logps_and_entropies(self, model: Any, *args: Any, **kwargs: Any) -> Any:
        out = super()._get_per_token_logps_and_entropies(model, *args, **kwargs)
        if kwargs.get("compute_entropy"):  # the policy's own forward pass inside the loss
            self._policy_logps = out[0]
        return out

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        if self.kl_estimator == "k3" or self.beta == 0.0:
            return super()._compute_loss(model, inputs)
        beta, self.beta = self.beta, 0.0
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            self.beta = beta
        assert self._policy_logps is not None, "TRL computed no policy log-probs in the loss"
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        kl = masked_sequence_mean(k2_kl(self._policy_logps, inputs["ref_per_token_logps"]), mask)
        mode = "train" if model.training else "eval"
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        self._metrics[mode]["kl"].append(self.accelerator.gather(kl.detach()).nanmean().item())
        return loss + beta * kl / accumulation


def grpo_config(
    hp: Hyperparameters,
    objective: str,
    steps: int,
    output_dir: str,
    seed: int,
    reward_weights: list[float] | None = None,
) -> GRPOConfig:
    """TRL's config from resolved hyperparameters: one generation batch per optimizer step.

    ``reward_weights``: the recipe's (``hoprl.recipes.reward_weights``); without them TRL would sum
    every reward function, including EVO-RAG's and R2AG's logging-only per-signal rewards.
    """
    return GRPOConfig(
        output_dir=output_dir,
        reward_weights=reward_weights,
        max_steps=steps,
        learning_rate=hp.learning_rate or 1e-5,
        lr_scheduler_type=hp.lr_scheduler,
        per_device_train_batch_size=hp.questions_per_step * hp.num_generations,
        num_generations=hp.num_generations,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        loss_type=objective,
        scale_rewards=reward_scaling(hp, objective),
        beta=hp.beta or 0.0,
        epsilon=hp.epsilon or 0.2,
        epsilon_high=hp.epsilon_high,
        max_completion_length=hp.token_budget,
        temperature=hp.temperature,
        logging_steps=1,
        save_strategy="steps",
        save_steps=hp.save_steps,
        report_to=hp.report_to or "none",
        seed=seed,
        data_seed=seed,
        **accelerator_args(),
        disable_tqdm=True,
        dataloader_num_workers=0,
        remove_unused_columns=False,
    )


def prompts_dataset(questions: list[Question]) -> Dataset:
    """One row per question; the prompt is the question text (the rollout finds the question by it)."""
    return Dataset.from_dict({"prompt": [q.question for q in questions]})


def build_grpo(
    model: Any,
    tokenizer: Any,
    rollout: AgentRollout,
    questions: list[Question],
    config: GRPOConfig,
    kl_estimator: str = "k3",
    callbacks: list[Any] | None = None,
) -> HoprlGRPOTrainer:
    """The trainer for one job; ``trainer.train(resume_from_checkpoint=...)`` runs it."""
    return HoprlGRPOTrainer(
        model=model,
        reward_funcs=rollout.reward_funcs,
        args=config,
        train_dataset=prompts_dataset(questions),
        processing_class=tokenizer,
        rollout_func=rollout,
        callbacks=callbacks,
        kl_estimator=kl_estimator,
    )
