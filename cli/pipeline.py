"""``hoprl pipeline``: the whole pipeline from the command line, with a summary at the end.

:func:`run_pipeline` runs :func:`flows.pipeline.pipeline` against the Prefect API that
:func:`prefect_api` picks (``PREFECT_API_URL`` if set, else the local server of ``make ui`` if
one answers on 127.0.0.1:4200, else a temporary server of its own, whose runs no UI shows
afterwards: :func:`temporary_server`)
and returns its summary; :func:`format_summary` is the text the command prints;
:func:`add_arguments` / :func:`main` are the command's options and body. While it runs, the
terminal shows a line per stage and each trainer job's step / total, reward and ETA
(:mod:`flows.progress`).

    hoprl pipeline --small                              # synthetic world, SmolLM2-135M, when-to-search
    hoprl pipeline --small --dataset ../shared/data/hotpotqa_dev.jsonl --steps 40
    hoprl pipeline --recipe r2ag --model Qwen/Qwen2.5-3B   # the paper's settings (a GPU machine)
    hoprl pipeline --config configs/r2ag.yaml --small       # a config's toy CPU run (configs/*.yaml)
    hoprl pipeline --run-id when-to-search-1a2b3c4d      # resume a run that was stopped
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

LOCAL_API_URL = "http://127.0.0.1:4200/api"  # `make ui` (flows/ui.py) serves here


def prefect_api(local: str = LOCAL_API_URL) -> str | None:
    """The Prefect API a run reports to: ``$PREFECT_API_URL``, else ``local`` if a server answers
    its ``/health`` there (``make ui``), else None (the command's :func:`temporary_server`)."""
    from flows.ui import local_api

    return os.environ.get("PREFECT_API_URL") or local_api(local)


EPHEMERAL_STARTUP_TIMEOUT_S = 180

#: this process's temporary Prefect server (:func:`temporary_server`): its API URL once started
_TEMPORARY: dict[str, str] = {}


def temporary_server(timeout_s: float) -> str:
    """The API URL of a Prefect server for this process: started on the first call (within
    ``timeout_s``), stopped when the process exits.

    It is the server Prefect starts by itself when no API is set: Prefect's app factory with the
    environment Prefect's own ``SubprocessASGIServer`` gives it (no UI, the services of an ephemeral
    server). It is started here, not by Prefect, for its process group. Prefect starts it in the
    command's, so a terminal's Ctrl-C, sent to the whole foreground group, stopped the server with
    the command; the flow then retried for about 70 s to record its end on a server that was gone
    (a one-task flow, 2026-12-07), and a crashed run stayed "running" in Prefect's database. In a
    session of its own the server outlives the Ctrl-C. atexit stops it after Prefect's own exit
    handlers (registered later, so run first) have sent the last logs, and it dies with the process
    if that is killed (PR_SET_PDEATHSIG).
    """
    if "url" in _TEMPORARY:
        return _TEMPORARY["url"]
    from flows.stack import die_with_parent
    from flows.ui import stop, wait_healthy
    from hoprl.ports import free_port

    port = free_port()
    ephemeral = {"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
    env = {name: value for name, value in os.environ.items() if name != "PREFECT_API_URL"} | ephemeral
    app = "prefect.server.api.server:create_app"
    command = [sys.executable, "-m", "uvicorn", "--factory", app, "--host", "127.0.0.1", "--port", str(port),
               "--log-level", "error", "--lifespan", "on"]  # fmt: skip
    proc = subprocess.Popen(command, env=env, start_new_session=True, preexec_fn=die_with_parent)
    atexit.register(stop, [proc], 5.0)
    url = f"http://127.0.0.1:{port}/api"
    print(f"Starting a temporary Prefect server at {url} (it stops with this command)", file=sys.stderr)
    wait_healthy(url, proc, timeout_s=timeout_s)
    _TEMPORARY["url"] = url
    return url


@contextmanager
def prefect_settings() -> Iterator[str | None]:
    """The Prefect settings a flow started from the command line runs under; yields the API URL of
    a server that outlives the command (:func:`prefect_api`), or None where the command reports to
    its own temporary server (:func:`temporary_server`), whose runs no UI shows afterwards."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    api = prefect_api()
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        PREFECT_UI_URL,
        temporary_settings,
    )

    # Prefect gives its temporary server 20 s to start, which a loaded 2-core machine missed
    # ("Timed out while attempting to connect to ephemeral Prefect API server" after 47 s of
    # `make run`); this one gets 180 s. A value the user sets wins.
    startup = PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.name
    url = api or temporary_server(float(os.environ.get(startup) or EPHEMERAL_STARTUP_TIMEOUT_S))
    # no "View at <link>" lines for a server that has no UI and stops with the command
    with temporary_settings({PREFECT_API_URL: url, **({} if api else {PREFECT_UI_URL: ""})}):
        yield api


def run_pipeline(
    dataset: str = "synthetic",
    recipe: str = "when-to-search",
    objective: str | None = None,
    model: str | None = None,
    steps: int = 200,
    run_id: str | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Run (or resume, with an existing ``run_id``) the pipeline; returns its summary.

    ``options`` are the other parameters of :func:`flows.pipeline.pipeline` (``sft_steps``,
    ``segments``, ``eval_limit``, ``dev_limit``, ``baselines``, ``seed``, ``hyperparameters``,
    ``recipe_config``, ``preset``). ``objective`` None is the recipe's paper objective.
    """
    from flows.pipeline import pipeline

    with prefect_settings() as api:
        summary = pipeline(
            recipe=recipe,
            objective=objective,
            model=model,
            dataset=dataset,
            steps=steps,
            run_id=run_id,
            **options,
        )
    return {**summary, "prefect_api_url": api}


def format_summary(summary: dict[str, Any]) -> str:
    """What ``hoprl pipeline`` prints: before/after, where the report is, what to do next."""
    before, after = summary["before"], summary["after"]
    rows = [
        f"{name:<22}{before[key]:>8.3f}{after[key]:>8.3f}{after[key] - before[key]:>+9.3f}"
        for key, name in [
            ("em_scored", "EM (as the report)"),  # answerable questions unless the recipe can refuse
            ("em", "EM (all questions)"),
            ("f1", "F1"),
            ("judge_accuracy", "judge accuracy"),
            ("retrieval_count", "retrievals / question"),
        ]
    ]
    server, flow_run = summary.get("prefect_api_url"), summary.get("prefect_flow_run_id")
    ui = (
        f"{server.removesuffix('/api')}/runs/flow-run/{flow_run}"
        if server
        else "this run used a temporary Prefect server; start `make ui` first to see runs in the Prefect UI"
    )
    body = {
        "question": "<your question>",
        "recipe": summary["recipe"],
        "collection": summary["collection"],
        "return_trace": True,
    }
    return "\n".join(
        [
            f"run {summary['run_id']}",
            f"{'':<22}{'before':>8}{'after':>8}{'change':>9}",
            *rows,
            f"report: {summary['report']}",
            *(f"plot:   {p}" for p in summary["plots"]),
            f"checkpoint: {summary['checkpoint']}",
            f"Prefect UI: {ui}",
            "Serve the trained checkpoint and ask it a question:",
            f"  POLICY_MODEL={summary['checkpoint']} hoprl serve policy --port 8002 &   # retriever on 8001",
            "  curl -s http://127.0.0.1:8002/v1/answer -H 'content-type: application/json' \\",
            f"       -d '{json.dumps(body)}'",
        ]
    )


#: what the command runs when neither an option nor a --config sets it
DEFAULTS: dict[str, Any] = {"dataset": "synthetic", "recipe": "when-to-search", "steps": 24, "seed": 0}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``hoprl pipeline`` (for :mod:`cli.main`). Options that a ``--config`` file can
    set default to None here, so an option given explicitly wins over the file (:data:`DEFAULTS`)."""
    parser.add_argument(
        "--config",
        default=None,
        help="a job config (configs/<paper>.yaml): its recipe, objective, model, dataset, steps, seed and "
        "hyperparameters feed the run; the options given here win",
    )
    parser.add_argument(
        "--dataset", default=None, help="synthetic[:SEED[:MAX_HOPS[:TEST]]], a JSONL path, or a hub name"
    )
    parser.add_argument("--recipe", default=None, help=f"default {DEFAULTS['recipe']}")
    parser.add_argument(
        "--objective",
        default=None,
        choices=["grpo", "dapo", "dr_grpo"],
        help="default: the recipe's paper objective (dapo for r2ag and when-to-search, else grpo)",
    )
    parser.add_argument(
        "--preset",
        default=None,
        choices=["paper", "cpu"],
        help="paper (default): the papers' training settings; cpu: their sizes scaled down to two CPU cores",
    )
    parser.add_argument(
        "--small",
        action="store_true",
        help="the cpu preset (make run): 2 questions x 4 samples a step, 4 turns of 96 tokens; with "
        "--config, also the config's small: section",
    )
    parser.add_argument("--model", default=None, help="HF id or folder; default: bundled SmolLM2-135M")
    parser.add_argument(
        "--steps", type=int, default=None, help=f"RL optimizer steps in all (default {DEFAULTS['steps']})"
    )
    parser.add_argument(
        "--segments", type=int, default=4, help="trainer jobs; dev check + curriculum between"
    )
    parser.add_argument("--sft-steps", type=int, default=10, help="SFT warm-start steps (0: none)")
    parser.add_argument("--eval-limit", type=int, default=30, help="test questions per evaluation")
    parser.add_argument("--dev-limit", type=int, default=8, help="dev questions per curriculum check")
    parser.add_argument(
        "--limit", type=int, default=None, help="at most this many questions per split (quick runs)"
    )
    parser.add_argument(
        "--baselines", nargs="*", default=["naive-rag"], help="recipes on the untrained model"
    )
    from cli import protocol

    protocol.add_arguments(
        parser,
        "after the final evaluation, run this paper's evaluation protocol (hoprl/protocols.py: "
        "its datasets from --data-dir, --eval-limit questions each, its step cap and decoding)",
        "--protocol: the benchmark files",
    )
    parser.add_argument(
        "--corpus",
        default=None,
        metavar="COLLECTION",
        help="the open-domain setting: train and evaluate against this corpus collection "
        "(hoprl ingest-corpus) instead of indexing the dataset's paragraphs; gold paragraphs are "
        "found in it by title, then text",
    )
    parser.add_argument("--run-id", default=None, help="resume this run (default: a new run)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--hyperparameters", type=json.loads, default=None, help="JSON, e.g. '{\"learning_rate\": 1e-5}'"
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def config_options(args: argparse.Namespace) -> dict[str, Any]:
    """The :func:`run_pipeline` arguments a ``--config`` file sets (none without one).

    The file's ``recipe_config`` and ``preset`` become the flow's own parameters of those names;
    the other hyperparameters go to every trainer job of the run.
    """
    if not args.config:
        return {}
    from hoprl.jobspec import load_config, set_fields

    fields = set_fields(load_config(args.config, small=args.small))
    options: dict[str, Any] = {
        k: fields[k] for k in ("recipe", "objective", "model", "dataset", "steps", "seed") if k in fields
    }
    hyperparameters = fields.get("hyperparameters", {})
    for key in ("recipe_config", "preset"):
        if key in hyperparameters:
            options[key] = hyperparameters.pop(key)
    return options | {"hyperparameters": hyperparameters}


def pipeline_options(args: argparse.Namespace) -> dict[str, Any]:
    """The :func:`run_pipeline` arguments the command's options stand for: an option given
    explicitly, else the ``--config`` file's value, else :data:`DEFAULTS`. ``--hyperparameters``
    merges into the file's key by key."""
    from hoprl.configs import merge

    config = config_options(args)
    explicit = {
        key: value
        for key in ("dataset", "recipe", "objective", "model", "steps", "seed", "preset")
        if (value := getattr(args, key)) is not None
    }
    if args.small:
        explicit["preset"] = "cpu"
    hyperparameters = merge(config.pop("hyperparameters", {}), args.hyperparameters or {}) or None
    return {
        **DEFAULTS,
        "objective": None,
        "model": None,
        "preset": "paper",
        **config,
        **explicit,
        "hyperparameters": hyperparameters,
        "run_id": args.run_id,
        "segments": args.segments,
        "sft_steps": args.sft_steps,
        "eval_limit": args.eval_limit,
        "dev_limit": args.dev_limit,
        "limit": args.limit,
        "baselines": args.baselines,
        **({"protocol": args.protocol, "data_dir": args.data_dir} if args.protocol else {}),
        **({"corpus": args.corpus} if args.corpus else {}),
    }


def check_options(options: dict[str, Any]) -> None:
    """The options as the flow's :class:`flows.spec.RunSpec` validates them, before anything starts:
    a bad value stops the command naming the field (:class:`ConfigError`)."""
    from pydantic import ValidationError

    from flows.spec import RunSpec
    from hoprl.configs import ConfigError

    fields = {k: v for k, v in options.items() if k in RunSpec.model_fields and v is not None}
    try:
        RunSpec.model_validate(fields)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"pipeline options: {problems}") from None


def main(args: argparse.Namespace) -> int:
    """The body of ``hoprl pipeline``: check the options, run, then print the summary (stdout)."""
    from hoprl.configs import ConfigError

    try:
        options = pipeline_options(args)
        check_options(options)
    except ConfigError as exc:
        from rich.console import Console

        Console(stderr=True).print(f"[red]error:[/red] {exc}")
        return 2
    summary = run_pipeline(**options)
    print(json.dumps(summary, indent=1) if args.json else format_summary(summary))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="hoprl pipeline", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
