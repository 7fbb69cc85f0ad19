"""Jobs in several processes (accelerate launch, gloo on CPU) and what a machine without CUDA refuses.

The two-process job is the real thing: the trainer service launches the worker under
``accelerate launch --multi_gpu --num_processes 2``, two ranks train the tiny model with DDP over
gloo, rank 0 writes the registry. The test kills the whole job with SIGKILL after its first
checkpoint, lets the queue start it again, and checks that it resumed from that checkpoint, that
the registry holds one set of rows per step, and that both ranks ended with the same weights.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from sqlalchemy import select

from hoprl.clients.trainer import TrainerClient
from hoprl.data.jsonl import write_questions
from hoprl.domain import Question
from hoprl.jobspec import load_config, resolve
from hoprl.registry.models import EpisodeRow, MetricRow
from hoprl.registry.store import Registry
from hoprl.schemas.trainer import Hyperparameters, JobRequest
from services.local import LocalServer
from services.trainer.app import create_app
from services.trainer.launch import loop_problem, worker_command
from services.trainer.queue import rank_pids
from services.trainer.settings import TrainerSettings

CUDA = torch.cuda.is_available()


@pytest.fixture()
def settings(tmp_path: Path, retriever_url: str, tiny_model: str) -> TrainerSettings:
    return TrainerSettings(database_url=f"sqlite:///{tmp_path / 'registry.db'}", runs_dir=tmp_path / "runs",
                           retriever_url=retriever_url, poll_interval_s=0.2, torch_threads=1,
                           data_roots=[tmp_path], model_roots=[Path(tiny_model).parent],
                           max_processes=2)  # fmt: skip


@pytest.fixture()
def data(tmp_path: Path, synthetic: dict[str, list[Question]]) -> Path:
    path = tmp_path / "train.jsonl"
    write_questions(path, synthetic["train"])
    return path


def job(tiny_model: str, data: Path, collection: str, **hp: Any) -> dict[str, Any]:
    return {
        "recipe": "search-r1", "objective": "grpo", "model": tiny_model, "dataset": str(data),
        "collection": collection, "steps": 4, "seed": 3,
        "hyperparameters": {"questions_per_step": 2, "num_generations": 2, "max_steps": 2,
                            "max_new_tokens_per_step": 8, "token_budget": 64, "save_steps": 2, **hp},
    }  # fmt: skip


@pytest.mark.skipif(CUDA, reason="checks what a machine without CUDA refuses")
@pytest.mark.parametrize(
    ("hp", "field", "code", "words"),
    [
        ({"generation": "vllm"}, "generation", "vllm_unavailable", "CUDA"),
        ({"generation": "vllm", "vllm_mode": "server"}, "generation", "vllm_unavailable", "CUDA"),
        ({"distributed": "zero3", "processes": 2}, "distributed", "distributed_unavailable", "CUDA"),
        ({"distributed": "fsdp"}, "distributed", "distributed_unavailable", "CUDA"),
        ({"processes": 3}, "processes", "processes_too_large", "TRAINER_MAX_PROCESSES"),
        ({"processes": 2, "questions_per_step": 3}, "processes", "processes_uneven", "split evenly"),
    ],
)
def test_what_this_machine_cannot_run_is_a_409_naming_it(
    settings: TrainerSettings,
    tiny_model: str,
    data: Path,
    hp: dict[str, Any],
    field: str,
    code: str,
    words: str,
) -> None:
    with LocalServer(create_app(settings)) as server:
        response = httpx.post(f"{server.url}/v1/jobs", json=job(tiny_model, data, "c", **hp))
    assert response.status_code == 409, response.text
    body = response.json()
    assert (
        body["error"] == code and f"hyperparameters.{field}" in body["message"] and words in body["message"]
    )
    assert "Traceback" not in response.text


@pytest.mark.parametrize(
    ("request_changes", "loop"),
    [
        ({"recipe": "r2ag", "objective": "dapo"}, "R2AG"),
        ({"objective": "ppo"}, "ppo"),
        ({"objective": "dpo"}, "dpo"),
    ],
)
def test_loops_of_one_process_refuse_several(
    settings: TrainerSettings, tiny_model: str, data: Path, request_changes: dict[str, str], loop: str
) -> None:
    body = {**job(tiny_model, data, "c", processes=2), **request_changes}
    with LocalServer(create_app(settings)) as server:
        response = httpx.post(f"{server.url}/v1/jobs", json=body)
    assert response.status_code == 409 and response.json()["error"] == "processes_unsupported"
    assert loop in response.json()["message"]


def test_the_worker_command(settings: TrainerSettings) -> None:
    one = worker_command("py", "job-1", Hyperparameters(), settings)
    assert one == ["py", "-m", "services.trainer.worker", "job-1"]
    two = worker_command("py", "job-1", Hyperparameters(processes=2), settings)
    assert two[:3] == ["py", "-m", "accelerate.commands.launch"]
    assert two[two.index("--num_processes") + 1] == "2" and "--multi_gpu" in two
    assert two[-3:] == ["-m", "services.trainer.worker", "job-1"]
    zero3 = worker_command("py", "job-1", Hyperparameters(processes=8, distributed="zero3"), settings)
    assert zero3[zero3.index("--config_file") + 1] == str(settings.accelerate_configs / "zero3.yaml")
    assert "--multi_gpu" not in zero3


def wait(predicate: Any, timeout: float, what: str, every: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.mark.skipif(CUDA, reason="the CPU (gloo) path; GPUs run the same code over NCCL")
def test_a_two_process_job_trains_resumes_after_kill_and_ends_with_identical_weights(
    settings: TrainerSettings, tiny_model: str, data: Path, collection: str
) -> None:
    with LocalServer(create_app(settings)) as server, TrainerClient(server.url) as client:
        run_id = client.submit(job(tiny_model, data, collection, processes=2)).id
        folder = settings.runs_dir / run_id
        # the first checkpoint is complete (rank 0 wrote its state file last); a step of the tiny
        # model takes about half a second, so the ranks are frozen at once: otherwise the first
        # attempt can reach checkpoint-4 before the kill and the second has nothing to resume
        checkpoint_2 = folder / "checkpoint-2" / "hoprl_state.json"
        wait(checkpoint_2.is_file, 400, "checkpoint-2", every=0.02)
        ranks = rank_pids(folder, run_id)
        for pid in ranks:
            os.kill(pid, signal.SIGSTOP)
        first = int((folder / "worker.pid").read_text())
        assert len(ranks) == 2 and first not in ranks  # torchrun's ranks, in sessions of their own
        assert not (folder / "checkpoint-4" / "hoprl_state.json").is_file()  # frozen before step 4's
        os.kill(first, signal.SIGKILL)  # the job's launcher: the queue must stop the orphaned ranks
        wait(lambda: (folder / "worker.pid").read_text() != str(first), 60, "the queue to restart the job")
        final = wait(
            lambda: (j := client.get(run_id)).status in ("succeeded", "failed", "cancelled") and j,
            600,
            "the job",
        )
        log = (folder / "worker.log").read_text()
        assert final.status == "succeeded", log[-3000:]
        assert not any(Path(f"/proc/{pid}").exists() for pid in ranks)  # the first attempt's ranks
    assert "attempt 2, resuming after step 2" in log
    ranks = json.loads((folder / "ranks.json").read_text())
    assert len(ranks["digests"]) == 2 and ranks["identical"] is True
    with Registry(settings.database_url) as registry, registry.session() as s:
        metrics = s.execute(select(MetricRow.step, MetricRow.name).where(MetricRow.run_id == run_id)).all()
        episodes = s.execute(select(EpisodeRow).where(EpisodeRow.run_id == run_id)).scalars().all()
        checkpoints = [c.step for c in registry.checkpoints(run_id)]
    # one set of rows per step: no (step, metric) twice, every step logged, both ranks' episodes once
    assert len(metrics) == len(set(metrics))
    assert sorted({step for step, _ in metrics}) == [1, 2, 3, 4]
    by_step: dict[int, list[Any]] = {}
    for e in episodes:
        by_step.setdefault(e.step, []).append(e)
    assert sorted(by_step) == [1, 2, 3, 4]
    for step, rows in by_step.items():  # 2 questions x 2 samples, one question per rank
        assert len(rows) == 4, step
        assert len({r.question_id for r in rows}) == 2, step
    attempts = {step: {r.trajectory["meta"]["attempt"] for r in rows} for step, rows in by_step.items()}
    assert attempts == {1: {1}, 2: {1}, 3: {2}, 4: {2}}
    assert sorted(set(checkpoints)) == [2, 4]


@pytest.mark.parametrize("config", sorted((Path(__file__).resolve().parents[3] / "configs").glob("*.yaml")))
def test_every_paper_config_asks_only_what_its_training_loop_can_do(config: Path) -> None:
    """At GPU size: vLLM, processes and DeepSpeed/FSDP only where TRL's trainers run the loop."""
    request = load_config(config)
    hp = resolve(request.hyperparameters, request.recipe, request.objective)
    assert loop_problem(request, hp) is None, config.name


def test_the_projects_own_loops_refuse_vllm_and_deepspeed(settings: TrainerSettings) -> None:
    r2ag = JobRequest(recipe="r2ag", objective="dapo", hyperparameters=Hyperparameters(generation="vllm"))
    assert loop_problem(r2ag, r2ag.hyperparameters)[:2] == ("generation", "generation_unsupported")  # type: ignore[index]
    ppo = JobRequest(recipe="evo-rag", objective="ppo", hyperparameters=Hyperparameters(distributed="zero3"))
    assert loop_problem(ppo, ppo.hyperparameters)[:2] == ("distributed", "distributed_unsupported")  # type: ignore[index]
    evo = JobRequest(recipe="evo-rag", objective="grpo", hyperparameters=Hyperparameters(processes=2))
    # EVO-RAG's sibling GRPO (its default) is the project's own loop; per_step runs in TRL's
    assert loop_problem(evo, resolve(evo.hyperparameters, "evo-rag", "grpo"))[:2] == (  # type: ignore[index]
        "processes", "processes_unsupported",
    )  # fmt: skip
    per_step = Hyperparameters(processes=2, advantage="per_step")
    assert loop_problem(evo, resolve(per_step, "evo-rag", "grpo")) is None  # preference model: rank 0
