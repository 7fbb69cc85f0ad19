"""The Prefect flows against live services, under ``prefect_test_harness`` (a throwaway Prefect API).

Services run in this process over real HTTP on 127.0.0.1 (see ``conftest.py``): the retriever
(embedded Qdrant), a rules judge, a policy whose engine is a scripted OpenAI-compatible model (it
answers the synthetic questions from scripts) and the real trainer service, whose jobs train a
tiny random Llama (2 layers) in worker subprocesses. The registry is a SQLite file of the module,
the run folders a temp folder. The fan-out units run eagerly.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
from prefect.testing.utilities import prefect_test_harness

from flows import fanout
from flows.data import build_index, prepare_data
from flows.evaluate import evaluate
from flows.pipeline import pipeline
from flows.progress import watch_job
from flows.runs import registry, run_dir
from flows.stack import ServiceUrls
from flows.training import HEADROOM_STEP, TrainerJobFailed, boundaries, headroom, run_job, train
from hoprl.clients.retriever import RetrieverClient
from hoprl.clients.trainer import TrainerClient
from hoprl.data.jsonl import load_questions
from hoprl.ports import free_port
from hoprl.schemas.trainer import Job
from services.local import LocalServer
from services.trainer.app import create_app as create_trainer
from services.trainer.settings import TrainerSettings

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 6  # questions per split (the scripted policy knows the first 6 of each, see conftest)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A Prefect test API, a registry file and a runs folder for the module; fan-out eager."""
    folder = tmp_path_factory.mktemp("flows")
    with pytest.MonkeyPatch.context() as mp, prefect_test_harness(server_startup_timeout=120):
        mp.setenv("HOPRL_DATABASE_URL", f"sqlite:///{folder / 'registry.db'}")
        mp.setenv("HOPRL_RUNS_DIR", str(folder / "runs"))
        fanout.use_eager(True)
        yield folder


@pytest.fixture(scope="module")
def urls(
    env: Path, live_services: Callable[[Path], AbstractContextManager[ServiceUrls]]
) -> Iterator[ServiceUrls]:
    with live_services(env) as started, pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOPRL_POLICY_ADMIN_TOKEN", "flows-test")
        yield started


@pytest.fixture(scope="module")
def indexed(urls: ServiceUrls) -> dict[str, Any]:
    """Run ``prep`` with the synthetic world's first questions, prepared and indexed."""
    data = prepare_data("synthetic", "prep", limit=LIMIT)
    return {"data": data, "index": build_index("prep", data, urls.retriever)}


def test_prepare_data_and_build_index_register_and_ingest(indexed: dict[str, Any], urls: ServiceUrls) -> None:
    data, index = indexed["data"], indexed["index"]
    assert data["counts"] == {"train": LIMIT, "dev": LIMIT, "test": LIMIT}
    assert all(Path(p).is_file() for p in data["paths"].values())
    with registry().session() as s:
        from hoprl.registry.models import DatasetRow, IndexRow

        dataset = s.get_one(DatasetRow, data["dataset_id"])
        row = s.get_one(IndexRow, index["index_id"])
    assert (dataset.name, dataset.source, dataset.counts) == ("synthetic", "synthetic", data["counts"])
    assert row.collection == index["collection"] and row.dataset_id == dataset.id and row.points > LIMIT
    with RetrieverClient(urls.retriever) as client:
        points = {c.name: c.points for c in client.collections()}
    assert points[index["collection"]] == index["points"]
    # Idempotent: the same data again is the same dataset row and index row, nothing re-ingested.
    again = build_index("prep", prepare_data("synthetic", "prep", limit=LIMIT), urls.retriever)
    assert again["index_id"] == index["index_id"]


