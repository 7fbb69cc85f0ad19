"""EVO-RAG's multi-head preference model: one shared encoder, one linear head per step signal.

The encoder (default: the bundled all-MiniLM-L6-v2, mean pooled over tokens) reads a step as a
text pair ``(context, step text)``; the context (question and earlier steps) is truncated first so
the step itself is always seen. Seven linear heads ``h_k`` map the pooled vector to one score per
signal in :data:`hoprl.recipes.evo_rag.SIGNALS` order (r_ret, r_dup, r_bt, r_ref, r_step, r_ans,
r_act).

Head-wise pairwise logistic loss. For a pair ``(a, b)`` and signal ``k``, the pair has a
preference on ``k`` when ``|r_k(a) - r_k(b)| > tie_eps``; with ``s = sign(r_k(a) - r_k(b))``::

    loss_k(a, b) = -log sigmoid(s * (h_k(a) - h_k(b)))         (= softplus(-s * (h_k(a) - h_k(b))))
    loss = sum over (pair, head) cells with a preference of loss_k / number of such cells

so a head only learns from pairs its signal can order, and every preference counts equally.

As a reward: ``R = sum_k w_k(t) h_k`` with EVO-RAG's scheduled weights for the current stage
(:func:`hoprl.recipes.evo_rag.step_weights`), summed over an episode's steps like ``R = sum_t R_t``.

Example::

    model = PreferenceModel()
    train_preference(model, pairs_from_episodes(scored_episodes), PreferenceConfig())
    model.score(["<search>Acme founder</search>"])  # [1, 7]
    reward = make_reward_func(model, curriculum)      # TRL's (prompts, completions, **kwargs)
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn import functional as F
from transformers import AutoModel, AutoTokenizer

from hoprl.agent.tokens import episode_messages
from hoprl.agent.trajectory import Episode
from hoprl.embedding import default_model_path
from hoprl.recipes.base import RewardFunc, versioned
from hoprl.recipes.evo_rag import SIGNALS, Curriculum, EvoRagConfig, Stage, step_weights
from services.trainer.dpo import sibling_groups

log = logging.getLogger("hoprl.trainer.preference")

HEADS_FILE = "heads.safetensors"
META_FILE = "preference.json"


class PreferenceConfig(BaseModel):
    """Training settings of the preference model."""

    model_config = ConfigDict(extra="forbid")

    epochs: int = Field(default=3, ge=1)
    batch_size: int = Field(default=16, ge=1, description="pairs per optimizer step")
    learning_rate: float = Field(default=2e-5, description="for the encoder")
    head_learning_rate: float = Field(default=1e-3, description="for the seven heads")
    train_encoder: bool = Field(default=True, description="False: a frozen encoder, heads only")
    tie_eps: float = Field(default=1e-6, ge=0.0, description="signal gaps up to this are ties")
    seed: int = 0


@dataclass(frozen=True)
class Item:
    """One step to score: its text, what came before it, and its seven signals (SIGNALS order)."""

    text: str
    signals: tuple[float, ...]
    context: str = ""


class PreferenceModel(nn.Module):
    """A mean-pooled encoder with seven linear heads, one per EVO-RAG signal.

    Args:
        encoder: a local folder or Hugging Face id of a BERT-like encoder (None: bundled MiniLM).
        max_length: tokens per ``(context, text)`` pair; the context is truncated first.
    """

    def __init__(self, encoder: str | Path | None = None, max_length: int = 256) -> None:
        super().__init__()
        path = str(encoder or default_model_path())
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.encoder = AutoModel.from_pretrained(path)
        self.max_length = max_length
        hidden = int(self.encoder.config.hidden_size)
        self.heads = nn.ModuleDict({name: nn.Linear(hidden, 1) for name in SIGNALS})

    def forward(self, texts: Sequence[str], contexts: Sequence[str] | None = None) -> torch.Tensor:
        """Head scores ``[N, 7]`` (with gradient)."""
        contexts = contexts if contexts is not None else [""] * len(texts)
        batch = self.tokenizer(
            list(contexts),
            list(texts),
            padding=True,
            truncation="only_first",
            max_length=self.max_length,
            return_tensors="pt",
        )
        hidden = self.encoder(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return torch.cat([head(pooled) for head in self.heads.values()], dim=-1)

    @torch.no_grad()
    def score(self, texts: Sequence[str], contexts: Sequence[str] | None = None) -> torch.Tensor:
        """Head scores ``[N, 7]`` in eval mode, without gradient; columns follow SIGNALS."""
        was_training = self.training
        self.eval()
        out = self(texts, contexts)
        self.train(was_training)
        return out

    def save(self, path: str | Path) -> None:
        """Encoder and tokenizer (``save_pretrained``), heads and settings into ``path``."""
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        self.encoder.save_pretrained(out)
        self.tokenizer.save_pretrained(out)
        save_file({k: v.contiguous() for k, v in self.heads.state_dict().items()}, str(out / HEADS_FILE))
        meta = {"signals": list(SIGNALS), "max_length": self.max_length}
        (out / META_FILE).write_text(json.dumps(meta))

    @classmethod
    def load(cls, path: str | Path) -> PreferenceModel:
        meta = json.loads((Path(path) / META_FILE).read_text())
        if tuple(meta["signals"]) != SIGNALS:
            raise ValueError(f"{path} has heads {meta['signals']}, this code expects {list(SIGNALS)}")
        model = cls(path, max_length=meta["max_length"])
        model.heads.load_state_dict(load_file(str(Path(path) / HEADS_FILE)))
        return model


def headwise_loss(
    scores_a: torch.Tensor,
    scores_b: torch.Tensor,
    signals_a: torch.Tensor,
    signals_b: torch.Tensor,
    tie_eps: float = 1e-6,
) -> torch.Tensor:
    """Mean of ``-log sigmoid(s_k (h_k(a) - h_k(b)))`` over (pair, head) cells with a preference.

    All four arguments are ``[N, 7]``. Returns 0 (with gradient) when no cell has a preference.
    """
    gap = signals_a - signals_b
    sign = torch.sign(gap) * (gap.abs() > tie_eps)
    cells = sign != 0
    per_cell = F.softplus(-sign * (scores_a - scores_b))
    return (per_cell * cells).sum() / cells.sum().clamp(min=1)


def _signals(items: Sequence[Item]) -> torch.Tensor:
    return torch.tensor([item.signals for item in items], dtype=torch.float32)


def _score_pairs(
    model: PreferenceModel, pairs: Sequence[tuple[Item, Item]]
) -> tuple[torch.Tensor, torch.Tensor]:
    items = [a for a, _ in pairs] + [b for _, b in pairs]
    scores = model([i.text for i in items], [i.context for i in items])
    return scores[: len(pairs)], scores[len(pairs) :]


def train_preference(
    model: PreferenceModel, pairs: Sequence[tuple[Item, Item]], config: PreferenceConfig
) -> list[float]:
    """Minimise :func:`headwise_loss` over ``pairs`` for ``config.epochs``; returns the batch losses."""
    if not pairs:
        raise ValueError("no pairs to train on; store several samples per question")
    rng = random.Random(config.seed)
    torch.manual_seed(config.seed)
    model.encoder.requires_grad_(config.train_encoder)
    groups: list[dict[str, Any]] = [{"params": model.heads.parameters(), "lr": config.head_learning_rate}]
    if config.train_encoder:
        groups.append({"params": model.encoder.parameters(), "lr": config.learning_rate})
    optimizer = torch.optim.AdamW(groups)
    model.train()
    losses: list[float] = []
    for epoch in range(config.epochs):
        first = len(losses)
        order = rng.sample(range(len(pairs)), len(pairs))
        for start in range(0, len(order), config.batch_size):
            batch = [pairs[i] for i in order[start : start + config.batch_size]]
            scores_a, scores_b = _score_pairs(model, batch)
            sig_a, sig_b = _signals([a for a, _ in batch]), _signals([b for _, b in batch])
            loss = headwise_loss(scores_a, scores_b, sig_a, sig_b, config.tie_eps)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        epoch_losses = losses[first:]
        log.info("preference epoch %d: loss %.4f", epoch + 1, sum(epoch_losses) / len(epoch_losses))
    return losses


@torch.no_grad()
def pairwise_accuracy(
    model: PreferenceModel, pairs: Sequence[tuple[Item, Item]], tie_eps: float = 1e-6
) -> dict[str, float | None]:
    """Per signal: the share of pairs with a preference that the head orders the same way."""
    model.eval()
    scores_a, scores_b = _score_pairs(model, pairs)
    gap = _signals([a for a, _ in pairs]) - _signals([b for _, b in pairs])
    sign = torch.sign(gap) * (gap.abs() > tie_eps)
    agree = torch.sign(scores_a - scores_b) == sign
    out: dict[str, float | None] = {}
    for k, name in enumerate(SIGNALS):
        cells = sign[:, k] != 0
        out[name] = agree[cells, k].float().mean().item() if cells.any() else None
    return out


def _context(messages: Sequence[dict[str, str]]) -> str:
    """The conversation before a step as plain text (the system prompt is the same for all)."""
    return "\n".join(m["content"] for m in messages if m["role"] != "system")


def pairs_from_episodes(episodes: Sequence[Episode]) -> list[tuple[Item, Item]]:
    """Every pair of sibling steps (same question and prefix, different step text) of scored episodes.

    Each step is scored on its own seven signals, so a head compares what the step itself earned.
    """
    pairs = []
    for group in sibling_groups(episodes):
        context = _context(group.prompt)
        items = []
        for text, eps in group.candidates.items():
            signals = eps[0].steps[group.t - 1].signals
            items.append(Item(text, tuple(signals[k] for k in SIGNALS), context))
        pairs += [(a, b) for i, a in enumerate(items) for b in items[i + 1 :]]
    return pairs


def _text(x: Any) -> str:
    """A completion or prompt as text: plain strings, or TRL's conversational message lists."""
    return x if isinstance(x, str) else "\n".join(m["content"] for m in x)


