"""Write each service's OpenAPI spec: ``python -m services.openapi OUT_DIR`` (``make openapi``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from fastapi import FastAPI

from services.judge.app import create_app as judge_app
from services.policy.app import create_app as policy_app
from services.retriever.app import create_app as retriever_app
from services.trainer.app import create_app as trainer_app

APPS: dict[str, Callable[[], FastAPI]] = {
    "retriever": retriever_app,
    "policy": policy_app,
    "judge": judge_app,
    "trainer": trainer_app,
}


def main(out: str = "openapi") -> None:
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    for name, factory in APPS.items():
        path = folder / f"{name}.json"
        path.write_text(json.dumps(factory().openapi(), indent=2) + "\n")
        print(f"wrote {path}")  # a command-line entry point: stdout is its output


if __name__ == "__main__":
    main(*sys.argv[1:2])