def test_prepare_data_builds_a_papers_training_set_and_registers_its_sampling(env: Path) -> None:
    """EVO-RAG's training set (App. A.1) from ../shared/data: the 110 HotpotQA training questions
    the folder holds (of the paper's 1,000), its dev split halved into dev and test; the registry's
    dataset row keeps the seed and each part's counts."""
    shared = ROOT.parent / "shared" / "data"
    if not shared.is_dir():
        pytest.skip("../shared/data holds the benchmark samples")
    data = prepare_data(f"paper:evo-rag:{shared}", "paper-prep")
    assert data["counts"] == {"train": 110, "dev": 264, "test": 264} and data["name"] == "paper-evo-rag"
    with registry().session() as s:
        from hoprl.registry.models import DatasetRow

        source = json.loads(s.get_one(DatasetRow, data["dataset_id"]).source)
    assert source["spec"] == f"paper:evo-rag:{shared}" and source["seed"] == 0
    assert {"part": "hotpotqa:train:1000", "role": "train", "available": 110, "taken": 110} in source["parts"]
    manifest = json.loads((Path(data["paths"]["train"]).parent / "manifest.json").read_text())
    assert manifest["sampling"]["missing"] == ["bamboogle:test"]


def test_evaluate_stores_predictions_and_publishes_the_report(
    indexed: dict[str, Any], urls: ServiceUrls
) -> None:
    reg = registry()
    reg.create_run("eval-run", "when-to-search", "grpo", "scripted", {}, 0)
    test_path, collection = indexed["data"]["paths"]["test"], indexed["index"]["collection"]
    base = evaluate(
        "eval-run",
        "baseline",
        test_path,
        collection,
        "naive-rag",
        urls.policy,
        urls.retriever,
        urls.judge,
        dataset="synthetic",
    )
    final = evaluate(
        "eval-run",
        "final",
        test_path,
        collection,
        "when-to-search",
        urls.policy,
        urls.retriever,
        urls.judge,
        dataset="synthetic",
    )
    metrics = final["metrics"]
    assert metrics["questions"] == LIMIT and metrics["errors"] == 0
    assert metrics["em"] > base["metrics"]["em"]  # the scripted agent answers half right; naive-rag none
    assert metrics["retrieval_count"] == 1.0 and 0 <= metrics["recall@5"] <= 1
    assert len(reg.predictions(final["evaluation_id"])) == LIMIT
    folder = Path(final["report"]).parent
    report = Path(final["report"]).read_text()
    assert "| final | when-to-search |" in report
    assert re.search(r"\| final \| [+-]\d\.\d{3} \| \[-?\d\.\d\d, -?\d\.\d\d\] \| [\d.e-]+ \|", report)
    assert (folder / "accuracy_vs_retrievals.png").stat().st_size > 1000

    async def all_keys() -> set[str]:
        async with get_client() as client:
            return {a.key for a in await client.read_artifacts() if a.key}

    # No pipeline flow run is linked to eval-run: the artifacts belong to the evaluate flow runs.
    assert {"eval-run-report", "eval-run-accuracy"} <= asyncio.run(all_keys())


def test_evaluate_repeatable_answers_through_the_batch_route(
    indexed: dict[str, Any], urls: ServiceUrls
) -> None:
    """``repeatable=True`` answers through ``/v1/answer/batch``: the scripted agent (deterministic)
    gives the same predictions as through ``/v1/answer``, and the evaluation says how it ran."""
    registry().create_run("eval-lockstep", "when-to-search", "grpo", "scripted", {}, 0)
    test_path, collection = indexed["data"]["paths"]["test"], indexed["index"]["collection"]
    args = ("eval-lockstep", test_path, collection, "when-to-search", urls.policy, urls.retriever, urls.judge)
    one = evaluate(args[0], "one-by-one", *args[1:], dataset="synthetic")
    batch = evaluate(args[0], "lockstep", *args[1:], dataset="synthetic", repeatable=True)
    assert batch["metrics"]["repeatable"] and not one["metrics"]["repeatable"]
    assert batch["metrics"]["questions"] == LIMIT and batch["metrics"]["errors"] == 0
    rows = {
        e: json.loads((run_dir("eval-lockstep") / "evals" / f"{e}.json").read_text())
        for e in ("one-by-one", "lockstep")
    }
    keys = ("id", "prediction", "em", "retrievals", "queries", "outcome")
    assert [{k: r[k] for k in keys} for r in rows["lockstep"]] == [
        {k: r[k] for k in keys} for r in rows["one-by-one"]
    ]