def make_reward_func(
    model: PreferenceModel, stage: Stage | Curriculum = "discovery", config: EvoRagConfig | None = None
) -> RewardFunc:
    """The model as a TRL reward: ``sum_k w_k(t) h_k`` under the current stage's weights.

    With ``kwargs["episodes"]`` (one :class:`Episode` per completion) every step is scored in its
    context and the rewards are summed over steps. Otherwise each completion is one step, at
    ``kwargs["t"][i]`` (default 1) with the prompt as its context. A :class:`Curriculum` is read
    at every call, so a stage switch applies at once.
    """
    cfg = config or EvoRagConfig()

    def weights(t: int) -> torch.Tensor:
        current = stage.stage if isinstance(stage, Curriculum) else stage
        w = step_weights(t, current, cfg)
        return torch.tensor([w[k] for k in SIGNALS])

    def reward(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        episodes: Sequence[Episode] | None = kwargs.get("episodes")
        if episodes is None:
            ts = kwargs.get("t") or [1] * len(completions)
            scores = model.score([_text(c) for c in completions], [_text(p) for p in prompts])
            return [float(weights(t) @ s) for t, s in zip(ts, scores, strict=True)]
        out: list[float | None] = []
        for ep in episodes:
            if not ep.steps:
                out.append(0.0)
                continue
            contexts = [
                _context(episode_messages(ep.model_copy(update={"steps": ep.steps[:i]})))
                for i in range(len(ep.steps))
            ]
            scores = model.score([s.text for s in ep.steps], contexts)
            out.append(sum(float(weights(s.t) @ row) for s, row in zip(ep.steps, scores, strict=True)))
        return out

    return versioned("evo_rag_preference@1")(reward)
