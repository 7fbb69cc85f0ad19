"""EVO-RAG's preference model in the training loop: the per-step update and the reward it gives.

:class:`PreferenceLearner` is Algorithm 1's reward-model update (one :meth:`~PreferenceLearner.step`
per training step on that step's scored episodes, with held-back questions for its accuracy);
:class:`PreferenceCallback` saves it into each checkpoint; :func:`make_reward_func` turns the model
into a TRL reward function, ``R = sum_t sum_k w_k(t) h_k``. The model, its losses and its pairs
are :mod:`hoprl.training.preference`.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from hoprl.agent.tokens import episode_messages
from hoprl.domain import Episode
from hoprl.recipes.base import RewardFunc, versioned
from hoprl.recipes.evo_rag import SIGNALS, Curriculum, EvoRagConfig, Stage, step_weights
from hoprl.training.preference import (
    HEADS_FILE,
    Item,
    PreferenceConfig,
    PreferenceModel,
    context_text,
    make_optimizer,
    preference_pairs,
    return_accuracy,
    train_preference,
)

log = logging.getLogger("hoprl.trainer.preference")


class PreferenceLearner:
    """The reward-model update of the paper's Algorithm 1, once per training step (module doc).

    Args:
        recipe: the EVO-RAG recipe of the job (its config weights ``G_t``; its curriculum's stage
            weights the heads in the accuracy).
        config: training settings; ``eval_share`` of the questions (by a seeded hash of the
            question id) are held back: their pairs are only ever evaluated.
        model: a :class:`PreferenceModel` (default: a fresh one on the bundled encoder).
    """

    SUBDIR = "preference"

    def __init__(self, recipe: Any, config: PreferenceConfig, model: PreferenceModel | None = None) -> None:
        self.recipe, self.config = recipe, config
        if model is None:
            with torch.random.fork_rng(devices=[]):  # seeded heads; the job's RNG stream untouched
                torch.manual_seed(config.seed)
                model = PreferenceModel()
        self.model = model
        self.optimizer = make_optimizer(self.model, config)
        self.held_back: list[tuple[Item, Item]] = []

    def is_held_back(self, question_id: str) -> bool:
        digest = hashlib.sha256(f"{self.config.seed}:{question_id}".encode()).digest()
        return int.from_bytes(digest[:4], "big") / 2**32 < self.config.eval_share

    def step(self, episodes: Sequence[Episode]) -> dict[str, float]:
        """Train on this step's pairs of training questions; evaluate on every held-back pair."""
        began = time.perf_counter()
        pairs = preference_pairs(episodes, self.recipe.config, self.config.delta)
        train = [p for p in pairs if not self.is_held_back(p[0].question_id)]
        held = [p for p in pairs if self.is_held_back(p[0].question_id)]
        self.held_back = (self.held_back + held)[-self.config.max_eval_pairs :]
        metrics = {
            "preference/train_pairs": float(len(train)),
            "preference/eval_pairs": float(len(self.held_back)),
        }
        if train:
            losses = train_preference(self.model, train, self.config, self.optimizer)
            metrics["preference/loss"] = sum(losses) / len(losses)
        accuracy = return_accuracy(
            self.model, self.held_back, self.recipe.curriculum.stage, self.recipe.config
        )
        if accuracy is not None:
            metrics["preference/eval_accuracy"] = accuracy
        return metrics | {"preference/step_s": time.perf_counter() - began}

    def save(self, checkpoint: str | Path) -> None:
        """Into ``checkpoint/preference`` (a :meth:`PreferenceModel.save` folder)."""
        self.model.save(Path(checkpoint) / self.SUBDIR)

    def restore(self, checkpoint: str | Path) -> None:
        """Load the heads and encoder saved in ``checkpoint``, if it has them (resume)."""
        folder = Path(checkpoint) / self.SUBDIR
        if (folder / HEADS_FILE).is_file():
            self.model = PreferenceModel.load(folder)
            self.optimizer = make_optimizer(self.model, self.config)  # (Adam's moments start afresh)


class PreferenceCallback(TrainerCallback):
    """Saves a GRPO job's preference model into each TRL checkpoint (``checkpoint-N/preference``)."""

    def __init__(self, learner: PreferenceLearner) -> None:
        self.learner = learner

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:  # several processes: rank 0's learner saw every rank's episodes
            self.learner.save(Path(args.output_dir) / f"checkpoint-{state.global_step}")


def preference_learner(hp: Any, recipe: Any, seed: int = 0) -> PreferenceLearner | None:
    """The job's learner when ``hp.preference_model`` is on (EVO-RAG only), else None."""
    if not hp.preference_model or recipe.name != "evo-rag":
        return None
    return PreferenceLearner(
        recipe, PreferenceConfig(epochs=1, eval_share=hp.preference_eval_share, seed=seed)
    )


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
                context_text(episode_messages(ep.model_copy(update={"steps": ep.steps[:i]})))
                for i in range(len(ep.steps))
            ]
            scores = model.score([s.text for s in ep.steps], contexts)
            out.append(sum(float(weights(s.t) @ row) for s, row in zip(ep.steps, scores, strict=True)))
        return out

    return versioned("evo_rag_preference@1")(reward)
