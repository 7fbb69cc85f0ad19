"""GRPO / DAPO / Dr.GRPO through TRL, with multi-turn agent rollouts and ARENA's k2 KL.

TRL does the optimisation; this module only configures it:

- generation is :class:`~hoprl.training.rollout.AgentRollout` (TRL's ``rollout_func``): the
  recipe's agent loop against the retriever, with the current weights, and ``env_mask`` = 0 on
  injected tokens, so they never enter the loss;
- the rewards are the recipe's ``reward_funcs()``, weighted by its ``reward_weights`` (TRL logs each);
- ``loss_type`` is the objective (``grpo``, ``dapo``, ``dr_grpo``), with ``epsilon`` /
  ``epsilon_high`` (R2AG: 0.2 / 0.28) and ``beta`` (0 = no KL, no reference model);
- :class:`HoprlGRPOTrainer` swaps TRL's k3 KL estimator for ARENA's k2 when asked, and gives
  EVO-RAG's per-step-index advantages (``advantage="per_step"``, below; the paper's sibling
  normalisation, EVO-RAG's default, is :mod:`hoprl.training.siblings`);
- what it logs beyond TRL (:mod:`hoprl.training.signals`): TRL's EOS-based ``completions/clipped_ratio``
  and terminated lengths recomputed from the episodes, and the KL to the job's starting weights
  (``warm_start_kl/*``) at any beta.

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

**Per-step advantages (EVO-RAG, an option).** TRL turns each completion's total reward into one
advantage, ``(R_i - mean_group R) / std_group R``, and gives it to every token of the completion.
This option normalises the *step* rewards ``r~_t = R_t = sum_k w_k(t) r_k(t)`` per step index
across the group's independent episodes instead (the project's earlier reading of EVO-RAG §3.4;
the paper normalises over sibling candidates of one state: :mod:`hoprl.training.siblings`): for
episode ``i`` of a group and its step ``t``::

    A_{i,t} = (R_{i,t} - mu_t) / (sigma_t + 1e-4)     mu_t, sigma_t over the group's episodes
                                                      that have a step t (TRL's mean and std)

(``scale_rewards="none"`` drops the division; ``"batch"`` takes ``sigma_t`` over the whole batch;
a step index only one episode reached gets 0). Step ``t``'s policy tokens (the ``t``-th run of
mask-1 tokens, counting steps with text) all get ``A_{i,t}``; injected and template tokens get 0.
TRL's loss accepts advantages of shape ``(B, T)`` from a subclass, so the override only replaces
``advantages`` in the batch :meth:`_generate_and_score_completions` returns; the clipped loss,
KL and aggregation stay TRL's. ``advantage="sequence"`` keeps TRL's per-completion advantages.

**The placebo (``placebo=True``).** The control arm of a learning check: every step's rewards are
permuted across the whole batch (rows of TRL's per-function rewards, or the episodes' step rewards
under ``advantage="per_step"``) before any advantage is computed, by a permutation drawn from the
job's seed and the step (:func:`placebo_order`). The update then has the real run's size, its
reward distribution and its samples, but no link between what an episode did and what it was paid,
so a gain the placebo also shows did not come from the reward. Rollouts, dynamic sampling and the
registry's episode records keep the real rewards.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import nanstd

from hoprl.domain import Episode, Question
from hoprl.jobspec import reward_scaling
from hoprl.schemas.trainer import Hyperparameters
from hoprl.training.hardware import common_args, per_process
from hoprl.training.policy_head import loss_mask, policy_token_logps, score_compactly
from hoprl.training.rollout import AgentRollout
from hoprl.training.signals import WarmStartKL, probe_kl, replace_completion_metrics, warm_start_kl

log = logging.getLogger("hoprl.trainer")

#: where ``trl vllm-serve`` listens by default (server mode without vllm_server_url)
DEFAULT_VLLM_SERVER = "http://127.0.0.1:8000"


def k2_kl(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """Per-token k2 estimator ``½ (log πθ - log πref)²``.

    >>> float(k2_kl(torch.tensor([-1.0]), torch.tensor([-3.0])))
    2.0
    """
    return 0.5 * (logps - ref_logps) ** 2


def masked_sequence_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over mask-1 tokens of each row, then over rows (rows without such tokens count 0)."""
    return ((values * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()


def step_advantages(
    rewards: Sequence[Sequence[float]], group_size: int, scale: str = "group"
) -> torch.Tensor:
    """Per-step group-normalised advantages ``[episodes, max steps]`` (module docstring).

    ``rewards[i]`` are episode ``i``'s step rewards; consecutive runs of ``group_size`` episodes
    are groups. Entries past an episode's last step are 0.

    >>> step_advantages([[1.0, 2.0], [3.0]], group_size=2, scale="none").tolist()
    [[-1.0, 0.0], [1.0, 0.0]]
    """
    if len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} episodes is not a whole number of groups of {group_size}")
    width = max((len(r) for r in rewards), default=0)
    table = torch.full((len(rewards), max(width, 1)), float("nan"))
    for i, r in enumerate(rewards):
        table[i, : len(r)] = torch.tensor(list(r), dtype=torch.float32)
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}")
    grouped = table.view(-1, group_size, table.shape[1])  # [groups, group_size, steps]
    centred = grouped - torch.nanmean(grouped, dim=1, keepdim=True)
    if scale == "group":
        centred = centred / (nanstd(grouped, dim=1, keepdim=True) + 1e-4)
    advantages = centred.reshape(table.shape)
    if scale == "batch":
        advantages = advantages / (nanstd(table, dim=0, keepdim=True) + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0)


