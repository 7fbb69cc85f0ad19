"""Concurrent writers on the real PostgreSQL: separate processes, as in a deployment.

A trainer worker records its job (episodes, metrics, checkpoints, stages, status) while a flow
records its pipeline (status, Prefect link, evaluations, ledger, copied curves) and two Celery
units deliver the same episodes twice; then the queue's claim of a queued job by two claimers.
"""

from __future__ import annotations

import multiprocessing
import subprocess
import threading
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.engine import URL

from hoprl.registry import Registry
from hoprl.registry.models import EvaluationRow, PredictionRow, RunRow
from tests.hoprl.registry.test_registry import episode, rewards

pytestmark = pytest.mark.integration

JOB, PIPELINE = "job-0001", "pipe-1"
STEPS, EPISODES_PER_STEP, EVALUATIONS, QUESTIONS, UNITS, LINKS = 20, 8, 6, 25, 40, 20
# spawn, not fork: a child forked from a test process that already ran threads (torch, Prefect,
# servers) inherited their state and failed in the full suite; spawned children start clean.
SPAWN = multiprocessing.get_context("spawn")


def trainer_worker(url: str, start: Event) -> None:
    """What services/trainer/worker.py and the trainer loops write for one job."""
    start.wait(30)
    with Registry(url, owner="trainer") as reg:
        reg.set_run_status(JOB, "running")
        reg.start_stage(JOB, "stage1", 0)
        for step in range(1, STEPS + 1):
            ids = range(EPISODES_PER_STEP)
            reg.write_episodes(JOB, step, [episode(i) for i in ids], [rewards(i) for i in ids])
            reg.log_metrics(JOB, step, {"reward": step / STEPS, "loss": 1 / step})
            if step % 5 == 0:
                reg.add_checkpoint(JOB, step, f"/runs/{JOB}/checkpoint-{step}", reg.latest_metrics(JOB))
            if step == STEPS // 2:
                reg.record_stage_switch(JOB, step, "stage1", "stage2", "switch_step reached")
        reg.set_run_status(JOB, "succeeded")


def flow(url: str, start: Event) -> None:
    """What flows/pipeline.py, evaluate.py and training.copy_curves write for one pipeline."""
    start.wait(30)
    with Registry(url, owner="flows") as reg:
        reg.set_run_status(PIPELINE, "running")
        for e in range(EVALUATIONS):
            predictions = [
                {"question_id": f"q{q:02d}", "prediction": "a", "em": float(q % 2), "f1": 0.5}
                for q in range(QUESTIONS)
            ]
            evaluation = reg.add_evaluation(PIPELINE, "synthetic", "test", {"em": 0.5}, predictions)
            reg.log_metrics(PIPELINE, 0, {f"pipeline/eval/{e}": float(evaluation)})
            for step, value in reg.metric_series(JOB, "reward"):  # the job's curve, read as it grows
                reg.log_metrics(PIPELINE, step, {"train/reward": value})
        reg.set_run_status(PIPELINE, "succeeded")


def flow_link(url: str, start: Event) -> None:
    """flows/runs.py link_flow_run, again and again (resumed attempts) on the same run row."""
    start.wait(30)
    with Registry(url, owner="flows") as reg:
        for n in range(1, LINKS + 1):
            with reg.session() as s:
                s.get_one(RunRow, PIPELINE).prefect_flow_run_id = f"flow-run-{n}"


def fanout_unit(url: str, start: Event, order: list[int], written: Any) -> None:
    """flows/fanout.py rollout_episode units; the broker delivers each at least once."""
    start.wait(30)
    with Registry(url, owner="flows") as reg:
        written.put(sum(reg.write_episodes(PIPELINE, 0, [episode(i)], [rewards(i)]) for i in order))


def run_all(*targets: tuple[Any, ...]) -> None:
    start = SPAWN.Event()
    procs = [SPAWN.Process(target=t[0], args=(t[1], start, *t[2:])) for t in targets]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * len(procs)


