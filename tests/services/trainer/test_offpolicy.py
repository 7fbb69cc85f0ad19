"""PPO and DPO jobs through the job runner: fresh rollouts with the training model, registry rows,
resumable checkpoints, and training on another run's stored episodes (``episodes_from``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from hoprl.data.jsonl import write_questions
from hoprl.domain import Action, Episode, Question
from hoprl.recipes import RECIPES
from hoprl.recipes.evo_rag import EvoRag
from hoprl.registry.store import Registry
from hoprl.schemas.trainer import Hyperparameters, JobRequest
from hoprl.training.callbacks import STATE_FILE
from hoprl.training.ppo import VALUE_HEAD_FILE
from services.trainer.jobs import run_job, submit
from services.trainer.settings import TrainerSettings

STEPS, GROUPS, SAMPLES = 2, 2, 4
Env = tuple[TrainerSettings, Registry, Path]


class ParityEvoRag(EvoRag):
    """EVO-RAG with actions a random model takes: a segment reads as REFUSE (odd length) or
    BACKTRACK (even), so a group's returns differ and DPO finds pairs.

    A segment is the step's few random tokens (up to a newline; cut at max_new_tokens_per_step, it
    is parsed all the same: ``accept_truncated``). It used to end at the first space:
    most of the tokenizer's tokens begin with one, so most segments were empty, the empty ones
    merged into one candidate and pairs with an empty side were dropped; with the episodes sampled
    differently on every run (unseeded rollouts decode in whatever batches form), one run in a few
    dozen found no pair in either step, DPO never updated, and "no weight changed" failed. The jobs
    below sample with ``rollout_seed``, so each run draws the same episodes.
    """

    stop = ["\n"]  # noqa: RUF012
    accept_truncated = True

    def parse(self, segment: str) -> Action:
        return Action("refuse") if len(segment) % 2 else Action("backtrack")


@pytest.fixture(scope="module")
def env(retriever_url: str, synthetic: dict[str, list[Question]],
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:  # fmt: skip
    tmp = tmp_path_factory.mktemp("offpolicy")
    data = tmp / "train.jsonl"
    write_questions(data, synthetic["train"])
    settings = TrainerSettings(database_url=f"sqlite:///{tmp / 'registry.db'}", runs_dir=tmp / "runs",
                               retriever_url=retriever_url, torch_threads=1)  # fmt: skip
    with pytest.MonkeyPatch.context() as mp, Registry(settings.database_url) as registry:
        mp.setitem(RECIPES, "evo-rag", ParityEvoRag)
        yield settings, registry, data


def run(env: Env, model: str, collection: str, objective: str,
        steps: int = STEPS, seed: int = 0, **hp: Any) -> str:  # fmt: skip
    settings, registry, data = env
    params = Hyperparameters(
        questions_per_step=GROUPS, num_generations=SAMPLES, max_steps=2, max_new_tokens_per_step=8,
        token_budget=64, save_steps=1, eval_questions=1, learning_rate=1e-3, **{"rollout_seed": True, **hp},
    )  # fmt: skip
    request = JobRequest(recipe="evo-rag", objective=objective, model=model, dataset=str(data),
                         collection=collection, steps=steps, seed=seed, hyperparameters=params)  # fmt: skip
    run_id = submit(registry, request).id
    run_job(run_id, settings, registry)
    return run_id


def changed(before: str, after: str) -> bool:
    a = AutoModelForCausalLM.from_pretrained(before).state_dict()
    b = AutoModelForCausalLM.from_pretrained(after).state_dict()
    return any(not torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def ppo_run(env: Env, tiny_model: str, collection: str) -> str:
    # Table 10's Qwen2.5-0.5B critic cannot read the tiny model's tokens: a copy of the policy
    return run(env, tiny_model, collection, "ppo", critic_model="policy")


def check_job(env: Env, run_id: str, model: str, episodes: int = GROUPS * SAMPLES) -> list[Path]:
    """Registry rows for every step, and resumable checkpoints that moved the weights."""
    settings, registry, _ = env
    per_step = [registry.count_episodes(run_id, step=s) for s in range(1, STEPS + 1)]
    assert per_step == [episodes] * STEPS
    assert [s for s, _ in registry.metric_series(run_id, "step")] == list(range(1, STEPS + 1))
    assert registry.current_stage(run_id) == "discovery"
    folders = [Path(c.path) for c in registry.checkpoints(run_id)]
    assert folders == [settings.runs_dir / run_id / f"checkpoint-{s}" for s in range(1, STEPS + 1)]
    assert all((f / STATE_FILE).is_file() and (f / "optimizer.pt").is_file() for f in folders)
    assert json.loads((folders[-1] / STATE_FILE).read_text())["step"] == STEPS
    assert changed(model, str(folders[-1])), "no weight changed"
    return folders


def test_ppo_job(env: Env, ppo_run: str, tiny_model: str) -> None:
    folders = check_job(env, ppo_run, tiny_model)
    assert all((f / VALUE_HEAD_FILE).is_file() for f in folders)
    registry = env[1]
    logged = set(registry.latest_metrics(ppo_run))
    assert {"loss", "pg_loss", "vf_loss", "reward", "rollout_s", "searches"} <= logged
    rows = registry.episodes(ppo_run, step=1)
    assert all("evo_rag" in r.trajectory["meta"] and "total" in r.rewards for r in rows)


def test_dpo_job(env: Env, tiny_model: str, collection: str) -> None:
    """EVO-RAG's DPO (App. A.4): one episode per question with SAMPLES - 1 siblings at every step;
    the pairs come from each step's candidates."""
    run_id = run(env, tiny_model, collection, "dpo")
    pairs = [v for _, v in env[1].metric_series(run_id, "pairs")]
    assert len(pairs) == STEPS and sum(pairs) > 0, "no preference pair: DPO cannot have moved a weight"
    check_job(env, run_id, tiny_model, episodes=GROUPS)
    episodes = [Episode.model_validate(r.trajectory) for r in env[1].episodes(run_id, step=1)]
    assert all(len(others) == SAMPLES - 1 for e in episodes for others in e.meta["siblings"].values())
    assert "loss" in env[1].latest_metrics(run_id)


