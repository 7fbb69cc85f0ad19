"""What every flow shares: the registry, a run's folder, its stage ledger and its Prefect link.

A pipeline run is one row in the run registry (``runs``) and one folder on disk
(``$HOPRL_RUNS_DIR/<run id>/``: the prepared data, the report, the plots). The flows write the
pipeline runs' rows, Celery's idempotent fan-out units their units', the trainer its jobs'.

**The stage ledger.** A finished pipeline stage leaves a marker in the registry: the metric
``pipeline/<stage>`` at step 0 of the run, whose value is the id of what the stage produced
(dataset id, index id, evaluation id, or 1). ``pipeline(run_id=...)`` run again reads the
ledger and skips every marked stage, so a killed pipeline resumes where it stopped::

    if done(run_id, "build_index"):
        ...  # skip
    mark(run_id, "build_index", index_id)
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from prefect.runtime import flow_run

from hoprl.registry.models import RunRow
from hoprl.registry.shared import from_environment
from hoprl.settings import get_settings

LEDGER = "pipeline/"
RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


#: the registry at ``$HOPRL_DATABASE_URL``, one open per URL and process
registry = functools.partial(from_environment, "flows")


def runs_dir() -> Path:
    """Where run folders live: ``$HOPRL_RUNS_DIR``, default ``runs`` (shared with the trainer in compose)."""
    return get_settings().runs_dir.resolve()


def run_dir(run_id: str) -> Path:
    """The folder of one run, created on first use."""
    if not RUN_ID.match(run_id):
        raise ValueError(
            f"run id {run_id!r} must be 1-64 letters, digits, '.', '_' or '-' (it names a folder)"
        )
    path = runs_dir() / run_id
    path.mkdir(parents=True, exist_ok=True)
    return path


def link_flow_run(run_id: str) -> str | None:
    """Store the current Prefect flow run id on the registry run (the latest attempt wins).

    ``Registry.create_run`` keeps an existing row unchanged, so a resumed pipeline (a new flow run
    for the same registry run) updates the link here.
    """
    flow_run_id = flow_run.get_id()
    if flow_run_id is None:
        return None
    with registry().session() as s:
        run = s.get(RunRow, run_id)
        if run is None:
            raise KeyError(f"no run {run_id!r} in the registry; the pipeline creates it first")
        run.prefect_flow_run_id = str(flow_run_id)
    return str(flow_run_id)


def done(run_id: str, stage: str) -> float | None:
    """The ledger value of ``stage`` (what it produced) if it finished for this run, else None."""
    series = registry().metric_series(run_id, LEDGER + stage)
    return series[-1][1] if series else None


def mark(run_id: str, stage: str, value: float = 1.0) -> None:
    """Record that ``stage`` finished (idempotent: re-marking overwrites the value)."""
    registry().log_metrics(run_id, 0, {LEDGER + stage: float(value)})
