"""The trainer's wire contracts: a job request, its hyperparameters and the job view.

A job is one run in the run registry: the request is stored whole as the run's ``config``, so a
job can be re-run (or resumed after a restart) from the registry alone.

Hyperparameters are flat and validated (``extra="forbid"``): a misspelt name is a 422 naming the
field, never a silently kept default. Fields left unset take the recipe's published defaults
(:data:`RECIPE_DEFAULTS`, e.g. R2AG's asymmetric clip 0.2 / 0.28 with dynamic sampling, ARENA's
k2 KL), then the generic defaults below; the resolved values are logged and stored with the run.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Objective = Literal["grpo", "dapo", "dr_grpo", "sft", "ppo", "dpo"]
JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
LrScheduler = Literal["linear", "constant", "cosine"]  # transformers' SchedulerType names

#: per-recipe defaults from the papers, applied to hyperparameters the request leaves unset
RECIPE_DEFAULTS: dict[str, dict[str, Any]] = {
    "r2ag": {"epsilon": 0.2, "epsilon_high": 0.28, "dynamic_sampling": True},
    "eval-rar": {"beta": 0.001},
    "arena": {"beta": 0.001, "kl_estimator": "k2"},
    "when-to-search": {"beta": 0.0},
    # EVO-RAG: GRPO normalises step rewards per step index; the 7-head preference model trains in
    # the loop (Algorithm 1). max_turns / token_budget follow its T_max: see recipe_derived_defaults.
    "evo-rag": {"advantage": "per_step", "preference_model": True},
}

MAX_TOKEN_BUDGET = 32768  # Hyperparameters.token_budget's bound

#: per-(recipe, objective) defaults, applied before RECIPE_DEFAULTS
OBJECTIVE_DEFAULTS: dict[tuple[str, str], dict[str, Any]] = {
    # EVO-RAG's PPO: KL coefficient 0.001, policy lr 1e-6 and a separate critic at lr 1e-5
    ("evo-rag", "ppo"): {
        "beta": 0.001,
        "learning_rate": 1e-6,
        "critic": "separate",
        "critic_learning_rate": 1e-5,
    },
}


def recipe_derived_defaults(
    recipe: str, recipe_config: dict[str, Any], tokens_per_step: int
) -> dict[str, Any]:
    """Defaults a recipe derives from its own config, so the two never disagree.

    EVO-RAG: ``max_turns`` = its ``t_max`` and a ``token_budget`` that fits ``t_max`` search steps
    (:func:`hoprl.recipes.evo_rag.trainer_defaults`). Imported here, not at the top: the recipes
    pull in torch, and this module is also the light HTTP client's contract.
    """
    if recipe != "evo-rag":
        return {}
    from hoprl.recipes.evo_rag import trainer_defaults

    try:
        derived = trainer_defaults(recipe_config, tokens_per_step)
    except ValueError:  # an invalid recipe_config: the job reports the recipe's own error when it starts
        return {}
    return derived | {"token_budget": min(derived["token_budget"], MAX_TOKEN_BUDGET)}


class Hyperparameters(BaseModel):
    """Training knobs. ``None`` = the recipe's default (:data:`RECIPE_DEFAULTS`), else the generic one."""

    model_config = ConfigDict(extra="forbid")

    learning_rate: float | None = Field(None, gt=0, description="default 1e-5 (RL), 3e-4 (SFT)")
    lr_scheduler: LrScheduler = Field(
        "linear",
        description="the TRL trainers' schedule (GRPO / DAPO / Dr. GRPO, SFT): linear decay to 0 over the "
        "steps (transformers' default), constant, or cosine; the project's own loops (PPO / DPO, R2AG's "
        "rounds) keep their rate constant",
    )
    questions_per_step: int = Field(2, ge=1, le=256, description="GRPO groups per optimizer step")
    num_generations: int = Field(4, ge=2, le=64, description="samples per question (the group size)")
    beta: float | None = Field(None, ge=0, description="KL coefficient; 0 = no KL and no reference model")
    kl_estimator: Literal["k3", "k2"] | None = Field(
        None, description="k3 (TRL's) or k2 = ½(log πθ/πref)² (ARENA's stabilised KL)"
    )
    epsilon: float | None = Field(None, gt=0, lt=1, description="lower clip (default 0.2)")
    epsilon_high: float | None = Field(None, gt=0, lt=1, description="upper clip (default = epsilon)")
    scale_rewards: Literal["group", "batch", "none"] | None = Field(
        None,
        description="divide advantages by the group's reward std (group), the batch's (batch) or not at all "
        "(none); default: none for dr_grpo (Dr. GRPO drops the std as well as the length normalisation), "
        "else group",
    )
    dynamic_sampling: bool | None = Field(None, description="refill groups whose rewards have zero spread")
    max_resample: int = Field(3, ge=0, le=32, description="refill draws per flat group")
    max_turns: int = Field(
        4, ge=1, le=64, description="agent steps per episode; unset: EVO-RAG its T_max (20), else 4"
    )
    max_new_tokens_per_step: int = Field(64, ge=1, le=4096)
    token_budget: int = Field(
        512,
        ge=16,
        le=MAX_TOKEN_BUDGET,
        description="completion tokens per episode; unset: EVO-RAG enough for T_max searches, else 512",
    )
    temperature: float = Field(1.0, gt=0, le=2)
    search_mode: Literal["dense", "sparse", "hybrid"] = "hybrid"
    save_steps: int = Field(10, ge=1, description="a checkpoint every this many steps (and at the end)")
    max_train_questions: int | None = Field(None, ge=1, description="first N training questions only")
    eval_questions: int = Field(16, ge=1, description="dev questions per curriculum check (EVO-RAG)")
    sft_epochs: float = Field(1.0, gt=0, description="SFT: passes over the expert data (steps wins if set)")
    expert_noise: float = Field(0.0, ge=0, le=1, description="SFT: share of noisy expert plans")
    episodes_from: str | None = Field(
        None,
        description="PPO/DPO: train on this run's stored episodes (step by step) instead of fresh rollouts",
    )
    pair_delta: float = Field(0.1, ge=0, description="DPO: keep preference pairs whose margin exceeds this")
    rollout_seed: bool = Field(
        False,
        description="PPO/DPO fresh rollouts: sample each episode from its own seed (drawn from the job's "
        "seed and the step, plus the sample's index), so the same weights give the same episodes on every "
        "run; seeded calls decode one at a time, so rollouts are slower",
    )
    advantage: Literal["sequence", "per_step"] | None = Field(
        None,
        description="GRPO family: one advantage per episode from its total reward (sequence), or EVO-RAG's "
        "per-step group normalisation of step rewards (per_step); default: per_step for evo-rag, else "
        "sequence",
    )
    critic: Literal["separate", "shared"] | None = Field(
        None,
        description="PPO: a separate value model (its own copy of the network) or a value head on the "
        "policy; default: separate",
    )
    critic_learning_rate: float | None = Field(None, gt=0, description="PPO: the critic's (default 1e-5)")
    preference_model: bool | None = Field(
        None, description="EVO-RAG: train the 7-head preference model every step (default on for evo-rag)"
    )
    preference_eval_share: float = Field(
        0.2, gt=0, lt=1, description="preference model: share of questions whose pairs are held back"
    )
    recipe_config: dict[str, Any] = Field(
        default_factory=dict, description="the recipe's own config (e.g. when-to-search switch_step)"
    )
    report_to: list[str] = Field(default_factory=list, description="TRL/transformers report_to, e.g. wandb")
    torch_threads: int | None = Field(None, ge=1, description="training threads (decoding always uses 1)")

    def resolved(self, recipe: str, objective: str | None = None) -> Hyperparameters:
        """A copy with unset fields filled from the (recipe, objective) defaults, the recipe's, the
        ones the recipe derives from its config, then the generic ones. A field is unset when the
        request left it out or sent null (``max_turns`` and ``token_budget`` keep their plain
        defaults, 4 and 512, unless a recipe layer sets them)."""
        values = self.model_dump()
        unset = {k for k, v in values.items() if v is None or k not in self.model_fields_set}
        derived = recipe_derived_defaults(recipe, values["recipe_config"], values["max_new_tokens_per_step"])
        generic = {"beta": 0.0, "kl_estimator": "k3", "epsilon": 0.2, "dynamic_sampling": False,
                   "advantage": "sequence", "critic": "separate", "critic_learning_rate": 1e-5,
                   "preference_model": False}  # fmt: skip
        layers = [OBJECTIVE_DEFAULTS.get((recipe, objective or ""), {}), RECIPE_DEFAULTS.get(recipe, {}),
                  derived, generic]  # fmt: skip
        for layer in layers:
            for key, value in layer.items():
                if key in unset:
                    values[key] = value
                    unset.discard(key)
        return Hyperparameters.model_validate(values)


