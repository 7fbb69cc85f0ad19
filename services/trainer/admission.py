"""What a client may ask the trainer for: files inside the configured roots, sizes within the limits.

``POST /v1/jobs`` names files on the trainer's machine (``dataset``, ``model``, ``resume_from``), and
the job runs with the service's rights. :func:`admit` checks a request before it is queued:

- **datasets**: ``synthetic[:SEED[:MAX_HOPS[:TEST]]]``, a hub name (``hotpotqa``, ...), ``paper:<recipe>``
  (a paper's training set from the hub), or a JSONL file that resolves (symlinks and ``..``
  followed) inside ``TRAINER_DATA_ROOTS`` or the runs folders;
- **models and checkpoints**: a job id (its latest checkpoint), a Hugging Face id ``org/name``, or a
  folder that resolves inside ``TRAINER_MODEL_ROOTS``, the model cache's folder or the runs folders;
- **sizes**: steps, questions and generations per step, tokens per step and per episode, and the
  tokens a whole job may generate, each within a ``TRAINER_MAX_*`` setting;
- **what the job needs exists**: its ``collection`` in the retriever (404), a hub model in the local
  Hugging Face cache or on the hub (404; 503 while the hub cannot be asked), and a shape that can
  run: at least ``questions_per_step`` training questions (``max_train_questions``, and a JSONL
  file's own size, after the dev questions it keeps back).

Anything else is a 4xx naming the setting that would allow it. The statuses follow one rule: 422
only for what breaks the published schema (the request models), 404 for a name that resolves to
nothing, 403 for a path outside the roots, 409 for a request the schema allows but this trainer's
settings, machine or files cannot run (a size over a limit, a machine without GPUs, a folder that
is no checkpoint, a dataset too small). A path outside the roots is refused before anything is
opened, so the answer is the same whether the file exists or not, and no error carries a file's
content. The admitted request has every path made absolute, so the worker opens exactly what was
checked.

**Leases.** A job that names a ``collection`` holds a lease on it in the retriever
(:func:`hold_collection`, ``PUT /v1/collections/{name}/leases/{job id}``) from its submission to its
end (:func:`release_collection`, called by the queue when the job finishes, fails or is cancelled),
so the retriever answers 409 to a ``DELETE`` of a collection a queued or running job trains on. The
lease lives in the retriever, in the collection's metadata: the retriever imports nothing of the
trainer, and needs no registry to answer.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path

import httpx
from huggingface_hub import HfApi, constants, try_to_load_from_cache
from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

from hoprl.clients.http import ServiceError
from hoprl.clients.retriever import RetrieverClient
from hoprl.data.hub import HUB
from hoprl.generation.model import is_checkpoint
from hoprl.jobspec import resolve
from hoprl.registry.store import Registry
from hoprl.schemas.trainer import Hyperparameters, JobRequest
from services.errors import ApiError
from services.trainer.launch import check_machine
from services.trainer.settings import TrainerSettings

log = logging.getLogger("hoprl.trainer")
#: a Hugging Face model id: ``org/name``
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
#: seconds to wait for the retriever or the hub while admitting a job
ADMISSION_TIMEOUT_S = 10.0


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
            403,
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
            404,
            "unknown_dataset",
            f"dataset {_shown(value)} is neither synthetic[:SEED[:MAX_HOPS[:TEST]]], paper:<recipe>, a hub "
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
        return admit_hub_model(value)  # from_pretrained would load a local folder of that name first
    path = confine(value, settings.checkpoint_roots, field, "TRAINER_MODEL_ROOTS")
    if not path.is_dir():
        raise ApiError(
            404, "checkpoint_not_found", f"{field} {_shown(value)}: no such job, hub id or checkpoint folder"
        )
    if field == "model" and not is_checkpoint(path):
        raise ApiError(409, "not_a_checkpoint", f"model {_shown(value)} holds no config.json and weights")
    return str(path)


def admit_hub_model(value: str) -> str:
    """A hub id the worker can load: in the local Hugging Face cache, or on the hub; else 404 (503
    while the hub cannot be asked), instead of a job that fails at its start."""
    if isinstance(try_to_load_from_cache(value, "config.json"), str):
        return value
    if constants.HF_HUB_OFFLINE:
        raise ApiError(
            404, "model_not_found",
            f"model {_shown(value)} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set; "
            "download it first (huggingface-cli download) or name a checkpoint folder",
        )  # fmt: skip
    try:
        HfApi().model_info(value, timeout=ADMISSION_TIMEOUT_S)
    except (RepositoryNotFoundError, GatedRepoError):
        raise ApiError(
            404, "model_not_found", f"model {_shown(value)}: no such model on the Hugging Face hub (or "
            "it is private or gated)",
        ) from None  # fmt: skip
    except Exception as exc:  # no network, a hub outage: the job could not load it either
        raise ApiError(
            503, "hub_unreachable",
            f"model {_shown(value)} is not in the local Hugging Face cache and the hub could not be "
            f"asked ({type(exc).__name__}); download it first or retry",
        ) from None  # fmt: skip
    return value


def admit_collection(name: str, settings: TrainerSettings) -> None:
    """404 unless the retriever holds ``name``; 503 when the retriever does not answer."""
    try:
        with RetrieverClient(settings.retriever_url, timeout=ADMISSION_TIMEOUT_S) as client:
            client.info(name)
    except ServiceError as exc:
        if exc.status == 404:
            raise ApiError(
                404, "collection_not_found",
                f"collection {_shown(name)} does not exist in the retriever ({settings.retriever_url}); "
                "ingest it first, or leave collection unset to index the dataset's paragraphs",
            ) from None  # fmt: skip
        raise ApiError(
            503, "retriever_unavailable", f"the retriever could not check the collection: {exc}"
        ) from None
    except (httpx.TransportError, httpx.InvalidURL) as exc:
        raise ApiError(
            503, "retriever_unavailable",
            f"the retriever at {settings.retriever_url} (TRAINER_RETRIEVER_URL) did not answer: "
            f"{type(exc).__name__}",
        ) from None  # fmt: skip


def hold_collection(name: str, run_id: str, settings: TrainerSettings) -> None:
    """Lease ``name`` in the retriever for job ``run_id`` (module docstring); 404 / 503 as
    :func:`admit_collection` (the collection may have gone since it was checked)."""
    try:
        with RetrieverClient(settings.retriever_url, timeout=ADMISSION_TIMEOUT_S) as client:
            client.lease(name, run_id)
    except (ServiceError, httpx.TransportError, httpx.InvalidURL):
        admit_collection(name, settings)  # says why, in the same words
        raise ApiError(503, "retriever_unavailable", f"the retriever did not lease {_shown(name)}") from None


def release_collection(run_id: str, registry: Registry, settings: TrainerSettings) -> None:
    """Release job ``run_id``'s lease on its collection, if it named one; never raises (a lease the
    retriever keeps by mistake is released by hand: DELETE /v1/collections/{name}/leases/{id})."""
    run = registry.get_run(run_id)
    name = ((run.config or {}).get("request") or {}).get("collection") if run is not None else None
    if not name:
        return
    try:
        with RetrieverClient(settings.retriever_url, timeout=ADMISSION_TIMEOUT_S) as client:
            client.lease(name, run_id, held=False)
    except Exception as exc:  # the queue must go on; the 409 names the job, so it can be released
        log.warning("could not release job %s's lease on collection %s: %s", run_id, name, exc)


def train_questions(request: JobRequest, hp: Hyperparameters) -> int | None:
    """How many training questions the job will have, when known before it runs: a JSONL file's
    questions minus the dev ones it keeps back (as :func:`services.trainer.jobs.load_splits`), at
    most ``max_train_questions``; None when only the loader can tell (hub or synthetic data)."""
    counts = []
    if hp.max_train_questions is not None:
        counts.append(hp.max_train_questions)
    path = Path(request.dataset)
    if path.is_file():
        with path.open("rb") as lines:
            n = sum(1 for line in lines if line.strip())
        counts.append(n - min(hp.eval_questions, n // 4))
    return min(counts) if counts else None


def check_shape(request: JobRequest, hp: Hyperparameters) -> None:
    """409 for a job that cannot fill one step with training questions."""
    n = train_questions(request, hp)
    if n is not None and n < hp.questions_per_step:
        raise ApiError(
            409, "job_cannot_run",
            f"hyperparameters.questions_per_step = {hp.questions_per_step}, but the job has {n} training "
            "question(s) (max_train_questions, or the dataset file less its dev questions): it could "
            "not fill one step; ask for fewer questions per step or more training questions",
        )  # fmt: skip


def job_tokens(request: JobRequest, hp: Hyperparameters) -> int:
    """The most completion tokens a job can generate: every episode of every step at its budget.

    Dynamic sampling may redraw each question up to ``max_resample`` more times.
    """
    draws = 1 + (hp.max_resample if hp.dynamic_sampling else 0)
    return request.steps * hp.questions_per_step * hp.num_generations * draws * hp.token_budget


def check_limits(request: JobRequest, hp: Hyperparameters, settings: TrainerSettings) -> None:
    """409 naming the first size over its ``TRAINER_MAX_*`` setting."""
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
                409, f"{code}_too_large", f"{name} = {value} exceeds the limit {limit} ({setting})"
            )
    if hp.num_generations < 2 and request.objective not in ("ppo", "sft"):
        raise ApiError(
            422, "num_generations_too_small",
            f"num_generations = {hp.num_generations}: {request.objective} compares at least 2 samples "
            "(a group or sibling candidates); only ppo trains on one episode a question",
        )  # fmt: skip


def trl_only_loop(request: JobRequest, hp: Hyperparameters) -> str | None:
    """The loop a job trains in when it is not TRL's GRPO family (None when it is)."""
    if request.objective not in ("grpo", "dapo", "dr_grpo"):
        return f"objective {request.objective}"
    if hp.advantage == "siblings":
        return "advantage = siblings (EVO-RAG's sibling loop)"
    if request.recipe == "r2ag":
        return "r2ag's rounds"
    return None


