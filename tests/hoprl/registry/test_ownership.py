"""One owner per record: the trainer writes its jobs, the flows their pipelines, datasets,
indexes and evaluations; each is refused the other's records, with both named; reads are open."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, insert, select, update
from sqlalchemy.engine import URL

from hoprl.registry import OwnershipError, Registry
from hoprl.registry.models import DatasetRow, EpisodeRow, MetricRow, RunRow
from hoprl.registry.ownership import OWNERS, TABLE_OWNER
from tests.hoprl.registry.test_registry import episode, rewards

JOB, PIPELINE = "job-0001", "pipe-1"
RUN_OF = {"trainer": JOB, "flows": PIPELINE}
OTHER = {"trainer": "flows", "flows": "trainer"}


@pytest.fixture
def owned(registry_url: URL) -> Any:
    """One registry per owner on the same database, with one job and one pipeline run in it."""
    with Registry(registry_url) as setup:
        setup.create_run(JOB, recipe="arena", objective="grpo", model="m", config={}, seed=0, kind="job")
        setup.create_run(PIPELINE, recipe="arena", objective="grpo", model="m", config={}, seed=0)
    regs = {owner: Registry(registry_url, owner=owner) for owner in OWNERS}  # type: ignore[arg-type]
    yield regs
    for reg in regs.values():
        reg.close()


# (table, write): every typed write of a run's records, called on run ``run``
RUN_WRITES: list[tuple[str, Callable[[Registry, str], object]]] = [
    ("runs", lambda reg, run: reg.set_run_status(run, "running")),
    ("runs", lambda reg, run: reg.claim_run(run)),
    ("stages", lambda reg, run: reg.start_stage(run, "stage1", 0)),
    ("stage_switches", lambda reg, run: reg.record_stage_switch(run, 5, "stage1", "stage2", "step 5")),
    ("checkpoints", lambda reg, run: reg.add_checkpoint(run, 5, "/ckpt/5")),
    ("metrics", lambda reg, run: reg.log_metrics(run, 1, {"reward": 0.5})),
    ("episodes", lambda reg, run: reg.write_episodes(run, 1, [episode(0)], [rewards(0)])),
]

WRITE_IDS = [f"{table}{i}" for i, (table, _) in enumerate(RUN_WRITES)]


@pytest.mark.parametrize("owner", OWNERS)
@pytest.mark.parametrize(
    ("table", "write"), RUN_WRITES, ids=[f"{t}{i}" for i, (t, _) in enumerate(RUN_WRITES)]
)
def test_each_owner_writes_its_runs_and_is_refused_the_others(
    owned: dict[str, Registry], owner: str, table: str, write: Callable[[Registry, str], object]
) -> None:
    write(owned[owner], RUN_OF[owner])
    with pytest.raises(OwnershipError, match=f"the {owner} cannot write {table} of run") as refused:
        write(owned[owner], RUN_OF[OTHER[owner]])
    assert (refused.value.table, refused.value.writer, refused.value.owner) == (table, owner, OTHER[owner])
    assert f"belong to the {OTHER[owner]}" in str(refused.value)


def test_only_the_flows_write_datasets_indexes_and_evaluations(owned: dict[str, Registry]) -> None:
    flows, trainer = owned["flows"], owned["trainer"]
    dataset = flows.register_dataset("synthetic", "synthetic", "h1", {"train": 3})
    flows.register_index("wiki", "bge", "c1", 10, dataset.id)
    prediction = {"question_id": "q1", "prediction": "a", "em": 1.0, "f1": 1.0}
    evaluation = flows.add_evaluation(PIPELINE, "synthetic", "test", {"em": 1.0}, [prediction])
    refused = [
        ("datasets", lambda: trainer.register_dataset("synthetic", "synthetic", "h2", {})),
        ("indexes", lambda: trainer.register_index("wiki", "bge", "c2", 10)),
        ("evaluations", lambda: trainer.add_evaluation(JOB, "synthetic", "test", {}, [prediction])),
    ]
    for table, write in refused:
        with pytest.raises(OwnershipError, match=f"the trainer cannot write {table}: .* belong to the flows"):
            write()
    # evaluations hang under the flows' own runs: a job is evaluated through its pipeline's checkpoint
    with pytest.raises(OwnershipError, match="the flows cannot write evaluations of run 'job-0001'"):
        flows.add_evaluation(JOB, "synthetic", "test", {}, [prediction])
    assert set(TABLE_OWNER.values()) == {"flows"}
    # reads are open to every owner
    assert trainer.get_evaluation(evaluation) is not None and len(trainer.predictions(evaluation)) == 1


def test_create_run_makes_only_the_owners_kind_and_never_adopts_the_others_run(
    owned: dict[str, Registry],
) -> None:
    flows, trainer = owned["flows"], owned["trainer"]
    new = {"recipe": "arena", "objective": "grpo", "model": "m", "config": {}, "seed": 0}
    assert trainer.create_run("job-0002", **new, kind="job").kind == "job"
    assert flows.create_run("pipe-2", **new).kind == "pipeline"
    with pytest.raises(OwnershipError, match="the trainer cannot write runs of kind 'pipeline'"):
        trainer.create_run("job-0003", **new)  # the default kind is a pipeline's
    with pytest.raises(OwnershipError, match="the flows cannot write runs of kind 'job'"):
        flows.create_run("pipe-3", **new, kind="job")
    # ``pipeline(run_id="job-0001")`` once returned the job's row and then ran it as a pipeline
    with pytest.raises(OwnershipError, match="the flows cannot write runs of run 'job-0001'"):
        flows.create_run(JOB, **new)
    assert flows.get_run(JOB).kind == "job" and flows.get_run(JOB).status == "queued"  # type: ignore[union-attr]


def test_reads_are_open_to_every_owner(owned: dict[str, Registry]) -> None:
    flows, trainer = owned["flows"], owned["trainer"]
    trainer.log_metrics(JOB, 3, {"reward": 0.25})
    flows.log_metrics(PIPELINE, 3, {"dev/return": 0.5})
    assert flows.metric_series(JOB, "reward") == [(3, 0.25)]  # what the flows' copy_curves reads
    assert trainer.latest_metrics(PIPELINE) == {"dev/return": 0.5}
    assert {r.id for r in trainer.list_runs()} == {r.id for r in flows.list_runs()} == {JOB, PIPELINE}


def test_unowned_registry_writes_everything(registry: Registry) -> None:
    """owner=None: tests, migrations and scripts that do everything (never a service or a flow)."""
    registry.create_run(JOB, recipe="arena", objective="grpo", model="m", config={}, seed=0, kind="job")
    registry.create_run(PIPELINE, recipe="arena", objective="grpo", model="m", config={}, seed=0)
    for _, write in RUN_WRITES:
        write(registry, JOB)
        write(registry, PIPELINE)
    registry.add_evaluation(JOB, "d", "test", {}, [])
    assert registry.owner is None


def test_unknown_owner_names_the_valid_ones(registry_url: URL) -> None:
    with pytest.raises(ValueError, match="unknown registry owner 'bench'; valid: trainer, flows"):
        Registry(registry_url, owner="bench")  # type: ignore[arg-type]


def test_session_writes_are_checked_too(owned: dict[str, Registry]) -> None:
    """The raw session: the trainer's start_attempt deletes its job's later rows, the flows'
    link_flow_run sets their run's Prefect id; neither reaches the other's records."""
    flows, trainer = owned["flows"], owned["trainer"]
    for owner, reg in owned.items():
        reg.log_metrics(RUN_OF[owner], 7, {"loss": 1.0})
        reg.write_episodes(RUN_OF[owner], 7, [episode(0)], [rewards(0)])
    with trainer.session() as s:  # start_attempt, hoprl/training/callbacks.py
        for row in (EpisodeRow, MetricRow):
            s.execute(delete(row).where(row.run_id == JOB, row.step > 5))
    assert trainer.count_episodes(JOB) == 0 and trainer.count_episodes(PIPELINE) == 1
    with flows.session() as s:  # link_flow_run, flows/runs.py
        s.get_one(RunRow, PIPELINE).prefect_flow_run_id = "flow-run-1"
    assert flows.get_run(PIPELINE).prefect_flow_run_id == "flow-run-1"  # type: ignore[union-attr]

    refused = [
        (trainer, "episodes", delete(EpisodeRow).where(EpisodeRow.run_id == PIPELINE)),
        (trainer, "metrics", update(MetricRow).values(value=0.0)),  # every run's metrics: one is not its own
        (flows, "runs", update(RunRow).where(RunRow.id == JOB).values(status="cancelled")),
        (trainer, "datasets", delete(DatasetRow)),
    ]
    for reg, table, statement in refused:
        with pytest.raises(OwnershipError, match=f"the {reg.owner} cannot write {table}"), reg.session() as s:
            s.execute(statement)
    flows_job = pytest.raises(OwnershipError, match="the flows cannot write runs of run 'job-0001'")
    with flows_job, flows.session() as s:
        s.get_one(RunRow, JOB).prefect_flow_run_id = "flow-run-2"
    trainer_pipeline = pytest.raises(OwnershipError, match="the trainer cannot write metrics of run 'pipe-1'")
    with trainer_pipeline, trainer.session() as s:
        s.delete(s.scalars(select(MetricRow).filter_by(run_id=PIPELINE)).one())
    with (
        pytest.raises(ValueError, match="inserts no metrics rows; use the Registry's methods"),
        trainer.session() as s,
    ):
        s.execute(insert(MetricRow).values(run_id=JOB, step=1, name="x", value=1.0))
    assert flows.metric_series(PIPELINE, "loss") == [(7, 1.0)]
    assert flows.get_run(JOB).status == "queued"  # type: ignore[union-attr]


def test_the_trainers_start_attempt_runs_as_the_trainer(tmp_path: Path) -> None:
    """hoprl/training/callbacks.py's raw deletes pass the check unchanged under owner="trainer"."""
    from hoprl.training.callbacks import start_attempt

    with Registry(f"sqlite:///{tmp_path / 'r.db'}", owner="trainer") as trainer:
        trainer.create_run(JOB, recipe="arena", objective="grpo", model="m", config={}, seed=0, kind="job")
        trainer.write_episodes(JOB, 1, [episode(0)], [rewards(0)])
        trainer.record_stage_switch(JOB, 1, None, "stage1", "start")
        assert start_attempt(trainer, JOB, tmp_path / JOB) == 1
        assert trainer.count_episodes(JOB) == 0 and trainer.stage_switches(JOB) == []
