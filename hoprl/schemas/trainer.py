"""The trainer's wire contracts: a job request, its hyperparameters and the job view.

One cohesive module over ~400 lines: the contract and its defaults (presets, paper values) are
read together; splitting them would hide where a default comes from.

A job is one run in the run registry: the request is stored whole as the run's ``config``, so a
job can be re-run (or resumed after a restart) from the registry alone.

Hyperparameters are flat and validated (``extra="forbid"``): a misspelt name is a 422 naming the
field, never a silently kept default. Fields the request leaves out take, in this order, the
``cpu`` preset's value (:data:`CPU_PRESET`, only when ``preset="cpu"``), the paper's value for the
(recipe, objective) (:func:`objective_defaults`), the paper's value for the recipe
(:func:`recipe_defaults`, both read from ``configs/<recipe>.yaml``), the value the recipe derives
from its own config (:func:`recipe_derived_defaults`), then the generic one; an unset
``objective`` is the recipe's paper objective (:func:`recipe_objective`).
:meth:`Hyperparameters.resolved` is that one place; the resolved values are logged and stored
with the run. ``docs/papers.md`` says where each paper value comes from;
``tests/hoprl/test_papers_table.py`` compares the configs with it and
``tests/services/trainer/test_recipe_defaults.py`` pins what a bare request resolves to.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hoprl.schemas import json_typed, non_blank
from hoprl.schemas.retriever import CollectionName

Objective = Literal["grpo", "dapo", "dr_grpo", "sft", "ppo", "dpo"]
JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
LrScheduler = Literal["linear", "constant", "cosine"]  # transformers' SchedulerType names
Preset = Literal["paper", "cpu"]
Generation = Literal["transformers", "vllm"]
VllmMode = Literal["colocate", "server"]
Distributed = Literal["ddp", "zero2", "zero3", "fsdp"]

#: recipes without a paper config file (``configs/<recipe>.yaml``): never trained in a paper.
#: Search-R1's RAG baseline retrieves top-3 (NaiveRAGConfig.top_k).
BASELINE_DEFAULTS: dict[str, dict[str, Any]] = {"naive-rag": {"objective": "grpo"}}


def recipe_defaults(recipe: str) -> dict[str, Any]:
    """The recipe's paper settings, read from ``configs/<recipe>.yaml`` (the file is their one home:
    :func:`hoprl.configs.paper_defaults`; sources in docs/papers.md). ``objective`` is the recipe's
    objective when the request names none; ``recipe_config`` fills the recipe config keys the
    request leaves out. Imported here, not at the top: the configs module validates files with
    this module's :class:`JobRequest`."""
    from hoprl.configs import paper_defaults

    return paper_defaults(recipe) or dict(BASELINE_DEFAULTS.get(recipe, {}))


def objective_defaults(recipe: str, objective: str) -> dict[str, Any]:
    """The paper's settings for (recipe, objective), applied before :func:`recipe_defaults` (a
    learning rate is the objective's: an SFT warm start of the same recipe keeps the generic 3e-4):
    the config's ``objectives:`` section (:func:`hoprl.configs.objective_defaults`)."""
    from hoprl.configs import objective_defaults as from_config

    return from_config(recipe, objective)


#: ``preset="cpu"``: the papers' settings scaled down to what two CPU cores train in minutes with
#: SmolLM2-135M (``make run``, ``hoprl pipeline --small``). Only sizes change; objectives, clips, KL
#: and rewards stay the paper's. The episode shape (:func:`episode_shape`) is every phase's: the
#: trainer's rollouts, the flows' dev checks and the /v1/answer limits of the policy a local
#: pipeline starts (flows/stack.py), so a run is evaluated in the shape it was trained in.
CPU_PRESET: dict[str, Any] = {
    "questions_per_step": 2,  # groups per step; Search-R1 trains 512 prompts a step on 8 GPUs
    "num_generations": 4,  # group size (Search-R1: 5); 4 keeps a GRPO step of 2 groups at ~10-30 s
    "max_turns": 4,  # agent steps (when-to-search 5, EVO-RAG T_max 20): two searches and an answer
    # tokens one step generates (Search-R1 allows 500 per turn): when-to-search's expert segments in
    # the synthetic world take up to 66 tokens (measured, SmolLM2's tokenizer), so at 64 the SFT
    # model's answers were cut mid-tag; 96 holds them with room to spare
    "max_new_tokens_per_step": 96,
    # context growth per episode: a two-search episode with when-to-search's 5 documents a search
    # fits whole: 3 turns of 96 + 2 blocks of the largest measured 5-document block (395 tokens in
    # the synthetic world) + 64 of chat-template glue = 288 + 790 + 64 = 1142 <= 1152
    "token_budget": 1152,
    "save_steps": 5,  # checkpoints of short segments
}

