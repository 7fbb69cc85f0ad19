"""Typed HTTP client for the trainer service.

>>> client = TrainerClient("http://127.0.0.1:8004")  # doctest: +SKIP
>>> job = client.submit(JobRequest(recipe="when-to-search", objective="sft", steps=50))  # doctest: +SKIP
>>> client.wait(job.id).status  # doctest: +SKIP
'succeeded'

The request and response models are the service's own (:mod:`hoprl.schemas.trainer`, plain
pydantic with no server dependency), so client and server cannot drift apart.
"""

from __future__ import annotations

import time
from typing import Any

from hoprl.clients.http import ServiceClient
from hoprl.clients.http import check as _check
from hoprl.schemas.trainer import Job, JobCreated, JobRequest, JobStatus

TERMINAL = ("succeeded", "failed", "cancelled")


class TrainerClient(ServiceClient):
    """Blocking client; ``base_url`` is the service root, e.g. ``http://127.0.0.1:8004``."""

    def __init__(self, base_url: str, timeout: float = 30.0, **kwargs: Any) -> None:
        super().__init__(base_url, timeout, **kwargs)

    def submit(self, request: JobRequest | dict[str, Any]) -> JobCreated:
        """Queue a job; a dict is validated by the service (4xx raises :class:`ServiceError`).

        A :class:`JobRequest` is sent with the fields it was given only: a field left out must stay
        out, so the trainer fills it from the preset and the paper (``Hyperparameters.resolved``)
        instead of taking the generic default as an explicit value.
        """
        body = (
            request.model_dump(mode="json", exclude_unset=True, exclude_none=True)
            if isinstance(request, JobRequest)
            else request
        )
        return JobCreated.model_validate(_check(self.http.post("/v1/jobs", json=body)))

    def get(self, job_id: str) -> Job:
        return Job.model_validate(_check(self.http.get(f"/v1/jobs/{job_id}")))

    def list(self, status: JobStatus | None = None, limit: int = 100) -> list[Job]:
        params: dict[str, Any] = {"limit": limit}
        if status is not None:
            params["status"] = status
        return [Job.model_validate(j) for j in _check(self.http.get("/v1/jobs", params=params))]

    def cancel(self, job_id: str) -> Job:
        return Job.model_validate(_check(self.http.post(f"/v1/jobs/{job_id}/cancel")))

    def wait(self, job_id: str, timeout: float = 3600.0, poll: float = 1.0) -> Job:
        """Poll until the job finishes (succeeded, failed or cancelled); TimeoutError after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.get(job_id)
            if job.status in TERMINAL:
                return job
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {job.status} at step {job.step} after {timeout} s")
            time.sleep(poll)
