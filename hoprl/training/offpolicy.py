"""PPO and DPO jobs: EVO-RAG's other two objectives, on the rollouts GRPO trains on; and
EVO-RAG's GRPO over sibling candidates.

:class:`OffPolicyTrainer` is the job loop for ``objective: "ppo"`` and ``"dpo"``, and for the
GRPO family with ``advantage: "siblings"`` (:mod:`hoprl.training.siblings`: one episode per
question with ``num_generations`` candidates at every step, rows and advantages per sibling
group, one clipped-loss step; with ``episodes_from``, the siblings a sibling run stored). Each step:

1. **episodes**: either fresh rollouts, collected exactly as the GRPO path collects them
   (:meth:`AgentRollout.collect <hoprl.training.rollout.AgentRollout.collect>`: the recipe's
   agent loop against the retriever, ``questions_per_step`` questions x ``num_generations``
   samples, with the *current* weights), or, with the hyperparameter ``episodes_from: <run id>``,
   the episodes that run stored at the same step (its steps are cycled when this job runs
   longer). Training PPO or DPO on a GRPO run's stored episodes is what "GRPO, PPO and DPO
   compared on identical rollouts" means: same episodes, same batches, same order.
2. **score**: the recipe's reward functions, as GRPO scores them (EVO-RAG:
   :func:`~hoprl.recipes.evo_rag.score_episode` with the recipe's judge: the rules judge, or the
   judge service when ``TRAINER_JUDGE_URL`` is set). Stored episodes are already scored.
3. **record**: the episodes and their rewards go to the registry under this run at this step
   (idempotent on run, step, question, sample, so a resumed step writes nothing twice).
4. **update**: PPO: one :func:`~hoprl.training.ppo.ppo_step` (GAE over EVO-RAG's step
   rewards, a critic: by default a separate value model at its own learning rate, clipped
   objective); DPO: :func:`~hoprl.training.dpo.build_pairs` on the
   step's episodes, then one TRL DPO step on all its pairs (no pair with a margin above
   ``pair_delta``: the step is logged with ``pairs = 0`` and no update).
5. **preference model** (EVO-RAG, ``preference_model`` on): one
   :meth:`~hoprl.training.preference_learning.PreferenceLearner.step` on the step's sibling pairs; its
   ``preference/*`` metrics (held-back ``preference/eval_accuracy``) join the step's metrics.

The policy, the optimizer (and PPO's value head, DPO's frozen reference = the starting weights)
live for the whole job, which is why the loop calls ``ppo_step`` / a per-step TRL ``DPOTrainer``
rather than :func:`~hoprl.training.ppo.train_ppo` / :func:`~hoprl.training.dpo.train_dpo`:
those load a model from disk and start a fresh Adam on every call.

Metrics go to the registry every step; checkpoints (every ``save_steps`` and at the end) use the
GRPO path's layout (:func:`~hoprl.training.callbacks.save_loop_checkpoint`), so the checkpoints
table, resume after a kill, and serving a checkpoint work the same. EVO-RAG's stage switch is
checked on the dev split at each checkpoint, as in the GRPO path.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import random
import time
from pathlib import Path
from typing import Any

import torch
from transformers import set_seed
from trl.trainer.utils import disable_dropout_in_model

from hoprl.clients.retriever import AsyncRetrieverClient
from hoprl.domain import Episode, Question
from hoprl.generation.chat import EngineChat
from hoprl.recipes.scoring import score
from hoprl.registry.store import Registry
from hoprl.schemas.trainer import Hyperparameters, JobRequest
from hoprl.training.callbacks import Curricula, load_loop_checkpoint, save_loop_checkpoint
from hoprl.training.dpo import DPOJobConfig, build_pairs, dpo_trainer, sibling_pairs
from hoprl.training.optimizer import adamw
from hoprl.training.policy_loss import clipped_loss
from hoprl.training.ppo import (
    PPOConfig,
    PPOSample,
    load_critic,
    make_critic,
    ppo_optimizer,
    ppo_step,
    save_critic,
)
from hoprl.training.preference_learning import preference_learner
from hoprl.training.rollout import (
    AgentRollout,
    RolloutOptions,
    TrainingEngine,
    episode_stats,
    generation_mode,
)
from hoprl.training.siblings import run_sibling_episodes, sibling_rows

log = logging.getLogger("hoprl.trainer")

#: the recipes whose step rewards PPO's GAE and DPO's prefix returns are defined over
STEP_REWARD_RECIPES = ("evo-rag",)


class OffPolicyTrainer:
    """The PPO / DPO job loop (module doc); ``train(resume_from_checkpoint=...)`` like TRL's."""

    def __init__(
        self,
        objective: str,
        request: JobRequest,
        hp: Hyperparameters,
        recipe: Any,
        model: Any,
        tokenizer: Any,
        train: list[Question],
        dev: list[Question],
        opts: RolloutOptions,
        registry: Registry,
        run_id: str,
        output_dir: str,
    ) -> None:
        # EVO-RAG's GRPO over sibling candidates (siblings.py) is this loop too
        self.siblings = objective in ("grpo", "dapo", "dr_grpo") and hp.advantage == "siblings"
        if objective not in ("ppo", "dpo") and not self.siblings:
            raise ValueError(f"objective must be 'ppo' or 'dpo' (or GRPO with siblings), got {objective!r}")
        if self.siblings and hp.beta:
            raise ValueError("sibling GRPO has no KL term (EVO-RAG App. C Table 10: KL coef 0.0); set beta 0")
        if recipe.name not in STEP_REWARD_RECIPES:
            raise ValueError(
                f"{objective} needs step rewards, which recipe {recipe.name!r} does not define; "
                f"use one of {STEP_REWARD_RECIPES} or a GRPO-family objective"
            )
        self.objective, self.request, self.hp, self.recipe = objective, request, hp, recipe
        # DPO's pairs from sibling candidates (App. A.4), rolled out as the sibling GRPO's are
        self.dpo_siblings = objective == "dpo" and hp.dpo_pairs != "prefixes"
        self.loop = f"siblings-{objective}" if self.siblings else objective  # the checkpoints' loop name
        self.model, self.tokenizer, self.train_questions = model, tokenizer, train
        self.registry, self.run_id, self.output_dir = registry, run_id, output_dir
        self.rollout = AgentRollout(recipe, train, opts)
        self.rollout.engine = TrainingEngine(model, tokenizer)
        self.curricula = Curricula(recipe, dev_return=lambda: self.rollout.evaluate(dev))
        self.stored = stored_episodes(registry, hp.episodes_from) if hp.episodes_from else None
        # the frozen starting weights: DPO's reference, and PPO's when it has a KL penalty
        needs_ref = objective == "dpo" or bool(hp.beta)
        self.ref: Any = copy.deepcopy(model).eval().requires_grad_(False) if needs_ref else None
        lr = hp.learning_rate or (1e-5 if objective == "ppo" else 1e-6)
        if self.siblings:
            disable_dropout_in_model(model)
        elif objective == "ppo":
            disable_dropout_in_model(model)
            self.ppo = PPOConfig(
                learning_rate=lr,
                critic=hp.critic or "separate",
                critic_model=None if hp.critic_model == "policy" else hp.critic_model,
                critic_learning_rate=hp.critic_learning_rate or 1e-5,
                kl_coef=hp.beta or 0.0,
                temperature=hp.temperature,
                batch_size=hp.questions_per_step * hp.num_generations,
                mini_batch_size=hp.mini_batch_size or 4,
                seed=request.seed,
            )
            # a ValueModel (its own network: critic_model's, else a copy of the policy's) or a ValueHead
            self.value_head = make_critic(model, self.ppo.critic, self.ppo.critic_model, tokenizer)
            self.value_head.to(next(model.parameters()).device)
        elif objective == "dpo":
            self.dpo = DPOJobConfig(
                delta=hp.pair_delta,
                beta=hp.beta or 0.1,
                steps=1,
                learning_rate=lr,
                seed=request.seed,
                max_length=hp.token_budget + 1024,
            )
        self.optimizer = (
            ppo_optimizer(model, self.value_head, self.ppo)
            if objective == "ppo"
            else adamw(("policy", model.parameters(), lr))
        )
        self.preference = preference_learner(hp, recipe, request.seed)  # EVO-RAG's Algorithm 1
        self.branches: list[Episode] = []  # the last sibling step's scored branches
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda _: 1.0)

    @property
    def sibling_rollouts(self) -> bool:
        """One episode per question with sibling candidates at every step (sibling GRPO, DPO)."""
        return self.siblings or self.dpo_siblings

    # -- the loop -------------------------------------------------------------------------------

    def train(self, resume_from_checkpoint: str | None = None) -> None:
        start = 0
        set_seed(self.request.seed)  # a resumed job restores the RNG state of its checkpoint below
        if resume_from_checkpoint is not None:
            state = load_loop_checkpoint(resume_from_checkpoint, self.model, self.optimizer, self.loop)
            start = int(state["step"])
            self.curricula.restore(state.get("curriculum"))
            if self.objective == "ppo" and start:
                critic = load_critic(resume_from_checkpoint, self.model, self.ppo.critic)
                assert critic is not None, f"{resume_from_checkpoint} holds no {self.ppo.critic} critic"
                self.value_head.load_state_dict(critic.state_dict())
            if self.preference is not None:
                self.preference.restore(resume_from_checkpoint)
        if self.curricula.stage is not None and self.registry.current_stage(self.run_id) is None:
            self.registry.start_stage(self.run_id, self.curricula.stage, start)
        for step in range(start + 1, self.request.steps + 1):
            began = time.perf_counter()
            episodes, timings = self.episodes(step)
            metrics = self.update(episodes) | timings
            if self.preference is not None:  # sibling GRPO: its candidates are the preference siblings
                metrics |= self.preference.step(self.branches if self.sibling_rollouts else episodes)
            metrics |= {"step_time": time.perf_counter() - began, "step": float(step)}
            self.registry.log_metrics(self.run_id, step, metrics)
            shown = {
                k: round(v, 4) for k, v in metrics.items() if k in ("reward", "loss", "pairs", "step_time")
            }
            log.info("%s step %d/%d: %s", self.objective, step, self.request.steps, shown)
            if step % self.hp.save_steps == 0 or step == self.request.steps:
                self.save(step)

    def episodes(self, step: int) -> tuple[list[Episode], dict[str, float]]:
        """The step's scored episodes (fresh or stored), written to the registry under this run."""
        began = time.perf_counter()
        if self.stored is not None:
            steps = sorted(self.stored)
            rows = self.stored[steps[(step - 1) % len(steps)]]
            episodes = [ep for ep, _ in rows]
            self.registry.write_episodes(self.run_id, step, episodes, [r for _, r in rows])
            return episodes, {"reward": mean([float(r["total"]) for _, r in rows if "total" in r])}
        rng = random.Random(f"{self.request.seed}:{step}")  # the same draw when a resumed job replays it
        groups = rng.sample(self.train_questions, self.hp.questions_per_step)
        if self.hp.rollout_seed:  # each episode samples from this seed plus its index (run_episode)
            self.rollout.opts.sampling["seed"] = rng.randrange(2**31)
        if self.sibling_rollouts:
            return self.sibling_episodes(step, groups, began)
        weights = [1.0] + [0.0] * (len(self.rollout.reward_funcs) - 1)  # the recipe's total; the rest log
        engine = self.rollout.engine
        assert engine is not None
        with generation_mode(self.model, self.rollout.opts.torch_threads):
            episodes, _, per, totals = asyncio.run(self.rollout.collect(groups, engine, None, weights))
        self.registry.write_episodes(
            self.run_id, step, episodes, [{**p, "total": t} for p, t in zip(per, totals, strict=True)]
        )
        stats = {"rollout_s": time.perf_counter() - began, "reward": mean(totals)}
        return episodes, stats | episode_stats(episodes, self.tokenizer)

    def sibling_episodes(self, step: int, groups: list[Question], began: float) -> tuple[list[Episode], dict[str, float]]:  # fmt: skip # noqa: E501
        """One episode per question with its siblings at every step (EVO-RAG Table 10: n = 1)."""
        engine = self.rollout.engine
        assert engine is not None
        opts = self.rollout.opts

        async def run() -> list[Episode]:
            retriever = AsyncRetrieverClient(opts.retriever_url)
            try:
                return await run_sibling_episodes(self.recipe, groups, EngineChat(engine), retriever,
                                                  opts.collection, k=opts.num_generations,
                                                  concurrency=opts.concurrency, shape=opts.shape,
                                                  **opts.sampling)  # fmt: skip
            finally:
                await retriever.aclose()

        with generation_mode(self.model, opts.torch_threads):
            episodes = asyncio.run(run())
        weights = [1.0] + [0.0] * (len(self.rollout.reward_funcs) - 1)  # the recipe's total; the rest log
        per, totals = score(self.rollout.reward_funcs, weights, episodes, groups)
        self.registry.write_episodes(
            self.run_id, step, episodes, [{**p, "total": t} for p, t in zip(per, totals, strict=True)]
        )
        stats = {"rollout_s": time.perf_counter() - began, "reward": mean(totals)}
        return episodes, stats | episode_stats(episodes, self.tokenizer)

    def update(self, episodes: list[Episode]) -> dict[str, float]:
        self.model.train()
        if self.siblings:
            rows, advantages, counts, self.branches = sibling_rows(episodes, self.recipe, self.tokenizer)
            if not rows:
                return counts
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
            eps = self.hp.epsilon or 0.2
            loss = clipped_loss(self.model, rows, advantages, pad, temperature=self.hp.temperature,
                                eps_low=eps, eps_high=self.hp.epsilon_high or eps, loss_type=self.objective,
                                max_tokens=self.hp.max_new_tokens_per_step)  # fmt: skip
            self.optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
            return counts | {"loss": float(loss.item())}
        if self.objective == "ppo":
            # A step with no text has no token to carry its reward (e.g. an immediate end-of-text).
            usable = [e for e in episodes if e.steps and all(s.text for s in e.steps)]
            samples = [PPOSample.from_episode(e, self.tokenizer, self.recipe.config) for e in usable]
            if not samples:
                return {"ppo/skipped": float(len(episodes))}
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
            stats = ppo_step(self.model, self.value_head, self.ref, self.optimizer, samples, self.ppo, pad)
            return stats | {"ppo/skipped": float(len(episodes) - len(usable))}
        if self.dpo_siblings:
            built, self.branches = sibling_pairs(episodes, self.recipe, self.dpo.delta)
        else:
            built = build_pairs(episodes, self.dpo.delta, self.recipe.config)
        pairs = [p for p in built if all(p[side][0]["content"].strip() for side in ("chosen", "rejected"))]
        if not pairs:
            return {"pairs": 0.0}
        config = self.dpo.model_copy(update={"batch_size": len(pairs)})
        trainer = dpo_trainer(
            self.model,
            self.tokenizer,
            pairs,
            config,
            self.output_dir,
            self.ref,
            (self.optimizer, self.scheduler),
        )
        trainer.train()
        logged = next(h for h in reversed(trainer.state.log_history) if "loss" in h)
        return {k: float(v) for k, v in logged.items() if isinstance(v, int | float) and k != "step"} | {
            "pairs": float(len(pairs))
        }

    def save(self, step: int) -> None:
        switch = self.curricula.on_checkpoint()
        if switch is not None:
            log.info("stage switch at step %d: %s", step, switch)
            self.registry.record_stage_switch(self.run_id, step, **switch)
        state = {"loop": self.loop, "stage": self.curricula.stage, "curriculum": self.curricula.state()}

        def extra(folder: Path) -> None:
            if self.objective == "ppo":
                save_critic(self.value_head, folder)
            if self.preference is not None:
                self.preference.save(folder)

        save_loop_checkpoint(
            self.output_dir,
            step,
            self.model,
            self.tokenizer,
            self.optimizer,
            self.registry,
            self.run_id,
            state,
            extra,
        )


def stored_episodes(registry: Registry, run_id: str) -> dict[int, list[tuple[Episode, dict[str, Any]]]]:
    """Another run's stored episodes and rewards by step (what ``episodes_from`` trains on)."""
    if registry.get_run(run_id) is None:
        raise ValueError(f"episodes_from={run_id!r} is not a run in the registry")
    by_step: dict[int, list[tuple[Episode, dict[str, Any]]]] = {}
    for row in registry.episodes(run_id):
        by_step.setdefault(row.step, []).append((Episode.model_validate(row.trajectory), dict(row.rewards)))
    if not by_step:
        raise ValueError(f"run {run_id!r} stored no episodes; train it (or collect rollouts) first")
    return by_step


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
