"""R2AG's progressive iterative training: grow a retrieval forest one level per round, train on it.

One cohesive module over ~400 lines: the rounds loop with its advantages and surrogate loss (the
recipe's forest and rewards are :mod:`hoprl.recipes.r2ag`).

A *forest* holds the retrieval trees of a batch of questions (``questions_per_step`` questions,
drawn with the job's seed; one tree each to begin with). **One round is one optimizer step (one
registry step) and trains on the expansions of one tree level.** Round ``k`` of a forest:

1. **expand**: for every open leaf of every tree (:meth:`RetrievalTree.frontier`: the root in
   round 1, afterwards the gold hits of the level before), the current policy samples
   ``num_generations`` expansions. The prompt is R2AG's system prompt, the question, the pruned
   tree so far (:func:`~hoprl.recipes.r2ag.context`) and the node to expand. An expansion is one
   policy turn of the R2AG protocol run by the agent loop (:class:`LeafRecipe`): its ``<base-Q>`` /
   ``<predicted-Q>`` sub-queries go to the retriever (top-1 each), or it stops
   (``<base-Q>stop retrieval</base-Q>``, which never reaches the retriever).
2. **score**: each expansion is a one-step episode scored by the Top-Survivor reward
   (:meth:`R2ag.score`) with the gold titles its tree already holds as ``meta["found_titles"]``:
   Multi-Hit credits only documents new to the tree, and a stop earns Joint-Hit only when the tree
   holds every gold document (a stop before that zeroes the expansion's reward). The expansions go
   to the registry (question id, sample = the leaf's index among the question's open leaves x
   ``num_generations`` + sample).
3. **train**: a leaf's samples are a group; advantages are GRPO's ``(R - mean) / (std + 1e-4)``
   within it (``scale_rewards``: ``batch`` divides by the level's std instead, ``none``, the
   ``dr_grpo`` default, by nothing); groups whose rewards have zero spread are dropped (DAPO's
   dynamic sampling, without a refill: every open leaf is already in the batch). One optimizer
   step on the clipped surrogate ``-min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)`` over the
   expansion's policy tokens (mask 1; the injected ``<information>`` never enters the loss),
   aggregated per token over the batch (``dapo``), per sequence then per batch (``grpo``), or over
   ``B x token_budget`` (``dr_grpo``). With one update per batch ``rho`` is 1 when the gradient is
   taken (as in TRL with one iteration per generation), so the clip ``epsilon`` / ``epsilon_high``
   (0.2 / 0.28) is the DAPO objective's shape rather than an active constraint.
4. **grow and prune** (:func:`~hoprl.recipes.r2ag.grow_forest`): every sample's expansion of a
   tree makes a new tree, pruned to the branches that hit gold; identical trees are kept once, and
   the trees with an open leaf are round ``k+1``'s forest (at most ``forest_width`` per question
   when the recipe config sets it; the paper keeps them all).

After ``l_max`` rounds (L_MAX = 5), or as soon as no tree has an open leaf, the next round starts
a new forest on the next batch of questions. The round, the forest and the batch index are run
state: they are saved in every checkpoint's ``hoprl_state.json`` and restored on resume, and each
round is a registry stage (``round1`` .. ``round5``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import statistics
import time
from typing import Any

import torch
from transformers import set_seed
from trl.trainer.utils import selective_log_softmax

from hoprl.agent.runner import run_episodes
from hoprl.agent.tokens import to_token_trajectory
from hoprl.agent.trajectory import Episode, RetrievedDoc, Step
from hoprl.clients.retriever import AsyncRetrieverClient
from hoprl.generation.chat import EngineChat
from hoprl.recipes.base import Action
from hoprl.recipes.r2ag import (
    Forest,
    Node,
    RetrievalTree,
    context,
    episode_return,
    grow_forest,
    survivors,
    tree_from_dict,
    tree_to_dict,
)
from hoprl.registry.store import Registry
from hoprl.schemas import Question
from hoprl.schemas.trainer import Hyperparameters, JobRequest, reward_scaling
from hoprl.training.callbacks import Curricula, load_loop_checkpoint, save_loop_checkpoint
from hoprl.training.rollout import RolloutOptions, TrainingEngine, generation_mode

log = logging.getLogger("hoprl.trainer")
LOOP = "r2ag-rounds"
__all__ = ["R2agRounds", "group_advantages", "level_advantages", "tree_from_dict", "tree_to_dict"]


class LeafRecipe:
    """The R2AG recipe with one node's prompt and one turn: the agent loop then returns exactly one
    expansion of that node."""

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


def leaf_messages(recipe: Any, question: Question, tree: RetrievalTree, leaf: Node) -> list[dict[str, str]]:
    """The recipe's prompt plus the pruned tree and the node to expand."""
    messages = [dict(m) for m in recipe.messages(question)]
    if leaf is tree.root:
        messages[-1]["content"] += "\n\nExpand the question itself: this is the first level of the tree."
    else:
        doc = f" -> {leaf.doc.title}" if leaf.doc else ""
        messages[-1]["content"] += (
            f"\n\nRetrieval tree so far (the branches that found needed documents):\n{context(tree)}"
            f"\n\nExpand this node: [{leaf.kind}] {leaf.query}{doc}"
        )
    return messages


