"""The job queue: one worker subprocess at a time, state in the run registry.

The registry's ``runs`` table *is* the queue: ``POST /v1/jobs`` inserts a ``queued`` run, and a
background thread (:class:`JobQueue`) polls every ``poll_interval_s``:

- no worker running -> start ``python -m services.trainer.worker RUN_ID`` for the oldest queued
  run, under ``accelerate launch`` when the job asks for several processes
  (:mod:`services.trainer.launch`; stdout/stderr to ``<runs_dir>/<id>/worker.log``, its pid in
  ``worker.pid``);
- the worker exited -> it recorded ``succeeded`` / ``failed`` itself; a worker that died without
  recording anything (killed by a signal, OOM) leaves the run ``running``, so it is queued again
  and resumes from its last checkpoint, at most ``MAX_RESTARTS`` times, then marked failed.

On start, runs left ``running`` by a previous service process are adopted when their worker is
still alive (its pid file), else queued again: jobs survive a service restart. A service with
``cancel_on_exit`` (a pipeline's own local trainer, flows/stack.py) cancels its jobs when it stops
instead, so a stopped ``make run`` leaves no worker training; on start it adopts nothing and
cancels the jobs of its own folder a killed service left ``running``, leaving every other run's
job alone, so the next run's trainer never trains another run's job.
Cancelling a queued run marks it ``cancelled``; cancelling the running one terminates its worker.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from hoprl.registry.models import RunStatus
from hoprl.registry.store import Registry
from hoprl.schemas.trainer import Hyperparameters
from services.trainer.admission import release_collection
from services.trainer.launch import worker_command
from services.trainer.settings import TrainerSettings

log = logging.getLogger("hoprl.trainer")
MAX_RESTARTS = 3
RUNNING: tuple[RunStatus, ...] = ("running",)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:  # a zombie child of ours counts as dead
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return True


def exit_reason(proc: subprocess.Popen[bytes] | int) -> str:
    """How a worker ended, for the job's error: its exit code, or the signal that killed it (a
    SIGKILL no one sent is usually the kernel's OOM killer)."""
    code = None if isinstance(proc, int) else proc.returncode
    if code is None:
        return "exit status unknown (a worker adopted from an earlier service)"
    if code >= 0:
        return f"exit code {code}"
    name = signal.Signals(-code).name
    if -code == signal.SIGKILL:
        return f"killed by {name}, as the kernel's OOM killer ends a process when memory runs out"
    return f"killed by {name}"


