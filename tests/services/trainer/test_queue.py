"""The trainer's job queue: a worker that dies without a word is resumed, then failed with the reason."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from hoprl.registry import Registry
from services.trainer.queue import MAX_RESTARTS, JobQueue, exit_reason
from services.trainer.settings import TrainerSettings


def test_a_worker_killed_each_time_fails_the_job_naming_the_signal(tmp_path: Path) -> None:
    """A "python" that SIGKILLs itself stands for a worker the OOM killer ends: the job is queued
    again MAX_RESTARTS times, then failed with an error that says SIGKILL and what usually sends it."""
    python = tmp_path / "killed-python"
    python.write_text("#!/bin/sh\nkill -9 $$\n")
    python.chmod(0o755)
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    settings = TrainerSettings(database_url=url, runs_dir=tmp_path / "runs", python=str(python),
                               poll_interval_s=3600)  # fmt: skip
    with Registry(url, owner="trainer") as registry:
        registry.create_run(
            "job-1", recipe="arena", objective="grpo", model="m", config={}, seed=0, kind="job"
        )
        queue = JobQueue(settings, registry)
        launches = 0
        for _ in range(3 * (MAX_RESTARTS + 2)):
            queue.tick()  # launches the queued job, or finds its worker dead
            if queue.current is not None:
                launches += 1
                proc = queue.current[1]
                assert isinstance(proc, subprocess.Popen)
                proc.wait(timeout=30)
            run = registry.get_run("job-1")
            assert run is not None
            if run.status == "failed":
                break
        final = registry.get_run("job-1")
        assert launches == MAX_RESTARTS + 1
        assert final is not None and final.status == "failed" and final.error is not None
        assert "died repeatedly (last: killed by SIGKILL, as the kernel's OOM killer" in final.error


def test_the_exit_reason_names_codes_and_signals() -> None:
    code, term = (subprocess.Popen(["sh", "-c", c]) for c in ("exit 3", "kill -TERM $$"))
    assert code.wait(timeout=30) == 3 and term.wait(timeout=30) == -signal.SIGTERM
    assert exit_reason(code) == "exit code 3"
    assert exit_reason(term) == "killed by SIGTERM"
    assert exit_reason(12345) == "exit status unknown (a worker adopted from an earlier service)"
