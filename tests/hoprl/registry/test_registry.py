"""Registry behaviour on SQLite and PostgreSQL: idempotent writes, upserts, stages, comparisons."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy.engine import URL
from sqlalchemy.exc import IntegrityError

from hoprl.domain import Episode, RetrievedDoc, Step
from hoprl.registry import Prediction, Registry, total_reward

RUN = "run-1"


def make_run(reg: Registry, run_id: str = RUN, recipe: str = "when-to-search") -> None:
    reg.create_run(run_id, recipe=recipe, objective="grpo", model="smollm2-135m", config={"lr": 1e-6}, seed=7)


def episode(i: int, sample: int = 0) -> Episode:
    doc = RetrievedDoc(id=f"d{i}", title=f"Title {i}", text="text", score=0.5)
    return Episode(
        recipe="when-to-search",
        question_id=f"q{i:02d}",
        question=f"question {i}?",
        answers=[f"answer {i}"],
        steps=[
            Step(t=1, action="search", text="<search>x</search>", queries=["x"], docs=[[doc]]),
            Step(t=2, action="answer", text=f"<answer>answer {i}</answer>", answer=f"answer {i}"),
        ],
        final_answer=f"answer {i}",
        sample=sample,
    )


def rewards(i: int) -> dict[str, float]:
    return {"r_f": 1.0, "r_s": 0.0, "r_a": float(i % 2)}


def test_total_reward_prefers_total_and_skips_non_scalars() -> None:
    assert total_reward({"a": 1.0, "b": 0.5, "per_step": [1.0, 2.0], "na": None}) == 1.5
    assert total_reward({"a": 1.0, "total": 0.25}) == 0.25


def test_create_run_is_idempotent_and_status_is_stamped(registry: Registry) -> None:
    first = registry.create_run("r", recipe="arena", objective="grpo", model="m", config={"k": [1]}, seed=1)
    again = registry.create_run("r", recipe="other", objective="dpo", model="m2", config={}, seed=2)
    assert (again.recipe, again.config, again.seed, again.created_at) == (
        "arena",
        {"k": [1]},
        1,
        first.created_at,
    )
    assert first.status == "queued" and first.code_version
    running = registry.set_run_status("r", "running")
    assert running.started_at is not None and running.finished_at is None
    failed = registry.set_run_status("r", "failed", error="OOM at step 3")
    assert failed.finished_at is not None and failed.error == "OOM at step 3"
    assert registry.get_run("r") is not None and registry.get_run("nope") is None
    with pytest.raises(ValueError, match="valid: queued, running"):
        registry.set_run_status("r", "done")  # type: ignore[arg-type]
    with pytest.raises(KeyError, match="create_run"):
        registry.set_run_status("nope", "running")


def test_transition_run_moves_only_from_the_expected_statuses(registry: Registry) -> None:
    """A compare-and-set: a cancel arriving after the worker recorded "succeeded" changes nothing
    (``set_run_status`` would overwrite it), and a queued run is claimed once."""
    make_run(registry)
    claimed = registry.claim_run(RUN)
    assert claimed is not None and claimed.status == "running" and claimed.started_at is not None
    assert registry.claim_run(RUN) is None and registry.claim_run("missing") is None
    registry.set_run_status(RUN, "succeeded")
    assert registry.transition_run(RUN, "cancelled", ("queued", "running")) is None
    run = registry.get_run(RUN)
    assert run is not None and run.status == "succeeded"
    failed = registry.transition_run(RUN, "failed", ("succeeded",), error="late check failed")
    assert failed is not None and (failed.status, failed.error) == ("failed", "late check failed")
    assert failed.started_at == claimed.started_at and failed.finished_at is not None
    make_run(registry, "run-2")
    registry.create_run("job-1", recipe="arena", objective="grpo", model="m", config={}, seed=0, kind="job")
    assert registry.claim_next("pipeline").id == "run-2"  # type: ignore[union-attr]
    assert registry.claim_next() is not None and registry.claim_next() is None  # default: jobs
    with pytest.raises(ValueError, match="unknown run status 'done'"):
        registry.transition_run(RUN, "done", ("failed",))  # type: ignore[arg-type]


def test_list_runs_filters(registry: Registry) -> None:
    make_run(registry, "a", recipe="arena")
    make_run(registry, "b", recipe="r2ag")
    registry.set_run_status("b", "running")
    assert {r.id for r in registry.list_runs()} == {"a", "b"}
    assert [r.id for r in registry.list_runs(status="running")] == ["b"]
    assert [r.id for r in registry.list_runs(recipe="arena")] == ["a"]


def test_runs_have_a_kind(registry: Registry) -> None:
    """Trainer jobs and pipeline runs share the table; the trainer's queue lists its own alone."""
    make_run(registry, "pipe")
    job = registry.create_run("job-1", "arena", "grpo", "m", config={}, seed=0, kind="job")
    assert (registry.get_run("pipe").kind, job.kind) == ("pipeline", "job")  # type: ignore[union-attr]
    assert [r.id for r in registry.list_runs(kind="job")] == ["job-1"]
    assert [r.id for r in registry.list_runs(kind="pipeline", status="queued")] == ["pipe"]
    with pytest.raises(ValueError, match="valid: job, pipeline"):
        registry.create_run("x", "arena", "grpo", "m", config={}, seed=0, kind="flow")  # type: ignore[arg-type]


