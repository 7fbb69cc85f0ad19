"""Fuzz the trainer on the real PostgreSQL from its OpenAPI document (:mod:`tests.fuzz`): no 5xx,
only declared answers, JSON error bodies; stateful scenarios follow the links (create a job,
read it, cancel it, cancel it again: 409).

The queue polls once, at start-up, and never again, so the jobs the fuzzer creates stay queued:
thousands of training runs are not what this test is about (test_api.py trains for real).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from hoprl.registry.models import Base
from services.local import LocalServer
from services.trainer.app import create_app
from services.trainer.settings import TrainerSettings
from tests.fuzz import examples, fuzz_clean

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def idle_trainer(
    postgres_url: str, retriever_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    runs: Path = tmp_path_factory.mktemp("fuzz-trainer") / "runs"
    # max_job_tokens: a bare job trains at its paper's sizes (configs/<recipe>.yaml), which for most
    # recipes exceeds the default cap; the queued jobs never run here, so admit them and let the
    # stateful scenarios reach the create -> cancel links
    settings = TrainerSettings(database_url=postgres_url, runs_dir=runs, retriever_url=retriever_url,
                               poll_interval_s=24 * 3600, max_job_tokens=10**15)  # fmt: skip
    with LocalServer(create_app(settings)) as server:
        yield server.url


def test_no_server_errors(idle_trainer: str, postgres_url: str) -> None:
    engine = create_engine(postgres_url)
    tables = ", ".join(t.name for t in Base.metadata.sorted_tables)

    def empty_registry() -> None:
        with engine.begin() as conn:
            conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))

    links = ("POST /v1/jobs -> [201] GetJob ", "POST /v1/jobs -> [201] CancelJob ")
    try:
        report = fuzz_clean(idle_trainer, "trainer", links=links, max_examples=examples(),
                            stateful_scenarios=examples(40), reset=empty_registry)  # fmt: skip
    finally:
        engine.dispose()
    assert report.statuses[201] > 0 and report.statuses[422] > 0
