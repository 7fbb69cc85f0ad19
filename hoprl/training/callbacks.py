"""What a job does around TRL's loop: registry writes, curricula, checkpoint state, progress.

:class:`RunCallback` is one ``TrainerCallback`` per job:

- **metrics**: every ``on_log`` (one per step) goes to the registry at the step, with the
  rollout's step statistics (``rollout_s``; per-episode means ``retrieval_s``, ``generation_s``,
  ``searches`` and ``answer_tokens``; how the episodes ended, ``ended/*``) and dynamic-sampling
  counts; a tqdm bar in the log shows the step's signals (:data:`POSTFIX`: reward ± its spread,
  the share of flat groups, the KL to the starting weights, the clip fraction, the answered share,
  loss and step time). An SFT job logs its loss, gradient norm and token accuracy the same way.
- **curricula** (:class:`Curricula`): when-to-search's stage 1 -> 2 is checked every step
  (by step count or a plateau of the mean training reward); EVO-RAG's Discovery -> Refinement is
  checked at every checkpoint on a dev split (its mean episode return). A switch is recorded in
  the registry with the reason and the metric that triggered it.
- **checkpoints**: after TRL writes ``checkpoint-N`` (weights, optimizer, scheduler, RNG,
  trainer state), ``hoprl_state.json`` is written beside them (step, curriculum state, stage) and
  the checkpoint is registered. A checkpoint without that file is incomplete (the job died while
  saving) and is never resumed from: see :func:`latest_complete_checkpoint`.
- **attempts**: every start of a job's worker is one attempt, numbered in ``<run dir>/attempt``
  by :func:`start_attempt` (the worker calls it before ``run_job``), which first deletes what
  earlier attempts recorded for the steps after the checkpoint it resumes from (episodes,
  metrics, stage switches, stages, checkpoint rows). Those steps run again, so each step's
  records come from one attempt: the one whose checkpoint holds the step, or the one that ran it
  last. The metric ``attempt`` at every step and ``meta["attempt"]`` on every stored GRPO
  episode say which.

The project's own loops (PPO / DPO in :mod:`hoprl.training.offpolicy`, R2AG's rounds in
:mod:`hoprl.training.r2ag_rounds`) write the same layout with :func:`save_loop_checkpoint`
(weights, tokenizer, ``optimizer.pt``, ``rng_state.pth``, then :data:`STATE_FILE` last, with a
``loop`` key naming the loop) and read it back with :func:`load_loop_checkpoint`.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from sqlalchemy import delete, update
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, TrainerCallback

from hoprl.registry.models import CheckpointRow, EpisodeRow, MetricRow, StageRow, StageSwitchRow
from hoprl.registry.store import Registry
from hoprl.training.lora import is_lora, save_merged, servable

log = logging.getLogger("hoprl.trainer")
STATE_FILE = "hoprl_state.json"
ATTEMPT_FILE = "attempt"


def latest_complete_checkpoint(output_dir: Path) -> Path | None:
    """The highest ``checkpoint-N`` folder that holds :data:`STATE_FILE` (fully written)."""
    done = [p for p in output_dir.glob("checkpoint-*") if (p / STATE_FILE).is_file()]
    return max(done, key=lambda p: int(p.name.split("-")[-1]), default=None)


def current_attempt(output_dir: str | Path) -> int:
    """The number of the run's current attempt (``<output_dir>/attempt``; 1 before any)."""
    path = Path(output_dir) / ATTEMPT_FILE
    return int(path.read_text()) if path.is_file() else 1


def start_attempt(registry: Registry, run_id: str, output_dir: Path) -> int:
    """Begin a new attempt at run ``run_id`` and return its number (1, 2, ...).

    The attempt resumes after step ``C``, its latest complete checkpoint's (0 without one: a job
    that starts from another job's checkpoint has committed nothing of its own yet). Whatever
    earlier attempts recorded for steps after ``C`` is deleted in one transaction, because this
    attempt runs those steps again: a killed attempt's episodes would otherwise stay beside the
    re-run's metrics (episodes are insert-if-absent, metrics overwrite), and a stage switch it
    made would stay even when the re-run switches elsewhere. Stages opened after ``C`` go, a stage
    closed after ``C`` is open again, and checkpoint ``C`` is registered if the kill came between
    writing it and registering it.
    """
    checkpoint = latest_complete_checkpoint(output_dir)
    step = int(json.loads((checkpoint / STATE_FILE).read_text())["step"]) if checkpoint else 0
    counter = output_dir / ATTEMPT_FILE
    attempt = int(counter.read_text()) + 1 if counter.is_file() else 1
    output_dir.mkdir(parents=True, exist_ok=True)
    counter.write_text(str(attempt))
    with registry.session() as s:
        for row in (EpisodeRow, MetricRow, StageSwitchRow, CheckpointRow):
            s.execute(delete(row).where(row.run_id == run_id, row.step > step))
        s.execute(delete(StageRow).where(StageRow.run_id == run_id, StageRow.started_at_step > step))
        reopen = update(StageRow).where(StageRow.run_id == run_id, StageRow.ended_at_step > step)
        s.execute(reopen.values(ended_at_step=None))
    if checkpoint is not None:
        registry.add_checkpoint(run_id, step, str(servable(checkpoint)), registry.latest_metrics(run_id))
    log.info(
        "run %s: attempt %d, resuming after step %d (records of later steps deleted)", run_id, attempt, step
    )
    return attempt