def token_advantages(
    advantages: torch.Tensor, episodes: Sequence[Episode], mask: torch.Tensor
) -> torch.Tensor:
    """Spread step advantages ``[B, steps]`` over tokens ``[B, T]``: step ``t``'s policy tokens (the
    ``k``-th run of 1s in ``mask`` for the ``k``-th step with text) get ``advantages[i, t-1]``;
    every mask-0 token gets 0. A row with no policy token (TRL masked it) stays 0."""
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    for i, episode in enumerate(episodes):
        row = mask[i].bool().tolist()
        starts = [j for j, on in enumerate(row) if on and (j == 0 or not row[j - 1])]
        owners = [t for t, step in enumerate(episode.steps) if step.text]
        if not starts:
            continue
        if len(starts) != len(owners):
            raise ValueError(
                f"episode {episode.question_id!r} #{episode.sample}: {len(owners)} steps with text but "
                f"{len(starts)} runs of policy tokens; tokens must come from to_token_trajectory"
            )
        ends = [*starts[1:], len(row)]
        for t, start, end in zip(owners, starts, ends, strict=True):
            run = mask[i, start:end].float()
            out[i, start:end] = run * float(advantages[i, t])
    return out


def placebo_order(n: int, seed: int, step: int) -> list[int]:
    """The placebo's permutation of a batch of ``n`` rows at optimizer step ``step``: drawn from
    ``seed`` and ``step`` alone, so every process (and a resumed job) draws the same one."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return [int(i) for i in torch.randperm(n, generator=generator)]


class HoprlGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer with ``kl_estimator="k2"`` and ``advantage="per_step"`` (module docstring).

    Args:
        step_rewards: ``episode -> [R_1, ..., R_T]`` of a scored episode (``EvoRag.step_rewards``);
            required by ``advantage="per_step"``, which reads the episodes of the rollout
            (``rollout_func.last_episodes``, in batch order).
        warm_start: measures the KL to the starting weights at ``beta == 0`` (``warm_start_kl/*``).
    """

    #: the loss's log-probs at the policy's tokens only (:mod:`hoprl.training.policy_head`); False
    #: keeps TRL's every-position computation (``bench/rl_step.py``'s before/after)
    policy_tokens_only = True

    def __init__(
        self,
        *args: Any,
        kl_estimator: str = "k3",
        advantage: str = "sequence",
        step_rewards: Callable[[Episode], list[float]] | None = None,
        placebo: bool = False,
        warm_start: WarmStartKL | None = None,
        **kwargs: Any,
    ) -> None:
        if kl_estimator not in ("k3", "k2"):
            raise ValueError(f"kl_estimator must be 'k3' or 'k2', got {kl_estimator!r}")
        if advantage not in ("sequence", "per_step"):
            raise ValueError(f"advantage must be 'sequence' or 'per_step', got {advantage!r}")
        if advantage == "per_step" and step_rewards is None:
            raise ValueError("advantage='per_step' needs a recipe with step rewards (evo-rag)")
        self.kl_estimator, self.advantage, self.step_rewards = kl_estimator, advantage, step_rewards
        self.placebo = placebo
        self._policy_logps: torch.Tensor | None = None
        self._score_mask: torch.Tensor | None = None  # the loss's policy tokens, while it runs
        self.preference: Any = None  # EVO-RAG's PreferenceLearner, set by the job (services.trainer.jobs)
        super().__init__(*args, **kwargs)
        if self.policy_tokens_only:
            score_compactly()  # the fused LM head scores labelled positions only (hoprl.training.policy_head)
        self.warm_start = warm_start
        if warm_start is not None:
            warm_start.prepare(self)

    def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
        output: dict[str, Any] = super()._generate_and_score_completions(inputs)
        agent: Any = self.rollout_func  # an AgentRollout: TRL's completion metrics from its episodes
        policy: Any = self.model
        metrics = self._metrics["train" if policy.training else "eval"]
        policy_mask = loss_mask(output)
        if getattr(agent, "last_episodes", None) is not None:  # token rows without episodes keep TRL's
            replace_completion_metrics(metrics, agent.last_episodes, policy_mask, self.accelerator.gather)
        if self.advantage == "per_step" and self.step_rewards is not None:
            rollout: Any = self.rollout_func  # an AgentRollout: the batch's episodes, in order
            episodes = rollout.last_episodes
            rewards = [self.step_rewards(e) for e in episodes]
            if self.placebo:
                rewards = [rewards[i] for i in self.placebo_rows(len(rewards))]
            per_step = step_advantages(rewards, int(self.num_generations or 1), self.scale_rewards)
            output["advantages"] = token_advantages(per_step, episodes, policy_mask).to(
                output["advantages"].dtype
            )
        return output

    def placebo_rows(self, n: int) -> list[int]:
        """This step's placebo permutation of ``n`` rows (:func:`placebo_order`)."""
        return placebo_order(n, int(self.args.seed), int(self.state.global_step) + 1)

    def _calculate_rewards(self, inputs: Any, prompts: Any, completions: Any, ids: Any) -> Any:
        rewards = super()._calculate_rewards(inputs, prompts, completions, ids)
        if not self.placebo:
            return rewards
        self._metrics["train"]["placebo"].append(1.0)
        return rewards[torch.tensor(self.placebo_rows(rewards.shape[0]), device=rewards.device)]

    def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> torch.Tensor:  # fmt: skip
        loss: torch.Tensor = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if self._policy_logps is not None:  # the loss's own policy log-probs: no extra forward
            mode = "train" if model.training else "eval"
            last = not model.training or self.accelerator.sync_gradients  # the step's last pass
            for name, value in warm_start_kl(self, inputs, self._policy_logps, self.warm_start, last).items():
                self._metrics[mode][name].append(value)
            if model.training:  # the same KL on the first step's episodes, at a step's last pass
                for name, value in probe_kl(self, model, self.warm_start).items():
                    self._metrics[mode][name].append(value)
        return loss

    def _get_per_token_logps_and_entropies(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        batch_size: int | None = None,
        compute_entropy: bool = False,
        compute_aux_loss: bool = False,
        **media: Any,
    ) -> Any:
        if self._score_mask is not None and not compute_aux_loss and all(v is None for v in media.values()):
            # inside the loss, a text model: the policy's tokens only (hoprl.training.policy_head)
            logps, entropies = policy_token_logps(
                model, input_ids, attention_mask, logits_to_keep, self._score_mask, batch_size,
                compute_entropy, self.accelerator.autocast,
            )  # fmt: skip
            out = (logps, entropies, None)
        else:
            out = super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **media,
            )  # fmt: skip
        if compute_entropy:  # the policy's own forward pass inside the loss
            self._policy_logps = out[0]
        return out

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        # the loss reads completion_mask * tool_mask positions only: score just those
        if self.policy_tokens_only and "tool_mask" in inputs:
            self._score_mask = loss_mask(inputs)
        try:
            return self._masked_loss(model, inputs)
        finally:
            self._score_mask = None

    def _masked_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        if self.kl_estimator == "k3" or self.beta == 0.0:
            return super()._compute_loss(model, inputs)
        beta, self.beta = self.beta, 0.0
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            self.beta = beta
        assert self._policy_logps is not None, "TRL computed no policy log-probs in the loss"
        kl = masked_sequence_mean(k2_kl(self._policy_logps, inputs["ref_per_token_logps"]), loss_mask(inputs))
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

    ``micro_batch``: a step's episodes are generated together (one generation batch, TRL's
    ``steps_per_generation``) and trained in passes of ``micro_batch`` whose gradients accumulate
    (``gradient_accumulation_steps``), one optimizer step per generation batch.
    """
    micro, passes = micro_batches(per_process(hp.questions_per_step * hp.num_generations, hp.processes),
                                  hp.micro_batch)  # fmt: skip
    return GRPOConfig(
        reward_weights=reward_weights,
        max_steps=steps,
        learning_rate=hp.learning_rate or 1e-5,
        lr_scheduler_type=hp.lr_scheduler,
        # the step's global batch (questions_per_step groups), split over the job's processes, in
        # passes of micro_batch episodes whose gradients accumulate into one optimizer step
        per_device_train_batch_size=micro,
        num_generations=hp.num_generations,
        gradient_accumulation_steps=passes,
        steps_per_generation=passes,
        **checkpointing(hp),
        loss_type=objective,
        scale_rewards=reward_scaling(hp, objective),
        beta=hp.beta or 0.0,
        epsilon=hp.epsilon or 0.2,
        epsilon_high=hp.epsilon_high,
        max_completion_length=hp.token_budget,
        temperature=hp.temperature,
        save_strategy="steps",
        save_steps=hp.save_steps,
        remove_unused_columns=False,
        **vllm_args(hp),
        **common_args(output_dir, seed, hp.report_to),
    )


def checkpointing(hp: Hyperparameters) -> dict[str, Any]:
    """``gradient_checkpointing`` when the job chooses; TRL's default (on) otherwise."""
    return {} if hp.gradient_checkpointing is None else {"gradient_checkpointing": hp.gradient_checkpointing}


