"""One episode shape: the trainer's rollouts, the dev checks and /v1/answer read the same limits.

``make run``'s shape by hand (the cpu preset, hoprl/domain/shape.py): 4 steps of 96 tokens and
1152 tokens of context growth, 5 documents a search (when-to-search's top-k). Training samples at
1.0 (Search-R1's temperature); dev checks and evaluations are greedy; none is grammar-constrained.
Each test fails when its phase takes a limit from anywhere but the run's shape.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from flows.pipeline import job_hyperparameters, job_request, run_shape
from flows.rollouts import collect_rollouts
from flows.stack import service_env
from flows.training import dev_options, dev_shape, segment_request
from hoprl.domain import EpisodeShape
from hoprl.jobspec import job_episode_shape, resolve
from hoprl.recipes import get_recipe
from hoprl.schemas.trainer import JobRequest
from services.policy.settings import PolicySettings, installed_engine
from services.trainer.jobs import rollout_options
from services.trainer.settings import TrainerSettings

SHAPE = {"max_steps": 4, "max_new_tokens_per_step": 96, "token_budget": 1152}
HP = job_hyperparameters("when-to-search", 4, None, None, "cpu")
DATA = {"counts": {"train": 6}, "source": "synthetic", "paths": {"train": "unused.jsonl"}}


def request() -> dict:
    return job_request("when-to-search", "dapo", "synthetic", DATA, "c", 0, HP)


def test_the_run_records_make_runs_shape() -> None:
    shape = run_shape("when-to-search", "dapo", HP)
    assert shape.limits() == SHAPE
    assert shape.top_k == 5 and shape.grammar is False and shape.search_mode == "hybrid"
    assert shape.temperature == 1.0 and shape.greedy().temperature == 0.0
    assert shape.greedy().limits() == SHAPE
    assert shape.stop == tuple(get_recipe("when-to-search").stop)


def test_the_shape_is_frozen_and_names_each_field_once() -> None:
    shape = run_shape("when-to-search", "dapo", HP)
    with pytest.raises(ValidationError):
        shape.max_steps = 9  # type: ignore[misc]
    with pytest.raises(ValidationError, match="max_turns"):
        EpisodeShape.model_validate({**SHAPE, "max_turns": 4})  # one name per field
    assert EpisodeShape.model_validate(shape.model_dump(mode="json")) == shape  # stored, read back whole


def test_training_rollouts_read_the_shape(tmp_path: Path) -> None:
    """Every segment's request resolves, in the trainer, to rollouts of the run's shape at 1.0."""
    body = segment_request(request(), "ckpt", 2, 2)
    job = JobRequest.model_validate(body)
    hp = resolve(job.hyperparameters, job.recipe, job.objective)
    settings = TrainerSettings(runs_dir=tmp_path, retriever_url="http://127.0.0.1:9")
    shape = rollout_options(job, hp, "c", settings).shape
    assert shape.limits() == SHAPE and shape.temperature == 1.0 and shape.grammar is False


def test_dev_checks_read_the_shape_greedily() -> None:
    shape = dev_shape(request())
    assert shape.limits() == SHAPE and shape.temperature == 0.0 and shape.grammar is False
    assert dev_options(request(), 2, "model-id")["recipe_config"]["switch_step"] == 0  # stage 2 at once


def test_a_collection_without_a_shape_is_refused() -> None:
    with pytest.raises(ValueError, match="episode shape"):
        collect_rollouts.fn("r", 1, "dev.jsonl", "c", "naive-rag", "http://p", "http://r", options={})


def test_the_local_policy_answers_in_the_shape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The env a pipeline gives its policy, read by the policy's own settings: /v1/answer runs 4
    steps of 96 tokens within 1152, free of the grammar, with the recipe's 5 documents a search."""
    env = service_env("policy", tmp_path, {"retriever": "http://r"}, "t", None, job_episode_shape(request()))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("POLICY_ENGINE", raising=False)
    settings = PolicySettings()
    served = {"max_steps": settings.max_steps, "max_new_tokens_per_step": settings.max_new_tokens_per_step,
              "token_budget": settings.token_budget}  # fmt: skip
    assert served == SHAPE and settings.constrained_decoding is False
    assert get_recipe("when-to-search").top_k == run_shape("when-to-search", "dapo", HP).top_k
    # the default engine (vllm where installed), eager, its KV cache sized for 16 such episodes
    assert (settings.engine, settings.eager, settings.kv_cache_gib) == (installed_engine(), True, 2)
