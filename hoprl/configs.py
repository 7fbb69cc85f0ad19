"""Job configs: one YAML file per paper (``configs/*.yaml``), loaded as a validated :class:`JobRequest`.

A config file holds the fields of a trainer job request (``recipe``, ``objective``, ``model``,
``steps``, ``seed``, ``hyperparameters: {...}``) at the paper's size, on GPUs. Its ``small:``
section holds the overrides for a toy run on a CPU (the bundled model, the transformers engine,
one process, the ``cpu`` preset, a few steps); ``small=True`` applies them. Overrides merge key by
key into the mappings below them, and a ``null`` override removes the key, so the layered
defaults of :meth:`Hyperparameters.resolved` (the ``cpu`` preset's sizes, the paper's values)
apply to it again.

>>> request = load_config("configs/search-r1.yaml", small=True)  # doctest: +SKIP
>>> request.hyperparameters.generation, request.hyperparameters.preset  # doctest: +SKIP
('transformers', 'cpu')

An unknown key, a value of the wrong type or a YAML error raises :class:`ConfigError` naming the
file and the key; the same validation as ``POST /v1/jobs`` (``extra="forbid"``) applies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from hoprl.schemas.trainer import JobRequest

SMALL = "small"  # the section of a config file that holds the toy-run overrides


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


def read_config(path: str | Path) -> dict[str, Any]:
    """The file's mapping as written (``small:`` section included); :class:`ConfigError` otherwise."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"config {path}: cannot read it ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config {path} must be a mapping of job request fields (recipe, steps, ...)")
    small = data.get(SMALL)
    if small is not None and not isinstance(small, dict):
        raise ConfigError(f"config {path}: `{SMALL}:` must be a mapping of overrides")
    return data


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
