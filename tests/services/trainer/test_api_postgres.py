"""The trainer API on the real PostgreSQL: what the registry cannot hold is a 422, never a 500.

SQLite stores anything; PostgreSQL's ``integer`` holds 32 bits, and its text and JSONB hold no NUL
character and JSONB no NaN or Infinity. Each case below was a 500 (a ``DataError`` from the
insert or the lookup) before the API checked the values it stores.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from services.local import LocalServer
from services.trainer.app import create_app
from services.trainer.settings import TrainerSettings

pytestmark = pytest.mark.integration
NUL = "\u0000"


@pytest.fixture(scope="module")
def trainer(
    postgres_url: str, retriever_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[httpx.Client]:
    """A trainer on PostgreSQL whose queue never starts a job (it polls once, at start-up)."""
    runs = tmp_path_factory.mktemp("pg-trainer") / "runs"
    settings = TrainerSettings(database_url=postgres_url, runs_dir=runs, retriever_url=retriever_url,
                               poll_interval_s=3600)  # fmt: skip
    with LocalServer(create_app(settings)) as server, httpx.Client(base_url=server.url) as http:
        yield http


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"seed": 2**31}, "seed"),
        ({"seed": -1}, "seed"),
        ({"dataset": f"train{NUL}.jsonl"}, "dataset"),
        ({"resume_from": f"job-{NUL}x"}, "resume_from"),
        ({"model": f"org/model{NUL}"}, "model"),
        ({"collection": f"c{NUL}"}, "collection"),
        ({"hyperparameters": {"recipe_config": {f"switch{NUL}": 1}}}, "hyperparameters.recipe_config.<key>"),
        ({"hyperparameters": {"report_to": [NUL]}}, "hyperparameters.report_to.0"),
    ],
)
def test_a_value_the_registry_cannot_hold_is_a_422_naming_it(
    trainer: httpx.Client, body: dict, where: str
) -> None:
    response = trainer.post("/v1/jobs", json={"recipe": "search-r1", **body})
    assert response.status_code == 422, response.text
    assert response.json()["error"] == "invalid_request"
    assert response.json()["message"].startswith(f"{where}: "), response.json()["message"]


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        (
            b'{"recipe": "search-r1", "hyperparameters": {"learning_rate": Infinity}}',
            "hyperparameters.learning_rate",
        ),
        (
            b'{"recipe": "search-r1", "hyperparameters": {"recipe_config": {"b": NaN}}}',
            "hyperparameters.recipe_config.b",
        ),
    ],
)
def test_nan_and_infinity_are_422(trainer: httpx.Client, raw: bytes, where: str) -> None:
    """Python's JSON reader accepts NaN and Infinity; JSONB does not."""
    response = trainer.post("/v1/jobs", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert response.json()["message"].startswith(f"{where}: ")


def test_the_largest_seed_is_stored_and_the_job_read_back(trainer: httpx.Client) -> None:
    created = trainer.post("/v1/jobs", json={"recipe": "search-r1", "seed": 2**31 - 1})
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    assert trainer.get(f"/v1/jobs/{job_id}").json()["status"] == "queued"
    assert trainer.post(f"/v1/jobs/{job_id}/cancel").json()["status"] == "cancelled"
    again = trainer.post(f"/v1/jobs/{job_id}/cancel")
    assert (again.status_code, again.json()["error"]) == (409, "job_finished")


@pytest.mark.parametrize("path", ["/v1/jobs/job-%00x", "/v1/jobs/%00"])
def test_an_id_no_column_can_hold_names_no_job(trainer: httpx.Client, path: str) -> None:
    for response in (trainer.get(path), trainer.post(f"{path}/cancel")):
        assert response.status_code == 404, response.text
        assert response.json()["error"] == "job_not_found"


def test_the_queue_left_the_jobs_alone(trainer: httpx.Client) -> None:
    """The fixture's premise: nothing ran, so these tests never started a training process."""
    assert all(job["status"] in ("queued", "cancelled") for job in trainer.get("/v1/jobs").json())
