"""Make ``pipeline`` startable from the Prefect UI: a deployment on the ``hoprl`` work pool, or serve it.

Two ways, both against the Prefect server named by ``PREFECT_API_URL``:

- ``python -m flows.deploy``: register the deployment ``pipeline/pipeline`` (code from this
  checkout) on the process work pool ``hoprl``, created if missing; any number of
  ``prefect worker start --pool hoprl`` processes then run what the UI or
  ``prefect deployment run pipeline/pipeline -p steps=40`` starts. Compose does the same from
  ``infra/prefect/prefect.yaml`` (the code baked into the image at /app).
- ``python -m flows.deploy --serve``: ``pipeline.serve()``, one long-running process that is both
  the deployment and its worker (no pool): the simplest way to get a "Run" button.

The defaults of the deployment are the pipeline's parameters in ``prefect.yaml``.
"""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import yaml

from flows.pipeline import pipeline

ROOT = Path(__file__).resolve().parents[1]
PREFECT_YAML = ROOT / "infra" / "prefect" / "prefect.yaml"


def deployment_spec() -> dict[str, Any]:
    """The ``pipeline`` deployment of ``infra/prefect/prefect.yaml`` (one source of the defaults)."""
    (spec,) = yaml.safe_load(PREFECT_YAML.read_text())["deployments"]
    return dict(spec)


def ensure_pool(name: str) -> None:
    """Create the process work pool ``name`` unless it exists."""
    if subprocess.run(["prefect", "work-pool", "inspect", name], capture_output=True).returncode != 0:
        subprocess.run(["prefect", "work-pool", "create", name, "--type", "process"], check=True)


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
        parameters=spec["parameters"],
        description=spec["description"],
        tags=spec["tags"],
        build=False,
        push=False,
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
        deploy()


if __name__ == "__main__":
    main()
