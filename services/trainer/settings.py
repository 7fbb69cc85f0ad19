"""Trainer settings: environment variables with the ``TRAINER_`` prefix."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class TrainerSettings(BaseSettings):
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
    judge_url: str | None = Field(None, description="EVO-RAG's refusal judge service; unset = rules")
    default_model: str | None = Field(None, description="HF id or folder; unset = the bundled SmolLM2-135M")
    model_cache: Path = Field(
        Path(".hoprl/models/smollm2-135m-instruct"), description="dense copy of the bundled model"
    )
    torch_threads: int = Field(0, ge=0, description="training threads; 0 = torch default (decoding uses 1)")
    poll_interval_s: float = Field(1.0, gt=0, description="how often the queue looks for work")
    python: str | None = Field(None, description="interpreter for job subprocesses; unset = this one")