def test_train_runs_segments_and_switches_stage(
    indexed: dict[str, Any], urls: ServiceUrls, tiny_model: str
) -> None:
    reg = registry()
    reg.create_run("train-run", "when-to-search", "grpo", tiny_model, {}, 0)
    reg.add_checkpoint("train-run", 0, tiny_model, {"objective": "base"})
    request = {
        "recipe": "when-to-search",
        "objective": "grpo",
        "dataset": "synthetic",
        "seed": 0,
        "collection": indexed["index"]["collection"],
        "hyperparameters": {
            "questions_per_step": 2,
            "num_generations": 2,
            "max_steps": 2,
            "max_new_tokens_per_step": 8,
            "token_budget": 64,
            "max_train_questions": 4,
            "recipe_config": {"switch_step": 1},
        },
    }
    dev = {"path": indexed["data"]["paths"]["dev"], "limit": 2}
    final = train("train-run", request, steps=2, segments=2, dev=dev, urls=urls)
    assert boundaries(2, 2) == [1, 2] and final["step"] == 2
    assert [c.step for c in reg.checkpoints("train-run")] == [0, 1, 2]
    (switch,) = reg.stage_switches("train-run")
    assert (switch.step, switch.from_stage, switch.to_stage) == (1, "stage1", "stage2")
    assert [s.name for s in reg.stages("train-run")] == ["stage1", "stage2"]
    assert [step for step, _ in reg.metric_series("train-run", "dev/em")] == [1, 2]
    assert reg.metric_series("train-run", "train/reward")  # the jobs' curves, copied at global steps
    assert reg.count_episodes("train-run") == 2 * 2  # two dev questions at each of two checks
    with TrainerClient(urls.trainer) as client:
        jobs = client.list()
    # The second segment trained in stage 2 from the first segment's checkpoint.
    assert jobs[0].model == reg.checkpoints("train-run")[1].path and jobs[0].stage == "stage2"


def test_headroom_samples_the_warm_start_on_dev(
    indexed: dict[str, Any], urls: ServiceUrls, tiny_model: str
) -> None:
    """k = 3 sampled episodes of each of 4 dev questions. The scripted policy answers every sample
    of a question alike, right on the even questions (conftest.scripts): pass@1 = pass@3 = the
    share of the answerable ones that are even, and every group is flat (no reward spread)."""
    reg = registry()
    reg.create_run("headroom-run", "when-to-search", "dapo", tiny_model, {}, 0)
    reg.add_checkpoint("headroom-run", 0, tiny_model, {"objective": "base"})
    request = {"recipe": "when-to-search", "objective": "dapo", "dataset": "synthetic", "seed": 0,
               "collection": indexed["index"]["collection"],
               "hyperparameters": {"num_generations": 3, "max_steps": 4, "max_new_tokens_per_step": 64,
                                   "token_budget": 512, "temperature": 0.9}}  # fmt: skip
    dev = {"path": indexed["data"]["paths"]["dev"], "limit": 4}
    got = headroom("headroom-run", request, dev, urls)
    answerable = [i for i, q in enumerate(load_questions(dev["path"], 4)) if q.answers]
    right = sum(1 for i in answerable if i % 2 == 0) / len(answerable)
    assert got["headroom/k"] == 3 and got["headroom/questions"] == len(answerable)
    assert got["headroom/pass@1"] == pytest.approx(right) and got["headroom/pass@k"] == pytest.approx(right)
    assert got["headroom/frac_reward_zero_std"] == 1.0 and got["headroom/temperature"] == 0.9
    assert reg.count_episodes("headroom-run", HEADROOM_STEP) == 4 * 3
    assert reg.latest_metrics("headroom-run")["headroom/pass@k"] == got["headroom/pass@k"]  # at step 0


def artifact_keys(flow_run_id: str) -> list[str]:
    """The keys of the artifacts that belong to a flow run, as its Artifacts tab lists them."""

    async def read() -> list[str]:
        async with get_client() as client:
            found = await client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[UUID(flow_run_id)]))
            )
        return sorted(a.key or "" for a in found)

    return asyncio.run(read())


