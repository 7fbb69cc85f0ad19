"""R2AG's progressive iterative training as its Algorithm 1 runs it (App. B.1, B.2).

The forest and its growth are :mod:`hoprl.recipes.r2ag.forest`; this module is the loop.

**Levels and batches.** ``RR-Forest^0`` holds one tree per training question, the root alone (in
an order shuffled with the job's seed and the epoch). Level ``j`` walks ``RR-Forest^j`` in prompt
batches of ``B = questions_per_step`` trees (the paper: 128, App. B.2); **one batch is one
optimizer step** (Algorithm 1: ``π_old <- π_θ`` at the start of a batch, ``π_θ <- J | O`` at its
end) and one registry step. For every tree of the batch:

1. **expand**: ``G = num_generations`` responses (the paper's group size, 12 per tree at every
   expansion step, App. B.2) are sampled from ``q ⊕ d~^j``: R2AG's prompt with the tree's
   documents as an ``<information>`` block (none at level 0). A response is one policy turn of
   the R2AG protocol run by the agent loop (:class:`TreeRecipe`): its ``<base-Q>`` /
   ``<predicted-Q>`` sub-queries go to the retriever (top-1 each), or it stops.
2. **score**: the Top-Survivor reward (:meth:`R2ag.score`) with the gold titles the tree already
   holds as ``meta["found_titles"]`` (Multi-Hit credits only documents new to the tree; a stop
   before every gold document is found zeroes the reward). **The 4,096-token hard cap** (App. B.2,
   "Overlong Response Length Control"): a response cut at ``max_new_tokens_per_step`` (the paper:
   4,096) is truncated and its reward is 0 (``meta["r2ag"]["zeroed"] = "truncated"``).
3. **train**: a tree's ``G`` responses are a group; ``A_i = (R_i - mean) / (std + 1e-4)``
   (:mod:`hoprl.training.policy_loss`; ``scale_rewards`` as in TRL); a group whose rewards have
   zero spread is dropped (Eq. 6: ``std({R_i}) > 0``). One optimizer step on the clipped
   token-level surrogate (Eq. 6, ``dapo``: ``1 / sum_i |o_i|``; clip 0.2 / 0.28).
4. **grow** (:func:`~hoprl.recipes.r2ag.grow_forest`): each response's tree leaves the forest
   when it holds every gold document and the response stopped; every other one, pruned to its
   gold-hit branches, joins ``RR-Forest^{j+1}``: trees with no gold branch (the root alone) and
   trees whose response stopped early included. Identical trees are kept once.

When ``RR-Forest^j`` is exhausted, level ``j+1`` walks ``RR-Forest^{j+1}``. After ``l_max``
levels (the paper's 5 retrieval iterations, App. B.2) or when the next forest is empty, a new
epoch starts again from ``RR-Forest^0`` (Algorithm 1 returns there; a job may train longer).
The epoch, the level, the forests and the batch cursor are run state: they are saved in every
checkpoint's ``hoprl_state.json`` and restored on resume; each level is a registry stage
(``round1`` .. ``round5``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Any

import torch
from transformers import set_seed

from hoprl.agent.runner import run_episodes
from hoprl.agent.tokens import to_token_trajectory
from hoprl.clients.retriever import AsyncRetrieverClient
from hoprl.domain import Action, Episode, Question, RetrievedDoc, Step
from hoprl.generation.chat import EngineChat
from hoprl.jobspec import reward_scaling
from hoprl.recipes.r2ag import (
    Forest,
    RetrievalTree,
    documents,
    episode_return,
    grow_forest,
    survivors,
    tree_from_dict,
    tree_to_dict,
)
from hoprl.registry.store import Registry
from hoprl.schemas.trainer import Hyperparameters, JobRequest
from hoprl.training.callbacks import Curricula, load_loop_checkpoint, save_loop_checkpoint
from hoprl.training.optimizer import adamw
from hoprl.training.policy_loss import clipped_loss, group_advantages, level_advantages
from hoprl.training.rollout import RolloutOptions, TrainingEngine, generation_mode

log = logging.getLogger("hoprl.trainer")
LOOP = "r2ag-rounds"
__all__ = ["R2agRounds", "cap_reward", "group_advantages", "level_advantages", "tree_from_dict",
           "tree_to_dict"]  # fmt: skip


class TreeRecipe:
    """The R2AG recipe with one tree's prompt and one turn: the agent loop then returns exactly one
    response to that tree."""

    max_steps = 1

    def __init__(self, recipe: Any, messages: list[dict[str, str]]) -> None:
        self.recipe, self._messages = recipe, messages
        self.name, self.stop, self.top_k = recipe.name, recipe.stop, recipe.top_k

    def messages(self, question: Question) -> list[dict[str, str]]:
        return [dict(m) for m in self._messages]

    def parse(self, segment: str) -> Action:
        action: Action = self.recipe.parse(segment)
        return action

    def information(self, docs: list[list[RetrievedDoc]]) -> str:
        text: str = self.recipe.information(docs)
        return text


def tree_messages(recipe: Any, question: Question, tree: RetrievalTree) -> list[dict[str, str]]:
    """``q ⊕ d~``: the recipe's prompt, then the tree's documents as the policy reads retrievals."""
    messages = [dict(m) for m in recipe.messages(question)]
    docs = documents(tree)
    if docs:
        messages[-1]["content"] += "\n\n" + recipe.information([[d] for d in docs])
    return messages


def truncated(episode: Episode) -> bool:
    """The response was cut at its token cap (finish reason ``length``)."""
    return "length" in episode.meta.get("finish_reasons", [])


def cap_reward(episode: Episode) -> Episode:
    """App. B.2: a truncated response earns 0 (its signals are zeroed, the reason recorded)."""
    if truncated(episode):
        for step in episode.steps:
            step.signals = dict.fromkeys(step.signals, 0.0)
        episode.meta["r2ag"] = {**episode.meta.get("r2ag", {}), "zeroed": "truncated"}
    return episode


class R2agRounds:
    """The Algorithm 1 loop (module doc); ``train(resume_from_checkpoint=...)`` like TRL's trainers."""

    def __init__(
        self,
        request: JobRequest,
        hp: Hyperparameters,
        recipe: Any,
        model: Any,
        tokenizer: Any,
        train: list[Question],
        opts: RolloutOptions,
        registry: Registry,
        run_id: str,
        output_dir: str,
    ) -> None:
        self.request, self.hp, self.recipe, self.model, self.tokenizer = request, hp, recipe, model, tokenizer
        self.train_questions, self.opts = train, opts
        self.by_id = {q.id: q for q in train}
        self.registry, self.run_id, self.output_dir = registry, run_id, output_dir
        self.l_max: int = recipe.config.l_max
        self.curricula = Curricula(recipe)  # R2AG has no reward curriculum; its levels are the stages
        self.engine = TrainingEngine(model, tokenizer)
        self.optimizer = adamw(("policy", model.parameters(), hp.learning_rate or 1e-5))
        self.epoch = self.level = self.cursor = 0
        self.forest: Forest = []  # RR-Forest^j
        self.next_forest: Forest = []  # RR-Forest^{j+1}, built batch by batch

    @property
    def stage(self) -> str:
        return f"round{self.level + 1}"

    def new_epoch(self, epoch: int) -> None:
        """``RR-Forest^0``: every training question's root, in a seeded order."""
        order = list(self.train_questions)
        random.Random(f"{self.request.seed}:forest:{epoch}").shuffle(order)
        self.epoch, self.level, self.cursor = epoch, 0, 0
        self.forest = [RetrievalTree.for_question(q) for q in order]
        self.next_forest = []

    def batch(self) -> Forest:
        return self.forest[self.cursor : self.cursor + self.hp.questions_per_step]

    # -- the loop -------------------------------------------------------------------------------

    def train(self, resume_from_checkpoint: str | None = None) -> None:
        start = 0
        set_seed(self.request.seed)  # a resumed job restores the RNG state of its checkpoint below
        self.new_epoch(0)
        if resume_from_checkpoint is not None:
            state = load_loop_checkpoint(resume_from_checkpoint, self.model, self.optimizer, LOOP)
            start = int(state["step"])
            if start:
                self.restore(state)
        if self.registry.current_stage(self.run_id) is None:
            self.registry.start_stage(self.run_id, self.stage, start)
        for step in range(start + 1, self.request.steps + 1):
            before = self.stage
            metrics = self.step(step)
            self.registry.log_metrics(self.run_id, step, metrics)
            shown = {k: round(v, 4) for k, v in metrics.items()}
            log.info("r2ag step %d/%d (%s): %s", step, self.request.steps, before, shown)
            if self.stage != before:
                reason = "next level: the forest grew" if self.level else "forest done: a new epoch"
                trees = float(len(self.forest))
                self.registry.record_stage_switch(
                    self.run_id, step, before, self.stage, reason, metric_name="trees", metric_value=trees
                )
            if step % self.hp.save_steps == 0 or step == self.request.steps:
                save_loop_checkpoint(self.output_dir, step, self.model, self.tokenizer, self.optimizer,
                                     self.registry, self.run_id, self.state())  # fmt: skip

    def step(self, step: int) -> dict[str, float]:
        """One prompt batch: expand, score, record, train, grow (module doc)."""
        began = time.perf_counter()
        trees = self.batch()
        with generation_mode(self.model, self.opts.torch_threads):
            groups = asyncio.run(self.expansions(trees))
        rollout_s = time.perf_counter() - began
        flat = [ep for group in groups for ep in group]
        rewards = [episode_return(ep, self.recipe.config) for ep in flat]
        columns = [{**signal_sums(ep), "total": r} for ep, r in zip(flat, rewards, strict=True)]
        self.registry.write_episodes(self.run_id, step, flat, columns)
        grouped, start = [], 0
        for group in groups:
            grouped.append(rewards[start : start + len(group)])
            start += len(group)
        kept_eps: list[Episode] = []
        kept_adv: list[float] = []
        scaling = reward_scaling(self.hp, self.request.objective)
        advantages = level_advantages(grouped, scaling)
        for group, adv in zip(groups, advantages, strict=True):
            if adv is not None:
                kept_eps += group
                kept_adv += adv
        metrics = {
            "reward": sum(rewards) / len(rewards),
            "round": float(self.level + 1),
            "trees_in_batch": float(len(trees)),
            "groups": float(len(groups)),
            "dynamic/dropped": float(sum(a is None for a in advantages)),
            "truncated": float(sum(truncated(ep) for ep in flat)),
            "rollout_s": rollout_s,
            "step": float(step),
        }
        if kept_eps:
            self.model.train()
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
            loss = clipped_loss(
                self.model, [to_token_trajectory(e, self.tokenizer) for e in kept_eps], kept_adv, pad,
                temperature=self.hp.temperature, eps_low=self.hp.epsilon or 0.2,
                eps_high=self.hp.epsilon_high or self.hp.epsilon or 0.2, loss_type=self.request.objective,
                max_tokens=self.hp.max_new_tokens_per_step,
            )  # fmt: skip
            self.optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
            metrics["loss"] = float(loss.item())
        metrics |= self.grow(trees, groups)
        metrics["step_time"] = time.perf_counter() - began
        return metrics

    async def expansions(self, trees: Forest) -> list[list[Episode]]:
        """Per tree of the batch, its ``G`` scored responses (in batch order)."""
        chat = EngineChat(self.engine)
        retriever = AsyncRetrieverClient(self.opts.retriever_url)
        g = self.opts.num_generations
        cap = self.hp.max_new_tokens_per_step
        # one response per episode: the budget is the response cap, so only the cap cuts it
        shape = self.opts.shape.model_copy(
            update={"max_steps": 1, "max_new_tokens_per_step": cap, "token_budget": cap}
        )

        async def one(index: int, tree: RetrievalTree) -> list[Episode]:
            question = self.by_id[tree.question_id]
            recipe = TreeRecipe(self.recipe, tree_messages(self.recipe, question, tree))
            eps = await run_episodes(recipe, [question], chat, retriever, self.opts.collection,
                                     n_samples=g, concurrency=self.opts.concurrency, shape=shape,
                                     **self.opts.sampling)  # fmt: skip
            found = tree.found_titles()
            out = []
            for ep in eps:
                ep.sample += index * g  # unique per (step, question) for the registry key
                ep.meta |= {"found_titles": found, "round": self.level + 1, "epoch": self.epoch}
                out.append(cap_reward(self.recipe.score(ep)))
            return out

        try:
            return list(await asyncio.gather(*(one(i, t) for i, t in enumerate(trees))))
        finally:
            await retriever.aclose()

    def grow(self, trees: Forest, groups: list[list[Episode]]) -> dict[str, float]:
        """Add the batch's trees to ``RR-Forest^{j+1}``; move on to the next batch, level or epoch."""
        grown, done = grow_forest(trees, [[expansion_step(ep) for ep in group] for group in groups])
        self.next_forest = survivors(self.next_forest + grown, self.recipe.config.forest_width)
        metrics = {"trees_grown": float(len(grown)), "trees_finished": float(done),
                   "next_forest": float(len(self.next_forest))}  # fmt: skip
        self.cursor += len(trees)
        if self.cursor >= len(self.forest):
            if self.level + 1 >= self.l_max or not self.next_forest:
                self.new_epoch(self.epoch + 1)
            else:
                self.level, self.cursor = self.level + 1, 0
                self.forest, self.next_forest = self.next_forest, []
        return metrics

    # -- run state --------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {
            "loop": LOOP,
            "stage": self.stage,
            "curriculum": None,
            "epoch": self.epoch,
            "level": self.level,
            "cursor": self.cursor,
            "forest": [tree_to_dict(t) for t in self.forest],
            "next_forest": [tree_to_dict(t) for t in self.next_forest],
        }

    def restore(self, state: dict[str, Any]) -> None:
        if "level" not in state:  # saved by the per-leaf rounds (before r2ag@3): start the epoch over
            log.warning("checkpoint state predates Algorithm 1's loop; starting from RR-Forest^0")
            return
        self.epoch, self.level, self.cursor = int(state["epoch"]), int(state["level"]), int(state["cursor"])
        self.forest = [tree_from_dict(t) for t in state["forest"]]
        self.next_forest = [tree_from_dict(t) for t in state["next_forest"]]


def expansion_step(episode: Episode) -> Step:
    """The response an episode made; an episode cut before its first step added nothing."""
    if episode.steps:
        return episode.steps[0]
    return Step(t=1, action="format_error", text="", error=f"no expansion ({episode.outcome})")


def signal_sums(episode: Episode) -> dict[str, float]:
    """Per Top-Survivor signal, its sum over the episode's steps (the registry's reward columns)."""
    sums: dict[str, float] = {}
    for step in episode.steps:
        for name, value in step.signals.items():
            sums[f"r2ag_{name}@2"] = sums.get(f"r2ag_{name}@2", 0.0) + value
    return sums
