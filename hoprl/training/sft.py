"""SFT warm start: teach a small model the recipe's protocol from scripted expert trajectories.

A model that never emits ``<search>`` or ``<answer>`` gets the same (failing) reward on every
sample, so GRPO has nothing to learn from; a few hundred steps of supervised fine-tuning on the
recipe's expert trajectories fix that.

The expert data goes through the **same path as an RL rollout**: :class:`ExpertChat` replays the
recipe's ``expert_segments(question)`` (or asks its ``expert_reader(question)``, an expert that
reads the results, where the recipe has one) as the "model" of the episode runner, which runs them
against the real retriever (so the injected ``<information>`` is what the policy will see at RL
time) and records an :class:`~hoprl.domain.Episode`;
:func:`~hoprl.agent.tokens.to_token_trajectory` turns it into token ids and the policy mask.
Each example is pre-tokenized (``input_ids`` = prompt + completion, ``completion_mask`` = 0 on
the prompt and on every injected or template token, 1 on assistant text), and TRL's SFTTrainer
runs with ``completion_only_loss=True``: the loss covers the assistant turns only.

On a CPU, :class:`CompletionHeadSFTTrainer` projects only the assistant positions through the
LM head (TRL scores every position there); the loss and its gradients are TRL's.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from datasets import Dataset
from trl import SFTConfig, SFTTrainer

from hoprl.agent.runner import run_episode
from hoprl.agent.tokens import to_token_trajectory
from hoprl.clients.retriever import AsyncRetrieverClient
from hoprl.domain import MAX_BUDGET, Completion, Episode, EpisodeShape, Question
from hoprl.schemas.trainer import Hyperparameters
from hoprl.training.hardware import common_args, per_process

log = logging.getLogger("hoprl.trainer")

#: an expert episode's shape: the script decides its steps, so the limits are the widest a shape
#: holds (EVO-RAG's expert takes up to 20 steps) and never cut a scripted segment
EXPERT_SHAPE = EpisodeShape(max_steps=20, max_new_tokens_per_step=32768, token_budget=MAX_BUDGET)


class ExpertChat:
    """A ``ChatModel`` that answers with the next scripted expert segment (stop text included), or
    with what an adaptive expert (a function of the conversation so far) writes."""

    def __init__(self, script: Sequence[str] | Callable[[list[dict[str, str]]], str]) -> None:
        if callable(script):
            self.reply = script
        else:
            segments = list(script)
            self.reply = lambda messages: segments[min(_turns(messages), len(segments) - 1)]

    async def chat(self, messages: list[dict[str, str]], **_: Any) -> list[Completion]:
        text = self.reply(messages)
        usage = {"prompt_tokens": 0, "completion_tokens": len(text.split())}
        return [Completion(text, "stop", None, None, usage)]


def _turns(messages: list[dict[str, str]]) -> int:
    return sum(1 for m in messages if m["role"] == "assistant")


async def expert_episodes(
    recipe: Any, questions: Sequence[Question], retriever_url: str, collection: str,
    noise: float = 0.0, seed: int = 0, concurrency: int = 8,
) -> list[Episode]:  # fmt: skip
    """One expert episode per question, run through the agent loop against the retriever."""
    semaphore = asyncio.Semaphore(concurrency)
    retriever = AsyncRetrieverClient(retriever_url)

    async def one(i: int, q: Question) -> Episode:
        # A recipe's adaptive expert reads the results (when-to-search's "adaptive" experts).
        reader = getattr(recipe, "expert_reader", lambda _: None)(q)
        chat = ExpertChat(reader or recipe.expert_segments(q, noise=noise, seed=seed + i))
        async with semaphore:
            return await run_episode(recipe, q, chat, retriever, collection, shape=EXPERT_SHAPE)

    try:
        episodes = list(await asyncio.gather(*(one(i, q) for i, q in enumerate(questions))))
    finally:
        await retriever.aclose()
    counts = Counter(e.retrieval_count for e in episodes)
    log.info("%d expert episodes; searches per episode: %s", len(episodes), dict(sorted(counts.items())))
    return episodes


def sft_dataset(episodes: Sequence[Episode], tokenizer: Any, max_length: int | None = None) -> Dataset:
    """Pre-tokenized SFT rows; episodes longer than ``max_length`` tokens are left out (logged)."""
    rows: dict[str, list[list[int]]] = {"input_ids": [], "completion_mask": []}
    for ep in episodes:
        t = to_token_trajectory(ep, tokenizer)
        ids = t.prompt_ids + t.completion_ids
        if max_length is not None and len(ids) > max_length:
            log.warning(
                "expert episode %s has %d tokens > %d; left out", ep.question_id, len(ids), max_length
            )
            continue
        rows["input_ids"].append(ids)
        rows["completion_mask"].append([0] * len(t.prompt_ids) + t.mask)
    if not rows["input_ids"]:
        raise ValueError("no expert episode fits; raise the model's context or shorten the recipe prompt")
    return Dataset.from_dict(rows)


def sft_config(hp: Hyperparameters, steps: int | None, output_dir: str, seed: int) -> SFTConfig:
    """TRL's SFT config: completion-only loss over the pre-tokenized rows."""
    return SFTConfig(
        max_steps=steps or -1,
        num_train_epochs=hp.sft_epochs,
        # A warm start sees a few dozen to a few hundred expert episodes: at 3e-4, SmolLM2-135M's
        # loss fell from 1.48 to 0.10 in 8 steps of 4 and dev EM from 0 to 25 in 16 (synthetic).
        learning_rate=hp.learning_rate or 3e-4,
        lr_scheduler_type=hp.lr_scheduler,
        per_device_train_batch_size=per_process(hp.questions_per_step, hp.processes),
        completion_only_loss=True,
        max_length=None,
        # Batches of similar lengths: expert episodes run 400-1300 tokens and each row pads to the
        # longest of its batch (6 steps of 4: 341 s grouped against 367 s random, same data).
        train_sampling_strategy="group_by_length",
        save_strategy="steps",
        # TRL recomputes each layer in the backward pass by default (for memory). The cpu preset's
        # step of 2 expert episodes (~2,000 tokens) keeps SmolLM2-135M's activations in a few GB, so
        # it trains without: a forward pass less a step (make run's SFT step 17.5 -> 14 s). RL keeps
        # TRL's default: a DAPO step of 8 episodes without it reached 17.6 GB and was OOM-killed.
        gradient_checkpointing=hp.preset != "cpu",
        save_steps=hp.save_steps,
        **common_args(output_dir, seed, hp.report_to),
    )


