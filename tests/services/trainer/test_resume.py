"""A worker killed with SIGKILL resumes from its last complete checkpoint: no episode written
twice, none lost, every step logged once, and the curriculum stage carried over."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hoprl.data.synthetic import write_jsonl
from hoprl.registry.store import Registry
from hoprl.schemas import Question
from services.trainer.jobs import submit
from services.trainer.protocol import Hyperparameters, JobRequest

ROOT = Path(__file__).resolve().parents[3]
STEPS, GROUPS, SAMPLES = 5, 2, 2


def worker(run_id: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """The worker as the service starts it; its log goes to a file (a pipe could fill and block it)."""
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "services.trainer.worker", run_id], cwd=ROOT,
                                env=env, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip


def test_sigkill_then_resume(tiny_model: str, retriever_url: str, collection: str,
                             synthetic: dict[str, list[Question]], tmp_path: Path) -> None:  # fmt: skip
    data = tmp_path / "train.jsonl"
    write_jsonl(data, synthetic["train"])
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    env = {**os.environ, "TRAINER_DATABASE_URL": url, "TRAINER_RUNS_DIR": str(tmp_path / "runs"),
           "TRAINER_RETRIEVER_URL": retriever_url, "TRAINER_TORCH_THREADS": "1"}  # fmt: skip
    hp = Hyperparameters(
        questions_per_step=GROUPS, num_generations=SAMPLES, max_turns=2, max_new_tokens_per_step=8,
        token_budget=64, save_steps=2, eval_questions=1,
        recipe_config={"curriculum": "steps", "switch_step": 1},
    )  # fmt: skip
    request = JobRequest(recipe="when-to-search", model=tiny_model, dataset=str(data), collection=collection,
                         steps=STEPS, hyperparameters=hp)  # fmt: skip
    with Registry(url) as registry:
        run_id = submit(registry, request).id
        first = worker(run_id, env, tmp_path / "first.log")
        deadline = time.monotonic() + 240
        while registry.count_episodes(run_id, step=3) == 0:  # past checkpoint 2, mid-way to 4
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint within 240 s"
            time.sleep(0.2)
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        killed_at = (
            max(step for step, _ in registry.metric_series(run_id, "step"))
            if registry.metric_series(run_id, "step")
            else 0
        )
        assert registry.latest_checkpoint(run_id).step == 2
        second = worker(run_id, env, tmp_path / "second.log")
        second.wait(timeout=300)
        log = (tmp_path / "second.log").read_text()
        assert second.returncode == 0, log[-3000:]
        assert "resume " + str(tmp_path / "runs" / run_id / "checkpoint-2") in log

        run = registry.get_run(run_id)
        assert run is not None and run.status == "succeeded"
        per_step = [registry.count_episodes(run_id, step=s) for s in range(1, STEPS + 1)]
        assert per_step == [GROUPS * SAMPLES] * STEPS  # none lost ...
        assert registry.count_episodes(run_id) == STEPS * GROUPS * SAMPLES  # ... none twice
        assert [s for s, _ in registry.metric_series(run_id, "step")] == list(range(1, STEPS + 1))
        assert [c.step for c in registry.checkpoints(run_id)] == [2, 4, 5]
        assert killed_at >= 2
        # stage 1 -> 2 switched at step 1 before the kill and the resumed run kept stage 2
        assert registry.current_stage(run_id) == "stage2"
        assert [(w.step, w.to_stage) for w in registry.stage_switches(run_id)] == [(1, "stage2")]