def save_loop_checkpoint(output_dir: str | Path, step: int, model: Any, tokenizer: Any, optimizer: Any,
                         registry: Registry, run_id: str, state: dict[str, Any],
                         extra: Callable[[Path], None] | None = None) -> Path:  # fmt: skip
    """``checkpoint-{step}`` in the TRL layout for a project loop; ``extra(folder)`` adds the loop's
    own files; :data:`STATE_FILE` is written last (``{"step": step, **state}``), then the
    checkpoint is registered with the latest metrics."""
    folder = Path(output_dir) / f"checkpoint-{step}"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if extra is not None:
        extra(folder)
    torch.save(optimizer.state_dict(), folder / "optimizer.pt")
    torch.save({"python": random.getstate(), "torch": torch.get_rng_state()}, folder / "rng_state.pth")
    (folder / STATE_FILE).write_text(json.dumps({"step": step, **state}, indent=1))
    registry.add_checkpoint(run_id, step, str(folder), registry.latest_metrics(run_id))
    log.info("checkpoint %s (stage %s)", folder, state.get("stage"))
    return folder


def load_loop_checkpoint(folder: str | Path, model: Any, optimizer: Any, loop: str) -> dict[str, Any]:
    """Load ``folder``'s weights into ``model``; when the checkpoint was written by the same ``loop``,
    also the optimizer and RNG state, and return its state. A checkpoint of another kind (a GRPO
    job's, say) only warm-starts the weights: the returned state is ``{"step": 0}``."""
    folder = Path(folder)
    model.load_state_dict(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict())
    state = json.loads((folder / STATE_FILE).read_text()) if (folder / STATE_FILE).is_file() else {}
    if state.get("loop") != loop:
        log.info("checkpoint %s is not a %s checkpoint: weights only, starting at step 0", folder, loop)
        return {"step": 0}
    optimizer.load_state_dict(torch.load(folder / "optimizer.pt"))
    rng = torch.load(folder / "rng_state.pth", weights_only=False)
    random.setstate(rng["python"])
    torch.set_rng_state(rng["torch"])
    return dict(state)


class Curricula:
    """The recipe's curriculum as run state: check, switch, save, restore.

    Args:
        recipe: its ``curriculum`` attribute (when-to-search or EVO-RAG), if any, is driven.
        dev_return: ``() -> mean dev return`` for EVO-RAG's checks (rolls out the dev split).
    """

    def __init__(self, recipe: Any, dev_return: Callable[[], float] | None = None) -> None:
        self.recipe, self.dev_return = recipe, dev_return
        self.curriculum: Any = getattr(recipe, "curriculum", None)

    @property
    def stage(self) -> str | None:
        if self.curriculum is None:
            return None
        stage = self.curriculum.stage
        return f"stage{stage}" if isinstance(stage, int) else str(stage)

    def on_step(self, step: int, mean_reward: float) -> dict[str, Any] | None:
        """When-to-search: one check per step; returns the switch record, if it switched."""
        if self.recipe.name != "when-to-search":
            return None
        before = self.stage
        if not self.curriculum.update(step, mean_reward):
            return None
        how = self.curriculum.mode
        reason = f"step {step} >= switch_step" if how == "steps" else "mean-reward EMA plateaued"
        return {"from_stage": before, "to_stage": self.stage, "reason": reason,
                "metric_name": "reward_ema" if how == "plateau" else "step",
                "metric_value": self.curriculum.ema if how == "plateau" else float(step)}  # fmt: skip

    def on_checkpoint(self) -> dict[str, Any] | None:
        """EVO-RAG: one dev check per checkpoint; returns the switch record, if it switched."""
        if self.recipe.name != "evo-rag" or self.dev_return is None:
            return None
        before, value = self.stage, self.dev_return()
        if not self.curriculum.update(value):
            return None
        reason = f"dev return EMA improved < {self.curriculum.eps} for {self.curriculum.patience} checks"
        return {"from_stage": before, "to_stage": self.stage, "reason": reason,
                "metric_name": "dev_return", "metric_value": value}  # fmt: skip

    def state(self) -> dict[str, Any] | None:
        return None if self.curriculum is None else self.curriculum.to_dict()

    def restore(self, state: dict[str, Any] | None) -> None:
        """Load a saved state **in place**: reward closures hold the curriculum object itself."""
        if self.curriculum is None or state is None:
            return
        for key, value in type(self.curriculum).from_dict(state).model_dump().items():
            setattr(self.curriculum, key, value)