#: the cpu preset's learning rate for RL objectives (an SFT warm start keeps the generic 3e-4): the
#: papers' 1e-6 (7B-8B models over hundreds of steps) barely moves SmolLM2-135M in the demo's few
#: steps; 1e-5 is the generic RL value the demo was sized with
CPU_RL_LEARNING_RATE = 1e-5

#: recipe config scaled with the cpu preset (merged under the request's recipe_config)
CPU_RECIPE_CONFIG: dict[str, dict[str, Any]] = {
    # EVO-RAG's scheduler p(t) = (t-1)/(T_max-1) spans the episode: with T_max = 20 and 4 steps it
    # never passes 0.16 and the late weights and r_act never act; T_max = max_turns keeps the whole
    # Discovery -> Refinement schedule inside the short episode
    "evo-rag": {"t_max": CPU_PRESET["max_turns"]},
}

MAX_TOKEN_BUDGET = 32768  # Hyperparameters.token_budget's bound


def recipe_objective(recipe: str, objective: str | None = None) -> str:
    """The objective a job trains with: the request's, else its recipe's paper objective.

    >>> recipe_objective("r2ag"), recipe_objective("r2ag", "grpo"), recipe_objective("search-r1")
    ('dapo', 'grpo', 'grpo')
    """
    return objective or str(recipe_defaults(recipe).get("objective", "grpo"))


def preset_recipe_config(preset: str, recipe: str) -> dict[str, Any]:
    """The recipe config keys a preset sets (the flows merge it into the requests they send, so
    their curriculum and dev checks read the config the trainer trains with)."""
    return dict(CPU_RECIPE_CONFIG.get(recipe, {})) if preset == "cpu" else {}