def test_datasets_and_indexes_are_idempotent(registry: Registry) -> None:
    ds = registry.register_dataset("hotpotqa", "../shared/data/hotpotqa_dev.jsonl", "abc", {"dev": 500})
    assert registry.register_dataset("hotpotqa", "elsewhere", "abc", {"dev": 1}).id == ds.id
    assert registry.register_dataset("hotpotqa", "x", "def", {"dev": 2}).id != ds.id
    ix = registry.register_index("hotpot-1a2b", "all-MiniLM-L6-v2", "h1", points=9000, dataset_id=ds.id)
    again = registry.register_index("hotpot-1a2b", "all-MiniLM-L6-v2", "h1", points=1)
    assert (again.id, again.points, again.dataset_id) == (ix.id, 9000, ds.id)


def test_episode_writes_are_idempotent_and_round_trip(registry: Registry) -> None:
    make_run(registry)
    eps = [episode(i) for i in range(10)]
    assert registry.write_episodes(RUN, 3, eps, [rewards(i) for i in range(10)]) == 10
    assert registry.write_episodes(RUN, 3, eps, [rewards(i) for i in range(10)]) == 0
    assert registry.count_episodes(RUN) == 10
    # a new sample of the same question at the same step is a new episode; so is a new step
    assert registry.write_episodes(RUN, 3, [episode(0, sample=1)], [rewards(0)]) == 1
    assert registry.write_episodes(RUN, 4, eps[:2], [rewards(0), rewards(1)]) == 2
    assert registry.count_episodes(RUN) == 13 and registry.count_episodes(RUN, step=4) == 2
    row = registry.episodes(RUN, step=3)[0]
    assert Episode.model_validate(row.trajectory) == eps[0]
    assert row.rewards == rewards(0) and row.total_reward == 1.0
    assert registry.write_episodes(RUN, 5, [], []) == 0
    with pytest.raises(ValueError, match="one per episode"):
        registry.write_episodes(RUN, 5, eps, [])


def test_episodes_need_an_existing_run(registry: Registry) -> None:
    with pytest.raises(IntegrityError):
        registry.write_episodes("missing", 1, [episode(0)], [rewards(0)])


