"""The jobs API over real HTTP: submit, poll to done, list, cancel, 4xx bodies, restart survival."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from hoprl.clients.http import ServiceError
from hoprl.clients.trainer import TrainerClient
from hoprl.data.jsonl import write_questions
from hoprl.domain import Question
from hoprl.registry.store import Registry
from hoprl.schemas.trainer import JobRequest
from services.local import LocalServer
from services.trainer.app import create_app
from services.trainer.jobs import submit
from services.trainer.routes import registry_of
from services.trainer.settings import TrainerSettings


@pytest.fixture()
def settings(tmp_path: Path, retriever_url: str, tiny_model: str) -> TrainerSettings:
    """The dataset is written to ``tmp_path`` and the tiny model lives beside it: both are roots."""
    return TrainerSettings(database_url=f"sqlite:///{tmp_path / 'registry.db'}", runs_dir=tmp_path / "runs",
                           retriever_url=retriever_url, poll_interval_s=0.2, torch_threads=1,
                           data_roots=[tmp_path], model_roots=[Path(tiny_model).parent])  # fmt: skip


def job(tiny_model: str, data: Path, collection: str, steps: int = 2) -> dict[str, object]:
    return {
        "recipe": "search-r1", "objective": "grpo", "model": tiny_model, "dataset": str(data),
        "collection": collection, "steps": steps,
        "hyperparameters": {"questions_per_step": 2, "num_generations": 2, "max_steps": 2,
                            "max_new_tokens_per_step": 8, "token_budget": 64, "save_steps": 10},
    }  # fmt: skip


@pytest.fixture()
def data(tmp_path: Path, synthetic: dict[str, list[Question]]) -> Path:
    path = tmp_path / "train.jsonl"
    write_questions(path, synthetic["train"])
    return path


def test_bad_input_is_4xx_json(settings: TrainerSettings) -> None:
    with Registry(settings.database_url) as registry:  # a flow's run in the same table
        registry.create_run("pipe-1", recipe="search-r1", objective="grpo", model="m", config={}, seed=0)
    with LocalServer(create_app(settings)) as server:
        http = httpx.Client(base_url=server.url)
        cases = [
            ({"recipe": "nope"}, 422, "unknown_recipe"),
            ({"recipe": "search-r1", "hyperparameters": {"lr": 1}}, 422, "invalid_request"),
            ({"recipe": "search-r1", "objective": "a2c"}, 422, "invalid_request"),
            ({"recipe": "search-r1", "hyperparameters": {"lr_scheduler": "step"}}, 422, "invalid_request"),
            ({"recipe": "search-r1", "steps": 0}, 422, "invalid_request"),
            ({"recipe": "search-r1", "resume_from": "job-missing"}, 404, "job_not_found"),
            ({"recipe": "search-r1", "resume_from": "pipe-1"}, 422, "not_a_job"),
        ]
        for body, status, error in cases:
            response = http.post("/v1/jobs", json=body)
            assert (response.status_code, response.json()["error"]) == (status, error), body
        bad = http.post("/v1/jobs", content=b"{", headers={"content-type": "application/json"})
        assert bad.status_code == 400 and bad.json()["error"] == "malformed_json"
        assert http.get("/v1/jobs/job-missing").json()["error"] == "job_not_found"
        assert http.post("/v1/jobs/job-missing/cancel").status_code == 404
        assert http.get("/healthz").json() == {"status": "ok"}
        assert http.get("/readyz").json()["status"] == "ready"


def test_submit_poll_list_cancel(
    settings: TrainerSettings, tiny_model: str, data: Path, collection: str
) -> None:
    with LocalServer(create_app(settings)) as server, TrainerClient(server.url) as client:
        first = client.submit(job(tiny_model, data, collection))
        queued = client.submit(job(tiny_model, data, collection))
        assert client.get(queued.id).status == "queued"  # one job at a time
        assert client.cancel(queued.id).status == "cancelled"
        with pytest.raises(ServiceError) as info:
            client.cancel(queued.id)
        assert info.value.status == 409
        done = client.wait(first.id, timeout=300, poll=0.5)
        assert done.status == "succeeded", done.error
        assert done.step == 2 and [c.step for c in done.checkpoints] == [2]
        assert {"reward", "loss", "rollout_s", "searches"} <= set(done.metrics)
        assert {j.id for j in client.list()} == {first.id, queued.id}
        assert [j.id for j in client.list(status="cancelled")] == [queued.id]
    with Registry(settings.database_url) as registry:
        assert registry.count_episodes(first.id) == 2 * 2 * 2  # steps x questions x samples


def test_job_survives_service_restart(settings: TrainerSettings, tiny_model: str, data: Path,
                                      collection: str) -> None:  # fmt: skip
    with LocalServer(create_app(settings)) as server, TrainerClient(server.url) as client:
        created = client.submit(job(tiny_model, data, collection))
        while client.get(created.id).status == "queued":
            pass
    # The service is gone; its worker is not. A new service adopts it (or re-queues a dead one).
    with LocalServer(create_app(settings)) as server, TrainerClient(server.url) as client:
        done = client.wait(created.id, timeout=300, poll=0.5)
        assert done.status == "succeeded", done.error
        assert done.step == 2


def _written(path: Path) -> bool:
    return path.is_file() and path.read_text().strip() != ""


def test_cancel_on_exit_stops_the_running_job_with_the_service(
    settings: TrainerSettings, tiny_model: str, data: Path, collection: str
) -> None:
    """A pipeline's own trainer (cancel_on_exit): its job ends with it, worker and all, and a
    service started next on the same registry finds nothing to adopt or resume."""
    settings = settings.model_copy(update={"cancel_on_exit": True})
    with LocalServer(create_app(settings)) as server, TrainerClient(server.url) as client:
        created = client.submit(job(tiny_model, data, collection, steps=50))
        pid_file = settings.runs_dir / created.id / "worker.pid"
        # the worker may mark its run running before the queue has written its pid file
        while client.get(created.id).status == "queued" or not _written(pid_file):
            time.sleep(0.05)
        pid = int(pid_file.read_text())
    with Registry(settings.database_url) as registry:
        assert registry.get_run(created.id).status == "cancelled"  # type: ignore[union-attr]
        assert registry.list_runs(status="running", kind="job") == []
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the worker went with the service, not left training


def test_cancel_on_exit_starts_without_taking_another_runs_job(settings: TrainerSettings) -> None:
    """At start, a pipeline's own trainer cancels the job its folder's killed predecessor left
    ``running`` (dead worker pid) and leaves a job with no pid file here (another run's) alone."""
    settings = settings.model_copy(update={"cancel_on_exit": True})
    with Registry(settings.database_url) as registry:
        ours, theirs = (submit(registry, JobRequest(recipe="search-r1", steps=3)).id for _ in range(2))
        for run_id in (ours, theirs):
            registry.set_run_status(run_id, "running")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that no longer runs
    (settings.runs_dir / ours).mkdir(parents=True)
    (settings.runs_dir / ours / "worker.pid").write_text(str(dead.pid))
    with LocalServer(create_app(settings)), Registry(settings.database_url) as registry:
        assert registry.get_run(ours).status == "cancelled"  # type: ignore[union-attr]
        time.sleep(3 * settings.poll_interval_s)  # a few queue ticks: nothing is launched
        assert registry.get_run(theirs).status == "running"  # type: ignore[union-attr]
        assert not (settings.runs_dir / theirs).exists()


def test_pipeline_runs_are_never_taken_for_jobs(settings: TrainerSettings) -> None:
    """A flow's runs share the runs table: the queue neither launches a queued one nor re-queues a
    running one at start, and the jobs API does not show them."""
    with Registry(settings.database_url) as registry:
        for run_id, status in (("pipe-queued", "queued"), ("pipe-running", "running")):
            registry.create_run(run_id, recipe="search-r1", objective="grpo", model="m", config={}, seed=0)
            registry.set_run_status(run_id, status)  # type: ignore[arg-type]
        with LocalServer(create_app(settings)) as server:
            http = httpx.Client(base_url=server.url)
            for _ in range(10):  # the queue ticks every 0.2 s
                assert http.get("/v1/jobs").json() == []
                time.sleep(0.2)
            for run_id in ("pipe-queued", "pipe-running"):
                assert http.get(f"/v1/jobs/{run_id}").json()["error"] == "job_not_found"
                assert http.post(f"/v1/jobs/{run_id}/cancel").status_code == 404
        assert [(r.id, r.status, r.kind) for r in sorted(registry.list_runs(), key=lambda r: r.id)] == [
            ("pipe-queued", "queued", "pipeline"),
            ("pipe-running", "running", "pipeline"),
        ]
        assert not (settings.runs_dir / "pipe-queued").exists()  # no worker was started for it


def test_routes_take_the_registry_through_a_dependency(tmp_path: Path) -> None:
    """The routes read the run registry through ``registry_of``: a test hands them its own, holding
    a job the app's registry never saw.

    No lifespan runs (a TestClient outside ``with``): no registry is opened, no queue started.
    """
    app = create_app(TrainerSettings(database_url=f"sqlite:///{tmp_path / 'unused.db'}", runs_dir=tmp_path))
    client = TestClient(app)
    missing = client.get("/v1/jobs")
    assert (missing.status_code, missing.json()["error"]) == (503, "not_ready")
    with Registry(f"sqlite:///{tmp_path / 'own.db'}") as registry:
        run = submit(registry, JobRequest(recipe="search-r1", steps=3))
        app.dependency_overrides[registry_of] = lambda: registry
        assert [(j["id"], j["status"], j["steps"]) for j in client.get("/v1/jobs").json()] == [
            (run.id, "queued", 3)
        ]
        assert client.get(f"/v1/jobs/{run.id}").json()["recipe"] == "search-r1"
    assert not (tmp_path / "unused.db").exists()
