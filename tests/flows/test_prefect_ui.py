"""The pipeline as users start it: the Prefect UI's Run button on a worker, and ``hoprl pipeline``.

``make ui`` (``python -m flows.ui``) runs here as a subprocess on a free port, with its state in a
temp folder and without the virtual environment on ``PATH``: a real ``prefect server start``, the
deployments registered by ``python -m flows.deploy`` and a real ``prefect worker start --pool
hoprl``. A run is started through the API the UI's Run button calls
(``POST /api/deployments/<id>/create_flow_run``) and the worker runs it as Prefect does, loading
``flows/pipeline.py`` as a script. The flow runs (and ``hoprl pipeline``, also a subprocess) use
the live services of ``conftest.py`` through ``HOPRL_*_URL`` and a SQLite registry in the temp
folder. Everything is sized to finish in a few minutes on two cores: 6 questions per split, 2
per evaluation, 0 RL steps for the UI run, 2 SFT + 2 GRPO steps of a 2-layer model for the CLI.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from importlib.metadata import packages_distributions
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.pipeline import prefect_api
from flows.stack import ServiceUrls
from hoprl.ports import free_port
from hoprl.registry import Registry

ROOT = Path(__file__).resolve().parents[2]
HP = {"questions_per_step": 2, "num_generations": 2, "max_steps": 2, "max_new_tokens_per_step": 8,
      "token_budget": 64}  # fmt: skip
TERMINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("prefect-ui")


@pytest.fixture(scope="module")
def env(
    folder: Path, live_services: Callable[[Path], AbstractContextManager[ServiceUrls]]
) -> Iterator[dict[str, str]]:
    """The environment of every process of this module: the live services, the registry, no venv
    on PATH, no Prefect or hoprl settings of the caller's."""
    with live_services(folder) as urls:
        venv_bin = str(Path(sys.executable).parent)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "HOPRL_"))}
        env |= {
            "PATH": os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_WORKER_QUERY_SECONDS": "1",  # the worker polls its pool every second
            "HOPRL_RETRIEVER_URL": urls.retriever,
            "HOPRL_POLICY_URL": urls.policy,
            "HOPRL_JUDGE_URL": urls.judge,
            "HOPRL_TRAINER_URL": urls.trainer,
            "HOPRL_POLICY_ADMIN_TOKEN": "flows-test",
            "HOPRL_DATABASE_URL": f"sqlite:///{folder / 'registry.db'}",
            "HOPRL_RUNS_DIR": str(folder / "runs"),
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1",
        }
        yield env


def log_tail(path: Path) -> str:
    return path.read_text(errors="replace")[-4000:] if path.exists() else f"({path} missing)"


@pytest.fixture(scope="module")
def ui(folder: Path, env: dict[str, str]) -> Iterator[str]:
    """``python -m flows.ui`` on a free port until the module ends; yields its API URL once the
    deployment is registered and the worker is online. Ctrl-C (SIGINT) stops it, and both."""
    port, home = free_port(), folder / "prefect"
    api = f"http://127.0.0.1:{port}/api"
    out = folder / "ui.log"
    with out.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flows.ui", "--port", str(port), "--home", str(home)],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not worker_online(api):
            assert proc.poll() is None, f"flows.ui exited with {proc.returncode}:\n{log_tail(out)}"
            assert time.monotonic() < deadline, f"no worker online after 300 s:\n{log_tail(out)}"
            time.sleep(1)
        yield api
    finally:
        proc.send_signal(signal.SIGINT)
        try:  # flows.ui gives the worker and the server 20 s together; a loaded CI machine is slow
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:  # kill its server and worker too (own process groups), so
            children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True)
            for pid in children.stdout.split():  # no orphan fails the next run's checks
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(int(pid), signal.SIGKILL)
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and prefect_api(api) is None, "Ctrl-C left the server running"
    assert "worker start" not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


class PrefectRetries(httpx.HTTPTransport):
    """Retries what Prefect's own client retries (``prefect.client.base``: 408, 429, 502, 503, up
    to 5 times with backoff): its server answers 503 when SQLite reports the database busy, which
    WAL mode does at once, without waiting, when a read transaction tries to write after another
    one committed (seen on CI: the Run button's request got a 503 while the worker was starting)."""

    CODES = frozenset({408, 429, 502, 503})

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        for attempt in range(5):
            response = super().handle_request(request)
            if response.status_code not in self.CODES:
                return response
            response.close()
            time.sleep(2**attempt)
        return super().handle_request(request)


