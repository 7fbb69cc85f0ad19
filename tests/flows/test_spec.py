"""``RunSpec``: a pipeline run's parameters validated once, alike from the CLI, a deployment and Python."""

from __future__ import annotations

import argparse

import pytest
from pydantic import ValidationError

from cli import pipeline as pipeline_cli
from flows.pipeline import pipeline
from flows.spec import RunSpec


def test_an_unset_objective_is_the_recipes_paper_objective() -> None:
    assert RunSpec(recipe="r2ag").objective == "dapo"  # R2AG §2.4: DAPO
    assert RunSpec(recipe="arena").objective == "grpo"
    assert RunSpec(recipe="r2ag", objective="grpo").objective == "grpo"


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"recipe": "nope"}, "recipe"),
        ({"baselines": ["naive-rag", "nope"]}, "baselines"),
        ({"protocol": "nope"}, "protocol"),
        ({"segments": 0}, "segments"),
        ({"steps": -1}, "steps"),
        ({"eval_limit": 0}, "eval_limit"),
        ({"stepz": 3}, "stepz"),
    ],
)
def test_a_bad_value_is_refused_naming_its_field(fields: dict, named: str) -> None:
    with pytest.raises(ValidationError) as info:
        RunSpec.model_validate(fields)
    assert named in {str(e["loc"][0]) for e in info.value.errors()}


def test_the_spec_is_frozen_and_stored_whole() -> None:
    spec = RunSpec(recipe="when-to-search", baselines=None, hyperparameters=None)
    assert spec.baselines == ("naive-rag",) and spec.hyperparameters == {}
    with pytest.raises(ValidationError):
        spec.steps = 3  # type: ignore[misc]
    assert RunSpec.model_validate(spec.model_dump(mode="json")) == spec


def test_the_command_refuses_a_bad_option_before_anything_starts(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    pipeline_cli.add_arguments(parser)
    assert pipeline_cli.main(parser.parse_args(["--recipe", "nope", "--small"])) == 2
    assert "recipe: Value error, unknown recipe 'nope'" in capsys.readouterr().err


def test_the_flow_refuses_a_bad_parameter_before_anything_starts() -> None:
    """The flow's own body builds the spec first: a deployment's bad ``-p`` value fails there,
    before a registry row or a service exists."""
    with pytest.raises(ValidationError, match="segments"):
        pipeline.fn(segments=0)
