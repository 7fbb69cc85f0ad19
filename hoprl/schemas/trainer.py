"""The trainer's wire contracts: a job request, its hyperparameters and the job view.

A job is one run in the run registry: the request is stored whole as the run's ``config``, so a
job can be re-run (or resumed after a restart) from the registry alone.

Hyperparameters are flat and validated (``extra="forbid"``): a misspelt name is a 422 naming the
field, never a silently kept default. A field the request leaves out is unset here; what the job
then trains with (the preset's, the paper's, the recipe's derived or the generic value) is
resolved in one place, :func:`hoprl.jobspec.resolve`. The one rule of the wire itself: an unset
``objective`` is the recipe's paper objective (:func:`hoprl.configs.recipe_objective`), stored as
such with the run.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hoprl.configs import recipe_objective
from hoprl.domain import RECIPE_NAMES, SHAPE_DEFAULTS
from hoprl.schemas import json_typed, non_blank
from hoprl.schemas.retriever import CollectionName

Objective = Literal["grpo", "dapo", "dr_grpo", "sft", "ppo", "dpo"]
JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
LrScheduler = Literal["linear", "constant", "cosine"]  # transformers' SchedulerType names
Preset = Literal["paper", "cpu"]
Generation = Literal["transformers", "vllm"]
VllmMode = Literal["colocate", "server"]
Distributed = Literal["ddp", "zero2", "zero3", "fsdp"]

MAX_TOKEN_BUDGET = 32768  # Hyperparameters.token_budget's bound


class Hyperparameters(BaseModel):
    """Training knobs. A field left out (or ``None``) takes the preset's, the paper's, the derived or
    the generic value (module docstring); the defaults named here are the generic ones."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _json_types(cls, data: Any) -> Any:
        """true/false for a boolean knob, a JSON number for a number (not 0, "5" or true)."""
        return json_typed(cls, data)

    preset: Preset = Field(
        "paper",
        description="paper: the papers' settings (configs/<recipe>.yaml); cpu: the same recipe with its "
        "sizes scaled down to two CPU cores (CPU_PRESET: 2 questions x 4 samples a step, 4 turns of 96 "
        "tokens, 1152-token episodes); a value the request sets wins over both",
    )

    learning_rate: float | None = Field(
        None,
        gt=0,
        description="the paper's (configs/<recipe>.yaml; SFT excepted), else 1e-5 (RL), 3e-4 (SFT)",
    )
    lr_scheduler: LrScheduler = Field(
        "linear",
        description="the TRL trainers' schedule (GRPO / DAPO / Dr. GRPO, SFT): linear decay to 0 over the "
        "steps (transformers' default), constant, or cosine; the project's own loops (PPO / DPO, R2AG's "
        "rounds) keep their rate constant",
    )
    questions_per_step: int = Field(2, ge=1, le=512, description="GRPO groups per optimizer step")
    num_generations: int = Field(
        4,
        ge=1,
        le=64,
        description="samples per question (the group size, at least 2 for every objective but PPO); "
        "search-r1's paper 5, cpu preset 4, EVO-RAG's PPO 1 (Table 10: 128 episodes a batch)",
    )
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
    dynamic_sampling: bool | None = Field(None, description="refill flat groups (dynamic_sampling_signal)")
    dynamic_sampling_signal: Literal["answers", "rewards"] | None = Field(
        None,
        description="what a group must vary in to be kept: answers (DAPO Eq. 11: some but not all correct by "
        "exact match; the default) or rewards (R2AG Eq. 6: total rewards with std > 0)",
    )
    max_resample: int = Field(3, ge=0, le=32, description="refill draws per flat group")
    flat_groups: Literal["drop", "train"] | None = Field(
        None,
        description="a group still flat after its refills: drop (out of the loss and its token count, as "
        "DAPO's Algorithm 1 and R2AG's keep only groups that pass the filter; the default) or train "
        "(trained on whatever its other reward terms spread)",
    )
    max_steps: int = Field(
        SHAPE_DEFAULTS["paper"].max_steps,
        ge=1,
        le=64,
        description="agent steps per episode; unset: the recipe's cap (EVO-RAG T_max 20, when-to-search 5), "
        "cpu preset 4, else 4",
    )
    max_new_tokens_per_step: int = Field(
        SHAPE_DEFAULTS["paper"].max_new_tokens_per_step,
        ge=1,
        le=4096,
        description="new tokens per agent step",
    )
    token_budget: int = Field(
        SHAPE_DEFAULTS["paper"].token_budget,
        ge=16,
        le=MAX_TOKEN_BUDGET,
        description="context growth per episode (generated + injected tokens); unset: EVO-RAG and "
        "when-to-search enough for their max turns of searches, cpu preset 1152, else 512",
    )
    temperature: float = Field(1.0, gt=0, le=2, description="rollout sampling temperature (Search-R1's 1.0)")
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
    advantage: Literal["sequence", "per_step", "siblings"] | None = Field(
        None,
        description="GRPO family: one advantage per episode from its total reward (sequence); EVO-RAG's "
        "step rewards normalised over the num_generations sibling candidates sampled from the same state "
        "(siblings: §3.4, App. A.5; one episode per question, the project's own loop, one process); or "
        "per step index across num_generations independent episodes (per_step, TRL's trainer); default: "
        "siblings for evo-rag, else sequence",
    )
    critic: Literal["separate", "shared"] | None = Field(
        None,
        description="PPO: a separate value model (its own copy of the network) or a value head on the "
        "policy; default: separate",
    )
    critic_learning_rate: float | None = Field(None, gt=0, description="PPO: the critic's (default 1e-5)")
    mini_batch_size: int | None = Field(
        None, ge=1, description="PPO: episodes per minibatch of an update (EVO-RAG Table 10: 64; default 4)"
    )
    dpo_pairs: Literal["siblings", "prefixes"] | None = Field(
        None,
        description="DPO: pairs from the num_generations sibling candidates sampled at each step of one "
        "episode per question (siblings: EVO-RAG App. A.4), or from independent episodes that share a "
        "prefix (prefixes, the project's earlier reading); default: siblings",
    )
    critic_model: str | None = Field(
        None,
        description="PPO, separate critic: the critic's own model (EVO-RAG App. C Table 10: "
        "Qwen/Qwen2.5-0.5B-Instruct, configs/evo-rag.yaml's PPO default; it must share the policy's "
        "tokenizer); 'policy': a copy of the policy's body (the cpu preset's; unset takes the paper's)",
    )
    preference_model: bool | None = Field(
        None, description="EVO-RAG: train the 7-head preference model every step (default on for evo-rag)"
    )
    preference_eval_share: float = Field(
        0.2, gt=0, lt=1, description="preference model: share of questions whose pairs are held back"
    )
    placebo: bool = Field(
        False,
        description="the control arm of a learning check (GRPO / DAPO / Dr. GRPO through TRL): each step's "
        "rewards are permuted across the batch before the advantages, by a permutation drawn from the seed "
        "and the step; the same job with and without it tells a gain the reward made from one any update "
        "makes",
    )
    micro_batch: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="GRPO / DAPO / Dr. GRPO through TRL: episodes per forward and backward pass; a step's "
        "episodes are rolled out together and their gradients accumulated over passes of this many (the "
        "same update, less activation memory); unset: the whole step in one pass",
    )
    gradient_checkpointing: bool | None = Field(
        None,
        description="GRPO / DAPO / Dr. GRPO through TRL: recompute activations in the backward pass (a "
        "third forward's cost for the memory of the activations); unset: TRL's default, on",
    )
    lora_rank: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="GRPO / DAPO / Dr. GRPO through TRL: train LoRA adapters of this rank on every linear "
        "layer (peft) instead of every weight; unset: full fine-tuning. LoRA RL is reported to want about "
        "10x the full-tuning learning rate",
    )
    lora_alpha: int | None = Field(None, ge=1, le=4096, description="LoRA's alpha (default: twice the rank)")
    recipe_config: dict[str, Any] = Field(
        default_factory=dict, description="the recipe's own config (e.g. when-to-search switch_step)"
    )
    report_to: list[str] = Field(default_factory=list, description="TRL/transformers report_to, e.g. wandb")
    torch_threads: int | None = Field(None, ge=1, description="training threads (decoding always uses 1)")
    # -- leaving the CPU (docs/gpus.md) ---------------------------------------------------------
    generation: Generation = Field(
        "transformers",
        description="rollout engine: transformers (in the training process; the CPU default) or vllm "
        "(TRL's vLLM integration; needs CUDA and the gpu extra)",
    )
    vllm_mode: VllmMode = Field(
        "colocate",
        description="vllm only: colocate (vLLM inside each training process, sharing its GPU) or server "
        "(a `trl vllm-serve` process on its own GPUs, at vllm_server_url)",
    )
    vllm_server_url: str | None = Field(
        None, description="vllm server mode: the `trl vllm-serve` base URL (default http://127.0.0.1:8000)"
    )
    vllm_gpu_memory_utilization: float = Field(
        0.3, gt=0, le=1, description="vllm colocate: the share of each GPU vLLM may take"
    )
    vllm_importance_sampling_correction: bool = Field(
        True, description="vllm: TRL's truncated importance-sampling correction with vLLM's log-probs"
    )
    processes: int = Field(
        1, ge=1, le=1024, description="training processes (accelerate launch; one per GPU, or CPU/gloo)"
    )
    distributed: Distributed | None = Field(
        None,
        description="accelerate config for processes > 1: ddp (default), zero2, zero3 (DeepSpeed) or fsdp "
        "(configs/accelerate/<name>.yaml)",
    )
    warm_start_kl: int | None = Field(
        None,
        ge=0,
        description="GRPO/DAPO at beta 0: episodes a step whose KL to the job's starting weights is measured "
        "(warm_start_kl/*: a no-grad forward pass of a frozen copy of them); 0 = none; unset: the cpu "
        "preset's 2, else 0. With beta > 0 the KL is read from TRL's reference log-probs on every episode",
    )