def test_pipeline_killed_mid_training_resumes_with_the_same_run_id(
    env: Path, urls: ServiceUrls, tiny_model: str
) -> None:
    """SIGKILL the flow's process while a training segment runs, then run ``pipeline`` again; once
    the run has succeeded, a third ``pipeline`` with the same run id skips every stage.

    One run covers both resumptions (after a kill, after success): every whole pipeline costs an
    SFT job and RL jobs, each a fresh trainer process."""
    from prefect.settings import PREFECT_API_URL

    from flows.training import SegmentJobs

    run_id, hp = "killed", {"questions_per_step": 2, "num_generations": 2, "max_steps": 2,
                            "max_new_tokens_per_step": 8, "token_budget": 64}  # fmt: skip
    args: dict[str, Any] = {"model": tiny_model, "steps": 4, "segments": 2, "sft_steps": 1, "limit": LIMIT,
            "eval_limit": 2, "dev_limit": 2, "hyperparameters": hp, "run_id": run_id}  # fmt: skip
    service_env = {"HOPRL_RETRIEVER_URL": urls.retriever, "HOPRL_POLICY_URL": urls.policy,
                   "HOPRL_JUDGE_URL": urls.judge, "HOPRL_TRAINER_URL": urls.trainer}  # fmt: skip
    with TrainerClient(urls.trainer) as client:
        jobs_before = {j.id for j in client.list()}
        flow_log = (env / "killed-flow.log").open("w")
        flow = subprocess.Popen(
            [sys.executable, "-c", "import json, sys\nfrom flows.pipeline import pipeline\n"
             "pipeline(**json.loads(sys.argv[1]))", json.dumps(args)],
            cwd=ROOT, stdout=flow_log, stderr=subprocess.STDOUT,
            env={**os.environ, **service_env, "HOPRL_CELERY_EAGER": "1",
                 "PREFECT_API_URL": str(PREFECT_API_URL.value())},
        )  # fmt: skip
        try:  # kill it once the first RL segment's trainer job is running
            deadline, segment = time.monotonic() + 600, None
            while segment is None or client.get(segment).status != "running":
                assert flow.poll() is None and time.monotonic() < deadline, "never saw a training segment"
                segment = SegmentJobs(run_id).get(2)
                time.sleep(0.05)
        finally:
            flow.kill()
            flow.wait()
            flow_log.close()
        run = registry().get_run(run_id)
        assert run is not None and run.status == "running", (  # as the kill left it
            f"the flow ended {run.status if run else None} before the kill: {run.error if run else None}\n"
            + (env / "killed-flow.log").read_text()[-4000:]
        )
        reg = registry()
        with pytest.MonkeyPatch.context() as mp:
            for name, value in service_env.items():
                mp.setenv(name, value)
            result = pipeline(**args)
            counts = (len(reg.checkpoints(run_id)), reg.count_episodes(run_id), len(client.list()))
            again = pipeline(**args)  # every stage done: all skipped, nothing submitted or stored
        jobs = [j for j in client.list() if j.id not in jobs_before]
        counts_again = (len(reg.checkpoints(run_id)), reg.count_episodes(run_id), len(client.list()))
    assert reg.get_run(run_id).status == "succeeded"  # type: ignore[union-attr]
    # One trainer job per segment (SFT, steps 1-2, steps 3-4): the killed segment's job was waited
    # for again, not submitted twice, and no checkpoint is missing or repeated.
    assert len(jobs) == 3 and SegmentJobs(run_id).get(2) == segment
    assert [c.step for c in reg.checkpoints(run_id)] == [0, 2, 4]
    assert all(Path(c.path, "model.safetensors").is_file() for c in reg.checkpoints(run_id))
    assert result["checkpoint"] == reg.checkpoints(run_id)[-1].path
    # Every training step's episodes exactly once (questions x samples), every dev check's too.
    for job in jobs:
        if job.objective != "sft":
            assert [reg.count_episodes(job.id, s) for s in (1, 2)] == [2 * 2, 2 * 2]
    # dev checks between segments only: the last checkpoint goes to the final evaluation at once
    assert [reg.count_episodes(run_id, s) for s in (2, 4)] == [2, 0]
    assert [step for step, _ in reg.metric_series(run_id, "dev/em")] == [2]
    # The warm start's loss per SFT step, its headroom before RL (2 dev questions x 2 samples) and
    # every RL step's signals, in the run and its report
    assert [step for step, _ in reg.metric_series(run_id, "sft/loss")] == [1]
    assert reg.count_episodes(run_id, -1) == 2 * 2 and reg.latest_metrics(run_id)["headroom/k"] == 2
    assert [step for step, _ in reg.metric_series(run_id, "train/frac_reward_zero_std")] == [1, 2, 3, 4]
    assert "## Training" in Path(result["report"]).read_text()
    # The run again: the same results, and no checkpoint, episode or trainer job added.
    assert result["before"] == again["before"] and result["after"] == again["after"]
    assert counts == counts_again
    run = reg.get_run(run_id)
    assert run is not None and run.prefect_flow_run_id == again["prefect_flow_run_id"]
    assert Path(result["report"]).is_file() and any(p.endswith("training.png") for p in result["plots"])
    # The report and the plots are artifacts of each pipeline flow run itself (its Artifacts tab),
    # one of each: published at each evaluation and at the end, updated in place; the run whose
    # stages were all skipped publishes them at its end.
    assert result["prefect_flow_run_id"] != again["prefect_flow_run_id"]
    keys = [f"{run_id}-accuracy", f"{run_id}-report", f"{run_id}-training"]
    assert artifact_keys(result["prefect_flow_run_id"]) == artifact_keys(again["prefect_flow_run_id"]) == keys


