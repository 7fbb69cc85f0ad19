"""The domain's types: the episode shape's one table of defaults, its names, and the recipe names."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from hoprl.domain import RECIPE_NAMES, SHAPE_DEFAULTS, EpisodeShape
from hoprl.jobspec import CPU_PRESET
from hoprl.recipes import RECIPES
from hoprl.schemas.trainer import Hyperparameters
from services.policy.settings import PolicySettings


def test_the_recipe_names_are_the_registrys() -> None:
    assert sorted(RECIPE_NAMES) == sorted(RECIPES)


def test_one_table_of_defaults_feeds_the_job_the_preset_and_the_service() -> None:
    """make run's 4 steps of 96 tokens in 1,152 (docs/training.md), the generic job's 4 / 64 / 512,
    the service's 10 / 256 / 2,048: each read from the table, nowhere spelled again."""
    assert SHAPE_DEFAULTS["cpu"].limits() == {
        "max_steps": 4,
        "max_new_tokens_per_step": 96,
        "token_budget": 1152,
    }
    assert {k: CPU_PRESET[k] for k in ("max_steps", "max_new_tokens_per_step", "token_budget")} == {
        "max_steps": 4, "max_new_tokens_per_step": 96, "token_budget": 1152,
    }  # fmt: skip
    generic = Hyperparameters()
    assert (generic.max_steps, generic.max_new_tokens_per_step, generic.token_budget) == (4, 64, 512)
    served = PolicySettings(_env_file=None).serving_shape()  # type: ignore[call-arg]
    assert served.limits() == {"max_steps": 10, "max_new_tokens_per_step": 256, "token_budget": 2048}
    assert served.grammar is True and served.temperature == 0.0


def test_a_shape_is_frozen_greedy_on_demand_and_refuses_other_spellings() -> None:
    shape = EpisodeShape(max_steps=4, max_new_tokens_per_step=96, token_budget=1152, temperature=1.0)
    assert shape.greedy().temperature == 0.0 and shape.greedy().limits() == shape.limits()
    assert shape.temperature == 1.0  # greedy() is a copy
    with pytest.raises(ValidationError):
        shape.max_steps = 5  # type: ignore[misc]
    for other in ("max_turns", "max_tokens_per_step", "documents_per_search", "t_max"):
        with pytest.raises(ValidationError, match=other):
            EpisodeShape.model_validate({**shape.model_dump(), other: 4})