def _nullable(schema: dict[str, Any]) -> None:
    """The OpenAPI document says what the validator accepts: the field's values or null (= unset)."""
    schema["anyOf"] = [{"type": schema.pop("type"), "enum": schema.pop("enum")}, {"type": "null"}]


def _recipe_names(schema: dict[str, Any]) -> None:
    """Lists the recipes in the OpenAPI document (an enum; the registry's names, hoprl.domain)."""
    schema["enum"] = sorted(RECIPE_NAMES)


class JudgeSpec(BaseModel):
    """The judge a recipe's reward calls (when-to-search's correctness, EVO-RAG's refusals), as the
    paper has it. The trainer binds the judge service at ``url`` (else ``TRAINER_JUDGE_URL``), run
    with ``JUDGE_BACKEND=openai`` and ``JUDGE_MODEL`` serving ``model``; without a service the rules
    judge decides, and the job's ``judge/*`` metrics count every such verdict as a fallback."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["openai", "rules"] = Field("openai", description="what the paper judges with")
    model: str | None = Field(None, description="the paper's judge model (the service's JUDGE_MODEL)")
    url: str | None = Field(None, description="the judge service; unset = the trainer's TRAINER_JUDGE_URL")
    answer_prompt: str | None = Field(
        None, description="the service's JUDGE_ANSWER_PROMPT for the paper's wording, e.g. arena_lj@1"
    )


class JobRequest(BaseModel):
    """``POST /v1/jobs``: what to train, from where, on what, for how long."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _json_types(cls, data: Any) -> Any:
        """A JSON number for steps and seed (not "5" or true)."""
        return json_typed(cls, data)

    recipe: str = Field(description="a recipe name, e.g. when-to-search", json_schema_extra=_recipe_names)
    objective: Objective = Field(
        None,  # type: ignore[arg-type]  # never None after validation: _paper_objective fills it
        description="unset: the recipe's paper objective (configs/<recipe>.yaml: dapo for r2ag and "
        "when-to-search, grpo for the others); an explicit objective wins",
        json_schema_extra=_nullable,
    )
    model: Annotated[str, non_blank(4096)] | None = Field(
        None, description="HF id or checkpoint folder; unset = the default model"
    )
    dataset: str = Field(
        "synthetic", description="a JSONL path, 'synthetic[:SEED[:MAX_HOPS[:TEST]]]', or a hub name"
    )
    collection: CollectionName | None = Field(
        None, description="retriever collection; unset = index the dataset's paragraphs"
    )
    steps: int = Field(10, ge=1, le=1_000_000, description="optimizer steps")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="the run registry keeps it as a 32-bit integer")
    resume_from: str | None = Field(
        None, description="a job id (its latest checkpoint) or a checkpoint folder"
    )
    hyperparameters: Hyperparameters = Field(default_factory=Hyperparameters)
    judge: JudgeSpec | None = Field(
        None, description="the paper's judge for the reward; unset = the judge service if the trainer has one"
    )

    @model_validator(mode="before")
    @classmethod
    def _paper_objective(cls, data: Any) -> Any:
        """An unset objective is the recipe's paper objective, stored as such with the run."""
        if isinstance(data, dict) and data.get("objective") is None and isinstance(data.get("recipe"), str):
            return {**data, "objective": recipe_objective(data["recipe"])}
        return data

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
    judge_flag: str | None = Field(
        None, description="set when the reward's verdicts came from the rules where the paper used an LLM"
    )
    checkpoints: list[Checkpoint] = Field(default_factory=list)
    error: str | None = None
    created_at: str | None = None


class JobCreated(BaseModel):
    id: str
    status: JobStatus
