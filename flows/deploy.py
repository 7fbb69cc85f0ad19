"""Make ``pipeline`` startable from the Prefect UI: a deployment on the ``hoprl`` work pool, or serve it.

Two ways, both against the Prefect server named by ``PREFECT_API_URL``:

- ``python -m flows.deploy``: register the deployment ``pipeline/pipeline`` (code from this
  checkout) on the process work pool ``hoprl``, created if missing; any number of
  ``prefect worker start --pool hoprl`` processes then run what the UI or
  ``prefect deployment run pipeline/pipeline -p steps=40`` starts. Compose does the same from
  ``infra/prefect/prefect.yaml`` (the code baked into the image at /app). ``make ui`` runs this
  after starting a local server (:mod:`flows.ui`).
- ``python -m flows.deploy --serve``: ``pipeline.serve()``, one long-running process that is both
  the deployment and its worker (no pool): the simplest way to get a "Run" button.

Both talk to the API through Prefect's Python client, so neither needs the ``prefect`` command
on ``PATH``. The defaults of the deployment are the pipeline's parameters in ``prefect.yaml``.
"""

from __future__ import annotations

import argparse
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.exceptions import ObjectNotFound
from prefect.workers.process import ProcessWorker

from flows.pipeline import pipeline

ROOT = Path(__file__).resolve().parents[1]
PREFECT_YAML = ROOT / "infra" / "prefect" / "prefect.yaml"


def deployment_spec() -> dict[str, Any]:
    """The ``pipeline`` deployment of ``infra/prefect/prefect.yaml`` (one source of the defaults)."""
    (spec,) = yaml.safe_load(PREFECT_YAML.read_text())["deployments"]
    return dict(spec)


def ensure_pool(name: str) -> None:
    """Create the process work pool ``name`` unless it exists (what ``prefect work-pool create
    NAME --type process`` does: the process worker's default job template)."""
    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(name)
        except ObjectNotFound:
            template = ProcessWorker.get_default_base_job_template()
            client.create_work_pool(WorkPoolCreate(name=name, type="process", base_job_template=template))


def deploy() -> str:
    """Register ``pipeline/pipeline`` on the spec's work pool; returns the deployment id."""
    spec = deployment_spec()
    pool = spec["work_pool"]["name"]
    ensure_pool(pool)
    flow = pipeline.from_source(source=str(ROOT), entrypoint=spec["entrypoint"])
    assert not isinstance(flow, Coroutine)  # from_source is sync outside an event loop
    deployment_id = flow.deploy(
        name=spec["name"],
        work_pool_name=pool,
        work_queue_name=spec["work_pool"].get("work_queue_name"),
        parameters=spec["parameters"],
        description=spec["description"],
        tags=spec["tags"],
        build=False,
        push=False,
        print_next_steps=False,
        ignore_warnings=True,
    )
    return str(deployment_id)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m flows.deploy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", action="store_true", help="serve the flow from this process (no pool)")
    args = parser.parse_args(argv)
    spec = deployment_spec()
    if args.serve:
        pipeline.serve(name=spec["name"], parameters=spec["parameters"], tags=spec["tags"])
    else:
        deployment_id = deploy()
        print(f"registered deployment {pipeline.name}/{spec['name']} ({deployment_id})")


if __name__ == "__main__":
    main()