def dying_trainer(folder: Path, tiny_model: str, worker: str) -> TrainerSettings:
    """A real trainer service whose worker "python" is the shell script ``worker``."""
    python = folder / "worker-python"
    python.write_text(f"#!/bin/sh\n{worker}\n")
    python.chmod(0o755)
    return TrainerSettings(database_url=f"sqlite:///{folder / 'trainer.db'}", runs_dir=folder / "jobs",
                           python=str(python), poll_interval_s=0.1,
                           model_roots=[Path(tiny_model).parent])  # fmt: skip


SFT_JOB = {"recipe": "when-to-search", "objective": "sft", "dataset": "synthetic", "seed": 0, "steps": 1}


def test_a_failed_trainer_job_ends_the_segment_without_resubmitting_it(
    env: Path, tiny_model: str, tmp_path: Path
) -> None:
    """A job whose worker the OOM killer ends each time fails once the trainer stops relaunching it;
    the segment's task raises at once instead of submitting the same job twice more (its
    retries are for lost connections)."""
    settings = dying_trainer(tmp_path, tiny_model, "kill -9 $$")
    started = time.monotonic()
    with LocalServer(create_trainer(settings)) as trainer:
        with pytest.raises(TrainerJobFailed, match="killed by SIGKILL"):
            run_job("dies", 1, {**SFT_JOB, "model": tiny_model}, trainer.url)
        with TrainerClient(trainer.url) as client:
            jobs = client.list()
    assert [j.status for j in jobs] == ["failed"]
    assert time.monotonic() - started < 10  # the task's retries would wait 10 s each


def test_the_wait_for_a_job_outlasts_a_trainer_restart(env: Path, tiny_model: str, tmp_path: Path) -> None:
    """The trainer is down for 3 s while a job is waited for (connections refused), then serves
    again and the job is cancelled: the wait reports the cancelled job instead of the
    connection error."""
    settings, port = dying_trainer(tmp_path, tiny_model, "exec sleep 600"), free_port()
    with LocalServer(create_trainer(settings), port=port) as first, TrainerClient(first.url) as client:
        job_id = client.submit({**SFT_JOB, "model": tiny_model}).id
    seen = threading.Event()

    def restart() -> None:
        time.sleep(3)
        with LocalServer(create_trainer(settings), port=port) as again, TrainerClient(again.url) as client:
            client.cancel(job_id)
            seen.wait(60)

    @flow
    def wait() -> Job:
        with TrainerClient(f"http://127.0.0.1:{port}") as client:
            return watch_job(client, job_id, "restart", poll_s=0.2)

    thread = threading.Thread(target=restart)
    thread.start()
    try:
        assert wait().status == "cancelled"
    finally:
        seen.set()
        thread.join()