class JobQueue:
    """``queue.start()`` then ``queue.stop()``; :meth:`cancel` from the routes."""

    def __init__(self, settings: TrainerSettings, registry: Registry) -> None:
        self.settings, self.registry = settings, registry
        self.lock = threading.Lock()
        self.current: tuple[str, subprocess.Popen[bytes] | int] | None = (
            None  # run id, process or adopted pid
        )
        self.restarts: dict[str, int] = {}
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="hoprl-trainer-queue", daemon=True)

    def start(self) -> None:
        for run in self.registry.list_runs(status="running", limit=1000, kind="job"):
            pid = self._pid(run.id)
            if self.settings.cancel_on_exit:  # a pipeline's own trainer: never another run's job
                # its own folder's job, left by a killed service (--run-id resubmits it); a job
                # with no pid file here is another run's, live or not, and stays as it is
                if pid is not None and not alive(pid):
                    log.info("run %s was left running by a stopped service: cancelled", run.id)
                    if self.registry.transition_run(run.id, "cancelled", RUNNING) is not None:
                        release_collection(run.id, self.registry, self.settings)
                continue
            if pid is not None and alive(pid) and self.current is None:
                log.info("adopting run %s (worker pid %d still alive)", run.id, pid)
                self.current = (run.id, pid)
            else:
                log.info("run %s was running when the service stopped: queued again", run.id)
                self.registry.set_run_status(run.id, "queued")
        self.thread.start()

    def stop(self) -> None:
        """Stop polling; a running worker keeps going and is adopted by the next service start,
        unless ``cancel_on_exit``: then the running job ends ``cancelled`` (it resumes from its
        checkpoints when submitted again with ``resume_from``)."""
        self.stopping.set()
        self.thread.join(timeout=10)
        if self.settings.cancel_on_exit and self.current is not None:
            self.cancel(self.current[0])

    def _loop(self) -> None:
        while not self.stopping.is_set():
            try:
                self.tick()
            except Exception:  # a registry hiccup must not kill the queue; the next tick retries
                log.exception("job queue tick failed")
            self.stopping.wait(self.settings.poll_interval_s)

    def tick(self) -> None:
        with self.lock:
            if self.current is not None and not self._finished():
                return
            self.current = None
            claimed = self.registry.claim_next("job")  # atomic: two trainers never launch one job
            if claimed is not None:
                try:
                    self._launch(claimed.id)
                except Exception:
                    self.registry.set_run_status(claimed.id, "queued")  # the next tick tries again
                    raise

    def _finished(self) -> bool:
        assert self.current is not None
        run_id, proc = self.current
        if isinstance(proc, int) and alive(proc):
            return False
        if not isinstance(proc, int) and proc.poll() is None:
            return False
        # The worker leads its own process group: what it started (accelerate's ranks) goes with it,
        # so a restart never meets ranks of the dead attempt still training.
        self._kill_job(run_id, proc if isinstance(proc, int) else proc.pid)
        run = self.registry.get_run(run_id)
        if run is not None and run.status == "running":  # died without a word: resume it
            self.restarts[run_id] = self.restarts.get(run_id, 0) + 1
            how = exit_reason(proc)
            if self.restarts[run_id] <= MAX_RESTARTS:
                log.warning("worker of run %s died (%s); queued again to resume", run_id, how)
                self.registry.set_run_status(run_id, "queued")
                return True  # it keeps its collection's lease
            self.registry.set_run_status(
                run_id, "failed", error=f"the worker died repeatedly (last: {how}); see worker.log"
            )
        release_collection(run_id, self.registry, self.settings)  # succeeded, failed or cancelled
        return True

    def _launch(self, run_id: str) -> None:
        folder = self.settings.runs_dir / run_id
        folder.mkdir(parents=True, exist_ok=True)
        run = self.registry.get_run(run_id)
        hp = Hyperparameters.model_validate((run.config if run else {}).get("hyperparameters", {}))
        command = worker_command(self.settings.python or sys.executable, run_id, hp, self.settings)
        with (folder / "worker.log").open("ab") as logfile:
            proc = subprocess.Popen(
                command, stdout=logfile, stderr=subprocess.STDOUT, env=self.worker_env(),
                start_new_session=True,
            )  # fmt: skip
        (folder / "worker.pid").write_text(str(proc.pid))
        self.registry.set_run_status(run_id, "running")
        self.current = (run_id, proc)
        log.info("run %s started (pid %d)", run_id, proc.pid)

    def worker_env(self) -> dict[str, str]:
        """This process's environment plus the settings, so the worker sees what the service sees."""
        s = self.settings
        env = dict(os.environ)
        env.update({
            "TRAINER_DATABASE_URL": self.registry.url.render_as_string(hide_password=False),
            "TRAINER_RUNS_DIR": str(s.runs_dir.resolve()),
            "TRAINER_RETRIEVER_URL": s.retriever_url,
            "TRAINER_MODEL_CACHE": str(s.model_cache.resolve()),
            "TRAINER_TORCH_THREADS": str(s.torch_threads),
        })  # fmt: skip
        if s.default_model:
            env["TRAINER_DEFAULT_MODEL"] = s.default_model
        return env

    def _pid(self, run_id: str) -> int | None:
        path = self.settings.runs_dir / run_id / "worker.pid"
        return int(path.read_text()) if path.is_file() else None

    def cancel(self, run_id: str) -> bool:
        """Cancel a queued or running run; False when it had already finished."""
        with self.lock:
            run = self.registry.get_run(run_id)
            if run is None or run.status not in ("queued", "running"):
                return False
            stopped = self.current is not None and self.current[0] == run_id
            if self.current is not None and stopped:
                self._terminate(self.current[1])
                self._kill_job(run_id, self._pid(run_id) or 0)  # ranks the launcher left behind
                self.current = None
            # unless the worker recorded its end meanwhile: a finished run keeps its status
            cancelled = self.registry.transition_run(run_id, "cancelled", ("queued", "running")) is not None
        if cancelled or stopped:  # either way it has ended, and _finished will not see it
            release_collection(run_id, self.registry, self.settings)
        return cancelled

    def _kill_job(self, run_id: str, pid: int) -> None:
        """SIGKILL what is left of a job: the worker's process group and its ranks (accelerate's
        ranks run in sessions of their own, so a dead launcher leaves them running)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        for rank in rank_pids(self.settings.runs_dir / run_id, run_id):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(rank, signal.SIGKILL)

    @staticmethod
    def _terminate(proc: subprocess.Popen[bytes] | int) -> None:
        pid = proc if isinstance(proc, int) else proc.pid
        try:
            os.killpg(pid, signal.SIGTERM)  # the worker leads its own session: its children go too
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if alive(pid):
            os.killpg(pid, signal.SIGKILL)
        if not isinstance(proc, int):
            proc.wait()


def rank_pids(folder: Path, run_id: str) -> list[int]:
    """The live worker processes of run ``run_id`` that wrote ``rank-N.pid`` in ``folder`` (a pid
    counts only while its command line still names the run, so a reused pid is never touched)."""
    found = []
    for path in folder.glob("rank-*.pid"):
        try:
            pid = int(path.read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"services.trainer.worker" in cmdline and run_id.encode() in cmdline:
            found.append(pid)
    return found


def log_path(settings: TrainerSettings, run_id: str) -> Path:
    return settings.runs_dir / run_id / "worker.log"
