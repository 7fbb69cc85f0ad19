"""``hoprl demo-rl``: RL over a warm start against a placebo, with the verdict at the end.

:func:`main` runs :func:`flows.demo_rl.demo_rl` under the same Prefect settings as ``hoprl
pipeline`` (:func:`cli.pipeline.prefect_settings`) and prints its verdict
(:func:`flows.demo_rl.format_verdict`); the exit status is 0 whatever the verdict (a run that
shows no gain is a result, not an error), 2 for bad options.

    hoprl demo-rl --dataset synthetic:0:2                     # make demo-rl
    hoprl demo-rl --dataset synthetic:3:2 --from runs/<make run>/jobs/<SFT job>/checkpoint-24
    hoprl demo-rl --run-id demo-rl-1a2b3c4d                   # resume a stopped demo
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

#: the options a user is most likely to change, with the flow's defaults
DEFAULTS: dict[str, Any] = {"dataset": "synthetic:0:2", "test_questions": 340, "sft_steps": 24, "steps": 8}


#: the options that are the flow's parameters of the same names (flows.demo_rl.demo_rl)
FLOW_OPTIONS = ("dataset", "test_questions", "sft_steps", "steps", "warm_start_from", "dev_limit", "seed",
                "hyperparameters", "run_id")  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``hoprl demo-rl`` (for :mod:`cli.main`)."""
    parser.add_argument(
        "--dataset", default=DEFAULTS["dataset"], help="synthetic:SEED:MAX_HOPS, as make run takes it"
    )
    parser.add_argument(
        "--test-questions",
        type=int,
        default=DEFAULTS["test_questions"],
        help="test questions of each evaluation (the synthetic test split is grown to this)",
    )
    parser.add_argument(
        "--sft-steps", type=int, default=DEFAULTS["sft_steps"], help="the warm start's SFT steps"
    )
    parser.add_argument("--steps", type=int, default=DEFAULTS["steps"], help="RL steps of each arm")
    parser.add_argument(
        "--from",
        dest="warm_start_from",
        default=None,
        metavar="CHECKPOINT",
        help="start from this SFT checkpoint folder (make run's) instead of training a warm start",
    )
    parser.add_argument("--dev-limit", type=int, default=12, help="dev questions of the headroom measurement")
    parser.add_argument("--seed", type=int, default=0, help="the jobs' seed (the world's is the dataset's)")
    parser.add_argument(
        "--hyperparameters",
        type=json.loads,
        default=None,
        help="JSON over the demo's RL settings, e.g. '{\"learning_rate\": 5e-5}'",
    )
    parser.add_argument("--run-id", default=None, help="resume this demo (default: a new run)")
    parser.add_argument("--json", action="store_true", help="print the verdict as JSON")


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with the options, or None."""
    for name in ("test_questions", "sft_steps", "steps", "dev_limit"):
        minimum = 0 if name == "sft_steps" else 1
        if getattr(args, name) < minimum:
            return f"--{name.replace('_', '-')} must be at least {minimum}"
    if args.sft_steps == 0 and not args.warm_start_from:
        return "--sft-steps 0 needs --from CHECKPOINT: RL from an untrained model is not a warm start"
    if args.hyperparameters is not None and not isinstance(args.hyperparameters, dict):
        return "--hyperparameters must be a JSON object"
    return None


def choose_precision() -> None:
    """bf16 for the demo's services where it pays, unless the user has chosen: ``HOPRL_BF16``
    (training under autocast) and ``POLICY_DTYPE=bfloat16`` (the evaluations' vLLM
    weights), both on where bf16 autocast measures at least 1.3x faster here
    (:func:`hoprl.training.hardware.bf16_pays`). On the AVX512-BF16 EPYC an RL step's trainer side
    took 58 s against 107 s, and vLLM answered 16 prompts of 2,200 tokens in 32 s against 83 s
    (docs/training.md, "make demo-rl"). The rollouts decode as :func:`hoprl.training.hardware.rollout_bf16`
    says (on a CPU in fp32, unless ``HOPRL_ROLLOUT_BF16`` is set) and prefill their prompts as
    training does (``HOPRL_ROLLOUT_PREFILL_BF16``, :func:`hoprl.training.hardware.rollout_prefill_bf16`)."""
    from hoprl.training.hardware import bf16_pays, rollout_bf16, rollout_prefill_bf16

    if os.environ.get("HOPRL_BF16") is None:
        os.environ["HOPRL_BF16"] = "1" if bf16_pays() else "0"
    if os.environ["HOPRL_BF16"] == "1":
        os.environ.setdefault("POLICY_DTYPE", "bfloat16")
    autocast = "on" if os.environ["HOPRL_BF16"] == "1" else "off"
    rollouts = "on" if rollout_bf16() else "off"
    prefill = "on" if rollout_prefill_bf16() else "off"
    weights = os.environ.get("POLICY_DTYPE", "float32")
    print(f"bf16 autocast in training: {autocast} (HOPRL_BF16), in rollouts: {rollouts} "
          f"(HOPRL_ROLLOUT_BF16), in their prefill: {prefill} (HOPRL_ROLLOUT_PREFILL_BF16); "
          f"policy weights: {weights} (POLICY_DTYPE)")  # fmt: skip


def main(args: argparse.Namespace) -> int:
    """The body of ``hoprl demo-rl``."""
    problem = check(args)
    if problem:
        from rich.console import Console

        Console(stderr=True).print(f"[red]error:[/red] {problem}")
        return 2
    from cli.pipeline import prefect_settings
    from flows.demo_rl import demo_rl, format_verdict

    choose_precision()
    with prefect_settings():
        result = demo_rl(**{name: getattr(args, name) for name in FLOW_OPTIONS})
    print(json.dumps(result, indent=1) if args.json else format_verdict(result))
    return 0
