"""configs/: every paper's job config validates at its paper size and with --small, the small run
really is a CPU run, every value carries its source, the loader's errors name the file and the key,
and the accelerate configs are ones `accelerate launch --config_file` accepts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import pytest

from hoprl.configs import SMALL, ConfigError, merge, read_config
from hoprl.jobspec import CPU_PRESET, load_config, resolve
from hoprl.recipes import get_recipe
from hoprl.schemas.trainer import Distributed, Hyperparameters
from services.trainer.admission import check_limits
from services.trainer.settings import TrainerSettings

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
PAPERS = ["arena", "eval-rar", "evo-rag", "r2ag", "search-r1", "when-to-search"]
#: the main model each paper trains (docs/papers.md); the others are the config's paper.models
MODELS = {
    "arena": "Qwen/Qwen2.5-7B-Instruct",  # ARENA §4.4, Table 3
    "eval-rar": "Qwen/Qwen2.5-3B",  # Eval-RAR §5.1, Table 1 (the Base model)
    "evo-rag": "meta-llama/Llama-3.1-8B-Instruct",  # EVO-RAG App. A.2, Table 7
    "r2ag": "Qwen/Qwen3-8B",  # R2AG App. B.2
    "search-r1": "Qwen/Qwen2.5-3B-Instruct",  # Search-R1's Experimental Setup
    "when-to-search": "Qwen/Qwen3-4B",  # when-to-search App. B.2, Tables 1, 2, 4
}
#: TRAINER_MAX_* settings a paper-size run must raise (the config's header says so): when-to-search
#: generates up to 500 steps x 32 questions x 32 samples x 4 draws x 16,384 tokens = 3.4e10
RAISED = {"when-to-search": {"max_job_tokens": 4 * 10**10}}
GPU_FIELDS = ("generation", "vllm_mode", "vllm_gpu_memory_utilization", "processes", "distributed")


def config(name: str) -> Path:
    return CONFIGS / f"{name}.yaml"


def test_there_is_one_config_per_paper() -> None:
    assert sorted(p.stem for p in CONFIGS.glob("*.yaml")) == PAPERS


@pytest.mark.parametrize("name", PAPERS)
def test_the_paper_size_config_is_a_gpu_job_the_trainer_admits(name: str) -> None:
    request = load_config(config(name))
    assert request.recipe == name and request.model == MODELS[name]
    hp = request.hyperparameters
    assert {"generation", "processes", "learning_rate", "num_generations"} <= hp.model_fields_set
    assert hp.preset == "paper"
    if name in ("r2ag", "evo-rag"):
        # R2AG's rounds and EVO-RAG's sibling GRPO are the project's own loops: one process,
        # transformers (the config says)
        assert (hp.generation, hp.processes, hp.distributed) == ("transformers", 1, None)
    else:
        assert hp.generation == "vllm" and hp.processes > 1
        assert hp.distributed is not None and (CONFIGS / "accelerate" / f"{hp.distributed}.yaml").is_file()
    get_recipe(request.recipe, **hp.recipe_config)  # the recipe accepts its config keys
    # within every TRAINER_MAX_* default (or the raised ones the config names), so `hoprl train` is
    # not refused by a trainer set up as the config says
    settings = TrainerSettings(**RAISED.get(name, {}))
    check_limits(request, resolve(hp, request.recipe, request.objective), settings)


@pytest.mark.parametrize("name", PAPERS)
def test_small_is_a_cpu_run_with_the_cpu_presets_sizes(name: str) -> None:
    request = load_config(config(name), small=True)
    assert request.recipe == name and request.model is None and request.dataset == "synthetic"
    assert request.steps <= 10
    hp = resolve(request.hyperparameters, request.recipe, request.objective)
    defaults = Hyperparameters()
    assert hp.preset == "cpu" and hp.generation == "transformers" and hp.processes == 1
    assert hp.distributed is None
    assert (hp.vllm_mode, hp.vllm_gpu_memory_utilization) == (
        defaults.vllm_mode,
        defaults.vllm_gpu_memory_utilization,
    )
    assert {k: getattr(hp, k) for k in CPU_PRESET} == CPU_PRESET
    paper = resolve(load_config(config(name)).hyperparameters, request.recipe, request.objective)
    for key in ("learning_rate", "beta", "kl_estimator", "epsilon", "epsilon_high", "dynamic_sampling"):
        assert getattr(hp, key) == getattr(paper, key), f"{name}: --small changed {key}"  # sizes only
    assert request.objective == load_config(config(name)).objective


def test_evo_rag_small_keeps_its_schedule_inside_the_short_episode() -> None:
    hp = resolve(load_config(config("evo-rag"), small=True).hyperparameters, "evo-rag", "grpo")
    assert hp.recipe_config == {"t_max": CPU_PRESET["max_steps"], "top_k": 3}


@pytest.mark.parametrize("name", PAPERS)
def test_every_value_names_its_source(name: str) -> None:
    """Each line that sets a value above the small: section carries a comment (its source); the
    recipe is the file's name."""
    lines = config(name).read_text().split(f"\n{SMALL}:")[0].splitlines()
    for line in lines:
        if re.match(r"^\s*[a-z_]+: +[^#\s]", line) and not line.startswith("recipe:"):
            assert "#" in line, f"{name}.yaml: {line.strip()!r} says nothing of where it comes from"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "small", "message"),
    [
        ("recipe: search-r1\nstep: 3\n", False, "unknown key 'step'"),
        ("recipe: search-r1\nhyperparameters:\n  lr: 1.0e-6\n", False, "unknown key 'hyperparameters.lr'"),
        (
            "recipe: search-r1\nsmall:\n  hyperparameters:\n    gpus: 1\n",
            True,
            "unknown key 'hyperparameters.gpus'",
        ),
        ("recipe: search-r1\nsteps: many\n", False, "steps: Input should be a JSON number"),
        ("recipe: search-r1\nhyperparameters:\n  generation: tpu\n", False, "hyperparameters.generation"),
        ("recipe: search-r1\n", True, "has no `small:` section"),
        ("recipe: [search-r1\n", False, "is not valid YAML"),
        ("- search-r1\n", False, "must be a mapping"),
        ("recipe: search-r1\nsmall: 3\n", False, "`small:` must be a mapping"),
    ],
)
def test_errors_name_the_file_and_the_key(tmp_path: Path, text: str, small: bool, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, small=small)
    assert str(path) in str(info.value) and message in str(info.value)
    if small and "small" in text and "gpus" in text:
        assert "small:` overrides" in str(info.value)  # the error says it is in the small section


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.yaml: cannot read it"):
        load_config(tmp_path / "missing.yaml")


