"""``hoprl demo-rl``'s options: bad ones stop it with exit 2 naming the fix, before anything starts;
every option the flow takes reaches it under its own name; bf16 is chosen unless the user chose."""

from __future__ import annotations

import argparse
import inspect
import os

import pytest

from cli import demo_rl as cli
from flows.demo_rl import demo_rl


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "0"], "--steps must be at least 1"),
        (["--test-questions", "0"], "--test-questions must be at least 1"),
        (["--sft-steps", "0"], "--sft-steps 0 needs --from CHECKPOINT"),
        (["--hyperparameters", "[1]"], "--hyperparameters must be a JSON object"),
    ],
)
def test_bad_options_stop_before_anything_starts(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(parse(*argv)) == 2
    assert message in capsys.readouterr().err


def test_the_defaults_are_the_demos_and_every_option_is_a_flow_parameter() -> None:
    args = parse()
    assert (args.dataset, args.test_questions, args.sft_steps, args.steps) == ("synthetic:0:2", 340, 24, 8)
    parameters = inspect.signature(demo_rl.fn).parameters
    assert set(cli.FLOW_OPTIONS) <= set(parameters)
    for name in ("test_questions", "sft_steps", "steps"):
        assert parameters[name].default == getattr(args, name)
    assert cli.check(parse("--sft-steps", "0", "--from", "runs/x/checkpoint-24")) is None


@pytest.fixture
def unset_precision(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The precision variables unset, and recorded first: ``choose_precision`` writes ``os.environ``
    itself, and a variable monkeypatch never saw would keep its value for every later test."""
    for name in ("HOPRL_BF16", "HOPRL_ROLLOUT_BF16", "HOPRL_ROLLOUT_PREFILL_BF16", "POLICY_DTYPE"):
        monkeypatch.setenv(name, "recorded")
        monkeypatch.delenv(name)
    return monkeypatch


def test_bf16_is_the_users_choice_when_made(unset_precision: pytest.MonkeyPatch) -> None:
    monkeypatch = unset_precision
    monkeypatch.setenv("HOPRL_BF16", "0")
    cli.choose_precision()
    assert "POLICY_DTYPE" not in os.environ  # autocast off: the policy keeps float32
    assert "HOPRL_ROLLOUT_BF16" not in os.environ  # and the rollouts decode as training, in fp32
    monkeypatch.setenv("HOPRL_BF16", "1")
    monkeypatch.setenv("POLICY_DTYPE", "float32")
    cli.choose_precision()
    assert os.environ["POLICY_DTYPE"] == "float32"  # set by the user: kept
    monkeypatch.delenv("POLICY_DTYPE")
    cli.choose_precision()
    assert os.environ["POLICY_DTYPE"] == "bfloat16"


@pytest.mark.parametrize("amx", [False, True])
def test_where_the_probe_turns_bf16_on_the_rollouts_still_decode_in_fp32_on_a_cpu(
    amx: bool, unset_precision: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With AMX too: a CPU decode step is slower under autocast (``hardware.rollout_bf16``)."""
    import torch

    from hoprl.training import hardware

    monkeypatch = unset_precision
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(hardware, "bf16_pays", lambda: True)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    cli.choose_precision()
    assert os.environ["HOPRL_BF16"] == "1" and "HOPRL_ROLLOUT_BF16" not in os.environ
    assert "in rollouts: off (HOPRL_ROLLOUT_BF16), in their prefill: on" in capsys.readouterr().out
    monkeypatch.setenv("HOPRL_ROLLOUT_BF16", "1")
    cli.choose_precision()
    assert "in rollouts: on (HOPRL_ROLLOUT_BF16)" in capsys.readouterr().out
    assert os.environ["HOPRL_ROLLOUT_BF16"] == "1"  # set by the user: kept