def test_dpo_prefix_pairs_option(env: Env, tiny_model: str, collection: str) -> None:
    """``dpo_pairs: prefixes`` (the earlier reading): SAMPLES independent episodes a question."""
    run_id = run(env, tiny_model, collection, "dpo", steps=1, dpo_pairs="prefixes")
    assert env[1].count_episodes(run_id, step=1) == GROUPS * SAMPLES


def texts(registry: Registry, run_id: str, step: int) -> list[list[str]]:
    return [[s["text"] for s in r.trajectory["steps"]] for r in registry.episodes(run_id, step=step)]


def test_seeded_rollouts_repeat_their_episodes(env: Env, tiny_model: str, collection: str) -> None:
    """What makes the DPO test deterministic: the same job seed gives the same episodes and pairs
    (unseeded, the samples differ from run to run), and another seed gives other episodes."""
    first, again = (run(env, tiny_model, collection, "dpo", steps=1) for _ in range(2))
    other = run(env, tiny_model, collection, "dpo", steps=1, seed=1)
    registry = env[1]
    assert texts(registry, first, 1) == texts(registry, again, 1)
    assert registry.metric_series(first, "pairs") == registry.metric_series(again, "pairs")
    assert texts(registry, other, 1) != texts(registry, first, 1)


def test_episodes_from(env: Env, ppo_run: str, tiny_model: str,
                       collection: str) -> None:  # fmt: skip
    """A DPO job on the PPO run's stored episodes: the same episodes, step by step, cycled."""
    registry = env[1]
    run_id = run(env, tiny_model, collection, "dpo", steps=3, episodes_from=ppo_run, dpo_pairs="prefixes")
    source = {s: [r.trajectory for r in registry.episodes(ppo_run, step=s)] for s in (1, 2)}
    for step, origin in ((1, 1), (2, 2), (3, 1)):
        assert [r.trajectory for r in registry.episodes(run_id, step=step)] == source[origin]
    assert "rollout_s" not in registry.latest_metrics(run_id)  # nothing was generated
    # Pairs are built deterministically from the stored episodes: step 3 reuses step 1's. How
    # many there are depends on the PPO run's sampled episodes (a group whose samples all read as
    # the same action gives none), so the weights must move exactly when some pair was found.
    pairs = [v for _, v in registry.metric_series(run_id, "pairs")]
    assert len(pairs) == 3 and pairs[2] == pairs[0]
    assert changed(tiny_model, registry.checkpoints(run_id)[-1].path) == (sum(pairs) > 0)
    with pytest.raises(ValueError, match="not a run"):
        run(env, tiny_model, collection, "ppo", steps=1, episodes_from="job-missing", critic_model="policy")


def test_sibling_grpo_job(env: Env, tiny_model: str, collection: str) -> None:
    """EVO-RAG's GRPO (the recipe's default advantage, siblings; §3.4, App. A.5, Table 10 n = 1):
    one episode per question, SAMPLES - 1 siblings recorded beside every step, one sibling group
    per step; the groups with spread train the policy and feed the preference model's pairs."""
    registry = env[1]
    run_id = run(env, tiny_model, collection, "grpo", steps=1)
    assert registry.get_run(run_id).config["hyperparameters"]["advantage"] == "siblings"  # type: ignore[union-attr]
    rows = registry.episodes(run_id, step=1)
    assert len(rows) == GROUPS  # one episode per question, not a group of SAMPLES
    episodes = [Episode.model_validate(r.trajectory) for r in rows]
    for episode in episodes:
        assert sorted(episode.meta["siblings"]) == [str(s.t) for s in episode.steps]
        assert all(len(others) == SAMPLES - 1 for others in episode.meta["siblings"].values())
    metrics = registry.latest_metrics(run_id)
    assert metrics["siblings/groups"] == sum(len(e.steps) for e in episodes)
    assert metrics["siblings/rows"] > 0 and "loss" in metrics, "no sibling group had spread"
    assert metrics["preference/train_pairs"] + metrics["preference/eval_pairs"] > 0
    checkpoint = Path(registry.checkpoints(run_id)[-1].path)
    assert changed(tiny_model, str(checkpoint))
    assert json.loads((checkpoint / STATE_FILE).read_text())["loop"] == "siblings-grpo"  # resumes as itself
