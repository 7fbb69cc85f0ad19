"""HTTP routes of the trainer (``/v1/jobs``): submit, inspect, list, cancel."""

from __future__ import annotations

import math
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query
from fastapi.exceptions import RequestValidationError

from hoprl.judging import judge_flag
from hoprl.recipes import RECIPES
from hoprl.registry.models import RunRow, RunStatus
from hoprl.registry.store import Registry
from hoprl.schemas.trainer import Checkpoint, Job, JobCreated, JobRequest, JobStatus
from services.errors import ERROR_RESPONSES, ApiError, find_value, state_of
from services.trainer.admission import admit, hold_collection
from services.trainer.jobs import submit
from services.trainer.queue import JobQueue

router = APIRouter(responses=ERROR_RESPONSES)
JobId = Annotated[str, Path(description="the id POST /v1/jobs returned")]
# OpenAPI links: what a created job's id leads to (schemathesis' stateful tests follow them)
JOB_LINKS = {
    name: {"operationId": operation, "parameters": {"job_id": "$response.body#/id"}}
    for name, operation in (("GetJob", "get_job"), ("CancelJob", "cancel_job"))
}
CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {**ERROR_RESPONSES[404], "description": "the job already finished"}
}
QUEUED: tuple[RunStatus, ...] = ("queued",)
#: seconds a client told "the queue is full" (429) waits before it asks again
RETRY_AFTER_S = 60
CREATE_ERRORS: dict[int | str, dict[str, Any]] = {
    201: {"description": "the job is queued", "links": JOB_LINKS},
    403: {**ERROR_RESPONSES[404], "description": "a path outside the folders the trainer may read"},
    409: {
        **ERROR_RESPONSES[404],
        "description": "this trainer's limits, machine or files cannot run the job",
    },
    429: {**ERROR_RESPONSES[404], "description": "TRAINER_MAX_QUEUED_JOBS jobs are queued (Retry-After)"},
}


# The lifespan's state, as dependencies: a test can hand the routes another registry or queue
# (app.dependency_overrides); async, so resolving them takes no thread from the routes' pool.


registry_of = state_of("registry", "the registry is still opening")  # the run registry the lifespan opened
queue_of = state_of("queue", "the job queue is still starting")  # the job queue it started


RegistryDep = Annotated[Registry, Depends(registry_of)]
QueueDep = Annotated[JobQueue, Depends(queue_of)]


def _unstorable(value: Any) -> bool:
    """A value the run registry cannot store: NUL in a string, a NaN or infinite number."""
    if isinstance(value, str):
        return "\x00" in value
    return isinstance(value, float) and not math.isfinite(value)


def _storable(body: JobRequest) -> None:
    """422 for any value of the request the registry cannot hold (the whole request is stored).

    PostgreSQL's text and JSONB cannot hold a NUL character, and JSON has no NaN or Infinity
    (Python's ``json`` reads them); either would fail the insert after validation had passed.
    """
    where = find_value(body.model_dump(), ("body",), _unstorable)
    if where is not None:
        message = "a NUL character (\\u0000), NaN or Infinity cannot be stored in the run registry"
        raise RequestValidationError([{"type": "value_error", "loc": where, "msg": message}])


def _validate(body: JobRequest, registry: Registry) -> None:
    _storable(body)
    if body.recipe not in RECIPES:
        raise ApiError(
            422, "unknown_recipe", f"unknown recipe {body.recipe!r}; valid recipes: {sorted(RECIPES)}"
        )
    if not body.resume_from:
        return
    run = registry.get_run(body.resume_from)
    if run is None and "/" not in body.resume_from:
        raise ApiError(
            404, "job_not_found", f"resume_from {body.resume_from!r} is not a job id or a folder path"
        )
    if run is not None and run.kind != "job":  # a flow's run: its checkpoints belong to its jobs
        raise ApiError(
            422,
            "not_a_job",
            f"resume_from {body.resume_from!r} is a {run.kind} run, not a job; pass the id of one of "
            "its trainer jobs or a checkpoint folder",
        )


def job_view(run: RunRow, registry: Registry) -> Job:
    metrics = registry.latest_metrics(run.id)
    checkpoints = [
        Checkpoint(step=c.step, path=c.path, metrics=c.metrics) for c in registry.checkpoints(run.id)
    ]
    return Job(
        id=run.id, status=run.status, recipe=run.recipe, objective=run.objective, model=run.model,
        step=int(metrics.get("step", 0)), steps=run.config["request"]["steps"],
        stage=registry.current_stage(run.id), metrics=metrics, judge_flag=judge_flag(metrics),
        checkpoints=checkpoints, error=run.error,
        created_at=run.created_at.isoformat() if run.created_at else None,
    )  # fmt: skip


def _queue_has_room(registry: Registry, limit: int) -> None:
    """429 with Retry-After while ``limit`` jobs are queued (TRAINER_MAX_QUEUED_JOBS)."""
    queued = len(registry.list_runs(status="queued", limit=limit, kind="job"))
    if queued >= limit:
        raise ApiError(
            429, "queue_full",
            f"{queued} jobs are queued, the limit (TRAINER_MAX_QUEUED_JOBS = {limit}); retry after "
            f"{RETRY_AFTER_S} s or cancel a queued job",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )  # fmt: skip


@router.post("/v1/jobs", operation_id="create_job", status_code=201, responses=CREATE_ERRORS)
def create_job(body: JobRequest, registry: RegistryDep, queue: QueueDep) -> JobCreated:
    """Queue a training job; it starts when the trainer is free (one job at a time). A job that
    names a collection leases it in the retriever until it ends (services.trainer.admission)."""
    _validate(body, registry)
    admitted = admit(body, queue.settings, registry)
    _queue_has_room(registry, queue.settings.max_queued_jobs)
    run = submit(registry, admitted)
    if admitted.collection:
        try:
            hold_collection(admitted.collection, run.id, queue.settings)
        except ApiError:
            error = "its collection could not be leased"
            registry.transition_run(run.id, "cancelled", QUEUED, error=error)
            raise
    return JobCreated(id=run.id, status=run.status)


@router.get("/v1/jobs/{job_id}", operation_id="get_job")
def get_job(job_id: JobId, registry: RegistryDep) -> Job:
    """Status, step, latest metrics, checkpoints and curriculum stage of one job."""
    run = registry.get_run(job_id)
    if run is None or run.kind != "job":
        raise ApiError(404, "job_not_found", f"no job {job_id!r}; GET /v1/jobs lists them")
    return job_view(run, registry)


@router.get("/v1/jobs", operation_id="list_jobs")
def list_jobs(
    registry: RegistryDep,
    status: Annotated[JobStatus | None, Query(description="only jobs with this status")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[Job]:
    """Jobs, newest first."""
    return [job_view(r, registry) for r in registry.list_runs(status=status, limit=limit, kind="job")]


@router.post("/v1/jobs/{job_id}/cancel", operation_id="cancel_job", responses=CONFLICT)
def cancel_job(job_id: JobId, registry: RegistryDep, queue: QueueDep) -> Job:
    """Cancel a queued job, or stop the running one (its checkpoints stay)."""
    run = registry.get_run(job_id)
    if run is None or run.kind != "job":
        raise ApiError(404, "job_not_found", f"no job {job_id!r}; GET /v1/jobs lists them")
    if not queue.cancel(job_id):
        raise ApiError(409, "job_finished", f"job {job_id!r} is already {run.status}; nothing to cancel")
    updated = registry.get_run(job_id)
    assert updated is not None
    return job_view(updated, registry)