def check_trl_options(request: JobRequest, hp: Hyperparameters) -> None:
    """409 for a placebo, LoRA, micro-batches or a checkpointing choice on a loop that is not TRL's
    GRPO family (they live there), and for micro-batches that do not divide a process's episodes of
    a step: schema-valid requests this trainer cannot run (the schema cannot relate the fields)."""
    asked = [("placebo", "does not permute rewards")] if hp.placebo else []
    if hp.lora_rank is not None:
        asked.append(("lora_rank", "trains every weight"))
    if hp.micro_batch is not None:
        asked.append(("micro_batch", "sizes its own passes"))
    if hp.gradient_checkpointing is not None:
        asked.append(("gradient_checkpointing", "keeps its own activations"))
    loop = trl_only_loop(request, hp) if asked else None
    if loop is None:
        batch = hp.questions_per_step * hp.num_generations // max(hp.processes, 1)
        if hp.micro_batch is not None and batch % min(hp.micro_batch, batch):
            raise ApiError(
                409, "micro_batch_indivisible",
                f"hyperparameters.micro_batch = {hp.micro_batch} does not divide the {batch} episodes a "
                "process trains each step (questions_per_step x num_generations / processes)",
            )  # fmt: skip
        return
    field, what = asked[0]
    raise ApiError(
        409, f"{field}_unsupported",
        f"hyperparameters.{field}: {loop} {what}; {field} works with grpo, dapo or dr_grpo through TRL "
        "(advantage sequence or per_step)",
    )  # fmt: skip


def admit(request: JobRequest, settings: TrainerSettings, registry: Registry) -> JobRequest:
    """``request`` with its paths checked and made absolute, its sizes within the limits; else 4xx."""
    hp = resolve(request.hyperparameters, request.recipe, request.objective)
    check_limits(request, hp, settings)
    check_trl_options(request, hp)
    check_machine(request, hp, settings)
    updates = {"dataset": admit_dataset(request.dataset, settings)}
    if request.model is not None:
        updates["model"] = admit_checkpoint(request.model, settings, registry, "model")
    if request.resume_from is not None:
        updates["resume_from"] = admit_checkpoint(request.resume_from, settings, registry, "resume_from")
    admitted = request.model_copy(update=updates)
    check_shape(admitted, hp)
    if request.collection:
        admit_collection(request.collection, settings)
    return admitted