def recipe_derived_defaults(
    recipe: str, recipe_config: dict[str, Any], tokens_per_step: int
) -> dict[str, Any]:
    """Defaults a recipe derives from its own config, so the two never disagree.

    ``max_turns`` = the recipe's episode cap (EVO-RAG's ``t_max``, when-to-search's ``max_turns``)
    and a ``token_budget`` that fits that many search steps (:func:`hoprl.recipes.evo_rag.
    trainer_defaults`: per step, the generated tokens plus ``top_k`` documents). Imported here, not
    at the top: the recipes pull in torch, and this module is also the light HTTP client's contract.
    """
    if recipe not in ("evo-rag", "when-to-search"):
        return {}
    from hoprl.recipes.evo_rag import INFO_TOKENS_PER_DOC, trainer_defaults
    from hoprl.recipes.when_to_search import WhenToSearchConfig

    try:
        if recipe == "evo-rag":
            derived = trainer_defaults(recipe_config, tokens_per_step)
        else:
            cfg = WhenToSearchConfig(**recipe_config)
            per_step = tokens_per_step + cfg.top_k * INFO_TOKENS_PER_DOC
            derived = {"max_turns": min(cfg.max_turns, 64), "token_budget": cfg.max_turns * per_step}
    except (ValueError, TypeError):  # an invalid recipe_config: the job reports the recipe's own error
        return {}
    return derived | {"token_budget": min(derived["token_budget"], MAX_TOKEN_BUDGET)}


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
    questions_per_step: int = Field(2, ge=1, le=256, description="GRPO groups per optimizer step")
    num_generations: int = Field(
        4, ge=2, le=64, description="samples per question (the group size); search-r1's paper 5, cpu preset 4"
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
    dynamic_sampling: bool | None = Field(None, description="refill groups whose rewards have zero spread")
    max_resample: int = Field(3, ge=0, le=32, description="refill draws per flat group")
    max_turns: int = Field(
        4,
        ge=1,
        le=64,
        description="agent steps per episode; unset: the recipe's cap (EVO-RAG T_max 20, when-to-search 5), "
        "cpu preset 4, else 4",
    )
    max_new_tokens_per_step: int = Field(64, ge=1, le=4096)
    token_budget: int = Field(
        512,
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
    critic_model: str | None = Field(
        None,
        description="PPO, separate critic: the critic's own model (EVO-RAG App. C Table 10: "
        "Qwen/Qwen2.5-0.5B-Instruct, configs/evo-rag.yaml); unset: a copy of the policy's body",
    )
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

    def resolved(self, recipe: str, objective: str | None = None) -> Hyperparameters:
        """A copy with every unset field filled (module docstring for the order of the layers).

        A field is unset when the request left it out or sent null. ``recipe_config`` merges key by
        key: the request's keys over the cpu preset's over the paper's. ``objective`` unset is the
        recipe's paper objective (:func:`recipe_objective`), so ``(recipe, objective)`` defaults match
        the objective the job will train with.
        """
        objective = recipe_objective(recipe, objective)
        values = self.model_dump()
        unset = {k for k, v in values.items() if v is None or k not in self.model_fields_set}
        # the paper's learning rate is its RL objective's: an SFT warm start keeps the generic 3e-4
        skip = {"objective", "learning_rate"} if objective == "sft" else {"objective"}
        paper = {k: v for k, v in recipe_defaults(recipe).items() if k not in skip}
        scaled = preset_recipe_config(self.preset, recipe)
        values["recipe_config"] = {**paper.pop("recipe_config", {}), **scaled, **values["recipe_config"]}
        preset = CPU_PRESET if self.preset == "cpu" else {}
        if preset and objective != "sft":
            preset = {**preset, "learning_rate": CPU_RL_LEARNING_RATE}

        def fill(layer: dict[str, Any]) -> None:
            for key, value in layer.items():
                if key in unset:
                    values[key] = value
                    unset.discard(key)

        for layer in (preset, objective_defaults(recipe, objective), paper):
            fill(layer)
        # derived from the recipe's config with the per-step tokens the layers above settled
        fill(recipe_derived_defaults(recipe, values["recipe_config"], values["max_new_tokens_per_step"]))
        fill({"beta": 0.0, "kl_estimator": "k3", "epsilon": 0.2, "dynamic_sampling": False,
              "advantage": "sequence", "critic": "separate", "critic_learning_rate": 1e-5,
              "preference_model": False})  # fmt: skip
        return Hyperparameters.model_validate(values)


#: How a pipeline's phases decode one episode shape: training rollouts sample at the job's
#: ``temperature`` (Search-R1's 1.0); dev checks and every evaluation (baselines, final) decode
#: greedily; none of them decodes under the recipe's action grammar (the policy a local pipeline
#: starts serves /v1/answer free), so a format error counts alike in training, dev and evaluation.
EVAL_TEMPERATURE = 0.0


def episode_shape(hp: Hyperparameters) -> dict[str, int]:
    """The episode limits of a resolved job (:meth:`Hyperparameters.resolved`), as
    :class:`hoprl.agent.runner.RunOptions` fields: the one source of the trainer's rollouts, the
    flows' dev checks and the /v1/answer limits of a local pipeline's policy.

    >>> episode_shape(Hyperparameters(preset="cpu").resolved("search-r1"))
    {'max_steps': 4, 'max_new_tokens_per_step': 96, 'token_budget': 1152}
    """
    return {
        "max_steps": hp.max_turns,
        "max_new_tokens_per_step": hp.max_new_tokens_per_step,
        "token_budget": hp.token_budget,
    }


def job_episode_shape(request: dict[str, Any]) -> dict[str, int]:
    """:func:`episode_shape` of a job request as JSON (what the flows send to the trainer)."""
    job = JobRequest.model_validate(request)
    return episode_shape(job.hyperparameters.resolved(job.recipe, job.objective))


def reward_scaling(hp: Hyperparameters, objective: str) -> str:
    """TRL's ``scale_rewards``: as set, else ``none`` for ``dr_grpo`` and ``group`` otherwise.

    TRL's ``loss_type="dr_grpo"`` only changes the length normalisation; Dr. GRPO (Liu et al., 2025)
    also drops the division by the group's reward std, so the objective sets both.
    """
    return hp.scale_rewards or ("none" if objective == "dr_grpo" else "group")


def _nullable(schema: dict[str, Any]) -> None:
    """The OpenAPI document says what the validator accepts: the field's values or null (= unset)."""
    schema["anyOf"] = [{"type": schema.pop("type"), "enum": schema.pop("enum")}, {"type": "null"}]


def _recipe_names(schema: dict[str, Any]) -> None:
    """Lists the recipes in the OpenAPI document (an enum), imported only when the document is built:
    the recipes pull in torch, and the trainer's light HTTP client imports this module."""
    from hoprl.recipes import RECIPES

    schema["enum"] = sorted(RECIPES)


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
        "synthetic", description="a JSONL path, 'synthetic[:SEED[:MAX_HOPS]]', or a hub name"
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