def reward_scaling(hp: Hyperparameters, objective: str) -> str:
    """TRL's ``scale_rewards``: as set, else ``none`` for ``dr_grpo`` and ``group`` otherwise.

    TRL's ``loss_type="dr_grpo"`` only changes the length normalisation; Dr. GRPO (Liu et al., 2025)
    also drops the division by the group's reward std, so the objective sets both.
    """
    return hp.scale_rewards or ("none" if objective == "dr_grpo" else "group")


def _recipe_names(schema: dict[str, Any]) -> None:
    """Lists the recipes in the OpenAPI document (an enum), imported only when the document is built:
    the recipes pull in torch, and the trainer's light HTTP client imports this module."""
    from hoprl.recipes import RECIPES

    schema["enum"] = sorted(RECIPES)


class JobRequest(BaseModel):
    """``POST /v1/jobs``: what to train, from where, on what, for how long."""

    model_config = ConfigDict(extra="forbid")

    recipe: str = Field(description="a recipe name, e.g. when-to-search", json_schema_extra=_recipe_names)
    objective: Objective = "grpo"
    model: str | None = Field(None, description="HF id or checkpoint folder; unset = the default model")
    dataset: str = Field(
        "synthetic", description="a JSONL path, 'synthetic[:SEED[:MAX_HOPS]]', or a hub name"
    )
    collection: str | None = Field(
        None, description="retriever collection; unset = index the dataset's paragraphs"
    )
    steps: int = Field(10, ge=1, le=1_000_000, description="optimizer steps")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="the run registry keeps it as a 32-bit integer")
    resume_from: str | None = Field(
        None, description="a job id (its latest checkpoint) or a checkpoint folder"
    )
    hyperparameters: Hyperparameters = Field(default_factory=Hyperparameters)

    @model_validator(mode="after")
    def _model_or_resume(self) -> JobRequest:
        if self.model is not None and not self.model.strip():
            raise ValueError("model must be a HF id or a folder; leave it out for the default model")
        return self


class Checkpoint(BaseModel):
    step: int
    path: str
    metrics: dict[str, Any] = Field(default_factory=dict)


class Job(BaseModel):
    """``GET /v1/jobs/{id}``: the run as the registry holds it."""

    id: str
    status: JobStatus
    recipe: str
    objective: str
    model: str
    step: int = Field(0, description="last step with metrics")
    steps: int = Field(description="steps asked for")
    stage: str | None = Field(None, description="current curriculum stage")
    metrics: dict[str, float] = Field(default_factory=dict, description="latest value of each metric")
    checkpoints: list[Checkpoint] = Field(default_factory=list)
    error: str | None = None
    created_at: str | None = None


class JobCreated(BaseModel):
    id: str
    status: JobStatus
