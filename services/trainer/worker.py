"""One job in its own process: ``python -m services.trainer.worker RUN_ID``.

The trainer service starts one worker per job, so cancelling a job is ending a process, and a
job killed with SIGKILL leaves nothing behind but its last complete checkpoint and what it wrote
to the registry. Each worker is one *attempt* at its run
(:func:`~hoprl.training.callbacks.start_attempt`): it deletes what earlier attempts recorded
for the steps after the checkpoint it resumes from, then runs those steps again, so every step's
episodes, metrics and stage switches come from one attempt. The worker marks the run
``running``, then ``succeeded`` or ``failed`` (with the error); logs go to stderr, which the
service sends to ``<runs_dir>/<run id>/worker.log``.
"""

from __future__ import annotations

import logging
import os
import sys

from hoprl.registry.store import Registry
from hoprl.training import distributed
from hoprl.training.callbacks import start_attempt
from services.trainer.jobs import run_job
from services.trainer.settings import TrainerSettings

log = logging.getLogger("hoprl.trainer")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("usage: python -m services.trainer.worker RUN_ID\n")
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    settings = TrainerSettings()
    run_id = argv[0]
    main_rank = distributed.is_main()  # several processes (accelerate launch): rank 0 alone writes
    # torchrun starts each rank in its own session, out of the launcher's process group: the queue
    # finds the ranks by these files to stop them with their job (services.trainer.queue).
    folder = settings.runs_dir / run_id
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"rank-{distributed.rank()}.pid").write_text(str(os.getpid()))
    with Registry(settings.database_url, owner="trainer") as registry:
        if main_rank:
            registry.set_run_status(run_id, "running")
        try:
            if main_rank:
                start_attempt(registry, run_id, settings.runs_dir / run_id)
            run_job(run_id, settings, registry)
        except Exception as exc:
            log.exception("run %s failed (rank %d)", run_id, distributed.rank())
            if main_rank:
                registry.set_run_status(run_id, "failed", error=f"{type(exc).__name__}: {exc}")
            return 1
        if main_rank:
            registry.set_run_status(run_id, "succeeded")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