# Config fields that change the logits after the head (read by TRL's fused head).
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier",
                     "logits_scaling")  # fmt: skip


class CompletionHeadSFTTrainer(SFTTrainer):
    """TRL's SFTTrainer, with the LM head applied to the assistant positions only on a CPU.

    TRL's fused LM head (``trl.trainer.utils.add_fused_lm_head``) scores only the positions with a
    label on Triton devices; elsewhere it scores every position, to keep tile shapes fixed for
    compilers. An expert episode is ~80% prompt and injected documents, and SmolLM2's 49,152-word
    head is a fifth of the model's arithmetic, so on a CPU most of that work is thrown away. No
    library offers the compact head for CPUs, hence this override: the backbone runs as usual, the
    head and cross-entropy run on the labelled positions, and the loss (summed NLL over
    ``num_items_in_batch``) and the logged entropy and token accuracy are TRL's. Everything else
    (GPUs, several processes, label smoothing, a custom loss, DFT) goes to TRL unchanged.
    """

    def _compact(self, model: Any, inputs: dict[str, Any], return_outputs: bool) -> bool:
        config, device = model.config.get_text_config(), model.device.type
        return (
            not return_outputs
            and model is self.model  # not wrapped for several processes, nor by PEFT
            and device == "cpu"  # TRL scores only labelled positions on GPUs
            and "attention_mask" in inputs  # padding-free batches go to TRL
            and self.compute_loss_func is None
            and self.label_smoother is None
            and self.args.loss_type == "nll"  # type: ignore[attr-defined]
            and not self.aux_loss_enabled
            # a plain head: no softcap or logit scale (TRL's head applies those)
            and all(getattr(config, a, None) is None for a in _LOGIT_TRANSFORMS)
        )

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:  # fmt: skip
        if not self._compact(model, inputs, return_outputs):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        mode = "train" if model.training else "eval"
        backbone = {k: v for k, v in inputs.items() if k != "labels"}
        hidden = model.base_model(**backbone, use_cache=False).last_hidden_state[:, :-1]
        labels = inputs["labels"][:, 1:]
        mask = labels != -100
        targets = labels[mask]
        logits = model.get_output_embeddings()(hidden[mask]).float()
        count = mask.sum() if num_items_in_batch is None else num_items_in_batch
        loss = F.cross_entropy(logits, targets, reduction="sum") / torch.as_tensor(count).clamp(min=1)
        with torch.no_grad():
            logp = logits.log_softmax(-1)
            entropy = -(logp.exp() * logp).sum(-1)
            valid = max(targets.numel(), 1)  # an all-masked batch logs 0, as TRL's does
            self._metrics[mode]["entropy"].append(entropy.sum().item() / valid)
            correct = (logits.argmax(-1) == targets).sum().item()
            self._metrics[mode]["mean_token_accuracy"].append(correct / valid)
            if mode == "train":
                self._total_train_tokens += int(inputs["attention_mask"].sum())
            self._metrics[mode]["num_tokens"] = [self._total_train_tokens]
        return loss


def build_sft(model: Any, tokenizer: Any, dataset: Dataset, config: SFTConfig,
              callbacks: list[Any] | None = None) -> SFTTrainer:  # fmt: skip
    return CompletionHeadSFTTrainer(model=model, args=config, train_dataset=dataset,
                                    processing_class=tokenizer, callbacks=callbacks)  # fmt: skip
