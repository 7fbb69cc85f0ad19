"""Job configs: one YAML file per paper (``configs/*.yaml``), loaded as a validated :class:`JobRequest`.

A config file holds the fields of a trainer job request (``recipe``, ``objective``, ``model``,
``steps``, ``seed``, ``hyperparameters: {...}``) at the paper's size, on GPUs, and three sections
that are not part of the request:

- ``small:`` the overrides for a toy run on a CPU (the bundled model, the transformers engine, one
  process, the ``cpu`` preset, a few steps); ``small=True`` applies them. Overrides merge key by
  key into the mappings below them, and a ``null`` override removes the key, so the layered
  defaults of :meth:`Hyperparameters.resolved` (the ``cpu`` preset's sizes, the paper's values)
  apply to it again.
- ``objectives: {<objective>: {...}}``: hyperparameters the paper gives for another objective of
  the same recipe (EVO-RAG's PPO column), applied when a job trains with it.
- ``paper:`` what the paper trains with beyond the request: its other backbones (``models``) and
  how its training set is built (``training_data``, :mod:`hoprl.data.mixtures`).

The file is the one home of a paper's settings: the trainer's ``paper`` preset reads it
(:func:`paper_defaults`, :func:`objective_defaults`), so a job sent without the file trains with
its training settings too. Only the machine settings (:data:`MACHINE`) stay the request's.

>>> request = load_config("configs/search-r1.yaml", small=True)  # doctest: +SKIP
>>> request.hyperparameters.generation, request.hyperparameters.preset  # doctest: +SKIP
('transformers', 'cpu')

An unknown key, a value of the wrong type or a YAML error raises :class:`ConfigError` naming the
file and the key; the same validation as ``POST /v1/jobs`` (``extra="forbid"``) applies.
"""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path
from typing import Any

import yaml

from hoprl.settings import get_settings

SMALL = "small"  # the section of a config file that holds the toy-run overrides
OBJECTIVES = "objectives"  # per-objective hyperparameters (not part of the request)
PAPER = "paper"  # other backbones and the training set (not part of the request)
SECTIONS = (SMALL, OBJECTIVES, PAPER)
#: hyperparameters that describe the machine a run uses, not how the paper trains: a request keeps
#: its own (a job sent to a CPU trainer must not inherit eight GPUs from the paper's file)
MACHINE = (
    "preset",
    "generation",
    "vllm_mode",
    "vllm_server_url",
    "vllm_gpu_memory_utilization",
    "vllm_importance_sampling_correction",
    "processes",
    "distributed",
    "report_to",
    "torch_threads",
)
#: the source tree's configs folder (``HOPRL_CONFIGS_DIR`` moves it: the images copy it to /app)
SOURCE_CONFIGS = Path(__file__).resolve().parents[1] / "configs"


class ConfigError(ValueError):
    """A config file is missing, not YAML, or not a valid job request; the message names the file."""


def merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` applied key by key; nested mappings merge, ``None`` removes a key.

    >>> merge({"a": 1, "h": {"x": 1, "y": 2}}, {"h": {"y": None, "z": 3}, "b": 2})
    {'a': 1, 'h': {'x': 1, 'z': 3}, 'b': 2}
    """
    merged = dict(base)
    for key, value in overrides.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's floats: ``1e-6`` is a number, not the string "1e-6"
    (YAML 1.1 needs a dot, ``1.0e-6``). Job requests take JSON's types only, so a learning rate
    written the usual way must arrive as a number."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def read_config(path: str | Path) -> dict[str, Any]:
    """The file's mapping as written (``small:`` section included); :class:`ConfigError` otherwise."""
    path = Path(path)
    try:
        data = yaml.load(path.read_text(), Loader=_Loader)
    except OSError as exc:
        raise ConfigError(f"config {path}: cannot read it ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config {path} must be a mapping of job request fields (recipe, steps, ...)")
    for section in SECTIONS:
        value = data.get(section)
        if value is not None and not isinstance(value, dict):
            what = "overrides" if section == SMALL else "settings"
            raise ConfigError(f"config {path}: `{section}:` must be a mapping of {what}")
    return data


def configs_dir() -> Path:
    """``HOPRL_CONFIGS_DIR``, else the source tree's ``configs/``."""
    return get_settings().configs_dir or SOURCE_CONFIGS


@functools.lru_cache(maxsize=32)
def _paper_file(folder: Path, recipe: str) -> dict[str, Any] | None:
    """The recipe's config file as written, or None when the recipe has none (``naive-rag``)."""
    path = folder / f"{recipe}.yaml"
    return read_config(path) if path.is_file() else None


def paper_config(recipe: str) -> dict[str, Any]:
    """``configs/<recipe>.yaml`` as written; :class:`ConfigError` when the recipe has no file."""
    data = _paper_file(configs_dir(), recipe)
    if data is None:
        raise ConfigError(f"no paper config for {recipe!r} in {configs_dir()} (HOPRL_CONFIGS_DIR)")
    return data


def _training(hyperparameters: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in hyperparameters.items() if k not in MACHINE}


def paper_defaults(recipe: str) -> dict[str, Any]:
    """The training settings of the recipe's paper: its config's ``objective`` and hyperparameters
    without the machine ones (:data:`MACHINE`); ``{}`` for a recipe without a config file.

    >>> paper_defaults("r2ag")["num_generations"], paper_defaults("naive-rag")
    (12, {})
    """
    data = _paper_file(configs_dir(), recipe)
    if data is None:
        return {}
    out = copy.deepcopy(_training(data.get("hyperparameters") or {}))
    if data.get("objective"):
        out["objective"] = data["objective"]
    return out


def objective_defaults(recipe: str, objective: str) -> dict[str, Any]:
    """The hyperparameters the paper gives for ``objective`` (its ``objectives:`` section).

    >>> objective_defaults("evo-rag", "ppo")["critic_learning_rate"], objective_defaults("evo-rag", "dpo")
    (1e-05, {})
    """
    data = _paper_file(configs_dir(), recipe) or {}
    return copy.deepcopy(_training((data.get(OBJECTIVES) or {}).get(objective) or {}))


def paper_section(recipe: str) -> dict[str, Any]:
    """The config's ``paper:`` section (``models``, ``training_data``)."""
    return dict(paper_config(recipe).get(PAPER) or {})


#: recipes without a paper config file (``configs/<recipe>.yaml``): never trained in a paper.
#: Search-R1's RAG baseline retrieves top-3 (NaiveRAGConfig.top_k).
BASELINE_DEFAULTS: dict[str, dict[str, Any]] = {"naive-rag": {"objective": "grpo"}}


def recipe_defaults(recipe: str) -> dict[str, Any]:
    """The recipe's paper settings (:func:`paper_defaults`), or a baseline's (:data:`BASELINE_DEFAULTS`):
    ``objective`` is the recipe's objective when a request names none; ``recipe_config`` fills the
    recipe config keys a request leaves out."""
    return paper_defaults(recipe) or dict(BASELINE_DEFAULTS.get(recipe, {}))


def recipe_objective(recipe: str, objective: str | None = None) -> str:
    """The objective a job trains with: the request's, else its recipe's paper objective.

    >>> recipe_objective("r2ag"), recipe_objective("r2ag", "grpo"), recipe_objective("search-r1")
    ('dapo', 'grpo', 'grpo')
    """
    return objective or str(recipe_defaults(recipe).get("objective", "grpo"))