def test_trainer_and_flow_write_the_same_database_at_once(postgres_url: URL) -> None:
    url = postgres_url.render_as_string(hide_password=False)
    with Registry(url, owner="trainer") as trainer:
        trainer.create_run(JOB, recipe="arena", objective="grpo", model="m", config={}, seed=0, kind="job")
        assert trainer.claim_run(JOB) is not None  # the queue's claim, before the worker starts
    with Registry(url, owner="flows") as flows:
        flows.create_run(PIPELINE, recipe="arena", objective="grpo", model="m", config={}, seed=0)
    written = SPAWN.Queue()
    forward, backward = list(range(UNITS)), list(range(UNITS - 1, -1, -1))
    run_all(
        (trainer_worker, url),
        (flow, url),
        (flow_link, url),
        (fanout_unit, url, forward, written),
        (fanout_unit, url, backward, written),
    )
    with Registry(url) as reg:
        job, pipeline = reg.get_run(JOB), reg.get_run(PIPELINE)
        assert job is not None and pipeline is not None
        assert (job.status, job.error) == ("succeeded", None) and job.started_at and job.finished_at
        assert reg.count_episodes(JOB) == STEPS * EPISODES_PER_STEP
        assert [s for s, _ in reg.metric_series(JOB, "reward")] == list(range(1, STEPS + 1))
        assert [c.step for c in reg.checkpoints(JOB)] == [5, 10, 15, 20]
        assert [(s.step, s.to_stage) for s in reg.stage_switches(JOB)] == [(STEPS // 2, "stage2")]
        assert [s.name for s in reg.stages(JOB)] == ["stage1", "stage2"]
        # the pipeline's status and its Prefect link, written by two processes, both kept
        assert (pipeline.status, pipeline.prefect_flow_run_id) == ("succeeded", f"flow-run-{LINKS}")
        assert pipeline.started_at and pipeline.finished_at
        # every fan-out episode once, though each was delivered twice
        assert reg.count_episodes(PIPELINE) == UNITS and written.get() + written.get() == UNITS
        with reg.session() as s:
            evaluations = s.scalar(select(func.count()).where(EvaluationRow.run_id == PIPELINE))
            predictions = s.scalar(select(func.count()).select_from(PredictionRow))
        assert (evaluations, predictions) == (EVALUATIONS, EVALUATIONS * QUESTIONS)
        ledger = {k: v for k, v in reg.latest_metrics(PIPELINE).items() if k.startswith("pipeline/")}
        assert len(ledger) == EVALUATIONS
        assert reg.count_episodes(JOB, step=0) == 0  # nothing of one owner landed on the other's run


# -- the queue's claim ----------------------------------------------------------------------------


def claimer(url: str, start: Event, claimed: Any) -> None:
    start.wait(30)
    with Registry(url, owner="trainer") as reg:
        mine = []
        while (run := reg.claim_next()) is not None:
            mine.append(run.id)
        claimed.put(mine)


def queue_jobs(url: str, n: int) -> list[str]:
    with Registry(url, owner="trainer") as reg:
        ids = [f"job-{i:04d}" for i in range(n)]
        for run_id in ids:
            reg.create_run(run_id, recipe="arena", objective="grpo", model="m", config={}, seed=0, kind="job")
    return ids


def test_claim_next_gives_each_queued_job_to_exactly_one_claimer(postgres_url: URL) -> None:
    url = postgres_url.render_as_string(hide_password=False)
    ids = queue_jobs(url, 40)
    claimed = SPAWN.Queue()
    run_all((claimer, url, claimed), (claimer, url, claimed), (claimer, url, claimed))
    got = [run_id for _ in range(3) for run_id in claimed.get()]
    assert sorted(got) == ids  # all claimed, none twice
    with Registry(url) as reg:
        assert {r.status for r in reg.list_runs(kind="job", limit=100)} == {"running"}


def test_claim_run_after_both_read_queued_has_one_winner(postgres_url: URL) -> None:
    """The interleaving that breaks a read-then-write claim: both read "queued" first."""
    url = postgres_url.render_as_string(hide_password=False)
    queue_jobs(url, 1)
    barrier, results = threading.Barrier(2), []

    def claim() -> None:
        with Registry(url, owner="trainer") as reg:
            run = reg.get_run("job-0000")
            assert run is not None and run.status == "queued"
            barrier.wait(timeout=30)
            results.append(reg.claim_run("job-0000"))

    threads = [threading.Thread(target=claim) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(r is None for r in results) == [False, True]


class LockstepRegistry(Registry):
    """A registry whose ``list_runs`` returns only when the other claimer has listed too: the
    interleaving two trainer processes on one database meet whenever their ticks coincide."""

    def __init__(self, url: str, barrier: threading.Barrier) -> None:
        super().__init__(url, owner="trainer")
        self.barrier = barrier

    def list_runs(self, *args: Any, **kwargs: Any) -> list[RunRow]:
        runs = super().list_runs(*args, **kwargs)
        self.barrier.wait(timeout=30)
        return runs


def test_two_job_queues_launch_a_queued_job_once(postgres_url: URL, tmp_path: Path) -> None:
    from services.trainer.queue import JobQueue
    from services.trainer.settings import TrainerSettings

    url = postgres_url.render_as_string(hide_password=False)
    queue_jobs(url, 1)
    settings = TrainerSettings(
        database_url=url, runs_dir=tmp_path / "runs", python="/bin/true", poll_interval_s=3600
    )
    barrier = threading.Barrier(2)
    queues = [JobQueue(settings, LockstepRegistry(url, barrier)) for _ in range(2)]
    threads = [threading.Thread(target=q.tick) for q in queues]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    launched = [q.current for q in queues if q.current is not None]
    for _, proc in launched:
        if isinstance(proc, subprocess.Popen):
            proc.wait(timeout=30)
    for q in queues:
        q.registry.close()
    assert [run_id for run_id, _ in launched] == ["job-0000"], f"launched {len(launched)} workers"
