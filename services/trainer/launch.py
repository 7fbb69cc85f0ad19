"""How a job's worker starts: one process, or ``accelerate launch`` over several; what the machine allows.

A job with ``processes: 1`` (the default) and no ``distributed`` config runs as before:
``python -m services.trainer.worker RUN_ID``. Otherwise the worker runs under ``accelerate launch``
(torchrun underneath): ``--multi_gpu`` for plain DDP (on CPU too, over gloo), or
``--config_file configs/accelerate/<distributed>.yaml`` for DeepSpeed ZeRO-2/3 and FSDP, with
``--num_processes`` from the job. Every rank runs the same worker; rank 0 alone writes the
registry and the checkpoint files (:mod:`hoprl.training.distributed`).

:func:`check_machine` refuses, with a 409 naming the field and the reason, what this trainer's
machine cannot run (``generation: vllm`` without CUDA or the gpu extra, more processes than
``TRAINER_MAX_PROCESSES``, DeepSpeed or FSDP without CUDA) and what the job loops cannot split
over processes or hand to vLLM (R2AG's rounds, PPO, DPO), before the job is queued. EVO-RAG's
preference model trains on rank 0, on the episodes of every rank.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import torch

from hoprl.ports import free_port
from hoprl.schemas.trainer import Hyperparameters, JobRequest
from services.errors import ApiError
from services.trainer.settings import TrainerSettings

#: objectives whose trainer is TRL's own loop, which accelerate splits over processes
MULTI_PROCESS_OBJECTIVES = ("grpo", "dapo", "dr_grpo", "sft")


def needs_launcher(hp: Hyperparameters) -> bool:
    return hp.processes > 1 or hp.distributed not in (None, "ddp")


def accelerate_config(hp: Hyperparameters, settings: TrainerSettings) -> Path | None:
    """The accelerate config file of ``hp.distributed`` (None for plain DDP)."""
    if hp.distributed in (None, "ddp"):
        return None
    return settings.accelerate_configs / f"{hp.distributed}.yaml"


def worker_command(python: str, run_id: str, hp: Hyperparameters, settings: TrainerSettings) -> list[str]:
    """The command that runs job ``run_id``'s worker (module docstring)."""
    worker = ["-m", "services.trainer.worker", run_id]
    if not needs_launcher(hp):
        return [python, *worker]
    launch = [python, "-m", "accelerate.commands.launch", "--num_processes", str(hp.processes),
              "--num_machines", "1", "--main_process_port", str(free_port()),
              "--dynamo_backend", "no"]  # fmt: skip
    config = accelerate_config(hp, settings)
    if config is None:
        launch += ["--multi_gpu", "--mixed_precision", "no"]  # precision: the TRL config's (bf16 or not)
    else:
        launch += ["--config_file", str(config)]
    return [*launch, *worker]


def max_processes(settings: TrainerSettings) -> int:
    """``TRAINER_MAX_PROCESSES``, else one per GPU (CUDA), else one per CPU core."""
    if settings.max_processes:
        return settings.max_processes
    return torch.cuda.device_count() if torch.cuda.is_available() else os.cpu_count() or 1


def check_machine(request: JobRequest, hp: Hyperparameters, settings: TrainerSettings) -> None:
    """409 for what this machine or the job's loop cannot run (module docstring): the request is
    schema-valid, this trainer's machine is what refuses it."""
    problem = machine_problem(request, hp, settings)
    if problem is not None:
        field, code, message = problem
        raise ApiError(409, code, f"hyperparameters.{field}: {message}")


def machine_problem(
    request: JobRequest, hp: Hyperparameters, settings: TrainerSettings
) -> tuple[str, str, str] | None:
    """``(field, code, message)`` of the first thing this trainer cannot run, or None."""
    cuda = torch.cuda.is_available()
    if hp.generation == "vllm" and not cuda:
        return ("generation", "vllm_unavailable",
                "vllm needs a CUDA GPU and this trainer has none; use generation 'transformers' here, "
                "or run the job on a GPU trainer (docs/gpus.md)")  # fmt: skip
    if hp.generation == "vllm" and importlib.util.find_spec("vllm") is None:
        return ("generation", "vllm_unavailable",
                "vllm is not installed on this trainer; install the gpu extra (pip install 'hoprl[gpu]') "
                "or use generation 'transformers'")  # fmt: skip
    if hp.distributed in ("zero2", "zero3", "fsdp"):
        config = accelerate_config(hp, settings)
        if not cuda:
            return ("distributed", "distributed_unavailable",
                    f"{hp.distributed} needs CUDA GPUs and this trainer has none; use ddp (or leave it "
                    "unset) on CPU")  # fmt: skip
        if hp.distributed.startswith("zero") and importlib.util.find_spec("deepspeed") is None:
            return ("distributed", "distributed_unavailable", "DeepSpeed is not installed on this trainer")
        if config is not None and not config.is_file():
            return ("distributed", "distributed_unavailable",
                    f"no accelerate config {config.name} in {settings.accelerate_configs} "
                    "(TRAINER_ACCELERATE_CONFIGS)")  # fmt: skip
    most = max_processes(settings)
    if hp.processes > most:
        return ("processes", "processes_too_large",
                f"{hp.processes} exceeds the {most} this trainer may start (one per GPU, or per CPU "
                "core; TRAINER_MAX_PROCESSES)")  # fmt: skip
    return loop_problem(request, hp)


def loop_problem(request: JobRequest, hp: Hyperparameters) -> tuple[str, str, str] | None:
    """``(field, code, message)`` when the job's training loop cannot do what ``hp`` asks, or None.

    vLLM generation, several processes and DeepSpeed / FSDP come from TRL and accelerate, so they
    are for the objectives TRL's trainers run (GRPO-family, SFT; vLLM for the GRPO-family only).
    R2AG's progressive rounds, PPO and DPO are the project's own loops: one process, transformers.
    """
    objective = request.objective or "grpo"
    siblings = hp.advantage == "siblings" and objective != "sft"  # EVO-RAG's sibling GRPO: its own loop
    trl_loop = objective in MULTI_PROCESS_OBJECTIVES and request.recipe != "r2ag" and not siblings
    loop = "R2AG's progressive rounds" if request.recipe == "r2ag" else f"the {objective} loop"
    loop = "the sibling GRPO loop (advantage siblings)" if siblings else loop
    if hp.generation == "vllm" and (not trl_loop or objective == "sft"):
        return ("generation", "generation_unsupported",
                f"{loop} generates with the training model itself; vllm rollouts are for grpo, dapo "
                "and dr_grpo jobs (not r2ag)")  # fmt: skip
    if hp.distributed in ("zero2", "zero3", "fsdp") and not trl_loop:
        return ("distributed", "distributed_unsupported",
                f"{loop} runs in one process without DeepSpeed or FSDP; leave distributed unset")  # fmt: skip
    if hp.processes > 1 and not trl_loop:
        return ("processes", "processes_unsupported",
                f"{loop} runs in one process; multi-process jobs train with "
                f"{', '.join(MULTI_PROCESS_OBJECTIVES)} (not r2ag)")  # fmt: skip
    if hp.processes > 1 and hp.questions_per_step % hp.processes:
        return ("processes", "processes_uneven",
                f"questions_per_step {hp.questions_per_step} does not split evenly over {hp.processes} "
                "processes (each rolls out whole groups)")  # fmt: skip
    return None
