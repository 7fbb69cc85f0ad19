"""Trainer settings: environment variables with the ``TRAINER_`` prefix."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from hoprl.settings import get_settings
from services.settings import ServiceSettings


def _flows_runs_dir() -> Path:
    """The flows' runs folder (``$HOPRL_RUNS_DIR``, default ``runs``): where a pipeline prepares its data."""
    return get_settings().runs_dir


def _default_data_roots() -> list[Path]:
    return [Path("data"), Path("../shared/data"), _flows_runs_dir()]


def _default_model_roots() -> list[Path]:
    return [_flows_runs_dir()]


class TrainerSettings(ServiceSettings):
    """Where runs are recorded and written, what the jobs talk to, how the queue polls.

    Every field reads ``TRAINER_<FIELD>`` (e.g. ``TRAINER_RUNS_DIR``); the registry URL is also
    read from the project-wide ``HOPRL_DATABASE_URL``.
    """

    model_config = SettingsConfigDict(env_prefix="TRAINER_", extra="forbid", populate_by_name=True)

    database_url: str | None = Field(
        None,
        validation_alias=AliasChoices("TRAINER_DATABASE_URL", "HOPRL_DATABASE_URL"),
        description="run registry URL; unset = sqlite:///.hoprl/registry.db",
    )
    runs_dir: Path = Field(Path(".hoprl/runs"), description="one folder per job: checkpoints and logs")
    retriever_url: str = Field("http://127.0.0.1:8001", description="the retriever rollouts search")
    judge_url: str | None = Field(
        None,
        description="the judge service the rewards call (EVO-RAG, when-to-search); unset = rules",
    )
    default_model: str | None = Field(None, description="HF id or folder; unset = the bundled SmolLM2-135M")
    model_cache: Path = Field(
        Path(".hoprl/models/smollm2-135m-instruct"), description="dense copy of the bundled model"
    )
    torch_threads: int = Field(0, ge=0, description="training threads; 0 = torch default (decoding uses 1)")
    poll_interval_s: float = Field(1.0, gt=0, description="how often the queue looks for work")
    cancel_on_exit: bool = Field(
        False,
        description="when the service stops, cancel the job it runs (resumable from its checkpoints); "
        "off, a running job keeps training and the next service adopts it. "
        "A pipeline's own local trainer sets it: nothing would watch that job after the pipeline",
    )
    python: str | None = Field(None, description="interpreter for job subprocesses; unset = this one")
    vllm_server_url: str | None = Field(
        None,
        description="`trl vllm-serve` for jobs with vllm_mode server that name none (compose: vllm-serve)",
    )
    max_processes: int | None = Field(
        None, ge=1, description="processes one job may start; unset = one per GPU, or per CPU core"
    )
    accelerate_configs: Path = Field(
        Path(__file__).resolve().parents[2] / "configs" / "accelerate",
        description="folder of accelerate config files (<distributed>.yaml: zero2, zero3, fsdp)",
    )

    # What a client may name (services.trainer.admission): a JSON list or folders joined by ':'.
    data_roots: Annotated[list[Path], NoDecode] = Field(
        default_factory=_default_data_roots,
        description="folders a job's JSONL dataset may be read from (runs_dir too); default: data, "
        "../shared/data and the flows' runs folder ($HOPRL_RUNS_DIR, default runs)",
    )
    model_roots: Annotated[list[Path], NoDecode] = Field(
        default_factory=_default_model_roots,
        description="folders a job's model or resume_from checkpoint may be loaded from (runs_dir and "
        "model_cache's folder too); default: the flows' runs folder",
    )

    max_queued_jobs: int = Field(
        64,
        ge=1,
        description="jobs waiting in the queue at most; POST /v1/jobs beyond it is a 429 (Retry-After)",
    )
    # Limits per job: a request over one is a 409 naming the setting.
    max_steps: int = Field(10_000, ge=1, description="optimizer steps per job")
    max_questions_per_step: int = Field(512, ge=1, description="questions (GRPO groups) per step")
    max_num_generations: int = Field(64, ge=2, description="samples per question (the group size)")
    max_new_tokens_per_step: int = Field(4096, ge=1, description="tokens one agent step may generate")
    max_token_budget: int = Field(32_768, ge=16, description="completion tokens per episode")
    max_eval_questions: int = Field(1024, ge=1, description="dev questions per curriculum check")
    max_job_tokens: int = Field(
        10_000_000_000,
        ge=1,
        description="completion tokens a whole job may generate (steps x questions x generations x draws "
        "x token_budget); the default is about a week of generation on one large GPU",
    )

    @field_validator("data_roots", "model_roots", mode="before")
    @classmethod
    def _folders(cls, value: Any) -> Any:
        """``["/a", "/b"]`` (JSON) or ``/a:/b`` (like PATH) from the environment."""
        if isinstance(value, str):
            text = value.strip()
            return json.loads(text) if text.startswith("[") else [p for p in text.split(os.pathsep) if p]
        return value

    @property
    def dataset_roots(self) -> list[Path]:
        """Where a dataset file may live: ``data_roots`` and ``runs_dir``."""
        return [*self.data_roots, self.runs_dir]

    @property
    def checkpoint_roots(self) -> list[Path]:
        """Where a model or checkpoint may live: ``model_roots``, the model cache's folder, ``runs_dir``."""
        return [*self.model_roots, self.model_cache.parent, self.runs_dir]