#: the progress bar's fields: (metric, label), in order; a metric the step did not log is left out
POSTFIX = (
    ("reward", "reward"),
    ("reward_std", "±"),
    ("frac_reward_zero_std", "flat"),
    ("warm_start_kl/k3", "kl0"),
    ("clip_ratio/region_mean", "clip"),
    ("ended/answer", "answered"),
    ("loss", "loss"),
    ("step_time", "s"),
)


def postfix(metrics: dict[str, float]) -> dict[str, str]:
    """The tqdm postfix of one step: :data:`POSTFIX`'s metrics that are there, 3 significant digits.

    >>> postfix({"reward": 0.5, "reward_std": 0.25, "loss": 0.01234})
    {'reward': '0.5', '±': '0.25', 'loss': '0.0123'}
    """
    return {label: f"{metrics[k]:.3g}" for k, label in POSTFIX if k in metrics}


class RunCallback(TrainerCallback):
    """Registry, curricula, checkpoint state and the progress bar for one run."""

    def __init__(self, registry: Registry, run_id: str, curricula: Curricula, rollout: Any = None) -> None:
        self.registry, self.run_id, self.curricula, self.rollout = registry, run_id, curricula, rollout
        self.bar: Any = None
        self.attempt = 1

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.attempt = current_attempt(args.output_dir)  # numbered by start_attempt before training
        if self.rollout is not None:
            self.rollout.attempt = self.attempt
        if not state.is_world_process_zero:  # several processes: rank 0 alone writes (distributed.py)
            return
        if self.curricula.stage is not None and self.registry.current_stage(self.run_id) is None:
            self.registry.start_stage(self.run_id, self.curricula.stage, state.global_step)
        self.bar = tqdm(total=state.max_steps, initial=state.global_step, desc=self.run_id, mininterval=0)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:  # fmt: skip
        metrics = {k: float(v) for k, v in (logs or {}).items() if isinstance(v, int | float)}
        if "train_runtime" in metrics or not state.is_world_process_zero:  # a summary, or not rank 0
            return
        if self.rollout is not None:
            metrics.update(self.rollout.step_stats)
            metrics.update({f"dynamic/{k}": float(v) for k, v in self.rollout.counts.items()})
        metrics["step"] = float(state.global_step)
        metrics["attempt"] = float(self.attempt)
        self.registry.log_metrics(self.run_id, state.global_step, metrics)
        if self.bar is not None:
            self.bar.n = state.global_step
            self.bar.set_postfix(postfix(metrics), refresh=True)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        totals = getattr(self.rollout, "last_totals", None)
        if totals:  # every rank decides on the step's gathered totals; rank 0 records
            switch = self.curricula.on_step(state.global_step, sum(totals) / len(totals))
            self._record(state.global_step, switch, state.is_world_process_zero)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = state.global_step
        self._record(step, self.curricula.on_checkpoint(), state.is_world_process_zero)
        if not state.is_world_process_zero:
            return
        folder = Path(args.output_dir) / f"checkpoint-{step}"
        model = kwargs.get("model")
        if model is not None and is_lora(model):  # a whole model to serve, beside TRL's adapter files
            save_merged(model, kwargs["processing_class"], folder)
        payload = {"step": step, "stage": self.curricula.stage, "curriculum": self.curricula.state()}
        (folder / STATE_FILE).write_text(json.dumps(payload, indent=1))
        self.registry.add_checkpoint(
            self.run_id, step, str(servable(folder)), self.registry.latest_metrics(self.run_id)
        )
        log.info("checkpoint %s (stage %s)", folder, payload["stage"])

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.bar is not None:
            self.bar.close()

    def _record(self, step: int, switch: dict[str, Any] | None, writer: bool = True) -> None:
        if switch is not None and writer:
            log.info("stage switch at step %d: %s", step, switch)
            self.registry.record_stage_switch(self.run_id, step, **switch)
