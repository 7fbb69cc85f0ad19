"""A worker killed with SIGKILL resumes from its last complete checkpoint: no episode written
twice, none lost, every step logged once, the curriculum stage carried over, every step's records
from one attempt, and the dynamic sampler's draws those of an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete

from hoprl.data.jsonl import write_questions
from hoprl.domain import Episode, Question, Step
from hoprl.registry.models import CheckpointRow
from hoprl.registry.store import Registry
from hoprl.schemas.trainer import Hyperparameters, JobRequest
from hoprl.training.callbacks import STATE_FILE, current_attempt, start_attempt
from services.trainer.jobs import submit
from tests.postgres import admin_url_or_skip, fresh_database

ROOT = Path(__file__).resolve().parents[3]
STEPS, GROUPS, SAMPLES = 5, 2, 2
#: per step: each group's question (TRL's sampler) and its refill candidates (dynamic sampling)
Draws = dict[int, list[tuple[str, tuple[str, ...]]]]


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A registry URL: a new SQLite file, or a fresh database on the PostgreSQL at 127.0.0.1."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'registry.db'}"
        return
    with fresh_database(admin_url_or_skip()) as url:
        yield url.render_as_string(hide_password=False)


# -- start_attempt on the registry alone ----------------------------------------------------------


def record_steps(registry: Registry, run_id: str, steps: range) -> None:
    """What a GRPO attempt leaves per step: episodes, metrics, a stage switch, a checkpoint row."""
    for step in steps:
        episodes = [Episode(recipe="when-to-search", question_id=f"q{step}", question="?", sample=i,
                            steps=[Step(t=1, action="answer", text="x")]) for i in range(2)]  # fmt: skip
        registry.write_episodes(run_id, step, episodes, [{"total": 0.5}, {"total": 1.0}])
        registry.log_metrics(run_id, step, {"reward": float(step), "step": float(step)})
        registry.record_stage_switch(run_id, step, f"stage{step}", f"stage{step + 1}", reason="test")
        registry.add_checkpoint(run_id, step, f"/nowhere/checkpoint-{step}")


def test_start_attempt_keeps_only_the_committed_steps(db_url: str, tmp_path: Path) -> None:
    runs = tmp_path / "runs" / "r1"
    with Registry(db_url) as registry:
        registry.create_run("r1", recipe="when-to-search", objective="grpo", model="m", config={}, seed=0)
        registry.start_stage("r1", "stage1", 0)
        # attempt 1 runs steps 1-3 and dies before any checkpoint completes
        assert start_attempt(registry, "r1", runs) == 1 and current_attempt(runs) == 1
        record_steps(registry, "r1", range(1, 4))
        # attempt 2 has no checkpoint to resume either: every step of attempt 1 goes
        assert start_attempt(registry, "r1", runs) == 2 and current_attempt(runs) == 2
        assert registry.count_episodes("r1") == 0 and registry.latest_metrics("r1") == {}
        assert [(s.name, s.started_at_step, s.ended_at_step) for s in registry.stages("r1")] == [
            ("stage1", 0, None)
        ]
        assert registry.stage_switches("r1") == [] and registry.checkpoints("r1") == []
        # attempt 2 runs steps 1-4; checkpoint 2 completes on disk, and the kill comes before its row
        record_steps(registry, "r1", range(1, 5))
        (runs / "checkpoint-2").mkdir(parents=True)
        (runs / "checkpoint-2" / STATE_FILE).write_text(json.dumps({"step": 2}))
        (runs / "checkpoint-4").mkdir()  # incomplete: no state file, never resumed from
        with registry.session() as s:  # the row of checkpoint 2 was never written
            s.execute(delete(CheckpointRow).where(CheckpointRow.run_id == "r1", CheckpointRow.step == 2))
        assert start_attempt(registry, "r1", runs) == 3
        assert [r.step for r in registry.episodes("r1")] == [1, 1, 2, 2]
        assert registry.metric_series("r1", "reward") == [(1, 1.0), (2, 2.0)]
        assert [(w.step, w.to_stage) for w in registry.stage_switches("r1")] == [(1, "stage2"), (2, "stage3")]
        # stage3 (opened at step 2) is open again: its end at step 3 was undone with step 3
        assert [(s.name, s.started_at_step, s.ended_at_step) for s in registry.stages("r1")] == [
            ("stage1", 0, 1),
            ("stage2", 1, 2),
            ("stage3", 2, None),
        ]
        assert registry.current_stage("r1") == "stage3"
        assert [(c.step, c.path) for c in registry.checkpoints("r1")] == [
            (1, "/nowhere/checkpoint-1"),
            (2, str(runs / "checkpoint-2")),
        ]


# -- kill -9 and resume, against an uninterrupted run ---------------------------------------------


def worker(run_id: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """The worker as the service starts it; its log goes to a file (a pipe could fill and block it)."""
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "services.trainer.worker", run_id], cwd=ROOT,
                                env=env, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip


def job(tiny_model: str, collection: str, data: Path) -> JobRequest:
    """When-to-search with a stage switch at step 1 and dynamic sampling on (3 refills a group)."""
    hp = Hyperparameters(
        questions_per_step=GROUPS, num_generations=SAMPLES, max_steps=2, max_new_tokens_per_step=8,
        token_budget=64, save_steps=2, eval_questions=1, dynamic_sampling=True, max_resample=3,
        recipe_config={"curriculum": "steps", "switch_step": 1},
    )  # fmt: skip
    return JobRequest(recipe="when-to-search", model=tiny_model, dataset=str(data), collection=collection,
                      steps=STEPS, seed=7, hyperparameters=hp)  # fmt: skip


def environment(url: str, runs: Path, retriever_url: str) -> dict[str, str]:
    return {**os.environ, "TRAINER_DATABASE_URL": url, "TRAINER_RUNS_DIR": str(runs),
            "TRAINER_RETRIEVER_URL": retriever_url, "TRAINER_TORCH_THREADS": "1"}  # fmt: skip


def draws(registry: Registry, run_id: str) -> Draws:
    """What each step drew, from the ``dynamic_sampling`` trail of the stored episodes."""
    out: dict[int, set[tuple[str, tuple[str, ...]]]] = {}
    for row in registry.episodes(run_id):
        trail = row.trajectory["meta"]["dynamic_sampling"]
        out.setdefault(row.step, set()).add((trail["for"], tuple(trail["candidates"])))
    return {step: sorted(groups) for step, groups in out.items()}


@pytest.fixture(scope="module")
def uninterrupted(tiny_model: str, retriever_url: str, collection: str, synthetic: dict[str, list[Question]],
                  tmp_path_factory: pytest.TempPathFactory) -> Draws:  # fmt: skip
    """The same job, same seed, never killed: what every step draws."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    data = tmp / "train.jsonl"
    write_questions(data, synthetic["train"])
    url = f"sqlite:///{tmp / 'registry.db'}"
    with Registry(url) as registry:
        run_id = submit(registry, job(tiny_model, collection, data)).id
        proc = worker(run_id, environment(url, tmp / "runs", retriever_url), tmp / "worker.log")
        assert proc.wait(timeout=400) == 0, (tmp / "worker.log").read_text()[-3000:]
        return draws(registry, run_id)


