"""EVO-RAG's multi-head preference model: one shared encoder, one linear head per step signal.

The encoder (default: the bundled all-MiniLM-L6-v2, mean pooled over tokens) reads a step as a
text pair ``(context, step text)``; the context (question and earlier steps) is truncated first so
the step itself is always seen. Seven linear heads ``h_k`` map the pooled vector to one score per
signal in :data:`hoprl.recipes.evo_rag.SIGNALS` order (r_ret, r_dup, r_bt, r_ref, r_step, r_ans,
r_act).

**Pairs (the paper).** Sibling prefixes: two steps that follow the same question and the same
earlier steps (:func:`hoprl.training.dpo.sibling_groups`). Each candidate step is valued by
its weighted return-to-go ``G_t = sum_{s>=t} sum_k w_k(s) r_k(s)`` (mean over the episodes that
took it; :func:`hoprl.training.dpo.candidate_values`), the preferred one is the higher ``G_t``.
:func:`preference_pairs` pairs the best candidate of a group with the worst, the second best
with the second worst, ... (every candidate in at most one pair: as many preferred as
dispreferred steps) and alternates which of the two is shown first, so the labels are 1:1.

**Head-wise logistic loss.** With ``y = +1`` when the first step of the pair is preferred (by
``G_t``), else ``-1``, every head is fitted to that order::

    loss = mean over pairs and heads k of  -log sigmoid(y * (h_k(a) - h_k(b)))        (loss="return")

``loss="per_signal"`` (the project's earlier reading, an option) orders head ``k`` by its own
signal instead: the pair counts for head ``k`` only when ``|r_k(a) - r_k(b)| > tie_eps``, with
``y_k = sign(r_k(a) - r_k(b))`` (:func:`headwise_loss`).

**In the training loop (Algorithm 1)** (:mod:`hoprl.training.preference_learning`). Each
iteration of the paper's loop rolls out episodes with the policy, scores their step signals and
``R_t``, updates the reward model on the sibling pairs of those rollouts, and then updates the
policy (GRPO, PPO or DPO). ``PreferenceLearner`` is that reward-model update: the trainer's EVO-RAG
jobs call its ``step`` once per step on the step's scored episodes (hyperparameter
``preference_model``, on for evo-rag) and log ``preference/eval_accuracy``: the share of
*held-back* pairs (pairs of questions hashed into ``eval_share``, never trained on) that the model
orders as ``G_t`` does, scoring a step by ``sum_k w_k(t) h_k`` (the paper's Table 5 "Eval Accuracy").

As a reward: ``R = sum_k w_k(t) h_k`` with EVO-RAG's scheduled weights for the current stage
(:func:`hoprl.recipes.evo_rag.step_weights`), summed over an episode's steps like ``R = sum_t R_t``.

Example::

    model = PreferenceModel()
    train_preference(model, preference_pairs(scored_episodes), PreferenceConfig())
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
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn import functional as F
from transformers import AutoModel, AutoTokenizer

from hoprl.domain import Episode
from hoprl.embedding import default_model_path
from hoprl.recipes.evo_rag import SIGNALS, EvoRagConfig, Stage, step_weights
from hoprl.training.dpo import candidate_values, sibling_groups
from hoprl.training.optimizer import ParamGroup, adamw

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
    loss: Literal["return", "per_signal"] = Field(
        default="return", description="heads fit the pair's G_t order (the paper) or each its own signal"
    )
    tie_eps: float = Field(default=1e-6, ge=0.0, description="signal or G_t gaps up to this are ties")
    delta: float = Field(default=0.0, ge=0.0, description="keep pairs whose G_t margin exceeds this")
    eval_share: float = Field(default=0.2, gt=0.0, lt=1.0, description="share of questions held back")
    max_eval_pairs: int = Field(default=512, ge=1, description="held-back pairs kept (the most recent)")
    seed: int = 0


@dataclass(frozen=True)
class Item:
    """One step to score: its text, what came before it, its seven signals (SIGNALS order), its
    step index ``t``, its weighted return-to-go ``value`` (G_t) and its question."""

    text: str
    signals: tuple[float, ...]
    context: str = ""
    t: int = 1
    value: float = 0.0
    question_id: str = ""


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


def return_headwise_loss(scores_a: torch.Tensor, scores_b: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    """Mean of ``-log sigmoid(y (h_k(a) - h_k(b)))`` over pairs and all seven heads.

    ``scores_*`` are ``[N, 7]``, ``label`` is ``[N]`` with ``+1`` (a preferred) or ``-1``.
    """
    return F.softplus(-label.unsqueeze(1) * (scores_a - scores_b)).mean()


def _labels(pairs: Sequence[tuple[Item, Item]], tie_eps: float) -> torch.Tensor:
    gap = torch.tensor([a.value - b.value for a, b in pairs])
    return torch.sign(gap) * (gap.abs() > tie_eps)


def pair_loss(
    scores_a: torch.Tensor,
    scores_b: torch.Tensor,
    pairs: Sequence[tuple[Item, Item]],
    config: PreferenceConfig,
) -> torch.Tensor:
    """The configured head-wise loss of a batch of pairs (module docstring)."""
    if config.loss == "per_signal":
        sig_a, sig_b = _signals([a for a, _ in pairs]), _signals([b for _, b in pairs])
        return headwise_loss(scores_a, scores_b, sig_a, sig_b, config.tie_eps)
    return return_headwise_loss(scores_a, scores_b, _labels(pairs, config.tie_eps))


def _signals(items: Sequence[Item]) -> torch.Tensor:
    return torch.tensor([item.signals for item in items], dtype=torch.float32)


def _score_pairs(
    model: PreferenceModel, pairs: Sequence[tuple[Item, Item]]
) -> tuple[torch.Tensor, torch.Tensor]:
    items = [a for a, _ in pairs] + [b for _, b in pairs]
    scores = model([i.text for i in items], [i.context for i in items])
    return scores[: len(pairs)], scores[len(pairs) :]


def make_optimizer(model: PreferenceModel, config: PreferenceConfig) -> torch.optim.Optimizer:
    """AdamW with the heads at ``head_learning_rate`` and (if trained) the encoder at ``learning_rate``."""
    model.encoder.requires_grad_(config.train_encoder)
    groups: list[ParamGroup] = [("heads", model.heads.parameters(), config.head_learning_rate)]
    if config.train_encoder:
        groups.append(("encoder", model.encoder.parameters(), config.learning_rate))
    return adamw(*groups)


def train_preference(
    model: PreferenceModel,
    pairs: Sequence[tuple[Item, Item]],
    config: PreferenceConfig,
    optimizer: torch.optim.Optimizer | None = None,
) -> list[float]:
    """Minimise :func:`pair_loss` over ``pairs`` for ``config.epochs``; returns the batch losses.

    ``optimizer``: keep one across calls (:class:`PreferenceLearner`); default a fresh
    :func:`make_optimizer`. Seeded by ``config.seed`` (batch order, the encoder's dropout) on a
    forked torch RNG: the caller's random stream, e.g. the policy's sampling in a job, is left as
    it was.
    """
    if not pairs:
        raise ValueError("no pairs to train on; store several samples per question")
    optimizer = optimizer or make_optimizer(model, config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        return _train(model, pairs, config, optimizer)


def _train(
    model: PreferenceModel,
    pairs: Sequence[tuple[Item, Item]],
    config: PreferenceConfig,
    optimizer: torch.optim.Optimizer,
) -> list[float]:
    rng = random.Random(config.seed)
    model.train()
    losses: list[float] = []
    for epoch in range(config.epochs):
        first = len(losses)
        order = rng.sample(range(len(pairs)), len(pairs))
        for start in range(0, len(order), config.batch_size):
            batch = [pairs[i] for i in order[start : start + config.batch_size]]
            scores_a, scores_b = _score_pairs(model, batch)
            loss = pair_loss(scores_a, scores_b, batch, config)
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


def context_text(messages: Sequence[dict[str, str]]) -> str:
    """The conversation before a step as plain text (the system prompt is the same for all)."""
    return "\n".join(m["content"] for m in messages if m["role"] != "system")


def preference_pairs(
    episodes: Sequence[Episode], config: EvoRagConfig | None = None, delta: float = 0.0
) -> list[tuple[Item, Item]]:
    """Balanced sibling pairs of scored episodes, ordered by the weighted return (module docstring).

    Per sibling group, candidates ranked by ``G_t`` are paired best with worst, second best with
    second worst, ..., keeping pairs whose margin exceeds ``delta``; the preferred step comes
    first in even-numbered pairs and second in odd ones, so the labels are 1:1.
    """
    pairs: list[tuple[Item, Item]] = []
    for group in sibling_groups(episodes):
        context, values = context_text(group.prompt), candidate_values(group, config)
        ranked = sorted(values, key=lambda text: -values[text])
        for best, worst in zip(ranked[: len(ranked) // 2], ranked[::-1], strict=False):
            if values[best] - values[worst] <= delta:
                continue
            a, b = (
                Item(text, tuple(group.candidates[text][0].steps[group.t - 1].signals[k] for k in SIGNALS),
                     context, group.t, values[text], group.question_id)
                for text in (best, worst)
            )  # fmt: skip
            pairs.append((a, b) if len(pairs) % 2 == 0 else (b, a))
    return pairs


@torch.no_grad()
def return_accuracy(
    model: PreferenceModel, pairs: Sequence[tuple[Item, Item]], stage: Stage, config: EvoRagConfig
) -> float | None:
    """Share of pairs that ``sum_k w_k(t) h_k`` orders as ``G_t`` does (None without pairs)."""
    if not pairs:
        return None
    model.eval()
    scores_a, scores_b = _score_pairs(model, pairs)
    w = torch.tensor([[step_weights(a.t, stage, config)[k] for k in SIGNALS] for a, _ in pairs])
    predicted = torch.sign(((scores_a - scores_b) * w).sum(-1))
    return (predicted == _labels(pairs, 0.0)).float().mean().item()
