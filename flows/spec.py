"""``RunSpec``: a pipeline run's parameters as one typed, validated object.

The flow (:func:`flows.pipeline.pipeline`) takes them as keyword parameters, so the Prefect UI's
form and a deployment's ``-p name=value`` keep working, and builds the spec from them first
thing; ``hoprl pipeline`` builds the same spec from its options before it starts anything
(:func:`cli.pipeline.pipeline_options`), so a bad value is refused alike at the command line, in
a deployment and from Python, naming the field. Each stage then takes the fields it needs.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hoprl.configs import recipe_objective
from hoprl.domain import RECIPE_NAMES
from hoprl.schemas.trainer import Preset


class RunSpec(BaseModel):
    """What a pipeline run trains, on what, for how long, and how it is evaluated."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    recipe: str = Field("when-to-search", description="the recipe trained and evaluated")
    objective: str | None = Field(
        None, description="grpo, dapo or dr_grpo for the RL segments; unset: the recipe's paper objective"
    )
    model: str | None = Field(None, description="HF id or folder; unset: the bundled SmolLM2-135M-Instruct")
    dataset: str = Field(
        "synthetic", min_length=1, description="synthetic[:SEED[:MAX_HOPS[:TEST]]], a JSONL path, a hub name"
    )
    steps: int = Field(200, ge=0, description="RL optimizer steps in all")
    sft_steps: int = Field(20, ge=0, description="SFT warm-start steps (0: RL starts from the model)")
    segments: int = Field(4, ge=1, description="trainer jobs the RL steps are split into")
    eval_limit: int | None = Field(50, ge=1, description="test questions per evaluation")
    dev_limit: int = Field(16, ge=1, description="dev questions per curriculum check")
    baselines: tuple[str, ...] = Field(
        ("naive-rag",), description="recipes evaluated on the untrained model too"
    )
    seed: int = Field(0, ge=0, le=2**31 - 1)
    limit: int | None = Field(None, ge=1, description="at most this many questions per split")
    hyperparameters: dict[str, Any] = Field(default_factory=dict, description="every trainer job's overrides")
    recipe_config: dict[str, Any] = Field(default_factory=dict, description="recipe config overrides")
    preset: Preset = "paper"
    protocol: str | None = Field(None, description="a paper's evaluation run on the trained policy")
    data_dir: str = Field("../shared/data", description="--protocol: where its benchmark files are")
    corpus: str | None = Field(
        None,
        min_length=1,
        description="a corpus collection (hoprl ingest-corpus) every job and evaluation searches instead "
        "of the dataset's own paragraphs (the open-domain setting)",
    )

    @field_validator("recipe", "protocol")
    @classmethod
    def _known_recipe(cls, value: str | None) -> str | None:
        if value is not None and value not in RECIPE_NAMES:
            raise ValueError(f"unknown recipe {value!r}; valid: {', '.join(RECIPE_NAMES)}")
        return value

    @field_validator("baselines", mode="before")
    @classmethod
    def _baselines(cls, value: Any) -> Any:
        return value or ("naive-rag",)  # none named: the default baseline

    @field_validator("baselines")
    @classmethod
    def _known_baselines(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            cls._known_recipe(name)
        return value

    @field_validator("hyperparameters", "recipe_config", mode="before")
    @classmethod
    def _empty(cls, value: Any) -> Any:
        return {} if value is None else value

    @model_validator(mode="after")
    def _paper_objective(self) -> RunSpec:
        """An unset objective is the recipe's paper objective, stored as such with the run."""
        if self.objective is None:
            object.__setattr__(self, "objective", recipe_objective(self.recipe))
        return self

    @property
    def trained_objective(self) -> str:
        """``objective``, never unset after validation."""
        assert self.objective is not None
        return self.objective