def group_advantages(rewards: list[float], scale: bool = True) -> list[float] | None:
    """GRPO advantages of one group, or None when its rewards have zero spread (dropped).

    ``scale``: divide by the group's reward std (GRPO); without it only the mean is subtracted
    (Dr. GRPO, ``scale_rewards="none"``).
    """
    if max(rewards) == min(rewards):
        return None
    mean = sum(rewards) / len(rewards)
    if not scale:
        return [r - mean for r in rewards]
    std = statistics.stdev(rewards)
    return [(r - mean) / (std + 1e-4) for r in rewards]


def level_advantages(groups: list[list[float]], scaling: str) -> list[list[float] | None]:
    """:func:`group_advantages` of each group under TRL's ``scale_rewards`` (``group`` / ``batch``
    / ``none``); ``batch`` divides the centred rewards by the std over every group's rewards."""
    advantages = [group_advantages(g, scale=scaling == "group") for g in groups]
    if scaling != "batch":
        return advantages
    std = statistics.stdev([r for g in groups for r in g])
    return [None if a is None else [x / (std + 1e-4) for x in a] for a in advantages]


def surrogate_loss(
    model: Any,
    episodes: list[Episode],
    advantages: list[float],
    tokenizer: Any,
    hp: Hyperparameters,
    loss_type: str,
) -> torch.Tensor:
    """The clipped policy-gradient loss of the module doc over the expansions' policy tokens."""
    trajectories = [to_token_trajectory(e, tokenizer) for e in episodes]
    ids = [t.prompt_ids + t.completion_ids for t in trajectories]
    width = max(len(x) for x in ids)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    input_ids = torch.tensor([x + [pad] * (width - len(x)) for x in ids])
    attention = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids])
    # shifted frame: position i predicts token i + 1; mask 1 where that token is the policy's
    mask = torch.tensor(
        [
            [0] * (len(t.prompt_ids) - 1) + t.mask + [0] * (width - len(x))
            for t, x in zip(trajectories, ids, strict=True)
        ],
        dtype=torch.float32,
    )
    logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1].float() / hp.temperature
    logps = selective_log_softmax(logits, input_ids[:, 1:])
    ratio = torch.exp(logps - logps.detach())
    adv = torch.tensor(advantages)[:, None]
    clipped = torch.clamp(ratio, 1 - (hp.epsilon or 0.2), 1 + (hp.epsilon_high or hp.epsilon or 0.2))
    per_token = -torch.min(ratio * adv, clipped * adv) * mask
    if loss_type == "grpo":
        return (per_token.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "dr_grpo":
        return per_token.sum() / (len(episodes) * hp.token_budget)
    return per_token.sum() / mask.sum().clamp(min=1.0)


class R2agRounds:
    """The round loop (module doc); ``train(resume_from_checkpoint=...)`` like TRL's trainers."""

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
        self.registry, self.run_id, self.output_dir = registry, run_id, output_dir
        self.l_max: int = recipe.config.l_max
        self.curricula = Curricula(recipe)  # R2AG has no reward curriculum; its rounds are the stages
        self.engine = TrainingEngine(model, tokenizer, threads=opts.torch_threads)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=hp.learning_rate or 1e-5)
        self.batch, self.round = 0, 1
        self.questions: list[Question] = []
        self.forest: Forest = []

    @property
    def stage(self) -> str:
        return f"round{self.round}"

    def new_forest(self, batch: int) -> None:
        rng = random.Random(f"{self.request.seed}:forest:{batch}")
        self.batch, self.round = batch, 1
        self.questions = rng.sample(self.train_questions, self.hp.questions_per_step)
        self.forest = [RetrievalTree.for_question(q) for q in self.questions]

    def open_leaves(self) -> int:
        return sum(len(tree.frontier(self.l_max)) for tree in self.forest)

    # -- the loop -------------------------------------------------------------------------------

    def train(self, resume_from_checkpoint: str | None = None) -> None:
        start = 0
        set_seed(self.request.seed)  # a resumed job restores the RNG state of its checkpoint below
        self.new_forest(0)
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
            log.info(
                "r2ag round step %d/%d (%s): %s",
                step,
                self.request.steps,
                before,
                {k: round(v, 4) for k, v in metrics.items()},
            )
            if self.stage != before:
                self.registry.record_stage_switch(
                    self.run_id,
                    step,
                    before,
                    self.stage,
                    "forest grew one level" if self.round > 1 else "forest done: new questions",
                    metric_name="open_leaves",
                    metric_value=float(self.open_leaves()),
                )
            if step % self.hp.save_steps == 0 or step == self.request.steps:
                save_loop_checkpoint(
                    self.output_dir,
                    step,
                    self.model,
                    self.tokenizer,
                    self.optimizer,
                    self.registry,
                    self.run_id,
                    self.state(),
                )

    def step(self, step: int) -> dict[str, float]:
        """One round: expand, score, record, train, grow and prune (module doc)."""
        if self.open_leaves() == 0:
            self.new_forest(self.batch + 1)
        began = time.perf_counter()
        with generation_mode(self.model, self.opts.torch_threads):
            level = asyncio.run(self.expansions())
        rollout_s = time.perf_counter() - began
        groups = [group for tree_groups in level for group in tree_groups]
        flat = [ep for group in groups for ep in group]
        rewards = [episode_return(ep, self.recipe.config) for ep in flat]
        self.registry.write_episodes(
            self.run_id,
            step,
            flat,
            [{**signal_sums(ep), "total": r} for ep, r in zip(flat, rewards, strict=True)],
        )
        grouped, start = [], 0
        for group in groups:
            grouped.append(rewards[start : start + len(group)])
            start += len(group)
        kept_eps: list[Episode] = []
        kept_adv: list[float] = []
        dropped = 0
        scaling = reward_scaling(self.hp, self.request.objective)
        for group, adv in zip(groups, level_advantages(grouped, scaling), strict=True):
            if adv is None:
                dropped += 1
                continue
            kept_eps += group
            kept_adv += adv
        metrics = {
            "reward": sum(rewards) / len(rewards),
            "round": float(self.round),
            "groups": float(len(groups)),
            "dynamic/dropped": float(dropped),
            "rollout_s": rollout_s,
            "step": float(step),
        }
        if kept_eps:
            self.model.train()
            loss = surrogate_loss(
                self.model, kept_eps, kept_adv, self.tokenizer, self.hp, self.request.objective
            )
            self.optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
            metrics["loss"] = float(loss.item())
        metrics |= self.grow(level)
        metrics["step_time"] = time.perf_counter() - began
        return metrics

    async def expansions(self) -> list[list[list[Episode]]]:
        """Per tree, per open leaf, its ``num_generations`` scored expansions (trees in forest order)."""
        chat = EngineChat(self.engine)
        retriever = AsyncRetrieverClient(self.opts.retriever_url)
        g = self.opts.num_generations
        episode_opts = {k: v for k, v in self.opts.episode.items() if k != "max_steps"}
        by_id = {q.id: q for q in self.questions}

        async def one(question: Question, tree: RetrievalTree, leaf: Node, index: int) -> list[Episode]:
            recipe = LeafRecipe(self.recipe, leaf_messages(self.recipe, question, tree, leaf))
            eps = await run_episodes(
                recipe,
                [question],
                chat,
                retriever,
                self.opts.collection,
                n_samples=g,
                concurrency=self.opts.concurrency,
                max_steps=1,
                **episode_opts,
            )
            found = tree.found_titles()
            out = []
            for ep in eps:
                ep.sample += index * g  # unique per (round step, question) for the registry key
                ep.meta |= {"found_titles": found, "round": self.round, "node": leaf.query}
                out.append(self.recipe.score(ep))
            return out

        leaf_index: dict[str, int] = {}
        jobs = []
        for tree in self.forest:
            for leaf in tree.frontier(self.l_max):
                index = leaf_index[tree.question_id] = leaf_index.get(tree.question_id, -1) + 1
                jobs.append(one(by_id[tree.question_id], tree, leaf, index))
        try:
            flat = list(await asyncio.gather(*jobs))
        finally:
            await retriever.aclose()
        level, start = [], 0
        for tree in self.forest:
            n = len(tree.frontier(self.l_max))
            level.append(flat[start : start + n])
            start += n
        return level

    def grow(self, level: list[list[list[Episode]]]) -> dict[str, float]:
        """Every sample's pruned tree propagates (:func:`grow_forest`); returns the forest's metrics."""
        steps = [[[expansion_step(ep) for ep in group] for group in groups] for groups in level]
        grown = grow_forest(self.forest, steps, self.l_max)
        found: dict[str, float] = {}
        for tree in grown:
            share = len(tree.found_titles()) / max(len(tree.gold_titles), 1)
            found[tree.question_id] = max(found.get(tree.question_id, 0.0), share)
        self.forest = survivors(grown, self.l_max, self.recipe.config.forest_width)
        metrics = {
            "gold_found": sum(found.values()) / len(self.questions),
            "trees": float(len(self.forest)),
        }
        self.round += 1
        if self.round > self.l_max or self.open_leaves() == 0:
            self.new_forest(self.batch + 1)
        return metrics

    # -- run state --------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {
            "loop": LOOP,
            "stage": self.stage,
            "curriculum": None,
            "batch": self.batch,
            "round": self.round,
            "question_ids": [q.id for q in self.questions],
            "forest": [tree_to_dict(t) for t in self.forest],
        }

    def restore(self, state: dict[str, Any]) -> None:
        by_id = {q.id: q for q in self.train_questions}
        self.batch, self.round = int(state["batch"]), int(state["round"])
        self.questions = [by_id[i] for i in state["question_ids"]]
        self.forest = [tree_from_dict(t) for t in state["forest"]]
        if any(not t.question_id for t in self.forest):  # saved before r2ag@2: one tree per question
            for tree, question in zip(self.forest, self.questions, strict=True):
                tree.question_id = question.id


def expansion_step(episode: Episode) -> Step:
    """The expansion an episode made; an episode cut before its first step closes the leaf."""
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
