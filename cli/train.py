"""``hoprl train``: submit a config's job to a running trainer service, and optionally follow it.

    hoprl train --config configs/search-r1.yaml                  # the paper's size (GPUs: docs/gpus.md)
    hoprl train --config configs/search-r1.yaml --small --wait   # a toy run on a CPU, followed to its end
    hoprl train --config configs/r2ag.yaml --hyperparameters '{"processes": 4}'

The job is the config file's request (:func:`hoprl.configs.load_config`, ``--small`` applying its
``small:`` section) with the options given here over it: ``--model``, ``--dataset``, ``--steps``,
``--seed`` replace the file's value, ``--hyperparameters`` merges into the file's key by key
(``null`` removes a key, so the trainer's default applies). The trainer is ``--trainer-url``, else
``$HOPRL_TRAINER_URL``, else ``http://127.0.0.1:8004`` (``hoprl serve trainer``); the API key is
``$HOPRL_API_KEY``. Standard output gets one JSON object: the queued job, or with ``--wait`` the
finished one.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from hoprl.schemas.trainer import Job, JobRequest
from hoprl.settings import get_settings

DEFAULT_TRAINER_URL = "http://127.0.0.1:8004"
POLL_S = 2.0

console = Console(stderr=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``hoprl train`` (for :mod:`cli.main`)."""
    parser.add_argument("--config", type=Path, required=True, help="a job config, e.g. configs/r2ag.yaml")
    parser.add_argument(
        "--small", action="store_true", help="apply the config's small: section (a toy run on a CPU)"
    )
    parser.add_argument(
        "--trainer-url",
        default=None,
        help=f"the trainer service; default $HOPRL_TRAINER_URL, else {DEFAULT_TRAINER_URL}",
    )
    parser.add_argument("--wait", action="store_true", help="follow the job until it ends")
    parser.add_argument("--model", default=None, help="HF id or checkpoint folder (replaces the config's)")
    parser.add_argument("--dataset", default=None, help="replaces the config's dataset")
    parser.add_argument("--steps", type=int, default=None, help="replaces the config's steps")
    parser.add_argument("--seed", type=int, default=None, help="replaces the config's seed")
    parser.add_argument(
        "--hyperparameters",
        type=json.loads,
        default=None,
        help="JSON merged into the config's hyperparameters (null removes a key), e.g. "
        '\'{"processes": 2, "distributed": "zero2"}\'',
    )


def job_request(args: argparse.Namespace) -> JobRequest:
    """The config file's request with the command's explicit options over it (ConfigError if invalid)."""
    from hoprl.configs import ConfigError, merge
    from hoprl.jobspec import load_config, set_fields, validate_request

    fields = set_fields(load_config(args.config, small=args.small))
    overrides: dict[str, Any] = {
        key: value
        for key in ("model", "dataset", "steps", "seed")
        if (value := getattr(args, key)) is not None
    }
    if args.hyperparameters is not None:
        if not isinstance(args.hyperparameters, dict):
            raise ConfigError("--hyperparameters must be a JSON object, e.g. '{\"processes\": 2}'")
        overrides["hyperparameters"] = args.hyperparameters
    return validate_request(merge(fields, overrides), f"config {args.config} with the command's options")


def describe(request: JobRequest) -> str:
    """One line: what the job trains, on what, with which engine and how many processes."""
    hp = request.hyperparameters
    engine = f"vllm ({hp.vllm_mode})" if hp.generation == "vllm" else hp.generation
    launch = f"{hp.processes} process(es)" + (f" with {hp.distributed}" if hp.distributed else "")
    return (
        f"{request.recipe} / {request.objective}, {request.steps} steps, model {request.model or 'default'}, "
        f"dataset {request.dataset}, preset {hp.preset}; rollouts on {engine}, {launch}"
    )


def follow(client: Any, job_id: str) -> Job:
    """Poll the job, printing each new step with its reward, until it succeeds, fails or is cancelled."""
    from hoprl.clients.trainer import TERMINAL

    last = -1
    while True:
        job: Job = client.get(job_id)
        if job.step != last:
            last = job.step
            metrics = [f"{k} {job.metrics[k]:.3g}" for k in ("reward", "loss") if k in job.metrics]
            console.print(", ".join([f"{job.id} {job.status}: step {job.step}/{job.steps}", *metrics]))
        if job.status in TERMINAL:
            return job
        time.sleep(POLL_S)


def main(args: argparse.Namespace) -> int:
    """The body of ``hoprl train``: submit, print the job (stdout), follow it with ``--wait``."""
    import httpx

    from hoprl.clients.http import ServiceError
    from hoprl.clients.trainer import TrainerClient
    from hoprl.configs import ConfigError

    try:
        request = job_request(args)
    except ConfigError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    url = args.trainer_url or get_settings().trainer_url or DEFAULT_TRAINER_URL
    with TrainerClient(url) as client:
        try:
            created = client.submit(request)
        except ServiceError as exc:
            console.print(f"[red]error:[/red] the trainer at {url} refused the job: {exc}")
            return 2
        except httpx.TransportError as exc:
            console.print(f"[red]error:[/red] no trainer answers at {url} ({exc}); start one with "
                          "`hoprl serve trainer` or pass --trainer-url")  # fmt: skip
            return 2
        console.print(f"job {created.id} {created.status} at {url}: {describe(request)}")
        if not args.wait:
            print(created.model_dump_json())
            return 0
        try:
            job = follow(client, created.id)
        except KeyboardInterrupt:
            console.print(
                f"stopped following; job {created.id} goes on "
                f"(cancel it: POST {url}/v1/jobs/{created.id}/cancel)"
            )
            return 130
    print(job.model_dump_json())
    if job.status != "succeeded":
        console.print(f"[red]job {job.id} {job.status}[/red]" + (f": {job.error}" if job.error else ""))
    return 0 if job.status == "succeeded" else 1
