"""What a client may ask the trainer for: files inside the configured roots, sizes within the limits.

``POST /v1/jobs`` names files on the trainer's machine (``dataset``, ``model``, ``resume_from``), and
the job runs with the service's rights. :func:`admit` checks a request before it is queued:

- **datasets**: ``synthetic[:SEED[:MAX_HOPS]]``, a hub name (``hotpotqa``, ...), ``paper:<recipe>``
  (a paper's training set from the hub), or a JSONL file that resolves (symlinks and ``..``
  followed) inside ``TRAINER_DATA_ROOTS`` or the runs folders;
- **models and checkpoints**: a job id (its latest checkpoint), a Hugging Face id ``org/name``, or a
  folder that resolves inside ``TRAINER_MODEL_ROOTS``, the model cache's folder or the runs folders;
- **sizes**: steps, questions and generations per step, tokens per step and per episode, and the
  tokens a whole job may generate, each within a ``TRAINER_MAX_*`` setting.

Anything else is a 4xx naming the setting that would allow it. A path outside the roots is refused
before anything is opened, so the answer is the same whether the file exists or not, and no error
carries a file's content. The admitted request has every path made absolute, so the worker opens
exactly what was checked.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from hoprl.data.hub import HUB
from hoprl.generation.model import is_checkpoint
from hoprl.jobspec import resolve
from hoprl.registry.store import Registry
from hoprl.schemas.trainer import Hyperparameters, JobRequest
from services.errors import ApiError
from services.trainer.launch import check_machine
from services.trainer.settings import TrainerSettings

#: a Hugging Face model id: ``org/name``
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _shown(value: str) -> str:
    return repr(value if len(value) <= 200 else value[:200] + "...")


def confine(value: str, roots: Sequence[Path], field: str, setting: str) -> Path:
    """``value`` resolved to an absolute path inside one of ``roots``; 422 naming ``setting`` otherwise."""
    try:
        path = Path(value).resolve()
    except (OSError, RuntimeError, ValueError):  # a NUL byte, a symlink loop
        raise ApiError(422, "invalid_path", f"{field} {_shown(value)} is not a usable path") from None
    allowed = [root.resolve() for root in roots]
    if not any(path.is_relative_to(root) for root in allowed):
        raise ApiError(
            422,
            "path_not_allowed",
            f"{field} {_shown(value)} is outside the folders the trainer may read "
            f"({', '.join(map(str, allowed))}); move it there or add its folder to {setting}",
        )
    return path


def _is_named_dataset(value: str) -> bool:
    """A hub name, ``synthetic[:...]``, or ``paper:<recipe>`` (a paper's training set from the hub)."""
    kind, _, rest = value.partition(":")
    return value in HUB or kind == "synthetic" or (kind == "paper" and bool(rest) and ":" not in rest)


def admit_dataset(value: str, settings: TrainerSettings) -> str:
    """A dataset name as given, or the absolute path of a JSONL file inside the data roots."""
    if _is_named_dataset(value) and not Path(value).exists():  # the loader prefers a file of that name
        return value
    if not any(mark in value for mark in ("/", "\\", ".jsonl")) and not Path(value).exists():
        raise ApiError(
            422,
            "unknown_dataset",
            f"dataset {_shown(value)} is neither synthetic[:SEED[:MAX_HOPS]], paper:<recipe>, a hub "
            f"dataset ({', '.join(HUB)}), nor a JSONL file path",
        )
    path = confine(value, settings.dataset_roots, "dataset", "TRAINER_DATA_ROOTS")
    if not path.is_file():
        raise ApiError(404, "dataset_not_found", f"dataset {_shown(value)}: no such file in the data roots")
    return str(path)


def admit_checkpoint(value: str, settings: TrainerSettings, registry: Registry, field: str) -> str:
    """A job id or HF id as given, or the absolute path of a checkpoint folder inside the model roots."""
    if registry.get_run(value) is not None:
        return value
    if field == "model" and HUB_ID.match(value) and not Path(value).exists():
        return value  # from_pretrained would load a local folder of that name first
    path = confine(value, settings.checkpoint_roots, field, "TRAINER_MODEL_ROOTS")
    if not path.is_dir():
        raise ApiError(
            404, "checkpoint_not_found", f"{field} {_shown(value)}: no such job, hub id or checkpoint folder"
        )
    if field == "model" and not is_checkpoint(path):
        raise ApiError(422, "not_a_checkpoint", f"model {_shown(value)} holds no config.json and weights")
    return str(path)


def job_tokens(request: JobRequest, hp: Hyperparameters) -> int:
    """The most completion tokens a job can generate: every episode of every step at its budget.

    Dynamic sampling may redraw each question up to ``max_resample`` more times.
    """
    draws = 1 + (hp.max_resample if hp.dynamic_sampling else 0)
    return request.steps * hp.questions_per_step * hp.num_generations * draws * hp.token_budget


def check_limits(request: JobRequest, hp: Hyperparameters, settings: TrainerSettings) -> None:
    """422 naming the first size over its ``TRAINER_MAX_*`` setting."""
    sizes = [
        ("steps", request.steps, settings.max_steps, "TRAINER_MAX_STEPS"),
        ("questions_per_step", hp.questions_per_step, settings.max_questions_per_step,
         "TRAINER_MAX_QUESTIONS_PER_STEP"),
        ("num_generations", hp.num_generations, settings.max_num_generations, "TRAINER_MAX_NUM_GENERATIONS"),
        ("max_new_tokens_per_step", hp.max_new_tokens_per_step, settings.max_new_tokens_per_step,
         "TRAINER_MAX_NEW_TOKENS_PER_STEP"),
        ("token_budget", hp.token_budget, settings.max_token_budget, "TRAINER_MAX_TOKEN_BUDGET"),
        ("eval_questions", hp.eval_questions, settings.max_eval_questions, "TRAINER_MAX_EVAL_QUESTIONS"),
        ("job tokens (steps x questions_per_step x num_generations x draws x token_budget)",
         job_tokens(request, hp), settings.max_job_tokens, "TRAINER_MAX_JOB_TOKENS"),
    ]  # fmt: skip
    for name, value, limit, setting in sizes:
        if value > limit:
            code = name.split(" ")[0]
            raise ApiError(
                422, f"{code}_too_large", f"{name} = {value} exceeds the limit {limit} ({setting})"
            )
    if hp.num_generations < 2 and request.objective not in ("ppo", "sft"):
        raise ApiError(
            422, "num_generations_too_small",
            f"num_generations = {hp.num_generations}: {request.objective} compares at least 2 samples "
            "(a group or sibling candidates); only ppo trains on one episode a question",
        )  # fmt: skip


def admit(request: JobRequest, settings: TrainerSettings, registry: Registry) -> JobRequest:
    """``request`` with its paths checked and made absolute, its sizes within the limits; else 4xx."""
    hp = resolve(request.hyperparameters, request.recipe, request.objective)
    check_limits(request, hp, settings)
    check_machine(request, hp, settings)
    updates = {"dataset": admit_dataset(request.dataset, settings)}
    if request.model is not None:
        updates["model"] = admit_checkpoint(request.model, settings, registry, "model")
    if request.resume_from is not None:
        updates["resume_from"] = admit_checkpoint(request.resume_from, settings, registry, "resume_from")
    return request.model_copy(update=updates)