def micro_batches(batch: int, micro_batch: int | None) -> tuple[int, int]:
    """``(episodes per pass, passes)`` for a process's ``batch`` of a step.

    >>> micro_batches(8, 2), micro_batches(8, None)
    ((2, 4), (8, 1))
    """
    micro = min(micro_batch or batch, batch)
    if batch % micro:
        raise ValueError(f"micro_batch {micro_batch} does not divide the step's {batch} episodes a process")
    return micro, batch // micro


def vllm_args(hp: Hyperparameters) -> dict[str, Any]:
    """TRL's vLLM settings for ``generation: vllm`` (none for the transformers engine).

    ``colocate`` runs vLLM inside each training process on its GPU (``vllm_gpu_memory_utilization``
    of it); ``server`` sends generation to a ``trl vllm-serve`` process at ``vllm_server_url``. TRL
    pushes the new weights to vLLM after every optimizer step either way, and with
    ``vllm_importance_sampling_correction`` reweights the loss by the ratio of the trainer's
    log-probs to vLLM's (which the rollout returns for the policy's tokens).
    """
    if hp.generation != "vllm":
        return {}
    args: dict[str, Any] = {
        "use_vllm": True,
        "vllm_mode": hp.vllm_mode,
        "vllm_importance_sampling_correction": hp.vllm_importance_sampling_correction,
    }
    if hp.vllm_mode == "colocate":
        args["vllm_gpu_memory_utilization"] = hp.vllm_gpu_memory_utilization
    else:
        args["vllm_server_base_url"] = hp.vllm_server_url or DEFAULT_VLLM_SERVER
    return args


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
    advantage: str = "sequence",
    placebo: bool = False,
    warm_start_kl: int = 0,
    peft_config: Any = None,
) -> HoprlGRPOTrainer:
    """The trainer for one job; ``trainer.train(resume_from_checkpoint=...)`` runs it.

    ``advantage="per_step"`` takes the step rewards from the rollout's recipe (``step_rewards``).
    ``warm_start_kl``: episodes a step whose KL to ``model``'s weights a frozen copy measures when
    ``config.beta == 0`` (0: none; with ``beta > 0`` TRL's reference is reused on every episode).
    """
    measure = WarmStartKL(model, rows=warm_start_kl) if warm_start_kl and config.beta == 0 else None
    return HoprlGRPOTrainer(
        model=model,
        reward_funcs=rollout.reward_funcs,
        args=config,
        train_dataset=prompts_dataset(questions),
        processing_class=tokenizer,
        rollout_func=rollout,
        callbacks=callbacks,
        kl_estimator=kl_estimator,
        advantage=advantage,
        step_rewards=getattr(rollout.recipe, "step_rewards", None),
        placebo=placebo,
        warm_start=measure,
        peft_config=peft_config,
    )