def test_concurrent_episode_writers_never_duplicate_or_fail(registry_url: URL) -> None:
    """Two writers (two engines, as two resumed workers would be) race on overlapping keys."""
    steps, barrier = range(5), threading.Barrier(2)
    writers = [Registry(registry_url), Registry(registry_url)]
    make_run(writers[0])
    new_counts: list[int] = []
    errors: list[BaseException] = []

    def write(reg: Registry, ids: list[int]) -> None:
        try:
            for step in steps:
                barrier.wait(timeout=30)
                eps = [episode(i) for i in ids]
                new_counts.append(reg.write_episodes(RUN, step, eps, [rewards(i) for i in ids]))
        except BaseException as exc:
            errors.append(exc)

    # 100 shared keys written in opposite orders: without one lock order, PostgreSQL deadlocks
    # here (measured: DeadlockDetected); batches this large make the two transactions overlap.
    threads = [
        threading.Thread(target=write, args=(writers[0], list(range(0, 200)))),
        threading.Thread(target=write, args=(writers[1], list(range(299, 99, -1)))),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for reg in writers:
        reg.close()
    assert errors == []
    with Registry(registry_url) as reg:
        assert reg.count_episodes(RUN) == 300 * len(steps)
    assert sum(new_counts) == 300 * len(steps)


def test_metrics_upsert_and_series(registry: Registry) -> None:
    make_run(registry)
    registry.log_metrics(RUN, 1, {"reward": 0.1, "loss": 2.0})
    registry.log_metrics(RUN, 2, {"reward": 0.3})
    registry.log_metrics(RUN, 1, {"reward": 0.2})  # a resumed job re-logs step 1
    registry.log_metrics(RUN, 3, {})
    assert registry.metric_series(RUN, "reward") == [(1, 0.2), (2, 0.3)]
    assert registry.metric_series(RUN, "loss") == [(1, 2.0)]
    assert registry.latest_metrics(RUN) == {"reward": 0.3, "loss": 2.0}


def test_stage_switches_and_current_stage(registry: Registry) -> None:
    make_run(registry)
    assert registry.current_stage(RUN) is None
    registry.start_stage(RUN, "discovery", 0)
    registry.start_stage(RUN, "discovery", 0)  # idempotent
    assert registry.current_stage(RUN) == "discovery"
    for _ in range(2):  # a resumed job records the same switch again
        switch = registry.record_stage_switch(
            RUN,
            50,
            "discovery",
            "refinement",
            reason="dev EMA plateau",
            metric_name="dev_ema",
            metric_value=0.41,
        )
    assert (switch.from_stage, switch.to_stage, switch.metric_value) == ("discovery", "refinement", 0.41)
    assert registry.current_stage(RUN) == "refinement"
    assert [(s.name, s.started_at_step, s.ended_at_step) for s in registry.stages(RUN)] == [
        ("discovery", 0, 50),
        ("refinement", 50, None),
    ]
    assert len(registry.stage_switches(RUN)) == 1
    registry.start_stage(RUN, "refinement", 60)  # a job resumed at step 60 announces its stage
    assert [s.started_at_step for s in registry.stages(RUN)] == [0, 50]
    with pytest.raises(ValueError, match="same step"):
        registry.start_stage(RUN, "stage-3", 50)


def test_checkpoints_are_idempotent_and_latest_wins(registry: Registry) -> None:
    make_run(registry)
    assert registry.latest_checkpoint(RUN) is None
    first = registry.add_checkpoint(RUN, 10, "/ckpt/10", {"dev_em": 0.1})
    registry.add_checkpoint(RUN, 30, "/ckpt/30")
    registry.add_checkpoint(RUN, 20, "/ckpt/20")
    again = registry.add_checkpoint(RUN, 10, "/elsewhere/10", {})
    assert (again.id, again.path, again.metrics) == (first.id, "/ckpt/10", {"dev_em": 0.1})
    latest = registry.latest_checkpoint(RUN)
    assert latest is not None and (latest.step, latest.path) == (30, "/ckpt/30")
    assert [c.step for c in registry.checkpoints(RUN)] == [10, 20, 30]


def _predictions(ems: list[float], judge: bool = True) -> list[Prediction]:
    return [
        Prediction(
            question_id=f"q{i:03d}",
            prediction="x",
            em=em,
            f1=em,
            judge_verdict=bool(em) if judge else None,
            retrieval_count=2,
            latency=0.1,
        )
        for i, em in enumerate(ems)
    ]


def test_evaluations_compare_pairs_by_question_id(registry: Registry) -> None:
    make_run(registry)
    ckpt = registry.add_checkpoint(RUN, 100, "/ckpt/100")
    strong = [1.0] * 80 + [0.0] * 20
    weak = [0.0] * 70 + [1.0] * 10 + [0.0] * 20
    a = registry.add_evaluation(RUN, "hotpotqa", "dev", {"em": 0.8}, _predictions(strong), checkpoint=ckpt.id)
    # stored in reverse order: pairing must follow question ids, not insertion order
    b = registry.add_evaluation(RUN, "hotpotqa", "dev", {"em": 0.1}, _predictions(weak)[::-1])
    evaluation = registry.get_evaluation(a)
    assert evaluation is not None and evaluation.checkpoint_id == ckpt.id
    assert len(registry.predictions(a)) == 100 and registry.predictions(b)[0].question_id == "q000"
    result = registry.compare(a, b, n_resamples=2000)
    assert (result.n, result.diff) == (100, pytest.approx(0.7))
    assert result.p_value < 0.01
    assert registry.compare(a, a, n_resamples=200).p_value == 1.0
    assert registry.compare(a, b, metric="judge", n_resamples=200).diff == pytest.approx(0.7)


def test_compare_explains_bad_requests(registry: Registry) -> None:
    make_run(registry)
    a = registry.add_evaluation(RUN, "d", "dev", {}, _predictions([1.0, 0.0], judge=False))
    other = [p.model_copy(update={"question_id": "other"}) for p in _predictions([1.0])]
    b = registry.add_evaluation(RUN, "d", "dev", {}, [p.model_dump() for p in other])
    with pytest.raises(ValueError, match="valid: em, f1"):
        registry.compare(a, a, metric="bleu")
    with pytest.raises(ValueError, match="run the judge"):
        registry.compare(a, a, metric="judge")
    with pytest.raises(ValueError, match="share no question ids"):
        registry.compare(a, b)