@pytest.mark.slow
def test_sigkill_then_resume(db_url: str, tiny_model: str, retriever_url: str, collection: str,
                             synthetic: dict[str, list[Question]], tmp_path: Path,
                             uninterrupted: Draws) -> None:  # fmt: skip
    data = tmp_path / "train.jsonl"
    write_questions(data, synthetic["train"])
    env = environment(db_url, tmp_path / "runs", retriever_url)
    with Registry(db_url) as registry:
        run_id = submit(registry, job(tiny_model, collection, data)).id
        first = worker(run_id, env, tmp_path / "first.log")
        deadline = time.monotonic() + 300
        while registry.count_episodes(run_id, step=3) == 0:  # past checkpoint 2, mid-way to 4
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no step 3 within 300 s"
            time.sleep(0.2)
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        killed: Any = {row.trajectory["meta"]["attempt"] for row in registry.episodes(run_id, step=3)}
        assert killed == {1}  # the killed attempt had stored step 3's episodes
        checkpoint = registry.latest_checkpoint(run_id)
        assert checkpoint is not None and checkpoint.step == 2
        second = worker(run_id, env, tmp_path / "second.log")
        second.wait(timeout=400)
        log = (tmp_path / "second.log").read_text()
        assert second.returncode == 0, log[-3000:]
        assert "resume " + str(tmp_path / "runs" / run_id / "checkpoint-2") in log
        assert f"run {run_id}: attempt 2, resuming after step 2" in log

        run = registry.get_run(run_id)
        assert run is not None and run.status == "succeeded"
        per_step = [registry.count_episodes(run_id, step=s) for s in range(1, STEPS + 1)]
        assert per_step == [GROUPS * SAMPLES] * STEPS  # none lost ...
        assert registry.count_episodes(run_id) == STEPS * GROUPS * SAMPLES  # ... none twice
        assert [s for s, _ in registry.metric_series(run_id, "step")] == list(range(1, STEPS + 1))
        assert [c.step for c in registry.checkpoints(run_id)] == [2, 4, 5]
        # (a) each step's episodes and metrics come from one attempt: 1 up to the checkpoint, then 2
        attempts = {s: {row.trajectory["meta"]["attempt"] for row in registry.episodes(run_id, step=s)}
                    for s in range(1, STEPS + 1)}  # fmt: skip
        assert attempts == {1: {1}, 2: {1}, 3: {2}, 4: {2}, 5: {2}}
        assert registry.metric_series(run_id, "attempt") == [(1, 1.0), (2, 1.0), (3, 2.0), (4, 2.0), (5, 2.0)]
        # (b) the questions and refills each step drew are those of the uninterrupted run
        assert draws(registry, run_id) == uninterrupted
        assert sorted(uninterrupted) == list(range(1, STEPS + 1))
        assert all(len(groups) == GROUPS and all(c for _, c in groups) for groups in uninterrupted.values())
        # stage 1 -> 2 switched at step 1 before the kill and the resumed run kept stage 2
        assert registry.current_stage(run_id) == "stage2"
        assert [(w.step, w.to_stage) for w in registry.stage_switches(run_id)] == [(1, "stage2")]
