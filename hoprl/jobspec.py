"""What a job runs with: its objective, preset, hyperparameters and episode shape, resolved once.

The wire contract of a job (:mod:`hoprl.schemas.trainer`) says what a client may send; this module
says what the job then trains with. Fields a request leaves out take, in this order, the ``cpu``
preset's value (:data:`CPU_PRESET`, only when ``preset="cpu"``), the paper's value for the
(recipe, objective) (:func:`hoprl.configs.objective_defaults`), the paper's value for the recipe
(:func:`hoprl.configs.recipe_defaults`, both read from ``configs/<recipe>.yaml``), the value the
recipe derives from its own config (:func:`recipe_derived_defaults`), then the generic one; an
unset ``objective`` is the recipe's paper objective (:func:`hoprl.configs.recipe_objective`).
:func:`resolve` is that one place; the resolved values are logged and stored with the run, and
:func:`episode_shape` turns them into the run's :class:`~hoprl.domain.EpisodeShape`.
``docs/papers.md`` says where each paper value comes from; ``tests/hoprl/test_papers_table.py``
compares the configs with it and ``tests/services/trainer/test_recipe_defaults.py`` pins what a
bare request resolves to.

:func:`load_config` reads a paper's config file as a validated request (:mod:`hoprl.configs` reads
the files' paper settings).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hoprl.configs import (
    OBJECTIVES,
    PAPER,
    SMALL,
    ConfigError,
    merge,
    objective_defaults,
    read_config,
    recipe_defaults,
    recipe_objective,
)
from hoprl.domain import MAX_BUDGET, SHAPE_DEFAULTS, EpisodeShape
from hoprl.protocols import Protocol
from hoprl.recipes.evo_rag import INFO_TOKENS_PER_DOC, trainer_defaults
from hoprl.recipes.when_to_search import COMPACT_PROMPT, WhenToSearchConfig
from hoprl.schemas.trainer import MAX_TOKEN_BUDGET, Hyperparameters, JobRequest

#: ``preset="cpu"``: the papers' settings scaled down to what two CPU cores train in minutes with
#: SmolLM2-135M (``make run``, ``hoprl pipeline --small``). Only sizes change; objectives, clips, KL
#: and rewards stay the paper's. The episode shape (:func:`episode_shape`) is every phase's: the
#: trainer's rollouts, the flows' dev checks and the /v1/answer limits of the policy a local
#: pipeline starts (flows/stack.py), so a run is evaluated in the shape it was trained in.
CPU_PRESET: dict[str, Any] = {
    "questions_per_step": 2,  # groups per step; Search-R1 trains 512 prompts a step on 8 GPUs
    "num_generations": 4,  # group size (Search-R1: 5); 4 keeps a GRPO step of 2 groups at ~10-30 s
    # the episode: SHAPE_DEFAULTS["cpu"] (hoprl.domain.shape says why 4 steps of 96 tokens in 1152)
    **SHAPE_DEFAULTS["cpu"].limits(),
    "save_steps": 5,  # checkpoints of short segments
    # PPO's critic: a copy of the tiny policy's body (EVO-RAG's Qwen2.5-0.5B critic reads another
    # tokenizer's ids than SmolLM2's)
    "critic_model": "policy",
    # the KL to the warm start at beta 0 on 2 of a step's 8 episodes: the frozen copy's no-grad
    # forward pass cost 7-9% of the loss on 2 episodes, 26-30% on all 8 (docs/training.md, "What a
    # step logs")
    "warm_start_kl": 2,
}

#: the cpu preset's learning rate for RL objectives (an SFT warm start keeps the generic 3e-4): the
#: papers' 1e-6 (7B-8B models over hundreds of steps) barely moves SmolLM2-135M in the demo's few
#: steps; 1e-5 is the generic RL value the demo was sized with
CPU_RL_LEARNING_RATE = 1e-5

#: recipe config scaled with the cpu preset (merged under the request's recipe_config)
CPU_RECIPE_CONFIG: dict[str, dict[str, Any]] = {
    # EVO-RAG's scheduler p(t) = (t-1)/(T_max-1) spans the episode: with T_max = 20 and 4 steps it
    # never passes 0.16 and the late weights and r_act never act; T_max = max_steps keeps the whole
    # Discovery -> Refinement schedule inside the short episode
    "evo-rag": {"t_max": CPU_PRESET["max_steps"]},
    # when-to-search's compact instruction instead of App. B.4's (docs/training.md, "The cpu preset's
    # when-to-search prompt": make run, seed 0, measured with both)
    "when-to-search": {"system_prompt": COMPACT_PROMPT},
}


def preset_recipe_config(preset: str, recipe: str) -> dict[str, Any]:
    """The recipe config keys a preset sets (the flows merge it into the requests they send, so
    their curriculum and dev checks read the config the trainer trains with)."""
    return dict(CPU_RECIPE_CONFIG.get(recipe, {})) if preset == "cpu" else {}


def recipe_derived_defaults(
    recipe: str, recipe_config: dict[str, Any], tokens_per_step: int
) -> dict[str, Any]:
    """Defaults a recipe derives from its own config, so the two never disagree.

    ``max_steps`` = the recipe's episode cap (EVO-RAG's ``t_max``, when-to-search's ``max_turns``)
    and a ``token_budget`` that fits that many search steps (:func:`hoprl.recipes.evo_rag.
    trainer_defaults`: per step, the generated tokens plus ``top_k`` documents).
    """
    if recipe not in ("evo-rag", "when-to-search"):
        return {}
    try:
        if recipe == "evo-rag":
            derived = trainer_defaults(recipe_config, tokens_per_step)
        else:
            cfg = WhenToSearchConfig(**recipe_config)
            per_step = tokens_per_step + cfg.top_k * INFO_TOKENS_PER_DOC
            derived = {"max_steps": min(cfg.max_turns, 64), "token_budget": cfg.max_turns * per_step}
    except (ValueError, TypeError):  # an invalid recipe_config: the job reports the recipe's own error
        return {}
    return derived | {"token_budget": min(derived["token_budget"], MAX_TOKEN_BUDGET)}


def resolve(hp: Hyperparameters, recipe: str, objective: str | None = None) -> Hyperparameters:
    """A copy of ``hp`` with every unset field filled (module docstring for the order of the layers).

    A field is unset when the request left it out or sent null. ``recipe_config`` merges key by
    key: the request's keys over the cpu preset's over the paper's. ``objective`` unset is the
    recipe's paper objective (:func:`recipe_objective`), so ``(recipe, objective)`` defaults match
    the objective the job will train with.
    """
    objective = recipe_objective(recipe, objective)
    values = hp.model_dump()
    unset = {k for k, v in values.items() if v is None or k not in hp.model_fields_set}
    # the paper's learning rate is its RL objective's: an SFT warm start keeps the generic 3e-4
    skip = {"objective", "learning_rate"} if objective == "sft" else {"objective"}
    paper = {k: v for k, v in recipe_defaults(recipe).items() if k not in skip}
    scaled = preset_recipe_config(hp.preset, recipe)
    values["recipe_config"] = {**paper.pop("recipe_config", {}), **scaled, **values["recipe_config"]}
    preset = CPU_PRESET if hp.preset == "cpu" else {}
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
          "dynamic_sampling_signal": "answers", "flat_groups": "drop",
          "advantage": "sequence", "critic": "separate", "critic_learning_rate": 1e-5,
          "mini_batch_size": 4, "dpo_pairs": "siblings", "preference_model": False,
          "warm_start_kl": 0})  # fmt: skip
    return Hyperparameters.model_validate(values)


def episode_shape(hp: Hyperparameters) -> EpisodeShape:
    """The episode shape of a resolved job (:func:`resolve`): the one source of the trainer's
    rollouts (sampled at the job's ``temperature``), the flows' dev checks and the evaluations of a
    run (:meth:`EpisodeShape.greedy`), and the /v1/answer limits of a local pipeline's policy. None
    of them decodes under the recipe's action grammar, so a format error counts alike in training,
    dev and evaluation; the recipe's own ``top_k`` and stop strings apply.

    >>> episode_shape(resolve(Hyperparameters(preset="cpu"), "search-r1")).limits()
    {'max_steps': 4, 'max_new_tokens_per_step': 96, 'token_budget': 1152}
    """
    return EpisodeShape(
        max_steps=hp.max_steps,
        max_new_tokens_per_step=hp.max_new_tokens_per_step,
        token_budget=hp.token_budget,
        temperature=hp.temperature,
        search_mode=hp.search_mode,
    )


def job_episode_shape(request: JobRequest | dict[str, Any]) -> EpisodeShape:
    """:func:`episode_shape` of a job request (or its JSON, as the flows send it to the trainer)."""
    job = JobRequest.model_validate(request)
    return episode_shape(resolve(job.hyperparameters, job.recipe, job.objective))


def reward_scaling(hp: Hyperparameters, objective: str) -> str:
    """TRL's ``scale_rewards``: as set, else ``none`` for ``dr_grpo`` and ``group`` otherwise.

    TRL's ``loss_type="dr_grpo"`` only changes the length normalisation; Dr. GRPO (Liu et al., 2025)
    also drops the division by the group's reward std, so the objective sets both.
    """
    return hp.scale_rewards or ("none" if objective == "dr_grpo" else "group")


def _problems(exc: ValidationError) -> str:
    """Pydantic's errors as ``key: message`` lines, an unknown key named as such."""
    lines = []
    for error in exc.errors():
        key = ".".join(str(part) for part in error["loc"]) or "(top level)"
        if error["type"] == "extra_forbidden":
            lines.append(f"unknown key {key!r}")
        else:
            lines.append(f"{key}: {error['msg']}")
    return "; ".join(lines)


def validate_request(data: dict[str, Any], where: str) -> JobRequest:
    """``data`` as a :class:`JobRequest`; :class:`ConfigError` naming ``where`` and each bad key."""
    try:
        return JobRequest.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{where}: {_problems(exc)}") from None


def load_config(path: str | Path, small: bool = False) -> JobRequest:
    """The job request a config file describes; ``small`` applies its ``small:`` overrides.

    The paper-size request is validated first, so an error in the file's main part is reported as
    such, then the request with the overrides (an error there names the ``small:`` section).
    """
    data = read_config(path)
    overrides = data.pop(SMALL, None) or {}
    data.pop(OBJECTIVES, None)
    data.pop(PAPER, None)
    request = validate_request(data, f"config {path}")
    if not small:
        return request
    if not overrides:
        raise ConfigError(f"config {path} has no `{SMALL}:` section; --small needs one")
    return validate_request(merge(data, overrides), f"config {path}, with its `{SMALL}:` overrides")


def set_fields(request: JobRequest) -> dict[str, Any]:
    """The fields a config file set (hyperparameters too), as JSON values: what a caller merges its
    own explicit options over, leaving every other field to the trainer's layered defaults."""
    fields = request.model_dump(mode="json", exclude_unset=True)
    fields["objective"] = request.objective  # filled from the recipe when the file names none
    return fields


def protocol_shape(protocol: Protocol) -> EpisodeShape:
    """The episode a paper's evaluation runs (``hoprl eval-answers --protocol``, ``hoprl pipeline
    --protocol``): the shape its recipe trains with under the papers' preset (configs/<recipe>.yaml,
    :func:`episode_shape`), with the protocol's own step cap, evaluation decoding and generation
    limit where the paper gives them, free of any grammar (no paper constrains its decoding). A
    longer step cap than training's scales the token budget with it, so the extra steps fit.

    >>> shape = protocol_shape(PROTOCOLS["evo-rag"])
    >>> shape.max_steps, shape.max_new_tokens_per_step, shape.temperature, shape.grammar
    (20, 256, 0.0, False)
    """
    trained = episode_shape(resolve(Hyperparameters(), protocol.recipe))
    steps = protocol.max_steps or trained.max_steps
    budget = trained.token_budget * max(1, -(-steps // trained.max_steps))
    return trained.model_copy(
        update={
            "max_steps": steps,
            "max_new_tokens_per_step": protocol.max_tokens or trained.max_new_tokens_per_step,
            "token_budget": min(budget, MAX_BUDGET),
            "temperature": protocol.temperature,
            "grammar": False,
        }
    )