def worker_online(api: str) -> bool:
    try:
        response = httpx.post(f"{api}/work_pools/hoprl/workers/filter", json={}, timeout=5)
    except httpx.TransportError:
        return False
    return response.status_code == 200 and any(w["status"] == "ONLINE" for w in response.json())


def wait_for_flow_run(api: httpx.Client, flow_run_id: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        run = api.get(f"/flow_runs/{flow_run_id}").json()
        if run["state_type"] in TERMINAL or time.monotonic() > deadline:
            return dict(run)
        time.sleep(1)


def flow_run_logs(api: httpx.Client, flow_run_id: str) -> str:
    body = {"logs": {"flow_run_id": {"any_": [flow_run_id]}}, "sort": "TIMESTAMP_ASC", "limit": 200}
    return "\n".join(entry["message"] for entry in api.post("/logs/filter", json=body).json())


def artifacts(api: httpx.Client, flow_run_id: str) -> list[dict[str, Any]]:
    """The artifacts of a flow run, as its Artifacts tab lists them."""
    body = {"artifacts": {"flow_run_id": {"any_": [flow_run_id]}}}
    return sorted(api.post("/artifacts/filter", json=body).json(), key=lambda a: a["key"] or "")


def test_prefect_retries_replays_a_503_until_the_server_answers() -> None:
    """A real HTTP server that answers 503 twice (as Prefect's does on a busy SQLite), then 201:
    the client sees the 201, and the server saw the same POST body three times."""
    import http.server
    import threading

    bodies: list[bytes] = []

    class Busy(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(503 if len(bodies) < 3 else 201)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with httpx.Client(base_url=url, timeout=10, transport=PrefectRetries()) as api:
            assert api.post("/runs", json={"a": 1}).status_code == 201
    finally:
        server.shutdown()
        server.server_close()
    assert bodies == [b'{"a":1}'] * 3


def test_no_flows_module_shadows_a_top_level_module() -> None:
    """A worker loads ``flows/pipeline.py`` as a script with ``flows/`` first on ``sys.path``, so a
    module there named like a package, an installed distribution's module or a standard-library
    module would replace it for the whole flow run (``flows/services.py`` hid ``services``)."""
    flows = ROOT / "flows"
    elsewhere = [p for p in sys.path if Path(p or ".").resolve() != flows]
    installed = set(packages_distributions())
    for module in sorted(flows.glob("*.py")):
        name = module.stem
        if name == "__init__":
            continue
        assert name not in sys.stdlib_module_names, f"flows/{name}.py shadows the standard library"
        assert name not in installed, f"flows/{name}.py shadows an installed module"
        assert importlib.machinery.PathFinder.find_spec(name, elsewhere) is None, (
            f"flows/{name}.py shadows {name}"
        )


@pytest.mark.integration
def test_a_run_started_from_the_ui_completes_on_a_worker_with_its_artifacts(
    ui: str, folder: Path, tiny_model: str
) -> None:
    """The Run button's request, picked up by the worker of pool ``hoprl``: the run completes, and
    its report and plots are artifacts of the pipeline's own flow run."""
    parameters = {"model": tiny_model, "steps": 0, "sft_steps": 0, "segments": 1, "limit": 6,
                  "eval_limit": 2, "dev_limit": 1, "hyperparameters": HP, "run_id": "ui-run"}  # fmt: skip
    with httpx.Client(base_url=ui, timeout=30, transport=PrefectRetries()) as api:
        deployment = api.get("/deployments/name/pipeline/pipeline").json()
        assert deployment["work_pool_name"] == "hoprl"
        created = api.post(
            f"/deployments/{deployment['id']}/create_flow_run", json={"parameters": parameters}
        )
        assert created.status_code == 201, created.text
        flow_run_id = created.json()["id"]
        run = wait_for_flow_run(api, flow_run_id, timeout=420)
        assert run["state_type"] == "COMPLETED", (
            f"{run['state_type']}: {run['state']['message']}\n{flow_run_logs(api, flow_run_id)}\n"
            + log_tail(folder / "prefect" / "worker.log")
        )
        found = artifacts(api, flow_run_id)
        subflows = api.post(
            "/flow_runs/filter", json={"flow_runs": {"parent_flow_run_id": {"any_": [flow_run_id]}}}
        )
        assert len(subflows.json()) >= 5  # prepare_data, build_index, 3 evaluations, train, ...
        assert all(artifacts(api, sub["id"]) == [] for sub in subflows.json())
    assert [a["key"] for a in found] == ["ui-run-accuracy", "ui-run-report", "ui-run-training"]
    assert all(a["task_run_id"] is None for a in found)
    report = found[1]["data"]
    assert "### Answers" in report and "| final | when-to-search |" in report
    with Registry(f"sqlite:///{folder / 'registry.db'}") as reg:
        row = reg.get_run("ui-run")
    assert row is not None and row.status == "succeeded" and row.prefect_flow_run_id == flow_run_id


@pytest.mark.integration
def test_make_run_finds_the_local_server(ui: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``hoprl pipeline`` reports to ``$PREFECT_API_URL``, else to the server ``make ui`` started
    if one answers, else to a temporary server of its own (None)."""
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    assert prefect_api(ui) == ui
    assert prefect_api(f"http://127.0.0.1:{free_port()}/api") is None
    monkeypatch.setenv("PREFECT_API_URL", "http://prefect.example:4200/api")
    assert prefect_api(ui) == "http://prefect.example:4200/api"


@pytest.mark.integration
@pytest.mark.slow  # 70-150 s on two cores: an SFT and a GRPO job, each a fresh process
def test_hoprl_pipeline_shows_each_stage_and_each_jobs_progress(
    ui: str, env: dict[str, str], folder: Path, tiny_model: str
) -> None:
    """The terminal of ``hoprl pipeline`` (``make run``): a line per stage as it starts and ends,
    and the trainer jobs' step / total with loss or reward, while they run; the run is on the
    server whose UI the summary names."""
    argv = ["pipeline", "--model", tiny_model, "--steps", "2", "--segments", "1", "--sft-steps", "2",
            "--limit", "6", "--eval-limit", "2", "--dev-limit", "1", "--run-id", "cli-run",
            "--hyperparameters", json.dumps(HP)]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "cli.main", *argv], cwd=ROOT, env={**env, "PREFECT_API_URL": ui},
        capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    (folder / "cli.log").write_text(out)
    assert proc.returncode == 0, out[-6000:]
    for stage in ("prepare_data", "build_index", "eval/baseline", "eval/baseline/naive-rag", "warm_start",
                  "train", "eval/final"):  # fmt: skip
        assert f"stage {stage}: started" in out and re.search(rf"stage {stage}: done in \d+", out), stage
    assert re.search(r"sft job-\S+ \(warm start\) \[-{10}\] step 0/2 \(0%\)", out)
    assert re.search(r"sft job-\S+ \(warm start\) \[#{10}\] step 2/2 \(100%\), loss [\d.]+, succeeded", out)
    rl = r"(grpo|dapo|dr_grpo) job-\S+ \(segment to step 2\)"  # the objective the trainer ran
    assert re.search(rf"{rl} \[#{{10}}\] step 2/2 \(100%\), reward -?[\d.]+ ± [\d.]+, .*succeeded", out)
    for label in ("baseline", "baseline/naive-rag", "final"):  # each evaluation's answers: its last line
        done = (
            rf"evaluation {label} \[#{{10}}\] 2/2 questions \(100%\), EM so far [\d.]+, (\d+ failed, )?done"
        )
        assert re.search(done, out), label
    flow_run = re.search(rf"Prefect UI: {ui.removesuffix('/api')}/runs/flow-run/([0-9a-f-]+)", out)
    assert flow_run, out[-3000:]
    with httpx.Client(base_url=ui, timeout=30, transport=PrefectRetries()) as api:
        run = api.get(f"/flow_runs/{flow_run.group(1)}").json()
        assert run["state_type"] == "COMPLETED" and run["parameters"]["run_id"] == "cli-run"
        assert [a["key"] for a in artifacts(api, flow_run.group(1))] == [
            "cli-run-accuracy", "cli-run-report", "cli-run-training"
        ]  # fmt: skip