def test_null_overrides_remove_keys_and_nested_mappings_merge() -> None:
    base = read_config(config("evo-rag"))
    merged = merge(base, base[SMALL])
    assert "model" not in merged and "t_max" not in merged["hyperparameters"]["recipe_config"]
    assert merged["hyperparameters"]["recipe_config"]["top_k"] == 3
    assert merged["hyperparameters"]["learning_rate"] == base["hyperparameters"]["learning_rate"]


# ---- accelerate configs --------------------------------------------------------------------------

ACCELERATE = ["ddp", "zero2", "zero3", "fsdp"]


def test_one_accelerate_config_per_distributed_value() -> None:
    assert sorted(p.stem for p in (CONFIGS / "accelerate").glob("*.yaml")) == sorted(ACCELERATE)
    assert sorted(get_args(Distributed)) == sorted(ACCELERATE)


@pytest.mark.parametrize(
    ("name", "kind"),
    [("ddp", "multi_gpu"), ("zero2", "use_deepspeed"), ("zero3", "use_deepspeed"), ("fsdp", "use_fsdp")],
)
def test_accelerate_launch_reads_the_config(name: str, kind: str) -> None:
    """accelerate's own loader (unknown top-level keys raise) and `accelerate launch`'s argument
    validation, as `accelerate launch --config_file ... --num_processes 2` runs them."""
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    path = CONFIGS / "accelerate" / f"{name}.yaml"
    loaded = load_config_from_file(str(path))
    options = {action.dest for action in launch_command_parser()._actions}
    for key in loaded.deepspeed_config or {}:
        assert key in options, f"{name}: deepspeed_config.{key} is no `accelerate launch` option"
    for key in loaded.fsdp_config or {}:
        assert key in options, f"{name}: fsdp_config.{key} is no `accelerate launch` option"
    argv = ["--config_file", str(path), "--num_processes", "2", "train.py"]
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(argv))
    assert getattr(args, kind) and args.num_processes == 2 and args.mixed_precision == "bf16"
    if name.startswith("zero"):
        assert args.zero_stage == int(name[-1])


def test_a_learning_rate_in_e_notation_is_a_number(tmp_path: Path) -> None:
    """PyYAML reads ``1e-6`` as the string "1e-6" (YAML 1.1 wants a dot); job requests take JSON's
    numbers only, so the loader reads it as YAML 1.2 does: a float."""
    path = tmp_path / "job.yaml"
    path.write_text("recipe: search-r1\nsteps: 1e2\nhyperparameters:\n  learning_rate: 1e-6\n")
    request = load_config(path)
    assert (request.steps, request.hyperparameters.learning_rate) == (100, 1e-6)
